#!/usr/bin/env python3
"""Build a benchmark store with a real RabbitMQ 4.3.6 broker (cached outside git).

    python bench/make_store.py                 # 200k x 5 KB + 200k x 200 B  (~1.1 GB)
    python bench/make_store.py --scale 0.1     # the 10x smaller store
    python bench/make_store.py --compacted     # a store the broker has compacted (holed files)

The broker is killed (-9) once every message is on disk, as a crashed node would leave it.
The store lands in ``$CQF_BENCH_CACHE/store-<scale>/`` (default /var/cache/cqforensics/bench);
an existing store is reused.

The compacted store (``store-compacted/``): 4 publishers each send 60k persistent messages of
4.2-8 KB (uniformly drawn, seeded; all above the 4 KB embedding threshold, so every body is in
the shared store; the bench store's message shape: a distinct message_id and ``seq`` header
on each), round-robin to ``compact.keep.<p>``, ``compact.drain.<p>`` and ``compact.drain2.<p>``,
so the shared store's 16 MiB files hold all three interleaved. Both drain queues are consumed
(acked in order: the broker's out-of-order ack lookup is quadratic), leaving a third of every
file live. The 4.x broker compacts a file once less than half of it is live (checked 15 s after
removes, on a timer that a later remove re-arms: a poke consumes one kept message): it zeroes
the holes, then moves the file's last messages into the first holes they fit and truncates.
With varied sizes most holes keep a zero-filled remainder, a few hundred per file (with 1 in
8 kept, as first tried, the moves leave only ~40 per file). Once the reader sees the holes
(``holes`` table, kind ``zeroed``) and their number has settled, the broker is killed (-9).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CACHE = Path(os.environ.get("CQF_BENCH_CACHE", "/var/cache/cqforensics/bench"))
BIG, SMALL = 5000, 200


def store_dir(scale: float) -> Path:
    return CACHE / f"store-{scale:g}"


def _publish(url: str, queue: str, size: int, count: int, seed: int) -> None:
    from cqforensics.broker.clients import pika_module

    pika = pika_module()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    props = pika.BasicProperties(delivery_mode=2, content_type="application/json",
                                 headers={"tenant": "acme", "seq": 0})
    text = (b'{"event":"order.created","payload":"' + b"abcdefghij" * (size // 10 + 1))[:size - 2] + b'"}'
    for i in range(count):
        props.headers["seq"] = seed + i
        props.message_id = f"{queue}-{seed + i}"
        ch.basic_publish("", queue, text, props)
    ch.confirm_delivery()  # a final confirmed publish: everything before it is on disk too
    ch.basic_publish("", queue, text, props)
    conn.close()


def build(scale: float, version: str = "4.3.6") -> Path:
    from cqforensics.broker import Broker
    from cqforensics.broker.clients import pika_module

    out = store_dir(scale)
    if (out / "DONE").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    out.chmod(0o755)
    n = int(200_000 * scale)
    pika = pika_module()
    t0 = time.monotonic()
    with Broker(version, out / "run") as b:
        b.start()
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        for q in ("bench.big", "bench.small"):
            ch.queue_declare(q, durable=True)
        conn.close()
        b.wait_durable("bench.big", "bench.small")  # a kill -9 must not lose the declarations
        jobs = [mp.Process(target=_publish, args=(b.url, q, size, n // 2, k * n // 2))
                for q, size in (("bench.big", BIG), ("bench.small", SMALL)) for k in range(2)]
        for j in jobs:
            j.start()
        for j in jobs:
            j.join()
            if j.exitcode:
                raise SystemExit(f"publisher failed ({j.exitcode})")
        time.sleep(2)
        b.kill()
    (out / "DONE").write_text(f"{n} + {n} messages (+2 confirm markers), {time.monotonic() - t0:.0f}s\n")
    return out


def node_dir(scale: float) -> Path:
    return store_dir(scale) / "run" / "mnesia" / "rabbit@localhost"


# -- the compacted store ------------------------------------------------------------------

COMPACTED_PUBLISHERS, COMPACTED_PER_PUBLISHER, COMPACTED_SIZES = 4, 60_000, (4200, 8000)
COMPACTED_QUEUES = ("keep", "drain", "drain2")


def compacted_dir() -> Path:
    return CACHE / "store-compacted"


def compacted_node_dir() -> Path:
    return compacted_dir() / "run" / "mnesia" / "rabbit@localhost"


def _publish_interleaved(url: str, p: int, count: int) -> None:
    import random

    from cqforensics.broker.clients import pika_module

    pika = pika_module()
    rng = random.Random(p)
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    props = pika.BasicProperties(delivery_mode=2, content_type="application/json",
                                 headers={"tenant": "acme", "seq": 0})
    lo, hi = COMPACTED_SIZES
    text = (b'{"event":"order.created","payload":"' + b"abcdefghij" * (hi // 10 + 1))
    queues = [f"compact.{q}.{p}" for q in COMPACTED_QUEUES]
    for i in range(count):
        props.headers["seq"] = i
        props.message_id = f"c{p}-{i}"
        size = rng.randint(lo, hi)
        ch.basic_publish("", queues[i % len(queues)], text[:size - 2] + b'"}', props)
    ch.confirm_delivery()
    ch.basic_publish("", queues[1], text[:lo], props)  # confirmed marker (drained with the rest)
    conn.close()


def _drain(url: str, queue: str, limit: int | None = None) -> None:
    from cqforensics.broker.clients import pika_module

    pika = pika_module()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    left = ch.queue_declare(queue, durable=True, passive=True).method.message_count
    left = min(left, limit) if limit is not None else left
    ch.basic_qos(prefetch_count=2000)
    n = 0
    for method, _, _ in ch.consume(queue, auto_ack=False, inactivity_timeout=60):
        if method is None:
            raise SystemExit(f"{queue}: {left - n} messages never came")
        n += 1
        if n % 500 == 0 or n == left:
            ch.basic_ack(method.delivery_tag, multiple=True)  # in order: cheap for the channel
        if n == left:
            break
    ch.cancel()
    conn.close()


def store_holes(node: Path) -> tuple[int, int, int]:
    """(zero-filled holes in the persistent shared store, .rdq files holding one, .rdq files) as the
    reader sees them (the ``holes`` table's other kinds: dead entries still in place, garbage)."""
    import cqforensics

    h = cqforensics.read_table(node, "holes", columns=["store", "file", "kind"]).to_pylist()
    rdq = [r for r in h if r["store"] == "persistent" and r["kind"] == "zeroed"]
    files = {r["file"] for r in rdq}
    n_files = sum(1 for _ in node.glob("msg_stores/vhosts/*/msg_store_persistent/*.rdq"))
    return len(rdq), len(files), n_files


def build_compacted(version: str = "4.3.6", wait: float = 600.0) -> Path:
    """A store the real broker has compacted, then kill -9 (see the module doc)."""
    from cqforensics.broker import Broker
    from cqforensics.broker.clients import pika_module

    out = compacted_dir()
    if (out / "DONE").exists():
        return compacted_node_dir()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    out.chmod(0o755)
    pika = pika_module()
    t0 = time.monotonic()
    P, n = COMPACTED_PUBLISHERS, COMPACTED_PER_PUBLISHER
    with Broker(version, out / "run") as b:
        b.start()
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        for p in range(P):
            for q in COMPACTED_QUEUES:
                ch.queue_declare(f"compact.{q}.{p}", durable=True)
        conn.close()
        drains = [(b.url, f"compact.{q}.{p}") for q in COMPACTED_QUEUES[1:] for p in range(P)]
        for target, args in ((_publish_interleaved, [(b.url, p, n) for p in range(P)]), (_drain, drains)):
            jobs = [mp.Process(target=target, args=a) for a in args]
            for j in jobs:
                j.start()
            for j in jobs:
                j.join()
                if j.exitcode:
                    raise SystemExit(f"{target.__name__} failed ({j.exitcode})")
            print(f"{target.__name__}: done at {time.monotonic() - t0:.0f}s", flush=True)
        # the broker checks the files that had removes 15 s after the first remove, skipping
        # those with removes since; the rest wait for a later remove to re-arm the timer: one
        # kept message consumed (and acked) now and then, after the drains have settled
        deadline, last, poked = time.monotonic() + wait, None, 0
        while True:
            time.sleep(16)
            if poked < 3:
                _drain(b.url, "compact.keep.0", limit=1)
                poked += 1
                continue
            holes, holed, files = store_holes(b.node_dir)
            print(f"  {time.monotonic() - t0:.0f}s: {holes} holes in {holed} of {files} .rdq files", flush=True)
            if holed >= files - 1 and (holes, holed) == last:
                break
            if time.monotonic() > deadline:
                raise SystemExit("the broker did not compact the store in time")
            last = (holes, holed)
        b.kill()
    holes, holed, files = store_holes(compacted_node_dir())
    lo, hi = COMPACTED_SIZES
    (out / "DONE").write_text(f"{P} x {n} messages of {lo}-{hi} B published, 1 in {len(COMPACTED_QUEUES)} kept; "
                              f"{holes} holes in {holed} of {files} .rdq files; {time.monotonic() - t0:.0f}s\n")
    return compacted_node_dir()


if __name__ == "__main__":
    # a TERM runs the Broker context's cleanup (kill, epmd, bind mount) like an interrupt
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--compacted", action="store_true", help="the store a broker has compacted")
    args = ap.parse_args()
    node = build_compacted() if args.compacted else (build(args.scale), node_dir(args.scale))[1]
    total = sum(p.stat().st_size for p in node.rglob("*") if p.is_file())
    print(f"{node}: {total / 1e9:.2f} GB")
    if args.compacted:
        print((compacted_dir() / "DONE").read_text(), end="")
