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

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cqforensics.grammar import rdq as c_rdq
from cqforensics.readers.files import map_file

_HEAD = c_rdq.ENTRY_HEAD.unpack_from
_SIZE = c_rdq.ENTRY_SIZE_FIELD.unpack_from
_MARK = c_rdq.WRITE_OK_MARKER
_CHUNK = 1 << 20


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


def find_candidates(data, start: int, end: int, first_only: bool = False) -> np.ndarray:
    """Offsets in [start, end) where a complete entry with a 255 marker starts (vectorised).

    ``first_only`` stops at the first chunk that yields any candidate (the resync case)."""
    found = []
    pos = start
    while pos < end:
        stop = min(pos + _CHUNK, end)
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


def _hole_kind(data, o: int, n: int) -> str:
    view = np.frombuffer(data, np.uint8, count=n, offset=o)
    return "zeroed" if not view.any() else "garbage"


def walk(path: Path, number: int, data=None) -> RdqFile:
    """Every entry of one file, plus its holes. Never raises on damaged content."""
    data = map_file(path) if data is None else data
    end = len(data)
    f = RdqFile(path, number, end)
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
        nxt = find_candidates(data, o + 1, end, first_only=True)
        stop = int(nxt[0]) if len(nxt) else end
        if stop == end and _is_truncated_tail(data, o, end):
            f.holes.append(Hole(o, end - o, "truncated_tail"))
        else:
            f.holes.append(Hole(o, stop - o, _hole_kind(data, o, stop - o)))
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
