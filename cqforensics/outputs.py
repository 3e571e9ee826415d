"""The one rule for every output path of every command, and the Spark writer: evidence is never
written to, and nothing existing is overwritten unless asked (``--force``).

Below the commands and the writers (``export``, ``write.output``, the CLI all call it); it
imports nothing but the error types.
"""

from __future__ import annotations

import os
from pathlib import Path

from cqforensics.errors import UsageError


def _inside(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def _real(p) -> Path:
    """``p`` absolute with its symlinks resolved (as far as it exists): a link into an input is
    inside that input."""
    return Path(os.path.realpath(Path(p).absolute()))


def check_output(out, inputs, *, directory: bool = False, force: bool = False) -> Path:
    """The one rule for every output path of every command (``read --out``, ``export --out``,
    compact/rebuild DST, the Spark writer's path): returns it absolute, or raises UsageError.

    * never inside an input, nor containing one (symlinks resolved on both sides): evidence is
      never written to;
    * a file output may not exist, a dir output may not exist or be an empty dir, unless
      ``force`` (the CLI's ``--force``): the file is overwritten, the dir's content replaced;
    * a dir where a file is wanted, or the reverse, is refused even with ``force``."""
    out = Path(out).absolute()
    real = _real(out)
    for p in [inputs] if isinstance(inputs, (str, os.PathLike)) else inputs:
        rp = _real(p)
        if _inside(real, rp) or (directory and _inside(rp, real)):
            raise UsageError(f"{out}: the output may not be inside an input" +
                             (" or contain one" if directory else "") + f" ({Path(p).absolute()})")
    if directory:
        if out.is_symlink() or (out.exists() and not out.is_dir()):
            raise UsageError(f"{out}: exists and is not a directory")
        if not force and out.is_dir() and any(out.iterdir()):
            raise UsageError(f"{out}: exists and is not empty (writers never write into existing data; "
                             "--force replaces it)")
    elif out.is_dir():
        raise UsageError(f"{out}: is a directory (the output is a file)")
    elif not force and (out.exists() or out.is_symlink()):
        raise UsageError(f"{out}: exists (not overwritten without --force)")
    return out


__all__ = ["check_output"]
