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

#: The JVMs tests start (Spark sessions in-process and in subprocesses, a standalone cluster's
#: master, worker and executors) run for seconds to a minute: the C1 compiler alone and the serial
#: collector cost them about a quarter less CPU than the server JIT and the parallel collector,
#: measured on a session start and twelve reads (17.1 -> 12.4 CPU-s to start). An operator's JVM
#: is left as it is: only the test run sets this, and a value set already is kept.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


def pytest_configure(config):
    """Compile this checkout's modules once, before any worker starts. Where
    PYTHONDONTWRITEBYTECODE is set (as on the project's VMs), every Python process the suite starts
    (CLI runs, Spark's planner and worker processes) otherwise compiles the ~90
    modules it imports from source: 0.5 of the 1.1 CPU-s an import of the CLI takes. Writing
    ``__pycache__`` into the checkout is the test run's own output (ignored by git)."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller compiled already
        return
    import compileall

    for package in ("cqforensics", "cli", "spark_datasource", "pyspark_rabbitcq", "brokers", "fuzz", "tests/support"):
        compileall.compile_dir(str(ROOT / package), quiet=1)


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
    if os.environ.get("CQF_KEEP_BROKER_DIRS"):  # the node a failing case left, to boot and compare by hand
        print(f"broker dir kept: {base}")
        return
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
