"""Reading input files: whole-file reads and memory maps, with one-line operational errors."""

from __future__ import annotations

import mmap
from pathlib import Path

from cqforensics.errors import OperationalError


def read_bytes(path: Path | str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise OperationalError(f"{path}: cannot read: {e.strerror}") from e


def read_head(path: Path | str, n: int) -> bytes:
    """The first ``n`` bytes of ``path`` (fewer when it is shorter)."""
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError as e:
        raise OperationalError(f"{path}: cannot read: {e.strerror}") from e


def map_file(path: Path | str):
    """A read-only memory map of ``path`` (``b""`` for an empty file)."""
    try:
        with open(path, "rb") as f:
            try:
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # empty file
                return b""
    except OSError as e:
        raise OperationalError(f"{path}: cannot read: {e.strerror}") from e


def file_size(path: Path | str) -> int:
    try:
        return Path(path).stat().st_size
    except OSError as e:
        raise OperationalError(f"{path}: cannot stat: {e.strerror}") from e
