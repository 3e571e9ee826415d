"""Front ends users can trust (issue 16): streaming `read`, well-grouped Parquet, `export --all`
emitting each stored entry once and streaming it, Ctrl-C and kill -9 during writers, --vhost /
--queue filters, `find`, and -v / --log-json."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import cqforensics
from cli import main as cli_main
from cli.main import main
from support import ROOT, SAMPLES, copy_node

KILL = SAMPLES / "4.3.6-kill"
BIG = SAMPLES / "3.13.7-clean"  # 2287 messages, 204 orphans: several batches of output


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")


# -- 1. read streams --------------------------------------------------------------------------------


def _two_batches(seen: list, capsys, fmt_check):
    """An ``iter_batches`` stand-in: a batch of real rows, then (once the caller asks for more)
    a check of what was written by then, then a second batch."""
    real = cqforensics.read_table(KILL, "messages", columns=["vhost", "queue", "seq_id"]).combine_chunks()

    def fake(paths, table="messages", columns=None, render=None, **kw):
        done = render or (lambda b: b)  # what the real one yields: the batches, or what render made of them
        yield done(real.slice(0, 3).to_batches()[0])
        seen.append(fmt_check(capsys.readouterr().out))  # what reached stdout before batch 2 was read
        yield done(real.slice(3, 2).to_batches()[0])
        seen.append("read past the limit")

    return fake


@pytest.mark.parametrize("fmt", ["table", "jsonl"])
def test_read_prints_rows_as_batches_arrive(capsys, monkeypatch, fmt):
    seen = []
    monkeypatch.setattr(cqforensics, "iter_batches", _two_batches(seen, capsys, lambda out: out.count("\n")))
    # a text table is laid out a group of rows at a time (the same text however the rows were
    # batched: read -j N): here a group of 3
    monkeypatch.setattr(cli_main, "TEXT_GROUP", 3)
    code, out, _ = run(capsys, "read", KILL, "--format", fmt, "--columns", "vhost,queue,seq_id")
    assert code == 0
    header = 1 if fmt == "table" else 0
    # the first batch's rows were on stdout before the second batch was even read
    assert seen[0] == header + 3
    assert out.count("\n") == 2 and seen[1] == "read past the limit"


def test_read_stops_reading_at_the_limit(capsys, monkeypatch):
    seen = []
    monkeypatch.setattr(cqforensics, "iter_batches", _two_batches(seen, capsys, lambda out: out))
    code, out, _ = run(capsys, "read", KILL, "--format", "jsonl", "--limit", "2", "--columns", "vhost,queue,seq_id")
    assert code == 0 and out.count("\n") == 2 and seen == []  # the second batch was never asked for


def test_read_text_table_aligns_and_keeps_header(capsys):
    code, out, _ = run(capsys, "read", BIG, "--columns", "vhost,queue,seq_id")
    lines = out.splitlines()
    want = cqforensics.read_table(BIG, "messages", columns=["seq_id"]).num_rows
    assert code == 0 and len(lines) == want + 1 and lines[0].split() == ["vhost", "queue", "seq_id"]
    code, out, _ = run(capsys, "read", BIG, "--limit", "0", "--columns", "vhost,queue")
    assert code == 0 and out.split() == ["vhost", "queue"]  # an empty table still names its columns


def test_read_parquet_honours_limit_and_writes_few_row_groups(capsys, tmp_path):
    out = tmp_path / "m.parquet"
    code, _, err = run(capsys, "read", BIG, "--format", "parquet", "--out", out, "--limit", "7")
    f = pq.ParquetFile(out)
    assert code == 0 and f.metadata.num_rows == 7 and f.num_row_groups == 1 and "7 rows" in err
    code, _, _ = run(capsys, "read", BIG, "--table", "store", "--format", "parquet", "--out", out, "--force")
    f = pq.ParquetFile(out)
    assert code == 0 and f.num_row_groups == 1
    assert f.metadata.num_rows == cqforensics.read_table(BIG, "store", columns=["offset"]).num_rows
    assert f.schema_arrow == cqforensics.schema("store")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.parquet.cqforensics-output.json", "m.parquet"]


def test_read_is_interrupted_without_leaving_a_partial_file(capsys, monkeypatch, tmp_path):
    real = cqforensics.read_table(KILL, "messages", columns=["vhost", "queue"])

    def interrupted(*a, render=None, **k):
        b = real.to_batches()[0]
        yield render(b) if render else b
        raise KeyboardInterrupt

    monkeypatch.setattr(cqforensics, "iter_batches", interrupted)
    for fmt in ("jsonl", "parquet"):
        code, _, err = run(capsys, "read", KILL, "--format", fmt, "--out", tmp_path / f"x.{fmt}")
        assert code == 32 and err == "cqforensics: interrupted\n"
    assert list(tmp_path.iterdir()) == []


def test_head_gets_the_first_row_at_once(tmp_path):
    """`cqforensics read ... | head -1`: the first line comes while the read goes on (here the
    rest of the read is made to take a minute), and a closed pipe is no error."""
    slow = (
        "import sys, time, cqforensics\n"
        "real = cqforensics.iter_batches\n"
        "def slow(*a, **k):\n"
        "    for i, b in enumerate(real(*a, **k)):\n"
        "        yield b\n"
        "        time.sleep(60)\n"
        "cqforensics.iter_batches = slow\n"
        "from cli.main import run\n"
        "run()\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", slow, "read", str(BIG)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env(),
    )
    try:
        start = time.monotonic()
        first = p.stdout.readline()
        assert first.split() and time.monotonic() - start < 30
    finally:
        p.kill()
        p.communicate()
    # a real pipe closed early (more output than a pipe buffer holds): exit 0, nothing on stderr
    p = subprocess.Popen(
        [sys.executable, "-m", "cqforensics", "read", str(BIG)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env(),
    )
    assert p.stdout.readline().split()[:2] == [b"node", b"vhost"]
    p.stdout.close()
    assert p.wait(timeout=120) == 0
    assert p.stderr.read() == b""


# -- 2. export: row groups, streaming, each stored entry once ------------------------------------


def test_export_parquet_writes_few_row_groups(capsys, tmp_path, monkeypatch):
    code, _, _ = run(capsys, "export", BIG, "--format", "parquet", "--out", tmp_path / "a", "--all")
    f = pq.ParquetFile(tmp_path / "a" / "messages.parquet")
    assert code == 0 and f.metadata.num_rows == 2287 + 204 and f.num_row_groups == 1
    from cqforensics.commands import export

    monkeypatch.setattr(export, "ROW_GROUP_ROWS", 1000)
    code, _, _ = run(capsys, "export", BIG, "--format", "parquet", "--out", tmp_path / "b", "--all")
    f = pq.ParquetFile(tmp_path / "b" / "messages.parquet")
    sizes = [f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)]
    assert code == 0 and sizes == [1000, 1000, 491]
    assert pq.read_table(tmp_path / "a" / "messages.parquet").equals(pq.read_table(tmp_path / "b" / "messages.parquet"))


def test_parquet_sink_closes_a_row_group_at_the_byte_budget(tmp_path):
    from cqforensics.commands.export import ParquetSink

    sch = pa.schema([("b", pa.binary())])
    with ParquetSink(tmp_path / "x.parquet", sch, rows=1000, nbytes=10_000) as sink:
        for _ in range(10):
            sink.write(pa.RecordBatch.from_pylist([{"b": b"x" * 3000}], schema=sch))
    f = pq.ParquetFile(tmp_path / "x.parquet")
    assert f.metadata.num_rows == 10 and f.num_row_groups == 3  # 4 + 4 + 2 rows of ~3 kB


def test_export_all_streams_the_store_rows(monkeypatch):
    """The orphans of a vhost are read while they are written, not gathered first."""
    from cqforensics.commands import export

    pulled = [0]
    real = export._store_rows

    def counted(*a, **k):
        for row in real(*a, **k):
            pulled[0] += 1
            yield row

    monkeypatch.setattr(export, "_store_rows", counted)
    orphan_batches = []
    for b in export.export_batches([BIG], everything=True, batch_rows=10):
        if b.column("source")[0].as_py() == "orphan":
            orphan_batches.append((b.num_rows, pulled[0]))
    assert sum(n for n, _ in orphan_batches) == 204
    assert orphan_batches[0] == (10, 10)  # the first batch left before the 11th orphan was read
    assert all(n <= 10 for n, _ in orphan_batches)


def _ghosts(tmp_path) -> tuple[Path, dict]:
    """A copy of 4.3.6-kill with three v2 slots marked dropped (status 0, bytes kept: what a
    dirty recovery leaves): one of a fan-out message another queue still holds, one whose
    shared-store entry nothing else refers to, one kept in a .qs file."""
    node = copy_node("4.3.6-kill", tmp_path / "in")
    rows = cqforensics.read_table(
        node,
        "messages",
        columns=["queue", "file", "offset", "location", "store_file", "store_offset", "index_version", "msg_id"],
    ).to_pylist()
    refs = collections.Counter((r["store_file"], r["store_offset"]) for r in rows if r["store_file"])
    v2 = [r for r in rows if r["index_version"] == 2 and r["store_file"]]
    picks = {
        "fan_out": next(
            r for r in v2 if r["location"] == "shared_store" and refs[(r["store_file"], r["store_offset"])] == 2
        ),
        "single": next(
            r for r in v2 if r["location"] == "shared_store" and refs[(r["store_file"], r["store_offset"])] == 1
        ),
        "qs": next(r for r in v2 if r["location"] == "queue_store"),
    }
    for r in picks.values():
        with open(r["file"], "r+b") as f:
            f.seek(r["offset"])
            assert f.read(1) == b"\x01"
            f.seek(r["offset"])
            f.write(b"\x00")
    return node, picks


def test_export_all_never_emits_the_same_bytes_twice(tmp_path):
    from cqforensics.commands import export

    node, picks = _ghosts(tmp_path)
    t = pa.Table.from_batches(list(export.export_batches([node], everything=True)))
    rows = t.select(["source", "store_file", "store_offset", "queue"]).to_pylist()
    where = collections.defaultdict(list)
    for r in rows:
        if r["store_file"] is not None:
            where[(r["store_file"], r["store_offset"])].append(r["source"])
    for key, sources in where.items():
        # only index rows may share bytes (a fan-out: one stored message held by several queues)
        assert len(sources) == 1 or set(sources) == {"index"}, (key, sources)
    key = lambda r: (r["store_file"], r["store_offset"])  # noqa: E731
    assert where[key(picks["fan_out"])] == ["index"]  # still held by the other queue: not a ghost too
    assert where[key(picks["single"])] == ["ghost"]  # its entry is an orphan now: emitted once, as the ghost
    assert where[key(picks["qs"])] == ["ghost"]
    counts = collections.Counter(r["source"] for r in rows)
    assert counts["ghost"] == 2 and counts["orphan"] == 3


def test_export_filters(capsys, tmp_path):
    code, _, err = run(
        capsys,
        "export",
        KILL,
        "--format",
        "jsonl",
        "--out",
        tmp_path / "q",
        "--all",
        "--queue",
        "amqp10.a",
        "--queue",
        "amqp10.b",
    )
    lines = [json.loads(x) for x in (tmp_path / "q" / "messages.jsonl").read_text().splitlines()]
    assert code == 0 and {r["queue"] for r in lines} == {"amqp10.a", "amqp10.b"} and len(lines) == 4
    assert {r["source"] for r in lines} == {"index"}  # store rows belong to no queue
    code, _, _ = run(capsys, "export", KILL, "--format", "jsonl", "--out", tmp_path / "v", "--vhost", "staging/ü")
    lines = [json.loads(x) for x in (tmp_path / "v" / "messages.jsonl").read_text().splitlines()]
    assert code == 0 and lines and {r["vhost"] for r in lines} == {"staging/ü"}


# -- 3. Ctrl-C and kill -9 ----------------------------------------------------------------------------

_SLOW_EXPORT = (
    "import time\n"
    "from cqforensics.commands import export\n"
    "real = export.export_batches\n"
    "def slow(*a, **k):\n"
    "    for b in real(*a, **k):\n"
    "        yield b\n"
    "        time.sleep(60)\n"
    "export.export_batches = slow\n"
    "from cli.main import run\n"
    "run()\n"
)

_SLOW_COMPACT = (
    "import time\n"
    "from cqforensics.write import salvage\n"
    "real = salvage.rewrite_vhost\n"
    "def slow(*a, **k):\n"
    "    real(*a, **k)\n"
    "    time.sleep(60)\n"
    "salvage.rewrite_vhost = slow\n"
    "from cli.main import run\n"
    "run()\n"
)


def _start(code: str, *argv) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env(),
        text=True,
    )


def _finish(p: subprocess.Popen, timeout: float = 60) -> tuple[str, str]:
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"still running {timeout} s after the signal; stderr: {err}") from None


def _wait_for(p: subprocess.Popen, found, timeout: float = 60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        hit = found()
        if hit:
            return hit
        if p.poll() is not None:
            raise AssertionError(f"exited early ({p.returncode}): {p.communicate()}")
        time.sleep(0.05)
    p.kill()
    raise AssertionError("the writer never started writing")


def _staged_file(out):
    """The file an export is writing: in its partial dir ``.<DIR>.cqf-partial-<pid>`` beside DIR."""
    return [f for d in out.parent.glob(f".{out.name}.cqf-partial-*") for f in d.iterdir()]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_ctrl_c_during_export_leaves_nothing_and_a_rerun_works(capsys, tmp_path, fmt):
    out = tmp_path / "out"
    p = _start(_SLOW_EXPORT, "export", KILL, "--format", fmt, "--out", out, "--all")
    _wait_for(p, lambda: _staged_file(out))  # the partial file is being written
    p.send_signal(signal.SIGINT)
    stdout, stderr = _finish(p)
    assert p.returncode == 32 and stderr == "cqforensics: interrupted\n" and stdout == ""
    assert list(tmp_path.iterdir()) == []  # no DIR, no partial dir
    code, _, _ = run(capsys, "export", KILL, "--format", fmt, "--out", out, "--all")
    assert code == 0 and sorted(x.name for x in out.iterdir()) == [".cqforensics-output.json", f"messages.{fmt}"] + (
        ["messages.jsonl.provenance.json"] if fmt == "jsonl" else []
    )


def test_a_kill_9_partial_is_removed_by_the_next_run(capsys, tmp_path):
    out = tmp_path / "out"
    p = _start(_SLOW_EXPORT, "export", KILL, "--format", "parquet", "--out", out)
    partial = _wait_for(p, lambda: _staged_file(out))[0].parent
    p.kill()
    p.communicate()
    assert partial.name == f".out.cqf-partial-{p.pid}" and partial.exists()
    code, _, err = run(capsys, "export", KILL, "--format", "parquet", "--out", out)
    assert code == 0 and sorted(x.name for x in out.iterdir()) == [".cqforensics-output.json", "messages.parquet"]
    assert err.startswith(f"cqforensics: WARNING: removed {partial}") and "interrupted run" in err
    assert [x.name for x in tmp_path.iterdir()] == ["out"]
    assert pq.read_table(out / "messages.parquet").num_rows == 93


def test_a_partial_of_a_live_process_is_reported_with_how_to_remove_it(capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".messages.jsonl.cqf-partial-1").write_text("")  # pid 1 is alive: maybe another run
    (out / "messages.jsonl.partial").write_text("")  # what an older cqforensics left
    code, _, err = run(capsys, "export", KILL, "--format", "jsonl", "--out", out)
    assert code == 16 and err.count("\n") == 1 and "not empty" in err
    assert ".messages.jsonl.cqf-partial-1" in err and "messages.jsonl.partial" in err and "rm -r" in err


def test_ctrl_c_during_compact_leaves_no_partial_dir(capsys, tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "in")
    dst = tmp_path / "out" / "rabbit@localhost"
    dst.parent.mkdir()
    p = _start(_SLOW_COMPACT, "compact", "-q", node, dst)
    _wait_for(p, lambda: list(dst.parent.iterdir()))
    p.send_signal(signal.SIGINT)
    stdout, stderr = _finish(p)
    assert p.returncode == 32 and stderr == "cqforensics: interrupted\n"
    assert list(dst.parent.iterdir()) == []
    code, _, _ = run(capsys, "compact", "-q", node, dst)
    assert code == 0 and run(capsys, "verify", dst)[0] == 0


def test_a_kill_9_staging_dir_is_removed_and_reported(capsys, tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "in")
    dst = tmp_path / "out" / "rabbit@localhost"
    dst.parent.mkdir()
    p = _start(_SLOW_COMPACT, "compact", "-q", node, dst)
    staged = _wait_for(p, lambda: list(dst.parent.iterdir()))[0]
    p.kill()
    p.communicate()
    assert staged.name == f".rabbit@localhost.cqf-partial-{p.pid}"
    code, out, err = run(capsys, "compact", "-q", node, dst)
    assert code == 0 and "removed 1 partial output" in out and f"removed {staged}" in err
    assert [x.name for x in dst.parent.iterdir()] == ["rabbit@localhost"]


# -- 4. filters and find ----------------------------------------------------------------------------


def test_read_filters_by_vhost_and_queue(capsys):
    code, out, _ = run(capsys, "read", KILL, "--format", "jsonl", "--vhost", "staging/ü")
    rows = [json.loads(x) for x in out.splitlines()]
    assert code == 0 and rows and {r["vhost"] for r in rows} == {"staging/ü"}
    code, out, _ = run(
        capsys, "read", KILL, "--format", "jsonl", "--queue", "amqp10.a", "--queue", "amqp10.b", "--columns", "queue"
    )
    assert code == 0 and sorted(json.loads(x)["queue"] for x in out.splitlines()) == ["amqp10.a"] * 2 + ["amqp10.b"] * 2


def test_fsck_filters_by_vhost_and_queue(capsys):
    code, out, _ = run(capsys, "fsck", "--json", KILL, "--queue", "session.exclusive")
    doc = json.loads(out)
    assert code == 0 and [q["queue"] for q in doc["queues"]] == ["session.exclusive"]
    assert all(f["queue"] in (None, "session.exclusive") for f in doc["findings"])
    code, out, _ = run(capsys, "fsck", "--json", KILL, "--vhost", "/")
    doc = json.loads(out)
    assert {q["vhost"] for q in doc["queues"]} == {"/"} and {f["vhost"] for f in doc["findings"]} == {"/"}


def test_find_by_msg_id_and_body(capsys, tmp_path):
    node, picks = _ghosts(tmp_path)
    t = cqforensics.read_table(
        node, "messages", columns=["msg_id", "body", "queue", "store_file", "store_offset", "location"]
    ).to_pylist()
    held = next(r for r in t if r["location"] == "shared_store" and r["store_file"] and len(r["body"]) > 20)
    code, out, err = run(capsys, "find", node, "--msg-id", held["msg_id"].hex()[:12], "--jsonl")
    hits = [json.loads(x) for x in out.splitlines()]
    assert code == 0 and hits and err == f"{len(hits)} hit{'s' if len(hits) > 1 else ''}\n"
    assert all(h["msg_id"] == held["msg_id"].hex() for h in hits)
    assert any(
        h["store_file"] == held["store_file"]
        and h["store_offset"] == held["store_offset"]
        and h["queue"] == held["queue"]
        and h["fate"] == "delivered at next boot"
        for h in hits
    )

    needle = held["body"][5:20]
    code, out, _ = run(capsys, "find", node, "--body-hex", needle.hex(), "--jsonl")
    hits = [json.loads(x) for x in out.splitlines()]
    want = sum(needle in (r["body"] or b"") for r in t)
    assert code == 0 and len([h for h in hits if h["source"] == "index"]) == want

    # a ghost (a slot an earlier recovery dropped) is found, with where its bytes are
    single = picks["single"]
    code, out, _ = run(capsys, "find", node, "--msg-id", single["msg_id"].hex(), "--jsonl")
    hits = [json.loads(x) for x in out.splitlines()]
    assert [(h["source"], h["queue"], h["store_file"], h["store_offset"], h["file"], h["offset"]) for h in hits] == [
        (
            "ghost",
            single["queue"],
            single["store_file"],
            single["store_offset"],
            single["store_file"],
            single["store_offset"],
        )
    ]
    assert hits[0]["fate"].startswith("dropped by an earlier recovery")

    code, out, _ = run(capsys, "find", node, "--msg-id", held["msg_id"].hex()[:8])  # text
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:4] == ["vhost", "queue", "source", "fate"]
    assert any(os.path.basename(held["store_file"]) in line for line in lines[1:])


def test_find_orphans_nothing_and_bad_ids(capsys):
    orphans = [
        r
        for r in cqforensics.read_table(KILL, "store", columns=["msg_id", "status", "file", "offset"]).to_pylist()
        if r["status"] == "orphan"
    ]
    code, out, _ = run(capsys, "find", KILL, "--msg-id", orphans[0]["msg_id"].hex(), "--jsonl")
    hits = [json.loads(x) for x in out.splitlines()]
    assert code == 0 and [(h["source"], h["store_file"], h["store_offset"]) for h in hits] == [
        ("orphan", orphans[0]["file"], orphans[0]["offset"])
    ]
    assert hits[0]["fate"].startswith("acked or deleted")
    code, out, err = run(capsys, "find", KILL, "--body", "no such text anywhere \u2603")
    assert code == 0 and out == "" and err == "0 hits\n"
    assert run(capsys, "find", KILL, "--msg-id", "xyz")[0] == 16
    assert run(capsys, "find", KILL)[0] == 16


# -- 6. logging ---------------------------------------------------------------------------------------


def test_verbose_and_json_logs_go_to_stderr(capsys):
    code, out, err = run(capsys, "read", KILL, "--limit", "1", "--format", "jsonl")
    assert code == 0 and err == ""
    code, out2, err = run(capsys, "-v", "read", KILL, "--limit", "1", "--format", "jsonl")
    assert code == 0 and out2 == out  # logs never reach stdout
    assert "cqforensics: INFO: read started" in err and "read finished: exit 0" in err
    code, out3, err = run(capsys, "--log-json", "-v", "read", KILL, "--limit", "1", "--format", "jsonl")
    docs = [json.loads(x) for x in err.splitlines()]
    assert code == 0 and out3 == out and len(docs) == 2
    assert all({"time", "level", "logger", "message"} <= set(d) for d in docs)
    assert docs[-1]["exit_code"] == 0 and docs[-1]["command"] == "read" and docs[-1]["level"] == "info"
    code, _, err = run(capsys, "--log-json", "read", KILL, "--limit", "1", "--format", "jsonl")
    assert code == 0 and err == ""  # without -v: warnings only


def test_long_commands_report_progress_in_bytes():
    """fsck, compact/rebuild and verify call progress(text, done_bytes, total_bytes); fsck's moves
    within a vhost, as its queue indexes are checked (a one-vhost node no longer sits at 0% until
    it is done), up to the total; on a terminal the CLI shows it as a bar with bytes, rate and
    ETA."""
    import fcntl
    import pty
    import struct
    import termios

    from cqforensics.commands import fsck
    from cqforensics.discovery import nodes as layout

    node = SAMPLES / "4.3.6-kill" / "mnesia"
    calls = []
    for _ in fsck.fsck([node], progress=lambda *a: calls.append(a)):
        pass
    vhosts = [v for n in layout.discover([node]) for v in n.vhosts]
    total = sum(layout.tree_bytes(v.path) for v in vhosts)
    assert calls[0][1] == 0 and calls[-1][1] == calls[-1][2] == total > 0
    assert all(a[1] <= b[1] for a, b in zip(calls, calls[1:]))  # never backwards
    first = layout.tree_bytes(min(vhosts, key=lambda v: v.name).path)  # "/" is checked first
    within = {c[1] for c in calls if c[0].endswith("vhost /")} - {0, first}
    assert len(within) > 3, calls  # moved while the first vhost was checked
    pid, fd = pty.fork()
    if pid == 0:  # the CLI on a terminal of 120 columns
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        os.execvp(sys.executable, [sys.executable, "-m", "cli.main", "fsck", str(node)])
    out = b""
    while True:
        try:
            d = os.read(fd, 4096)
        except OSError:
            break
        if not d:
            break
        out += d
    os.waitpid(pid, 0)
    text = out.decode(errors="replace")
    assert "B/s" in text and "vhost" in text and "%|" in text, text[:500]


def test_fsck_jobs_checks_nodes_in_parallel_with_the_same_report(capsys, tmp_path):
    """fsck -j N: a folder of node backups checked N at once gives the report -j 1 gives."""
    import shutil

    for ds in ("4.3.6-kill", "3.10.8-kill", "4.0.5-clean"):
        shutil.copytree(SAMPLES / ds / "mnesia", tmp_path / ds / "mnesia", symlinks=True)
    outs = []
    for jobs in ("1", "3"):
        code = main(["fsck", "--json", "-j", jobs, str(tmp_path)])
        doc = json.loads(capsys.readouterr().out)
        doc.pop("provenance")
        doc["summary"].pop("ttls_judged_at")  # the clock's time of each run
        outs.append((code, doc))
    assert outs[0] == outs[1] and len(outs[0][1]["nodes"]) == 3
    assert main(["fsck", "-j", "0", str(tmp_path)]) == 16
