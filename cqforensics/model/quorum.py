"""Quorum queues from their Ra files: each server's log assembled as Ra's recovery assembles it
(snapshot, segments, WAL records: ``model.recovery`` decides which survive), its ``rabbit_fifo``
state replayed (``model.fifo``), and what the next boot delivers, in the order a consumer
receives it, with the headers the broker adds.

The next boot of a single-node quorum queue: every entry of its log is applied (the leader of
the new term commits it all), then the leader monitors every consumer, enqueuer and
dead-letter worker it knows; all of them belong to the previous incarnation of the node, so
each is reported down (``{down, Pid, noproc}``, FIFO state_enter/2) and its checked-out
messages are returned (delivered again, ``redelivered``, their delivery count raised: a message
then over its delivery limit is dead-lettered instead). A consumer then receives the returned
messages first, then the others in queue order (4.0-4.2: priorities above 4 first, 2 to 1;
4.3: by priority), expired ones dropped (FIFO expire_msgs/4, judged at ``as_of``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cqforensics import compiled
from cqforensics.base.enums import Fate
from cqforensics.base.errors import FormatError
from cqforensics.codecs import etf
from cqforensics.message import rabbit_fifo
from cqforensics.model import fifo as m_fifo
from cqforensics.model import recovery as m_rec
from cqforensics.model.versions import BrokerModel
from cqforensics.readers import ra_segment as r_seg
from cqforensics.readers import ra_snapshot as r_snap
from cqforensics.readers import ra_system as r_sys
from cqforensics.readers import ra_wal as r_wal


@dataclass
class LogEntry:
    """Where one log entry's bytes are (the copy Ra uses for its index)."""

    index: int
    term: int
    file: Path
    offset: int  # the WAL record's start, or the segment entry's data
    data_offset: int
    length: int
    source: str  # wal / segment
    checksum: str  # ok / bad / not_computed

    def data(self, bodies):
        """The entry's stored bytes, from ``bodies`` (a ``model.bodies.Bodies``)."""
        return bodies.read(self.file, self.data_offset, self.length)


@dataclass
class ServerLog:
    """One Ra server's (one quorum queue member's) data on this node."""

    uid: str
    path: Path
    config: r_sys.ServerConfig | None
    name: str | None = None  # from names.dets
    snapshot: r_snap.Snapshot | None = None
    entries: dict[int, LogEntry] = field(default_factory=dict)
    meta: r_sys.MetaRecord | None = None

    @property
    def resource(self) -> tuple[bytes, bytes] | None:
        return self.config.queue_resource if self.config is not None else None


# -- replay ---------------------------------------------------------------------------------------


@dataclass
class Replay:
    """A server's state after its log, and what happened on the way."""

    log: ServerLog
    fifo: m_fifo.Fifo | None
    applied: int = 0  # entries applied after the snapshot
    last_index: int = 0
    last_term: int = 0
    notes: list[str] = field(default_factory=list)
    #: index -> ``entry_row`` of each entry replayed (the raft_log table takes these, not a
    #: second decode of the same bytes)
    entry_rows: dict[int, tuple] = field(default_factory=dict)
    error: str | None = None


def decode_log_entry(data) -> rabbit_fifo.Entry:
    """A log entry's stored bytes -> ``rabbit_fifo.Entry``: its term made by the compiled core
    where it is a plain one, else by the reference (``codecs.etf``), which words any error."""
    term = compiled.decode_term(data)
    return rabbit_fifo.decode(data) if term is None else rabbit_fifo.decode_entry(term)


#: entries decoded per call into the compiled core (their bytes are held meanwhile)
DECODE_BATCH = 256


def decode_log_entries(datas: list) -> list:
    """``decode_log_entry`` of each of ``datas``: its Entry, or the FormatError it raises (the
    terms made by the compiled core in one call, the rest by the reference, as one by one)."""
    terms = compiled.decode_terms(datas)
    if terms is None:
        terms = [None] * len(datas)
    decode, decode_entry = rabbit_fifo.decode, rabbit_fifo.decode_entry
    out = []
    for data, term in zip(datas, terms):
        if term is not None:
            out.append(decode_entry(term))
            continue
        try:
            out.append(decode(data))
        except FormatError as e:
            out.append(e)
    return out


#: ``entry_row`` of bytes that are no term
UNDECODABLE_ROW = ("undecodable", None, None, None)


def entry_row(entry: rabbit_fifo.Entry, facts: m_fifo.MsgFacts | None = None) -> tuple:
    """(entry kind, command name, ts, body size) of a decoded entry: the raft_log table's
    columns (``facts``: the ``message_facts`` of the message it carries, when known)."""
    cmd = entry.command
    if cmd is None:
        return (entry.kind, "noop" if entry.kind == "noop" else None, entry.ts, None)
    size = None
    if cmd.msg is not None:
        size = (facts or m_fifo.message_facts(cmd.msg, cmd.size)).size
    return (entry.kind, cmd.name, entry.ts, size)


def _decode(entry: LogEntry, bodies):
    return decode_log_entry(entry.data(bodies))


def _decoded(order: list[int], entries: dict[int, LogEntry], read):
    """(index, LogEntry, its ``decode_log_entries`` result) of each index of ``order``, decoded
    ``DECODE_BATCH`` at a time (``read``: ``Bodies.read``)."""
    for k in range(0, len(order), DECODE_BATCH):
        idxs = order[k : k + DECODE_BATCH]
        batch = [entries[i] for i in idxs]
        yield from zip(idxs, batch, decode_log_entries([read(e.file, e.data_offset, e.length) for e in batch]))


def replay(log: ServerLog, bodies, upto: int | None = None, lenient: bool = False) -> Replay:
    """Apply the snapshot and every log entry above it, in index order (``upto``: stop there);
    ``bodies``: the ``model.bodies.Bodies`` the entries are read through. ``lenient``: the log
    misses entries to damage (``Fifo.lenient``)."""
    cfg = (
        m_fifo.cfg_from_map(log.config.machine_config) if log.config is not None and log.config.terms else m_fifo.Cfg()
    )
    fifo = None
    start = 0
    out = Replay(log, None)
    snap = log.snapshot
    if snap is not None and snap.ok and snap.index is not None:
        try:
            fifo = m_fifo.from_snapshot(snap.state(), snap.machine_version or 0, cfg)
            fifo.lenient = lenient
            start = snap.index
            out.last_index, out.last_term = snap.index, snap.term or 0
        except (FormatError, ValueError) as e:
            out.notes.append(f"snapshot {snap.path}: its state is not read ({e}); replayed from the log alone")
            fifo = None
    read = bodies.read
    facts_of = m_fifo.message_facts
    rows = out.entry_rows
    entries = log.entries
    applied = 0
    order = sorted(i for i in entries if i > start and (upto is None or i <= upto))
    for idx, e, entry in _decoded(order, entries, read):
        if isinstance(entry, FormatError):
            if e.checksum in ("ok", "not_computed"):  # a damaged entry's own finding says why already
                out.notes.append(f"entry {idx} ({e.file.name}@{e.offset}) is no term: {entry.message}")
            rows[idx] = UNDECODABLE_ROW
            continue
        out.last_index, out.last_term = idx, e.term
        kind = entry.kind
        if kind == "noop":
            mv = entry.machine_version or 0
            if fifo is None:
                fifo = m_fifo.Fifo(cfg, mv)
                fifo.lenient = lenient
            else:
                fifo.upgrade(mv)
            rows[idx] = entry_row(entry)
            continue
        if kind != "command":
            rows[idx] = entry_row(entry)
            continue
        cmd = entry.command
        facts = facts_of(cmd.msg, cmd.size) if cmd.msg is not None else None
        rows[idx] = entry_row(entry, facts)
        if fifo is None:  # commands before any noop: only after a gap (the log's start lost)
            fifo = m_fifo.Fifo(cfg, 0)
            fifo.lenient = lenient
        meta = {"index": idx, "term": e.term, "ts": entry.ts, "reply": entry.reply, "facts": facts}
        try:
            fifo.apply(meta, cmd)
            applied += 1
        except m_fifo.Unsupported as u:
            out.notes.append(f"entry {idx}: {u} not applied")
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as err:
            out.notes.append(f"entry {idx}: {cmd.name} not applied ({type(err).__name__})")
    out.applied = applied
    out.fifo = fifo
    return out


# -- the next boot ----------------------------------------------------------------------------------


@dataclass
class Delivery:
    """A message as the next boot holds it, in delivery order."""

    msg: m_fifo.Msg
    position: int  # order of delivery after the boot (0 first)
    checked_out: bool  # held by a consumer at the stop: returned by the boot
    delivery_count: int  # what the broker reports as the delivery count
    redelivered: bool
    fate: str  # delivered / expired / delivery_limit
    state: str  # ready / returned / checked_out (where the replayed state holds it)


def boot(rep: Replay, machine_version: int | None, as_of_ms: int) -> list[Delivery]:
    """What the next boot's consumer receives from this queue, in order (``machine_version``:
    the machine version the booting broker runs; an older log is upgraded first)."""
    f0 = rep.fifo
    if f0 is None:
        return []
    f = f0.clone()
    held = {m.index for c in f.consumers.values() for m in c.checked_out.values()}
    held |= {m.index for _, c in f.waiting for m in c.checked_out.values()}
    returned = {m.index for m in f.returns}
    if machine_version is not None and machine_version > f.mv:
        f.upgrade(machine_version)
    meta = {"index": rep.last_index + 1, "term": rep.last_term + 1, "ts": as_of_ms, "reply": None}
    pids = {c.pid for c in f.consumers.values()} | {c.pid for _, c in f.waiting} | set(f.enqueuers)
    before = len(f.dead_lettered)
    for pid in sorted(pids, key=etf.term_order_key):
        f.apply(meta, rabbit_fifo.Command("down", pid=pid, info="noproc"))
    limited = {m.index for _, m, _ in f.dead_lettered[before:]} | {m.index for _, m in f.dlx.discards}
    out: list[Delivery] = []
    f.dead_lettered = []
    for pos in range(1 << 62):
        f._expire(as_of_ms)
        m = f._take()
        if m is None:
            break
        dc = _reported_count(m, f.mv)
        out.append(
            Delivery(
                m,
                pos,
                m.index in held,
                dc,
                dc > 0,
                "delivered",
                "checked_out" if m.index in held else "returned" if m.index in returned else "ready",
            )
        )
    for reason, m, _ in f.dead_lettered:  # expired at the drain
        out.append(
            Delivery(
                m,
                -1,
                m.index in held,
                _reported_count(m, f.mv),
                False,
                reason,
                "checked_out" if m.index in held else "ready",
            )
        )
    for idx in sorted(limited):
        pass
    return out


def _reported_count(m: m_fifo.Msg, mv: int) -> int:
    h = m.header
    if mv >= 4:
        return h.get("acquired_count", h.get("delivery_count", 0))
    return h.get("delivery_count", 0)


def delivered_view(fields: dict, m: m_fifo.Msg, broker: tuple[int, int, int]) -> dict:
    """The message columns as a consumer of ``broker`` receives them from a quorum queue: the
    delivery count header rabbit_fifo_client add_delivery_count_header adds (3.10-3.12: header
    ``x-delivery-count`` on every #basic_message; 3.13+: the ``x-delivery-count`` annotation when
    above 0 (4.0+: the acquired count), 4.3 also ``x-acquired-count``)."""
    h = m.header
    fields = dict(fields)
    if fields.get("term_format") == "basic_message" and broker < (3, 13, 0):
        count = h.get("delivery_count", 0)
        headers = json.loads(fields["headers"]) if fields.get("headers") else {}
        headers["x-delivery-count"] = {"type": "long", "value": count}
        from cqforensics.codecs import amqp091

        fields["headers"] = amqp091.headers_json(dict(sorted(headers.items())))
        return fields
    if broker < (4, 0, 0):
        count = h.get("delivery_count", 0)
        extra = {"x-delivery-count": count} if count > 0 else {}
    else:
        acq = h.get("acquired_count", h.get("delivery_count"))
        extra = {}
        if acq is not None:
            if broker >= (4, 3, 0):
                extra["x-acquired-count"] = acq
                if "delivery_count" in h:
                    extra["x-delivery-count"] = h["delivery_count"]
            else:
                extra["x-delivery-count"] = acq
    if extra:
        headers = json.loads(fields["headers"]) if fields.get("headers") else {}
        for k, v in extra.items():
            headers[k] = {"type": "long", "value": v}
        from cqforensics.codecs import amqp091

        fields["headers"] = amqp091.headers_json(dict(sorted(headers.items())))
    return fields


# -- assembly: the servers' logs as the next boot recovers them (rules: model.recovery) -----------------


@dataclass
class SegmentFile:
    path: Path
    seg: object  # readers.ra_segment.Segment
    usable: bool
    why: str = ""


@dataclass
class System:
    """A Ra system dir (``quorum/<node>/``) read: its servers' logs and what its recovery does."""

    dir: object  # layout.RaSystemDir
    servers: list[ServerLog] = field(default_factory=list)
    wal: list = field(default_factory=list)  # (WalScan, WalRecovery) per .wal, in recovery order
    segments: dict[str, list[SegmentFile]] = field(default_factory=dict)  # uid -> its segments
    snapshots: dict[str, list] = field(default_factory=dict)  # uid -> every snapshot read (chosen first)
    names: object = None  # readers.ra_system.Table
    meta: object = None
    #: the uids names.dets registers (an absent file registers none: ra_directory opens a new
    #: table); None when it is unreadable (not judged)
    registered: set[bytes] | None = None

    @property
    def outcome(self) -> str:
        return next((r.outcome for _, r in self.wal if r.outcome != m_rec.RA_OK), m_rec.RA_OK)


def wal_walk(path: Path, walks: dict | None = None) -> r_wal.WalScan:
    """``readers.ra_wal.walk`` of ``path``, done once per ``walks`` (a node's memo of its WAL
    walks: the version inference and the system's recovery read the same files)."""
    if walks is None:
        return r_wal.walk(path)
    scan = walks.get(path)
    if scan is None:
        scan = walks[path] = r_wal.walk(path)
    return scan


def read_system(ra_dir, model: BrokerModel, walks: dict | None = None) -> System:
    """Read ``quorum/<node>/`` (``layout.RaSystemDir``) as the next boot of ``model`` recovers it
    (``walks``: see ``wal_walk``)."""
    sys_ = System(ra_dir)
    sys_.names = r_sys.read_names(ra_dir.names) if ra_dir.names is not None else r_sys.Table(error="missing")
    sys_.meta = r_sys.read_meta(ra_dir.meta) if ra_dir.meta is not None else r_sys.Table(error="missing")
    registered = {r.uid for r in sys_.names.records} if sys_.names.error in (None, "missing") else None
    sys_.registered = registered
    names = {r.uid: r.name for r in sys_.names.records}
    metas = {r.uid: r for r in sys_.meta.records}
    logs: dict[str, ServerLog] = {}
    snap_index: dict[bytes, int] = {}
    for srv in ra_dir.servers:
        cfg = r_sys.read_config(srv.config) if srv.config is not None else None
        log = ServerLog(srv.uid, srv.path, cfg, names.get(os.fsencode(srv.uid)), meta=metas.get(os.fsencode(srv.uid)))
        snaps = []
        for sd in srv.snapshots:
            if sd.kind == "snapshot" and sd.snapshot is not None:
                snaps.append(r_snap.read_snapshot(sd.snapshot))
        chosen, _ = m_rec.choose_snapshot(snaps)
        log.snapshot = chosen
        sys_.snapshots[srv.uid] = ([chosen] if chosen else []) + [s for s in snaps if s is not chosen]
        if chosen is not None and chosen.index is not None:
            snap_index[os.fsencode(srv.uid)] = chosen.index
        segs = []
        for _, path in srv.segments:
            seg = r_seg.read_segment(path)
            ok, why = m_rec.ra_segment_usable(seg, model)
            segs.append(SegmentFile(path, seg, ok, why))
            if not ok:
                continue
            entries = log.entries
            for idx, term, off, length, status in zip(
                seg.index.tolist(), seg.term.tolist(), seg.offset.tolist(), seg.length.tolist(), seg.status.tolist()
            ):
                entries[idx] = LogEntry(idx, term, path, off, off, length, "segment", r_seg.ENTRY_LABELS[status])
        sys_.segments[srv.uid] = segs
        logs[srv.uid] = log
    for _, path in ra_dir.wal:
        scan = wal_walk(path, walks)
        rec = m_rec.wal_recovery(scan, model, registered, snap_index)
        sys_.wal.append((scan, rec))
        kept = np.asarray(rec.kept, np.int64)
        kept = kept[scan.known[kept]]  # an unknown writer's record is no server's
        by_ref = {ref: logs.get(os.fsdecode(uid)) for ref, uid in scan.writers.items()}
        labels = r_wal.CHECK_LABELS
        for ref, (idx, term, off, data_off, length, check) in zip(scan.ref[kept].tolist(), scan.entries(kept)):
            log = by_ref[ref]
            if log is not None:
                log.entries[idx] = LogEntry(idx, term, scan.path, off, data_off, length, "wal", labels[check])
    sys_.servers = [logs[k] for k in sorted(logs)]
    return sys_


def message_term(rep: Replay, index: int, buffers):
    """The stored message term of the enqueue (or requeue) at raft ``index``, or None."""
    e = rep.log.entries.get(index)
    if e is None:
        return None
    try:
        entry = _decode(e, buffers)
    except FormatError:
        return None
    cmd = entry.command
    return cmd.msg if cmd is not None and cmd.name in ("enqueue", "requeue") else None


# -- a node's quorum queues and what the next boot does with each -------------------------------------

#: a quorum queue's fate at the next boot (``QuorumQueue.fate``), beside ``m_rec.RA_OK``
Q_OK, Q_NODE_DOWN, Q_CRASH, Q_UNAVAILABLE, Q_DELETED = (
    "ok",
    "node_refuses_start",
    "queue_crash",
    "unavailable",
    "deleted",
)


@dataclass
class QuorumQueue:
    """One quorum queue member on this node: its log, state, and what the next boot does."""

    system: System
    log: ServerLog
    replay: Replay
    vhost: str | None
    name: str | None
    fate: str = Q_OK
    why: str = ""
    why_file: Path | None = None
    why_offset: int | None = None
    deliveries: list[Delivery] = field(default_factory=list)
    pending_dlx: list = field(default_factory=list)  # (reason, Msg) waiting for at-least-once dead-lettering
    lost: list[m_fifo.Msg] = field(default_factory=list)  # in the files' state, not in the recovered one
    data_replay: Replay | None = None  # of every readable entry, when recovery drops some
    #: (reason, Msg) dead-lettered at most once by the entries the boot applies again (above
    #: meta.dets' last_applied) and by the boot's own returns: the boot publishes them (again)
    boot_dead_letters: list = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.name if self.name is not None else f"?{self.log.uid}"

    @property
    def may_not_answer(self) -> bool:
        """Up (empty) or without a leader, as the boot's timing falls: a fate of ``Q_OK`` that
        carries a ``why`` (``_server_fate``: a member left with nothing, on a version that elects
        such a member or not as it happens)."""
        return self.fate == Q_OK and bool(self.why)

    def messages(self):
        """(Msg, Fate, Delivery or None, delivery count, checked out) of every message the
        queue holds, in the order the next boot delivers them, then the ones it does not: kept
        for at-least-once dead-lettering, then lost with log entries the boot does not recover.
        A queue (or node) the boot loses: what the files hold, each with that fate."""
        qfate = _Q_FATE.get(self.fate)
        if qfate is not None:
            rep = self.data_replay or self.replay
            f = rep.fifo
            if f is None:
                return
            held = {m.index for c in f.consumers.values() for m in c.checked_out.values()}
            for m in held_messages(f):
                yield m, qfate, None, _header_count(m), m.index in held
            for _, m in list(f.dlx.discards) + [f.dlx.checked_out[k] for k in sorted(f.dlx.checked_out)]:
                yield m, qfate, None, _header_count(m), False
            return
        for d in self.deliveries:
            yield d.msg, _D_FATE.get(d.fate, Fate.DELIVERY_LIMIT), d, _header_count(d.msg), d.checked_out
        for _, m in self.pending_dlx:
            yield m, Fate.DEAD_LETTERED, None, _header_count(m), False
        for m in self.lost:
            yield m, Fate.LOG_LOST, None, _header_count(m), False

    def file_entries(self) -> dict[int, LogEntry]:
        """Every entry the files hold readable (a good checksum), below the snapshot and past any
        damage too, later copies winning: the evidence ``export --all`` recovers from."""
        out = _permissive(self.system, self.log).entries
        out.update(self.log.entries)
        return out

    def term_of(self, index: int) -> int | None:
        e = self.log.entries.get(index)
        if e is None and self.data_replay is not None:
            e = self.data_replay.log.entries.get(index)
        return e.term if e is not None else None

    def entry_of(self, index: int) -> LogEntry | None:
        e = self.log.entries.get(index)
        if e is None and self.data_replay is not None:
            e = self.data_replay.log.entries.get(index)
        return e


#: a queue's fate -> the drop reason of every message it holds
_Q_FATE = {
    Q_NODE_DOWN: Fate.BOOT_HANG,
    Q_CRASH: Fate.QUEUE_CRASH,
    Q_UNAVAILABLE: Fate.QUEUE_UNAVAILABLE,
    Q_DELETED: Fate.QUEUE_DELETED,
}
#: a delivery's fate at the boot's drain -> Fate
_D_FATE = {
    "delivered": Fate.DELIVERED,
    "expired": Fate.EXPIRED,
    "delivery_limit": Fate.DELIVERY_LIMIT,
    "rejected": Fate.DELIVERY_LIMIT,
    "maxlen": Fate.DELIVERY_LIMIT,
}


def _header_count(m: m_fifo.Msg) -> int:
    h = m.header
    return int(h.get("acquired_count", h.get("delivery_count", 0)) or 0)


def _permissive(system: System, log: ServerLog) -> ServerLog:
    """The log as the files hold it: every framed WAL record of the server with a good checksum
    (past a bad one, an unknown writer or a torn end too) and every readable segment entry,
    later copies winning."""
    out = ServerLog(log.uid, log.path, log.config, log.name, log.snapshot, dict(), log.meta)
    entries = out.entries
    for sf in system.segments.get(log.uid, []):
        seg = sf.seg
        if seg.header != r_seg.HEADER_OK:
            continue
        rows = np.flatnonzero(np.isin(seg.status, (r_seg.ENTRY_OK, r_seg.ENTRY_NO_CRC)))
        path = sf.path
        for idx, term, off, length in zip(
            seg.index[rows].tolist(), seg.term[rows].tolist(), seg.offset[rows].tolist(), seg.length[rows].tolist()
        ):
            entries[idx] = LogEntry(idx, term, path, off, off, length, "segment", "ok")
    uid = os.fsencode(log.uid)
    labels = r_wal.CHECK_LABELS
    for scan, _ in system.wal:
        rows = scan.rows_of(uid)
        rows = rows[scan.checksum[rows] != r_wal.CHECK_BAD]
        path = scan.path
        for idx, term, off, data_off, length, check in scan.entries(rows):
            entries[idx] = LogEntry(idx, term, path, off, data_off, length, "wal", labels[check])
    return out


def _other_file(a: LogEntry, b: LogEntry | None) -> bool:
    """Whether ``b`` is a copy of the entry in another file than ``a`` (the same Path object,
    as ``read_system`` and ``_permissive`` both take them from the walks, is not compared)."""
    return b is not None and a.file is not b.file and a.file != b.file


def log_holes(log: ServerLog) -> list[tuple[int, int]]:
    """The ranges (first, last) of indexes above the snapshot and below the log's last entry that
    no segment or WAL record holds: entries the next boot never applies."""
    floor = log.snapshot.index if log.snapshot is not None and log.snapshot.index is not None else 0
    idx = sorted(i for i in log.entries if i > floor)
    out, prev = [], None
    for i in idx:
        if prev is not None and i > prev + 1:
            out.append((prev + 1, i - 1))
        prev = i
    return out


def refusal(system: System) -> tuple[str, Path, int | None] | None:
    """(why, file, offset) when the system's WAL recovery refuses a file: the Ra system does not
    start, nor does the node (whatever quorum queues it has)."""
    for scan, rec in system.wal:
        if rec.outcome != m_rec.RA_OK:
            return (
                f"{scan.path.name}: {rec.stop} ({rec.detail or 'the WAL does not recover'}): the "
                "quorum queue Ra system does not start, nor does the node",
                scan.path,
                rec.stop_offset,
            )
    return None


def _server_fate(
    system: System, log: ServerLog, model: BrokerModel, known: set | None
) -> tuple[str, str, Path | None, int | None]:
    """(fate, why, file, offset) of one server at the next boot."""
    down = refusal(system)
    if down is not None:
        return (Q_NODE_DOWN, *down)
    if known is not None and log.resource is not None and log.resource not in known:
        return Q_DELETED, "the metadata holds no such queue: the broker never starts this server", log.path, None
    unregistered = system.registered is not None and os.fsencode(log.uid) not in system.registered
    if unregistered and not model.qq_recover_elects_new_member:
        return (
            Q_UNAVAILABLE,
            "names.dets does not register this server: ra:restart_server fails "
            "(name_not_registered), RabbitMQ starts a new member under a new uid (an empty dir, this one left "
            "unread) and no election: the queue gets no leader",
            system.dir.names or system.dir.path,
            None,
        )
    for sf in system.segments.get(log.uid, []):
        if not sf.usable:
            return Q_CRASH, f"{sf.path.name}: {sf.why}: the server crashes opening it", sf.path, 0
    snap_idx = log.snapshot.index if log.snapshot is not None and log.snapshot.index is not None else -1
    for idx in sorted(i for i in log.entries if i > snap_idx):
        e = log.entries[idx]
        if e.source == "segment" and e.checksum in ("crc_mismatch", "past_eof", "inside_index"):
            what = {
                "crc_mismatch": "ra_log_segment_crc_check_failure",
                "past_eof": "ra_log_segment_unexpected_eof",
                "inside_index": "an entry placed inside the index area",
            }[e.checksum]
            return (Q_CRASH, f"entry {idx} of {e.file.name}: {what} when the server applies it", e.file, e.offset)
    if log.entries:
        first = min(log.entries)
        if first - snap_idx > 1 and not (snap_idx == -1 and first <= 1):
            return (
                Q_CRASH,
                f"the log starts at {first}, after the snapshot at {snap_idx}: "
                "{corrupt_log, gap_between_snapshot_and_first_index}",
                log.path,
                None,
            )
        # a hole further on (a segment file gone) is no crash: Ra's reads plan over the segment
        # files present only (ra_log_reader:segrefs_to_read/4, Ra 2.x; ra_log_segments
        # segment_fold_plan/3, Ra 3), so recovery skips the missing entries without a word and
        # the machine applies the rest (seen on 4.0.5: a middle segment deleted, the queue up)
    if snap_idx < 1 and not any(i >= 1 for i in log.entries) and not unregistered:
        # ra_server:is_new/1 (next_index =:= 1): ra_server_proc follower(enter) sets no election
        # timer for a new member; RabbitMQ's recover/2 restarts it and triggers no election
        empty = (
            "nothing of its log is left after recovery (no snapshot, no entry): Ra takes the "
            "server for a new member and waits for an election nobody calls"
        )
        if model.qq_empty_member_elected is False:
            return Q_UNAVAILABLE, f"{empty}: the queue gets no leader", log.path, None
        if model.qq_empty_member_elected is None:  # up, empty, or never elected: the boot's timing decides
            return (
                Q_OK,
                f"{empty}, or it is elected and comes up empty, as the boot's timing falls ({model})",
                log.path,
                None,
            )
    return Q_OK, "", None, None


def applied_beyond_log(log: ServerLog) -> tuple[int, int] | None:
    """(where the server's log ends, what meta.dets says it applied) when its log (snapshot,
    segments, the WAL records recovery keeps) ends before the index meta.dets records as
    applied, else None. Ra applies only committed entries, and an entry is committed once
    written (ra_log_wal syncs before it notifies the writer), so a log that ends below
    ``last_applied`` lost entries its machine had applied (a WAL lost, emptied or replaced; or
    the meta record damaged)."""
    applied = log.meta.last_applied if log.meta is not None else None
    if applied is None:
        return None
    snap = log.snapshot.index if log.snapshot is not None and log.snapshot.index is not None else 0
    end = max([snap, *log.entries])
    return (end, applied) if applied > end else None


def newest_machine_version(ra_dir, walks: dict | None = None) -> int | None:
    """The highest machine version a noop entry of the system's WAL files, or a snapshot's meta,
    names (version evidence: each boot's leader appends a noop carrying the version it runs;
    ``walks``: see ``wal_walk``)."""
    best = None
    for _, path in ra_dir.wal:
        scan = wal_walk(path, walks)
        small = np.flatnonzero(scan.length < 64)  # a noop is ~30 bytes
        if not len(small):
            continue
        from cqforensics.readers.files import read_bytes

        data = read_bytes(path)
        starts, ends = scan.data_offset[small].tolist(), (scan.data_offset + scan.length)[small].tolist()
        for lo in range(0, len(starts), DECODE_BATCH):
            datas = [data[a:b] for a, b in zip(starts[lo : lo + DECODE_BATCH], ends[lo : lo + DECODE_BATCH])]
            for e in decode_log_entries(datas):
                if not isinstance(e, FormatError) and e.kind == "noop" and e.machine_version is not None:
                    best = max(best or 0, e.machine_version)
    for srv in ra_dir.servers:
        for sd in srv.snapshots:
            if sd.snapshot is not None:
                snap = r_snap.read_snapshot(sd.snapshot)
                if snap.machine_version is not None:
                    best = max(best or 0, snap.machine_version)
    return best


def node_quorum(
    systems: list[System], model: BrokerModel, as_of_ms: int, bodies, known: set | None = None
) -> list[QuorumQueue]:
    """Every quorum queue member of a node's Ra systems (``read_system`` of each
    ``layout.NodeDir.quorum``), replayed, with the next boot of ``model`` predicted. ``known``:
    the (vhost, name) pairs the metadata holds (None: unreadable metadata)."""
    out = []
    for system in systems:
        for log in system.servers:
            rep = replay(log, bodies)
            res = log.resource
            vhost = res[0].decode("utf-8", "replace") if res else None
            name = res[1].decode("utf-8", "replace") if res else None
            q = QuorumQueue(system, log, rep, vhost, name)
            q.fate, q.why, q.why_file, q.why_offset = _server_fate(system, log, model, known)
            data = _permissive(system, log)
            floor = log.snapshot.index if log.snapshot is not None and log.snapshot.index is not None else -1
            above = {i for i in data.entries if i > floor}  # below the snapshot: applied already, not a loss
            if (
                above != {i for i in log.entries if i > floor}
                or any(_other_file(data.entries[i], log.entries.get(i)) for i in above)
                or log_holes(log)
                or (q.fate != Q_OK and (not log.entries or min(log.entries) - floor > 1))
            ):
                # the files' own state: what a queue the boot loses holds, or what recovery drops (a
                # log with holes: an enqueue past one is not an out-of-sequence publish)
                q.data_replay = replay(data, bodies, lenient=True)
            if q.fate == Q_OK:
                q.deliveries = boot(rep, model.fifo_machine_version, as_of_ms)
                if rep.fifo is not None and rep.fifo.cfg.dead_letter_handler == "at_most_once":
                    applied = (
                        log.meta.last_applied if log.meta is not None and log.meta.last_applied is not None else -1
                    )
                    q.boot_dead_letters = [(r, m) for i, r, m in rep.fifo.published if i > applied]
                    q.boot_dead_letters += [
                        ("delivery_limit", d.msg) for d in q.deliveries if d.fate == "delivery_limit"
                    ]
                if rep.fifo is not None:
                    q.pending_dlx = list(rep.fifo.dlx.discards) + [
                        rep.fifo.dlx.checked_out[k] for k in sorted(rep.fifo.dlx.checked_out)
                    ]
            if q.fate == Q_OK and q.data_replay is not None and q.data_replay.fifo is not None:
                now = {d.msg.index for d in q.deliveries} | {m.index for _, m in q.pending_dlx}
                q.lost = [m for m in held_messages(q.data_replay.fifo) if m.index not in now]
            out.append(q)
    return out


def dead_letter_view(
    fields: dict,
    reason: str,
    source: tuple[bytes, bytes],
    exchange: bytes,
    rk: bytes | None,
    as_of_ms: int,
    broker: tuple[int, int, int],
) -> dict:
    """A message as rabbit_dead_letter:make_msg/5 (3.10-3.12; 3.13+ mc:record_death and the
    0-9-1 view of its deaths) republishes it, for a first death: the ``x-death`` header
    (count, reason, queue, time, exchange, routing-keys), ``x-first-death-*`` (and 4.x
    ``x-last-death-*``) headers, no expiration, the dead-letter exchange and routing key. The
    time is the boot's clock: predicted as ``as_of``."""
    from cqforensics.codecs import amqp091

    out = dict(fields)
    vhost, queue = source
    keys = list(out.get("routing_keys") or [])
    death = {
        "count": {"type": "long", "value": 1},
        "exchange": {"type": "longstr", "value": out.get("exchange") or ""},
        "queue": {"type": "longstr", "value": queue.decode("utf-8", "replace")},
        "reason": {"type": "longstr", "value": reason},
        "routing-keys": {"type": "array", "value": [{"type": "longstr", "value": k} for k in keys[:1]]},
        "time": {"type": "timestamp", "value": as_of_ms // 1000},
    }
    headers = json.loads(out["headers"]) if out.get("headers") else {}
    headers = {k: v for k, v in headers.items() if k != "x-delivery-count"}
    if "x-death" not in headers:
        headers["x-first-death-exchange"] = death["exchange"]
        headers["x-first-death-queue"] = death["queue"]
        headers["x-first-death-reason"] = death["reason"]
        headers["x-death"] = {"type": "array", "value": [{"type": "table", "value": death}]}
    if broker >= (3, 13, 0):
        headers["x-last-death-exchange"] = death["exchange"]
        headers["x-last-death-queue"] = death["queue"]
        headers["x-last-death-reason"] = death["reason"]
    if rk is not None:
        headers.pop("CC", None)
    out["headers"] = amqp091.headers_json(dict(sorted(headers.items())))
    out["properties"] = {**out["properties"], "expiration": None}
    out["exchange"] = exchange.decode("utf-8", "replace")
    out["routing_keys"] = [rk.decode("utf-8", "replace")] if rk is not None else keys
    out["msg_id"] = None
    return out


def held_messages(f: m_fifo.Fifo) -> list[m_fifo.Msg]:
    """Every message a state holds (returned, ready, checked out), in the order a consumer would
    get them (checked-out ones last)."""
    out = list(f.returns) + f.messages.items()
    for _, c in sorted(f.consumers.items(), key=lambda kv: etf.term_order_key(kv[0])):
        out += [c.checked_out[k] for k in sorted(c.checked_out)]
    for _, c in f.waiting:
        out += [c.checked_out[k] for k in sorted(c.checked_out)]
    return out


__all__ = [
    "Delivery",
    "LogEntry",
    "QuorumQueue",
    "Replay",
    "SegmentFile",
    "ServerLog",
    "System",
    "boot",
    "delivered_view",
    "held_messages",
    "message_term",
    "node_quorum",
    "read_system",
    "replay",
]
