"""Queue indexes as named, typed columns: one ``IndexChunk`` per ``.qi`` segment, or per CQv1
queue (its journal must be merged with all its segments).

Readers decode the files (``readers.qi``, ``readers.v1``); this module turns what they found
into numpy columns (``Records`` for the ``index`` table, ``AckRecords`` for ``acks``) and the
positions of the messages held, in SeqId order. Codes are ``cqforensics.base.enums`` enums.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from cqforensics.base.enums import AckEvidence, Location, RecordKind, SlotClass
from cqforensics.base.findings import Finding
from cqforensics.base.schema import TS, fits
from cqforensics.discovery.nodes import QueueDir, VhostDir
from cqforensics.readers import qi as r_qi
from cqforensics.readers.v1 import read_v1_queue

OFFSET_OUT_OF_RANGE = (1 << 63) - (1 << 34)  # a .qs offset >= 2^63, as the records keep it

ID = np.dtype("V16")
ZERO_ID = np.zeros(1, ID)[0]


@dataclass
class Records:
    """One row per index record (the ``index`` table); codes are ``RecordKind``/``Location``."""

    file: np.ndarray  # int32: position in IndexChunk.files
    offset: np.ndarray  # int64: record offset in that file
    kind: np.ndarray  # uint8 RecordKind
    seq: np.ndarray  # int64 SeqId
    persistent: np.ndarray  # int8: 1, 0, -1 unknown
    loc: np.ndarray  # int8 Location (NONE: no usable location)
    msg_id: np.ndarray  # V16 (zero when the record holds none)
    store_offset: np.ndarray  # int64: .qs entry offset, or v1 embedded term offset
    store_size: np.ndarray  # int64: .qs term size, or v1 embedded term size
    size: np.ndarray  # int64: message size the index records
    expiry: np.ndarray  # int64: epoch µs, 0 none
    status: np.ndarray  # int32: v2 slot status byte, -1 none
    delivered: np.ndarray  # int8: 1, 0, -1 unknown

    @classmethod
    def empty(cls, n: int) -> Records:
        return cls(
            np.zeros(n, np.int32),
            np.zeros(n, np.int64),
            np.zeros(n, np.uint8),
            np.zeros(n, np.int64),
            np.full(n, -1, np.int8),
            np.full(n, Location.NONE, np.int8),
            np.zeros(n, ID),
            np.zeros(n, np.int64),
            np.zeros(n, np.int64),
            np.zeros(n, np.int64),
            np.zeros(n, np.int64),
            np.full(n, -1, np.int32),
            np.full(n, -1, np.int8),
        )

    def __len__(self) -> int:
        return len(self.seq)

    def take(self, rows) -> Records:
        """The records at ``rows`` (positions or a slice), every column."""
        return Records(*(getattr(self, f.name)[rows] for f in fields(self)))

    @classmethod
    def row_dtype(cls) -> np.dtype:
        """One record as a numpy structured type (records written to a file and read back)."""
        empty = cls.empty(0)
        return np.dtype([(f.name, getattr(empty, f.name).dtype) for f in fields(cls)])

    def put_rows(self, out: np.ndarray, rows) -> None:
        """Writes the records at ``rows`` into ``out`` (of a type with ``row_dtype``'s fields)."""
        for f in fields(self):
            out[f.name] = getattr(self, f.name)[rows]

    @classmethod
    def from_rows(cls, rows: np.ndarray) -> Records:
        """The records of structured ``rows`` (``row_dtype``'s fields), each column contiguous."""
        return cls(*(np.ascontiguousarray(rows[f.name]) for f in fields(cls)))


@dataclass
class AckRecords:
    """One row per piece of evidence that a message is gone (the ``acks`` table)."""

    file: np.ndarray  # int32
    offset: np.ndarray  # int64
    seq: np.ndarray  # int64
    evidence: np.ndarray  # int8 AckEvidence
    msg_id: np.ndarray  # V16
    has_id: np.ndarray  # bool

    @classmethod
    def empty(cls, n: int) -> AckRecords:
        return cls(
            np.zeros(n, np.int32),
            np.zeros(n, np.int64),
            np.zeros(n, np.int64),
            np.zeros(n, np.int8),
            np.zeros(n, ID),
            np.zeros(n, bool),
        )

    def __len__(self) -> int:
        return len(self.seq)


@dataclass(frozen=True)
class SegmentHeader:
    """A v2 segment's header as read: whether it is valid, its SeqId range and counts."""

    ok: bool
    from_seq_id: int
    to_seq_id: int
    records: int
    live: int


@dataclass
class IndexChunk:
    """Index records of one ``.qi`` segment, or of a whole CQv1 queue.

    ``rec`` holds one entry per record (the ``index`` table); ``live`` are the positions in
    ``rec`` of the messages held (published, not acked), in SeqId order; ``errors`` maps a
    record position to why the broker's strict parser rejects it."""

    qdir: QueueDir
    version: int | None
    files: list[Path] = field(default_factory=list)
    rec: Records = field(default_factory=lambda: Records.empty(0))
    live: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    errors: dict[int, str] = field(default_factory=dict)
    acks: AckRecords = field(default_factory=lambda: AckRecords.empty(0))
    bad_segments: set[int] = field(default_factory=set)  # positions in files of .qi with bad headers
    segment: int | None = None  # v2: the segment number (names the companion .qs)
    header: SegmentHeader | None = None  # v2
    findings: list[Finding] = field(default_factory=list)  # the readers'; crashes_queue marks boot-crash causes
    segments: list[int | None] | None = None  # chunks joined (a share's live entries): the segment of each file

    @property
    def nbytes(self) -> int:
        """Bytes its arrays hold (a chunk kept between two reads counts against a budget)."""
        arrays = [getattr(self.rec, f.name) for f in fields(self.rec)] + [
            getattr(self.acks, f.name) for f in fields(self.acks)
        ]
        return self.live.nbytes + sum(a.nbytes for a in arrays)

    @property
    def qs_path(self) -> Path | None:
        """v2: the companion ``.qs`` segment, when it exists."""
        return self.qdir.qs.get(self.segment) if self.segment is not None else None

    def qs_of(self, file: int) -> Path | None:
        """v2: the ``.qs`` companion of the index file at position ``file`` in ``files`` (the
        chunk's segment, or one of the segments of joined chunks), when it exists."""
        return self.qdir.qs.get(self.segments[file] if self.segments is not None else self.segment)

    def index_ids(self, positions: np.ndarray) -> np.ndarray:
        """Whether the index itself holds the message id of each record at ``positions``:
        shared-store entries and v1 publishes carry one; embedded and ``.qs`` entries of a v2
        index do not (the stored term does)."""
        loc = self.rec.loc[positions]
        if self.version == 1:
            return np.ones(len(loc), bool)
        return loc == Location.SHARED_STORE


def _v2_chunk(qdir: QueueDir, number: int, path: Path, reference: bool = False) -> IndexChunk:
    qx = IndexChunk(qdir, 2, [path], segment=number)
    seg = r_qi.read_qi(path, number, reference=reference)
    qx.findings += seg.findings
    if not seg.header_ok:
        qx.bad_segments.add(0)
    kl = seg.klass
    if seg.records is not None:  # the core made them
        used, c, live = _core_records(seg)
    else:
        used, c, live = _slot_records(seg)
    c.offset = seg.offsets()[used]
    c.seq = seg.from_seq_id + used
    c.expiry = seg.expiry[used]  # out of range: no value (the reader's finding)
    qx.rec = c
    for slot, why in seg.bad_reason.items():
        qx.errors[int(np.searchsorted(used, slot))] = why
    qx.live = live  # slot order is SeqId order
    empty = np.flatnonzero(kl == SlotClass.EMPTY)
    ghosts = np.flatnonzero(c.kind == RecordKind.GHOST)
    a = qx.acks = AckRecords.empty(len(empty) + len(ghosts))
    a.offset[: len(empty)] = seg.offsets()[empty]
    a.seq[: len(empty)] = seg.from_seq_id + empty
    a.evidence[: len(empty)] = AckEvidence.V2_ZEROED_SLOT
    if len(ghosts):
        g = slice(len(empty), None)
        a.offset[g], a.seq[g], a.evidence[g] = c.offset[ghosts], c.seq[ghosts], AckEvidence.V2_DROPPED_BY_RECOVERY
        gs = r_qi.take(seg.slots, used[ghosts])
        a.msg_id[g] = gs["msg_id"]
        a.has_id[g] = gs["loc_kind"] == Location.SHARED_STORE
    qx.header = SegmentHeader(seg.header_ok, seg.from_seq_id, seg.to_seq_id, len(used), len(qx.live))
    return qx


def _slot_records(seg) -> tuple[np.ndarray, Records, np.ndarray]:
    """(used slots, their records without offset/seq/expiry, live positions), the reference."""
    kl = seg.klass
    used = np.flatnonzero(kl != SlotClass.EMPTY)
    c = Records.empty(len(used))
    s = r_qi.take(seg.slots, used)
    c.kind = np.where(
        kl[used] == SlotClass.GHOST,
        RecordKind.GHOST,
        np.where(kl[used] == SlotClass.BAD, RecordKind.BAD, RecordKind.PUBLISH),
    ).astype(np.uint8)
    c.persistent = (s["flags"] & 1).astype(np.int8)
    c.loc = np.where(
        (s["loc_kind"] <= Location.QUEUE_STORE) & ~seg.malformed[used], s["loc_kind"], Location.NONE
    ).astype(np.int8)
    c.msg_id = np.where(s["loc_kind"] == Location.SHARED_STORE, s["msg_id"], ZERO_ID)
    is_qs = s["loc_kind"] == Location.QUEUE_STORE
    # an offset past int64 (the reader's finding) stands as OFFSET_OUT_OF_RANGE: past any file, and
    # room left to add a size without wrapping; the tables show it as null
    c.store_offset = np.where(is_qs, np.minimum(s["qs_offset"], np.uint64(OFFSET_OUT_OF_RANGE)), 0).astype(np.int64)
    c.store_size = np.where(is_qs, s["qs_size"], 0).astype(np.int64)
    c.size = s["size"].astype(np.int64)
    c.status = s["status"].astype(np.int32)
    return used, c, np.flatnonzero(s["status"] == 1)


def _core_records(seg) -> tuple[np.ndarray, Records, np.ndarray]:
    """``_slot_records`` from the core's decode of the slots (readers.qi.slot_facts)."""
    d = seg.records
    used = np.frombuffer(d["used"], np.int64)
    n = len(used)
    store_offset = np.minimum(np.frombuffer(d["store_offset"], np.uint64), np.uint64(OFFSET_OUT_OF_RANGE))
    # offset, seq and expiry: set by the caller
    c = Records(
        np.zeros(n, np.int32),
        None,
        np.frombuffer(d["kind"], np.uint8),
        None,
        np.frombuffer(d["persistent"], np.int8),
        np.frombuffer(d["loc"], np.int8),
        np.frombuffer(d["msg_id"], ID),
        store_offset.astype(np.int64),
        np.frombuffer(d["store_size"], np.int64),
        np.frombuffer(d["size"], np.int64),
        None,
        np.frombuffer(d["status"], np.int32),
        np.full(n, -1, np.int8),
    )
    seg.records = None  # handed over: the segment keeps only what its own readers use
    return used, c, np.frombuffer(d["live"], np.int64)


_V1_KIND = {"publish": RecordKind.PUBLISH, "deliver": RecordKind.DELIVER, "ack": RecordKind.ACK}


def _v1_chunk(qdir: QueueDir, count: int) -> IndexChunk:
    qx = IndexChunk(qdir, 1)
    v1 = read_v1_queue(qdir.idx, qdir.journal, count)
    qx.findings += v1.findings
    fpos: dict[Path, int] = {}
    for p in [p for _, p in qdir.idx] + ([qdir.journal] if qdir.journal is not None else []):
        fpos[p] = len(qx.files)
        qx.files.append(p)
    c = Records.empty(len(v1.records))
    pos_of, acks = {}, []
    for i, r in enumerate(v1.records):
        pos_of[id(r)] = i
        c.file[i] = fpos[r.path]
        c.offset[i] = r.offset
        c.kind[i] = _V1_KIND[r.kind]
        c.seq[i] = r.seq_id
        if r.kind == "publish":
            c.persistent[i] = int(r.persistent)
            c.msg_id[i] = np.frombuffer(r.msg_id, ID)[0]
            c.size[i] = r.size
            if fits(r.expiry, TS):  # else no value (rendered null, the reader's finding), never wrapped
                c.expiry[i] = r.expiry
            if r.embedded_size:
                c.loc[i], c.store_offset[i], c.store_size[i] = Location.EMBEDDED, r.embedded_offset, r.embedded_size
            else:
                c.loc[i] = Location.SHARED_STORE
        elif r.kind == "ack":
            ev = AckEvidence.V1_JOURNAL_ACK if r.path == qdir.journal else AckEvidence.V1_ACK
            acks.append((fpos[r.path], r.offset, r.seq_id, ev))
    live = v1.live()
    qx.live = np.array([pos_of[id(e.pub)] for e in live], np.int64)
    for e in live:
        c.delivered[pos_of[id(e.pub)]] = int(e.delivered)
    pubs = {e.seq_id: e.pub.msg_id for e in v1.entries.values() if e.pub is not None}
    a = qx.acks = AckRecords.empty(len(acks))
    for k, (fi, off, seq, ev) in enumerate(acks):
        a.file[k], a.offset[k], a.seq[k], a.evidence[k] = fi, off, seq, ev
        if seq in pubs:
            a.msg_id[k], a.has_id[k] = np.frombuffer(pubs[seq], ID)[0], True
    qx.rec = c
    return qx


def iter_chunks(qdir: QueueDir, vhost: VhostDir, segments=None, kept: dict | None = None) -> Iterator[IndexChunk]:
    """A queue dir's index, a segment at a time (v1: the whole queue at once); ``segments``
    restricts a v2 queue to those segment numbers. ``kept``: chunks read before, by segment
    number (None: the v1 queue), each handed out once instead of read again."""
    kept = kept if kept is not None else {}
    if qdir.qi:
        for number, path in qdir.qi:
            if segments is None or number in segments:
                yield kept.pop(number, None) or _v2_chunk(qdir, number, path)
    elif qdir.idx or qdir.journal is not None:
        yield kept.pop(None, None) or _v1_chunk(qdir, vhost.segment_entry_count)
