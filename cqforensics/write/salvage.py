"""``compact`` and ``rebuild``: a new node dir whose message stores hold exactly the messages
kept from SRC's queue indexes, written the way the broker lays them out.

Both read SRC with the scan the readers and fsck use and copy each kept message's bytes
unchanged (shared-store entries whole, ``.qs`` entries with their header, CQv1 embedded terms),
so the broker delivers them exactly as before. SeqIds are kept (delivery order and the
``messages`` table's ``seq_id`` stay the same); ``.qs`` offsets are rewritten; shared-store
entries are written once, in their original order, rolled at the file size limit. Everything
outside ``msg_stores/vhosts`` (metadata, feature flags, quorum and stream data) is copied
unchanged, and no clean-shutdown file is written, so the broker rebuilds its indexes.

* compact keeps what the next boot of SRC would deliver (expired messages too: the broker
  drops those itself, by its own clock) and refuses a damaged SRC (``rebuild`` is for that);
* rebuild also keeps every message whose bytes are intact although the broker's recovery would
  drop it (behind a zeroed range its store scan stops at, in a segment with a bad header, in a
  queue whose index damage crashes it, ...), checking that each one decodes; what is readable
  but not deliverable (transient, unknown queue, failed CRC, undecodable, unreferenced) goes to
  ``lost+found/`` with its raw bytes and the reason; what has no bytes left is reported lost.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pickle
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from cqforensics.base import exitcodes
from cqforensics.base.enums import Fate, Location
from cqforensics.base.errors import CQError, FormatError, OperationalError, display, display_all, plural, queue_ref
from cqforensics.discovery import nodes as layout
from cqforensics.grammar import qi as c_qi
from cqforensics.grammar import rdq as c_rdq
from cqforensics.message import fast as fastpath
from cqforensics.model.options import make_options
from cqforensics.model.recovery import (
    BY_DESIGN,
    KEPT_AS_IS,
    QUARANTINED,
    SALVAGEABLE,
    intrinsic_fate,
    qs_fate,
)
from cqforensics.model.store import Spill, distinct
from cqforensics.model.versions import BrokerModel
from cqforensics.model.versions import model as version_model
from cqforensics.model.vhost import NodeScan, VhostScan
from cqforensics.output.guard import check_output
from cqforensics.readers import files as r_files
from cqforensics.readers import qs as r_qs
from cqforensics.readers import rdq as r_rdq
from cqforensics.write import formats
from cqforensics.write.output import Staging, copy_tree
from cqforensics.write.store import Entry, QueueWriter, SharedStoreWriter, Sources

_KEY = 1 << 40  # a shared-store entry's (file position, offset) as one sortable integer


class DamagedSource(CQError):
    """compact met damage: exit 4 (errors left), nothing written."""

    exit_code = exitcodes.ERRORS_LEFT


@dataclass
class QueueResult:
    node: str
    vhost: str | None
    queue: str | None
    priority: int | None
    dir: str
    index_version: int | None = None  # in SRC
    written_version: int | None = None
    messages: int = 0  # held by SRC's index (published, not acked)
    written: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # not written, by design
    quarantined: dict[str, int] = field(default_factory=dict)  # lost+found, bytes kept
    lost: dict[str, int] = field(default_factory=dict)  # no bytes left to keep
    broker_would_deliver: int | None = None  # what SRC's next boot delivers (rebuild)
    broker_would_expire: int | None = None  # ... and keeps until their TTL drops them
    skipped: str | None = None  # why the whole dir was not written
    restored: int = 0  # rebuild --restore-orphans: orphaned store messages written into this queue (in ``written``)

    def to_dict(self) -> dict:
        return {
            "node": self.node,
            "vhost": self.vhost,
            "queue": self.queue,
            "priority": self.priority,
            "queue_dir": self.dir,
            "index_version": self.index_version,
            "written_version": self.written_version,
            "messages": self.messages,
            "written": self.written,
            "restored_orphans": self.restored,
            "broker_would_deliver": self.broker_would_deliver,
            "broker_would_expire": self.broker_would_expire,
            "dropped": self.dropped,
            "quarantined": self.quarantined,
            "lost": self.lost,
            "skipped": self.skipped,
        }


@dataclass
class Result:
    command: str
    source: str
    output: str
    dry_run: bool
    broker_version: str = ""  # the version(s) the output is written for
    source_version: str = ""  # the version(s) SRC was read as (what its own next boot does)
    queues: list[QueueResult] = field(default_factory=list)
    bytes_before: int = 0  # every file under SRC's msg_stores/vhosts
    bytes_after: int = 0  # every file written under the output's msg_stores/vhosts
    store_entries_before: int = 0
    store_entries_written: int = 0
    store_files_written: int = 0
    garbage: dict[str, list[int]] = field(default_factory=dict)  # orphan/duplicate: [entries, bytes] not written
    lost_found: int = 0
    lost_found_path: str | None = None
    notes: list[str] = field(default_factory=list)
    verified: bool | None = None
    threshold: float | None = None  # compact --threshold PCT: only files above it are rewritten
    # compact: each source shared-store file and what became of it: node, vhost, file, size,
    # live_bytes, garbage_ratio, action (rewritten / kept), why (when not the ratio)
    store_files: list[dict] = field(default_factory=list)
    # rebuild --restore-orphans: each orphaned message written back (node, vhost, queue, msg_id, file, offset)
    restored: list[dict] = field(default_factory=list)
    # why the target version cannot boot the output as written (per node): an output that cannot
    # boot is no success (exit 4); it is kept, since its message stores are right and are what
    # --template or a hand transplant needs
    cannot_boot: list[str] = field(default_factory=list)

    @property
    def rescued(self) -> int:
        """Messages written that SRC's own next boot would have lost."""
        return sum(
            max(0, q.written - q.broker_would_deliver - q.broker_would_expire)
            for q in self.queues
            if q.broker_would_deliver is not None
        )

    @property
    def exit_code(self) -> int:
        """e2fsck style, bits: 1 (rebuild) when SRC was damaged and repaired (messages rescued, or
        lost or quarantined for reasons other than being transient or in a deleted queue); 4 when
        the output is written but the target version cannot boot it (``cannot_boot``)."""
        code = exitcodes.ERRORS_LEFT if self.cannot_boot else exitcodes.OK
        if self.command != "rebuild":
            return code
        by_design = {f.label for f in BY_DESIGN} | {formats.NOT_REPRESENTABLE}  # not damage of SRC
        damage = any(set(q.lost) - by_design or set(q.quarantined) - by_design for q in self.queues)
        return code | (exitcodes.FIXED if self.rescued or damage or "torn" in self.garbage else exitcodes.OK)

    def totals(self) -> dict:
        def total(key):
            out: dict[str, int] = {}
            for q in self.queues:
                for k, v in getattr(q, key).items():
                    out[k] = out.get(k, 0) + v
            return out

        return {
            "messages": sum(q.messages for q in self.queues),
            "written": sum(q.written for q in self.queues),
            "rescued": self.rescued,
            "restored_orphans": sum(q.restored for q in self.queues),
            "dropped": total("dropped"),
            "quarantined": total("quarantined"),
            "lost": total("lost"),
        }

    def to_dict(self) -> dict:
        return {
            "format": f"cqforensics-{self.command}/1",
            "command": self.command,
            "source": self.source,
            "output": self.output,
            "dry_run": self.dry_run,
            "broker_version": self.broker_version,
            "source_version": self.source_version,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "bytes_reclaimed": self.bytes_before - self.bytes_after,
            "store_entries_before": self.store_entries_before,
            "store_entries_written": self.store_entries_written,
            "store_files_written": self.store_files_written,
            "garbage_not_written": self.garbage,
            "threshold": self.threshold,
            "store_files": self.store_files,
            "lost_found": {"items": self.lost_found, "path": self.lost_found_path},
            "totals": self.totals(),
            "restored_orphans": display_all(self.restored),
            "queues": [q.to_dict() for q in self.queues],
            "notes": display_all(self.notes),
            "verified": self.verified,
            "cannot_boot": display_all(self.cannot_boot),
            "exit_code": self.exit_code,
        }


def _bump(d: dict, key: str, n: int = 1) -> None:
    d[key] = d.get(key, 0) + n


# -- lost+found ------------------------------------------------------------------------------------


class LostFound:
    """``lost+found/``: ``lost+found.jsonl`` (one line per item: where it was, why it is here,
    what it decodes to) and ``raw/<n>.etf`` (the stored term bytes, as found)."""

    def __init__(self, root: Path | None):
        self.root = root  # None: count only (dry run)
        self.items = 0
        self._out = None

    def add(self, reason: str, where: dict, raw: bytes | None, detail: str = "") -> None:
        self.items += 1
        if self.root is None:
            return
        if self._out is None:
            (self.root / "raw").mkdir(parents=True, exist_ok=True)
            self._out = open(self.root / "lost+found.jsonl", "x", encoding="utf-8")
        line = {"item": self.items, "reason": reason, "detail": detail, **where, "raw": None, "raw_bytes": None}
        if raw is not None:
            raw = bytes(raw)
            name = f"raw/{self.items:06d}.etf"
            with open(self.root / name, "xb") as f:
                f.write(raw)
            line.update(raw=name, raw_bytes=len(raw), raw_sha256=hashlib.sha256(raw).hexdigest())
            line.update(_summary(raw))
        # paths and names as text (``display``): an undecodable file name is no valid UTF-8
        self._out.write(json.dumps(display_all(line), ensure_ascii=False, default=str) + "\n")

    def close(self) -> None:
        if self._out is not None:
            self._out.flush()
            os.fsync(self._out.fileno())
            self._out.close()
            self._out = None


def _summary(raw: bytes) -> dict:
    try:
        m = fastpath.decode(raw)
    except Exception as e:  # damaged bytes are why many items are here
        return {"decode_error": f"{type(e).__name__}: {e}"[:300]}
    props = dict(m["properties"])
    return {
        "term_format": m["term_format"],
        "msg_id": m["msg_id"].hex() if m["msg_id"] else None,
        "exchange": m["exchange"],
        "routing_keys": m["routing_keys"],
        "properties": props,
        "headers": json.loads(m["headers"]) if m["headers"] else None,
        "body_size": len(m["body"]),
        "body_sha256": hashlib.sha256(m["body"]).hexdigest(),
        "body_base64": base64.b64encode(m["body"][:4096]).decode() if len(m["body"]) <= 4096 else None,
    }


# -- one vhost --------------------------------------------------------------------------------------


@dataclass
class RewriteContext:
    """What rewriting one vhost after another shares (``rewrite_vhost``): the command's rules
    (compact or rebuild), the result being filled in, open sources, lost+found, the output's
    shared-store file size limit, and what compact found that makes SRC unfit."""

    command: str
    result: Result
    sources: Sources
    lost: LostFound
    dry: bool
    limit: int
    damage: list[str] = field(default_factory=list)  # compact: what makes SRC unfit (the first few)
    damaged: int = 0  # compact: messages that make SRC unfit
    target: BrokerModel | None = None  # the version the output is written for (None: SRC's)
    reterm: Reterms | None = None  # this vhost: the shared-store terms re-encoded for the target
    v2_count: dict[Path, int] = field(default_factory=dict)  # vhost dir -> v2 segment size seen
    torn: dict[bytes, tuple] = field(default_factory=dict)  # this vhost: id -> marker-less entry
    repaired: dict[bytes, bytes] = field(default_factory=dict)  # this vhost: id -> whole term of a torn entry
    threshold: float | None = None  # compact --threshold: garbage percentage above which a file is rewritten
    kept_paths: list[Path] = field(default_factory=list)  # output files copied whole (verify tolerates their garbage)
    restore_orphans: frozenset = frozenset()  # rebuild: queue names (bytes) orphans are written back into

    @classmethod
    def start(
        cls,
        command: str,
        source,
        output,
        sources: Sources,
        limit: int = c_rdq.FILE_SIZE_LIMIT,
        lost_found: Path | None = None,
        dry_run: bool = False,
        target: BrokerModel | None = None,
    ) -> RewriteContext:
        """A context with a new, empty ``Result``; ``lost_found``: where lost+found goes
        (None: items are only counted); ``target``: the version written for (None: each
        vhost's own)."""
        return cls(
            command,
            Result(command, display(source), display(output), dry_run),
            sources,
            LostFound(lost_found),
            dry_run,
            limit,
            target=target,
        )

    @property
    def rebuild(self) -> bool:
        return self.command == "rebuild"


def _read_small(path: Path) -> bytes | None:
    """A small file's bytes; None when absent, unreadable or not a regular file (a FIFO would
    block ``open()`` forever)."""
    try:
        return r_files.read_optional(path)
    except (CQError, OSError):
        return None


def _put_file(ctx: RewriteContext, path: Path, data: bytes) -> None:
    """A small file of the output (made durable with the rest by ``Staging.commit``)."""
    ctx.result.bytes_after += len(data)
    if not ctx.dry:
        with open(path, "xb") as f:
            f.write(data)


@dataclass
class _QueuePlan:
    """One queue dir the rewrite writes (or skips): a source queue dir (``q``), or the dir of a
    durable queue whose index dir is gone that --restore-orphans writes (``q`` None)."""

    q: layout.QueueDir | None
    qr: QueueResult
    out_dir: str
    vout: int | None  # the index version written (None: not written)
    stub: bytes | None  # its .queue_name
    restore: bytes | None = None  # --restore-orphans: the queue name orphans routed to it are found by
    #: per source chunk, in order: (segment size the writer takes from it on, or None; seq id shift)
    chunks: list[tuple[int | None, int]] = field(default_factory=list)
    orphans: list[tuple] = field(default_factory=list)  # restore candidates (``_orphans_to_restore``)

    @property
    def written(self) -> bool:
        return not self.qr.skipped


def _plan_dirs(vs: VhostScan, ctx: RewriteContext, model: BrokerModel) -> list[_QueuePlan]:
    """Every queue dir of the vhost, then (--restore-orphans) the lost queues to write, with the
    results they fill in (in ``ctx.result``, in that order)."""
    vh = vs.vhost
    node = vs.node.node.node
    vhost_label = vh.name if vh.name is not None else vh.label
    plans = []
    for q in vs.all_queue_dirs:
        qr = QueueResult(node, vhost_label, q.name, q.priority, q.dir_name, q.index_version)
        ctx.result.queues.append(qr)
        known = vs.queue_known(q)
        own = vs.node.renamed_dir(vh, q) if ctx.rebuild else None
        out_dir = own[0] if own is not None else q.dir_name
        if own is not None:
            ctx.result.notes.append(
                f"{node}: vhost {vhost_label!r}: queue dir {q.dir_name} holds the index of "
                f"queue {q.label!r}, whose own dir {own[0]} is missing: written back as {own[0]}"
            )
        if known is False:
            qr.skipped = "not a durable queue in the metadata: the broker deletes this dir at boot"
        vin = q.index_version
        vout = formats.index_version(model, current=vin) if vin is not None else None
        if (
            not qr.skipped
            and q.name_source != ".queue_name"
            and q.name_raw is None
            and not q.qi
            and not q.idx
            and q.journal is None
        ):  # a dir with no name and no index: nothing a boot could read
            qr.skipped = "an empty queue dir without a readable .queue_name: nothing to write"
        qr.written_version = None if qr.skipped else vout
        stub = None
        if not qr.skipped:
            # the source's own .queue_name only when it parsed and matched its dir; a damaged one
            # is written afresh from the name the metadata gives the dir (never copied damaged)
            stub = q.stub if q.name_source == ".queue_name" else None
            if stub is None and q.name_raw is not None and vh.name_raw is not None:
                stub = formats.queue_name_stub(vh.name_raw, q.name_raw, vout or 2)
        restore = q.name_raw if not qr.skipped and q.priority is None and q.name_raw in ctx.restore_orphans else None
        plans.append(_QueuePlan(q, qr, out_dir, vout, stub, restore))
    for lq in vs.lost_queues if ctx.restore_orphans else ():  # queues whose index dir is gone
        if lq.vhost_dir != vh.dir_name or lq.name not in ctx.restore_orphans:
            continue
        if lq.levels > 1:
            ctx.result.notes.append(
                f"{node}: vhost {vhost_label!r}: queue {lq.label!r} is a priority queue: "
                "--restore-orphans does not write its levels"
            )
            continue
        ((dir_name, _, _),) = lq.dirs
        stored = lq.name  # not a priority queue: the dir is named from the queue's own name
        declared = vs.node.metadata.arguments(lq.vhost, lq.name).get("x-queue-version")
        vout = formats.index_version(model, declared if isinstance(declared, int) else None)
        qr = QueueResult(node, vhost_label, lq.name.decode("utf-8", "replace"), None, dir_name, None, vout)
        ctx.result.queues.append(qr)
        plans.append(_QueuePlan(None, qr, dir_name, vout, formats.queue_name_stub(lq.vhost, stored, vout), lq.name))
    return plans


def _plan_chunks(vs: VhostScan, plan: _QueuePlan, ctx: RewriteContext, refs, store_pos, first: bool):
    """The source dir's chunks as ``(segment size to set or None, positions, entries)``: the
    entries to write of the chunk's live entries in the scan's share (all when unshared), with
    their positions among all its live entries. ``first``: the first pass over the dir, which
    records what each chunk's header says (the later shares' passes go by that record)."""
    if plan.q is None:
        return
    vh = vs.vhost
    for c, qx in enumerate(vs.index_of(plan.q, in_share=False)):
        if first:
            # a v2 segment is written with the size its header records (the broker's
            # classic_queue_index_v2_segment_entry_count); one with a bad header with the
            # size the vhost's other segments have
            shift, count = 0, None
            if qx.version == 2 and qx.header is not None:
                ok, low, to = qx.header.ok, qx.header.from_seq_id, qx.header.to_seq_id
                if ok:
                    ctx.v2_count.setdefault(vh.path, to - low)
                count = to - low if ok else ctx.v2_count.get(vh.path, c_qi.DEFAULT_SEGMENT_ENTRY_COUNT)
                shift = qx.segment * count - low
            elif plan.vout == 2:
                count = ctx.v2_count.get(vh.path, c_qi.DEFAULT_SEGMENT_ENTRY_COUNT)
            plan.chunks.append((count, shift))
        count, shift = plan.chunks[c]
        rows = vs.chunk_rows(qx)
        pos = np.arange(len(qx.live)) if rows is None else np.flatnonzero(rows[qx.live])
        qx.live = qx.live[pos]
        if not len(qx.live):
            yield count, pos, []
            continue
        entries, at = _chunk_entries(vs, qx, vs.resolve(qx), plan.qr, ctx, refs, store_pos, plan.written, shift)
        yield count, pos[at], entries


def _write_queue(
    vs: VhostScan, out: Path, ctx: RewriteContext, plan: _QueuePlan, chunks, orphans: Callable, extra: dict | None
) -> list:
    """Write one planned queue dir from its chunks (``(segment size or None, positions, entries)``,
    in seq order), then the orphans restored into it and the Spark writer's rows for it; returns
    the rows written (in a list: none or one)."""
    vh = vs.vhost
    writer = None
    if plan.written:
        vout = plan.vout or 2
        writer = QueueWriter(
            out / "queues" / plan.out_dir,
            ctx.sources,
            vout,
            vh.segment_entry_count if vout == 1 else c_qi.DEFAULT_SEGMENT_ENTRY_COUNT,
            plan.stub,
            dry=ctx.dry,
        )
        if plan.stub is not None:
            ctx.result.bytes_after += len(plan.stub)
    for count, _, entries in chunks:
        if writer is not None and count is not None:
            writer.set_entry_count(count)
        if writer is not None and entries:
            writer.add(entries)
    if writer is None:
        return []
    if plan.restore is not None:
        writer.add(_restore(orphans(), writer.next_seq, plan.qr, ctx))
    rows = extra.pop(plan.q.dir_name, None) if extra and plan.q is not None else None
    if rows is not None:
        writer.add(rows.entries(writer.next_seq))
    writer.close()
    plan.qr.written = writer.stats.messages - (rows.count if rows is not None else 0)
    ctx.result.bytes_after += writer.stats.bytes
    return [rows] if rows is not None else []


class _EntrySpill:
    """A rewrite in id shares: each share's pass over every queue dir writes the entries of its
    chunks, in queue and chunk order, to a temporary file of its own; the queue writers then read
    every share's file in step, a chunk at a time, merging its entries back into index order."""

    def __init__(self, parts: int):
        self.files = [tempfile.TemporaryFile(prefix="cqf-entries-") for _ in range(parts)]

    def add(self, k: int, pos: np.ndarray, entries: list[Entry]) -> None:
        pickle.dump((pos, entries), self.files[k], protocol=pickle.HIGHEST_PROTOCOL)

    def rewind(self) -> None:
        for f in self.files:
            f.seek(0)

    def chunks(self, plan: _QueuePlan):
        """The plan's chunks, every share's part read and merged (a chunk's entries at a time)."""
        for count, _ in plan.chunks:
            parts = [pickle.load(f) for f in self.files]
            pos = np.concatenate([p for p, _ in parts])
            entries = [e for _, es in parts for e in es]
            yield count, pos, [entries[i] for i in np.argsort(pos, kind="stable").tolist()]

    def close(self) -> None:
        for f in self.files:
            f.close()


#: a store entry written from: its key, size, whether it needs no new copy, and where its term
#: re-encoded for the target version is (``Reterms``; length -1: copied as stored) with its id
KEY_RECORD = np.dtype(
    [
        ("key", np.int64),
        ("total", np.int64),
        ("skip", bool),
        ("term_at", np.int64),
        ("term_len", np.int64),
        ("msg_id", "V16"),
    ]
)


class Reterms:
    """The shared-store terms re-encoded for the target version, by store key: each written to a
    temporary file as it is made; a share's keys and places are held until its records take them
    (``take``), so memory holds one share's."""

    def __init__(self):
        self.file = tempfile.TemporaryFile(prefix="cqf-terms-")
        self.at: dict[int, tuple[int, int, bytes]] = {}  # key -> (place, length, id), this share
        self.files: set[int] = set()  # file positions with a term re-encoded
        self.count = 0

    def __setitem__(self, key: int, value: tuple[bytes, bytes]) -> None:
        msg_id, term = value
        at = self.file.seek(0, 2)
        self.file.write(term)
        self.at[key] = (at, len(term), msg_id)
        self.files.add(key // _KEY)
        self.count += 1

    def __bool__(self) -> bool:
        return self.count > 0

    def take(self, rec: np.ndarray) -> np.ndarray:
        """``rec`` (``KEY_RECORD``) with the places of its re-encoded terms; forgets them."""
        rec["term_len"] = -1
        for i, key in enumerate(rec["key"].tolist()) if self.at else ():
            hit = self.at.get(key)
            if hit is not None:
                rec["term_at"][i], rec["term_len"][i] = hit[0], hit[1]
                rec["msg_id"][i] = np.frombuffer(hit[2], "V16")[0]
        self.at = {}
        return rec

    def read(self, at: int, length: int) -> bytes:
        self.file.seek(at)
        return self.file.read(length)

    def close(self) -> None:
        self.file.close()


class _StoreKeys(Spill):
    """Per share, the shared-store entries its messages are written from (``KEY_RECORD``),
    sorted, in the share's file of a ``Spill``; read back merged in key order a source file at
    a time (``by_file``), so the copy holds one file's records."""

    BLOCK = 1 << 16  # records read at once from a share's file

    def __init__(self, parts: int):
        super().__init__(KEY_RECORD, parts)

    def put(self, k: int, rec: np.ndarray) -> None:
        """The share's records, replacing any it had (written as ``Spill.add`` writes: by
        ``pwrite``, its size kept, which ``load`` reads by)."""
        self.files[k].truncate(0)
        self.sizes[k] = 0
        data = memoryview(rec.tobytes())
        while data:
            n = os.pwrite(self.files[k].fileno(), data, self.sizes[k])
            self.sizes[k] += n
            data = data[n:]

    def load(self, k: int) -> np.ndarray:
        return super().load(k).copy()  # writable

    def by_file(self):
        """Every share's records of one source file after another, in key order."""
        for f in self.files:
            f.seek(0)
        held = [np.zeros(0, KEY_RECORD) for _ in self.files]
        done = [False] * len(self.files)

        def fill(k: int) -> None:
            while not done[k] and not len(held[k]):
                raw = self.files[k].read(self.BLOCK * KEY_RECORD.itemsize)
                done[k] = len(raw) < self.BLOCK * KEY_RECORD.itemsize
                held[k] = np.frombuffer(raw, KEY_RECORD)

        while True:
            for k in range(len(held)):
                fill(k)
            heads = [int(h["key"][0]) for h in held if len(h)]
            if not heads:
                return
            end = (min(heads) // _KEY + 1) * _KEY
            out = []
            for k in range(len(held)):
                while len(held[k]):
                    cut = int(np.searchsorted(held[k]["key"], end))
                    out.append(held[k][:cut])
                    held[k] = held[k][cut:]
                    if len(held[k]):
                        break
                    fill(k)
            rec = np.concatenate(out)
            yield rec[np.argsort(rec["key"], kind="stable")]

    def close(self) -> None:
        for f in self.files:
            f.close()


def _share_scans(vs: VhostScan, parts: int):
    """The scan of each id share of the vhost in turn (``vs`` itself when it is read whole)."""
    if parts == 1:
        yield vs
        return
    for k in range(parts):
        sub = vs.share_scan(k, parts)
        try:
            yield sub
        finally:
            sub.close()


def rewrite_vhost(vs: VhostScan, out: Path, ctx: RewriteContext, extra: dict | None = None) -> None:
    """Rewrite one vhost's store into ``out``. ``extra`` (the Spark writer's append) maps queue
    dir names to more messages to write after the ones the dir holds: objects with the interface
    of ``rows.QueueRows`` (``dir_name``, ``index_version``, ``stub``, ``count``, ``entries(first_seq)``,
    ``shared_terms()``); the dirs written are popped from it.

    A vhost the readers read in message-id shares (``VhostScan.shares``) is rewritten the same
    way, so memory stays bounded whatever the store's size: each share's pass resolves its
    messages and spills the entries to write (``_EntrySpill``) and the store entries they come
    from (``_StoreKeys``); the queue dirs are then written from the spills merged back into index
    order, and the store copied in its original order. The output is the same as a read whole."""
    vh = vs.vhost
    node = vs.node.node.node
    vhost_label = vh.name if vh.name is not None else vh.label
    model = ctx.target or vs.model  # what the output is written for
    if not ctx.dry:
        (out / "queues").mkdir(parents=True)
        (out / "msg_store_transient").mkdir()
    # .vhost holds the name exactly: a damaged one is written afresh from the name the metadata
    # gives the dir; with no name known it is left out (the broker writes it when it recovers the
    # vhost, rabbit_vhost:recover/1, and never reads it): a copy of damaged bytes is no name
    if vh.name_raw is not None:
        _put_file(ctx, out / ".vhost", vh.name_raw)
    else:
        ctx.result.notes.append(
            f"{display(node)}/{display(vhost_label)}: no name is known for vhost dir "
            f"{display(vh.dir_name)} (its .vhost names no vhost, nor does the metadata): "
            "written without .vhost, which the broker writes when it recovers the vhost"
        )
    raw = _read_small(vh.path / ".config")
    if raw is not None:
        _put_file(ctx, out / ".config", raw)
    ctx.repaired = {}
    ctx.reterm = Reterms()
    # rebuild: a queue dir renamed away from its queue's own dir (which is missing) is written
    # back as that dir; the broker would delete it and boot the queue empty
    vs.keep_renamed = ctx.rebuild
    plans = _plan_dirs(vs, ctx, model)
    parts = vs.shares
    spill = _EntrySpill(parts) if parts > 1 else None
    keys = _StoreKeys(parts)
    files: list = []  # the persistent store's files (the same in every share's scan)
    live = None  # per file: bytes of the entries written from it
    added = []  # extra rows written
    try:
        for k, sub in enumerate(_share_scans(vs, parts)):
            stores = sub.stores
            persistent = stores.get("persistent")
            if persistent is not None:
                files = persistent.files
            ctx.result.store_entries_before += sum(len(st.e_id) for st in stores.values())
            store_pos = {f.path: fi for fi, f in enumerate(files)}
            refs = ([], [], [])  # (file position, offset, total) of the store entries written
            # rebuild: entries whose 255 marker is bad but whose term is whole can still be delivered
            ctx.torn = (
                {i: (persistent.files[fi].path, o, t) for fi, o, t, i in persistent.bad}
                if ctx.rebuild and persistent is not None
                else {}
            )
            for plan in plans:
                chunks = _plan_chunks(sub, plan, ctx, refs, store_pos, first=k == 0)
                if spill is None:
                    added += _write_queue(
                        sub, out, ctx, plan, chunks, partial(_orphans_to_restore, sub, plan.restore, ctx, refs), extra
                    )
                    continue
                for _, pos, entries in chunks:
                    spill.add(k, pos, entries)
                if plan.restore is not None:
                    plan.orphans += _orphans_to_restore(sub, plan.restore, ctx, refs)
            rec = ctx.reterm.take(_store_records(refs))
            keys.put(k, rec)
            f_of = rec["key"] // _KEY
            used = np.bincount(f_of, weights=rec["total"], minlength=len(files)) if len(rec) else np.zeros(len(files))
            live = used if live is None else live + used
            if ctx.threshold is None:
                _store_garbage(sub, ctx, node, vhost_label, rec["key"])
        if spill is not None:
            spill.rewind()
            for plan in plans:
                added += _write_queue(
                    vs, out, ctx, plan, spill.chunks(plan), partial(sorted, plan.orphans, key=lambda o: o[0]), extra
                )
        for rows in (extra or {}).values():  # queues with no dir yet
            writer = QueueWriter(
                out / "queues" / rows.dir_name,
                ctx.sources,
                rows.index_version,
                vh.segment_entry_count if rows.index_version == 1 else c_qi.DEFAULT_SEGMENT_ENTRY_COUNT,
                rows.stub,
                dry=ctx.dry,
            )
            writer.add(rows.entries(0))
            writer.close()
            added.append(rows)
        kept = _kept_files(files, ctx, node, vhost_label, model, live if live is not None else np.zeros(len(files)))
        if ctx.threshold is not None:  # garbage, and what needs no copy, knowing the files kept
            for k, sub in enumerate(_share_scans(vs, parts)):
                rec = keys.load(k)
                st = sub.stores.get("persistent")
                if kept and st is not None:
                    rec["skip"] = _kept_copies(st, kept, rec["key"])
                    keys.put(k, rec)
                kept_keys = _kept_keys(st, kept) if kept and st is not None else np.zeros(0, np.int64)
                _store_garbage(
                    sub, ctx, node, vhost_label, np.union1d(rec["key"], kept_keys) if len(kept_keys) else rec["key"]
                )
        # the shared store: each entry written from once, in its original order
        shared = SharedStoreWriter(
            out / "msg_store_persistent",
            ctx.sources,
            ctx.limit,
            dry=ctx.dry,
            first=max((files[fi].number for fi in kept), default=-1) + 1,
        )
        for fi in sorted(kept):  # kept whole, under their own names
            ctx.kept_paths.append(shared.keep(files[fi].path, files[fi].size))
            ctx.result.bytes_after += files[fi].size
        for rec in keys.by_file():
            for key, total, skipped, term_at, term_len, msg_id in zip(
                rec["key"].tolist(),
                rec["total"].tolist(),
                rec["skip"].tolist(),
                rec["term_at"].tolist(),
                rec["term_len"].tolist(),
                rec["msg_id"],
            ):
                if skipped:  # in a kept file, or a kept file holds a copy its recovery claims first
                    continue
                if term_len >= 0:  # re-encoded for the target version
                    shared.add(msg_id.tobytes(), ctx.reterm.read(term_at, term_len))
                else:
                    shared.copy(files[key // _KEY].path, key % _KEY, total)
        for msg_id, term in ctx.repaired.items():  # re-framed with a good marker
            shared.add(msg_id, term)
        for rows in added:
            for t in rows.shared_terms():
                shared.add_from(*t)
        shared.close()
    finally:
        keys.close()
        ctx.reterm.close()
        if spill is not None:
            spill.close()
    ctx.result.store_entries_written += shared.entries
    ctx.result.store_files_written += len(shared.files)
    ctx.result.bytes_after += shared.bytes


def _store_records(refs) -> np.ndarray:
    """The store entries a share's messages are written from (``refs``: lists of file positions,
    offsets and entry sizes), once each, sorted by key (``KEY_RECORD``)."""
    if not refs[0]:
        return np.zeros(0, KEY_RECORD)
    f, o, t = (np.concatenate(c) for c in refs)
    key, first = np.unique(f * _KEY + o, return_index=True)
    rec = np.zeros(len(key), KEY_RECORD)
    rec["key"], rec["total"] = key, t[first]
    return rec


def _kept_files(
    files: list, ctx: RewriteContext, node: str, vhost: str | None, model: BrokerModel, live: np.ndarray
) -> set[int]:
    """compact --threshold (borg's): the positions of the persistent store files kept whole
    (garbage ratio at or below the threshold, ``live`` bytes per file written from, and nothing
    in them the output's boot or verify would object to); each file's fate goes to the report."""
    if ctx.threshold is None or not files:
        return set()
    retermed = ctx.reterm.files if ctx.reterm is not None else set()
    kept = set()
    for fi, rf in enumerate(files):
        size = int(rf.size)
        ratio = (size - int(live[fi])) / size if size else 0.0
        why = None
        if ctx.reterm:
            why = "messages of this vhost are re-encoded for the target version"
        elif rf.bad_markers or any(
            h.kind in ("garbage", "truncated_tail") or (h.kind == "zeroed" and model.sequential_scan) for h in rf.holes
        ):
            why = "holds damaged bytes or a hole the target's store scan objects to"
        elif fi in retermed:
            why = "holds messages re-encoded for the target version"
        action = "kept" if why is None and ratio * 100 <= ctx.threshold else "rewritten"
        if action == "kept":
            kept.add(fi)
        ctx.result.store_files.append(
            {
                "node": node,
                "vhost": vhost,
                "file": display(rf.path),
                "size": size,
                "live_bytes": int(live[fi]),
                "garbage_ratio": round(ratio, 4),
                "action": action,
                "why": why,
            }
        )
    return kept


def _kept_keys(st, kept: set[int]) -> np.ndarray:
    """The keys of every entry of the store index (of a share) in the files kept whole."""
    sel = np.isin(st.e_file, list(kept))
    return distinct(st.e_file[sel].astype(np.int64) * _KEY + st.e_offset[sel])


def _kept_copies(st, kept: set[int], keys: np.ndarray) -> np.ndarray:
    """Per key of a live entry: whether it needs no new copy: it lies in a kept file, or a kept
    file holds a copy of its id that the scan reaches (new files are numbered above the kept
    ones, so the output's recovery claims that copy first)."""
    in_kept = np.isin(st.e_file, list(kept))
    has_copy = np.zeros(len(st.distinct), bool)
    has_copy[st.e_group[in_kept & st.reach]] = True
    all_keys = st.e_file.astype(np.int64) * _KEY + st.e_offset
    order = np.argsort(all_keys, kind="stable")
    at = order[np.searchsorted(all_keys[order], keys)]
    return in_kept[at] | has_copy[st.e_group[at]]


def _chunk_entries(
    vs: VhostScan, qx, res, qr: QueueResult, ctx: RewriteContext, refs, store_pos, written: bool, shift: int
) -> tuple[list[Entry], list[int]]:
    """The chunk's live entries to write (SeqIds moved by ``shift``), and their positions among
    the live entries; the rest counted, and put in lost+found when rebuild has their bytes.
    ``written``: the queue dir is written (else its messages are dropped or quarantined)."""
    r, live = qx.rec, qx.live
    qr.messages += len(live)
    fates = res.fates()
    locs = r.loc[live].tolist()
    seqs = r.seq[live].tolist()
    sizes = r.size[live].tolist()
    expiries = r.expiry[live].tolist()
    delivered = r.delivered[live].tolist()
    persistent = r.persistent[live].tolist()
    ids = r.msg_id[live].tobytes()
    body_file, body_start, body_len = res.body_file.tolist(), res.body_start.tolist(), res.body_len.tolist()
    store_off = res.store_offset.tolist()
    st_off, st_size = r.store_offset[live].tolist(), r.store_size[live].tolist()
    files = r.file[live].tolist()
    qs_path = qx.qs_path
    qs = vs.qs_files.get(qs_path) if qs_path is not None else None
    has_id = qx.index_ids(live).tolist()
    target = ctx.target or vs.model
    vhost_raw = vs.vhost.name_raw if vs.vhost.name_raw is not None else (qr.vhost or "").encode()
    entries: list[Entry] = []
    at: list[int] = []
    rf, ro, rt = [], [], []
    for j in range(len(live)):
        fate = fates[j]
        loc = locs[j]
        msg_id = ids[16 * j : 16 * j + 16]
        fb = body_file[j]

        def place() -> dict:
            path = str(res.body_files[fb]) if fb >= 0 else str(qx.files[files[j]]) if qx.files else None
            return {
                "node": qr.node,
                "vhost": qr.vhost,
                "queue": qr.queue,
                "priority": qr.priority,
                "queue_dir": qr.dir,
                "seq_id": seqs[j],
                "msg_id": msg_id.hex() if has_id[j] else None,
                "location": loc,
                "fate_at_next_boot": fate.reason,
                "file": path,
                "offset": store_off[j] if store_off[j] >= 0 else None,
            }

        def raw() -> bytes | None:
            if fb < 0:
                return None
            return vs.bodies.read(res.body_files[fb], body_start[j], body_len[j])

        def retarget(term, whole: bool) -> tuple[bool, bytes | None]:
            """(write it, its new term; None: copy the stored bytes): the target version's shape
            (``formats.term_plan``). ``term``: the stored term, or its first bytes (not ``whole``)."""
            action, why = formats.term_plan(target, formats.term_shape(term))
            if action == formats.KEEP:
                return True, None
            full = term if whole else raw()
            if action == formats.UNREPRESENTABLE:
                ctx.lost.add(formats.NOT_REPRESENTABLE, place(), full, why)
                _bump(qr.quarantined, formats.NOT_REPRESENTABLE)
                return False, None
            try:
                return True, formats.retarget_or_damage(target, full, vhost_raw, msg_id if has_id[j] else None)
            except FormatError as e:  # values the target's encoding cannot hold: damage, quarantined
                ctx.lost.add("undecodable", place(), full, e.message)
                _bump(qr.quarantined, "undecodable")
                return False, None

        b = None
        keep = False
        if not written:  # the queue dir is not written (unknown to the metadata)
            if ctx.rebuild:
                b = raw()
                if b is None:
                    _bump(qr.lost, Fate.QUEUE_DELETED.label)
                else:
                    ctx.lost.add(Fate.QUEUE_DELETED.label, place(), b, qr.skipped or "")
                    _bump(qr.quarantined, Fate.QUEUE_DELETED.label)
            else:
                _bump(qr.dropped, Fate.QUEUE_DELETED.label)
            continue
        if not ctx.rebuild:
            if fate in BY_DESIGN:  # transient: not a message a restart keeps
                _bump(qr.dropped, fate.label)
                continue
            if fate not in KEPT_AS_IS or fb < 0:
                why = fate.reason or Fate.BODY_MISSING.label
                _bump(qr.lost, why)
                ctx.damaged += 1
                if len(ctx.damage) < 5:  # named in the error; the rest counted
                    ctx.damage.append(f"{queue_ref(qr.vhost, qr.queue)}: seq id {seqs[j]}: {why}")
                continue
            bad_entry = qs_fate(res.qs_status[j])
            if bad_entry in QUARANTINED:  # expired, so the broker drops it unread, but its .qs entry
                ctx.lost.add(bad_entry.label, place(), raw())  # fails its check: never copied as good
                _bump(qr.quarantined, bad_entry.label)
                continue
            keep = True
        else:
            # what no boot delivers, whatever else is wrong with the queue
            fate = intrinsic_fate(persistent[j], loc) or fate
            if qs_fate(res.qs_status[j]) in QUARANTINED:  # its .qs entry contradicts the index
                fate = qs_fate(res.qs_status[j])
            whole_qs_entry = False
            if (
                fate == Fate.QS_BAD_HEADER
                and qs is not None
                and vs.bodies.qs_entry(qs, st_off[j], st_size[j], trust_header=False) == r_qs.OK
            ):
                fate, whole_qs_entry = Fate.DELIVERED, True  # the entry itself is intact
            if fate == Fate.BODY_MISSING and loc == Location.SHARED_STORE and msg_id in ctx.torn:
                b = _whole_term(vs, *ctx.torn[msg_id], msg_id) if msg_id not in ctx.repaired else ctx.repaired[msg_id]
                if b is not None:
                    if msg_id not in ctx.repaired:
                        ok, new = retarget(b, True)
                        if not ok:
                            continue
                        b = new if new is not None else b
                    ctx.repaired[msg_id] = b
                    entries.append(
                        Entry(seqs[j] + shift, msg_id, sizes[j], expiries[j], shared=True, delivered=delivered[j] == 1)
                    )
                    at.append(j)
                    continue
            if fate in SALVAGEABLE:
                b = vs.bodies.read(qs_path, *r_qs.term_span(st_off[j], st_size[j])) if whole_qs_entry else raw()
                if b is None:
                    _bump(qr.lost, fate.reason if fate not in KEPT_AS_IS else Fate.BODY_MISSING.label)
                    continue
                why = _undecodable(b, msg_id if has_id[j] else None)
                if why is not None:
                    ctx.lost.add("undecodable", place(), b, why)
                    _bump(qr.quarantined, "undecodable")
                    continue
                keep = True
            elif fate in QUARANTINED:
                b = raw()
                if b is None:
                    _bump(qr.lost, fate.label)
                else:
                    ctx.lost.add(fate.label, place(), b)
                    _bump(qr.quarantined, fate.label)
                continue
            else:
                _bump(qr.lost, fate.label)
                if fb >= 0:
                    ctx.lost.add(fate.label, place(), raw())
                continue
        if not keep:
            continue
        ok, new = (
            retarget(b, True)
            if b is not None
            else retarget(
                vs.bodies.read(res.body_files[fb], body_start[j], min(body_len[j], formats.SHAPE_HEAD)), False
            )
        )
        if not ok:
            continue
        seq = seqs[j] + shift
        at.append(j)
        if loc == Location.SHARED_STORE:
            entries.append(Entry(seq, msg_id, sizes[j], expiries[j], shared=True, delivered=delivered[j] == 1))
            rf.append(store_pos[res.body_files[fb]])
            ro.append(store_off[j])
            rt.append(r_rdq.entry_total(body_len[j]))
            if new is not None:
                ctx.reterm[rf[-1] * _KEY + ro[-1]] = (msg_id, new)
        elif new is not None:  # re-encoded: written from memory
            entries.append(Entry(seq, msg_id, sizes[j], expiries[j], delivered=delivered[j] == 1, term=new))
        elif loc == Location.QUEUE_STORE:
            entries.append(
                Entry(
                    seq,
                    b"",
                    sizes[j],
                    expiries[j],
                    src=(qs_path, *r_qs.entry_span(st_off[j], st_size[j])),
                    qs_header=True,
                )
            )
        else:  # CQv1 embedded
            entries.append(
                Entry(
                    seq,
                    msg_id,
                    sizes[j],
                    expiries[j],
                    delivered=delivered[j] == 1,
                    src=(qx.files[files[j]], st_off[j], st_size[j]),
                )
            )
    if rf:
        refs[0].append(np.array(rf, np.int64))
        refs[1].append(np.array(ro, np.int64))
        refs[2].append(np.array(rt, np.int64))
    return entries, at


def _orphans_to_restore(vs: VhostScan, queue: bytes, ctx: RewriteContext, refs) -> list[tuple]:
    """rebuild --restore-orphans: the orphaned shared-store messages of the scan (of its share)
    whose exchange and routing keys reach ``queue`` under the metadata's bindings
    (``VhostScan.orphan_destinations``), in store order, as ``((file position, offset, entry
    size), id, body size, file)``; each is written from its stored bytes (re-encoded for another
    target version like any kept message: ``ctx.reterm``), and its entry added to ``refs``."""
    from cqforensics.message import fast as fastpath

    st = vs.stores.get("persistent")
    if st is None:
        return []
    target = ctx.target or vs.model
    vhost_raw = vs.vhost.name_raw or b""
    out, rf, ro, rt = [], [], [], []
    for e, dest in sorted(vs.orphan_destinations("persistent").items()):
        if not dest or queue not in dest:
            continue
        path, start, length = st.term_span(e)
        term = vs.bodies.read(path, start, length)
        msg_id = st.e_id[e].tobytes()
        try:
            size = len(fastpath.decode(term)["body"])
        except Exception:  # decoded once already to route it; a failure here means no restore
            continue
        action, why = formats.term_plan(target, formats.term_shape(term))
        if action == formats.UNREPRESENTABLE:
            ctx.result.notes.append(f"orphan {msg_id.hex()} not restored into {queue!r}: {why}")
            continue
        key = (int(st.e_file[e]), int(st.e_offset[e]), int(st.e_total[e]))
        if action != formats.KEEP:
            try:
                ctx.reterm[key[0] * _KEY + key[1]] = (
                    msg_id,
                    formats.retarget_or_damage(target, term, vhost_raw, msg_id),
                )
            except FormatError as e:
                ctx.result.notes.append(f"orphan {msg_id.hex()} not restored into {queue!r}: {e.message}")
                continue
        out.append((key, msg_id, size, path))
        rf.append(key[0])
        ro.append(key[1])
        rt.append(key[2])
    if rf:
        refs[0].append(np.array(rf, np.int64))
        refs[1].append(np.array(ro, np.int64))
        refs[2].append(np.array(rt, np.int64))
    return out


def _restore(orphans: list[tuple], first_seq: int, qr: QueueResult, ctx: RewriteContext) -> list[Entry]:
    """The index entries of the orphans restored into a queue (``_orphans_to_restore``), from
    ``first_seq`` on, in store order. Each keeps its id, gets no expiry, and is labelled in the
    result and in lost+found's index (reason ``restored``, no bytes copied)."""
    entries = []
    for (_, offset, _), msg_id, size, path in orphans:
        entries.append(Entry(first_seq + len(entries), msg_id, size, 0, shared=True))
        where = {
            "node": qr.node,
            "vhost": qr.vhost,
            "queue": qr.queue,
            "queue_dir": qr.dir,
            "seq_id": entries[-1].seq_id,
            "msg_id": msg_id.hex(),
            "file": str(path),
            "offset": offset,
        }
        ctx.result.restored.append(where)
        ctx.lost.add(
            "restored",
            {**where, "location": "shared_store", "fate_at_next_boot": None},
            None,
            f"orphaned store message written back into queue {qr.queue!r} (--restore-orphans)",
        )
    qr.restored += len(entries)
    return entries


def _whole_term(vs: VhostScan, path: Path, offset: int, total: int, msg_id: bytes) -> bytes | None:
    """The term of a shared-store entry that lacks its write marker, when it is complete
    (decodes to exactly the entry's length) and is the message the index expects."""
    raw = bytes(vs.bodies.read(path, *r_rdq.term_span(offset, total)))
    try:
        from cqforensics.codecs import etf

        etf.decode(raw, exact=True)
    except Exception:  # incomplete or damaged: quarantined with the other torn entries
        return None
    return raw if _undecodable(raw, msg_id) is None else None


def _undecodable(raw: bytes, msg_id: bytes | None) -> str | None:
    try:
        m = fastpath.decode(raw)
    except Exception as e:  # the reason is the finding
        return f"{type(e).__name__}: {e}"[:300]
    if msg_id is not None and m["msg_id"] is not None and m["msg_id"] != msg_id:
        return "the stored term's message id differs from the index's"
    return None


def _store_garbage(vs: VhostScan, ctx: RewriteContext, node: str, vhost: str | None, written_keys: np.ndarray) -> None:
    """Shared-store entries not written: ``orphan`` (no index entry refers to the id),
    ``duplicate`` (another copy of the id was written) or ``unreferenced`` (only messages that
    were not written refer to it; those are accounted for with their queue). compact drops them
    (the space it reclaims); rebuild keeps the bytes of orphans, and of duplicates that differ
    from the copy written, in lost+found."""
    for kind, st in vs.stores.items():
        n = len(st.e_id)
        written = np.zeros(n, bool)
        if kind == "persistent" and n and len(written_keys):
            written = np.isin(st.e_file.astype(np.int64) * _KEY + st.e_offset, written_keys)
        group_written = np.full(len(st.distinct), -1, np.int64)
        group_written[st.e_group[written]] = np.flatnonzero(written)
        refs = vs.references[kind]
        referenced = refs.ids.lookup(st.distinct.ids) >= 0
        for i in np.flatnonzero(~written).tolist():
            g = int(st.e_group[i])
            label = "duplicate" if group_written[g] >= 0 else "unreferenced" if referenced[g] else "orphan"
            entry = ctx.result.garbage.setdefault(label, [0, 0])
            entry[0] += 1
            entry[1] += int(st.e_total[i])
            if not ctx.rebuild or label == "unreferenced":
                continue
            f = st.files[st.e_file[i]]
            o = int(st.e_offset[i])
            raw = bytes(vs.bodies.read(*st.term_span(i)))
            if label == "duplicate":
                if vs.bodies.read(*st.term_span(int(group_written[g]))) == raw:
                    continue  # the same bytes as the copy written
            ctx.lost.add(
                label,
                {
                    "node": node,
                    "vhost": vhost,
                    "queue": None,
                    "store": kind,
                    "file": str(f.path),
                    "offset": o,
                    "msg_id": st.e_id[i].tobytes().hex(),
                },
                raw,
                "no queue index refers to it (acked, or its index entry is gone)"
                if label == "orphan"
                else "differs from the copy of this id that was written",
            )
        for fi, o, t, i in st.bad:
            path = st.files[fi].path
            if kind == "persistent" and i in ctx.repaired:
                ctx.result.notes.append(
                    f"{vhost}: {path}@{o}: entry {i.hex()} lacked its write marker but its "
                    "term was whole: written with a good one"
                )
                continue
            entry = ctx.result.garbage.setdefault("torn", [0, 0])
            entry[0] += 1
            entry[1] += t
            if ctx.rebuild:
                ctx.lost.add(
                    "torn_write",
                    {
                        "node": node,
                        "vhost": vhost,
                        "queue": None,
                        "store": kind,
                        "file": str(path),
                        "offset": o,
                        "msg_id": i.hex(),
                    },
                    vs.bodies.read(path, *r_rdq.term_span(o, t)),
                    "entry without its 255 write marker",
                )


# -- the node dir -----------------------------------------------------------------------------------


def write_lost_queue_dirs(
    out_node: Path, meta, model: BrokerModel, dry: bool = False, source: layout.NodeDir | None = None
) -> list[str]:
    """Give every durable classic queue of ``meta`` homed on the node an index dir in the
    written node dir ``out_node`` (``.queue_name`` only, as the broker leaves an empty queue):
    a queue whose dir SRC lacks (``queue-index-missing``) or that a Spark write has no rows
    for. The next boot would declare it empty anyway; the output then reads and verifies as a
    broker's own. ``dry``: nothing is written, ``source`` (SRC's layout) tells what would be.
    Returns one note per queue."""
    from cqforensics.model.vhost import lost_queues, queue_dirs_of

    if meta is None or meta.kind is None:
        return []
    node = source if dry else layout.list_node_dir(out_node)
    notes = []
    for lq in lost_queues(node, meta):
        declared = meta.arguments(lq.vhost, lq.name).get("x-queue-version")
        version = formats.index_version(model, declared if isinstance(declared, int) else None)
        vdir = out_node / "msg_stores" / "vhosts" / lq.vhost_dir
        stored = {d: n for d, n, _ in queue_dirs_of(meta, lq.vhost, lq.name)}
        if not dry:
            if not vdir.is_dir():
                (vdir / "queues").mkdir(parents=True)
                for sub in ("msg_store_persistent", "msg_store_transient"):
                    (vdir / sub).mkdir()
                with open(vdir / ".vhost", "xb") as f:
                    f.write(lq.vhost)
            (vdir / "queues").mkdir(exist_ok=True)
            for dir_name, _, _ in lq.dirs:
                qdir = vdir / "queues" / dir_name
                qdir.mkdir()
                with open(qdir / ".queue_name", "xb") as f:
                    f.write(formats.queue_name_stub(lq.vhost, stored[dir_name], version))
        notes.append(
            f"vhost {lq.vhost.decode('utf-8', 'replace')!r}, queue {lq.label!r}: durable queue with no index dir "
            f"({', '.join(sorted({w for _, _, w in lq.dirs}))}): written empty, as its next boot "
            "would start it"
        )
    return notes


def _vhosts_under_own_dirs(node, notes: list[str], meta) -> None:
    """Name the vhost dirs of ``node`` (a layout.NodeDir, before it is scanned) renamed away from
    their own dir: the broker finds a vhost's store only under the dir its name gives (md5, base
    36), so a dir whose ``.vhost`` names another dir is read and written as that dir, named as
    ``.vhost`` holds it. One whose own dir is present too is left out, with a note: the broker
    reads only that one.

    A dir is renamed only when it is no vhost's own dir and its ``.vhost`` is a readable name
    (``VhostDir.stored_name``: present, at most ``layout.NAME_FILE_LIMIT`` bytes) of a vhost the
    metadata knows (``meta``; any name when the metadata is unreadable). A dir that is the own
    dir of a vhost of the metadata holds that vhost, whatever its ``.vhost`` says: that file is
    damaged (the broker writes it at every vhost recovery and never reads it,
    rabbit_vhost:recover/1), and the writers write it afresh from the metadata's name."""
    from cqforensics.codecs import textfiles

    known = set(meta.vhosts) | {vh for vh, _ in meta.queues} if meta.kind is not None else None
    own_dirs = {textfiles.vhost_dir_name(n) for n in known or ()}
    taken = {v.dir_name for v in node.vhosts}
    for v in list(node.vhosts):
        raw = v.stored_name
        if v.name_raw is not None or not raw or v.dir_name in own_dirs or (known is not None and raw not in known):
            continue
        own = textfiles.vhost_dir_name(raw)
        shown = display(raw[:200]) + ("..." if len(raw) > 200 else "")
        if own in taken:
            node.vhosts.remove(v)
            notes.append(
                f"{display(node.node)}: vhost dir {display(v.dir_name)} holds .vhost {shown!r}, whose own "
                f"dir {own} is present too (the broker reads only that one): not written"
            )
            continue
        notes.append(
            f"{display(node.node)}: vhost dir {display(v.dir_name)} holds .vhost {shown!r}, whose own "
            f"dir {own} is missing: written back as {own}"
        )
        taken.add(own)
        v.dir_name, v.name_raw, v.name = own, raw, raw.decode("utf-8", "replace")


def rewrite(
    command: str,
    src,
    dst,
    broker_version: str | None = None,
    dry_run: bool = False,
    file_size_limit: int = c_rdq.FILE_SIZE_LIMIT,
    progress: Callable[[str], None] | None = None,
    verify_output: bool = True,
    source_version: str | None = None,
    force: bool = False,
    threshold: float | None = None,
    template=None,
    restore_orphans=(),
) -> Result:
    """compact or rebuild ``src`` (a node dir, a mnesia base or a folder of them) into ``dst``.
    ``broker_version``: the version that will boot the output (its index versions, stored term
    shapes and atom encoding; default: the version SRC was written by); ``source_version``: the
    version SRC is read as, whose next boot decides what is kept (default: inferred); ``force``:
    ``dst`` may be an existing non-empty dir, replaced whole (atomically) by the output;
    ``threshold`` (compact only, borg's ``--threshold``): rewrite only the shared-store files
    whose garbage ratio is above this percentage and copy the others whole (their orphans and
    duplicates stay; new files are numbered above them); ``template``: a node dir of the target
    broker whose metadata replaces SRC's (``retarget``: for a target of another release series);
    ``restore_orphans`` (rebuild only, opt-in): queue names into which the orphaned shared-store
    messages their bindings route to them are written back (``_orphans_to_restore``)."""
    from cqforensics.base.errors import UsageError
    from cqforensics.commands.fsck import running_broker
    from cqforensics.write import retarget

    if threshold is not None and (command != "compact" or not 0 <= threshold <= 100):
        raise UsageError("--threshold: a percentage from 0 to 100, for compact only")
    if restore_orphans and command != "rebuild":
        raise UsageError("--restore-orphans: for rebuild only")

    src = Path(src).absolute()
    inputs = [src] + ([Path(template).absolute()] if template is not None else [])
    check_output(Path(dst), inputs, directory=True, force=force, deep=False)  # refused before the long read
    nodes = layout.discover([src])
    result = Result(command, display(src), display(Path(dst).absolute()), dry_run)
    for node in nodes:
        live = running_broker(node.path)
        if live:
            raise OperationalError(
                f"{node.path}: a broker appears to be running on it ({live}); stop it, or "
                "copy the dir, before rewriting it"
            )
    as_of_ms = int(time.time() * 1000)  # TTLs judged at one instant (lost+found's provenance)
    predicted = {}
    if command == "rebuild":  # what SRC's own next boot would deliver, per queue dir
        predicted = _broker_prediction(src, source_version)
    with Staging(Path(dst), inputs, dry_run, replace=force, command=command, broker_version=broker_version) as staging:
        sources = Sources()
        lost = LostFound(None if dry_run else staging.path / "lost+found")
        ctx = RewriteContext(
            command,
            result,
            sources,
            lost,
            dry_run,
            file_size_limit,
            target=version_model(broker_version) if broker_version else None,
            threshold=threshold,
            restore_orphans=frozenset(q.encode() if isinstance(q, str) else q for q in restore_orphans),
        )
        result.threshold = threshold
        try:
            if template is not None:  # another series' metadata: the target's own (write/retarget.py)
                result.notes += [] if dry_run else retarget.install_template(template, src, staging.path, nodes)
            elif not dry_run:
                copy_tree(src, staging.path, {n.path / "msg_stores" / "vhosts" for n in nodes})
            versions, targets = set(), set()
            for node in nodes:
                options = make_options(
                    broker_version=source_version,
                    as_of=as_of_ms,
                    bodies=False,
                    decode=False,
                    assume_dirty=command == "rebuild",
                )
                ns = NodeScan(node, options)
                _vhosts_under_own_dirs(node, result.notes, ns.metadata)
                versions.add(ns.model.label)
                targets.add((ctx.target or ns.model).label)
                out_node = staging.path / node.path.relative_to(src)
                result.bytes_before += layout.tree_bytes(node.path / "msg_stores" / "vhosts")
                vhosts = ns.vhosts
                sizes = [layout.tree_bytes(vs.vhost.path) for vs in vhosts] if progress else []
                for k, vs in enumerate(vhosts, 1):
                    if progress:
                        progress(
                            f"{display(node.node)}: vhost {display(vs.vhost.label)} ({k}/{len(vhosts)})",
                            sum(sizes[: k - 1]),
                            sum(sizes),
                        )
                    try:
                        rewrite_vhost(vs, out_node / "msg_stores" / "vhosts" / vs.vhost.dir_name, ctx)
                    finally:
                        vs.close()
                    dropped = len(vs.vhost.others) + sum(len(q.others) for q in vs.vhost.queues)
                    if dropped:
                        result.notes.append(
                            f"{node.node}, vhost {vs.vhost.label!r}: {plural(dropped, 'file')} the "
                            "broker does not use were not carried over"
                        )
                result.notes += [
                    f"{node.node}: {n}"
                    for n in write_lost_queue_dirs(out_node, ns.metadata, ctx.target or ns.model, dry_run, node)
                ]
                if template is None and ctx.target is not None:
                    gap = retarget.carried_metadata_note(ns.model, ctx.target)
                    result.cannot_boot += [f"{node.node}: {gap}"] if gap else []
            if template is not None:
                retarget.check_written(template, result, ctx.target or ns.model)
            result.source_version = ", ".join(sorted(versions))
            result.broker_version = ", ".join(sorted(targets))
        finally:
            lost.close()
            sources.close()
        if ctx.damage:
            more = ctx.damaged - len(ctx.damage)
            shown = "; ".join(ctx.damage) + (f" (and {more} more)" if more else "")
            raise DamagedSource(
                f"{src}: {plural(ctx.damaged, 'message')} the next boot would not deliver as they are "
                f"({shown}); compact only rewrites consistent stores: run `cqforensics fsck` to see "
                "the damage and `cqforensics rebuild` to salvage"
            )
        for q in result.queues:
            if command == "rebuild":
                q.broker_would_deliver, q.broker_would_expire = predicted.get((q.node, q.vhost, q.dir), (0, 0))
        found = {r["queue"].encode() for r in result.restored}
        for name in sorted(ctx.restore_orphans - found):
            result.notes.append(
                f"--restore-orphans {name.decode('utf-8', 'replace')!r}: no orphaned store message "
                "routes to it (or no such durable queue)"
            )
        result.lost_found = lost.items
        if lost.items and not dry_run:
            result.lost_found_path = display(Path(dst).absolute() / "lost+found")
            from cqforensics.output import provenance

            with open(staging.path / "lost+found" / "provenance.json", "x", encoding="utf-8") as fh:
                fh.write(provenance.to_json(provenance.record(command, [src], result.broker_version, as_of_ms)))
                fh.flush()
                os.fsync(fh.fileno())
        if staging.removed_stale:
            result.notes.append(f"removed {len(staging.removed_stale)} partial output(s) of interrupted runs")
        staging.broker_version = result.broker_version
        if not dry_run and verify_output:
            from cqforensics.write.verify import verify

            check = verify(staging.path, broker_version=broker_version, garbage_allowed_in=ctx.kept_paths)
            result.verified = check.consistent
            if not check.consistent:
                raise OperationalError(
                    f"the output failed verification ({plural(len(check.violations), 'violation')}, first: "
                    f"{check.violations[0].message}); nothing was written to {dst}"
                )
        staging.commit()
    return result


def _broker_prediction(src: Path, broker_version: str | None) -> dict:
    """(node, vhost, queue dir) -> messages SRC's next boot delivers (fsck's prediction)."""
    from cqforensics.tables.builders import queue_summaries

    out = {}
    options = make_options(broker_version=broker_version, bodies=False, decode=False)
    for node in layout.discover([src]):
        ns = NodeScan(node, options)
        for vs in ns.vhosts:
            try:
                for s in queue_summaries(vs):
                    vh = vs.vhost.name if vs.vhost.name is not None else vs.vhost.label
                    out[(node.node, vh, s["qdir"].dir_name)] = (s["kept"], s["drops"].get(Fate.EXPIRED.label, 0))
            finally:
                vs.close()
    return out


def compact(src, dst, **kw) -> Result:
    return rewrite("compact", src, dst, **kw)


def rebuild(src, dst, **kw) -> Result:
    return rewrite("rebuild", src, dst, **kw)
