"""Damage applied to *copies* of the samples (sample_data is never modified).

Each helper changes one file in place and returns a short description; the crafted damage is
the only hand-made part, the bytes around it are the broker's."""

from __future__ import annotations

import os
import random
import shutil
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


def drop_declaration_outcome(node: Path) -> tuple[bytes, bytes]:
    """Cut out of ``node``'s LATEST.LOG the ``committed`` outcome of the last durable queue
    declaration it logs; returns that queue's (vhost, name)."""
    from cqforensics.readers.terms import read_disk_log

    path = node / "LATEST.LOG"
    data = path.read_bytes()
    log = read_disk_log(path, data)
    assert log.error is None, log.error
    ends = log.offsets[1:] + [len(data)]
    for i in reversed(range(len(log.items))):
        item = log.items[i]
        if not (isinstance(item, tuple) and item[0] == "commit" and isinstance(item[2], tuple)):
            continue  # not a presume-abort commit (those carry a #decision{})
        for op in item[4]:  # disc_copies ops: {{Tab, Key}, Record, Op}
            if op[0][0] == "rabbit_durable_queue" and op[2] == "write":
                tid = item[2][1]
                j = next(
                    j
                    for j in range(i + 1, len(log.items))
                    if isinstance(log.items[j], tuple) and log.items[j][0] == "decision" and log.items[j][1] == tid
                )
                path.write_bytes(data[: log.offsets[j]] + data[ends[j] :])
                resource = op[1][1]
                return resource[1], resource[3]
    raise AssertionError(f"{path}: no durable queue declaration with a logged outcome")


#: the sample fragmented_copy splits, and the vhost dir of its biggest store
FRAGMENTED_DATASET, FRAGMENTED_VHOST = "4.3.6-clean", "628WB79CIFDYO9LJI6DKMI09L"


def fragmented_copy(dest):
    """A copy of the 4.3.6-clean sample whose biggest vhost store is split over two files: 0.rdq
    with about 60% of its bytes orphans (copies of entries under fresh ids, as acked messages
    leave them) and 1.rdq with about 10%. The clean-shutdown files of that store are removed (they
    record the old locations), so the next boot rebuilds its index, as after a kill -9."""
    import cqforensics
    from cqforensics.grammar import rdq as c_rdq
    from cqforensics.readers import rdq as r_rdq
    from support import SAMPLES

    shutil.copytree(SAMPLES / FRAGMENTED_DATASET / "mnesia", dest, symlinks=True)
    store = dest / "rabbit@localhost" / "msg_stores" / "vhosts" / FRAGMENTED_VHOST / "msg_store_persistent"
    data = (store / "0.rdq").read_bytes()
    live = {
        (r["offset"], r["total_size"])
        for r in cqforensics.read_table(
            SAMPLES / FRAGMENTED_DATASET / "mnesia", table="store", columns=["file", "offset", "total_size", "status"]
        ).to_pylist()
        if r["status"] == "live" and r["file"].endswith(f"{FRAGMENTED_VHOST}/msg_store_persistent/0.rdq")
    }
    f = r_rdq.walk(store / "0.rdq", 0)
    entries = [data[o : o + t] for o, t in zip(f.offsets.tolist(), f.totals.tolist()) if (o, t) in live]
    assert len(entries) > 10 and not f.holes  # the sample's own orphans are left out
    half = len(entries) // 2
    fresh = iter(range(1, 1 << 20))

    def orphans(live: int, ratio: float) -> bytes:
        out, k = b"", 0
        while len(out) < live * ratio / (1 - ratio) - 200:
            e = entries[k % len(entries)]
            k += 1
            out += e[:8] + next(fresh).to_bytes(16, "big") + e[8 + c_rdq.MSG_ID_SIZE :]
        return out

    first, second = b"".join(entries[:half]), b"".join(entries[half:])
    (store / "0.rdq").write_bytes(first + orphans(len(first), 0.6))
    (store / "1.rdq").write_bytes(orphans(len(second), 0.1) + second)
    for name in ("clean.dot", "file_summary.ets", "msg_store_index.ets"):
        (store / name).unlink(missing_ok=True)
    return store
