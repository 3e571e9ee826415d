#!/usr/bin/env python3
"""Build a benchmark store with a real RabbitMQ 4.3.6 broker (cached outside git).

    python bench/make_store.py                 # 200k x 5 KB + 200k x 200 B  (~1.1 GB)
    python bench/make_store.py --scale 0.1     # the 10x smaller store

The broker is killed (-9) once every message is on disk, as a crashed node would leave it.
The store lands in ``$CQF_BENCH_CACHE/store-<scale>/`` (default /var/cache/cqforensics/bench);
an existing store is reused.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
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


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args()
    path = build(args.scale)
    total = sum(p.stat().st_size for p in node_dir(args.scale).rglob("*") if p.is_file())
    print(f"{node_dir(args.scale)}: {total / 1e9:.2f} GB")
