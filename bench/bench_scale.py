#!/usr/bin/env python3
"""Cost per queue and per hole: every command on a node of many empty queues, and on a node
whose shared store holds a sparse 50 GB ``.rdq`` (issue 32 item 4).

    python bench/bench_scale.py                 # 20,000 queues and the 50 GB sparse file
    python bench/bench_scale.py --queues 2000 5000 20000 --repeat 3

Inputs (built once, cached in ``$CQF_BENCH_CACHE``, default /var/cache/cqforensics/bench):

* ``queues-<N>``: a real RabbitMQ 4.3.6 node on which N durable classic queues were declared
  (``scale.00000`` ...), a few persistent messages published to the first three, then kill -9
  as the other bench stores: N queue dirs holding only their ``.queue_name`` (plus the three
  with a segment), every one known to the (Khepri) metadata.
* ``unknown-<N>``: crafted (labelled so): a copy of the ``4.3.6-kill`` sample with N more queue
  dirs, each a ``.queue_name`` naming a queue the metadata does not know, so every one is an
  ``unknown-queue`` finding (the findings path at scale).
* ``sparse``: crafted (labelled so): a copy of the ``4.3.6-kill`` sample whose persistent
  ``0.rdq`` (the broker's real entries) is extended to 50 GB by ``truncate``, with the same
  entries copied again at 25 GB: two data extents and two holes the filesystem knows (a sparse
  file costs no disk). The copy after the hole holds second copies of the ids (``duplicate-copy``).

Each command runs in a fresh process (``cqforensics fsck``, ``verify``, ``audit``, ``report``, ``read --table
messages``, ``read --table findings``, ``export``, ``compact``, ``rebuild``; and the API's
``read_table(..., "queues")``), alternating inputs, ``--repeat`` times; the table gives the best
wall time and its CPU seconds (the machine may be shared: compare within one run). Results in
``bench/results/scale.md`` and ``scale.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from make_store import CLI, CLI_ENV, core_status  # noqa: E402

CACHE = Path(os.environ.get("CQF_BENCH_CACHE", "/var/cache/cqforensics/bench"))
SAMPLE = ROOT / "sample_data" / "4.3.6-kill" / "mnesia"
SPARSE_SIZE = 50 << 30
PUBLISHED = 3  # queues that get a few messages (the others stay empty)


def queues_dir(n: int) -> Path:
    return CACHE / f"queues-{n}"


def queues_node(n: int) -> Path:
    return queues_dir(n) / "run" / "mnesia" / "rabbit@localhost"


def build_queues(n: int, version: str = "4.3.6") -> Path:
    """A real broker's node dir with ``n`` durable classic queues (see the module doc)."""
    from brokers import Broker
    from brokers.clients import pika_module

    out = queues_dir(n)
    if (out / "DONE").exists():
        return queues_node(n)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    out.chmod(0o755)
    pika = pika_module()
    t0 = time.monotonic()
    names = [f"scale.{i:05d}" for i in range(n)]
    with Broker(version, out / "run") as b:
        b.start()
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        for name in names:
            ch.queue_declare(name, durable=True)
        ch.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2, content_type="text/plain")
        for name in names[:PUBLISHED]:
            for k in range(3):
                ch.basic_publish("", name, f"{name} message {k}".encode(), props)
        conn.close()
        b.wait_durable(names[0], names[-1], timeout=120)
        time.sleep(2)
        b.kill()
    (out / "DONE").write_text(f"{n} durable queues, {PUBLISHED} x 3 messages, kill -9; {time.monotonic() - t0:.0f}s\n")
    return queues_node(n)


def build_unknown(n: int) -> Path:
    """Crafted: the 4.3.6-kill sample plus ``n`` queue dirs the metadata does not know."""
    from cqforensics.codecs import textfiles

    out = CACHE / f"unknown-{n}"
    node = out / "mnesia" / "rabbit@localhost"
    if (out / "DONE").exists():
        return node
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(SAMPLE, out / "mnesia")
    queues = next((node / "msg_stores" / "vhosts").glob("*/queues"))  # the / vhost's (the sample's first)
    vhost = (queues.parent / ".vhost").read_bytes()
    for i in range(n):
        name = f"unknown.{i:05d}".encode()
        d = queues / textfiles.queue_dir_name(vhost, name)
        d.mkdir()
        (d / ".queue_name").write_bytes(b"VHOST: " + vhost + b"\nQUEUE: " + name + b"\nINDEX: v2\n")
    (out / "DONE").write_text(f"crafted: the 4.3.6-kill sample plus {n} unknown queue dirs\n")
    return node


def sparse_rdq(node: Path) -> Path:
    return next(node.glob("msg_stores/vhosts/*/msg_store_persistent/0.rdq"))


def build_sparse(size: int = SPARSE_SIZE) -> Path:
    """Crafted: the 4.3.6-kill sample whose persistent 0.rdq is extended to ``size`` bytes with
    its entries copied again at ``size // 2`` (two holes the filesystem knows)."""
    out = CACHE / f"sparse-{size >> 30}G"
    node = out / "mnesia" / "rabbit@localhost"
    if (out / "DONE").exists():
        return node
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(SAMPLE, out / "mnesia")
    make_sparse(sparse_rdq(node), size)
    (out / "DONE").write_text(f"crafted: the 4.3.6-kill sample, its persistent 0.rdq sparse to {size} bytes\n")
    return node


def make_sparse(rdq: Path, size: int) -> None:
    """``rdq``'s bytes again at ``size // 2`` (block-aligned) and the file extended to ``size``."""
    data = rdq.read_bytes()
    with open(rdq, "r+b") as f:
        f.seek(size // 2)
        f.write(data)
        f.truncate(size)


#: each command on an input (``{node}``, ``{out}`` a scratch dir); the API's read in a fresh
#: Python process
COMMANDS = {
    "fsck": ["cqforensics", "fsck", "--json", "{node}"],
    "export": ["cqforensics", "export", "{node}", "--format", "jsonl", "--out", "{out}/e"],
    "audit": ["cqforensics", "audit", "--json", "{node}"],
    "verify": ["cqforensics", "verify", "--json", "{node}"],
    "report": ["cqforensics", "report", "{node}", "--html", "{out}/report.html"],
    "compact": ["cqforensics", "compact", "{node}", "{out}/c"],
    "rebuild": ["cqforensics", "rebuild", "{node}", "{out}/r"],
    "read messages": ["cqforensics", "read", "{node}", "--table", "messages", "--format", "jsonl"],
    "read findings": ["cqforensics", "read", "{node}", "--table", "findings", "--format", "jsonl"],
    "API queues": [
        sys.executable,
        "-c",
        "import sys, cqforensics; print(cqforensics.read_table(sys.argv[1], 'queues').num_rows)",
        "{node}",
    ],
}
#: exits that say the command did its job (fsck/verify 4: damage found, rebuild 1: repaired)
DONE = {0, 1, 4}


def run(cmd: list[str], node: Path, jobs: int | None) -> tuple[float, float, int]:
    """(wall s, CPU s with its workers, exit code) of one command in a fresh process."""
    out = Path(tempfile.mkdtemp(prefix="cqf-bench-scale-"))
    try:
        argv = [a.format(node=node, out=out) for a in cmd]
        if argv[0] == "cqforensics":  # this checkout's, whatever is on PATH
            argv[:1] = CLI
            if jobs is not None:
                argv += ["-j", str(jobs)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=CLI_ENV)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode not in DONE:
            raise SystemExit(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.decode()[-2000:]}")
        return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), p.returncode
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--queues",
        type=int,
        nargs="*",
        default=[2000, 20000],
        help="sizes of the broker-made many-queue nodes (default 2000 20000)",
    )
    ap.add_argument("--unknown", type=int, default=20000, help="crafted unknown queue dirs (0: none)")
    ap.add_argument("--sparse-gb", type=int, default=50, help="size of the sparse .rdq (0: none)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=None, help="-j for every command (default: the CLI's own)")
    ap.add_argument("--only", nargs="*", choices=sorted(COMMANDS))
    args = ap.parse_args()
    print(f"compiled core: {core_status()}", flush=True)
    inputs = {f"{n:,} queues (4.3.6)": build_queues(n) for n in args.queues}
    if args.unknown:
        inputs[f"{args.unknown:,} unknown queue dirs (crafted)"] = build_unknown(args.unknown)
    if args.sparse_gb:
        inputs[f"sparse {args.sparse_gb} GB .rdq (crafted)"] = build_sparse(args.sparse_gb << 30)
    names = args.only or list(COMMANDS)
    started, load = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()
    best: dict[tuple[str, str], tuple[float, float, int]] = {}
    for k in range(args.repeat):  # inputs alternate within each round
        for name in names:
            for label, node in inputs.items():
                r = run(COMMANDS[name], node, args.jobs)
                if (name, label) not in best or r[0] < best[(name, label)][0]:
                    best[(name, label)] = r
                print(f"  {name} on {label}: {r[0]:.2f} s wall, {r[1]:.2f} s CPU", file=sys.stderr, flush=True)
    labels = list(inputs)
    lines = [
        f"# Cost per queue and per hole ({started}; best of {args.repeat}; load average at the start "
        f"{load[0]:.1f}, {os.cpu_count()} CPUs; -j {args.jobs or 'default'})",
        "",
        "| command | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    for name in names:
        lines.append(
            f"| {name} | "
            + " | ".join(f"{best[(name, lb)][0]:.2f} s ({best[(name, lb)][1]:.2f} s CPU)" for lb in labels)
            + " |"
        )
    sizes = sorted(args.queues)
    if len(sizes) >= 2:
        small, big = (f"{sizes[0]:,} queues (4.3.6)", f"{sizes[-1]:,} queues (4.3.6)")
        lines += ["", f"CPU per queue dir ({sizes[0]:,} -> {sizes[-1]:,}: the difference over the added dirs):", ""]
        for name in names:
            d = (best[(name, big)][1] - best[(name, small)][1]) / (sizes[-1] - sizes[0]) * 1e6
            lines.append(f"- {name}: {d:.0f} µs")
    text = "\n".join(lines) + "\n"
    print(text)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "scale.md").write_text(text)
    (out / "scale.json").write_text(
        json.dumps(
            {
                "started": started,
                "load": load,
                "jobs": args.jobs,
                "results": {f"{n} | {lb}": v for (n, lb), v in best.items()},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the broker harness cleans up
    main()
