"""spark.read.format("rabbitcq") on a standalone cluster (a master and one 1-core worker on
127.0.0.1, started as bench/bench_spark.py starts them): the executor's Python workers import
this checkout and decode with the compiled core, the rows equal the embedded reader's, and no
process the cluster started survives it. About 30 s."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cqforensics
from support import ROOT, SAMPLES, skip_or_fail

sys.path.insert(0, str(ROOT / "bench"))
from bench_spark import python_path, standalone_cluster  # noqa: E402

pytestmark = pytest.mark.spark

DRIVER = textwrap.dedent("""
    import json, sys
    import cqforensics
    from pyspark.sql import SparkSession
    url, path, stats = sys.argv[1:4]
    s = (SparkSession.builder.master(url).config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.executor.cores", "1").config("spark.executor.memory", "1g")
         .config("spark.executorEnv.PYTHONPATH", sys.argv[4]).config("spark.executorEnv.CQF_SPARK_TASK_STATS", stats)
         .config("spark.pyspark.python", sys.executable).config("spark.sql.session.timeZone", "UTC").getOrCreate())
    got = s.read.format("rabbitcq").option("maxPartitionBytes", "20000").load(path).toArrow()
    want = cqforensics.read_table(path, "messages")
    print(json.dumps({"rows": got.num_rows, "equal": got.equals(want)}))
    s.stop()
""")


def _groups() -> dict[int, int]:
    """pid -> process group of every live process."""
    out = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        out[int(stat.split("/")[2])] = int(fields[2])
    return out


def _cluster_groups(url: str) -> set[int]:
    """Process groups of the live master and workers of the cluster at ``url`` (by its port)."""
    port, groups, out = url.rsplit(":", 1)[1], _groups(), set()
    for pid, group in groups.items():
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if ("deploy.master" in line and f"--port {port}" in line) or ("deploy.worker" in line and url in line):
            out.add(group)
    return out


def test_standalone_cluster_reads_with_the_core(tmp_path):
    if shutil.which("java") is None:
        skip_or_fail("Spark tests need Java 17+ (java is not on PATH)")
    path, stats = str(SAMPLES / "4.3.6-clean"), tmp_path / "stats"
    stats.mkdir()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=python_path())
    with standalone_cluster(workers=1) as url:
        p = subprocess.run(
            [sys.executable, "-c", DRIVER, url, path, str(stats), python_path()],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        groups = _cluster_groups(url)
        assert len(groups) == 2  # the master's and the worker's (its executors and Python workers run in it)
    assert not groups & set(_groups().values()), "a process of the cluster survived it"
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result == {"rows": cqforensics.read_table(path, "messages").num_rows, "equal": True}
    tasks = [json.loads(f.read_text()) for f in stats.glob("*.json")]
    assert len(tasks) > 1  # maxPartitionBytes split the read
    assert {t["core"] for t in tasks} == {"on"}, "the executors' Python workers run without the compiled core"
    assert sum(t["core_rows"] for t in tasks) > 0
    assert sum(t["rows"] for t in tasks) == result["rows"]
