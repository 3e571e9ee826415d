"""CQv2 ``.qs`` per-queue store segments. Entries are only trusted through the offsets the
``.qi`` gives (QS2 leaves zero-filled ranges for messages acked while buffered), and checked
as QS2 check_msg_on_disk does: the entry header's size must equal the index's, and the CRC
(low 16 bits of CRC-32 over the term area) must match when its flag is set."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cqforensics import core
from cqforensics.codes import QsStatus
from cqforensics.grammar import qs as c_qs
from cqforensics.errors import FormatError
from cqforensics.readers.files import open_regular, read_bytes

_ENTRY_HEADER = c_qs.ENTRY_HEADER.unpack_from

OK, MISSING_FILE, BAD_HEADER, OUT_OF_RANGE = QsStatus.OK, QsStatus.MISSING_FILE, QsStatus.BAD_HEADER, QsStatus.OUT_OF_RANGE
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
        term = data[offset + c_qs.ENTRY_HEADER_SIZE:end]
        if zlib.crc32(term) & 0xFFFF != crc:
            return BAD_CRC, 1
    return OK, flags & 1


def check_entries(data, offsets, sizes, reference: bool = False) -> np.ndarray:
    """``check_entry``'s status (int8 QsStatus codes) for many entries at once: by the compiled
    core when it is built, else (or with ``reference=True``) entry by entry."""
    if not reference and core.native() is not None:
        return core.check_qs(data, offsets, sizes)
    return np.array([check_entry(data, o, s)[0] for o, s in zip(np.asarray(offsets).tolist(),
                                                              np.asarray(sizes).tolist())], np.int8)


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
        from cqforensics.errors import OperationalError

        raise OperationalError(f"{path}: cannot read: {e.strerror}") from e
    ok = len(head) == c_qs.HEADER_SIZE and head[:4] == c_qs.MAGIC and head[4] == c_qs.VERSION
    return QsFile(path, size, ok)


_NONZERO = re.compile(rb"[^\x00]")


def dump_rows(path: Path, segment_entry_count: int | None = None):
    """The per-entry listing of one segment (``dump``) as ``(row, term)`` pairs.

    Without the .qi, entries are found heuristically: an entry header whose term starts
    with 131 and whose CRC checks; zero runs are skipped (QS2 leaves zero-filled gaps for
    messages acked while buffered; rabbitmq-formats.md 3.2)."""
    data = read_bytes(path)
    ok = data[:4] == c_qs.MAGIC and len(data) >= c_qs.HEADER_SIZE and data[4] == c_qs.VERSION
    yield {"offset": 0, "kind": "header", "status": "ok" if ok else "bad header"}, None
    o, gap = first_entry_offset(), None
    while o < len(data):
        if o + c_qs.ENTRY_HEADER_SIZE + 1 <= len(data):
            size, flags, crc, reserved = _ENTRY_HEADER(data, o)
            start, length = term_span(o, size)
            term = data[start:start + length]
            if 0 < size <= len(data) - start and flags in (0, 1) and reserved == 0 and term[:1] == b"\x83" \
                    and (not flags or zlib.crc32(term) & 0xFFFF == crc):
                if gap is not None:
                    yield _gap(data, gap, o), None
                    gap = None
                yield ({"offset": o, "kind": "entry", "size": size, "crc": "ok" if flags else "none", "status": "ok"},
                       (data, start, length))
                o = sum(entry_span(o, size))
                continue
        gap = o if gap is None else gap
        if data[o] == 0:
            m = _NONZERO.search(data, o)
            o = m.start() if m else len(data)
        else:
            o += 1
    if gap is not None:
        yield _gap(data, gap, len(data)), None


def _gap(data: bytes, start: int, end: int) -> dict:
    return {"offset": start, "kind": "gap", "size": end - start,
            "status": "zeroed" if not any(data[start:end]) else "unparsed bytes"}
