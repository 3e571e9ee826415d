"""CQv2 ``.qs`` per-queue store segments. Entries are only trusted through the offsets the
``.qi`` gives (QS2 leaves zero-filled ranges for messages acked while buffered), and checked
as QS2 check_msg_on_disk does: the entry header's size must equal the index's, and the CRC
(low 16 bits of CRC-32 over the term area) must match when its flag is set."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

from cqforensics.grammar import qs as c_qs
from cqforensics.readers.files import map_file

_ENTRY_HEADER = c_qs.ENTRY_HEADER.unpack_from

OK, MISSING_FILE, BAD_HEADER, OUT_OF_RANGE, BAD_SIZE, BAD_CRC = "ok", "missing_file", "bad_header", \
    "out_of_range", "bad_size", "bad_crc"


@dataclass
class QsFile:
    path: Path
    data: object  # bytes or mmap
    header_ok: bool

    @property
    def size(self) -> int:
        return len(self.data)

    def check(self, offset: int, size: int) -> tuple[str, int]:
        """(status, CRC flag) of the entry the index places at ``offset`` with term ``size``."""
        if not self.header_ok:
            return BAD_HEADER, 0
        end = offset + c_qs.ENTRY_HEADER_SIZE + size
        if offset < c_qs.HEADER_SIZE or end > len(self.data):
            return OUT_OF_RANGE, 0
        h_size, flags, crc, _ = _ENTRY_HEADER(self.data, offset)
        if h_size != size:
            return BAD_SIZE, flags & 1
        if flags & 1:
            term = self.data[offset + c_qs.ENTRY_HEADER_SIZE:end]
            if zlib.crc32(term) & 0xFFFF != crc:
                return BAD_CRC, 1
        return OK, flags & 1

    def term(self, offset: int, size: int):
        start = offset + c_qs.ENTRY_HEADER_SIZE
        return self.data[start:start + size]


def open_qs(path: Path | None) -> QsFile | None:
    if path is None or not path.exists():
        return None
    data = map_file(path)
    ok = len(data) >= c_qs.HEADER_SIZE and data[:4] == c_qs.MAGIC and data[4] == c_qs.VERSION
    return QsFile(path, data, ok)
