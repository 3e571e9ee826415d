"""The one accessor of stored bytes: every module above the readers gets a body (or any byte
range of an input file) from a ``Bodies``, never from an mmap of its own.

Spans come from the readers (``readers.rdq.term_span``, ``readers.qs.term_span``, the v1
reader's embedded offsets), so no module here does framing arithmetic. Only the most recently
used files stay mapped, so pages read stop counting as resident memory once a file is done with.
The compiled decode reads whole batches from open files instead (``descriptors``): a store's
files are visited once per queue, and reading costs no mapping and unmapping of their pages
at each visit (with many small files, as a compacted store has, that work was most of the read).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from cqforensics import compiled as core
from cqforensics.base.enums import QsStatus
from cqforensics.base.schema import binary_array
from cqforensics.readers import qs as r_qs
from cqforensics.readers.files import map_file, open_file


class Bodies:
    MAX_MAPS = 2
    #: files kept open for ``descriptors``: no memory cost, a descriptor each; every file of a
    #: store of a few GiB, so each is opened once per read, not once per queue that uses it
    MAX_OPEN = 128

    #: bytes of ``.qs`` checks kept for asking again (a clean start's crash check and the listing
    #: after it check the same entries: each is checked once)
    QS_CHECKED_BYTES = 32 << 20

    def __init__(self):
        self._maps: dict[Path, object] = {}
        self._open: dict[Path, object] = {}  # path -> file object, most recent last
        self._qs_checked: dict[tuple, np.ndarray] = {}
        self._qs_room = self.QS_CHECKED_BYTES

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
        return self._data(path)[start : start + length]

    def read_many(self, paths, starts, lengths) -> list[bytes]:
        """Byte ranges of files, looking each file up once per run of equal paths."""
        out, last, data = [], None, None
        for path, start, length in zip(paths, starts, lengths):
            if path is not last:
                data, last = self._data(path), path
            out.append(data[start : start + length])
        return out

    def column(self, paths: list[Path], file_ix: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
        """Arrow binary: row k the bytes ``[starts[k], starts[k] + lengths[k])`` of
        ``paths[file_ix[k]]`` (fewer where the file ends first), by the compiled core (read a run
        of nearby spans at a time straight into the column) when it is built, else span by span."""
        if core.native() is None or int(np.maximum(lengths, 0).sum()) >= 1 << 31:  # past int32 offsets
            return binary_array(self.read_many([paths[f] for f in file_ix.tolist()], starts.tolist(), lengths.tolist()))
        used, local = np.unique(file_ix, return_inverse=True)
        return core.read_spans(
            self.descriptors([paths[f] for f in used.tolist()]), local.astype(np.int32), starts, lengths
        )

    def descriptors(self, paths: list[Path]) -> list[int]:
        """A descriptor of each of ``paths`` open for reading, all valid together (the compiled
        core reads many spans of them in one call); afterwards only the most recent stay open."""
        out = []
        for path in paths:
            f = self._open.pop(path, None)
            self._open[path] = f = open_file(path) if f is None else f
            out.append(f.fileno())
        while len(self._open) > max(self.MAX_OPEN, len(paths)):
            self._open.pop(next(iter(self._open))).close()
        return out

    def size(self, path: Path) -> int:
        return len(self._data(path))

    def qs_entries(self, qs: r_qs.QsFile, offsets, sizes) -> np.ndarray:
        """``qs_entry`` (trusting the file header) of many entries: int8 QsStatus codes (read-only;
        kept, up to ``QS_CHECKED_BYTES``, for the same entries asked again)."""
        key = (qs.path, np.ascontiguousarray(offsets).tobytes(), np.ascontiguousarray(sizes).tobytes())
        got = self._qs_checked.get(key)
        if got is None:
            got = qs.check_many(self._data(qs.path), offsets, sizes)
            cost = len(key[1]) + len(key[2]) + len(got)
            if cost <= self._qs_room:
                got.flags.writeable = False
                self._qs_checked[key] = got
                self._qs_room -= cost
        return got

    def qs_entry(self, qs: r_qs.QsFile, offset: int, size: int, trust_header: bool = True) -> QsStatus:
        """The check of the ``.qs`` entry an index places at ``offset`` with term ``size``;
        ``trust_header=False`` judges the entry by its own header when the file's is damaged."""
        data = self._data(qs.path)
        return (qs.check(data, offset, size) if trust_header else r_qs.check_entry(data, offset, size))[0]

    def close(self) -> None:
        self._qs_checked.clear()
        self._qs_room = self.QS_CHECKED_BYTES
        for m in self._maps.values():
            if hasattr(m, "close"):
                m.close()
        self._maps.clear()
        for f in self._open.values():
            f.close()
        self._open.clear()
