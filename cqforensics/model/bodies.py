"""The one accessor of stored bytes: every module above the readers gets a body (or any byte
range of an input file) from a ``Bodies``, never from an mmap of its own.

Spans come from the readers (``readers.rdq.term_span``, ``readers.qs.term_span``, the v1
reader's embedded offsets), so no module here does framing arithmetic. Only the most recently
used files stay mapped, so pages read stop counting as resident memory once a file is done with.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cqforensics.codes import QsStatus
from cqforensics.readers import qs as r_qs
from cqforensics.readers.files import map_file


class Bodies:
    MAX_MAPS = 2

    def __init__(self):
        self._maps: dict[Path, object] = {}

    def _data(self, path: Path):
        m = self._maps.pop(path, None)
        if m is None:
            m = map_file(path)
            while len(self._maps) >= self.MAX_MAPS:
                old = self._maps.pop(next(iter(self._maps)))
                if hasattr(old, "close"):
                    old.close()
        self._maps[path] = m  # most recent last
        return m

    def read(self, path: Path, start: int, length: int) -> bytes:
        """``length`` bytes of ``path`` from ``start`` (fewer where the file ends first)."""
        return self._data(path)[start:start + length]

    def read_many(self, paths, starts, lengths) -> list[bytes]:
        """Byte ranges of files, looking each file up once per run of equal paths."""
        out, last, data = [], None, None
        for path, start, length in zip(paths, starts, lengths):
            if path is not last:
                data, last = self._data(path), path
            out.append(data[start:start + length])
        return out

    def buffers(self, paths: list[Path]) -> list:
        """The mapped bytes of each of ``paths``, all valid together (the compiled core reads
        many spans of them in one call); afterwards only the most recent stay mapped."""
        out = []
        for path in paths:
            m = self._maps.pop(path, None)
            out.append(map_file(path) if m is None else m)
            self._maps[path] = out[-1]
        while len(self._maps) > max(self.MAX_MAPS, len(paths)):
            old = self._maps.pop(next(iter(self._maps)))
            if hasattr(old, "close"):
                old.close()
        return out

    def size(self, path: Path) -> int:
        return len(self._data(path))

    def qs_entries(self, qs: r_qs.QsFile, offsets, sizes) -> np.ndarray:
        """``qs_entry`` (trusting the file header) of many entries: int8 QsStatus codes."""
        return qs.check_many(self._data(qs.path), offsets, sizes)

    def qs_entry(self, qs: r_qs.QsFile, offset: int, size: int, trust_header: bool = True) -> QsStatus:
        """The check of the ``.qs`` entry an index places at ``offset`` with term ``size``;
        ``trust_header=False`` judges the entry by its own header when the file's is damaged."""
        data = self._data(qs.path)
        return (qs.check(data, offset, size) if trust_header else r_qs.check_entry(data, offset, size))[0]

    def close(self) -> None:
        for m in self._maps.values():
            if hasattr(m, "close"):
                m.close()
        self._maps.clear()
