"""Queue storage cqforensics does not read yet, on nodes real brokers wrote (issue 28): a node
holding quorum queues and a stream beside its classic queues. Until those kinds are read, every
front end names them, and fsck's exit code says its check is incomplete (bit 2).

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
from conftest import need_broker

pytestmark = pytest.mark.broker

VERSIONS = ("4.3.6", "3.10.8")
CLASSIC, QUORUM, STREAM = ("cq.a", "cq.b"), ("qq.a", "qq.dlx"), ("st.a",)


@pytest.fixture(scope="module", params=VERSIONS)
def node(request, tmp_path_factory) -> Path:
    """A node dir with two classic queues, two quorum queues (one with a dead-letter exchange and
    a delivery limit) and a stream, 7 persistent messages in each, written by a real broker."""
    from cqforensics.broker import Broker

    import pika

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
            ch.queue_declare("qq.dlx", durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 3,
                                                                "x-dead-letter-exchange": "",
                                                                "x-dead-letter-routing-key": "cq.b"})
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


def test_fsck_names_the_quorum_queues_and_the_stream_and_exits_2(capsys, node):
    code, out, _ = run(capsys, "fsck", node)
    assert code == 2, out
    assert "NOT READ: 2 quorum queues: 'qq.a' (vhost '/'), 'qq.dlx' (vhost '/')" in out
    assert "NOT READ: 1 stream: 'st.a' (vhost '/')" in out
    assert "exit 2: no errors; check incomplete" in out
    code, out, _ = run(capsys, "fsck", "--json", node)
    doc = json.loads(out)
    kinds = {u["kind"]: u for u in doc["nodes"][0]["not_read"]}
    assert set(kinds) == {"quorum", "stream"} and doc["exit_code"] == 2
    assert {q["queue"] for q in kinds["quorum"]["queues"]} == set(QUORUM) and kinds["quorum"]["data_dirs"] == 2
    assert [q["queue"] for q in kinds["stream"]["queues"]] == ["st.a"] and kinds["stream"]["data_dirs"] == 1
    assert {(f["code"], f["details"]["kind"]) for f in doc["findings"] if f["code"] == "storage-not-read"} == \
        {("storage-not-read", "quorum"), ("storage-not-read", "stream")}
    assert {q["queue"]: q["messages"] for q in doc["queues"]} == {q: 7 for q in CLASSIC}  # the classic ones: read


def test_a_filter_naming_a_quorum_queue_or_a_stream_says_it_is_not_read(capsys, node):
    code, _, err = run(capsys, "read", node, "--queue", "qq.a")
    assert code == 16 and "queue 'qq.a' is a quorum queue" in err and "does not read quorum queues" in err
    code, _, err = run(capsys, "fsck", node, "--queue", "st.a")
    assert code == 16 and "queue 'st.a' is a stream" in err


def test_the_tables_say_what_they_leave_out(node, caplog, monkeypatch):
    from cqforensics import driver

    monkeypatch.setattr(driver, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="cqforensics.driver"):
        t = cqforensics.read_table(node, "messages", columns=["queue"])
    assert set(t.column("queue").to_pylist()) == set(CLASSIC)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "2 quorum queues not read: 'qq.a' (vhost '/'), 'qq.dlx' (vhost '/')" in said and "'st.a'" in said
    f = cqforensics.read_table(node, "findings", columns=["code", "details"]).to_pylist()
    assert sorted(json.loads(r["details"])["kind"] for r in f if r["code"] == "storage-not-read") == ["quorum", "stream"]


def test_audit_export_and_report_name_them(capsys, node, tmp_path):
    code, out, _ = run(capsys, "audit", "--json", node)
    assert {u["kind"] for u in json.loads(out)["nodes"][0]["not_read"]} == {"quorum", "stream"}
    code, out, _ = run(capsys, "audit", node)
    assert "NOT READ on rabbit@localhost: 2 quorum queues: 'qq.a'" in out
    code, _, err = run(capsys, "export", node, "--format", "jsonl", "--out", tmp_path / "x")
    assert code == 0 and "NOT READ on rabbit@localhost: 1 stream: 'st.a' (vhost '/')" in err
    code, _, _ = run(capsys, "report", node, "--html", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert 'class="meta not-read" data-kind="quorum"' in page and 'data-kind="stream"' in page
    assert "qq.dlx" in page and 'class="meta crash incomplete"' in page
