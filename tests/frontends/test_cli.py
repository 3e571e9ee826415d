"""The command line: exit codes, JSON documents, read-only guarantee, companions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support import ROOT, SAMPLES, copy_node, damage, unreadable
from support.cli import fingerprint, run


def test_fsck_clean_samples_exit_0(capsys):
    for ds in ("3.10.8-clean", "3.10.8-kill", "4.0.5-kill", "4.3.6-clean", "4.3.6-rolled"):
        code, out, _ = run(capsys, "fsck", str(SAMPLES / ds))
        assert code == 0, out
        assert "exit 0: no errors" in out


def test_fsck_json_document(capsys):
    code, out, _ = run(capsys, "fsck", "--json", str(SAMPLES / "4.3.6-kill"))
    doc = json.loads(out)
    assert code == doc["exit_code"] == 0
    for f in doc["findings"]:
        assert {"code", "severity", "vhost", "queue", "file", "offset", "message"} <= set(f)
    q = {(q["vhost"], q["queue"]): q for q in doc["queues"]}
    assert q[("/", "jobs.prio")]["queue_dirs"] == 6  # priority levels summed into one entry
    assert {"vhost", "queue", "messages", "predicted_after_restart", "dropped"} <= set(q[("/", "jobs.prio")])
    assert q[("/", "session.exclusive")]["drop_reasons"] == {"queue_deleted": 5}
    assert doc["nodes"][0]["broker_version"] == "4.3"


def test_fsck_damage_exit_4_with_file_and_offset(capsys, tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    qi = sorted(node.glob("msg_stores/vhosts/*/queues/*/0.qi"))[0]
    damage.zero(qi, 0, 8)
    code, out, _ = run(capsys, "fsck", "--jsonl", str(node))
    assert code == 4
    lines = [json.loads(x) for x in out.splitlines()]
    assert {"code": "qi-bad-header", "file": str(qi), "offset": 0} in [
        {k: f[k] for k in ("code", "file", "offset")} for f in lines
    ]


def test_fsck_predicts_for_another_version(capsys, tmp_path):
    node = copy_node("3.10.8-kill", tmp_path / "mnesia")
    import cqforensics

    rdq = max(node.glob("msg_stores/vhosts/*/msg_store_persistent/*.rdq"), key=lambda p: p.stat().st_size)
    e = [
        r
        for r in cqforensics.read_table(node, "store", columns=["file", "offset", "total_size"]).to_pylist()
        if r["file"] == str(rdq)
    ][2]
    damage.zero(rdq, e["offset"], e["total_size"])
    _, out_old, _ = run(capsys, "fsck", "--json", "--broker-version", "3.10", str(node))
    _, out_new, _ = run(capsys, "fsck", "--json", "--broker-version", "4.0", str(node))
    old, new = json.loads(out_old), json.loads(out_new)
    # 3.10's scanner stops at the zeros and loses the rest of the file; 4.0 resynchronises
    assert old["summary"]["predicted_after_restart"] < new["summary"]["predicted_after_restart"]
    assert old["nodes"][0]["version_source"] == "--broker-version"
    assert any(f["code"] == "rdq-garbage" and f["offset"] == e["offset"] for f in old["findings"])


def test_exit_codes_operational_usage_interrupt(capsys, monkeypatch):
    assert run(capsys, "fsck", "/no/such/node")[0] == 8
    assert run(capsys, "fsck", "--json", "--jsonl", str(SAMPLES))[0] == 16
    assert run(capsys, "fsck")[0] == 16
    assert run(capsys, "fsck", "--help")[0] == 0
    assert run(capsys, "fsck", "--broker-version", "2.8", str(SAMPLES / "4.3.6-kill"))[0] == 16
    from cqforensics.commands import fsck

    def interrupted(*a, **k):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(fsck, "fsck", interrupted)
    assert run(capsys, "fsck", str(SAMPLES / "4.3.6-kill"))[0] == 32


def test_an_unexpected_exception_is_one_line_and_exit_8(capsys, monkeypatch):
    from cqforensics.commands import fsck

    def bug(*a, **k):
        raise RuntimeError("boom\nsecond line")
        yield

    monkeypatch.setattr(fsck, "fsck", bug)
    code, out, err = run(capsys, "fsck", str(SAMPLES / "4.3.6-kill"))
    assert code == 8 and out == ""
    assert err.count("\n") == 1 and "RuntimeError: boom second line" in err and "--traceback" in err
    assert "Traceback" not in err
    code, _, err = run(capsys, "--traceback", "fsck", str(SAMPLES / "4.3.6-kill"))
    assert code == 8 and "Traceback (most recent call last)" in err and "RuntimeError: boom" in err
    assert err.rstrip().splitlines()[-1].startswith("cqforensics: internal error: RuntimeError")


def test_interrupt_is_exit_32_without_traceback(capsys, monkeypatch):
    import cqforensics

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cqforensics, "iter_batches", interrupted)
    code, _, err = run(capsys, "--traceback", "read", str(SAMPLES / "4.3.6-kill"))
    assert code == 32 and err == "cqforensics: interrupted\n"


def test_errors_keep_their_exit_codes_and_name_the_file(capsys, monkeypatch, tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "in")
    marker = next(node.glob("msg_stores/vhosts/*/.vhost"))
    with monkeypatch.context() as m:
        unreadable(m, marker)
        for cmd in ("read", "fsck", "audit"):
            code, _, err = run(capsys, cmd, str(node))
            assert code == 8 and str(marker) in err and err.count("\n") == 1, (cmd, err)
    from cqforensics.model import vhost

    def denied(path):
        raise PermissionError(13, "Permission denied", str(path / "metadata"))

    monkeypatch.setattr(vhost, "read_metadata", denied)
    code, _, err = run(capsys, "read", "--table", "queues", str(SAMPLES / "4.3.6-kill"))
    assert code == 8 and err.startswith("cqforensics: ") and "metadata: Permission denied" in err
    assert run(capsys, "read", "--as-of", "yesterday", str(SAMPLES / "4.3.6-kill"))[0] == 16


def test_no_traceback_reaches_the_user(tmp_path):
    (tmp_path / "msg_stores" / "vhosts" / "X").mkdir(parents=True)
    (tmp_path / "msg_stores" / "vhosts" / "X" / "queues").write_text("not a dir")
    p = subprocess.run(
        [sys.executable, "-m", "cqforensics", "fsck", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert "Traceback" not in p.stderr and p.returncode in (0, 4, 8)


def test_every_command_leaves_the_input_untouched(capsys, tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "in")
    before = fingerprint(tmp_path / "in")
    run(capsys, "fsck", "--deep", str(node))
    run(capsys, "fsck", "--json", str(tmp_path / "in"))
    run(capsys, "audit", str(node))
    run(capsys, "export", str(node), "--format", "parquet", "--out", str(tmp_path / "out"), "--all")
    for t in ("messages", "store", "holes", "findings"):
        run(capsys, "read", str(node), "--table", t, "--format", "jsonl")
    for f in node.rglob("*"):
        if f.is_file() and f.suffix in (".rdq", ".qi", ".qs", ".ets"):
            run(capsys, "dump", "--deep", str(f))
    assert fingerprint(tmp_path / "in") == before


def test_fsck_on_a_read_only_mount(capsys, tmp_path):
    node = copy_node("3.10.8-kill", tmp_path / "src")
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:
        subprocess.run(["mount", "--bind", str(tmp_path / "src"), str(ro)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
    else:
        import shutil

        ro.rmdir()
        shutil.copytree(tmp_path / "src", ro)
        for dirpath, _, files in os.walk(ro):
            for n in files:
                os.chmod(os.path.join(dirpath, n), 0o444)
    try:
        with pytest.raises(OSError):
            (ro / "probe").write_text("x")
        code, out, _ = run(capsys, "fsck", "--json", str(ro))
        assert code == 0 and json.loads(out)["summary"]["messages"] > 0
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], check=False)
    del node


def test_fsck_warns_when_a_broker_runs_on_the_dir(capsys, tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    (node.parent / f"{node.name}.pid").write_text(str(os.getpid()))  # a live process claims the node
    code, _, err = run(capsys, "fsck", str(node))
    assert "appears to be running" in err and code == 0


def test_export_refuses_output_inside_the_input(capsys, tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    code, _, err = run(capsys, "export", str(node), "--format", "jsonl", "--out", str(node / "out"))
    assert code == 16 and "inside an input" in err
    assert not (node / "out").exists()


def test_export_jsonl_round_trips_bodies(capsys, tmp_path):
    import base64

    import cqforensics

    code, _, err = run(
        capsys, "export", str(SAMPLES / "3.10.8-clean"), "--format", "jsonl", "--out", str(tmp_path / "x")
    )
    assert code == 0 and "index" in err
    rows = [json.loads(x) for x in (tmp_path / "x" / "messages.jsonl").read_text().splitlines()]
    want = cqforensics.read_table(SAMPLES / "3.10.8-clean", "messages", columns=["body"]).column("body").to_pylist()
    assert [base64.b64decode(r["body_base64"]) if "body_base64" in r else None for r in rows] == want
    assert all(r["source"] == "index" for r in rows)


def test_export_all_recovers_acked_bodies(capsys, tmp_path):
    code, _, err = run(
        capsys, "export", str(SAMPLES / "4.3.6-clean"), "--format", "parquet", "--out", str(tmp_path / "x"), "--all"
    )
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "x" / "messages.parquet")
    sources = set(t.column("source").to_pylist())
    assert sources == {"index", "orphan"}


def test_dump_every_kind(capsys):
    kill = SAMPLES / "3.10.8-kill" / "mnesia" / "rabbit@localhost"
    clean = SAMPLES / "3.10.8-clean" / "mnesia" / "rabbit@localhost"  # recovery terms exist after a clean stop
    for node, pattern in (
        (kill, "msg_stores/vhosts/*/msg_store_persistent/0.rdq"),
        (kill, "msg_stores/vhosts/*/queues/*/0.qi"),
        (kill, "msg_stores/vhosts/*/queues/*/0.qs"),
        (kill, "msg_stores/vhosts/*/queues/*/0.idx"),
        (kill, "msg_stores/vhosts/*/queues/*/journal.jif"),
        (clean, "msg_stores/vhosts/*/recovery.dets"),
        (kill, "LATEST.LOG"),
    ):
        f = next(node.glob(pattern))
        code, out, _ = run(capsys, "dump", "--jsonl", "--deep", str(f))
        assert code == 0 and out.strip(), pattern
    assert run(capsys, "dump", str(kill / "schema.DAT"))[0] == 16


def test_audit_json(capsys):
    code, out, _ = run(capsys, "audit", "--json", str(SAMPLES / "4.3.6-clean"))
    a = json.loads(out)
    assert code == 0
    fan = [g for g in a["duplicates_by_message_id"] if g["kind"].startswith("fan-out")]
    assert fan and all(len(g["queues"]) >= 2 for g in fan)
    assert a["compaction"]["reclaimable_bytes"] > 0
    assert {o["status"] for o in a["orphans"]} == {"orphan"}


# -- front-end basics: version, help, argument checks, outputs, rendering -------------------------


def _all_parsers(parser):
    yield parser
    for a in parser._actions:
        if a.__class__.__name__ == "_SubParsersAction":
            for sub in a.choices.values():
                yield from _all_parsers(sub)


def test_every_argument_has_help():
    from cli.main import build_parser

    missing = [
        f"{p.prog}: {a.dest}"
        for p in _all_parsers(build_parser())
        for a in p._actions
        if not (a.help and a.help.strip())
    ]
    assert not missing, missing


def test_version(capsys):
    import cqforensics
    from cqforensics import compiled as core

    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"cqforensics {cqforensics.__version__} (compiled core: {core.status()})"


@pytest.mark.parametrize(
    "argv, option",
    [
        (["read", "--limit", "-1", "SAMPLE"], "--limit"),
        (["read", "--limit", "ten", "SAMPLE"], "--limit"),
        (["compact", "--file-size-limit", "0", "SAMPLE", "OUT"], "--file-size-limit"),
        (["rebuild", "--file-size-limit", "-5", "SAMPLE", "OUT"], "--file-size-limit"),
        (["dump", "--segment-entry-count", "0", "SAMPLE"], "--segment-entry-count"),
        (["read", "--as-of", "99999999999999999", "SAMPLE"], "--as-of"),
        (["fsck", "--as-of", "10000-01-01T00:00:00", "SAMPLE"], "--as-of"),
        (["audit", "--as-of", "yesterday", "SAMPLE"], "--as-of"),
    ],
)
def test_bad_values_are_one_line_usage_errors(capsys, tmp_path, argv, option):
    argv = [str(SAMPLES / "4.3.6-kill") if a == "SAMPLE" else str(tmp_path / "out") if a == "OUT" else a for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 16 and out == ""
    assert err.count("\n") == 1 and f"argument {option}:" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_limit_zero_and_a_good_as_of_are_accepted(capsys):
    code, out, _ = run(
        capsys,
        "read",
        "--limit",
        "0",
        "--format",
        "jsonl",
        "--as-of",
        "2026-01-01T00:00:00Z",
        str(SAMPLES / "4.3.6-kill"),
    )
    assert code == 0 and out == ""


def test_read_out_never_writes_into_the_evidence_nor_over_a_file(capsys, tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "in")
    before = fingerprint(tmp_path / "in")
    (tmp_path / "link").symlink_to(node)
    for out in (node / "rows.jsonl", node / "msg_stores" / "rows.jsonl", tmp_path / "link" / "rows.jsonl"):
        code, _, err = run(capsys, "read", str(node), "--format", "jsonl", "--out", str(out))
        assert code == 16 and "inside an input" in err and err.count("\n") == 1, err
    code, _, err = run(
        capsys, "read", str(tmp_path / "in"), "--format", "parquet", "--out", str(node / "x.parquet"), "--force"
    )
    assert code == 16 and "inside an input" in err  # --force never allows that
    assert fingerprint(tmp_path / "in") == before

    existing = tmp_path / "rows.jsonl"
    existing.write_text("keep me\n")
    for force in ([], ["--force"]):  # a file cqforensics did not write: never replaced
        code, _, err = run(capsys, "read", str(node), "--format", "jsonl", "--out", str(existing), *force)
        assert code == 16 and "exists" in err or "not an output of cqforensics" in err, err
        assert existing.read_text() == "keep me\n"
    existing.unlink()
    code, _, _ = run(capsys, "read", str(node), "--format", "jsonl", "--out", str(existing))
    code, _, _ = run(capsys, "read", str(node), "--format", "jsonl", "--out", str(existing), "--force")  # its own
    _, stdout, _ = run(capsys, "read", str(node), "--format", "jsonl")
    assert code == 0 and existing.read_text() == stdout and stdout.count("\n") == 93
    # no partial file left; the manifest beside the file says it is cqforensics's own
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".rows.jsonl.cqforensics-output.json",
        "in",
        "link",
        "rows.jsonl",
    ]
    (tmp_path / "d").mkdir()
    code, _, err = run(capsys, "read", str(node), "--out", str(tmp_path / "d"))
    assert code == 16 and "is a directory" in err


def test_every_output_follows_the_same_rules(capsys, tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "in")
    before = fingerprint(tmp_path / "in")
    for argv in (
        ["export", str(node), "--format", "jsonl", "--out", str(node / "x")],
        ["export", str(node), "--format", "jsonl", "--out", str(node / "x"), "--force"],
        ["compact", str(node), str(node / "x")],
        ["rebuild", str(node), str(node / "x"), "--force"],
        ["rebuild", str(node), str(tmp_path / "in")],
        ["compact", "--dry-run", str(node), str(node / "x")],
    ):
        code, _, err = run(capsys, *argv)
        assert code == 16 and "inside an input" in err and err.count("\n") == 1, (argv, err)
    assert fingerprint(tmp_path / "in") == before

    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("x")
    for argv in (
        ["export", str(node), "--format", "jsonl", "--out", str(full)],
        ["compact", str(node), str(full)],
        ["rebuild", str(node), str(full)],
    ):
        code, _, err = run(capsys, *argv)
        assert code == 16 and "not empty" in err and "--force" in err, (argv, err)
        code, _, err = run(capsys, *argv, "--force")  # not written by cqforensics: --force does not change that
        assert code == 16 and "not an output of cqforensics" in err, (argv, err)
        assert [p.name for p in full.iterdir()] == ["keep"]
    out = tmp_path / "out"
    code, _, _ = run(capsys, "export", str(node), "--format", "jsonl", "--out", str(out))
    assert code == 0 and sorted(p.name for p in out.iterdir()) == [
        ".cqforensics-output.json",
        "messages.jsonl",
        "messages.jsonl.provenance.json",
    ]
    code, _, _ = run(capsys, "compact", str(node), str(out), "--force")  # an output of cqforensics: replaced whole
    assert code == 0 and not (out / "messages.jsonl").exists() and (out / "msg_stores").is_dir()
    assert run(capsys, "verify", str(out))[0] == 0


def test_one_helper_decides_every_output_path():
    """Every command's output goes through ``cqforensics.output.guard.check_output``: no other module
    words (or decides) the inside-an-input rule."""
    import inspect

    from cli import main as cli_main
    from cqforensics.commands import export, republish
    from cqforensics.output import guard as outputs
    from cqforensics.write import rows, salvage

    for mod in (cli_main, export, salvage, rows, republish):
        assert "check_output(" in inspect.getsource(mod), mod.__name__
    deciders = [
        p.relative_to(ROOT).as_posix()
        for top in ("cqforensics", "cli", "spark_datasource")
        for p in (ROOT / top).rglob("*.py")
        if "may not be inside" in p.read_text()
    ]
    assert deciders == ["cqforensics/output/guard.py"], deciders
    assert outputs.check_output.__module__ == "cqforensics.output.guard"


def test_text_tables_keep_the_end_of_paths(capsys):
    import io

    from cli import render

    long = "/srv/backups/" + "very-long-directory-name/" * 6 + "msg_stores/vhosts/ABC/queues/DEF/12.qi"
    buf = io.StringIO()
    render.text_table([{"file": long, "message": "x" * 100}], ["file", "message"], buf, max_width=40)
    row = buf.getvalue().splitlines()[1]
    assert "…" + long[-39:] in row  # the tail, with the file name
    assert "x" * 39 + "…" in row  # other text keeps its head
    code, out, _ = run(capsys, "read", "--table", "files", str(SAMPLES / "4.3.6-kill"))
    import cqforensics

    files = cqforensics.read_table(SAMPLES / "4.3.6-kill", "files", columns=["file"]).column("file").to_pylist()
    lines = out.splitlines()[1:]
    assert code == 0 and len(lines) == len(files) and any(len(f) > 60 for f in files)
    for line, f in zip(lines, files):
        assert os.path.basename(f) in line, (f, line)


def test_dump_shows_erlang_terms_as_erlang_text(capsys):
    node = SAMPLES / "3.10.8-clean" / "mnesia" / "rabbit@localhost"
    code, out, _ = run(capsys, "dump", str(node / "LATEST.LOG"))
    assert code == 0
    assert "term={log_header,trans_log," in out and "<rabbit@localhost." in out  # a pid
    dets = next(node.glob("msg_stores/vhosts/*/recovery.dets"))
    code, out2, _ = run(capsys, "dump", str(dets))
    assert code == 0 and "{persistent_ref,<<" in out2 and "{next_seq_id," in out2
    code, out3, _ = run(
        capsys, "dump", "--deep", str(next(node.glob("msg_stores/vhosts/*/msg_store_persistent/0.rdq")))
    )
    assert code == 0 and 'routing_keys=["' in out3 and 'body_preview=<<"' in out3
    code, out4, _ = run(capsys, "dump", "--jsonl", str(node / "LATEST.LOG"))
    terms = [json.loads(x)["term"] for x in out4.splitlines() if "term" in json.loads(x)]
    assert terms and terms[0].startswith("{log_header,")
    import re

    for text in (out, out2, out3, *terms):
        for python_repr in ("Atom(", "Opaque(", "BitBinary(", "ImproperList(", "['", "True", "None"):
            assert python_repr not in text, python_repr
        assert not re.search(r"(^|[\s(\[,=:])b['\"]", text)  # no bytes reprs


def test_erlang_term_text():
    from cqforensics.codecs import etf

    A = etf.Atom
    cases = [
        (A("ok"), "ok"),
        (A("rabbit@host"), "rabbit@host"),
        (A("Hello"), "'Hello'"),
        (A("end"), "'end'"),
        (A("it's"), "'it\\'s'"),
        (A(""), "''"),
        (A("ü"), "'ü'"),
        (7, "7"),
        (-3, "-3"),
        (2**70, str(2**70)),
        (1.5, "1.5"),
        (b"", "<<>>"),
        (b"abc", '<<"abc">>'),
        ("eu-ü".encode(), '<<"eu-ü"/utf8>>'),
        (b"\x00\xff", "<<0,255>>"),
        (b'a"b\n', '<<"a\\"b\\n">>'),
        ((), "{}"),
        ((A("a"), 1, b"x"), '{a,1,<<"x">>}'),
        ([], "[]"),
        ([52, 46, 51], '"4.3"'),
        ([1, 2, 300], "[1,2,300]"),
        ([A("a"), [A("b")]], "[a,[b]]"),
        (etf.ImproperList([1, 2], A("t")), "[1,2|t]"),
        ({A("k"): [1]}, "#{k => [1]}"),
        (etf.BitBinary(b"\x01\xa0", 3), "<<1,5:3>>"),
    ]
    for term, text in cases:
        assert etf.format_term(term) == text, (term, etf.format_term(term), text)
    # terms as decoded from the wire: a pid keeps its node, id and serial
    raw = etf.term_to_binary((A("tid"), 30))
    assert etf.format_term(etf.binary_to_term(raw)) == "{tid,30}"
    log = SAMPLES / "3.10.8-clean" / "mnesia" / "rabbit@localhost" / "LATEST.LOG"
    from cqforensics.readers import terms

    texts = [etf.format_term(t) for t in terms.read_disk_log(log).items]
    assert any("{tid,30,<rabbit@localhost.576.0>}" in t for t in texts)
