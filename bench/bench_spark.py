#!/usr/bin/env python3
"""Spark benchmark: ``rabbitcq`` messages against Parquet holding the same rows, in local[1],
local[2] and on a standalone cluster (a master and 2 workers of 1 core each, on 127.0.0.1).

    python bench/bench_spark.py                      # needs the benchmark store (bench/make_store.py), Java 17
    python bench/bench_spark.py --quick              # one run per query instead of best of 3
    python bench/bench_spark.py --modes local1 standalone

Queries: ``count()`` and ``sum(length(body))`` over the messages table; ``sum(size)`` too for
the sources that have it. Sources:

* ``rabbitcq``: the full read (every column; a Python data source cannot prune columns, so a
  ``count()`` reads and hands over the bodies as well);
* ``rabbitcq narrowed``: ``.schema(...)`` without ``body`` or decoded columns (the opt-in column
  pruning): no body read or decode;
* ``parquet``: Spark's own reader of a Parquet copy, written once from the rabbitcq read and
  cached beside the store;
* ``arrow source``: a minimal Python data source yielding that Parquet copy's rows as Arrow
  batches (pyarrow reads them in the Python worker): what any Python data source pays Spark for
  the same rows, with almost no reading of its own. rabbitcq - arrow source = our reader;
  arrow source - parquet = Spark's Python data source path (Arrow hand-over, JVM).

Each query runs in one fresh session per mode, best of 3; figures are wall-clock seconds. The
tasks of the last run of each rabbitcq query record (``CQF_SPARK_TASK_STATS``) whether the
compiled core decoded the rows, and how long the reader took apart from Spark's handling of
its batches in the Python worker. Results: ``bench/results/spark.json`` and ``spark.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from make_store import build, build_clean, clean_node_dir, node_dir, store_dir  # noqa: E402

SCALE = [1.0]  # the store's scale (main sets it)

MODES = {"local1": "local[1]", "local2": "local[2]", "standalone": "standalone (2 workers x 1 core)"}
WORKERS, WORKER_MEMORY, EXECUTOR_MEMORY = 2, "3g", "2g"

CHILD = r"""
import glob, json, os, shutil, sys, time
master, node, parquet, runs, stats_dir = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
conf = json.loads(sys.argv[6])
clean_node = sys.argv[7]  # the store's cleanly stopped twin (make_store.build_clean)
import pyarrow as pa, pyarrow.parquet as pq
from pyspark.sql import SparkSession, functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from spark_datasource.source import TASK_STATS, _timed

b = SparkSession.builder.master(master)
for k, v in {"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC", "spark.driver.memory": "4g",
             "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1", **conf}.items():
    b = b.config(k, v)
spark = b.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
if not os.path.exists(parquet):
    spark.read.format("rabbitcq").load(node).write.parquet(parquet)
SCHEMA = spark.read.format("rabbitcq").load(node).schema


class ArrowSource(DataSource):
    # the Parquet copy's files, one per partition, read by pyarrow in the Python worker
    @classmethod
    def name(cls):
        return "arrowsource"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        return ArrowReader(self.options["path"], schema)


class ArrowReader(DataSourceReader):
    def __init__(self, path, schema):
        self.files, self.schema = sorted(glob.glob(os.path.join(path, "*.parquet"))), schema

    def partitions(self):
        return [InputPartition(f) for f in self.files]

    def read(self, partition):
        from pyspark.sql.pandas.types import to_arrow_schema
        try:
            expected = to_arrow_schema(self.schema, timezone="UTC")
        except TypeError:
            expected = to_arrow_schema(self.schema)
        batches = (pa.RecordBatch.from_arrays([c.cast(f.type) for c, f in zip(batch.columns, expected)],
                                              schema=expected)
                   for batch in pq.ParquetFile(partition.value).iter_batches(batch_size=8192))
        stats = os.environ.get(TASK_STATS)
        yield from _timed(batches, stats, 1) if stats else batches


spark.dataSource.register(ArrowSource)
NARROW = "vhost STRING, queue STRING, seq_id BIGINT, size BIGINT, survives_restart BOOLEAN"
sources = {"rabbitcq": lambda: spark.read.format("rabbitcq").load(node),
           "rabbitcq narrowed": lambda: spark.read.format("rabbitcq").schema(NARROW).load(node),
           "parquet": lambda: spark.read.parquet(parquet),
           "arrow source": lambda: spark.read.format("arrowsource").load(parquet),
           "rabbitcq, cleanly stopped": lambda: spark.read.format("rabbitcq").load(clean_node),
           "rabbitcq narrowed, cleanly stopped": lambda: spark.read.format("rabbitcq").schema(NARROW).load(clean_node)}
queries = {"count": lambda df: df.count(),
           "sum(length(body))": lambda df: df.agg(F.sum(F.length("body"))).collect()[0][0],
           "sum(size)": lambda df: df.agg(F.sum("size")).collect()[0][0]}
# which queries each source runs: the narrowed read has no body column
wanted = {"rabbitcq": ("count", "sum(length(body))"), "rabbitcq narrowed": ("count", "sum(size)"),
          "parquet": ("count", "sum(length(body))", "sum(size)"), "arrow source": ("count", "sum(length(body))"),
          "rabbitcq, cleanly stopped": ("count", "sum(length(body))"),
          "rabbitcq narrowed, cleanly stopped": ("count", "sum(size)")}
# warm up every executor's Python worker (the imports) and the JVM's Arrow and Parquet paths
sources["rabbitcq"]().count()
sources["parquet"]().count()
sources["arrow source"]().limit(1).collect()
out = {}
for s in ("rabbitcq", "arrow source"):  # planning alone: the schema and partitions() in Python planning workers
    best = None
    for _ in range(runs):
        t0 = time.perf_counter()
        sources[s]().agg(F.sum(F.length("body")))._jdf.queryExecution().executedPlan()
        best = min(best or 1e9, time.perf_counter() - t0)
    out[f"{s} planning"] = {"seconds": best, "value": None}
for s, make in sources.items():
    for q in wanted[s]:
        best, value = None, None
        for _ in range(runs):
            shutil.rmtree(stats_dir, ignore_errors=True)
            os.makedirs(stats_dir)
            t0 = time.perf_counter()
            value = queries[q](make())
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        out[f"{s} {q}"] = {"seconds": best, "value": value}
        tasks = [json.load(open(p)) for p in glob.glob(os.path.join(stats_dir, "*.json"))]
        if tasks:  # the last run's tasks (the Python sources)
            out[f"{s} {q}"]["tasks"] = {
                "tasks": len(tasks), "workers": len({t["pid"] for t in tasks}),
                "core": sorted({t["core"] for t in tasks}), "last_run_s": dt,
                **{k: sum(t[k] for t in tasks) for k in ("rows", "arrow_bytes", "core_rows", "reference_rows",
                                                         "task_s", "reader_s", "spark_s", "gc_collections",
                                                         "gc_full", "gc_s")}}
print(json.dumps(out))
spark.stop()
"""


def python_path() -> str:
    return os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> Path:
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists():
        raise SystemExit(f"{home}: no bin/spark-class in the installed pyspark")
    return home


@contextmanager
def standalone_cluster(workers: int = WORKERS):
    """``spark://127.0.0.1:<port>`` of a master and ``workers`` workers of 1 core each, every
    process (and the executors they start) killed on exit."""
    home = spark_home()
    tmp = Path(tempfile.mkdtemp(prefix="cqf-spark-cluster-"))
    env = dict(
        os.environ,
        SPARK_HOME=str(home),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_WORKER_DIR=str(tmp / "work"),
        SPARK_LOG_DIR=str(tmp / "logs"),
        SPARK_PID_DIR=str(tmp),
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=python_path(),
    )
    spark_class = str(home / "bin" / "spark-class")
    port, ui = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    procs: list[tuple[str, subprocess.Popen]] = []

    def start(name: str, *args: str) -> None:
        log = open(tmp / f"{name}.log", "wb")
        # a session of its own: the whole group (launcher, JVM, executors, Python workers) is killed at the end
        procs.append(
            (
                name,
                subprocess.Popen(
                    [spark_class, *args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                ),
            )
        )
        log.close()

    try:
        start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui),
        )
        for i in range(workers):
            start(
                f"worker{i}",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                WORKER_MEMORY,
                "--webui-port",
                str(free_port()),
                url,
            )
        _wait_for_workers(ui, workers, procs, tmp)
        yield url
    finally:
        for _, p in procs:
            _kill_group(p, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for _, p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _kill_group(p, signal.SIGKILL)  # the executors of a worker that did not stop them
            p.wait()
        _wait_gone([p.pid for _, p in procs])
        shutil.rmtree(tmp, ignore_errors=True)


def _kill_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(groups: list[int], timeout: float = 30.0) -> None:
    """Until no process of ``groups`` is left (killed members take a moment to exit)."""
    deadline = time.monotonic() + timeout
    for g in groups:
        while time.monotonic() < deadline:
            try:
                os.killpg(g, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            print(f"warning: process group {g} of the Spark cluster still has processes", file=sys.stderr)


def _wait_for_workers(ui: int, workers: int, procs, tmp: Path, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, p in procs:
            if p.poll() is not None:
                raise SystemExit(f"spark {name} exited ({p.returncode}):\n{(tmp / f'{name}.log').read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as r:
                state = json.load(r)
            if sum(w.get("state") == "ALIVE" for w in state.get("workers", [])) >= workers:
                return
        except (OSError, ValueError):
            pass  # the master's UI is not up yet
        time.sleep(1)
    raise SystemExit(
        f"{workers} workers did not register with the master in {timeout:.0f}s:\n"
        f"{(tmp / 'master.log').read_text()[-3000:]}"
    )


def run(master: str, node: Path, parquet: Path, runs: int, conf: dict | None = None) -> dict:
    stats = Path(tempfile.mkdtemp(prefix="cqf-spark-tasks-"))
    conf = {
        "spark.executorEnv.PYTHONPATH": python_path(),
        "spark.executorEnv.CQF_SPARK_TASK_STATS": str(stats),
        "spark.pyspark.python": sys.executable,
        **(conf or {}),
    }
    env = dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=python_path(),
        CQF_SPARK_TASK_STATS=str(stats),
    )
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                master,
                str(node),
                str(parquet),
                str(runs),
                str(stats),
                json.dumps(conf),
                str(clean_node_dir(SCALE[0])),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
    finally:
        shutil.rmtree(stats, ignore_errors=True)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_mode(mode: str, node: Path, parquet: Path, runs: int) -> dict:
    if mode != "standalone":
        return run(MODES[mode], node, parquet, runs)
    with standalone_cluster() as url:
        return run(
            url,
            node,
            parquet,
            runs,
            {"spark.executor.cores": "1", "spark.cores.max": str(WORKERS), "spark.executor.memory": EXECUTOR_MEMORY},
        )


def embedded_read(node: Path, runs: int) -> float:
    """The full messages read by the Python API in this process, no Spark (best of ``runs``)."""
    sys.path.insert(0, str(ROOT))
    import cqforensics

    best = None
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in cqforensics.iter_batches(node, "messages"):
            pass
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best


def report(results: dict, embedded: float) -> str:
    modes = list(results)
    first = results[modes[0]]
    lines = ["| query | " + " | ".join(MODES[m] for m in modes) + " |", "|---" * (len(modes) + 1) + "|"]
    for key in first:
        lines.append(f"| {key} | " + " | ".join(f"{results[m][key]['seconds']:.2f} s" for m in modes) + " |")
    for src in ("rabbitcq", "rabbitcq narrowed", "arrow source"):
        for q in ("count", "sum(length(body))", "sum(size)"):
            if f"{src} {q}" in first:
                lines.append(
                    f"| {src} / parquet, {q} | "
                    + " | ".join(
                        f"{results[m][f'{src} {q}']['seconds'] / results[m][f'parquet {q}']['seconds']:.1f}x"
                        for m in modes
                    )
                    + " |"
                )
    for src in ("rabbitcq", "rabbitcq narrowed"):
        for q in ("count", "sum(length(body))", "sum(size)"):
            if f"{src}, cleanly stopped {q}" in first:
                lines.append(
                    f"| {src}: cleanly stopped / killed, {q} | "
                    + " | ".join(
                        f"{results[m][f'{src}, cleanly stopped {q}']['seconds'] / results[m][f'{src} {q}']['seconds']:.2f}x"
                        for m in modes
                    )
                    + " |"
                )
    lines += [
        "",
        f"The same full messages read without Spark (Python API, one process): {embedded:.2f} s.",
        "",
        (
            "The Python sources' tasks in the full read, sum(length(body)), last run; seconds summed over "
            "tasks. reader: making the batches (rabbitcq: scan, core decode, Arrow columns; arrow source: "
            "pyarrow reading Parquet); hand-over: Spark's code in the Python worker between batches (Arrow "
            "IPC to the JVM, blocked while the JVM consumes):"
        ),
        "",
        (
            "| mode | source | wall | tasks | Python workers | rows by core / reference | task | reader | "
            "hand-over | GC runs (full) | GC time |"
        ),
        "|---" * 11 + "|",
    ]
    for m in modes:
        for src in ("rabbitcq", "arrow source"):
            t = results[m][f"{src} sum(length(body))"].get("tasks")
            if not t:
                continue
            core = (
                f"{t['core_rows']:,} / {t['reference_rows']:,} (core {', '.join(t['core'])})"
                if src == "rabbitcq"
                else "-"
            )
            lines.append(
                f"| {MODES[m]} | {src} | {t['last_run_s']:.2f} s | {t['tasks']} | {t['workers']} | {core} | "
                f"{t['task_s']:.2f} s | {t['reader_s']:.2f} s | {t['spark_s']:.2f} s | "
                f"{t['gc_collections']} ({t['gc_full']}) | {t['gc_s'] * 1000:.0f} ms |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one run per query instead of best of 3")
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--scale", type=float, default=1.0, help="the bench store's scale (make_store.py)")
    args = ap.parse_args()
    runs = 1 if args.quick else 3
    build(args.scale)
    build_clean(store_dir(args.scale))
    SCALE[0] = args.scale
    node, parquet = node_dir(args.scale), store_dir(args.scale) / "messages.parquet"
    results = {m: run_mode(m, node, parquet, runs) for m in args.modes}
    for m, r in results.items():  # every mode and source answers the same
        for q in ("count", "sum(length(body))", "sum(size)"):
            values = {r[k]["value"] for k in r if k.endswith(f" {q}")}
            assert len(values) == 1, f"{m}: {q} differs between sources: {values}"
    text = report(results, embedded_read(node, runs))
    print(text, end="")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "spark.json").write_text(json.dumps(results, indent=1))
    (HERE / "results" / "spark.md").write_text(
        f"# Spark ({'one run' if args.quick else 'best of 3'}, {time.strftime('%Y-%m-%d', time.gmtime())})\n\n{text}"
    )


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f}s in all)")
