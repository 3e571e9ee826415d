"""Finding things in a node dir the tests damage or inspect: vhost dirs, a queue's dir, the
items of an ets dump."""

from __future__ import annotations

from pathlib import Path


def vhost_dirs(node: Path) -> list[Path]:
    return sorted(p for p in (node / "msg_stores" / "vhosts").iterdir() if p.is_dir())


def root_vhost(node: Path) -> Path:
    for v in vhost_dirs(node):
        if (v / ".vhost").exists() and (v / ".vhost").read_bytes() == b"/":
            return v
    raise AssertionError("no vhost / dir")


def queue_dir(node: Path, name: bytes) -> Path:
    for q in (root_vhost(node) / "queues").iterdir():
        qn = q / ".queue_name"
        if qn.exists() and b"QUEUE: " + name + b"\n" in qn.read_bytes() + b"\n":
            return q
    raise AssertionError(f"no dir for queue {name!r}")


def ets_items(ets: Path) -> list[tuple[int, object]]:
    """(offset, term) of each item of an intact ``ets:tab2file`` dump."""
    from cqforensics.codecs import etf

    data, out, o = ets.read_bytes(), [], 8
    while o + 8 <= len(data):
        size = int.from_bytes(data[o : o + 4], "big")
        start = o + 8 + (16 if size >= 65528 else 0)
        out.append((o, etf.decode(data[start : start + size])[0]))
        o = start + size
    return out
