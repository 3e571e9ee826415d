"""Reading input files: whole-file reads and memory maps, with one-line operational errors.

Every input file is opened here, and only when it is a regular file (``os.stat`` before the
open, ``O_NONBLOCK`` as a belt, ``fstat`` after it): a FIFO, socket or device named like a
broker file would block ``open()`` or a read forever. Such a file raises ``NotRegularFile``
(a ``FormatError``: the layout turns it into a ``not-regular-file`` finding) and is never read.
``data_extents`` lists the data regions of a sparse file so scanners skip its holes unread."""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path

import numpy as np

from cqforensics.base.errors import FormatError, OperationalError, display

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


class NotRegularFile(FormatError):
    """A path that is not a regular file where one is expected (never opened for reading)."""


def _what(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _oserror(path, e: OSError, verb: str = "read") -> OperationalError:
    return OperationalError(f"{display(path)}: cannot {verb}: {e.strerror or e}")


def file_type(path: Path | str) -> str | None:
    """None for a regular file (symlinks followed), else what it is ("a FIFO", "a dangling or
    looping symlink", ...); raises FileNotFoundError when nothing is there."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.lexists(path):
            return "a dangling symlink"
        raise
    except OSError as e:
        if os.path.islink(path):
            return f"a symlink that cannot be followed ({e.strerror})"
        raise
    return None if stat.S_ISREG(st.st_mode) else _what(st.st_mode)


def is_regular(path: Path | str) -> bool:
    """Whether ``path`` is a regular file (symlinks followed); False when missing or unreadable."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def not_regular(path: Path | str, what: str) -> NotRegularFile:
    return NotRegularFile(f"{what}, not a regular file: never read", os.fsdecode(path), None)


def open_regular(path: Path | str):
    """A binary file object on ``path``, opened only if it is a regular file (NotRegularFile
    otherwise; OSError as is, for the caller to word)."""
    what = file_type(path)
    if what is not None:  # a directory too: in a data dir, one named like a broker file is damage
        raise not_regular(path, what)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between the stat and the open
            raise not_regular(path, _what(st.st_mode))
    except BaseException:
        os.close(fd)
        raise
    # the file object owns fd from here, also when a Ctrl-C interrupts fdopen: closing fd here
    # as well would close it twice, the second time under a file opened since with its number
    return os.fdopen(fd, "rb")


def read_bytes(path: Path | str) -> bytes:
    try:
        with open_regular(path) as f:
            return f.read()
    except OSError as e:
        raise _oserror(path, e) from e


def read_optional(path: Path | str, limit: int | None = None, listed: bool = False) -> bytes | None:
    """The bytes of ``path`` (its first ``limit``), or None when it does not exist. ``listed``:
    a dir listing just showed it as a regular file that is no symlink, so it is opened without
    a stat first (never following a link; its ``fstat`` still checks it)."""
    try:
        if limit is not None:
            return _read_upto(path, limit, listed)
        with open_regular(path) as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _oserror(path, e) from e


#: what a read of a small file asks the kernel for at a time
_SMALL_READ = 1 << 16
#: how ``_read_upto`` opens a file (never blocking on a FIFO), and one a listing just showed
#: as a regular file (no symlink followed either)
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_LISTED_FLAGS = _READ_FLAGS | getattr(os, "O_NOFOLLOW", 0)


def _read_upto(path: Path | str, limit: int, listed: bool = False) -> bytes:
    """The first ``limit`` bytes of a regular file, read a little at a time: a buffered
    ``read(limit)`` allocates ``limit`` bytes up front (an mmap and munmap for each small file
    read with a 1 MiB limit: most of the cost of listing a node of many queue dirs)."""
    flags = _LISTED_FLAGS if listed else _READ_FLAGS
    if not listed:
        what = file_type(path)
        if what is not None:
            raise not_regular(path, what)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between the stat and the open
            raise not_regular(path, _what(st.st_mode))
        parts, got = [], 0
        while got < limit:
            chunk = os.read(fd, min(limit - got, _SMALL_READ))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
            if got >= st.st_size and len(chunk) < _SMALL_READ:  # all its size said: no read for the EOF
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        os.close(fd)


def read_head(path: Path | str, n: int) -> bytes:
    """The first ``n`` bytes of ``path`` (fewer when it is shorter)."""
    try:
        return _read_upto(path, n)
    except OSError as e:
        raise _oserror(path, e) from e


def open_file(path: Path | str):
    """``path`` open for reading (a binary file object), with ``map_file``'s errors."""
    try:
        return open_regular(path)
    except OSError as e:
        raise _oserror(path, e) from e


def map_file(path: Path | str):
    """A read-only memory map of ``path`` (``b""`` for an empty file)."""
    try:
        with open_regular(path) as f:
            try:
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # empty file
                return b""
    except OSError as e:
        raise _oserror(path, e) from e


def reading_whole(data) -> None:
    """``data``, a map, is about to be read all through, in order (a walk): let the pages a
    read brings in from disk be cached in large folios (MADV_HUGEPAGE). Page faults on a plain
    map cache a file 4 KiB page by 4 KiB page, and every later map or read of it (the walk, the
    bodies) then pays per page: with many small files, most of the cost of a read. Pages
    already cached stay as they are; where the kernel cannot, nothing changes but the speed."""
    if isinstance(data, mmap.mmap) and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            data.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # no transparent huge pages for files here
            pass


_FIRST_WINDOW, _MAX_WINDOW = 4096, 16 << 20


def next_nonzero(data, start: int, end: int) -> int:
    """Offset of the first nonzero byte of ``data[start:end]`` (``end`` when none). The search
    runs through numpy views of growing windows (no copy, vectorised) and drops a map's pages
    once passed (``drop_pages``): a long zero run (a file of zeros, or a sparse file whose holes
    the file system does not report) costs neither memory nor a byte-at-a-time scan."""
    o, window = start, _FIRST_WINDOW
    while o < end:
        stop = min(o + window, end)
        view = np.frombuffer(data, np.uint8, stop - o, o)
        if view.any():
            return o + int((view != 0).argmax())
        drop_pages(data, o, stop)
        o, window = stop, min(window * 2, _MAX_WINDOW)
    return end


def find(data, needle: bytes, start: int, stop: int) -> int:
    """``data.find(needle, start, stop)`` that, on a map, searches a window at a time and drops
    the pages it has passed: a search through a huge file keeps this process's memory flat."""
    if not isinstance(data, mmap.mmap) or stop - start <= _MAX_WINDOW:
        return data.find(needle, start, stop)
    o = start
    while o < stop:
        w = min(o + _MAX_WINDOW, stop)
        hit = data.find(needle, o, min(w + len(needle) - 1, stop))
        if hit >= 0:
            return hit
        drop_pages(data, o, w)
        o = w
    return -1


def drop_pages(data, start: int, end: int) -> None:
    """Let the kernel drop the pages of a read-only map that lie wholly in ``[start, end)``: they
    stay in the page cache and fault back in if read again, but leave this process's RSS (a
    scan of a huge file keeps its memory flat)."""
    if not isinstance(data, mmap.mmap):
        return
    a = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    b = end // mmap.PAGESIZE * mmap.PAGESIZE
    if b > a:
        data.madvise(mmap.MADV_DONTNEED, a, b - a)


def file_size(path: Path | str) -> int:
    try:
        return Path(path).stat().st_size
    except OSError as e:
        raise _oserror(path, e, "stat") from e


def data_extents(path: Path | str, size: int | None = None) -> list[tuple[int, int]] | None:
    """The ``[start, end)`` ranges of ``path`` that hold data (everything outside them reads as
    zeros), found with SEEK_DATA/SEEK_HOLE without reading; None when the file system cannot
    tell (then every byte must be treated as data)."""
    if not hasattr(os, "SEEK_DATA"):
        return None
    try:
        with open_regular(path) as f:
            fd = f.fileno()
            return fd_extents(fd, os.fstat(fd).st_size if size is None else size)
    except (OSError, FormatError):
        return None


def fd_extents(fd: int, size: int) -> list[tuple[int, int]] | None:
    """``data_extents`` of an open file's first ``size`` bytes (one lseek for a file without
    holes); None when the file system cannot tell."""
    if not hasattr(os, "SEEK_DATA"):
        return None
    if not size:
        return []
    try:
        if os.lseek(fd, 0, os.SEEK_HOLE) >= size:  # the usual file: data all through
            return [(0, size)]
        out = []
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as e:
                if e.errno == 6:  # ENXIO: no data past pos
                    break
                return None
            if start >= size:
                break
            stop = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            out.append((start, stop))
            pos = stop
        return out
    except OSError:
        return None
