"""Evidence is never written to (issue 28; docs/evidence.md): every writer of cqforensics, against
every target that is not its own, with and without ``--force`` (Spark: ``overwrite`` and
``append``). The rule is written once (``cqforensics.output.guard``); this file is its proof: one cell
of ``GRID`` per writer and case, each a test below (``test_grid_covers_every_writer_and_case``
keeps the grid whole).

The world the CLI cells run in (``world``) holds the job's input (a copy of the 4.3.6-kill
sample), another node's real data dir that is no input of the job (a second copy), a plain
foreign dir and file, and symlinks to each; every refusal must leave all of it byte for byte
(names, contents and mtimes: ``fingerprint``) as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cqforensics
from cli.main import main
from support import ROOT, SAMPLES, copy_node
from support.cli import fingerprint

# R: refused (exit 16, or the Spark job fails at planning, with one line naming the target), with and
#    without --force / in both save modes; nothing anywhere changes.
# F: a previous output of cqforensics: refused without --force; replaced with it, only at commit
#    (a failure before the commit leaves it as it was). Spark: both modes replace it at commit.
# C: republish's journal of cqforensics: continued, never replaced.
# A: Spark: a previous output that the same job reads, replaced at commit, after every read.
# -: not applicable (see the case's description)
GRID = """
case                   compact rebuild export read report republish spark
input                  R       R       R      R    R      R         R
inside-input           R       R       R      R    R      R         R
inside-input-existing  R       R       R      R    R      R         R
above-input            R       R       R      R    R      R         R
other-node             R       R       R      R    R      R         R
inside-other-node      R       R       R      R    R      R         R
other-node-existing    R       R       R      R    R      R         R
other-base             R       R       R      R    R      R         R
link-to-input          R       R       R      R    R      R         R
link-to-inside-input   R       R       R      R    R      R         R
link-to-above-input    R       R       R      R    R      R         R
link-to-other-node     R       R       R      R    R      R         R
through-link           R       R       R      R    R      R         R
foreign                R       R       R      R    R      R         R
forged-marker          R       R       R      R    R      R         R
forged-manifest        R       R       R      -    -      -         R
changed-output         R       R       R      R    R      R         R
previous-output        F       F       F      F    F      C         F
previous-output-read   R       R       R      R    R      R         A
"""

CASES = {
    "input": "the target is the job's input (a node dir)",
    "inside-input": "a new path inside the input",
    "inside-input-existing": "an existing entry inside the input (dir writers: its msg_stores/; file writers: a "
    "file the broker wrote)",
    "above-input": "a parent of the input (its mnesia base)",
    "other-node": "another node's real data dir, no input of the job",
    "inside-other-node": "a new path inside that node dir",
    "other-node-existing": "an existing entry of that node (dir writers: its msg_stores/; file writers: a file "
    "its broker wrote)",
    "other-base": "that node's mnesia base (a dir holding a node dir)",
    "link-to-input": "a symlink to the input",
    "link-to-inside-input": "a symlink to an entry inside the input",
    "link-to-above-input": "a symlink to the input's parent",
    "link-to-other-node": "a symlink to the other node dir",
    "through-link": "a new path under a symlink to the other node dir",
    "foreign": "a plain non-empty dir (dir writers) or file (file writers) cqforensics did not write",
    "forged-marker": "another node's data dir (file writers: a foreign file) with the manifest of a real output "
    "of cqforensics copied in (beside it)",
    "forged-manifest": "a cleanly stopped broker's node dir with a manifest computed over it (files: a file's "
    "manifest cannot be told from a real one: the documented limit, docs/evidence.md)",
    "changed-output": "a previous output of cqforensics changed since (dirs: a file added, as a broker's boot "
    "would; files: edited)",
    "previous-output": "a previous output of the same writer",
    "previous-output-read": "a previous output of cqforensics that the job reads as its input",
}


def _grid() -> dict[tuple[str, str], str]:
    lines = [line.split() for line in GRID.strip().splitlines()]
    writers = lines[0][1:]
    return {(w, row[0]): mark for row in lines[1:] for w, mark in zip(writers, row[1:])}


TABLE = _grid()
WRITERS = ("compact", "rebuild", "export", "read", "report", "republish", "spark")
DIR_WRITERS = ("compact", "rebuild", "export")
CLI = WRITERS[:-1]


def test_grid_covers_every_writer_and_case():
    """Every writer has a cell for every case (a new writer or case without its cells fails here),
    and every writer of the CLI is in the grid (the commands with an output option)."""
    assert {w for w, _ in TABLE} == set(WRITERS)
    assert {c for _, c in TABLE} == set(CASES)
    assert len(TABLE) == len(WRITERS) * len(CASES)
    assert set(TABLE.values()) <= {"R", "F", "C", "A", "-"}
    from cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    writing = sorted(
        name
        for name, p in sub.choices.items()
        if any(o in p._option_string_actions for o in ("--out", "--html", "--journal"))
        or any(a.dest == "dst" for a in p._actions)
    )
    assert writing == sorted(CLI), writing


# -- the world ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = tmp_path_factory.mktemp("world")
    node = copy_node("4.3.6-kill", w / "in")
    other = copy_node("4.3.6-kill", w / "other")
    (w / "foreign").mkdir()
    (w / "foreign" / "notes.txt").write_text("an investigator's notes\n")
    (w / "foreign.txt").write_text("not written by cqforensics\n")
    links = w / "links"
    links.mkdir()
    for name, to in (
        ("input", node),
        ("inside", node / "msg_stores"),
        ("above", node.parent),
        ("other", other),
        ("other-file", other / "rabbit_serial"),
    ):
        (links / name).symlink_to(to)
    return {"root": w, "node": node, "other": other, "links": links}


def _target(world, case: str, writer: str) -> Path:
    w, node, other, links = world["root"], world["node"], world["other"], world["links"]
    file = writer not in DIR_WRITERS
    return {
        "input": node,
        "inside-input": node / ("out.x" if file else "out"),
        "inside-input-existing": node / "rabbit_serial" if file else node / "msg_stores",
        "above-input": node.parent,
        "other-node": other,
        "inside-other-node": other / ("out.x" if file else "out"),
        "other-node-existing": other / "rabbit_serial" if file else other / "msg_stores",
        "other-base": other.parent,
        "link-to-input": links / "input",
        "link-to-inside-input": links / "inside",
        "link-to-above-input": links / "above",
        "link-to-other-node": links / "other",
        "through-link": links / "other" / ("out.x" if file else "out"),
        "foreign": w / ("foreign.txt" if file else "foreign"),
    }[case]


JOURNAL_URL = "amqp://guest:guest@127.0.0.1:1/"


def _argv(writer: str, src, out, force: bool) -> list[str]:
    argv = {
        "compact": ["compact", "-q", src, out],
        "rebuild": ["rebuild", "-q", src, out],
        "export": ["export", src, "--format", "jsonl", "--out", out],
        "read": ["read", src, "--format", "jsonl", "--out", out],
        "report": ["report", src, "--html", out],
        "republish": ["republish", src, JOURNAL_URL, "--journal", out],
    }[writer]
    return [str(a) for a in argv] + (["--force"] if force and writer != "republish" else [])


def _run(capsys, argv) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _refused(capsys, writer, src, target, protect, cwd=None) -> None:
    """``writer`` aimed at ``target`` is refused with one line, with and without --force, and
    nothing under ``protect`` changes."""
    before = {str(p): fingerprint(p) for p in protect}
    for force in (False, True):
        code, out, err = _run(capsys, _argv(writer, src, target, force))
        assert code == 16, (writer, force, code, err, out)
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert str(target) in err or os.path.realpath(target) in err, err
    assert {str(p): fingerprint(p) for p in protect} == before


REFUSALS = [
    (w, c)
    for (w, c), mark in TABLE.items()
    if mark == "R"
    and w in CLI
    and c
    in (
        "input",
        "inside-input",
        "inside-input-existing",
        "above-input",
        "other-node",
        "inside-other-node",
        "other-node-existing",
        "other-base",
        "link-to-input",
        "link-to-inside-input",
        "link-to-above-input",
        "link-to-other-node",
        "through-link",
        "foreign",
    )
]


@pytest.mark.parametrize("writer, case", REFUSALS, ids=[f"{w}-{c}" for w, c in REFUSALS])
def test_cli_writer_refuses(writer, case, world, capsys):
    _refused(capsys, writer, world["node"], _target(world, case, writer), [world["root"]])


def test_the_library_writer_of_definitions_follows_the_rule(world):
    """``retarget.write_definitions`` (a library writer, no CLI option) goes through the same rule."""
    from cqforensics.base.errors import UsageError
    from cqforensics.model.versions import model
    from cqforensics.write import retarget

    before = fingerprint(world["root"])
    for case in (
        "input",
        "inside-input",
        "inside-input-existing",
        "inside-other-node",
        "other-node-existing",
        "link-to-other-node",
        "through-link",
        "foreign",
    ):
        with pytest.raises(UsageError):
            retarget.write_definitions(world["node"], model("4.3.6"), _target(world, case, "read"))
    assert fingerprint(world["root"]) == before


def test_compact_and_rebuild_never_write_over_or_into_their_template(world, capsys):
    """--template NODE is an input too (its metadata is read): DST may not be it, inside it or
    around it."""
    other = world["other"]
    before = fingerprint(world["root"])
    for command in ("compact", "rebuild"):
        for target in (other, other / "out", other.parent):
            for force in ([], ["--force"]):
                code, _, err = _run(
                    capsys,
                    [
                        command,
                        "-q",
                        "--broker-version",
                        "4.3",
                        "--template",
                        str(other),
                        str(world["node"]),
                        str(target),
                        *force,
                    ],
                )
                assert code == 16 and err.count("\n") == 1, (command, target, err)
    assert fingerprint(world["root"]) == before


# -- outputs of cqforensics: forged, changed, previous -------------------------------------------------


def _make_output(capsys, writer: str, src, out) -> None:
    if writer == "republish":  # a journal of cqforensics: its start record (the broker is not needed)
        out.write_text(
            json.dumps(
                {
                    "op": "start",
                    "v": 1,
                    "tool": "cqforensics",
                    "target": JOURNAL_URL,
                    "inputs": [str(src)],
                    "time": "2026-11-27T00:00:00+00:00",
                }
            )
            + "\n"
        )
        return
    code, _, err = _run(capsys, _argv(writer, src, out, False))
    assert code in (0, 1), err


def _out_name(writer: str) -> str:
    return {
        "compact": "out",
        "rebuild": "out",
        "export": "out",
        "read": "rows.jsonl",
        "report": "r.html",
        "republish": "j.journal",
    }[writer]


@pytest.mark.parametrize("writer", CLI)
def test_forged_marker_is_refused(writer, tmp_path, capsys):
    src = SAMPLES / "4.3.6-kill" / "mnesia"
    real = tmp_path / "real" / _out_name(writer)
    real.parent.mkdir()
    _make_output(capsys, writer, src, real)
    if writer in DIR_WRITERS:  # another node's data dir, with a real output's manifest copied into it
        target = copy_node("4.3.6-kill", tmp_path / "victim")
        shutil.copy2(real / ".cqforensics-output.json", target / ".cqforensics-output.json")
    else:  # a foreign file, with a real output's manifest copied beside it
        target = tmp_path / "victim" / real.name
        target.parent.mkdir()
        target.write_text("not written by cqforensics\n")
        man = real.parent / f".{real.name}.cqforensics-output.json"
        if man.exists():
            shutil.copy2(man, target.parent / man.name)
    _refused(capsys, writer, src, target, [tmp_path / "victim"])


@pytest.mark.parametrize("writer", DIR_WRITERS)
def test_a_manifest_forged_over_a_brokers_node_dir_is_refused(writer, tmp_path, capsys):
    """A manifest that matches the tree byte for byte, computed over a cleanly stopped broker's node
    dir: it lists clean-shutdown files, which no writer of cqforensics writes."""
    from cqforensics.output.guard import not_own, write_manifest

    victim = copy_node("4.3.6-clean", tmp_path / "victim")
    write_manifest(victim, "compact")
    assert "clean-shutdown" in not_own(victim)
    _refused(capsys, writer, SAMPLES / "4.3.6-kill" / "mnesia", victim, [tmp_path / "victim"])


@pytest.mark.parametrize("writer", CLI)
def test_a_changed_output_is_no_longer_its_own(writer, tmp_path, capsys):
    src = SAMPLES / "4.3.6-kill" / "mnesia"
    out = tmp_path / _out_name(writer)
    _make_output(capsys, writer, src, out)
    if writer == "republish":  # a journal whose first line someone else wrote
        out.write_text("a file that happens to have this name\n" + out.read_text())
    elif writer in DIR_WRITERS:  # what a broker's boot does to a node dir: new files
        (out / "added-by-someone-else").write_text("x")
    else:
        with open(out, "a") as f:
            f.write("an investigator's annotation\n")
    _refused(capsys, writer, src, out, [tmp_path])


def _inject_failure(monkeypatch, writer: str) -> None:
    """Make ``writer`` fail after it has read (some of) its input, before its commit."""
    import cqforensics.commands.export as export_module
    from cqforensics.base.errors import OperationalError

    def boom(*a, **k):
        raise OperationalError("injected failure before the commit")

    if writer in ("compact", "rebuild"):  # after the whole read and write, at the output's verification
        __import__("cqforensics.write.verify")  # (the package's own ``verify`` is the function)
        monkeypatch.setattr(sys.modules["cqforensics.write.verify"], "verify", boom)
    elif writer == "report":  # the page is rendered before the file is written
        monkeypatch.setattr("cqforensics.commands.report.render", boom)
    else:  # after the first batch has been written
        owner, name = (export_module, "export_batches") if writer == "export" else (cqforensics, "iter_batches")
        real = getattr(owner, name)

        def half(*a, **k):
            yield next(iter(real(*a, **k)))
            boom()

        monkeypatch.setattr(owner, name, half)


@pytest.mark.parametrize("writer", CLI)
def test_a_previous_output_the_job_reads_is_never_its_output(writer, tmp_path, capsys):
    """previous-output-read, CLI: a job reading an output of cqforensics never writes over it or
    into it (the CLI knows its inputs; Spark, which cannot, replaces only at commit)."""
    prev = tmp_path / "prev"
    _make_output(capsys, "compact", SAMPLES / "4.3.6-kill" / "mnesia", prev)
    _refused(capsys, writer, prev, prev if writer in DIR_WRITERS else prev / "x", [tmp_path])


@pytest.mark.parametrize("writer", [w for w in CLI if TABLE[(w, "previous-output")] == "F"])
def test_a_previous_output_is_replaced_only_with_force_and_only_at_commit(writer, tmp_path, capsys, monkeypatch):
    src = SAMPLES / "4.3.6-kill" / "mnesia"
    out = tmp_path / _out_name(writer)
    _make_output(capsys, writer, src, out)
    before = fingerprint(tmp_path)
    code, _, err = _run(capsys, _argv(writer, src, out, False))
    assert code == 16 and "--force" in err and fingerprint(tmp_path) == before, err
    with monkeypatch.context() as m:  # a failure in the middle of the job: the previous output stays whole
        _inject_failure(m, writer)
        code, _, err = _run(capsys, _argv(writer, src, out, True))
        assert code == 8 and "injected failure" in err, err
    assert fingerprint(tmp_path) == before
    code, _, err = _run(capsys, _argv(writer, SAMPLES / "4.3.6-clean" / "mnesia", out, True))
    assert code in (0, 1), err
    assert fingerprint(tmp_path) != before
    assert [p.name for p in tmp_path.iterdir() if ".cqf-" in p.name] == []  # nothing left beside it
    from cqforensics.output.guard import not_own

    assert not_own(out) is None  # the new output is its own again: a later --force may replace it


def test_a_journal_of_cqforensics_is_continued_and_nothing_else(tmp_path, capsys):
    src = SAMPLES / "4.3.6-kill" / "mnesia"
    journal = tmp_path / "j.journal"
    _make_output(capsys, "republish", src, journal)
    before = journal.read_bytes()
    code, _, err = _run(capsys, _argv("republish", src, journal, False))
    assert code == 8 and "cannot connect" in err, err  # accepted: the run went on to the broker
    assert journal.read_bytes() == before  # nothing to record: nothing was sent
    empty = tmp_path / "notes.journal"
    empty.write_text("")
    _refused(capsys, "republish", src, empty, [tmp_path])


def test_republish_without_its_client_library_leaves_no_file(tmp_path):
    """No pika (hidden from the import here): the run stops before any journal file is made, the
    default one in the working directory included."""
    code = (
        "import sys; sys.modules['pika'] = None\n"
        "from cli.main import main\n"
        f"sys.exit(main(['republish', {str(SAMPLES / '4.3.6-kill' / 'mnesia')!r}, {JOURNAL_URL!r}]))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert p.returncode == 8 and "republish needs pika" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_issue_compact_force_over_another_nodes_data_dir(tmp_path, capsys):
    """Issue 28 as reported: ``compact --force SRC DST`` with DST another node's real data dir (a
    copy of the same sample) replaced DST whole."""
    dst = tmp_path / "dst"
    shutil.copytree(SAMPLES / "4.3.6-kill", dst, symlinks=True)
    before = fingerprint(dst)
    code, _, err = _run(capsys, ["compact", "-q", "--force", str(SAMPLES / "4.3.6-kill"), str(dst)])
    assert code == 16 and "not an output of cqforensics" in err and "mnesia/rabbit@localhost/ (a node dir)" in err
    assert fingerprint(dst) == before


# -- the Spark writer ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rows(spark):
    return spark.read.format("rabbitcq").load(str(SAMPLES / "4.3.6-kill")).where("survives_restart")


TEMPLATE = SAMPLES / "4.3.6-kill" / "mnesia" / "rabbit@localhost"


def _save(df, dst, mode: str, template: bool = True):
    w = df.write.format("rabbitcq").option("brokerVersion", "4.3.6").mode(mode)
    if template:
        w = w.option("template", str(TEMPLATE))
    w.save(str(dst))


def _spark_refused(df, dst, protect, mode: str, template: bool = True) -> str:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    before = {str(p): fingerprint(p) for p in protect}
    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        _save(df, dst, mode, template)
    msg = str(e.value)
    assert "rabbitcq writer: " in msg and "Traceback" not in msg and msg.count("\n") <= 1, msg  # one line
    assert {str(p): fingerprint(p) for p in protect} == before
    return msg


SPARK_REFUSALS = [
    c
    for (w, c), mark in TABLE.items()
    if w == "spark" and mark == "R" and c not in ("forged-marker", "forged-manifest", "changed-output")
]


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["overwrite", "append"])
@pytest.mark.parametrize("case", SPARK_REFUSALS)
def test_spark_writer_refuses(case, mode, world, rows, spark):
    """Without a template, as in the issue (with one, an existing DST was refused before, though
    only at commit and only because of the template)."""
    dst = _target(world, case, "spark")
    df = spark.read.format("rabbitcq").load(str(world["node"])).where("survives_restart") if case == "input" else rows
    _spark_refused(df, dst, [world["root"]], mode, template=False)


@pytest.mark.spark
def test_spark_writer_the_issue_overwrite_of_the_node_it_reads(spark, tmp_path):
    """Issue 28 as reported: reading a node dir and saving over it with overwrite replaced it (84
    files to 73; orphans, transient store, recovery files gone)."""
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    df = spark.read.format("rabbitcq").load(str(node)).where("survives_restart")
    msg = _spark_refused(df, node, [tmp_path], "overwrite", template=False)
    assert "not an output of cqforensics" in msg and "msg_stores/" in msg


@pytest.mark.spark
def test_spark_writer_on_forged_and_changed_outputs(spark, rows, tmp_path):
    from cqforensics.output.guard import write_manifest

    real = tmp_path / "real"
    _save(rows, real, "append")
    victim = copy_node("4.3.6-kill", tmp_path / "victim")  # forged-marker
    shutil.copy2(real / ".cqforensics-output.json", victim / ".cqforensics-output.json")
    forged = copy_node("4.3.6-clean", tmp_path / "forged")  # forged-manifest
    write_manifest(forged, "spark-write")
    for mode in ("overwrite", "append"):
        _spark_refused(rows, victim, [tmp_path / "victim"], mode)
        _spark_refused(rows, forged, [tmp_path / "forged"], mode)
    (real / "clean.dot").write_bytes(b"")  # changed-output: what a broker's clean stop would add
    for mode in ("overwrite", "append"):
        _spark_refused(rows, real, [tmp_path / "real"], mode)


@pytest.mark.spark
def test_spark_writer_replaces_its_own_output_only_at_commit(spark, rows, tmp_path):
    """previous-output (both modes replace it, at commit; a failed commit leaves it whole) and
    previous-output-read (the job reads the output it replaces: every read is done before the
    commit)."""
    dst = tmp_path / "dst"
    _save(rows, dst, "append")  # the safe form: a new DST
    n = cqforensics.read_table(dst).num_rows
    assert n == rows.count()
    _save(rows, dst, "append", template=False)
    assert cqforensics.read_table(dst).num_rows == 2 * n
    before = fingerprint(tmp_path)
    renamed = rows.withColumn("queue", rows.queue.substr(1, 3))  # queues DST's metadata does not declare
    msg = _spark_refused(renamed, dst, [tmp_path], "overwrite", template=False)  # fails at commit
    assert "not durable queues" in msg and fingerprint(tmp_path) == before
    mine = spark.read.format("rabbitcq").load(str(dst)).where("queue = 'work'")
    _save(mine, dst, "overwrite", template=False)
    assert {r["queue"] for r in cqforensics.read_table(dst).to_pylist()} == {"work"}
    assert [p.name for p in tmp_path.iterdir()] == ["dst"]


@pytest.mark.spark
def test_spark_writer_refuses_its_own_output_written_for_a_version_that_cannot_boot(spark, rows, tmp_path):
    dst = tmp_path / "dst"
    _save(rows, dst, "append")
    w = rows.write.format("rabbitcq").option("brokerVersion", "3.10").mode("overwrite")
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    before = fingerprint(tmp_path)
    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        w.save(str(dst))
    assert "cannot boot the metadata" in str(e.value) and "Traceback" not in str(e.value)
    assert fingerprint(tmp_path) == before
