"""Provenance: what produced a report, an export or a lost+found, from what. Recorded in
``fsck --json`` (``provenance``), every export (Parquet key-value metadata
``cqforensics.provenance``; beside a JSONL export, ``messages.jsonl.provenance.json``) and
``lost+found/provenance.json``; its JSON Schema is ``cqforensics/schemas/provenance.json``.

``tool``/``version``: cqforensics and its version; ``core``: the compiled core's status (on, off,
or why not built); ``command``; ``broker_version``: the version whose next boot was predicted
or written for; ``as_of``: the time TTLs were judged at (ISO 8601, UTC); ``created``: when;
``inputs``: every regular file under the input paths (symlinks not followed), sorted by path,
with its size and SHA-256 (null when it cannot be read).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from cqforensics import core
from cqforensics.errors import display

METADATA_KEY = b"cqforensics.provenance"
_CHUNK = 1 << 20


def now_ms() -> int:
    return int(time.time() * 1000)


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _sha256(path: str) -> str | None:
    h = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        while True:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                return h.hexdigest()
            h.update(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)


def inputs_manifest(paths) -> list[dict]:
    """``{path, size, sha256}`` of every regular file under ``paths`` (a file path is itself)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files = set()
    for p in paths:
        p = os.path.abspath(p)
        if os.path.isfile(p) and not os.path.islink(p):
            files.add(p)
            continue
        for dirpath, _, names in os.walk(p):
            for n in names:
                f = os.path.join(dirpath, n)
                try:
                    st = os.lstat(f)
                except OSError:
                    continue
                if os.path.stat.S_ISREG(st.st_mode):
                    files.add(f)
    out = []
    for f in sorted(files):
        try:
            size = os.lstat(f).st_size
        except OSError:
            continue
        out.append({"path": display(f), "size": size, "sha256": _sha256(f)})
    return out


def record(command: str, paths, broker_version: str | None, as_of_ms: int | None) -> dict:
    # the package's version: its __init__ is always loaded before any submodule (importing the
    # package root here would be an upward import, through cqforensics.api)
    version = sys.modules["cqforensics"].__version__
    return {"tool": "cqforensics", "version": version, "core": core.status(), "command": command,
            "created": iso(now_ms()), "broker_version": broker_version or None, "as_of": iso(as_of_ms),
            "inputs": inputs_manifest(paths)}


def to_json(p: dict) -> str:
    return json.dumps(p, ensure_ascii=False, sort_keys=True, indent=1) + "\n"
