#!/usr/bin/env python3
"""compact: throughput on the benchmark store as a ratio to copying the same dir, and the space
it reclaims on a store with garbage (RabbitMQ 4.3.6).

    python bench/bench_compact.py            # needs root and the 4.3.6 chroot; builds stores on first use

1. The >= 1 GB benchmark store (kill -9, no garbage): wall-clock of ``cp -r`` of the node dir
   next to ``cqforensics compact`` (a command: start-up, staging, writing, fsync, verify of
   the output, rename), best of 3 each, the same page cache for both.
2. A store with garbage: a copy of the 10x smaller store booted by the real broker; a consumer
   takes every message of bench.big, acks every third, and the rest go back to the queue when
   it disconnects; then a clean stop. A third of each store file is then dead, under the half
   the broker needs before it compacts a file itself, so the garbage stays. ``compact`` on it
   reports the bytes before and after. (The 10x smaller store because the broker's channel
   looks up each out-of-order ack by walking its unacked list: quadratic in what is held.)
"""

from __future__ import annotations

import json
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

WORK = Path("/var/tmp")


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def timed(argv: list[str], ok=(0,)) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if p.returncode not in ok:
        raise SystemExit(f"{argv[:4]}: exit {p.returncode}: {p.stderr[-2000:]}")
    return dt, p.stdout


def copy_vs_compact(src: Path, runs: int = 3) -> dict:
    copies, compacts, doc = [], [], None
    for _ in range(runs):
        work = Path(tempfile.mkdtemp(prefix="cqf-bench-", dir=WORK))
        try:
            copies.append(timed(["cp", "-r", str(src), str(work / "copy")])[0])
            shutil.rmtree(work / "copy")
            dt, out = timed(
                [sys.executable, "-m", "cqforensics", "compact", "--json", "-q", str(src), str(work / "out")]
            )
            compacts.append(dt)
            doc = json.loads(out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return {
        "bytes": tree_bytes(src),
        "copy_s": min(copies),
        "compact_s": min(compacts),
        "all_copy_s": copies,
        "all_compact_s": compacts,
        "bytes_before": doc["bytes_before"],
        "bytes_after": doc["bytes_after"],
        "messages": doc["totals"]["written"],
        "verified": doc["verified"],
    }


def build_garbage(scale: float = 0.1) -> Path:
    """A copy of the benchmark store after a consumer acked every third message of bench.big."""
    from brokers import Broker
    from brokers.clients import pika_module

    out = Path(f"{store_dir(scale)}-garbage")
    if (out / "DONE").exists():
        return out / "run" / "mnesia" / "rabbit@localhost"
    build(scale)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    out.chmod(0o755)
    shutil.copytree(store_dir(scale) / "run", out / "run", symlinks=True)
    pika = pika_module()
    with Broker("4.3.6", out / "run") as b:
        b.start(timeout=900)
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        total = ch.queue_declare("bench.big", durable=True, passive=True).method.message_count
        ch.basic_qos(prefetch_count=0)
        acked = seen = 0
        for method, _, _ in ch.consume("bench.big", auto_ack=False, inactivity_timeout=30):
            if method is None:
                break
            seen += 1
            if seen % 3 == 1:
                ch.basic_ack(method.delivery_tag)
                acked += 1
            if seen == total:
                break
        conn.close()  # the unacked two thirds go back to the queue, in order
        time.sleep(2)
        b.stop()
    (out / "DONE").write_text(f"bench.big: {acked} of {seen} messages acked\n")
    return out / "run" / "mnesia" / "rabbit@localhost"


def main() -> None:
    build(1.0)
    node = node_dir(1.0)
    for kind, src in (("killed", node), ("cleanly stopped twin", build_clean(store_dir(1.0)))):
        got = copy_vs_compact(src.parent)
        if kind == "killed":
            big = got
        gb = got["bytes"] / 1e9
        print(f"store ({kind}): {gb:.2f} GB, {got['messages']} messages, no garbage")
        print(f"cp -r:                 {got['copy_s']:6.2f} s  ({gb / got['copy_s']:.2f} GB/s)")
        print(f"cqforensics compact:   {got['compact_s']:6.2f} s  ({gb / got['compact_s']:.2f} GB/s, output verified)")
        print(
            f"compact takes {got['compact_s'] / got['copy_s']:.2f}x the time of a copy "
            f"(throughput {got['copy_s'] / got['compact_s']:.2f} of copy)",
            flush=True,
        )
    gnode = build_garbage(0.1)
    fsck_doc = json.loads(timed([sys.executable, "-m", "cqforensics", "audit", "--json", str(gnode)], ok=(0, 4))[1])
    garbage = copy_vs_compact(gnode.parent)
    results = {
        "store": big,
        "garbage_store": garbage,
        "audit_reclaimable_bytes": fsck_doc.get("compaction", {}).get("reclaimable_bytes"),
        "compact_time_vs_copy": big["compact_s"] / big["copy_s"],
    }
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "compact.json").write_text(json.dumps(results, indent=1))
    before, after = garbage["bytes_before"], garbage["bytes_after"]
    print(
        f"store with garbage (10x smaller store, a third of bench.big acked): {before / 1e6:.1f} MB of stores -> "
        f"{after / 1e6:.1f} MB after compact: {(before - after) / 1e6:.1f} MB reclaimed "
        f"({100 * (before - after) / before:.0f}%), {garbage['compact_s']:.2f} s; audit predicted "
        f"{(results['audit_reclaimable_bytes'] or 0) / 1e6:.1f} MB of store garbage"
    )


if __name__ == "__main__":
    main()
