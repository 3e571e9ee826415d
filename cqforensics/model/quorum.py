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

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

from cqforensics import etf, rabbit_fifo
from cqforensics.errors import FormatError
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
    entry_kinds: dict[int, str] = field(default_factory=dict)  # index -> command name (the raft_log table)
    error: str | None = None


def _decode(entry: LogEntry, bodies):
    return rabbit_fifo.decode(entry.data(bodies))


def replay(log: ServerLog, bodies, upto: int | None = None) -> Replay:
    """Apply the snapshot and every log entry above it, in index order (``upto``: stop there);
    ``bodies``: the ``model.bodies.Bodies`` the entries are read through."""
    buffers = bodies
    cfg = m_fifo.cfg_from_map(log.config.machine_config) if log.config is not None and log.config.terms else m_fifo.Cfg()
    fifo = None
    start = 0
    out = Replay(log, None)
    snap = log.snapshot
    if snap is not None and snap.ok and snap.index is not None:
        try:
            fifo = m_fifo.from_snapshot(snap.state(), snap.machine_version or 0, cfg)
            start = snap.index
            out.last_index, out.last_term = snap.index, snap.term or 0
        except (FormatError, ValueError) as e:
            out.notes.append(f"snapshot {snap.path}: its state is not read ({e}); replayed from the log alone")
            fifo = None
    for idx in sorted(i for i in log.entries if i > start and (upto is None or i <= upto)):
        e = log.entries[idx]
        try:
            entry = _decode(e, buffers)
        except FormatError as err:
            out.notes.append(f"entry {idx} ({e.file.name}@{e.offset}) is no term: {err.message}")
            out.entry_kinds[idx] = "undecodable"
            continue
        out.last_index, out.last_term = idx, e.term
        if entry.kind == "noop":
            mv = entry.machine_version or 0
            if fifo is None:
                fifo = m_fifo.Fifo(cfg, mv)
            else:
                fifo.upgrade(mv)
            out.entry_kinds[idx] = "noop"
            continue
        if entry.kind != "command":
            out.entry_kinds[idx] = entry.kind
            continue
        cmd = entry.command
        out.entry_kinds[idx] = cmd.name
        if fifo is None:  # commands before any noop: only after a gap (the log's start lost)
            fifo = m_fifo.Fifo(cfg, 0)
        meta = {"index": idx, "term": e.term, "ts": entry.ts, "reply": entry.reply}
        try:
            fifo.apply(meta, cmd)
            out.applied += 1
        except m_fifo.Unsupported as u:
            out.notes.append(f"entry {idx}: {u} not applied")
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as err:
            out.notes.append(f"entry {idx}: {cmd.name} not applied ({type(err).__name__})")
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
    f = copy.deepcopy(f0)
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
        out.append(Delivery(m, pos, m.index in held, dc, dc > 0, "delivered",
                            "checked_out" if m.index in held else "returned" if m.index in returned else "ready"))
    for reason, m, _ in f.dead_lettered:  # expired at the drain
        out.append(Delivery(m, -1, m.index in held, _reported_count(m, f.mv), False, reason,
                            "checked_out" if m.index in held else "ready"))
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
        from cqforensics import amqp091

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
        from cqforensics import amqp091

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

    @property
    def outcome(self) -> str:
        return next((r.outcome for _, r in self.wal if r.outcome != m_rec.RA_OK), m_rec.RA_OK)


def read_system(ra_dir, model: BrokerModel) -> System:
    """Read ``quorum/<node>/`` (``layout.RaSystemDir``) as the next boot of ``model`` recovers it."""
    sys_ = System(ra_dir)
    sys_.names = r_sys.read_names(ra_dir.names) if ra_dir.names is not None else r_sys.Table(error="missing")
    sys_.meta = r_sys.read_meta(ra_dir.meta) if ra_dir.meta is not None else r_sys.Table(error="missing")
    registered = {r.uid for r in sys_.names.records}
    names = {r.uid: r.name for r in sys_.names.records}
    metas = {r.uid: r for r in sys_.meta.records}
    logs: dict[str, ServerLog] = {}
    snap_index: dict[bytes, int] = {}
    for srv in ra_dir.servers:
        cfg = r_sys.read_config(srv.config) if srv.config is not None else None
        log = ServerLog(srv.uid, srv.path, cfg, names.get(srv.uid.encode()), meta=metas.get(srv.uid.encode()))
        snaps = []
        for sd in srv.snapshots:
            if sd.kind == "snapshot" and sd.snapshot is not None:
                snaps.append(r_snap.read_snapshot(sd.snapshot))
        chosen, _ = m_rec.choose_snapshot(snaps)
        log.snapshot = chosen
        sys_.snapshots[srv.uid] = ([chosen] if chosen else []) + [s for s in snaps if s is not chosen]
        if chosen is not None and chosen.index is not None:
            snap_index[srv.uid.encode()] = chosen.index
        segs = []
        for _, path in srv.segments:
            seg = r_seg.read_segment(path)
            ok, why = m_rec.ra_segment_usable(seg, model)
            segs.append(SegmentFile(path, seg, ok, why))
            if not ok:
                continue
            for i in range(len(seg)):
                idx = int(seg.index[i])
                status = int(seg.status[i])
                log.entries[idx] = LogEntry(idx, int(seg.term[i]), path, int(seg.offset[i]), int(seg.offset[i]),
                                            int(seg.length[i]), "segment",
                                            "ok" if status == r_seg.ENTRY_OK else r_seg.ENTRY_LABELS[status])
        sys_.segments[srv.uid] = segs
        logs[srv.uid] = log
    for _, path in ra_dir.wal:
        scan = r_wal.walk(path)
        rec = m_rec.wal_recovery(scan, model, registered, snap_index)
        sys_.wal.append((scan, rec))
        for i in rec.kept:
            uid = scan.uid(i)
            log = logs.get(uid.decode("utf-8", "replace")) if uid is not None else None
            if log is None:
                continue
            idx = int(scan.index[i])
            check = r_wal.CHECK_LABELS[int(scan.checksum[i])]
            log.entries[idx] = LogEntry(idx, int(scan.term[i]), path, int(scan.offset[i]), int(scan.data_offset[i]),
                                        int(scan.length[i]), "wal", check)
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


__all__ = ["Delivery", "LogEntry", "Replay", "SegmentFile", "ServerLog", "System", "boot", "delivered_view", "message_term",
           "read_system", "replay"]
