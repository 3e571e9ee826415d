"""Never in place, never half done: every writer (compact, rebuild, the Spark writer) builds
its output in a staging dir beside the destination (``Staging``) and moves it into place only
once it is complete and verified.

The staging dir is ``.<DST name>.cqf-partial-<pid>`` in DST's parent, so the final rename is
atomic (same filesystem) and a kill at any moment leaves either no DST (or the empty dir it
was) or the complete one, never something that looks complete. Partial dirs left by killed
runs are removed by the next run for the same DST. A writer that replaces an existing DST
(``replace=True``: the Spark writer's overwrite and append) swaps the two trees atomically
(renameat2 RENAME_EXCHANGE), so DST is at every moment the old tree or the new one; the old
one then sits in the staging dir's place until it is removed.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from pathlib import Path

from cqforensics.errors import OperationalError, UsageError, display
from cqforensics.export import PARTIAL, partials, process_gone, signals_held
from cqforensics.outputs import check_output
from cqforensics.readers import files as r_files

log = logging.getLogger(__name__)


def check_destination(dst: Path, inputs: list[Path], replace: bool = False) -> Path:
    """A writer's DST (a dir): ``check_output`` with ``directory=True``; with ``replace`` it may
    be an existing dir (the output replaces it whole)."""
    return check_output(dst, inputs, directory=True, force=replace)


def stale_partials(dst: Path) -> list[Path]:
    """Staging dirs of earlier runs for ``dst`` whose process is gone (the one naming and
    liveness rule of partial outputs, ``cqforensics.export.partials``, as for files)."""
    return [p for p, pid in partials(dst) if pid != os.getpid() and p.is_dir() and not p.is_symlink()
            and process_gone(pid)]


def copy_tree(src: Path, dst: Path, skip: set[Path]) -> None:
    """Copy ``src`` into the existing dir ``dst``, except the dirs in ``skip`` (created empty).
    Writers carry a node dir's metadata over this way and write its message stores anew."""
    for dirpath, dirnames, filenames in os.walk(src):
        here = Path(dirpath)
        target = dst / here.relative_to(src)
        target.mkdir(exist_ok=True)
        keep = []
        for d in dirnames:
            p = here / d
            if p.is_symlink():
                os.symlink(os.readlink(p), target / d)
            elif p in skip:
                (target / d).mkdir()
            else:
                keep.append(d)
        dirnames[:] = keep
        for name in filenames:
            p = here / name
            try:
                if p.is_symlink():
                    os.symlink(os.readlink(p), target / name)
                elif stat.S_ISFIFO(p.lstat().st_mode):  # carried as what it is (opening it would block)
                    os.mkfifo(target / name, stat.S_IMODE(p.lstat().st_mode))
                else:
                    copy_file(p, target / name)
            except OSError as e:
                raise OperationalError(f"{display(p)}: cannot copy: {e.strerror or e}") from e
        shutil.copystat(here, target)


def copy_file(src: Path, dst: Path) -> None:
    """``shutil.copy2``, but a sparse file's holes (SEEK_HOLE) are neither read nor written:
    its data ranges are copied and the copy is extended to its size, holes and all."""
    fd = os.open(src, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        extents = r_files.fd_extents(fd, size)
        if extents is None or extents == [(0, size)] or not size:
            os.close(fd)
            fd = -1
            shutil.copy2(src, dst)
            return
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            for start, end in extents:
                pos = start
                while pos < end:
                    data = memoryview(os.pread(fd, min(end - pos, 1 << 24), pos))
                    if not data:
                        break
                    done = 0
                    while done < len(data):
                        done += os.pwrite(out, data[done:], pos + done)
                    pos += len(data)
            os.ftruncate(out, size)
        finally:
            os.close(out)
        shutil.copystat(src, dst)
    finally:
        if fd >= 0:
            os.close(fd)


def sync_tree(root: Path) -> None:
    """Make everything written under ``root`` durable, files and dir entries: one ``syncfs`` of
    its file system where there is one (Linux), else an fsync of every file and dir. The
    writers do not fsync file by file: a node of 20,000 queue dirs is 40,000 files and dirs,
    each fsync a journal commit of its own."""
    if _syncfs(root):
        return
    for dirpath, _, names in os.walk(root, topdown=False):
        for name in names:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _syncfs(root: Path) -> bool:
    """syncfs(2) of the file system holding ``root``; False where there is none."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        return False
    fd = os.open(root, os.O_RDONLY)
    try:
        if syncfs(fd) == 0:
            return True
        err = ctypes.get_errno()
    finally:
        os.close(fd)
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP
        return False
    raise OperationalError(f"{display(root)}: cannot make the output durable: {os.strerror(err)}")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE); False where that is unsupported."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not on this filesystem or kernel
        return False
    raise OperationalError(f"{b}: cannot swap in the new store: {os.strerror(err)}")


class Staging:
    """``with Staging(dst, inputs) as st: write under st.path; st.commit()``. Leaving the block
    without ``commit`` (an error) removes the staging dir; a kill leaves it, named partial.

    ``replace``: DST may be an existing dir, which ``commit`` swaps out atomically (see the
    module doc) and removes; an input may then be DST itself (it is read, never written)."""

    def __init__(self, dst: Path, inputs: list[Path], dry_run: bool = False, replace: bool = False):
        self.dst = check_destination(dst, inputs, replace)
        self.dry_run = dry_run
        self.replace = replace
        self.path = self.dst.parent / f".{self.dst.name}{PARTIAL}{os.getpid()}"
        self.removed_stale: list[Path] = []
        self.committed = False

    def __enter__(self) -> "Staging":
        if self.dry_run:
            return self
        if not self.dst.parent.is_dir():
            raise UsageError(f"{self.dst.parent}: the output's parent dir does not exist")
        for p in stale_partials(self.dst):
            shutil.rmtree(p, ignore_errors=True)
            log.warning("removed %s, the partial output of an interrupted run", display(p))
            self.removed_stale.append(p)
        if self.path.exists():
            shutil.rmtree(self.path)
        try:
            self.path.mkdir()
        except OSError as e:
            raise OperationalError(f"{self.path}: cannot create: {e.strerror}") from e
        return self

    def commit(self) -> None:
        if self.dry_run:
            return
        sync_tree(self.path)
        dst = self.dst
        with signals_held():  # Ctrl-C now lands after the rename(s), never between them
            if self.replace and dst.is_dir() and any(dst.iterdir()):
                self._swap()
                return
            try:
                os.rename(self.path, dst)  # replaces an empty dir atomically
            except OSError as e:
                raise OperationalError(f"{dst}: cannot rename the finished output into place: {e.strerror}") from e
            self.committed = True
        _fsync_dir(dst.parent)

    def _swap(self) -> None:
        """Make the staging dir the new DST in one step; the old tree takes the staging dir's
        name (so a kill before it is removed leaves it as a stale partial) and is removed."""
        dst = self.dst
        if _exchange(self.path, dst):
            _fsync_dir(dst.parent)
            self.committed = True
            shutil.rmtree(self.path)  # the old DST now
            return
        # no renameat2 here: two renames; between them the old tree waits beside DST
        old = dst.parent / f".{dst.name}.cqf-old-{os.getpid()}"
        os.rename(dst, old)
        os.rename(self.path, dst)
        _fsync_dir(dst.parent)
        self.committed = True
        shutil.rmtree(old)

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed and not self.dry_run:
            with signals_held():  # a second Ctrl-C does not cut the removal short
                shutil.rmtree(self.path, ignore_errors=True)
