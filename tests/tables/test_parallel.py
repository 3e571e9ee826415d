"""Every core (``-j N`` / ``jobs=N``, ``cqforensics.base.parallel``): the map itself (order, errors,
interrupts, no orphan process), and the same output as ``-j 1``, in the same order, on the
samples with every vhost split as a big one is (the thresholds forced to 0: every vhost's
listing in ranges, its indexes, its store's files and the inputs' hashes by the workers), with
and without id shares. Speed is measured in ``bench/bench_jobs.py``, not here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

import cqforensics
from cli.main import main
from cqforensics.base import parallel
from cqforensics.base.errors import FormatError, UsageError
from cqforensics.checks import vhost as checks_vhost
from cqforensics.commands import fsck
from cqforensics.model import store as model_store
from cqforensics.model import vhost as model_vhost
from cqforensics.model.vhost import VhostScan
from cqforensics.output import provenance
from cqforensics.read import driver
from support import ROOT, SAMPLES

AS_OF = 1_900_000_000_000
#: a killed 4.x node (CQv2, .qs and shared store), a 3.10 node with small v1 segments, a clean
#: 3.10 node (recorded state), and a 4.3.6 store rolled over many files
SPLIT_SAMPLES = ("4.3.6-kill", "3.10.8-segments", "3.10.8-clean", "4.3.6-rolled")


@pytest.fixture
def split_everything(monkeypatch):
    """Every vhost read and checked as a big one is with ``jobs`` > 1."""
    monkeypatch.setattr(driver, "SPLIT_BYTES", 0)
    monkeypatch.setattr(checks_vhost, "SPLIT_BYTES", 0)
    monkeypatch.setattr(model_vhost, "PARALLEL_INDEX_BYTES", 0)
    monkeypatch.setattr(model_store, "PARALLEL_WALK_BYTES", 0)
    monkeypatch.setattr(fsck, "SMALL_VHOST", 0)
    monkeypatch.setattr(provenance, "PARALLEL_BYTES", 0)


# -- the map ------------------------------------------------------------------------------------


def _uneven(t):
    time.sleep(0.02 * ((7 * t) % 5))  # later tasks often finish first
    for i in range(3):
        yield (t, i)


def test_items_come_in_task_order_whatever_finishes_first():
    got = list(parallel.ordered(range(12), _uneven, 3))
    assert got == [(t, i) for t in range(12) for i in range(3)]


def _big(t):
    yield np.full(1 << 20, t, np.int64)  # 8 MB: sent through a memfd, mapped by the caller


def test_big_items_travel_whole_and_a_full_buffer_waits():
    got = list(parallel.ordered(range(6), _big, 2, buffer=1 << 20))
    assert [int(a[0]) for a in got] == list(range(6)) and all((a == a[0]).all() and len(a) == 1 << 20 for a in got)


def _failing(t):
    yield t
    if t == 3:
        raise FormatError("torn", "/x/0.rdq", 17)
    if t == 5:
        raise ZeroDivisionError("a bug")


def test_an_error_comes_at_its_place_as_itself():
    got = []
    with pytest.raises(FormatError) as e:
        for item in parallel.ordered(range(8), _failing, 2):
            got.append(item)
    assert got == [0, 1, 2, 3]  # what -j 1 yields before the error
    assert (e.value.path, e.value.offset, e.value.exit_code, str(e.value)) == ("/x/0.rdq", 17, 8, "/x/0.rdq@0x11: torn")
    with pytest.raises(parallel.WorkerError) as bug:
        list(parallel.ordered([4, 5], _failing, 2))
    assert "ZeroDivisionError: a bug" in str(bug.value) and "Traceback" in bug.value.details


def _usage(t):
    raise UsageError("bad")
    yield


def test_a_usage_error_keeps_its_exit_code():
    with pytest.raises(UsageError) as e:
        list(parallel.ordered([1, 2], _usage, 2))
    assert e.value.exit_code == 16


def _children() -> set[int]:
    me = os.getpid()
    out = set()
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.add(int(p))
            except (OSError, ValueError, IndexError):
                continue
    return out


def test_stopping_early_leaves_no_process():
    before = _children()
    g = parallel.ordered(range(100), _uneven, 2)
    next(g)
    g.close()
    assert _children() == before


def _touching(task):
    where, t = task
    (where / str(t)).write_text("done")
    yield t


def test_a_started_map_works_before_it_is_taken(tmp_path):
    """``parallel.started``: its workers run their tasks while the caller does something else
    (the inputs manifest hashed beside fsck's checks); the items come as ``ordered`` gives them."""
    before = _children()
    items = parallel.started([(tmp_path, t) for t in range(3)], _touching, 3)
    deadline = time.monotonic() + 30
    while len(list(tmp_path.iterdir())) < 3:  # one task a worker: every one done, nothing taken yet
        assert time.monotonic() < deadline, "the started workers did not run their tasks"
        time.sleep(0.05)
    assert list(items) == [0, 1, 2]
    assert _children() == before
    with pytest.raises(RuntimeError):
        list(items)


def test_a_started_map_left_or_dropped_leaves_no_process():
    before = _children()
    items = parallel.started(range(50), _uneven, 2)
    it = iter(items)
    next(it)
    it.close()
    assert _children() == before
    items = parallel.started(range(50), _uneven, 2)
    del items  # never taken
    assert _children() == before


def _nested(t):
    yield from parallel.ordered(range(3), lambda k: [(os.getpid(), t, k)], 4)


def test_a_map_in_a_worker_runs_in_it():
    got = list(parallel.ordered(range(4), _nested, 2))
    assert [(t, k) for _, t, k in got] == [(t, k) for t in range(4) for k in range(3)]
    for t in range(4):  # each task's inner map ran in its one worker: never more than -j processes
        assert len({pid for pid, tt, _ in got if tt == t}) == 1


_INTERRUPTED = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    from cli import main as m
    from cqforensics.base import parallel

    def work(t):
        os.write(1, f"{os.getpid()}\\n".encode())  # one write: the two workers' lines never mix
        time.sleep(120)
        yield t

    def fake_main(argv=None):
        for _ in parallel.ordered(range(4), work, 2):
            pass
        return 0

    m.main = fake_main
    m.run()
""")


def _workers(proc, n: int) -> list[int]:
    return [int(proc.stdout.readline()) for _ in range(n)]


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # dead, not yet reaped by its new parent
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_ctrl_c_exits_32_and_leaves_no_worker():
    proc = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED, str(ROOT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        workers = _workers(proc, 2)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
        assert proc.wait(timeout=30) == 32
        assert proc.stderr.read().strip().splitlines() == ["cqforensics: interrupted"]
        assert all(_gone(w, 0.5) for w in workers)  # reaped by the command itself
    finally:
        proc.kill()
        proc.wait()


def test_killing_the_command_kills_its_workers():
    proc = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED, str(ROOT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        workers = _workers(proc, 2)
        proc.kill()  # kill -9: no handler runs; the kernel kills the workers (PR_SET_PDEATHSIG)
        proc.wait()
        assert all(_gone(w) for w in workers)
    finally:
        proc.kill()
        proc.wait()


# -- the same output ------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", SPLIT_SAMPLES)
def test_every_table_is_the_same_with_jobs(split_everything, dataset):
    path = SAMPLES / dataset
    for table in cqforensics.TABLES:
        one = cqforensics.read_table(path, table, as_of=AS_OF)
        two = cqforensics.read_table(path, table, as_of=AS_OF, jobs=2)
        assert two.equals(one), (dataset, table)


def test_a_read_in_shares_is_the_same_with_jobs(split_everything, monkeypatch):
    monkeypatch.setattr(VhostScan, "shares", property(lambda self: 3))  # every vhost in 3 id shares
    for table in ("messages", "index", "store", "findings", "queues"):
        one = cqforensics.read_table(SAMPLES / "4.3.6-kill", table, as_of=AS_OF)
        two = cqforensics.read_table(SAMPLES / "4.3.6-kill", table, as_of=AS_OF, jobs=2)
        assert two.equals(one), table


def _fsck_json(capsys, *argv) -> dict:
    assert main(["fsck", "--json", "--as-of", str(AS_OF), *argv]) in (0, 4)
    doc = json.loads(capsys.readouterr().out)
    doc["provenance"]["created"] = None
    return doc


@pytest.mark.parametrize("dataset", SPLIT_SAMPLES[:2])
def test_fsck_deep_is_the_same_with_jobs(split_everything, capsys, dataset):
    path = str(SAMPLES / dataset)
    assert _fsck_json(capsys, "--deep", "-j", "2", path) == _fsck_json(capsys, "--deep", "-j", "1", path)


def test_cli_outputs_are_the_same_byte_for_byte(split_everything, capsys, tmp_path):
    """Text tables and Parquet files are laid out by rows, never by how batches were cut."""
    src = str(SAMPLES / "4.3.6-kill")
    outs = {}
    for j in ("1", "2"):
        for fmt in ("table", "jsonl"):
            assert main(["read", src, "--as-of", str(AS_OF), "--format", fmt, "-j", j]) == 0
            outs[(fmt, j)] = capsys.readouterr().out
        assert (
            main(
                [
                    "read",
                    src,
                    "--as-of",
                    str(AS_OF),
                    "--format",
                    "parquet",
                    "--out",
                    str(tmp_path / f"m{j}.parquet"),
                    "-j",
                    j,
                ]
            )
            == 0
        )
        assert (
            main(
                [
                    "export",
                    src,
                    "--as-of",
                    str(AS_OF),
                    "--all",
                    "--format",
                    "jsonl",
                    "--out",
                    str(tmp_path / f"e{j}"),
                    "-j",
                    j,
                ]
            )
            == 0
        )
        assert main(["audit", src, "--as-of", str(AS_OF), "--json", "-j", j]) == 0
        outs[("audit", j)] = capsys.readouterr().out
    for key in ("table", "jsonl", "audit"):
        assert outs[(key, "1")] == outs[(key, "2")], key
    assert (tmp_path / "m1.parquet").read_bytes() == (tmp_path / "m2.parquet").read_bytes()
    assert pq.ParquetFile(tmp_path / "m1.parquet").metadata.num_rows > 0
    assert (tmp_path / "e1" / "messages.jsonl").read_bytes() == (tmp_path / "e2" / "messages.jsonl").read_bytes()


def test_jobs_must_be_a_positive_integer(capsys):
    with pytest.raises(UsageError):
        cqforensics.read_table(SAMPLES / "4.3.6-kill", "queues", jobs=0)
    assert main(["fsck", "-j", "0", str(SAMPLES / "4.3.6-kill")]) == 16
    assert "-j/--jobs" in capsys.readouterr().err


def test_read_jsonl_limit_is_the_same_with_jobs(split_everything, capsys):
    """JSON lines are made by the workers (``iter_batches(render=...)``): a limit cuts them at a
    row, wherever the batches were cut."""
    src = str(SAMPLES / "4.3.6-kill")
    for limit in ("1", "7", "1000"):
        outs = []
        for j in ("1", "2"):
            assert main(["read", src, "--as-of", str(AS_OF), "--format", "jsonl", "--limit", limit, "-j", j]) == 0
            outs.append(capsys.readouterr().out)
        assert outs[0] == outs[1]
        assert len(outs[0].split("\n")) - 1 == min(int(limit), 93)


# -- the inputs' hashes, shared out ----------------------------------------------------------


@pytest.mark.parametrize("jobs", [2, 3])
def test_the_inputs_manifest_hashed_in_claimed_groups_is_the_serial_one(monkeypatch, jobs):
    """``provenance.hashing`` with ``jobs`` > 1: the workers and then the caller claim groups of
    files one at a time (``_Claims``); the manifest is the serial one, in the same order, whoever
    hashed which group (here the workers may have claimed all, some or none of them)."""
    monkeypatch.setattr(provenance, "PARALLEL_BYTES", 0)
    node = SAMPLES / "4.3.6-rolled"
    want = provenance.inputs_manifest(node, 1)
    assert provenance.hashing(node, jobs)() == want
    monkeypatch.setattr(provenance, "CLAIMED_GROUPS", 100)  # more groups than files: some empty-handed
    assert provenance.hashing(node, jobs)() == want


def test_each_group_is_claimed_once_across_processes():
    """``_Claims``: a forked worker and the caller drain the same numbers; each number goes to
    exactly one of them, and an emptied pipe reads as its end (no wait)."""
    claims = provenance._Claims(200)
    got = list(parallel.started(range(2), lambda _: [claims.each(lambda g: (os.getpid(), g))], 2))
    mine = claims.each(lambda g: (os.getpid(), g))
    claims.close()
    numbers = [g for part in got for g, _ in part] + [g for g, _ in mine]
    assert sorted(numbers) == list(range(200))
    with pytest.raises(ValueError):
        provenance._Claims(256)
