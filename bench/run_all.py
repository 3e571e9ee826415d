#!/usr/bin/env python3
"""Every benchmark in one run, one after the other (their figures are comparable only within
one run: this VM's speed varies between days by 2x), collated in ``bench/results/summary.md``.

    python bench/run_all.py            # 19 minutes on the 2-core VM of 2026-11-29 (stores built)
    python bench/run_all.py --quick    # one run per case where a benchmark offers it

Runs bench_readers (every table, core and pure-Python reference, ratio to the raw read, the
compacted store), bench_holes (holed against rewritten), bench_memory (peak RSS, 0.1x to 10x)
and bench_spark (local and standalone cluster against Parquet), each on the killed stores and
on their cleanly stopped twins side by side (make_store.build_clean); then bench_jobs (``-j 1``
against ``-j 2``, every command on the 1x store) and bench_scale (20,000 queues, 20,000 unknown
queue dirs, a sparse 50 GB ``.rdq``): every figure issue 32 asks for, from one run. Each writes its own results
in ``bench/results/``; this script adds their stdout, under one date, to the summary.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = (
    "bench_readers.py",
    "bench_holes.py",
    "bench_memory.py",
    "bench_spark.py",
    "bench_jobs.py",
    "bench_scale.py",
)
QUICK = {"bench_readers.py": ["--quick"], "bench_spark.py": ["--quick"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", choices=BENCHMARKS, help="a subset, in this order")
    args = ap.parse_args()
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    parts = [f"# Benchmarks, one run ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n"]
    failed = []
    for name in args.only or BENCHMARKS:
        t0 = time.perf_counter()
        p = subprocess.run(
            [sys.executable, str(HERE / name), *(QUICK.get(name, []) if args.quick else [])],
            capture_output=True,
            text=True,
        )
        took = time.perf_counter() - t0
        print(p.stdout, end="", flush=True)
        if p.returncode:
            failed.append(name)
            print(p.stderr[-3000:], file=sys.stderr)
        parts.append(f"## {name} ({took:.0f} s{', FAILED' if p.returncode else ''})\n\n```\n{p.stdout.strip()}\n```\n")
    (out / "summary.md").write_text("\n".join(parts))
    print(f"summary: {out / 'summary.md'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
