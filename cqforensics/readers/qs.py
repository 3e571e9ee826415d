"""CQv2 ``.qs`` per-queue store segments. Entries are only trusted through the offsets the
``.qi`` gives (QS2 leaves zero-filled ranges for messages acked while buffered), and checked
as QS2 check_msg_on_disk does: the entry header's size must equal the index's, and the CRC
(low 16 bits of CRC-32 over the term area) must match when its flag is set."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cqforensics import compiled as core
from cqforensics.base.enums import QsStatus
from cqforensics.base.errors import CQError, FormatError
from cqforensics.grammar import qs as c_qs
from cqforensics.readers.files import data_extents, drop_pages, find, map_file, next_nonzero, open_regular

_ENTRY_HEADER = c_qs.ENTRY_HEADER.unpack_from

OK, MISSING_FILE, BAD_HEADER, OUT_OF_RANGE = (
    QsStatus.OK,
    QsStatus.MISSING_FILE,
    QsStatus.BAD_HEADER,
    QsStatus.OUT_OF_RANGE,
)
BAD_SIZE, BAD_CRC = QsStatus.BAD_SIZE, QsStatus.BAD_CRC


def term_span(offset, size):
    """(start, length) of the term of the entry at ``offset`` whose index records ``size``."""
    return offset + c_qs.ENTRY_HEADER_SIZE, size


def entry_span(offset, size):
    """(start, length) of the whole entry (header included) at ``offset`` with term ``size``."""
    return offset, c_qs.ENTRY_HEADER_SIZE + size


def first_entry_offset() -> int:
    """Where the first entry of a segment starts (right after the file header)."""
    return c_qs.HEADER_SIZE


def first_term_start() -> int:
    """Where the term of the first entry of a segment starts (right after the file header)."""
    return term_span(c_qs.HEADER_SIZE, 0)[0]


def check_entry(data, offset: int, size: int) -> tuple[QsStatus, int]:
    """(status, CRC flag) of the entry at ``offset`` judged by its own header alone: the size
    it records must be ``size`` and its CRC (when flagged) must match (QS2 check_msg_on_disk)."""
    end = offset + c_qs.ENTRY_HEADER_SIZE + size
    if offset < c_qs.HEADER_SIZE or size < 0 or end > len(data):
        return OUT_OF_RANGE, 0
    h_size, flags, crc, _ = _ENTRY_HEADER(data, offset)
    if h_size != size:
        return BAD_SIZE, flags & 1
    if flags & 1:
        term = data[offset + c_qs.ENTRY_HEADER_SIZE : end]
        if zlib.crc32(term) & 0xFFFF != crc:
            return BAD_CRC, 1
    return OK, flags & 1


#: the most bytes ERTS copies into ``term_to_iovec``'s output: a longer binary is handed over by
#: reference, an iovec element of its own (ERL_ONHEAP_BIN_LIMIT)
_ONHEAP_BIN_LIMIT = 64
_BINARY_EXT = 109  # "m": tag, 4-byte length, the bytes


def cut_between_write_pieces(path: Path, offset: int, size: int, file_size: int) -> bool:
    """Whether the file ends, inside the entry at ``offset`` (term ``size``), where a write of
    that entry can stop when the writer is killed: QS2 writes an entry as the pieces
    ``[header, term_to_iovec(Msg), padding]`` in ``pwrite`` calls of many iovecs each (split by
    the runtime at IOV_MAX), and Linux stops a buffered write at a page boundary when a fatal
    signal is pending. So: at a page boundary, right after the 8-byte header, or right before or
    after the bytes of a binary longer than 64 bytes (a piece of its own; a message body is
    one), with the bytes present the start of that entry (its header recording ``size``).
    Seen on 4.0.5 killed during a mass requeue: the file ended right before a 1,500-byte body."""
    start, length = entry_span(offset, size)
    if not start < file_size < start + length:
        return False
    try:
        with open_regular(path) as f:
            f.seek(start)
            got = f.read(file_size - start)
    except (OSError, FormatError):
        return False
    if len(got) != file_size - start:  # changed under us
        return False
    if file_size % 4096 == 0:
        return True
    if len(got) < c_qs.ENTRY_HEADER_SIZE or _ENTRY_HEADER(got, 0)[0] != size:
        return False
    if len(got) == c_qs.ENTRY_HEADER_SIZE:
        return True
    for at in range(c_qs.ENTRY_HEADER_SIZE, len(got) - 4):  # a binary whose bytes end where the file does
        if got[at] == _BINARY_EXT:
            n = int.from_bytes(got[at + 1 : at + 5], "big")
            if n > _ONHEAP_BIN_LIMIT and len(got) in (at + 5, at + 5 + n):
                return True
    return False


def check_entries(data, offsets, sizes, reference: bool = False) -> np.ndarray:
    """``check_entry``'s status (int8 QsStatus codes) for many entries at once: by the compiled
    core when it is built, else (or with ``reference=True``) entry by entry."""
    if not reference and core.native() is not None:
        return core.check_qs(data, offsets, sizes)
    return np.array(
        [check_entry(data, o, s)[0] for o, s in zip(np.asarray(offsets).tolist(), np.asarray(sizes).tolist())], np.int8
    )


@dataclass
class QsFile:
    """A .qs segment: its size and header; entry checks read through a caller-supplied buffer
    (so the caller decides how long the file stays mapped)."""

    path: Path
    size: int
    header_ok: bool

    def check(self, data, offset: int, size: int) -> tuple[QsStatus, int]:
        """(status, CRC flag) of the entry the index places at ``offset`` with term ``size``."""
        if not self.header_ok:
            return BAD_HEADER, 0
        return check_entry(data, offset, size)

    def check_many(self, data, offsets, sizes) -> np.ndarray:
        """``check`` of many entries (int8 QsStatus codes)."""
        if not self.header_ok:
            return np.full(len(offsets), BAD_HEADER, np.int8)
        return check_entries(data, offsets, sizes)


def open_qs(path: Path | None) -> QsFile | None:
    if path is None:
        return None
    try:
        with open_regular(path) as f:
            head = f.read(c_qs.HEADER_SIZE)
            size = f.seek(0, 2)
    except FileNotFoundError:
        return None
    except FormatError:  # not a regular file (NotRegularFile): never read, as if missing
        return None
    except OSError as e:
        from cqforensics.base.errors import OperationalError

        raise OperationalError(f"{path}: cannot read: {e.strerror}") from e
    ok = len(head) == c_qs.HEADER_SIZE and head[:4] == c_qs.MAGIC and head[4] == c_qs.VERSION
    return QsFile(path, size, ok)


_TERM_TAG = b"\x83"  # every entry's term starts with the external-term-format version byte
_DROP_EVERY = 16 << 20


def scan_entries(data, start: int, extents=None):
    """Entries of a segment found without the .qi (heuristically: an entry header whose term
    starts with 131 and whose CRC, when flagged, checks), from ``start`` to the end, in file order:
    ``("entry", offset, size, flags)`` and ``("gap", offset, end, zeroed)`` for the bytes between
    (QS2 leaves zero-filled gaps for messages acked while buffered; docs/formats/classic.md §3.2).
    ``data`` may be a map of a huge file: nothing is copied but a term being checked, zero runs
    are skipped vectorised (``files.next_nonzero``), garbage jumps to the next byte 131 that could
    start a term, ``extents`` (``files.data_extents``) skips a sparse file's holes unread, and the
    pages behind the scan are dropped, so memory stays flat whatever the file's size."""
    end = len(data)
    holes = _holes(extents, end)
    o, gap, gap_zero, dropped = start, None, True, 0
    while o < end:
        if o - dropped >= _DROP_EVERY:
            drop_pages(data, dropped, o)
            dropped = o
        hole = holes.get(o)
        if hole is not None:  # a hole reads as zeros: skipped unread
            gap = o if gap is None else gap
            o = hole
            continue
        if o + c_qs.ENTRY_HEADER_SIZE + 1 <= end:
            size, flags, crc, reserved = _ENTRY_HEADER(data, o)
            t_start, length = term_span(o, size)
            if (
                0 < size <= end - t_start
                and flags in (0, 1)
                and reserved == 0
                and data[t_start] == 0x83
                and (not flags or zlib.crc32(data[t_start : t_start + length]) & 0xFFFF == crc)
            ):
                if gap is not None:
                    yield "gap", gap, o, gap_zero
                    gap, gap_zero = None, True
                yield "entry", o, size, flags
                o = sum(entry_span(o, size))
                continue
        gap = o if gap is None else gap
        nxt = _next_hole(holes, o, end)
        if data[o] == 0:  # an entry's header starts with zeros: resume up to a header before the run's end
            o = max(o + 1, next_nonzero(data, o, nxt) - c_qs.ENTRY_HEADER_SIZE)
        else:  # no entry can start before the next byte 131 (its term's first byte)
            gap_zero = False
            tag = find(data, _TERM_TAG, o + 1 + c_qs.ENTRY_HEADER_SIZE, min(nxt + c_qs.ENTRY_HEADER_SIZE, end))
            o = nxt if tag < 0 else min(tag - c_qs.ENTRY_HEADER_SIZE, nxt)
    if gap is not None:
        yield "gap", gap, end, gap_zero


def _holes(extents, end: int) -> dict[int, int]:
    """hole start -> hole end, from a file's data extents (none when unknown)."""
    if extents is None:
        return {}
    out, pos = {}, 0
    for a, b in extents:
        if a > pos:
            out[pos] = a
        pos = max(pos, b)
    if pos < end:
        out[pos] = end
    return out


def _next_hole(holes: dict[int, int], o: int, end: int) -> int:
    """Where the next hole after ``o`` starts (``end`` when none)."""
    return min(min((h for h in holes if h > o), default=end), end)


def garbage_runs(path: Path, start: int, reference: bool = False):
    """(offset, length) of every run of bytes at or after ``start`` that is neither an entry nor
    zeros (QS2 leaves only zero-filled gaps: junk, a torn write, or a damaged entry); none for a
    file with a bad header (``qs-bad-header``'s) or one that is not a regular file. Mapped, and
    a large file walked by its data extents; by the compiled core when it is built, else (or
    with ``reference=True``) by ``scan_entries``."""
    try:
        data = map_file(path)
    except CQError:  # not a regular file, or unreadable: the index checks say so
        return
    yield from garbage_in(data, start, data_extents(path, len(data)) if len(data) > (64 << 20) else None, reference)


def garbage_in(data, start: int, extents=None, reference: bool = False, per_call: int = 4096):
    """``garbage_runs`` of a segment's bytes (``extents``: ``files.data_extents``, or None); the
    core finds at most ``per_call`` runs per call (a hostile file may hold millions)."""
    if len(data) < c_qs.HEADER_SIZE or data[:4] != c_qs.MAGIC or data[4] != c_qs.VERSION:
        return
    o = max(start, first_entry_offset())
    if reference or core.native() is None:
        for kind, off, end, zeroed in scan_entries(data, o, extents):
            if kind == "gap" and not zeroed:
                yield off, end - off
        return
    holes = sorted(_holes(extents, len(data)).items())
    while o is not None:
        offsets, lengths, o = core.qs_garbage(data, o, holes, per_call)
        yield from zip(offsets.tolist(), lengths.tolist())


def trailing_garbage(path: Path, start: int) -> tuple[int, int] | None:
    """The first of ``garbage_runs`` at or after ``start``, or None."""
    return next(garbage_runs(path, start), None)


def dump_rows(path: Path, segment_entry_count: int | None = None):
    """The per-entry listing of one segment (``dump``) as ``(row, term)`` pairs: the file is
    mapped and walked by ``scan_entries`` (a sparse file by its data extents), never read whole."""
    data = map_file(path)
    ok = data[:4] == c_qs.MAGIC and len(data) >= c_qs.HEADER_SIZE and data[4] == c_qs.VERSION
    yield {"offset": 0, "kind": "header", "status": "ok" if ok else "bad header"}, None
    extents = data_extents(path, len(data)) if len(data) > (64 << 20) else None
    for kind, o, a, b in scan_entries(data, first_entry_offset(), extents):
        if kind == "entry":
            start, length = term_span(o, a)
            yield (
                {"offset": o, "kind": "entry", "size": a, "crc": "ok" if b else "none", "status": "ok"},
                (data, start, length),
            )
        else:
            yield {"offset": o, "kind": "gap", "size": a - o, "status": "zeroed" if b else "unparsed bytes"}, None
