"""CQv2 ``.qs`` per-queue store segments. Entries are only trusted through the offsets the
``.qi`` gives (QS2 leaves zero-filled ranges for messages acked while buffered), and checked
as QS2 check_msg_on_disk does: the entry header's size must equal the index's, and the CRC
(low 16 bits of CRC-32 over the term area) must match when its flag is set."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

from cqforensics.grammar import qs as c_qs

_ENTRY_HEADER = c_qs.ENTRY_HEADER.unpack_from

OK, MISSING_FILE, BAD_HEADER, OUT_OF_RANGE, BAD_SIZE, BAD_CRC = "ok", "missing_file", "bad_header", \
    "out_of_range", "bad_size", "bad_crc"


@dataclass
class QsFile:
    """A .qs segment: its size and header; entry checks read through a caller-supplied buffer
    (so the caller decides how long the file stays mapped)."""

    path: Path
    size: int
    header_ok: bool

    def check(self, data, offset: int, size: int) -> tuple[str, int]:
        """(status, CRC flag) of the entry the index places at ``offset`` with term ``size``."""
        if not self.header_ok:
            return BAD_HEADER, 0
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
