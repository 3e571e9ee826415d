"""The command line: exit codes, JSON documents, read-only guarantee, companions."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

import damage
from cli.main import main
from conftest import ROOT, SAMPLES, copy_node


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def fingerprint(root) -> dict:
    """Every file's bytes and mtime, and every dir's listing, under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        out[dirpath] = sorted(dirnames + filenames)
        for n in filenames:
            p = os.path.join(dirpath, n)
            st = os.stat(p)
            with open(p, "rb") as f:
                out[p] = (hashlib.sha256(f.read()).hexdigest(), st.st_mtime_ns, st.st_size)
    return out


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
        {k: f[k] for k in ("code", "file", "offset")} for f in lines]


def test_fsck_predicts_for_another_version(capsys, tmp_path):
    node = copy_node("3.10.8-kill", tmp_path / "mnesia")
    import cqforensics

    rdq = max(node.glob("msg_stores/vhosts/*/msg_store_persistent/*.rdq"), key=lambda p: p.stat().st_size)
    e = [r for r in cqforensics.read_table(node, "store", columns=["file", "offset", "total_size"]).to_pylist()
         if r["file"] == str(rdq)][2]
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
    from cqforensics import fsck

    def interrupted(*a, **k):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(fsck, "fsck", interrupted)
    assert run(capsys, "fsck", str(SAMPLES / "4.3.6-kill"))[0] == 32


def test_no_traceback_reaches_the_user(tmp_path):
    (tmp_path / "msg_stores" / "vhosts" / "X").mkdir(parents=True)
    (tmp_path / "msg_stores" / "vhosts" / "X" / "queues").write_text("not a dir")
    p = subprocess.run([sys.executable, "-m", "cqforensics", "fsck", str(tmp_path)], capture_output=True, text=True,
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
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

    code, _, err = run(capsys, "export", str(SAMPLES / "3.10.8-clean"), "--format", "jsonl", "--out",
                       str(tmp_path / "x"))
    assert code == 0 and "index" in err
    rows = [json.loads(x) for x in (tmp_path / "x" / "messages.jsonl").read_text().splitlines()]
    want = cqforensics.read_table(SAMPLES / "3.10.8-clean", "messages", columns=["body"]).column("body").to_pylist()
    assert [base64.b64decode(r["body_base64"]) if "body_base64" in r else None for r in rows] == want
    assert all(r["source"] == "index" for r in rows)


def test_export_all_recovers_acked_bodies(capsys, tmp_path):
    code, _, err = run(capsys, "export", str(SAMPLES / "4.3.6-clean"), "--format", "parquet", "--out",
                       str(tmp_path / "x"), "--all")
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "x" / "messages.parquet")
    sources = set(t.column("source").to_pylist())
    assert sources == {"index", "orphan"}


def test_dump_every_kind(capsys):
    kill = SAMPLES / "3.10.8-kill" / "mnesia" / "rabbit@localhost"
    clean = SAMPLES / "3.10.8-clean" / "mnesia" / "rabbit@localhost"  # recovery terms exist after a clean stop
    for node, pattern in ((kill, "msg_stores/vhosts/*/msg_store_persistent/0.rdq"),
                          (kill, "msg_stores/vhosts/*/queues/*/0.qi"), (kill, "msg_stores/vhosts/*/queues/*/0.qs"),
                          (kill, "msg_stores/vhosts/*/queues/*/0.idx"), (kill, "msg_stores/vhosts/*/queues/*/journal.jif"),
                          (clean, "msg_stores/vhosts/*/recovery.dets"), (kill, "LATEST.LOG")):
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
