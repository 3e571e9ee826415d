"""Shared fixtures (the shared helpers are in ``support``)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
# ``support`` (the shared helpers) for every test, wherever it sits; and the checkout's root, for
# ``fuzz`` and ``brokers`` (not installed with the package). No test imports another test module.
sys.path[:0] = [str(_TESTS.parent), str(_TESTS)]

from support import ROOT, dataset_params, skip_or_fail  # noqa: E402
from support.oracle import extract_archives  # noqa: E402

extract_archives()  # datasets committed as their node-dir archive are unpacked before any test reads them


def pytest_collection_modifyitems(items):
    """A test that takes the ``spark`` session is a ``spark`` test, marked or not (the fast tier
    leaves Spark out)."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)


@pytest.fixture
def broker_dir(tmp_path_factory):
    """A temp dir the broker's rabbitmq user can enter (pytest's own tmp root is 0700)."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="cqf-broker-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=dataset_params())
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

    s = (
        SparkSession.builder.master("local[2]")
        .appName("cqforensics-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()
