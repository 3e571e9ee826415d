"""Never in place, never half done: writers build their output in a staging dir beside the
destination and rename it into place only once it is complete and verified.

The staging dir is ``.<DST name>.cqf-partial-<pid>`` in DST's parent, so the final rename is
atomic (same filesystem) and a kill at any moment leaves either no DST (or the empty dir it
was) or the complete one, never something that looks complete. Partial dirs left by killed
runs are removed by the next run for the same DST.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from cqforensics.errors import OperationalError, UsageError

PARTIAL = ".cqf-partial-"


def _inside(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def check_destination(dst: Path, inputs: list[Path]) -> Path:
    """DST must not exist (or be an empty dir) and must not overlap an input."""
    dst = Path(dst).absolute()
    for p in inputs:
        p = Path(p).absolute()
        if _inside(dst, p) or _inside(p, dst):
            raise UsageError(f"{dst}: the output may not be inside an input or contain one ({p})")
    if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
        raise UsageError(f"{dst}: exists and is not a directory")
    if dst.is_dir() and any(dst.iterdir()):
        raise UsageError(f"{dst}: exists and is not empty (writers never write into existing data)")
    return dst


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_partials(dst: Path) -> list[Path]:
    """Staging dirs of earlier runs for ``dst`` whose process is gone."""
    out = []
    prefix = f".{dst.name}{PARTIAL}"
    if dst.parent.is_dir():
        for p in dst.parent.iterdir():
            if p.name.startswith(prefix) and p.is_dir():
                pid = p.name[len(prefix):]
                if pid.isdigit() and not _alive(int(pid)):
                    out.append(p)
    return out


def fsync_tree(root: Path) -> None:
    """Make the dir entries durable (files are fsynced as they are closed)."""
    for dirpath, _, _ in os.walk(root, topdown=False):
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Staging:
    """``with Staging(dst, inputs) as st: write under st.path; st.commit()``. Leaving the block
    without ``commit`` (an error) removes the staging dir; a kill leaves it, named partial."""

    def __init__(self, dst: Path, inputs: list[Path], dry_run: bool = False):
        self.dst = check_destination(dst, inputs)
        self.dry_run = dry_run
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
        fsync_tree(self.path)
        try:
            os.rename(self.path, self.dst)  # replaces an empty dir atomically
        except OSError as e:
            raise OperationalError(f"{self.dst}: cannot rename the finished output into place: {e.strerror}") from e
        fd = os.open(self.dst.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.committed = True

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed and not self.dry_run:
            shutil.rmtree(self.path, ignore_errors=True)
