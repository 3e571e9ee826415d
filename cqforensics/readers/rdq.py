"""Shared-store ``.rdq`` files: entries ``<<Size:64, MsgId:16, Body, 255>>`` and the holes
between them.

``walk`` follows sizes from offset 0 (the healthy case costs one struct unpack per entry;
sizes and ids are then gathered with numpy).
Where the chain breaks (a size that does not fit, a missing 255 marker, zero-filled or
garbage bytes) it resynchronises like RabbitMQ 3.13.1+ does: it slides to the next offset
holding a candidate (a complete entry with its 255 marker), found vectorised with numpy
instead of byte by byte. It records what it skipped as holes (zeroed / garbage / truncated tail).

**Which candidates become entries** (the one rule; the compiled core implements the same,
tests/codecs/test_core.py checks they agree). Every candidate the walk meets (on the chain, or at a
resynchronisation) is judged by evidence:

1. *trusted*: its id is in ``referenced`` (the ids the queue indexes reference, plus those
   ``msg_store_index.ets`` records after a clean stop; ``model.store.scan_store`` passes them):
   accepted, and the walk jumps over it (as RabbitMQ 4.x does with a ``valid`` candidate);
2. otherwise its term must look like a stored message (``plausible_term``: ``131``, then a
   record tuple whose first element is an atom lying inside the term, or a compressed term), and
   no trusted candidate may start inside it: an unreferenced candidate never hides a
   referenced one. Then it is accepted (an orphan);
3. else it is *rejected* (``RdqFile.rejected``, with the reason, each a
   ``rdq-rejected-candidate`` finding) and the walk moves to the next candidate after its
   first byte, so the candidates inside it are judged in turn.

The trusted candidates inside unreferenced ones are found by one lazy forward scan (each byte
of the file looked at once at most), so a file full of holes or orphans costs one pass.

``broker_chain`` lists the entries the <= 3.13.0 scanner (rabbit_msg_file:scan) reaches:
it walks the same chain but stops at a zero size field or an entry that does not fit,
so everything behind a zeroed range is lost to those versions.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from cqforensics import compiled as core
from cqforensics.base.errors import plural
from cqforensics.base.findings import Finding
from cqforensics.grammar import rdq as c_rdq
from cqforensics.readers.files import data_extents, drop_pages, map_file, reading_whole

_HEAD = c_rdq.ENTRY_HEAD.unpack_from
_SIZE = c_rdq.ENTRY_SIZE_FIELD.unpack_from
_MARK = c_rdq.WRITE_OK_MARKER
_CHUNK = 1 << 20
_SPARSE_MIN = 1 << 26  # files this big are walked by their data extents (holes skipped unread)


class Hole(NamedTuple):
    """A byte range of a file between entries."""

    offset: int
    length: int
    kind: str  # one of HOLE_KINDS


#: the kinds of hole (codes shared with the compiled core: position in this tuple)
HOLE_KINDS = ("zeroed", "garbage", "truncated_tail")


class Holes(Sequence):
    """The holes of a walk by the compiled core, kept as three arrays and read as ``Hole``
    tuples: a broker-compacted file has hundreds of holes, and a Python object each would cost
    more (to make, and for the garbage collector) than the walk that found them."""

    __slots__ = ("kinds", "lengths", "offsets")

    def __init__(self, offsets: np.ndarray, lengths: np.ndarray, kinds: np.ndarray):
        self.offsets, self.lengths, self.kinds = offsets, lengths, kinds

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(self)[i]
        return Hole(int(self.offsets[i]), int(self.lengths[i]), HOLE_KINDS[self.kinds[i]])

    def __iter__(self):
        return map(Hole, self.offsets.tolist(), self.lengths.tolist(), [HOLE_KINDS[k] for k in self.kinds.tolist()])

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)


@dataclass
class RdqFile:
    path: Path
    number: int
    size: int
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # entries with a valid marker
    totals: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # TotalSize = Size + 9
    msg_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, "V16"))
    holes: Sequence[Hole] = field(default_factory=list)  # a list, or Holes from the compiled core
    bad_markers: list[tuple[int, int, bytes]] = field(default_factory=list)  # (offset, total, id): torn entries
    #: candidates the walk did not take: (offset, total, id, reason, hidden), ``reason`` one of
    #: REJECT_REASONS, ``hidden`` the offset of the referenced candidate it would hide (else -1)
    rejected: list[tuple[int, int, bytes, str, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)


#: why a candidate was not taken (codes shared with the compiled core: position in this tuple)
REJECT_REASONS = ("not_a_message_term", "hides_referenced")
_TUPLE_SMALL, _TUPLE_LARGE, _COMPRESSED = 104, 105, 80
_ATOM_U8 = (115, 119)  # SMALL_ATOM_EXT, SMALL_ATOM_UTF8_EXT: one length byte
_ATOM_U16 = (100, 118)  # ATOM_EXT, ATOM_UTF8_EXT: two length bytes
_ZLIB = 0x78


class Referenced:
    """The ids a walk trusts: 16-byte ids, sorted (bytewise), as one buffer (what the compiled
    core binary-searches); the Python walk uses the set, built once and shared by every file."""

    def __init__(self, ids: np.ndarray):
        ids = np.ascontiguousarray(ids).view("V16")
        halves = ids.view(">u8").reshape(-1, 2).astype(np.uint64)  # big-endian halves: bytewise order
        hi, lo = halves[:, 0], halves[:, 1]
        if ((hi[1:] > hi[:-1]) | ((hi[1:] == hi[:-1]) & (lo[1:] > lo[:-1]))).all():
            self.sorted = ids.tobytes()  # already sorted and distinct (a model.store.IdSet's ids)
            return
        order = np.lexsort((lo, hi))
        keep = np.ones(len(order), bool)
        keep[1:] = (halves[order][1:] != halves[order][:-1]).any(axis=1)
        self.sorted = ids[order[keep]].tobytes()

    def __len__(self) -> int:
        return len(self.sorted) // 16

    @property
    def directory(self) -> bytes:
        """Where each two-byte prefix's ids start in ``sorted``: 65,537 native uint32, entry
        ``b`` the position of the first id whose first two bytes are ``b`` or more. The compiled
        walk looks every entry up, and this narrows each lookup to a handful of ids (a binary
        search over all of them cost as much as the walk itself). Made once per ``sorted``."""
        made = self.__dict__.get("_directory")
        if made is None or made[0] is not self.sorted:
            prefixes = np.frombuffer(self.sorted, ">u2")[::8]
            counts = np.bincount(prefixes, minlength=1 << 16)
            made = self.__dict__["_directory"] = (self.sorted, np.r_[0, np.cumsum(counts)].astype(np.uint32).tobytes())
        return made[1]

    @property
    def set(self) -> frozenset:
        s = self.__dict__.get("_set")
        if s is None:
            b = self.sorted
            s = self.__dict__["_set"] = frozenset(b[i : i + 16] for i in range(0, len(b), 16))
        return s


def plausible_term(data, start: int, length: int) -> bool:
    """The outer framing of a stored message term: version byte 131, then a tuple of arity >= 2
    whose first element is an atom lying inside the term (every message record: #basic_message,
    #mc), or a compressed term (tag 80, a non-zero size, then a zlib stream)."""
    if length < 4 or data[start] != 131:
        return False
    tag = data[start + 1]
    if tag == _COMPRESSED:
        return length >= 7 and int.from_bytes(data[start + 2 : start + 6], "big") > 0 and data[start + 6] == _ZLIB
    if tag == _TUPLE_SMALL:
        arity, k = data[start + 2], 3
    elif tag == _TUPLE_LARGE:
        if length < 7:
            return False
        arity, k = int.from_bytes(data[start + 2 : start + 6], "big"), 6
    else:
        return False
    if arity < 2 or k + 2 > length:
        return False
    atom = data[start + k]
    if atom in _ATOM_U8:
        return k + 2 + data[start + k + 1] <= length
    if atom in _ATOM_U16:
        return k + 3 <= length and k + 3 + int.from_bytes(data[start + k + 1 : start + k + 3], "big") <= length
    return False


def term_span(offset, total):
    """(start, length) of the stored term inside the entry at ``offset`` of ``total`` bytes
    (``<<Size:64, MsgId:16, Term, 255>>``); works on numpy arrays too."""
    return offset + c_rdq.ENTRY_HEADER_SIZE, total - c_rdq.ENTRY_HEADER_SIZE - 1


def entry_total(term_length):
    """The ``total`` of an entry framing a term of ``term_length`` bytes (inverse of term_span)."""
    return term_length + c_rdq.ENTRY_HEADER_SIZE + 1


def find_candidates(
    data, start: int, end: int, first_only: bool = False, extents=None, until: int | None = None
) -> np.ndarray:
    """Offsets in [start, until) where a complete entry (one that fits before ``end``, the end of
    the file) with a 255 marker starts (vectorised); ``until`` defaults to ``end``.

    ``first_only`` stops at the first chunk that yields any candidate (the resync case).
    ``extents`` (sorted ``[start, end)`` data ranges of a sparse file, see
    ``files.data_extents``): the holes between them read as zeros, where no entry can start
    (its size field would be 0), so they are skipped without being read."""
    found = []
    pos = start
    until = end if until is None else min(until, end)
    step = 4096 if first_only else _CHUNK  # a resync usually finds its entry close by: grow the window
    ends = [e for _, e in extents] if extents is not None else None
    while pos < until:
        stop = min(pos + step, until)
        if ends is not None:
            i = bisect.bisect_right(ends, pos)
            if i == len(ends):
                break  # only zeros from here on
            pos = max(pos, extents[i][0] - 7)  # a size field may start up to 7 bytes before data
            if pos >= until:
                break
            stop = min(pos + step, until, max(ends[i], pos + 1))
        window = np.frombuffer(data, np.uint8, count=min(stop + 7, end) - pos, offset=pos)
        n = stop - pos
        if len(window) < n + 7:
            window = np.concatenate([window, np.zeros(n + 7 - len(window), np.uint8)])
        size = np.empty(n, np.uint64)  # the size field at each offset: 8 strided big-endian views
        for k in range(min(8, n)):
            size[k::8] = np.frombuffer(window, ">u8", count=(n - k + 7) // 8, offset=k)
        cand = np.flatnonzero((size >= 16) & (size <= np.uint64(max(end - 9 - pos, 0))))
        # the largest Size that fits at each offset: end - 9 - offset (at least 16)
        limit = end - 9 - (pos + cand)
        cand = cand[(limit >= 16) & (size[cand] <= np.maximum(limit, 0).astype(np.uint64))]
        if len(cand):
            mark_at = pos + cand + 8 + size[cand].astype(np.int64)
            marks = np.frombuffer(data, np.uint8, count=end, offset=0)[mark_at]
            cand = cand[marks == _MARK] + pos
            found.append(cand)
            if first_only and len(cand):
                break
        drop_pages(data, pos, stop)  # memory stays flat over a huge file (read again if needed)
        pos = stop
        step = min(step * 2, _CHUNK)
    return np.concatenate(found) if found else np.zeros(0, np.int64)


def _hole_kind(data, o: int, n: int, extents=None) -> str:
    ranges = (
        [(o, o + n)] if extents is None else [(max(a, o), min(b, o + n)) for a, b in extents if a < o + n and b > o]
    )
    for a, b in ranges:
        for c in range(a, b, _CHUNK):
            if np.frombuffer(data, np.uint8, count=min(_CHUNK, b - c), offset=c).any():
                return "garbage"
            drop_pages(data, c, c + _CHUNK)
    return "zeroed"


def walk(path: Path, number: int, data=None, reference: bool = False, referenced: Referenced | None = None) -> RdqFile:
    """Every entry of one file, plus its holes, torn entries and rejected candidates (see the
    module's rule; ``referenced``: the ids to trust, none when not given). Never raises on damaged
    content. A big sparse file is walked by its data extents: its holes are skipped unread.

    The compiled core does the walk when it is built (``reference=True``, or no core: this
    module's Python walk, the specification it is tested against)."""
    data = map_file(path) if data is None else data
    end = len(data)
    extents = data_extents(path, end) if end >= _SPARSE_MIN else None
    if extents == [(0, end)]:
        extents = None
    if extents is None:  # a sparse file's holes are never read: no pages brought in around them
        reading_whole(data)
    f = RdqFile(path, number, end)
    if not reference and core.native() is not None:
        trusted = referenced is not None and len(referenced) > 0
        f.offsets, f.totals, f.msg_ids, holes, torn, rejected = core.walk_rdq(
            data, extents, referenced.sorted if trusted else None, referenced.directory if trusted else None
        )
        f.holes = Holes(*holes)
        f.bad_markers = torn
        f.rejected = rejected
        return f
    trusted = referenced.set if referenced is not None and len(referenced) else frozenset()
    ahead = _TrustedAhead(data, end, extents, trusted)
    offsets: list[int] = []
    o = 0
    hole = -1  # start of the hole being skipped, -1 when none
    size_at, mark = _SIZE, _MARK
    add_offset = offsets.append
    while o < end:
        if o + 24 <= end:
            (size,) = size_at(data, o)
            nxt = o + size + 9
            if size >= 16 and nxt <= end and data[nxt - 1] == mark:  # a candidate
                reason = None
                if data[o + 8 : o + 24] not in trusted:
                    if not plausible_term(data, o + 24, size - 16):
                        reason, hidden = 0, -1
                    else:
                        hidden = ahead.first(o + 1, nxt)
                        if hidden >= 0:
                            reason = 1
                if reason is None:
                    if hole >= 0:
                        f.holes.append(Hole(hole, o - hole, _hole_kind(data, hole, o - hole, extents)))
                        hole = -1
                    add_offset(o)
                    o = nxt
                    continue
                f.rejected.append((o, size + 9, bytes(data[o + 8 : o + 24]), REJECT_REASONS[reason], hidden))
            elif 16 <= size and nxt <= end:
                f.bad_markers.append((o, size + 9, bytes(data[o + 8 : o + 24])))  # torn: size fits, no marker
        if hole < 0:
            hole = o  # the chain breaks at o
        nxt = find_candidates(data, o + 1, end, first_only=True, extents=extents)
        o = int(nxt[0]) if len(nxt) else end
    if hole >= 0:
        if _is_truncated_tail(data, hole, end):
            f.holes.append(Hole(hole, end - hole, "truncated_tail"))
        else:
            f.holes.append(Hole(hole, end - hole, _hole_kind(data, hole, end - hole, extents)))
    if offsets:  # every such entry has its 24-byte head inside the file
        f.offsets = np.array(offsets, np.int64)
        heads = np.lib.stride_tricks.sliding_window_view(np.frombuffer(data, np.uint8, count=end), 24)[f.offsets]
        f.totals = heads[:, :8].copy().view(">u8").ravel().astype(np.int64) + 9
        f.msg_ids = heads[:, 8:].copy().view("V16").ravel()
    return f


class _TrustedAhead:
    """The trusted candidates ahead of the walk, found by one lazy forward scan: ``first(lo, hi)``
    is the smallest offset in [lo, hi) holding a candidate with a trusted id, -1 when none (``lo``
    never decreases from one call to the next, so each byte is scanned once at most)."""

    def __init__(self, data, end: int, extents, trusted: frozenset):
        self.data, self.end, self.extents, self.trusted = data, end, extents, trusted
        self.frontier = 0  # every offset below it has been scanned
        self.found: list[int] = []  # trusted candidates found, ascending
        self.i = 0  # first of ``found`` not below the last ``lo``

    def first(self, lo: int, hi: int) -> int:
        if not self.trusted:
            return -1
        found, data = self.found, self.data
        while True:
            while self.i < len(found) and found[self.i] < lo:
                self.i += 1
            if self.i < len(found):
                return found[self.i] if found[self.i] < hi else -1
            if self.frontier >= hi:
                return -1
            a = max(self.frontier, lo)
            b = max(hi, min(self.end, a + _CHUNK))  # at least a chunk ahead: one numpy pass per MiB
            for c in find_candidates(data, a, self.end, extents=self.extents, until=b).tolist():
                if data[c + 8 : c + 24] in self.trusted:
                    found.append(c)
            self.frontier = b


def _is_truncated_tail(data, o: int, end: int) -> bool:
    """An entry header at o whose size runs past the end of the file (a write cut short)."""
    if o + 8 > end:
        return any(data[o:end])
    size = int.from_bytes(data[o : o + 8], "big")
    return size >= 16 and o + size + 9 > end and size < (1 << 40)


def rejected_findings(f: RdqFile, store: str) -> list[Finding]:
    """One ``rdq-rejected-candidate`` finding per candidate the walk did not take."""
    out = []
    for o, t, i, why, hidden in f.rejected:
        if why == "hides_referenced":
            text = (
                f"candidate entry for {i.hex()} ({plural(t, 'byte')}) is referenced by no index and would hide the "
                f"referenced entry at {hidden}: not taken"
            )
        else:
            text = f"candidate entry for {i.hex()} ({plural(t, 'byte')}) is referenced by no index and holds no message term"
        details = {"store": store, "msg_id": i.hex(), "total_size": t, "reason": why}
        if hidden >= 0:
            details["hidden_offset"] = hidden
        out.append(Finding("rdq-rejected-candidate", text, str(f.path), o, details=details))
    return out


def broker_chain(f: RdqFile, data=None) -> list[int]:
    """Indexes (into f.offsets) of the entries the <= 3.13.0 sequential scanner reaches."""
    return broker_scan(f, data)[0]


def broker_scan(f: RdqFile, data=None) -> tuple[list[int], int]:
    """The <= 3.13.0 sequential scan of ``f``: (indexes into f.offsets of the entries it reaches,
    the offset where it stops). rabbit_msg_file:scan stops at a zero size field or at an entry
    that does not fit the file, and skips (by its size) an entry whose marker is not 255."""
    data = map_file(f.path) if data is None else data
    end = len(data)
    index = {off: i for i, off in enumerate(f.offsets.tolist())}
    reached = []
    o = 0
    while o + 8 <= end:
        size = int.from_bytes(data[o : o + 8], "big")
        if size == 0 or o + size + 9 > end:
            break
        i = index.get(o)
        if i is not None:
            reached.append(i)
        o += size + 9
    return reached, o


def dump_rows(path: Path, segment_entry_count: int | None = None):
    """The per-entry listing of one file (``dump``): entries and holes in file order, each as
    ``(row, term)`` with ``term`` the ``(data, start, length)`` of the stored message (None
    for holes and torn entries). The file is memory-mapped (pages come and go), never read whole."""
    data = map_file(path)
    f = walk(path, 0, data)
    rows = [
        (o, {"offset": o, "kind": "entry", "size": t, "msg_id": i.hex(), "status": "ok"})
        for o, t, i in zip(f.offsets.tolist(), f.totals.tolist(), (m.tobytes() for m in f.msg_ids))
    ]
    rows += [
        (o, {"offset": o, "kind": "entry", "size": t, "msg_id": i.hex(), "status": "no write marker"})
        for o, t, i in f.bad_markers
    ]
    rows += [
        (o, {"offset": o, "kind": "candidate", "size": t, "msg_id": i.hex(), "status": f"rejected: {why}"})
        for o, t, i, why, _ in f.rejected
    ]
    rows += [(h.offset, {"offset": h.offset, "kind": "hole", "size": h.length, "status": h.kind}) for h in f.holes]
    seen: set = set()
    for _, row in sorted(rows, key=lambda r: (r[0], r[1]["kind"] != "hole", r[1]["kind"])):
        term = None
        if row["kind"] == "entry" and row["status"] == "ok":
            if row["msg_id"] in seen:
                row["status"] = "duplicate id in this file"
            seen.add(row["msg_id"])
            term = (data, *term_span(row["offset"], row["size"]))
        yield row, term
