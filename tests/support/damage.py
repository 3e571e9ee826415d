"""Damage applied to *copies* of the samples (sample_data is never modified).

Each helper changes one file in place and returns a short description; the crafted damage is
the only hand-made part, the bytes around it are the broker's."""

from __future__ import annotations

import os
import random
from pathlib import Path


def truncate(path: Path, at: int) -> str:
    os.truncate(path, at)
    return f"truncated {path.name} at {at}"


def zero(path: Path, start: int, length: int) -> str:
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(bytes(length))
    return f"zeroed {path.name}[{start}:{start + length}]"


def flip(path: Path, pos: int, mask: int = 0xFF) -> str:
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([b ^ mask]))
    return f"flipped {path.name}[{pos}]"


def junk(path: Path, start: int, length: int, seed: int = 1) -> str:
    rnd = random.Random(seed)
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(bytes(rnd.randrange(256) for _ in range(length)))
    return f"junk in {path.name}[{start}:{start + length}]"


def remove(path: Path) -> str:
    path.unlink()
    return f"removed {path.name}"


def empty(path: Path) -> str:
    path.write_bytes(b"")
    return f"emptied {path.name}"


def apply(kind: str, path: Path, rnd: random.Random) -> str:
    """One damage of ``kind`` at a random place of ``path``."""
    size = path.stat().st_size
    if kind == "remove":
        return remove(path)
    if kind == "empty" or size == 0:
        return empty(path)
    if kind == "truncate":
        return truncate(path, rnd.randrange(size))
    start = rnd.randrange(size)
    length = min(size - start, rnd.randrange(1, 4096))
    if kind == "zero":
        return zero(path, start, length)
    if kind == "flip":
        return flip(path, start, 1 << rnd.randrange(8))
    if kind == "junk":
        return junk(path, start, length, rnd.randrange(1 << 30))
    raise ValueError(kind)


KINDS = ("truncate", "zero", "flip", "junk", "remove", "empty")


def middle_third_of_biggest_rdq(node: Path, kind: str) -> Path:
    """The biggest persistent ``.rdq`` of ``node`` with its middle third ``zeroed``, made
    ``garbage`` (a fixed byte pattern) or ``truncated`` away (with all after it); returns it."""
    rdq = max(node.rglob("msg_store_persistent/*.rdq"), key=lambda p: p.stat().st_size)
    data = bytearray(rdq.read_bytes())
    lo, hi = len(data) // 3, 2 * len(data) // 3
    if kind == "zeroed":
        data[lo:hi] = bytes(hi - lo)
    elif kind == "garbage":
        data[lo:hi] = bytes((i * 37 + 11) % 256 for i in range(hi - lo))
    else:
        del data[lo:]
    rdq.write_bytes(bytes(data))
    return rdq
