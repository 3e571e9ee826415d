"""Never in place, never half done: every writer (compact, rebuild, the Spark writer) builds
its output in a staging dir beside the destination and moves it into place only once it is
complete and verified. The staging and commit (``Staging``) and the rule every output follows
(what a writer may replace: only a previous output of cqforensics, at commit) live in
``cqforensics.outputs``, shared with export and the file outputs; here: carrying a node dir's
metadata over (``copy_tree``).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from cqforensics.errors import OperationalError, display
from cqforensics.outputs import Staging, fsync_tree


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
                    shutil.copy2(p, target / name)
            except OSError as e:
                raise OperationalError(f"{display(p)}: cannot copy: {e.strerror or e}") from e
        shutil.copystat(here, target)


__all__ = ["Staging", "copy_tree", "fsync_tree"]
