"""Never in place, never half done: every writer (compact, rebuild, the Spark writer) builds
its output in a staging dir beside the destination and moves it into place only once it is
complete and verified. The staging and commit (``Staging``) and the rule every output follows
(what a writer may replace: only a previous output of cqforensics, at commit) live in
``cqforensics.output.guard``, shared with export and the file outputs; here: carrying a node dir's
metadata over (``copy_tree``).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from cqforensics.base.errors import OperationalError, display
from cqforensics.output.guard import Staging, sync_tree
from cqforensics.readers import files as r_files


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


__all__ = ["Staging", "copy_file", "copy_tree", "sync_tree"]
