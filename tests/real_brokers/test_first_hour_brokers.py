"""Queue storage on nodes real brokers wrote (issues 28, 30, 31): a node holding quorum queues and
a stream beside its classic queues. Every kind is read by every front end: its queues and messages
are listed, nothing is named as not read, and fsck's check is complete (no exit bit 2). The
mechanism that names a kind not read (``layout.STORAGE_KINDS``) is tested on a crafted kind in
tests/commands/test_first_hour.py.

One broker per version writes the node (module fixture: booted once, queues declared, messages
published with confirms, stopped cleanly); every case reads a copy of it."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import pytest

import cqforensics
from cli.main import main
from support import need_broker

pytestmark = pytest.mark.broker

VERSIONS = ("4.3.6", "3.10.8")
CLASSIC, QUORUM, STREAM = ("cq.a", "cq.b"), ("qq.a", "qq.dlx"), ("st.a",)


@pytest.fixture(scope="module", params=VERSIONS)
def node(request, tmp_path_factory) -> Path:
    """A node dir with two classic queues, two quorum queues (one with a dead-letter exchange and
    a delivery limit) and a stream, 7 persistent messages in each, written by a real broker."""
    import pika

    from brokers import Broker

    version = request.param
    need_broker(version)
    base = Path(tempfile.mkdtemp(prefix="cqf-broker-"))
    base.chmod(0o755)
    try:
        with Broker(version, base / "run") as b:
            b.start()
            conn = pika.BlockingConnection(pika.URLParameters(b.url))
            ch = conn.channel()
            ch.confirm_delivery()
            for q in CLASSIC:
                ch.queue_declare(q, durable=True)
            ch.queue_declare("qq.a", durable=True, arguments={"x-queue-type": "quorum"})
            ch.queue_declare(
                "qq.dlx",
                durable=True,
                arguments={
                    "x-queue-type": "quorum",
                    "x-delivery-limit": 3,
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": "cq.b",
                },
            )
            ch.queue_declare("st.a", durable=True, arguments={"x-queue-type": "stream"})
            for i in range(7):
                for q in CLASSIC + QUORUM + STREAM:
                    ch.basic_publish("", q, b"m%d" % i, pika.BasicProperties(delivery_mode=2))
            conn.close()
            b.wait_durable(*CLASSIC, *QUORUM, *STREAM)
            b.stop()
            out = tmp_path_factory.mktemp(f"node-{version}") / "mnesia"
            shutil.copytree(b.mnesia_base, out, symlinks=True)
        yield out / "rabbit@localhost"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_fsck_reads_every_kind_and_its_check_is_complete(capsys, node):
    code, out, _ = run(capsys, "fsck", node)
    assert code == 0, out
    assert "NOT READ" not in out and "st.a" in out and "qq.dlx" in out
    assert "exit 0: no errors" in out
    code, out, _ = run(capsys, "fsck", "--json", node)
    doc = json.loads(out)
    kinds = {u["kind"]: u for u in doc["nodes"][0]["not_read"]}
    assert not kinds and doc["exit_code"] == 0
    assert not [f for f in doc["findings"] if f["code"] == "storage-not-read"]
    # every message predicted to come back, whatever the kind of queue
    assert {q["queue"]: (q["messages"], q["predicted_after_restart"], q["queue_type"]) for q in doc["queues"]} == {
        **{q: (7, 7, "classic") for q in CLASSIC},
        **{q: (7, 7, "quorum") for q in QUORUM},
        "st.a": (7, 7, "stream"),
    }


def test_a_filter_naming_a_quorum_queue_or_a_stream_reads_it(capsys, node):
    code, out, err = run(capsys, "read", node, "--queue", "qq.a", "--columns", "queue,queue_type,body")
    assert code == 0, err
    assert out.count("qq.a") == 7 and "quorum" in out
    code, out, err = run(capsys, "fsck", node, "--queue", "st.a")
    assert code == 0 and "st.a" in out, err


def test_the_tables_hold_every_kind_and_leave_nothing_out(node, caplog, monkeypatch):
    from cqforensics.read import driver

    monkeypatch.setattr(driver, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="cqforensics.read.driver"):
        t = cqforensics.read_table(node, "messages", columns=["queue", "queue_type", "body"]).to_pylist()
    assert {r["queue"] for r in t} == set(CLASSIC + QUORUM) | {"st.a"}
    assert sorted(r["body"] for r in t if r["queue"] == "qq.dlx") == [b"m%d" % i for i in range(7)]
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "not read" not in said
    f = cqforensics.read_table(node, "findings", columns=["code", "details"]).to_pylist()
    assert not [r for r in f if r["code"] == "storage-not-read"]


def test_audit_export_and_report_read_every_kind(capsys, node, tmp_path):
    code, out, _ = run(capsys, "audit", "--json", node)
    assert json.loads(out)["nodes"][0]["not_read"] == []
    code, out, _ = run(capsys, "audit", node)
    assert "NOT READ" not in out
    code, _, err = run(capsys, "export", node, "--format", "jsonl", "--out", tmp_path / "x")
    assert code == 0 and "NOT READ" not in err and "7 stream" in err
    lines = [json.loads(line) for p in sorted((tmp_path / "x").rglob("*.jsonl")) for line in p.read_text().splitlines()]
    assert sum(1 for r in lines if r.get("queue") in QUORUM) == 14
    code, _, _ = run(capsys, "report", node, "--html", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert "not-read" not in page
    assert 'data-queue="qq.dlx" data-type="quorum"' in page and 'data-queue="st.a" data-type="stream"' in page
