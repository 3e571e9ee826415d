#!/usr/bin/env python3
"""Build a benchmark store with a real RabbitMQ 4.3.6 broker (cached outside git).

    python bench/make_store.py                 # 200k x 5 KB + 200k x 200 B  (~1.1 GB)
    python bench/make_store.py --scale 0.1     # the 10x smaller store
    python bench/make_store.py --compacted     # a store the broker has compacted (holed files)
    python bench/make_store.py --scale 10      # 10 copies of the 1x store in its one vhost
    python bench/make_store.py --scale 1 --clean   # the 1x store, cleanly stopped (and the killed one)

The broker is killed (-9) once every message is on disk, as a crashed node would leave it.
The store lands in ``$CQF_BENCH_CACHE/store-<scale>/`` (default /var/cache/cqforensics/bench);
an existing store is reused. Scales above 1 are whole multiples of the 1x store, made without a
broker (``build_scaled``: ``store-1-x<N>-onevhost/``).

Every store has a cleanly stopped twin (``--clean``; ``<store>-clean/``, ``build_clean``): the
same messages after a real 4.3.6 broker booted on a copy of the killed store and stopped with
``rabbitmqctl shutdown``, so it holds the clean-shutdown files (``clean.dot``,
``msg_store_index.ets``, ``file_summary.ets``, ``recovery.dets``) a clean start trusts and
every reader reads. RabbitMQ's backup guide has a node stopped before its messages are copied,
so a stopped store is the common kind of evidence; a killed one is what a crash leaves.

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
import struct
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: the command line of this checkout's CLI, with ``CLI_ENV``: a benchmark measures the code
#: beside it, never a ``cqforensics`` on PATH (an older install shadowed it once: its figures
#: were another commit's)
CLI = [sys.executable, "-m", "cqforensics"]
CLI_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep),
}
CACHE = Path(os.environ.get("CQF_BENCH_CACHE", "/var/cache/cqforensics/bench"))


def core_status() -> str:
    """The compiled core the benchmarks measure (``cqforensics.compiled.status``); a debug build
    (an editable install's, once) is refused: its figures are 8-13x slower and mean nothing."""
    from cqforensics import compiled

    status = compiled.status()
    if compiled.debug_build():
        sys.exit(f"benchmarks refuse the compiled core this checkout holds: {status}")
    return status


BIG, SMALL = 5000, 200


def store_dir(scale: float) -> Path:
    return CACHE / f"store-{scale:g}"


def _publish(url: str, queue: str, size: int, count: int, seed: int) -> None:
    from brokers.clients import pika_module

    pika = pika_module()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    props = pika.BasicProperties(delivery_mode=2, content_type="application/json", headers={"tenant": "acme", "seq": 0})
    text = (b'{"event":"order.created","payload":"' + b"abcdefghij" * (size // 10 + 1))[: size - 2] + b'"}'
    for i in range(count):
        props.headers["seq"] = seed + i
        props.message_id = f"{queue}-{seed + i}"
        ch.basic_publish("", queue, text, props)
    ch.confirm_delivery()  # a final confirmed publish: everything before it is on disk too
    ch.basic_publish("", queue, text, props)
    conn.close()


def build(scale: float, version: str = "4.3.6") -> Path:
    from brokers import Broker
    from brokers.clients import pika_module

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
        jobs = [
            mp.Process(target=_publish, args=(b.url, q, size, n // 2, k * n // 2))
            for q, size in (("bench.big", BIG), ("bench.small", SMALL))
            for k in range(2)
        ]
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


# -- the 3x and 10x stores, made without a broker ------------------------------------------

QI_HEADER, QI_ENTRY = 64, 32


def _link_tree(src: Path, dst: Path, skip: Path | None = None) -> None:
    for dirpath, dirnames, filenames in os.walk(src):
        d = Path(dirpath)
        if d == skip:
            dirnames[:] = []
            continue
        (dst / d.relative_to(src)).mkdir(parents=True, exist_ok=True)
        for f in filenames:
            os.link(d / f, dst / d.relative_to(src) / f)


def _rewrite_rdq(src: Path, dst: Path, k: int) -> int:
    """Copy ``src`` to ``dst`` with every entry's msg_id (header and term) changed by copy ``k``;
    stops rewriting at the first thing that is not a whole entry (the rest is copied as is)."""
    data = src.read_bytes()
    out, off, n = [], 0, 0
    while off + 24 <= len(data):
        size = struct.unpack_from(">Q", data, off)[0]
        end = off + 8 + size + 1
        if size < 16 or end > len(data) or data[end - 1] != 0xFF:
            break
        mid = data[off + 8 : off + 24]
        new = bytes([mid[0] ^ k]) + mid[1:]
        out.append(data[off:end].replace(mid, new))
        off, n = end, n + 1
    out.append(data[off:])
    dst.write_bytes(b"".join(out))
    return n


def _rewrite_qi(src: Path, dst: Path, k: int) -> None:
    buf = bytearray(src.read_bytes())
    whole = (len(buf) - QI_HEADER) // QI_ENTRY if len(buf) > QI_HEADER else 0
    if whole:
        e = np.frombuffer(buf, np.uint8, whole * QI_ENTRY, QI_HEADER).reshape(whole, QI_ENTRY)
        shared = (e[:, 0] != 0) & (e[:, 3] == 1)  # a live entry located in the shared store
        e[shared, 4] ^= k
    dst.write_bytes(bytes(buf))


def scaled_dir(copies: int) -> Path:
    return CACHE / f"store-1-x{copies}-onevhost"


def build_scaled(copies: int) -> Path:
    """The killed 1x store's content ``copies`` times in its one vhost, made without a broker
    (see the module doc: copy k's files renumbered, its ids rewritten, its queues ``Q~k``)."""
    from cqforensics.codecs import textfiles

    out = scaled_dir(copies)
    node = out / "run" / "mnesia" / "rabbit@localhost"
    if (out / "DONE").exists():
        return node
    src = node_dir(1.0)
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.monotonic()
    vhosts = sorted((src / "msg_stores" / "vhosts").iterdir())
    assert len(vhosts) == 1, vhosts
    vsrc = vhosts[0]
    vdst = node / "msg_stores" / "vhosts" / vsrc.name
    _link_tree(src, node, skip=vsrc / "queues")  # copy 0 of everything, hardlinked
    (vdst / "queues").mkdir(parents=True, exist_ok=True)
    vhost = (vsrc / ".vhost").read_bytes()
    rdqs = sorted((int(p.stem), p) for p in (vsrc / "msg_store_persistent").glob("*.rdq"))
    stride = rdqs[-1][0] + 1
    for qsrc in sorted((vsrc / "queues").iterdir()):
        _link_tree(qsrc, vdst / "queues" / qsrc.name, skip=qsrc / "__none__")
    for k in range(1, copies):
        for n, p in rdqs:
            _rewrite_rdq(p, vdst / "msg_store_persistent" / f"{n + k * stride}.rdq", k)
        for qsrc in sorted((vsrc / "queues").iterdir()):
            qn = textfiles.parse_queue_name((qsrc / ".queue_name").read_bytes(), vhost)
            name = qn.name + f"~{k}".encode()
            qdst = vdst / "queues" / textfiles.queue_dir_name(vhost, name)
            qdst.mkdir()
            stub = b"VHOST: " + vhost + b"\nQUEUE: " + name + b"\n" + (b"INDEX: v2\n" if qn.index == "v2" else b"")
            (qdst / ".queue_name").write_bytes(stub)
            for f in sorted(qsrc.iterdir()):
                if f.name == ".queue_name":
                    continue
                if f.suffix == ".qi":
                    _rewrite_qi(f, qdst / f.name, k)
                else:
                    os.link(f, qdst / f.name)
        print(f"  x{copies}: copy {k} written ({time.monotonic() - t0:.0f}s)", flush=True)
    total = sum(p.stat().st_size for p in node.rglob("*") if p.is_file())
    (out / "DONE").write_text(f"{copies} copies of {src} in one vhost; {total} bytes; {time.monotonic() - t0:.0f}s\n")
    return node


# -- cleanly stopped stores -------------------------------------------------------------------

CLEAN_FILES = ("clean.dot", "msg_store_index.ets", "file_summary.ets", "recovery.dets")


def clean_dir(src: Path) -> Path:
    """Where the cleanly stopped twin of the killed store ``src`` (a ``store-*`` dir) goes."""
    return src.with_name(src.name + "-clean")


def clean_node_dir(scale: float) -> Path:
    return clean_dir(store_dir(scale)) / "run" / "mnesia" / "rabbit@localhost"


def clean_scaled_node_dir(copies: int) -> Path:
    return clean_dir(scaled_dir(copies)) / "run" / "mnesia" / "rabbit@localhost"


def _queue_counts(b) -> dict[str, int]:
    out = {}
    for line in b.ctl("list_queues", "-q", "--no-table-headers", "name", "messages").splitlines():
        name, _, n = line.rpartition("\t")
        if name:
            out[name] = int(n)
    return out


def build_clean(src: Path, copies: int = 1, version: str = "4.3.6", timeout: float = 3600.0) -> Path:
    """The same messages as the killed store ``src`` (a ``store-*`` dir), cleanly stopped: a real
    broker boots on a copy of its run dir (recovering it as after a crash), then stops with
    ``rabbitmqctl shutdown``, which writes the clean-shutdown files (clean.dot,
    msg_store_index.ets, file_summary.ets, recovery.dets) a clean start trusts. The copy is
    full (the broker writes into it); once stopped, every file equal to the killed store's is
    hardlinked to it. A store of ``copies`` > 1 (``build_scaled``) holds queues ``Q~k`` its
    metadata does not know, which a boot would delete: the broker first boots on its metadata
    alone, declares them (durable, as the originals), and stops, so that its second boot keeps
    them. Every queue must then hold what the killed store's index holds (checked against
    ``rabbitmqctl list_queues``)."""
    from brokers import Broker

    out = clean_dir(src)
    node = out / "run" / "mnesia" / "rabbit@localhost"
    if (out / "DONE").exists():
        return node
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    out.chmod(0o755)
    t0 = time.monotonic()
    src_node = src / "run" / "mnesia" / "rabbit@localhost"
    want = _index_counts(src_node)
    shutil.copytree(src / "run" / "mnesia", out / "run" / "mnesia", symlinks=True)  # no hardlink kept
    print(f"  {out.name}: copied ({time.monotonic() - t0:.0f}s)", flush=True)
    if copies > 1:
        aside = out / "stores-aside"
        (node / "msg_stores").rename(aside)
        with Broker(version, out / "run") as b:
            b.start(timeout=timeout)
            declare = [q for q in want if q not in _queue_counts(b)]
            from brokers.clients import pika_module

            pika = pika_module()
            conn = pika.BlockingConnection(pika.URLParameters(b.url))
            ch = conn.channel()
            for q in declare:
                ch.queue_declare(q, durable=True)
            conn.close()
            b.wait_durable(*declare)
            b.stop(timeout=timeout)
        shutil.rmtree(node / "msg_stores")
        aside.rename(node / "msg_stores")
        print(f"  {out.name}: {len(declare)} queues declared ({time.monotonic() - t0:.0f}s)", flush=True)
    with Broker(version, out / "run") as b:
        b.start(timeout=timeout)
        got = _queue_counts(b)
        print(f"  {out.name}: booted, {sum(got.values())} messages ({time.monotonic() - t0:.0f}s)", flush=True)
        if got != want:
            raise SystemExit(f"{out}: the broker holds {got}, the killed store's index {want}")
        b.stop(timeout=timeout)
    missing = [f for f in CLEAN_FILES if not any(node.rglob(f))]
    if missing:
        raise SystemExit(f"{out}: the clean stop wrote no {', '.join(missing)}")
    linked = _link_same(src_node, node)
    total = sum(p.stat().st_size for p in node.rglob("*") if p.is_file())
    (out / "DONE").write_text(
        f"{src.name} booted by RabbitMQ {version} and stopped cleanly; {sum(want.values())} "
        f"messages; {total} bytes ({linked} hardlinked to {src.name}); "
        f"{time.monotonic() - t0:.0f}s\n"
    )
    return node


def _index_counts(node: Path) -> dict[str, int]:
    """Messages per queue as the reader finds them in a node dir's indexes (what a boot
    recovers from a killed store: every queue, no damage)."""
    import cqforensics

    t = cqforensics.read_table(node, "queues", columns=["queue", "messages"]).to_pylist()
    return {r["queue"]: r["messages"] for r in t}


def _link_same(src: Path, dst: Path) -> int:
    """Hardlink every file of ``dst`` to the file of the same path under ``src`` when their bytes
    are equal (the broker left most of the store as it found it); returns the bytes linked."""
    import filecmp

    linked = 0
    for p in dst.rglob("*"):
        q = src / p.relative_to(dst)
        if (
            p.is_file()
            and not p.is_symlink()
            and q.is_file()
            and p.stat().st_size == q.stat().st_size
            and filecmp.cmp(p, q, shallow=False)
        ):
            tmp = p.with_name(p.name + ".link")
            os.link(q, tmp)
            os.replace(tmp, p)
            linked += q.stat().st_size
    return linked


# -- the compacted store ------------------------------------------------------------------

COMPACTED_PUBLISHERS, COMPACTED_PER_PUBLISHER, COMPACTED_SIZES = 4, 60_000, (4200, 8000)
COMPACTED_QUEUES = ("keep", "drain", "drain2")


def compacted_dir() -> Path:
    return CACHE / "store-compacted"


def compacted_node_dir() -> Path:
    return compacted_dir() / "run" / "mnesia" / "rabbit@localhost"


def _publish_interleaved(url: str, p: int, count: int) -> None:
    import random

    from brokers.clients import pika_module

    pika = pika_module()
    rng = random.Random(p)
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    props = pika.BasicProperties(delivery_mode=2, content_type="application/json", headers={"tenant": "acme", "seq": 0})
    lo, hi = COMPACTED_SIZES
    text = b'{"event":"order.created","payload":"' + b"abcdefghij" * (hi // 10 + 1)
    queues = [f"compact.{q}.{p}" for q in COMPACTED_QUEUES]
    for i in range(count):
        props.headers["seq"] = i
        props.message_id = f"c{p}-{i}"
        size = rng.randint(lo, hi)
        ch.basic_publish("", queues[i % len(queues)], text[: size - 2] + b'"}', props)
    ch.confirm_delivery()
    ch.basic_publish("", queues[1], text[:lo], props)  # confirmed marker (drained with the rest)
    conn.close()


def _drain(url: str, queue: str, limit: int | None = None) -> None:
    from brokers.clients import pika_module

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
    from brokers import Broker
    from brokers.clients import pika_module

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
    (out / "DONE").write_text(
        f"{P} x {n} messages of {lo}-{hi} B published, 1 in {len(COMPACTED_QUEUES)} kept; "
        f"{holes} holes in {holed} of {files} .rdq files; {time.monotonic() - t0:.0f}s\n"
    )
    return compacted_node_dir()


if __name__ == "__main__":
    # a TERM runs the Broker context's cleanup (kill, epmd, bind mount) like an interrupt
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--compacted", action="store_true", help="the store a broker has compacted")
    ap.add_argument("--clean", action="store_true", help="also its cleanly stopped twin")
    args = ap.parse_args()
    if args.compacted:
        node = build_compacted()
    elif args.scale > 1:
        if args.scale != int(args.scale):
            raise SystemExit("scales above 1 are whole multiples of the 1x store")
        build(1.0)
        node = build_scaled(int(args.scale))
        if args.clean:
            node = build_clean(scaled_dir(int(args.scale)), copies=int(args.scale))
    else:
        node = (build(args.scale), node_dir(args.scale))[1]
        if args.clean:
            node = build_clean(store_dir(args.scale))
    total = sum(p.stat().st_size for p in node.rglob("*") if p.is_file())
    print(f"{node}: {total / 1e9:.2f} GB")
    if args.compacted:
        print((compacted_dir() / "DONE").read_text(), end="")
