#!/usr/bin/env python3
"""Memory curve: peak RSS of reading ``refcounts``, ``store`` and ``messages`` (by default; any
table with ``--tables``), and of the writers ``compact`` and ``rebuild`` (``--writers``), at 0.1x,
1x, 3x and 10x the bench store, each read or write in a fresh process.

    python bench/bench_memory.py                    # sizes 0.1 1 3 10
    python bench/bench_memory.py --sizes 1 3        # a subset
    python bench/bench_memory.py --tables findings files queues index acks holes
    python bench/bench_memory.py --tables --writers compact rebuild   # the writers only

Every size is read as the killed store and as its cleanly stopped twin (``--kinds``; a real
broker booted on a copy and stopped it: make_store.build_clean), side by side.

0.1x and 1x are the broker-made bench stores (bench/make_store.py). 3x and 10x are made without
a broker, from the 1x store (make_store.build_scaled), as ONE vhost holding N copies of its content (the vhost-wide state
is what has to stay bounded; copies in separate vhosts would be read one vhost at a time and
prove nothing about it):

* ``msg_store_persistent``: copy k of file n becomes file ``n + k * (last + 1)``; every entry's
  msg_id (in its header and in the stored term) gets its first byte XORed with k, so every
  copy's messages are distinct store entries (copy 0 is hardlinked as is);
* queues: copy k of queue Q is ``Q~k`` (its dir name and ``.queue_name`` as the broker would
  write them); its ``.qi`` segments get the same msg_id rewrite on shared-store entries; its
  ``.qs`` segments (bodies under 4 KB, embedded in the queue's own store, ids checksummed with
  the term) are hardlinked unchanged;
* everything else in the node dir (metadata, transient store, recovery.dets) is hardlinked.

A vhost with more stored messages than ``ENTRIES_PER_SHARE`` is read in message-id shares
(``cqforensics.model.vhost``), so 3x and 10x take several passes; ``--entries-per-share`` sets
it (a huge number reads every vhost whole, as before shares).

The copies' queues are not in the node's metadata, so the reader reports them as such; every
message is still read, resolved and decoded. Built once under ``$CQF_BENCH_CACHE`` (3x: 3.4 GB,
10x: 11.5 GB of disk). Results: a markdown table on stdout and ``bench/results/memory.json``
(``memory-writers.json`` for a run of the writers alone).

The writers read every size through a hardlinked view of its node dir without the metadata
(``coordination/``, ``rabbitmq_metadata/``: ``writer_node``): a writer drops (compact) or
quarantines one by one into lost+found (rebuild) the messages of a queue the metadata does not
declare, so with the metadata the copies' queues would measure lost+found, not the rewrite;
without it every queue dir is written, as a store whose metadata declares them all would be.
Each writes into a fresh ``$CQF_BENCH_CACHE/out-<writer>-<size>-<pid>/``, removed after the run
(10x writes about 11 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from make_store import CACHE, _link_tree, build, build_clean, build_scaled, core_status, node_dir, scaled_dir, store_dir  # noqa: E402

TABLES = ("refcounts", "store", "messages")  # the default
WRITERS = ("compact", "rebuild")
METADATA = ("coordination", "rabbitmq_metadata")  # what writer_node leaves out
ALL_TABLES = ("refcounts", "store", "messages", "index", "acks", "holes", "files", "queues", "findings", "fsck")


def writer_node(node: Path) -> Path:
    """A hardlinked view of ``node`` without its metadata, beside its store (see the module doc)."""
    view = node.parents[2].with_name(node.parents[2].name + "-nometa")
    out = view / node.relative_to(node.parents[2])
    if (view / "DONE").exists():
        return out
    shutil.rmtree(view, ignore_errors=True)
    out.mkdir(parents=True)
    for child in sorted(node.iterdir()):
        if child.name in METADATA:
            continue
        if child.is_dir():
            _link_tree(child, out / child.name)
        else:
            os.link(child, out / child.name)
    (view / "DONE").write_text(f"{node} without {', '.join(METADATA)}, hardlinked\n")
    return out


CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import cqforensics
from cqforensics.model import store
store.ENTRIES_PER_SHARE = int(sys.argv[4]) or store.ENTRIES_PER_SHARE
t0 = time.perf_counter()
rows = 0
if sys.argv[3] == "fsck":  # the checks of the fsck command: rows are the messages checked
    from cqforensics.commands import fsck
    rows = sum(q.messages for q in fsck.run([sys.argv[2]]).queues)
else:
    for b in cqforensics.iter_batches(sys.argv[2], sys.argv[3]):
        rows += b.num_rows
dt = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"rows": rows, "seconds": dt, "cpu_seconds": ru.ru_utime + ru.ru_stime, "peak_rss_mb": ru.ru_maxrss / 1024}))
"""

WRITER_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from cqforensics.write import salvage
t0 = time.perf_counter()
r = salvage.rewrite(sys.argv[2], sys.argv[3], sys.argv[4])
dt = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
t = r.totals()
print(json.dumps({"written": t["written"], "store_entries_written": r.store_entries_written,
                  "bytes_after": r.bytes_after, "lost_found": r.lost_found, "verified": r.verified,
                  "exit_code": r.exit_code, "seconds": dt, "cpu_seconds": ru.ru_utime + ru.ru_stime,
                  "peak_rss_mb": ru.ru_maxrss / 1024}))
"""

BASELINE = r"""
import resource, sys
sys.path.insert(0, sys.argv[1])
import cqforensics, pyarrow, numpy
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def measure(node: Path, table: str, per_share: int = 0) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), str(node), table, str(per_share)], capture_output=True, text=True
    )
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    return json.loads(p.stdout)


def measure_writer(node: Path, writer: str, size: float) -> dict:
    """``writer`` on ``writer_node(node)`` into a fresh dir, removed afterwards."""
    out = CACHE / f"out-{writer}-{size:g}-{os.getpid()}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    try:
        p = subprocess.run(
            [sys.executable, "-c", WRITER_CHILD, str(ROOT), writer, str(writer_node(node)), str(out / "node")],
            capture_output=True,
            text=True,
        )
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    return json.loads(p.stdout)


def _cell(r: dict) -> str:
    if "error" in r:
        return f"error: {r['error']}"
    return f"{r['peak_rss_mb']:.0f} ({r['seconds']:.1f} s, {r['cpu_seconds']:.1f} s CPU)"


def stored_messages(node: Path) -> int:
    import cqforensics

    return sum(b.num_rows for b in cqforensics.iter_batches(node, "index", columns=["seq_id"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", type=float, default=[0.1, 1, 3, 10])
    ap.add_argument(
        "--tables", nargs="*", default=list(TABLES), choices=ALL_TABLES, help="tables to read (none: only the writers)"
    )
    ap.add_argument(
        "--writers",
        nargs="*",
        default=[],
        choices=WRITERS,
        help="writers to run on each size (default: none; 10x writes about 11 GB, removed after)",
    )
    ap.add_argument(
        "--entries-per-share",
        type=int,
        default=0,
        help="stored messages a pass may hold (default: cqforensics.model.store.ENTRIES_PER_SHARE; "
        "a huge number reads every vhost whole, as before shares)",
    )
    ap.add_argument(
        "--kinds",
        nargs="+",
        default=["killed", "clean"],
        choices=["killed", "clean"],
        help="the killed stores, their cleanly stopped twins (make_store.build_clean), or both",
    )
    args = ap.parse_args()
    print(f"compiled core: {core_status()}", flush=True)
    nodes = {}
    for s in args.sizes:
        if s in (0.1, 1):
            build(s)
            killed = node_dir(s)
            clean = build_clean(store_dir(s)) if "clean" in args.kinds else None
        elif s == int(s) and s > 1:
            killed = build_scaled(int(s))
            clean = build_clean(scaled_dir(int(s)), copies=int(s)) if "clean" in args.kinds else None
        else:
            raise SystemExit(f"size {s}: only 0.1, 1 and whole multiples of 1 can be made")
        for kind, node in (("killed", killed), ("clean", clean)):
            if kind in args.kinds:
                nodes[(s, kind)] = node
    base = float(
        subprocess.run([sys.executable, "-c", BASELINE, str(ROOT)], capture_output=True, text=True, check=True).stdout
    )
    core = "off (CQF_CORE=0)" if os.environ.get("CQF_CORE") == "0" else "default"
    results = {"baseline_rss_mb": base, "core": core, "entries_per_share": args.entries_per_share or None, "sizes": {}}
    print(
        f"peak RSS (MB) per read or write, each in a fresh process (wall and CPU seconds); interpreter + "
        f"libraries {base:.0f} MB; core {core}"
    )
    columns = args.tables + args.writers
    print("| size | store | stored messages | bytes | " + " | ".join(columns) + " |")
    print("|" + "---|" * (4 + len(columns)))
    for (s, kind), node in nodes.items():
        size = sum(p.stat().st_size for p in node.rglob("*") if p.is_file())
        msgs = stored_messages(node)
        row = {"node": str(node), "bytes": size, "index_rows": msgs, "tables": {}, "writers": {}}
        cells = []
        for t in args.tables:
            row["tables"][t] = r = measure(node, t, args.entries_per_share)
            cells.append(_cell(r))
        for w in args.writers:
            row["writers"][w] = r = measure_writer(node, w, s)
            cells.append(_cell(r))
        results["sizes"][f"{s:g}x" + ("" if kind == "killed" else " clean")] = row
        print(f"| {s:g}x | {kind} | {msgs:,} | {size / 1e9:.2f} GB | " + " | ".join(cells) + " |", flush=True)
    (HERE / "results").mkdir(exist_ok=True)
    name = "memory.json" if args.tables else "memory-writers.json"  # a writers-only run keeps the readers' figures
    (HERE / "results" / name).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
