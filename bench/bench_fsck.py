#!/usr/bin/env python3
"""fsck vs the real broker's own dirty-restart recovery of the same dir (RabbitMQ 4.3.6).

    python bench/bench_fsck.py        # needs root and the 4.3.6 chroot; builds the store on first use

The store is the kill -9'd benchmark store, so a boot is a dirty recovery (the shared store is
scanned, every index segment walked), and then its cleanly stopped twin (the same messages;
make_store.build_clean), whose boot trusts the clean-shutdown files. Broker: wall-clock from launching rabbitmq-server on a
fresh copy to its AMQP listener answering (the copy is not timed), next to the same on an empty
node (the boot's fixed cost). fsck: wall-clock of ``cqforensics fsck --json`` as a command.
Best of 3 each.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from make_store import build, build_clean, node_dir, store_dir  # noqa: E402


def fsck_seconds(node: Path) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "cqforensics", "fsck", "--json", str(node)], cwd=ROOT, capture_output=True, text=True
    )
    dt = time.perf_counter() - t0
    if p.returncode not in (0, 4):
        raise SystemExit(p.stderr[-2000:])
    return dt


def boot_seconds(mnesia_base: Path | None) -> float:
    from brokers import Broker

    work = Path(tempfile.mkdtemp(prefix="cqf-bench-", dir="/var/tmp"))
    work.chmod(0o755)
    try:
        with Broker("4.3.6", work / "run") as b:
            if mnesia_base is not None:
                b.install_node(mnesia_base)
            t0 = time.perf_counter()
            b.start(timeout=900)
            dt = time.perf_counter() - t0
            b.stop()
        return dt
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    build(1.0)
    empty_s = min(boot_seconds(None) for _ in range(2))
    fsck_of = {}
    for kind, node in (
        ("kill -9 (dirty recovery)", node_dir(1.0)),
        ("cleanly stopped twin (clean recovery)", build_clean(store_dir(1.0))),
    ):
        size = sum(p.stat().st_size for p in node.rglob("*") if p.is_file())
        fsck_s = fsck_of[kind] = min(fsck_seconds(node) for _ in range(3))
        broker_s = min(boot_seconds(node.parent) for _ in range(3))
        print(f"store: {size / 1e9:.2f} GB, 400k messages, {kind}")
        print(
            f"RabbitMQ 4.3.6 boot on it:   {broker_s:6.2f} s  (empty node: {empty_s:.2f} s, "
            f"so recovery itself ~{broker_s - empty_s:.2f} s)"
        )
        print(f"cqforensics fsck --json:     {fsck_s:6.2f} s")
        print(
            f"fsck is {broker_s / fsck_s:.1f}x faster than the broker's boot "
            f"({(broker_s - empty_s) / fsck_s:.1f}x its recovery alone)",
            flush=True,
        )
    killed, clean = fsck_of.values()
    print(f"fsck of the cleanly stopped store / of the killed one: {clean / killed:.2f}x (goal <= 1.2)")


if __name__ == "__main__":
    main()
