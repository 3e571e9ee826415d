"""CPU per test, of the test's process and of every process it started (brokers, JVMs, CLI runs,
Spark's Python workers), for finding what makes the suite cost what it costs (docs/testing.md).

    CQF_CPUPROF=/tmp/prof PYTHONPATH=tests python3 -m pytest -p support.cpuprof   # a JSON line a test
    python3 tests/support/cpuprof.py /tmp/prof [N]                   # CPU by layer and file, top N

Each pytest process (each xdist worker) moves itself into a cgroup (v1 ``cpuacct``) of its own at
start, so every process it starts is counted there, including those that outlive their parent:
a killed broker's Erlang VM is orphaned when its shell dies with it, so ``getrusage`` never sees
it, and the JVM of a Spark session lives across tests. Each line: the test's id, ``cpu`` (the
group's CPU seconds during the test, its set-up and tear-down), ``self`` (the pytest process's
own) and ``wall``. A module or session fixture's cost falls to the first test that uses it.
``PYTHONPATH=tests``: a ``-p`` plugin is imported before the conftest puts ``tests`` on the
path. Needs root and a cgroup v1 ``cpuacct`` hierarchy; without them the plugin says so and counts
nothing. Measurement only: nothing in the suite loads it.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_group: Path | None = None


def _usage() -> float:
    return int((_group / "cpuacct.usage").read_text()) / 1e9


def _own() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def pytest_configure(config):
    global _group
    if not os.environ.get("CQF_CPUPROF"):
        return
    group = CPUACCT / f"cqforensics-{_worker()}-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as e:
        print(f"support.cpuprof: no CPU counted (a cgroup v1 cpuacct group is needed: {e})", file=sys.stderr)
        return
    _group = group


def pytest_unconfigure(config):
    """Back to the root group, and the group removed (kept while a process it counts, say an
    orphaned broker VM, still lives)."""
    if _group is None:
        return
    try:
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
        _group.rmdir()
    except OSError:
        pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Counts around the whole protocol of a test: set-up, call, tear-down."""
    if _group is None:
        yield
        return
    cpu, own, t = _usage(), _own(), time.monotonic()
    yield
    line = {
        "id": item.nodeid,
        "cpu": round(_usage() - cpu, 3),
        "self": round(_own() - own, 3),
        "wall": round(time.monotonic() - t, 3),
    }
    with open(Path(os.environ["CQF_CPUPROF"]) / f"{_worker()}.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def summary(out: Path, top: int = 30) -> str:
    """CPU by layer (the test folder) and by file, the most costly first."""
    rows = [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines()]
    by_layer: dict[str, list[float]] = {}
    by_file: dict[str, list[float]] = {}
    for r in rows:
        path = r["id"].split("::")[0]
        for key, table in ((path.split("/")[1] if "/" in path else path, by_layer), (path, by_file)):
            t = table.setdefault(key, [0.0, 0.0, 0])
            t[0] += r["cpu"]
            t[1] += r["self"]
            t[2] += 1
    total = sum(r["cpu"] for r in rows)
    lines = [f"{len(rows)} tests, {total:,.0f} CPU-s (the pytest processes' own: {sum(r['self'] for r in rows):,.0f})"]
    for title, table, n in (("layer", by_layer, len(by_layer)), ("file", by_file, top)):
        lines.append(f"\n{'CPU-s':>8} {'own':>7} {'tests':>5}  {title}")
        for key, (cpu, own, count) in sorted(table.items(), key=lambda kv: -kv[1][0])[:n]:
            lines.append(f"{cpu:8.1f} {own:7.1f} {count:5d}  {key}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 30))
