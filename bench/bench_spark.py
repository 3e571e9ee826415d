#!/usr/bin/env python3
"""Spark benchmark: ``rabbitcq`` messages vs Parquet holding the same rows, local[1] and local[2].

    python bench/bench_spark.py        # needs the benchmark store (bench/make_store.py) and Java 17

Queries: ``count()`` and ``sum(length(body))`` over the messages table. The Parquet copy is
written once (from the rabbitcq read) and cached beside the store. A third source reads
rabbitcq with a narrowed schema (``.schema(...)`` without ``body`` or decoded columns, the
opt-in column pruning): its ``count()`` and ``sum(size)`` (the index's message size) need no
body read or decode. Each query runs in a fresh
session per core count, best of 3; figures are wall-clock seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from make_store import build, node_dir, store_dir  # noqa: E402

CHILD = r"""
import json, os, sys, time
cores, node, parquet = sys.argv[1], sys.argv[2], sys.argv[3]
from pyspark.sql import SparkSession, functions as F
spark = (SparkSession.builder.master(f"local[{cores}]").config("spark.ui.enabled", "false")
         .config("spark.sql.session.timeZone", "UTC").config("spark.driver.memory", "4g").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
if not os.path.exists(parquet):
    spark.read.format("rabbitcq").load(node).write.parquet(parquet)
NARROW = "vhost STRING, queue STRING, seq_id BIGINT, size BIGINT, survives_restart BOOLEAN"
sources = {"rabbitcq": lambda: spark.read.format("rabbitcq").load(node),
           "parquet": lambda: spark.read.parquet(parquet),
           "rabbitcq narrowed": lambda: spark.read.format("rabbitcq").schema(NARROW).load(node)}
queries = {"count": lambda df: df.count(),
           "sum(length(body))": lambda df: df.agg(F.sum(F.length("body"))).collect()[0][0],
           "sum(size)": lambda df: df.agg(F.sum("size")).collect()[0][0]}
# which queries each source runs: the narrowed read has no body column
wanted = {"rabbitcq": ("count", "sum(length(body))"), "parquet": ("count", "sum(length(body))", "sum(size)"),
          "rabbitcq narrowed": ("count", "sum(size)")}
sources["rabbitcq"]().limit(1).collect()  # warm up: the data source lookup and the Python workers
out = {}
for s, make in sources.items():
    for q in wanted[s]:
        run = queries[q]
        best, value = None, None
        for _ in range(3):
            t0 = time.perf_counter()
            value = run(make())
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        out[f"{s} {q}"] = {"seconds": best, "value": value}
print(json.dumps(out))
"""


def run(cores: int, node: Path, parquet: Path) -> dict:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                        if p]))
    out = subprocess.run([sys.executable, "-c", CHILD, str(cores), str(node), str(parquet)], env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    build(1.0)
    node, parquet = node_dir(1.0), store_dir(1.0) / "messages.parquet"
    results = {c: run(c, node, parquet) for c in (1, 2)}
    print(f"{'query':<34} {'1 core':>9} {'2 cores':>9} {'speed-up':>9}")
    for key in results[1]:
        a, b = results[1][key]["seconds"], results[2][key]["seconds"]
        print(f"{key:<34} {a:>8.2f}s {b:>8.2f}s {a / b:>8.2f}x")
    for q in ("count", "sum(length(body))"):
        for c in (1, 2):
            r = results[c][f"rabbitcq {q}"]["seconds"] / results[c][f"parquet {q}"]["seconds"]
            print(f"rabbitcq / parquet, {q}, {c} core(s): {r:.1f}x")
        assert results[1][f"rabbitcq {q}"]["value"] == results[1][f"parquet {q}"]["value"]
    for q in ("count", "sum(size)"):
        for c in (1, 2):
            r = results[c][f"rabbitcq narrowed {q}"]["seconds"] / results[c][f"parquet {q}"]["seconds"]
            print(f"rabbitcq narrowed / parquet, {q}, {c} core(s): {r:.1f}x")
        assert results[1][f"rabbitcq narrowed {q}"]["value"] == results[1][f"parquet {q}"]["value"]
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "spark.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f}s in all)")
