"""Shared fixtures. Tests that need a real broker or Java skip with the reason when it is not
available here; with CQF_NO_SKIP=1 (set by .ci/run) such a skip is a failure instead."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_data"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from oracle import datasets, extract_archives, manifest  # noqa: E402

extract_archives()  # datasets committed as their node-dir archive are unpacked before any test reads them

NO_SKIP = os.environ.get("CQF_NO_SKIP") == "1"


def skip_or_fail(why: str) -> None:
    if NO_SKIP:
        pytest.fail(f"CQF_NO_SKIP=1 but {why}")
    pytest.skip(why)


def need_broker(version: str) -> None:
    from brokers import runtime

    why = runtime(version).unavailable()
    if why:
        skip_or_fail(why)


def copy_node(dataset: str, dest: Path) -> Path:
    """A private copy of a sample's mnesia base; returns the node dir inside it."""
    shutil.copytree(SAMPLES / dataset / "mnesia", dest, symlinks=True)
    return dest / Path(manifest(dataset)["node_dir"]).name


def streams_beside_two_vhosts(dest: Path) -> Path:
    """A node dir of two vhosts (``/`` and ``staging/ü``, 4.3.6-kill) holding the streams of
    4.3.6-streams-clean: a composite of two real node dirs (the streams' queues are not in this
    node's metadata, so the default vhost lists them); returns its mnesia base."""
    node = copy_node("4.3.6-kill", dest)
    streams = SAMPLES / "4.3.6-streams-clean" / "mnesia" / Path(manifest("4.3.6-streams-clean")["node_dir"]).name
    shutil.copytree(streams / "stream", node / "stream")
    return dest


@pytest.fixture
def broker_dir(tmp_path_factory):
    """A temp dir the broker's rabbitmq user can enter (pytest's own tmp root is 0700)."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="cqf-broker-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=datasets())
def dataset(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def spark():
    """One local[2] session for the whole run. Workers must import this checkout: PYTHONPATH
    is exported before the JVM starts (Spark's static data-source lookup scans the workers'
    sys.path for pyspark_* modules)."""
    if shutil.which("java") is None:
        skip_or_fail("Spark tests need Java 17+ (java is not on PATH)")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["TZ"] = "UTC"
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    from pyspark.sql import SparkSession

    s = (SparkSession.builder.master("local[2]").appName("cqforensics-tests")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .config("spark.default.parallelism", "2").config("spark.sql.session.timeZone", "UTC")
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


__all__ = ["ROOT", "SAMPLES", "need_broker", "skip_or_fail", "copy_node", "datasets", "manifest"]
