"""Shared-store ``.rdq`` files: entries ``<<Size:64, MsgId:16, Body, 255>>`` and the holes
between them.

``walk`` follows sizes from offset 0 (the healthy case costs one struct unpack per entry;
sizes and ids are then gathered with numpy).
Where the chain breaks (a size that does not fit, a missing 255 marker, zero-filled or
garbage bytes) it resynchronises like RabbitMQ 3.13.1+ does: it slides to the next offset
holding a plausible entry, found vectorised with numpy instead of byte by byte.
It records what it skipped as holes (zeroed / garbage / truncated tail).

``broker_chain`` lists the entries the <= 3.13.0 scanner (rabbit_msg_file:scan) reaches:
it walks the same chain but stops at a zero size field or an entry that does not fit,
so everything behind a zeroed range is lost to those versions.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cqforensics import core
from cqforensics.grammar import rdq as c_rdq
from cqforensics.readers.files import data_extents, map_file

_HEAD = c_rdq.ENTRY_HEAD.unpack_from
_SIZE = c_rdq.ENTRY_SIZE_FIELD.unpack_from
_MARK = c_rdq.WRITE_OK_MARKER
_CHUNK = 1 << 20
_SPARSE_MIN = 1 << 26  # files this big are walked by their data extents (holes skipped unread)


@dataclass
class Hole:
    offset: int
    length: int
    kind: str  # zeroed | garbage | truncated_tail


@dataclass
class RdqFile:
    path: Path
    number: int
    size: int
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # entries with a valid marker
    totals: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # TotalSize = Size + 9
    msg_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, "V16"))
    holes: list[Hole] = field(default_factory=list)
    bad_markers: list[tuple[int, int, bytes]] = field(default_factory=list)  # (offset, total, id): torn entries

    def __len__(self) -> int:
        return len(self.offsets)


def term_span(offset, total):
    """(start, length) of the stored term inside the entry at ``offset`` of ``total`` bytes
    (``<<Size:64, MsgId:16, Term, 255>>``); works on numpy arrays too."""
    return offset + c_rdq.ENTRY_HEADER_SIZE, total - c_rdq.ENTRY_HEADER_SIZE - 1


def entry_total(term_length):
    """The ``total`` of an entry framing a term of ``term_length`` bytes (inverse of term_span)."""
    return term_length + c_rdq.ENTRY_HEADER_SIZE + 1


def find_candidates(data, start: int, end: int, first_only: bool = False, extents=None) -> np.ndarray:
    """Offsets in [start, end) where a complete entry with a 255 marker starts (vectorised).

    ``first_only`` stops at the first chunk that yields any candidate (the resync case).
    ``extents`` (sorted ``[start, end)`` data ranges of a sparse file, see
    ``files.data_extents``): the holes between them read as zeros, where no entry can start
    (its size field would be 0), so they are skipped without being read."""
    found = []
    pos = start
    ends = [e for _, e in extents] if extents is not None else None
    while pos < end:
        stop = min(pos + _CHUNK, end)
        if ends is not None:
            i = bisect.bisect_right(ends, pos)
            if i == len(ends):
                break  # only zeros from here on
            pos = max(pos, extents[i][0] - 7)  # a size field may start up to 7 bytes before data
            if pos >= end:
                break
            stop = min(pos + _CHUNK, end, max(ends[i], pos + 1))
        window = np.frombuffer(data, np.uint8, count=min(stop + 7, end) - pos, offset=pos)
        n = stop - pos
        if len(window) < n + 7:
            window = np.concatenate([window, np.zeros(n + 7 - len(window), np.uint8)])
        size = np.zeros(n, np.uint64)
        for k in range(8):
            size = (size << np.uint64(8)) | window[k:k + n].astype(np.uint64)
        limit = end - 9 - (pos + np.arange(n, dtype=np.int64))  # largest Size that fits at each offset
        ok = (limit >= 16) & (size >= 16)
        ok[ok] = size[ok] <= limit[ok].astype(np.uint64)
        cand = np.flatnonzero(ok)
        if len(cand):
            mark_at = pos + cand + 8 + size[cand].astype(np.int64)
            marks = np.frombuffer(data, np.uint8, count=end, offset=0)[mark_at]
            cand = cand[marks == _MARK] + pos
            found.append(cand)
            if first_only and len(cand):
                break
        pos = stop
    return np.concatenate(found) if found else np.zeros(0, np.int64)


def _hole_kind(data, o: int, n: int, extents=None) -> str:
    ranges = [(o, o + n)] if extents is None else \
        [(max(a, o), min(b, o + n)) for a, b in extents if a < o + n and b > o]
    for a, b in ranges:
        for c in range(a, b, _CHUNK):
            if np.frombuffer(data, np.uint8, count=min(_CHUNK, b - c), offset=c).any():
                return "garbage"
    return "zeroed"


def walk(path: Path, number: int, data=None, reference: bool = False) -> RdqFile:
    """Every entry of one file, plus its holes. Never raises on damaged content. A big sparse
    file is walked by its data extents: its holes are skipped without being read.

    The compiled core does the walk when it is built (``reference=True``, or no core: this
    module's Python walk, the specification it is tested against)."""
    data = map_file(path) if data is None else data
    end = len(data)
    extents = data_extents(path, end) if end >= _SPARSE_MIN else None
    if extents == [(0, end)]:
        extents = None
    f = RdqFile(path, number, end)
    if not reference and core.native() is not None:
        f.offsets, f.totals, f.msg_ids, holes, torn = core.walk_rdq(data, extents)
        f.holes = [Hole(o, n, kind) for o, n, kind in holes]
        f.bad_markers = torn
        return f
    offsets: list[int] = []
    o = 0
    size_at, mark = _SIZE, _MARK
    add_offset = offsets.append
    while o < end:
        if o + 24 <= end:  # the healthy chain: one unpack and one byte per entry
            (size,) = size_at(data, o)
            nxt = o + size + 9
            if size >= 16 and nxt <= end and data[nxt - 1] == mark:
                add_offset(o)
                o = nxt
                continue
        # the chain breaks at o: a torn entry (size fits, marker missing) is remembered,
        # then slide to the next plausible entry
        if o + 24 <= end:
            size, msg_id = _HEAD(data, o)
            if 16 <= size and o + size + 9 <= end:
                f.bad_markers.append((o, size + 9, msg_id))
        nxt = find_candidates(data, o + 1, end, first_only=True, extents=extents)
        stop = int(nxt[0]) if len(nxt) else end
        if stop == end and _is_truncated_tail(data, o, end):
            f.holes.append(Hole(o, end - o, "truncated_tail"))
        else:
            f.holes.append(Hole(o, stop - o, _hole_kind(data, o, stop - o, extents)))
        o = stop
    if offsets:  # every such entry has its 24-byte head inside the file
        f.offsets = np.array(offsets, np.int64)
        heads = np.lib.stride_tricks.sliding_window_view(np.frombuffer(data, np.uint8, count=end), 24)[f.offsets]
        f.totals = heads[:, :8].copy().view(">u8").ravel().astype(np.int64) + 9
        f.msg_ids = heads[:, 8:].copy().view("V16").ravel()
    return f


def _is_truncated_tail(data, o: int, end: int) -> bool:
    """An entry header at o whose size runs past the end of the file (a write cut short)."""
    if o + 8 > end:
        return any(data[o:end])
    size = int.from_bytes(data[o:o + 8], "big")
    return size >= 16 and o + size + 9 > end and size < (1 << 40)


def broker_chain(f: RdqFile, data=None) -> list[int]:
    """Indexes (into f.offsets) of the entries the <= 3.13.0 sequential scanner reaches.

    rabbit_msg_file:scan stops at a zero size field or at an entry that does not fit the
    file, and skips (by its size) an entry whose marker is not 255."""
    data = map_file(f.path) if data is None else data
    end = len(data)
    index = {off: i for i, off in enumerate(f.offsets.tolist())}
    reached = []
    o = 0
    while o + 8 <= end:
        size = int.from_bytes(data[o:o + 8], "big")
        if size == 0 or o + size + 9 > end:
            break
        i = index.get(o)
        if i is not None:
            reached.append(i)
        o += size + 9
    return reached


def dump_rows(path: Path, segment_entry_count: int | None = None):
    """The per-entry listing of one file (``dump``): entries and holes in file order, each as
    ``(row, term)`` with ``term`` the ``(data, start, length)`` of the stored message (None
    for holes and torn entries). The file is memory-mapped (pages come and go), never read whole."""
    data = map_file(path)
    f = walk(path, 0, data)
    rows = [(o, {"offset": o, "kind": "entry", "size": t, "msg_id": i.hex(), "status": "ok"})
            for o, t, i in zip(f.offsets.tolist(), f.totals.tolist(), (m.tobytes() for m in f.msg_ids))]
    rows += [(o, {"offset": o, "kind": "entry", "size": t, "msg_id": i.hex(), "status": "no write marker"})
             for o, t, i in f.bad_markers]
    rows += [(h.offset, {"offset": h.offset, "kind": "hole", "size": h.length, "status": h.kind}) for h in f.holes]
    seen: set = set()
    for _, row in sorted(rows, key=lambda r: (r[0], r[1]["kind"] != "hole")):
        term = None
        if row["kind"] == "entry" and row["status"] == "ok":
            if row["msg_id"] in seen:
                row["status"] = "duplicate id in this file"
            seen.add(row["msg_id"])
            term = (data, *term_span(row["offset"], row["size"]))
        yield row, term
