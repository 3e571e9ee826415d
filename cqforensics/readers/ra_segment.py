"""Ra log segment ``<N>.segment``: entries the segment writer moved out of the WAL, one server's
(grammar: ``grammar.ra`` ``seg_header``/``seg_index_v2``/``seg_index_v1``; spec:
docs/formats/quorum.md "Segments").

``read_segment`` reads the header and the index the way ra_log_segment recover_index/3 does
(records until an all-zero one or the end of the index area; a record whose index goes back
trims the ones above it, as a follower's overwrite leaves them) and checks every entry's data
as its fold/5 does when the server reads it: within the file (else ``unexpected_eof``) and its
CRC-32 (else ``crc_check_failure``; 0 = not computed). It never raises on damaged bytes.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cqforensics.grammar import ra as c_ra
from cqforensics.readers.files import map_file

#: the state of an entry (``Segment.status``)
ENTRY_OK, ENTRY_BAD_CRC, ENTRY_PAST_EOF, ENTRY_NO_CRC, ENTRY_BEFORE_DATA = 0, 1, 2, 3, 4
ENTRY_LABELS = ("ok", "crc_mismatch", "past_eof", "not_computed", "inside_index")

#: how a segment's header reads (``Segment.header``)
HEADER_OK = "ok"
HEADER_MISSING = "missing"  # fewer than 8 bytes: read_header/1 returns eof (missing_segment_header)
HEADER_BAD = "bad"  # not "RASG" or a version above 2: invalid_segment_format
HEADER_VERSION0 = "version0"  # "RASG" version 0: read_header/1 accepts it, index_record_size/1 has no clause

_COLUMNS = {
    "slot": np.int32,
    "index": np.uint64,
    "term": np.uint64,
    "offset": np.int64,
    "length": np.int64,
    "crc": np.uint32,
    "status": np.uint8,
}


@dataclass
class Segment:
    """One segment file: header facts, the index records recovery keeps (columns, index order as
    written, trimmed as recover_index does), and where the index reading ended."""

    path: Path
    size: int
    header: str
    version: int | None = None
    max_count: int | None = None
    data_start: int | None = None  # header + max_count index slots
    index_end: int | None = None  # offset where the index reading stopped
    torn_index: bool = False  # the file ends inside an index record (Ra 2.x: function_clause at open)
    trimmed: int = 0  # records dropped because a later one goes back (an overwrite)
    slot: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    index: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    term: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    offset: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    length: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    crc: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint32))
    status: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint8))

    def __len__(self) -> int:
        return len(self.index)

    @property
    def readable(self) -> bool:
        """Whether ra_log_segment:open/2 succeeds on it."""
        return self.header == HEADER_OK and not self.torn_index

    @property
    def range(self) -> tuple[int, int] | None:
        """(first, last) raft index as ra_log_segment range/1 gives it (update_range/2: the
        smallest seen, and the last record's index)."""
        if not len(self.index):
            return None
        return int(self.index.min()), int(self.index[-1])

    def record_size(self) -> int:
        return c_ra.SEG_INDEX_SIZE[self.version]


def read_segment(path: Path, data=None) -> Segment:
    path = Path(path)
    data = map_file(path) if data is None else data
    size = len(data)
    if size < c_ra.SEG_HEADER_SIZE:
        return Segment(path, size, HEADER_MISSING)
    magic, version, max_count = bytes(data[:4]), int.from_bytes(data[4:6], "big"), int.from_bytes(data[6:8], "big")
    if magic != c_ra.SEG_MAGIC or version > c_ra.SEG_VERSION:
        return Segment(path, size, HEADER_BAD, version=version, max_count=max_count)
    if version not in c_ra.SEG_INDEX:
        return Segment(path, size, HEADER_VERSION0, version=version, max_count=max_count)
    rec = c_ra.SEG_INDEX[version]
    rsize = rec.size
    data_start = c_ra.SEG_HEADER_SIZE + max_count * rsize
    seg = Segment(path, size, HEADER_OK, version, max_count, data_start)
    area_end = min(size, data_start)
    o = c_ra.SEG_HEADER_SIZE
    rows: list[tuple] = []
    zero = bytes(rsize)
    last = 0
    while o < area_end:
        if o + rsize > area_end:
            seg.torn_index = True  # SEG parse_index_data/6 (2.x) has no clause for a partial record
            break
        chunk = data[o : o + rsize]
        if chunk == zero:
            break
        idx, term, off, length, crc = rec.unpack_from(data, o)
        if idx < last:  # SEG: "trim index entries if Idx goes backwards" (rows stay sorted: pop the top)
            while rows and rows[-1][1] > idx:
                rows.pop()
                seg.trimmed += 1
        rows.append(((o - c_ra.SEG_HEADER_SIZE) // rsize, idx, term, off, length, crc))
        last = idx
        o += rsize
    seg.index_end = o
    status = []
    crc32 = zlib.crc32
    for _, _, _, off, length, crc in rows:
        if off + length > size:
            status.append(ENTRY_PAST_EOF)
        elif off < data_start:
            status.append(ENTRY_BEFORE_DATA)
        elif crc == 0:
            status.append(ENTRY_NO_CRC)
        else:
            status.append(ENTRY_OK if crc32(data[off : off + length]) == crc else ENTRY_BAD_CRC)
    if rows:
        cols = list(zip(*rows))
        seg.slot, seg.index, seg.term, seg.offset, seg.length, seg.crc = (
            np.asarray(c, dtype=t)
            for c, t in zip(cols, (np.int32, np.uint64, np.uint64, np.int64, np.int64, np.uint32))
        )
    seg.status = np.asarray(status, dtype=np.uint8)
    return seg


def entry_data(data, seg: Segment, i: int):
    """The stored term bytes of entry ``i`` (a view into ``data``; short when past the end)."""
    start = int(seg.offset[i])
    return data[start : start + int(seg.length[i])]


def dump_rows(path: Path, segment_entry_count: int | None = None):
    """The per-entry listing of one segment (``dump``) as ``(row, term)`` pairs, in index order."""
    data = map_file(path)
    seg = read_segment(path, data)
    status = seg.header if seg.header != HEADER_OK else f"ok: version {seg.version}, {seg.max_count} index slots"
    yield {"offset": 0, "kind": "header", "status": status}, None
    for i in range(len(seg)):
        row = {
            "offset": int(seg.offset[i]),
            "kind": "entry",
            "size": int(seg.length[i]),
            "raft_index": int(seg.index[i]),
            "raft_term": int(seg.term[i]),
            "slot_offset": c_ra.SEG_HEADER_SIZE + int(seg.slot[i]) * seg.record_size(),
            "status": ENTRY_LABELS[int(seg.status[i])],
        }
        term = (data, int(seg.offset[i]), int(seg.length[i])) if seg.status[i] != ENTRY_PAST_EOF else None
        yield row, term
    if seg.torn_index:
        yield {"offset": seg.index_end, "kind": "end", "status": "the file ends inside an index record"}, None


__all__ = [
    "ENTRY_BAD_CRC",
    "ENTRY_BEFORE_DATA",
    "ENTRY_LABELS",
    "ENTRY_NO_CRC",
    "ENTRY_OK",
    "ENTRY_PAST_EOF",
    "HEADER_BAD",
    "HEADER_MISSING",
    "HEADER_OK",
    "HEADER_VERSION0",
    "Segment",
    "dump_rows",
    "entry_data",
    "read_segment",
]
