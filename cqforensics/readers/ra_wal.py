"""Ra write-ahead log ``<N>.wal``: one file shared by every Ra server of a system (every quorum
queue of the node), records of all writers interleaved (grammar: ``grammar.ra`` ``wal_record``;
spec: docs/formats/quorum.md "WAL").

``walk`` reads every record it can frame, in file order, and says where and why the framing
stops; it never decides what the broker does with a bad checksum or an unknown writer
reference (that depends on the Ra version: ``model.quorum``), but records the facts its
recovery looks at (ra_log_wal recover_records/5, is_last_record/2): each record's checksum
status, the bytes after it, an all-zero record, a torn end. Damaged bytes are never raised:
the scan ends with a ``WalEnd`` naming the offset.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cqforensics.grammar import ra as c_ra
from cqforensics.readers.files import map_file

_FIXED = c_ra.WAL_FIXED.unpack_from
_FIXED_SIZE = c_ra.WAL_FIXED_SIZE

#: checksum status of a record (``WalScan.checksum``)
CHECK_OK, CHECK_BAD, CHECK_NONE = 0, 1, 2
CHECK_LABELS = ("ok", "bad", "not_computed")

#: how the framing of a WAL ends (``WalEnd.kind``)
END_EOF = "eof"  # the last record ends at the end of the file
END_ZEROED = "zeroed"  # an all-zero record (a pre-allocated or zero-filled tail): recovery stops, silently
END_TORN = "torn"  # a record runs past the end of the file: recovery stops, silently
END_NO_HEADER = "bad_header"  # no "RAWA" + version 1 header: ra_log_wal exits unknown_wal_file_format
END_SHORT = "short_header"  # fewer than 5 bytes (an empty file included): open_at_first_record has no clause

#: per-record columns of a scan (numpy dtypes)
_COLUMNS = {
    "offset": np.int64,
    "ref": np.int32,
    "known": np.bool_,
    "truncate": np.bool_,
    "index": np.uint64,
    "term": np.uint64,
    "data_offset": np.int64,
    "length": np.int64,
    "checksum": np.uint8,
    "stored_checksum": np.uint32,
}


@dataclass(frozen=True)
class WalEnd:
    kind: str
    offset: int  # where the framing stopped (a record's start, or the end of the file)
    detail: str = ""


@dataclass
class WalScan:
    """Every framed record of one WAL file, as columns (one row per record, file order).

    ``ref`` is the writer's number in this file and ``writers[ref]`` its UId; ``known`` is False
    for a cached reference no earlier record of the file named (Ra up to 2.14 crashes on it, later
    versions skip it). ``checksum`` is CHECK_OK /
    CHECK_BAD / CHECK_NONE (the stored value 0: checksums were off). A record whose framing is
    plausible is listed even after a bad checksum (what the broker does with it is the model's
    decision); ``end`` says how the framing ended."""

    path: Path
    size: int
    header_ok: bool
    end: WalEnd
    writers: dict[int, bytes] = field(default_factory=dict)
    offset: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    ref: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    known: np.ndarray = field(default_factory=lambda: np.empty(0, np.bool_))
    truncate: np.ndarray = field(default_factory=lambda: np.empty(0, np.bool_))
    index: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    term: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    data_offset: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    length: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    checksum: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint8))
    stored_checksum: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint32))
    #: rows failing their checksum -> whether ra_log_wal is_last_record/2 forgives it (fewer than 13
    #: bytes follow it, or the next 13 are zero)
    forgiven: dict[int, bool] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.offset)

    def uid(self, i: int) -> bytes | None:
        return self.writers.get(int(self.ref[i])) if self.known[i] else None

    def rows_of(self, uid: bytes) -> np.ndarray:
        """The rows whose writer is ``uid`` (those ``uid(i)`` gives it for), in file order."""
        refs = [r for r, u in self.writers.items() if u == uid]
        if not refs:
            return np.empty(0, np.int64)
        return np.flatnonzero(self.known & np.isin(self.ref, refs))

    def entries(self, rows: np.ndarray):
        """``(index, term, offset, data_offset, length, checksum)`` of each of ``rows``, as Python
        ints, in their order (the one place a record's columns are read together)."""
        return zip(
            self.index[rows].tolist(),
            self.term[rows].tolist(),
            self.offset[rows].tolist(),
            self.data_offset[rows].tolist(),
            self.length[rows].tolist(),
            self.checksum[rows].tolist(),
        )

    def record_end(self, i: int) -> int:
        return int(self.data_offset[i] + self.length[i])

    def first_bad(self) -> int | None:
        """The row of the first record failing its checksum (None: none)."""
        bad = np.flatnonzero(self.checksum == CHECK_BAD)
        return int(bad[0]) if len(bad) else None

    def bad_is_last(self, i: int) -> bool:
        """Whether ra_log_wal is_last_record/2 forgives the bad checksum of record ``i``: fewer than
        13 bytes follow it, or the next 13 are zero (the rest of the file is then not read)."""
        return self.forgiven.get(i, False)


def walk(path: Path, data=None) -> WalScan:
    """Frame every record of the WAL at ``path`` (``data``: its bytes, else the file is mapped)."""
    path = Path(path)
    data = map_file(path) if data is None else data
    size = len(data)
    if size < c_ra.WAL_HEADER_SIZE:
        return WalScan(path, size, False, WalEnd(END_SHORT, 0, f"{size} bytes, not a 5-byte header"))
    if bytes(data[:4]) != c_ra.WAL_MAGIC or data[4] != c_ra.WAL_VERSION:
        return WalScan(path, size, False, WalEnd(END_NO_HEADER, 0, f"starts {bytes(data[:5]).hex()}"))
    cols: dict[str, list] = {k: [] for k in _COLUMNS}
    writers: dict[int, bytes] = {}
    forgiven: dict[int, bool] = {}
    o = c_ra.WAL_HEADER_SIZE
    end = None
    adler = zlib.adler32
    while o < size:
        if size - o < 3:
            end = WalEnd(END_TORN, o, f"{size - o} bytes left, not a record head")
            break
        head = (data[o] << 16) | (data[o + 1] << 8) | data[o + 2]
        p = o + 3
        cached = bool(head & 0x400000)
        ref = head & 0x3FFFFF
        uid = None
        if not cached:
            if p + 2 > size:
                end = WalEnd(END_TORN, o, "the end of the file cuts the writer's id length")
                break
            uid_len = (data[p] << 8) | data[p + 1]
            p += 2
            if p + uid_len > size:
                end = WalEnd(END_TORN, o, f"the end of the file cuts the writer's id ({uid_len} bytes)")
                break
            uid = bytes(data[p : p + uid_len])
            p += uid_len
        if p + _FIXED_SIZE > size:
            if head == 0 and not any(data[o:size]):
                end = WalEnd(END_ZEROED, o, "zero-filled tail")
            else:
                end = WalEnd(END_TORN, o, f"{size - o} bytes left, a record header needs {p + _FIXED_SIZE - o}")
            break
        stored, length, idx, term = _FIXED(data, p)
        if head == 0 and stored == 0 and length == 0:  # WAL recover_records/5, first clause
            end = WalEnd(END_ZEROED, o, "an all-zero record: the zero-filled end of the log")
            break
        d = p + _FIXED_SIZE
        if d + length > size:
            end = WalEnd(END_TORN, o, f"a record of {length} bytes runs {d + length - size} bytes past the end")
            break
        if uid is not None:
            writers[ref] = uid
        cols["known"].append(uid is not None or ref in writers)
        if stored == 0:
            check = CHECK_NONE
        else:
            check = CHECK_OK if adler(data[p + 8 : d + length]) == stored else CHECK_BAD
            if check == CHECK_BAD:
                end_ = d + length
                forgiven[len(cols["offset"])] = size - end_ < c_ra.WAL_LAST_RECORD_PROBE or not any(
                    data[end_ : end_ + c_ra.WAL_LAST_RECORD_PROBE]
                )
        cols["offset"].append(o)
        cols["ref"].append(ref)
        cols["truncate"].append(bool(head & 0x800000))
        cols["index"].append(idx)
        cols["term"].append(term)
        cols["data_offset"].append(d)
        cols["length"].append(length)
        cols["checksum"].append(check)
        cols["stored_checksum"].append(stored)
        o = d + length
    if end is None:
        end = WalEnd(END_EOF, size)
    arrays = {k: np.asarray(v, dtype=_COLUMNS[k]) for k, v in cols.items()}
    return WalScan(path, size, True, end, writers, **arrays, forgiven=forgiven)


def record_data(data, scan: WalScan, i: int):
    """The stored term bytes of record ``i`` (a view into ``data``)."""
    start = int(scan.data_offset[i])
    return data[start : start + int(scan.length[i])]


def dump_rows(path: Path, segment_entry_count: int | None = None):
    """The per-record listing of one WAL (``dump``) as ``(row, term)`` pairs, in file order."""
    data = map_file(path)
    scan = walk(path, data)
    yield {"offset": 0, "kind": "header", "status": "ok" if scan.header_ok else scan.end.detail}, None
    for i in range(len(scan)):
        uid = scan.uid(i)
        row = {
            "offset": int(scan.offset[i]),
            "kind": "record",
            "size": int(scan.length[i]),
            "id": uid.decode("utf-8", "replace") if uid is not None else f"?ref{int(scan.ref[i])}",
            "raft_index": int(scan.index[i]),
            "raft_term": int(scan.term[i]),
            "status": "checksum "
            + CHECK_LABELS[int(scan.checksum[i])]
            + (", truncating write" if scan.truncate[i] else ""),
        }
        yield row, (data, int(scan.data_offset[i]), int(scan.length[i]))
    if scan.header_ok:
        yield (
            {
                "offset": scan.end.offset,
                "kind": "end",
                "status": f"{scan.end.kind}: {scan.end.detail}" if scan.end.detail else scan.end.kind,
            },
            None,
        )


__all__ = [
    "CHECK_BAD",
    "CHECK_LABELS",
    "CHECK_NONE",
    "CHECK_OK",
    "END_EOF",
    "END_NO_HEADER",
    "END_SHORT",
    "END_TORN",
    "END_ZEROED",
    "WalEnd",
    "WalScan",
    "dump_rows",
    "record_data",
    "walk",
]
