#!/usr/bin/env python3
"""Stream (osiris) read speed and memory, on streams a real RabbitMQ 4.3.6 broker wrote.

    python bench/bench_streams.py                  # build (cached) and measure 0.1x and 1x
    python bench/bench_streams.py --sizes 0.1      # one size
    python bench/bench_streams.py --build-only     # just the node dirs

FIGURES

The node dir (built once, cached outside git under ``$CQF_BENCH_CACHE/streams-<scale>/``,
default /var/cache/cqforensics/bench) holds two streams, at 1x:

* ``bench.sp``: 1,000,000 records of about 1 KB over the stream protocol (``rstream``, publisher
  ``bench-pub``: every chunk carries its sequence in a trailer): half as simple entries (sent
  ``BATCH`` at a time), half in sub-batches of ``SUB_BATCH`` records, their compression cycling
  through none, gzip, snappy, lz4 and zstd;
* ``bench.amqp``: 200,000 messages of about 1 KB over AMQP 0-9-1 (properties and headers on
  each, as ``make_store.py``'s messages; many small chunks);

and 0.1x a tenth of each. The broker is stopped cleanly once every publish is confirmed; the
build checks the reader finds every record.

Measured, each in a fresh process (peak RSS is the process's), alternating sizes and kinds in one
run, ``--repeat`` times (the median is reported; the machine is shared, so ratios are what count):

* ``raw``: reading the stream's segment files' bytes (1 MiB reads), the floor of any read;
* ``messages``: ``cqforensics.iter_batches(node, "messages", queues=[stream])``, every column
  (bodies, AMQP 1.0 sections decoded, as an AMQP 0-9-1 consumer of 4.3.6 receives them);
* ``fsck``: the node's findings table (every stream read and checked, its next boot predicted).

Reported per stream and size: records/s, the ratio of the read's time to the raw read of the
same bytes, and peak RSS (MB). Results: a markdown table on stdout and
``bench/results/streams.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

CACHE = Path(os.environ.get("CQF_BENCH_CACHE", "/var/cache/cqforensics/bench"))
SP, AMQP = "bench.sp", "bench.amqp"
SP_RECORDS, AMQP_RECORDS, SIZE = 1_000_000, 200_000, 1000
BATCH, SUB_BATCH = 500, 100
COMPRESSIONS = ("No", "Gzip", "Snappy", "Lz4", "Zstd")
PUBLISHER = "bench-pub"


def store_dir(scale: float) -> Path:
    return CACHE / f"streams-{scale:g}"


def node_dir(scale: float) -> Path:
    return store_dir(scale) / "run" / "mnesia" / "rabbit@localhost"


def _body(i: int) -> bytes:
    head = f'{{"event":"order.created","seq":{i},"payload":"'.encode()
    return (head + b"abcdefghij" * (SIZE // 10))[: SIZE - 2] + b'"}'


async def _stream_protocol(broker, n: int) -> None:
    from rstream import AMQPMessage, CompressionType, Producer

    from brokers.streams import _codecs, _stream_client

    _codecs()
    simple = n // 2
    async with _stream_client(broker, Producer) as p:
        i = 0
        while i < simple:
            k = min(BATCH, simple - i)
            await p.send_batch(SP, [AMQPMessage(body=_body(i + j)) for j in range(k)], publisher_name=PUBLISHER)
            i += k
        b = 0
        while i < n:
            k = min(SUB_BATCH, n - i)
            comp = getattr(CompressionType, COMPRESSIONS[b % len(COMPRESSIONS)])
            await p.send_sub_entry(
                SP, [AMQPMessage(body=_body(i + j)) for j in range(k)], compression_type=comp, publisher_name=PUBLISHER
            )
            i, b = i + k, b + 1
            if b % 50 == 0:
                await p._publish_buffered_messages(SP)
        await p._publish_buffered_messages(SP)
        await p.send_wait(SP, AMQPMessage(body=_body(n)), publisher_name=PUBLISHER)  # confirmed: the rest is too


def _amqp091(url: str, n: int) -> None:
    from brokers.clients import pika_module

    pika = pika_module()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    props = pika.BasicProperties(delivery_mode=2, content_type="application/json", headers={"tenant": "acme", "seq": 0})
    for i in range(n):
        props.headers["seq"] = i
        props.message_id = f"{AMQP}-{i}"
        ch.basic_publish("", AMQP, _body(i), props)
    ch.confirm_delivery()
    ch.basic_publish("", AMQP, _body(n), props)  # confirmed: everything before it is on disk too
    conn.close()


def build(scale: float, version: str = "4.3.6") -> Path:
    from brokers import Broker
    from brokers.clients import pika_module

    out = store_dir(scale)
    if (out / "DONE").exists():
        return node_dir(scale)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    out.chmod(0o755)
    n_sp, n_amqp = int(SP_RECORDS * scale), int(AMQP_RECORDS * scale)
    pika = pika_module()
    t0 = time.monotonic()
    with Broker(version, out / "run", plugins=["rabbitmq_stream"]) as b:
        b.start()
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        for q in (SP, AMQP):
            ch.queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
        conn.close()
        b.wait_durable(SP, AMQP)
        _amqp091(b.url, n_amqp)
        print(f"  AMQP 0-9-1: {n_amqp} at {time.monotonic() - t0:.0f}s", flush=True)
        asyncio.run(_stream_protocol(b, n_sp))
        print(f"  stream protocol: {n_sp} at {time.monotonic() - t0:.0f}s", flush=True)
        time.sleep(2)
        b.stop()
    counts = {name: records(scale, name) for name in (SP, AMQP)}
    want = {SP: n_sp + 1, AMQP: n_amqp + 1}
    if counts != want:
        raise SystemExit(f"the reader finds {counts} records, {want} were confirmed")
    size = sum(p.stat().st_size for p in node_dir(scale).rglob("*.segment"))
    (out / "DONE").write_text(f"{counts} records, {size / 1e6:.0f} MB of segments, {time.monotonic() - t0:.0f}s\n")
    return node_dir(scale)


def stream_dir(scale: float, name: str) -> Path:
    from cqforensics.model.vhost import base64uri

    prefix = base64uri(f"/_{name}_")
    root = node_dir(scale) / "stream"
    (d,) = [d for d in root.iterdir() if d.name.startswith(prefix) and d.name[len(prefix) :].isdigit()]
    return d


def records(scale: float, name: str) -> int:
    """The records of a stream's user chunks, from the chunk headers (a walk that seeks)."""
    from cqforensics.grammar import osiris as g

    n = 0
    for seg in sorted(stream_dir(scale, name).glob("*.segment")):
        with open(seg, "rb") as f:
            pos = g.LOG_HEADER_SIZE
            while True:
                f.seek(pos)
                head = f.read(g.CHUNK_HEADER_SIZE)
                if len(head) < g.CHUNK_HEADER_SIZE:
                    break
                h = g.CHUNK_HEADER.unpack(head)
                n += h[3] if h[1] == g.CHNK_USER else 0
                pos += g.CHUNK_HEADER_SIZE + h[10] + h[8] + h[9]
    return n


# -- measuring -------------------------------------------------------------------------------------

CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
kind, node, stream_dir, name = sys.argv[2:6]
import cqforensics
t0 = time.perf_counter()
rows = size = 0
if kind == "raw":
    buf = bytearray(1 << 20)
    for f in sorted(os.listdir(stream_dir)):
        if f.endswith(".segment"):
            with open(os.path.join(stream_dir, f), "rb", buffering=0) as fh:
                while True:
                    n = fh.readinto(buf)
                    if not n:
                        break
                    size += n
else:
    for b in cqforensics.iter_batches(node, kind, queues=[name]):
        rows += b.num_rows
        size = max(size, b.nbytes)
dt = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"rows": rows, "bytes": size, "seconds": dt, "cpu_seconds": ru.ru_utime + ru.ru_stime,
                  "peak_rss_mb": ru.ru_maxrss / 1024}))
"""

KINDS = ("raw", "messages", "queues")


def measure(kind: str, scale: float, name: str, core: bool = True) -> dict:
    env = dict(os.environ, CQF_CORE="1" if core else "0")
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), kind, str(node_dir(scale).parent), str(stream_dir(scale, name)), name],
        capture_output=True,
        text=True,
        env=env,
    )
    if p.returncode:
        raise SystemExit(f"{kind} {scale:g}x {name}: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=float, nargs="+", default=[0.1, 1.0])
    ap.add_argument("--streams", nargs="+", default=[SP, AMQP], choices=[SP, AMQP])
    ap.add_argument(
        "--kinds", nargs="+", default=list(KINDS[1:]), choices=KINDS[1:], help="what to measure besides the raw read"
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reference", action="store_true", help="the pure-Python reference too (CQF_CORE=0)")
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    for s in args.sizes:
        t0 = time.monotonic()
        print(f"{build(s)}: {(store_dir(s) / 'DONE').read_text().strip()} ({time.monotonic() - t0:.0f}s)", flush=True)
    if args.build_only:
        return
    cases = [(k, True) for k in args.kinds] + ([(k, False) for k in args.kinds] if args.reference else [])
    runs: dict = {}
    for _ in range(args.repeat):  # alternating: every case once per round
        for s in args.sizes:
            for name in args.streams:
                runs.setdefault((s, name, "raw", True), []).append(measure("raw", s, name))
                for kind, core in cases:
                    runs.setdefault((s, name, kind, core), []).append(measure(kind, s, name, core))
    results = []
    print("\n| stream | size | read | records | records/s | x raw read | peak RSS MB | CPU s |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for (s, name, kind, core), rs in runs.items():
        if kind == "raw":
            continue
        raw = statistics.median(r["seconds"] for r in runs[(s, name, "raw", True)])
        sec = statistics.median(r["seconds"] for r in rs)
        rows = rs[0]["rows"]
        rss = max(r["peak_rss_mb"] for r in rs)
        cpu = statistics.median(r["cpu_seconds"] for r in rs)
        label = kind + ("" if core else " (reference)")
        results.append(
            {
                "stream": name,
                "scale": s,
                "read": kind,
                "core": core,
                "rows": rows,
                "seconds": sec,
                "records_per_s": rows / sec,
                "x_raw": sec / raw,
                "peak_rss_mb": rss,
                "cpu_seconds": cpu,
                "raw_seconds": raw,
                "segment_bytes": runs[(s, name, "raw", True)][0]["bytes"],
            }
        )
        print(f"| {name} | {s:g}x | {label} | {rows:,} | {rows / sec:,.0f} | {sec / raw:.0f} | {rss:.0f} | {cpu:.1f} |")
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "streams.json").write_text(json.dumps({"repeat": args.repeat, "results": results}, indent=1))


if __name__ == "__main__":
    main()
