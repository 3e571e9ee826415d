"""CQv2 ``.qs`` per-queue store segments. Entries are only trusted through the offsets the
``.qi`` gives (QS2 leaves zero-filled ranges for messages acked while buffered), and checked
as QS2 check_msg_on_disk does: the entry header's size must equal the index's, and the CRC
(low 16 bits of CRC-32 over the term area) must match when its flag is set."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

from cqforensics.codes import QsStatus
from cqforensics.grammar import qs as c_qs

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
    if offset < c_qs.HEADER_SIZE or end > len(data):
        return OUT_OF_RANGE, 0
    h_size, flags, crc, _ = _ENTRY_HEADER(data, offset)
    if h_size != size:
        return BAD_SIZE, flags & 1
    if flags & 1:
        term = data[offset + c_qs.ENTRY_HEADER_SIZE:end]
        if zlib.crc32(term) & 0xFFFF != crc:
            return BAD_CRC, 1
    return OK, flags & 1


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


def open_qs(path: Path | None) -> QsFile | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(c_qs.HEADER_SIZE)
            size = f.seek(0, 2)
    except FileNotFoundError:
        return None
    except OSError as e:
        from cqforensics.errors import OperationalError

        raise OperationalError(f"{path}: cannot read: {e.strerror}") from e
    ok = len(head) == c_qs.HEADER_SIZE and head[:4] == c_qs.MAGIC and head[4] == c_qs.VERSION
    return QsFile(path, size, ok)
