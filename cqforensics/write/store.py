"""Writing one vhost's message store: queue dirs (``.qi`` + ``.qs``, or CQv1 ``.idx``) and the
shared store's ``.rdq`` files, from terms in memory or byte ranges of source files.

Copies of source ranges go through ``os.copy_file_range`` (the kernel copies page cache to
page cache), and contiguous ranges are merged into one copy, so rewriting a store that is
mostly live costs about what copying it does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cqforensics.base.errors import OperationalError
from cqforensics.grammar import idx as c_idx
from cqforensics.grammar import qi as c_qi
from cqforensics.grammar import qs as c_qs
from cqforensics.grammar import rdq as c_rdq
from cqforensics.readers.registry import file_name
from cqforensics.write import formats

_COPY_CHUNK = 1 << 30


class Sources:
    """Open read-only descriptors of source files (a few at a time)."""

    MAX_OPEN = 8

    def __init__(self):
        self._fds: dict[Path, int] = {}

    def fd(self, path: Path) -> int:
        fd = self._fds.pop(path, None)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as e:
                raise OperationalError(f"{path}: cannot read: {e.strerror}") from e
            while len(self._fds) >= self.MAX_OPEN:
                os.close(self._fds.pop(next(iter(self._fds))))
        self._fds[path] = fd
        return fd

    def read(self, path: Path, offset: int, length: int) -> bytes:
        return os.pread(self.fd(path), length, offset)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class OutFile:
    """A new file written sequentially from bytes and source ranges (merged when contiguous)."""

    def __init__(self, path: Path, sources: Sources, dry: bool = False):
        """``dry``: count the bytes, write nothing (for --dry-run plans)."""
        self.path = path
        self.sources = sources
        self.dry = dry
        self.fd = -1
        if not dry:
            try:
                self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except OSError as e:
                raise OperationalError(f"{path}: cannot create: {e.strerror}") from e
        self.size = 0
        self._buf = bytearray()
        self._run: list | None = None  # [source path, offset, length]

    def put(self, data) -> None:
        self.size += len(data)
        if self.dry:
            return
        self._flush_run()
        self._buf += data
        if len(self._buf) >= 1 << 20:
            self._flush_buf()

    def copy(self, path: Path, offset: int, length: int) -> None:
        if self.dry:
            self.size += length
            return
        run = self._run
        if run is not None and run[0] == path and run[1] + run[2] == offset:
            run[2] += length
        else:
            self._flush_run()
            self._run = [path, offset, length]
        self.size += length

    def _flush_buf(self) -> None:
        if self._buf:
            _write_all(self.fd, self._buf, self.path)
            self._buf = bytearray()

    def _flush_run(self) -> None:
        if self._run is None:
            return
        self._flush_buf()
        path, offset, length = self._run
        self._run = None
        src = self.sources.fd(path)
        while length:
            n = 0
            try:
                n = os.copy_file_range(src, self.fd, min(length, _COPY_CHUNK), offset)
            except OSError:
                n = 0
            if n <= 0:  # not supported here, or the source is shorter than it was
                data = os.pread(src, min(length, 1 << 24), offset)
                if not data:
                    raise OperationalError(f"{path}: ends before offset {offset + length} (changed while reading?)")
                _write_all(self.fd, data, self.path)
                n = len(data)
            offset += n
            length -= n

    def close(self, sync: bool = False) -> None:
        if self.dry:
            return
        self._flush_run()
        self._flush_buf()
        if sync:
            os.fsync(self.fd)
        os.close(self.fd)


def _write_all(fd: int, data, path: Path) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError as e:
        raise OperationalError(f"{path}: cannot write: {e.strerror}") from e


# -- the shared store ------------------------------------------------------------------------------


class SharedStoreWriter:
    """``msg_store_persistent``: entries appended to ``0.rdq``, ``1.rdq`` ... A new file starts
    when the next entry would take the current one past ``limit`` (an entry larger than the
    limit gets a file of its own), as the broker's writer rolls over. ``first``: the number of
    the first file (``compact --threshold`` numbers new files above the files it keeps)."""

    def __init__(
        self,
        path: Path,
        sources: Sources,
        limit: int = c_rdq.FILE_SIZE_LIMIT,
        sync: bool = False,
        dry: bool = False,
        first: int = 0,
    ):
        self.path = path
        self.first = first
        self.sources = sources
        self.limit = limit
        self.sync = sync
        self.dry = dry
        self.files: list[tuple[Path, int]] = []  # (path, size) of closed files
        self.entries = 0
        self._out: OutFile | None = None
        if not dry:
            path.mkdir(parents=True, exist_ok=True)

    def _room(self, total: int) -> OutFile:
        out = self._out
        if out is not None and out.size and out.size + total > self.limit:
            self._close_current()
            out = None
        if out is None:
            out = self._out = OutFile(
                self.path / file_name("rdq", self.first + len(self.files)), self.sources, self.dry
            )
        return out

    def _close_current(self) -> None:
        if self._out is not None:
            self._out.close(self.sync)
            self.files.append((self._out.path, self._out.size))
            self._out = None

    def add(self, msg_id: bytes, term: bytes) -> None:
        entry = formats.rdq_entry(msg_id, term)
        self._room(len(entry)).put(entry)
        self.entries += 1

    def add_from(self, msg_id: bytes, path: Path, offset: int, length: int) -> None:
        """A new entry whose term is ``length`` bytes of ``path`` at ``offset``."""
        out = self._room(formats.rdq_entry_size(length))
        out.put(c_rdq.ENTRY_HEAD.pack(c_rdq.MSG_ID_SIZE + length, msg_id))
        out.copy(path, offset, length)
        out.put(b"\xff")
        self.entries += 1

    def copy(self, path: Path, offset: int, total: int) -> None:
        """A whole source entry (size field to marker) at ``offset``."""
        self._room(total).copy(path, offset, total)
        self.entries += 1

    def keep(self, path: Path, size: int) -> Path:
        """A source file copied whole, under its own name (``compact --threshold`` keeps files
        whose garbage ratio is at or below the threshold); returns the output path."""
        out = OutFile(self.path / path.name, self.sources, self.dry)
        if size:
            out.copy(path, 0, size)
        out.close(self.sync)
        return out.path

    def close(self) -> None:
        self._close_current()

    @property
    def bytes(self) -> int:
        return sum(s for _, s in self.files)


# -- queue dirs -------------------------------------------------------------------------------------


@dataclass
class Entry:
    """One message a queue index will hold. Its term is ``term`` or the source range ``src``
    (path, offset, length); for a ``.qs`` entry copied whole, ``src`` spans the 8-byte entry
    header too and ``qs_header`` says so."""

    seq_id: int
    msg_id: bytes
    size: int  # message body size (the index's stats field)
    expiry: int = 0  # microseconds since the epoch, 0 = none
    shared: bool = False  # body in the shared store (referenced by id)
    delivered: bool = False  # CQv1 only: write a deliver record
    term: bytes | None = None
    src: tuple[Path, int, int] | None = None
    qs_header: bool = False


@dataclass
class QueueStats:
    messages: int = 0
    bytes: int = 0  # index + queue-store bytes written
    files: list[Path] = field(default_factory=list)


class QueueWriter:
    """One queue dir: ``.queue_name`` plus v2 segments (``N.qi`` with ``N.qs``) or CQv1
    ``N.idx`` segments (no journal: a dirty start reads segments alone)."""

    def __init__(
        self,
        path: Path,
        sources: Sources,
        index_version: int,
        entry_count: int,
        queue_name_stub: bytes | None,
        sync: bool = False,
        dry: bool = False,
    ):
        self.path = path
        self.sources = sources
        self.version = index_version
        self.entry_count = entry_count  # v2: the .qi/.qs segment size; v1: the vhost's .config value
        self.sync = sync
        self.dry = dry
        self.stats = QueueStats()
        if not dry:
            path.mkdir(parents=True, exist_ok=False)
        if queue_name_stub is not None:
            out = OutFile(path / ".queue_name", sources, dry)
            out.put(queue_name_stub)
            out.close(sync)
        self._number = -1  # the segment being gathered
        self.next_seq = 0  # above every SeqId added
        self._pending: list[Entry] = []

    def _term(self, e: Entry) -> bytes:
        if e.term is not None:
            return e.term
        path, off, length = e.src
        if e.qs_header:
            off, length = off + c_qs.ENTRY_HEADER_SIZE, length - c_qs.ENTRY_HEADER_SIZE
        if self.dry:
            return bytes(length)
        data = self.sources.read(path, off, length)
        if len(data) != length:
            raise OperationalError(f"{path}: ends before offset {off + length} (changed while reading?)")
        return data

    def set_entry_count(self, count: int) -> None:
        """The segment size of the entries added next (a source's segments record theirs)."""
        if count != self.entry_count:
            self._flush()
            self.entry_count, self._number = count, -1

    def add(self, entries: list[Entry]) -> None:
        """Entries in ascending SeqId order (across calls too). A segment is written once an
        entry of a later one arrives (or at ``close``), so memory holds one segment's entries."""
        for e in entries:
            number = e.seq_id // self.entry_count
            if number != self._number:
                if self._pending and number < self._number:
                    raise ValueError(f"seq id {e.seq_id} arrives after segment {self._number}")
                self._flush()
                self._number = number
            if e.seq_id < self.next_seq:
                raise ValueError(f"seq id {e.seq_id} is not above {self.next_seq - 1}")
            self._pending.append(e)
            self.next_seq = e.seq_id + 1

    def _flush(self) -> None:
        if self._pending:
            (self._v1_segment if self.version == 1 else self._v2_segment)(self._number, self._pending)
            self._pending = []

    def _done(self, *files: OutFile | None) -> None:
        for f in files:
            if f is not None:
                f.close(self.sync)
                self.stats.bytes += f.size
                self.stats.files.append(f.path)

    def _v2_segment(self, number: int, entries: list[Entry]) -> None:
        base = number * self.entry_count
        qs = None
        n = len(entries)
        slots = np.empty(n, np.int64)
        loc = np.empty(n, np.uint8)
        ids = np.zeros(n, "V16")
        qs_off = np.zeros(n, np.uint64)
        qs_size = np.zeros(n, np.uint32)
        size = np.empty(n, np.uint32)
        expiry = np.empty(n, np.uint64)
        for k, e in enumerate(entries):
            slots[k], size[k], expiry[k] = e.seq_id - base, e.size, e.expiry
            if e.shared:
                loc[k] = c_qi.LOC_SHARED_STORE
                ids[k] = np.frombuffer(e.msg_id, "V16")[0]
                continue
            if qs is None:
                qs = OutFile(self.path / file_name("qs", number), self.sources, self.dry)
                qs.put(formats.segment_header(c_qs.MAGIC, number, self.entry_count))
            loc[k] = c_qi.LOC_QUEUE_STORE
            qs_off[k] = qs.size
            if e.qs_header:  # a whole source entry, header included
                path, off, length = e.src
                qs.copy(path, off, length)
                qs_size[k] = length - c_qs.ENTRY_HEADER_SIZE
            elif e.term is not None:
                qs.put(formats.qs_entry_header(e.term))
                qs.put(e.term)
                qs_size[k] = len(e.term)
            else:  # a bare term in a source file: its CRC needs the bytes
                term = self._term(e)
                qs.put(formats.qs_entry_header(term))
                qs.put(term)
                qs_size[k] = len(term)
        qi = OutFile(self.path / file_name("qi", number), self.sources, self.dry)
        qi.put(
            formats.qi_segment(
                number, self.entry_count, slots, np.ones(n, np.uint8), loc, ids, qs_off, qs_size, size, expiry
            )
        )
        self._done(qi, qs)
        self.stats.messages += n

    def _v1_segment(self, number: int, entries: list[Entry]) -> None:
        out = OutFile(self.path / file_name("idx", number), self.sources, self.dry)
        for e in entries:
            rel = e.seq_id - number * self.entry_count
            if e.shared:
                out.put(formats.v1_publish_head(rel, True, e.msg_id, e.expiry, e.size))
            elif e.term is not None:
                out.put(formats.v1_publish_head(rel, True, e.msg_id, e.expiry, e.size, len(e.term)))
                out.put(e.term)
            else:
                path, off, length = e.src
                out.put(formats.v1_publish_head(rel, True, e.msg_id, e.expiry, e.size, length))
                out.copy(path, off, length)
            if e.delivered:
                out.put(formats.v1_deliver(rel))
        self._done(out)
        self.stats.messages += len(entries)

    def close(self) -> None:
        self._flush()


#: the CQv1 segment size when a vhost has no .config (QI1 ?SEGMENT_ENTRY_COUNT)
V1_DEFAULT_ENTRY_COUNT = c_idx.LEGACY_SEGMENT_ENTRY_COUNT
