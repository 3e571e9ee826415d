"""Things made once per test session and shared by every case (and every xdist worker) that
starts from them: a node dir a real broker wrote, kept in the session's temp dir, which the
workers share, made under a file lock by the first worker that needs it."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path


def session_dir(tmp_path_factory) -> Path:
    """The temp dir of the whole session (with xdist, above each worker's own)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(tmp_path_factory, name: str, make) -> Path:
    """``session_dir/name``, made by ``make(part)`` (which writes the directory ``part``) the
    first time any worker asks for it; a later caller (any worker) waits for the lock and gets
    the same directory. Callers only read it (copy it, or use it as a template)."""
    shared = session_dir(tmp_path_factory)
    made, part = shared / name, shared / f"{name}.part"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not made.exists():
            shutil.rmtree(part, ignore_errors=True)  # left by a worker that failed
            make(part)
            part.rename(made)
    return made
