#!/usr/bin/env python3
"""Reader benchmark on real-broker stores (bench/make_store.py builds and caches them).

    python bench/bench_readers.py            # builds the stores on first use (needs root + 4.3.6)
    python bench/bench_readers.py --quick    # one run per case instead of best of 3

Reports, measured in one run on a warm page cache:
* raw read: reading every byte of the node dir (the physical limit);
* the two passes over the shared store that ``store`` with bodies and ``messages`` make: its walk
  (the compiled walk through maps, no lookups) and a read of its ``.rdq`` files, and the ratio to
  the raw read those two alone allow; with the pass over every index and the compiled decode by
  itself, the messages/s a full decode reaches at most;
* every table read, with the compiled core (default) and with ``CQF_CORE=0`` (the pure-Python
  reference), each as time, rows/s, throughput as a ratio to raw read, and core/reference;
* the full ``messages`` decode on the fresh bench store and on the store the broker compacted
  (make_store --compacted: zero-filled holes in every .rdq file), in messages/s, and the
  per-message ratio fresh/compacted (issue 15's goal: within 1.2x);
* peak RSS of each read, in a fresh process (its imports and a warm-up read of a sample
  included), on the store and on the 10x smaller one;
* every read, and ``fsck``, on both kinds of store side by side: the killed store (what a crash
  leaves) and its cleanly stopped twin (``make_store.build_clean``: the same messages, with
  the clean-shutdown files a clean start trusts), each read of one alternating with the other's,
  and the ratio clean/killed in seconds per row (the goal: at most 1.2).
Each read is timed as the best of 3 (this VM's timings vary by +-30%), except the reference's
decode of the compacted store, timed once (it is the slow case the core is there to fix).
Results: a markdown table on stdout and ``bench/results/readers.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from make_store import build, build_clean, build_compacted, core_status, node_dir, store_dir  # noqa: E402

CASES = {
    "index": ("index", None),
    "store (no bodies)": ("store", ["file", "offset", "total_size", "msg_id", "status", "refs"]),
    "refcounts": ("refcounts", None),
    "store (bodies)": ("store", None),
    "acks": ("acks", None),
    "holes": ("holes", None),
    "files": ("files", None),
    "queues": ("queues", None),
    "findings": ("findings", None),
    "messages (full decode)": ("messages", None),
    "fsck": ("fsck", None),
}


def raw_read(node: Path, suffix: str | None = None) -> tuple[float, int]:
    """Seconds to read every file below ``node`` (those ending in ``suffix``), and their bytes."""
    buf = bytearray(16 << 20)
    view = memoryview(buf)
    total = 0
    t0 = time.perf_counter()
    for p in sorted(node.rglob("*")):
        if p.is_file() and (suffix is None or p.name.endswith(suffix)):
            with open(p, "rb", buffering=0) as f:
                while True:
                    n = f.readinto(view)
                    if not n:
                        break
                    total += n
    return time.perf_counter() - t0, total


def walk_floor(node: Path) -> float:
    """Seconds the compiled walk takes over every ``.rdq`` file through a map of each, made and
    unmapped per file, trusting no id (no lookups): what finding the entries costs at the least,
    as every table but ``index`` and ``acks`` must."""
    from cqforensics import compiled as core
    from cqforensics.readers.files import map_file

    t0 = time.perf_counter()
    for p in sorted(node.rglob("*.rdq")):
        m = map_file(p)
        core.walk_rdq(m)
        if hasattr(m, "close"):
            m.close()
    return time.perf_counter() - t0


def index_pass_floor(node: Path) -> float:
    """Seconds the pass over every queue index of the node takes (every segment decoded, the
    references into the shared store gathered and indexed by id), as a ``messages`` read makes
    it before it walks the store."""
    from cqforensics.discovery import nodes as layout
    from cqforensics.model.options import make_options
    from cqforensics.model.vhost import NodeScan

    t0 = time.perf_counter()
    for vs in NodeScan(layout.read_node_dir(node), make_options()).vhosts:
        vs.index_pass
        vs.close()
    return time.perf_counter() - t0


def decode_floor(node: Path, terms: int = 4096, repeats: int = 20) -> float:
    """Seconds a row the compiled decode takes by itself, without bodies (their copy is the
    second pass's), on the first ``terms`` stored terms of the store, held in memory (a batch
    of the read is about as many rows): the fastest of ``repeats`` decodes, per row."""
    import numpy as np

    from cqforensics import compiled as core
    from cqforensics.readers import rdq

    path = next(p for p in sorted(node.rglob("*.rdq")) if p.stat().st_size)
    data = path.read_bytes()
    offsets, totals, ids = core.walk_rdq(data)[:3]
    n = min(terms, len(offsets))
    starts, lengths = rdq.term_span(np.asarray(offsets[:n]), np.asarray(totals[:n]))
    args = (
        [data],
        np.zeros(n, np.int32),
        starts,
        lengths,
        np.ascontiguousarray(ids[:n]).tobytes(),
        np.ones(n, np.uint8),
    )
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        core.decode_messages(*args, bodies=False)
        best = min(best, time.perf_counter() - t0)
    return best / n


CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import cqforensics, pyarrow.compute
table, columns = sys.argv[3], json.loads(sys.argv[4])
from cqforensics.commands import fsck
for t in cqforensics.TABLES:  # warm up: one-time imports are not throughput
    cqforensics.read_table(sys.argv[5], t)
fsck.run([sys.argv[5]])
def cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime
c0, t0 = cpu(), time.perf_counter()
rows = 0
if table == "fsck":  # what the fsck command does, without its start-up: rows are the messages checked
    rows = sum(q.messages for q in fsck.run([sys.argv[2]]).queues)
else:
    for b in cqforensics.iter_batches(sys.argv[2], table, columns=columns):
        rows += b.num_rows
dt, dc = time.perf_counter() - t0, cpu() - c0
from cqforensics import compiled as core
print(json.dumps({"rows": rows, "seconds": dt, "cpu_seconds": dc,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "core": core.status(), "core_counts": dict(getattr(core, "COUNTS", {}))}))
"""


def run_case(node: Path, table: str, columns, runs: int = 3, core: bool = True) -> dict:
    """Best of ``runs`` reads, each in a fresh process (so peak RSS is that read's alone; import
    time excluded from the timing). This VM's timings vary by +-30% from run to run."""
    return _best([_run_once(node, table, columns, core) for _ in range(runs)])


def _best(results: list[dict]) -> dict:
    best = min(results, key=lambda r: r["seconds"])
    return {
        **best,
        "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
        "all_seconds": [r["seconds"] for r in results],
    }


def run_pair(nodes: list[Path], table: str, columns, runs: int = 3) -> list[dict]:
    """``run_case`` on each of ``nodes``, their reads alternating (one of each, then again), so a
    busy moment of the shared machine falls on both kinds alike."""
    results: list[list[dict]] = [[] for _ in nodes]
    for _ in range(runs):
        for got, node in zip(results, nodes):
            got.append(_run_once(node, table, columns))
    return [_best(r) for r in results]


def _run_once(node: Path, table: str, columns, core: bool = True) -> dict:
    warm = HERE.parent / "sample_data" / "4.3.6-clean"
    env = dict(os.environ)
    if core:
        env.pop("CQF_CORE", None)
    else:
        env["CQF_CORE"] = "0"
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(HERE.parent), str(node), table, json.dumps(columns), str(warm)],
        capture_output=True,
        text=True,
        env=env,
    )
    if out.returncode:  # one table's failure must not lose the rest of the run
        err = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        raise CaseFailed(f"{table} on {node}: {err}")
    return json.loads(out.stdout)


class CaseFailed(RuntimeError):
    pass


def baseline_rss() -> float:
    code = (
        "import resource, cqforensics, pyarrow.compute; [cqforensics.read_table("
        f"{str(HERE.parent / 'sample_data' / '4.3.6-clean')!r}, t) for t in cqforensics.TABLES]; "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(HERE.parent)!r}); " + code],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout)


def _fmt_rate(rows: int, seconds: float) -> str:
    r = rows / seconds
    return f"{r / 1e6:.2f} M/s" if r >= 1e6 else f"{r / 1e3:.1f} k/s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one run per case instead of best of 3")
    ap.add_argument(
        "--no-compacted",
        action="store_true",
        help="leave out the compacted store (its build takes a broker about 10 minutes)",
    )
    args = ap.parse_args()
    print(f"compiled core: {core_status()}", flush=True)
    runs = 1 if args.quick else 3
    big, small = node_dir(1.0), node_dir(0.1)
    build(1.0)
    build(0.1)
    clean, clean_small = build_clean(store_dir(1.0)), build_clean(store_dir(0.1))
    compacted = None if args.no_compacted else build_compacted()
    raw_read(clean)  # warm the page cache (the clean twin shares most files with the killed store)
    raw_read(big)
    raw_s, raw_bytes = min(raw_read(big) for _ in range(runs))
    craw_s, craw_bytes = (1.0, 0)
    if compacted is not None:
        raw_read(compacted)
        craw_s, craw_bytes = min(raw_read(compacted) for _ in range(runs))
    results = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "runs": runs,
        "store_bytes": raw_bytes,
        "raw_read_s": raw_s,
        "raw_read_mb_s": raw_bytes / raw_s / 1e6,
        "compacted_store_bytes": craw_bytes,
        "compacted_raw_read_s": craw_s,
        "baseline_rss_mb": baseline_rss(),
        "cases": {},
    }
    print(
        f"store: {raw_bytes / 1e9:.2f} GB in {sum(1 for p in big.rglob('*') if p.is_file())} files; "
        f"raw read {raw_s:.3f} s ({raw_bytes / raw_s / 1e6:.0f} MB/s); compacted store {craw_bytes / 1e9:.2f} GB, "
        f"raw read {craw_s:.3f} s; interpreter + libraries: {results['baseline_rss_mb']:.0f} MB RSS; "
        f"best of {runs}",
        flush=True,
    )
    # `store` with bodies and `messages` read the shared store twice: once to find its entries
    # (whose fates depend on every file), once to copy the bodies in the table's order
    walk_s = min(walk_floor(big) for _ in range(runs))
    rdq_s, rdq_bytes = min(raw_read(big, ".rdq") for _ in range(runs))
    results.update(walk_floor_s=walk_s, rdq_read_s=rdq_s, rdq_bytes=rdq_bytes)
    print(
        f"two passes over the shared store ({rdq_bytes / 1e9:.2f} GB of .rdq): its walk {walk_s:.3f} s (compiled, "
        f"through maps, no lookups) + a read of its files {rdq_s:.3f} s = {walk_s + rdq_s:.3f} s, so a table that "
        f"must do both reaches at most {raw_s / (walk_s + rdq_s):.2f}x of the raw read with nothing else to do",
        flush=True,
    )
    cases = [(name, big, table, columns) for name, (table, columns) in CASES.items()]
    if compacted is not None:
        cases.append(("messages (full decode), compacted store", compacted, "messages", None))
    head = (
        "| read | rows | core s | core rate | core vs raw read | pure-Python s | pure-Python rate "
        "| pure-Python vs raw read | core / pure-Python | peak RSS core | peak RSS pure-Python | RSS core, 1/10 store |"
    )
    lines = [head, "|" + "---|" * 12]
    kinds = [
        "| read | rows | killed s | killed rate | clean s | clean rate | **clean / killed** per row "
        "| killed CPU s | clean CPU s | peak RSS killed | peak RSS clean | RSS 1/10 killed | RSS 1/10 clean |",
        "|" + "---|" * 13,
    ]
    print(head)
    print(lines[1], flush=True)
    for name, node, table, columns in cases:
        is_compacted = node == compacted
        raw = craw_s if is_compacted else raw_s
        try:
            if is_compacted:
                c, sm = run_case(node, table, columns, runs), None
            else:
                c, cc = run_pair([node, clean], table, columns, runs)
                sm, csm = run_pair([small, clean_small], table, columns, 1)
                results.setdefault("clean_cases", {})[name] = {
                    "killed": c,
                    "clean": cc,
                    "killed_small": sm,
                    "clean_small": csm,
                }
                per = (cc["seconds"] / max(cc["rows"], 1)) / (c["seconds"] / max(c["rows"], 1))
                kinds.append(
                    f"| {name} | {c['rows']:,} | {c['seconds']:.3f} | {_fmt_rate(c['rows'], c['seconds'])} "
                    f"| {cc['seconds']:.3f} | {_fmt_rate(cc['rows'], cc['seconds'])} | **{per:.2f}x** "
                    f"| {c['cpu_seconds']:.3f} | {cc['cpu_seconds']:.3f} | {c['peak_rss_mb']:.0f} MB "
                    f"| {cc['peak_rss_mb']:.0f} MB | {sm['peak_rss_mb']:.0f} MB | {csm['peak_rss_mb']:.0f} MB |"
                )
                print("    both kinds: " + kinds[-1], flush=True)
                if table == "fsck":
                    continue  # no pure-Python figures for the command: it reads every table's way
            py = run_case(node, table, columns, 1 if is_compacted else runs, core=False)
        except CaseFailed as e:
            results["cases"][name] = {"error": str(e)}
            lines.append(f"| {name} | error: {e} |")
            print(lines[-1], flush=True)
            continue
        entry = {
            "node": str(node),
            "core": c,
            "reference": py,
            "small_core": sm,
            "core_vs_raw_read": raw / c["seconds"],
            "reference_vs_raw_read": raw / py["seconds"],
            "core_speedup": py["seconds"] / c["seconds"],
        }
        results["cases"][name] = entry
        line = (
            f"| {name} | {c['rows']:,} | {c['seconds']:.3f} | {_fmt_rate(c['rows'], c['seconds'])} "
            f"| {entry['core_vs_raw_read']:.2f}x | {py['seconds']:.2f} | {_fmt_rate(py['rows'], py['seconds'])} "
            f"| {entry['reference_vs_raw_read']:.3f}x | {entry['core_speedup']:.1f}x | {c['peak_rss_mb']:.0f} MB "
            f"| {py['peak_rss_mb']:.0f} MB | {sm['peak_rss_mb']:.0f} MB |"
            if sm
            else f"| {name} | {c['rows']:,} | {c['seconds']:.3f} | {_fmt_rate(c['rows'], c['seconds'])} "
            f"| {entry['core_vs_raw_read']:.2f}x | {py['seconds']:.2f} | {_fmt_rate(py['rows'], py['seconds'])} "
            f"| {entry['reference_vs_raw_read']:.3f}x | {entry['core_speedup']:.1f}x | {c['peak_rss_mb']:.0f} MB "
            f"| {py['peak_rss_mb']:.0f} MB | - |"
        )
        lines.append(line)
        print(line, flush=True)
        if c.get("core_counts"):
            print(f"    core counts: {c['core_counts']}", flush=True)
    fresh = results["cases"]["messages (full decode)"]
    comp = results["cases"].get("messages (full decode), compacted store", {"error": "left out"})
    per = {}
    for who in () if "error" in fresh or "error" in comp else ("core", "reference"):
        f_rate = fresh[who]["rows"] / fresh[who]["seconds"]
        c_rate = comp[who]["rows"] / comp[who]["seconds"]
        per[who] = {"fresh_msg_s": f_rate, "compacted_msg_s": c_rate, "fresh_over_compacted": f_rate / c_rate}
        print(
            f"full decode per message, {who}: fresh {f_rate:,.0f} msg/s, compacted {c_rate:,.0f} msg/s: "
            f"compacted is {f_rate / c_rate:.2f}x slower per message (goal <= 1.2x)",
            flush=True,
        )
    results["per_message_fresh_vs_compacted"] = per
    if "error" not in fresh:
        # what a full decode of the fresh store costs at the least: its two passes over the
        # shared store, the pass over every index, and the compiled decode by itself
        n = fresh["core"]["rows"]
        ix_s = min(index_pass_floor(big) for _ in range(runs))
        dec_s = decode_floor(big)
        floor = walk_s + rdq_s + ix_s + n * dec_s
        results["messages_floor"] = {
            "index_pass_s": ix_s,
            "decode_s_per_row": dec_s,
            "floor_s": floor,
            "msg_s": n / floor,
        }
        print(
            f"full decode at the least: the two passes {walk_s + rdq_s:.3f} s + the pass over every index "
            f"{ix_s:.3f} s + the compiled decode alone, without bodies, on terms in memory ({dec_s * 1e9:.0f} ns a "
            f"row at the read's batch size) x {n:,} = {floor:.3f} s: at most {n / floor:,.0f} msg/s with nothing "
            "else done (resolving, the columns, moving bodies)",
            flush=True,
        )
        got = fresh["core"]["seconds"]
        results["messages_floor"]["full_decode_of_floor"] = floor / got
        print(
            f"the full decode of the killed store: {got:.3f} s, {n / got:,.0f} msg/s: {floor / got:.2f} of the floor "
            "(goal >= 0.8)",
            flush=True,
        )
        nb = results.get("clean_cases", {}).get("messages (full decode)")
        if nb:
            print(
                f"  its cleanly stopped twin: {nb['clean']['seconds']:.3f} s, {floor / nb['clean']['seconds']:.2f} "
                "of the floor",
                flush=True,
            )
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "readers.json").write_text(json.dumps(results, indent=1))
    (out / "readers.md").write_text(
        "\n".join(lines) + "\n\nKilled store and its cleanly stopped twin, alternating:\n\n" + "\n".join(kinds) + "\n"
    )
    print("\nkilled store and its cleanly stopped twin (the same messages), reads alternating:")
    print("\n".join(kinds))
    print(f"cores used: 1 (embedded reader); cpu count {os.cpu_count()}")


if __name__ == "__main__":
    main()
