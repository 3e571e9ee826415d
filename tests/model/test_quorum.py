"""Quorum queues read from their Ra logs, against what real brokers delivered: the replay
(model/fifo.py, model/quorum.py) on the six *-quorum-* samples (3.10.8, 4.0.5, 4.3.6, clean stop
and kill -9), the columns a quorum queue adds, the raft_log table, export and fsck."""

from __future__ import annotations

import json

import pytest

import cqforensics
from cqforensics.commands import export, fsck
from cqforensics.message import rabbit_fifo
from cqforensics.model import fifo as m_fifo
from support import SAMPLES
from support.oracle import manifest

QUORUM = sorted(p.name for p in SAMPLES.glob("*-quorum-*") if (p / "mnesia").is_dir())


@pytest.fixture(params=QUORUM)
def qds(request) -> str:
    return request.param


def _rows(ds: str, **kw) -> list[dict]:
    return cqforensics.read_table(
        SAMPLES / ds / "mnesia", "messages", as_of=manifest(ds)["restarted_at_ms"], **kw
    ).to_pylist()


def test_every_quorum_message_is_predicted_with_its_redelivered_flag(qds):
    """test_oracle compares bodies, properties and headers; here: the quorum columns, and that
    ``checked_out`` (or a delivery count) is exactly the broker's ``redelivered``."""
    m = manifest(qds)
    truth = {q["name"]: q["messages"] for q in m["queues"] if q.get("queue_type") == "quorum"}
    got: dict[str, list[dict]] = {}
    for r in _rows(qds):
        if r["queue_type"] == "quorum" and r["survives_restart"]:
            got.setdefault(r["queue"], []).append(r)
    assert set(got) == {k for k, v in truth.items() if v}
    for name, want in truth.items():
        rows = got.get(name, [])
        assert len(rows) == len(want), name
        for r, w in zip(rows, want):
            assert r["raft_index"] > 0 and r["raft_term"] >= 1 and r["location"] in ("wal", "segment")
            assert r["file"] and r["offset"] is not None and r["persistent"] is True
            headers = json.loads(r["headers"]) if r["headers"] else {}
            shown = headers.get("x-delivery-count", {}).get("value", 0)
            assert w["redelivered"] == (shown > 0 if qds.startswith("3.10") else "x-delivery-count" in headers), name
            if r["checked_out"]:
                assert w["redelivered"], (name, r["raft_index"])


def test_quorum_queues_in_the_queues_table_and_fsck(qds):
    m = manifest(qds)
    queues = {q["queue"]: q for q in cqforensics.read_table(SAMPLES / qds / "mnesia", "queues").to_pylist()}
    report = fsck.run(SAMPLES / qds, as_of=m["restarted_at_ms"])
    verdicts = {v.queue: v for v in report.queues}
    for q in m["queues"]:
        if q.get("queue_type") != "quorum":
            continue
        row, v = queues[q["name"]], verdicts[q["name"]]
        assert row["queue_type"] == v.queue_type == "quorum"
        assert row["predicted_after_restart"] == v.predicted_after_restart == len(q["messages"])
        assert row["name_source"] == "ra_config" and row["queue_dir"].endswith(row["queue_dir"].split("/")[-1])
    assert report.exit_code == 0 and not [f for f in report.findings if f.severity == "error"]


def test_raft_log_lists_every_entry_copy_and_the_commands(qds):
    t = cqforensics.read_table(SAMPLES / qds / "mnesia", "raft_log").to_pylist()
    assert t
    by_queue: dict[str, list] = {}
    for r in t:
        by_queue.setdefault(r["queue"], []).append(r)
        assert r["command"] in rabbit_fifo.COMMANDS + ("noop", None)
        assert r["checksum"] == "ok" and r["entry"] in rabbit_fifo.ENTRY_KINDS
    orders = by_queue["qq.orders"]
    used = [r for r in orders if r["recovered"]]
    assert len({r["raft_index"] for r in used}) == len(used)  # one copy of each index is used
    kinds = {r["command"] for r in used}
    assert {"enqueue", "checkout", "settle"} <= kinds and kinds & {"return", "requeue"}  # 3.10: nack -> requeue
    assert sum(r["command"] == "enqueue" for r in orders) >= 16  # the kept messages' enqueues at least
    assert all(r["timestamp"] is not None for r in used if r["entry"] == "command")


def test_export_recovers_quorum_messages_and_all_recovers_consumed_ones(qds, tmp_path):
    out = tmp_path / "out"
    export.export([SAMPLES / qds / "mnesia"], "jsonl", out, queues=["qq.orders"])
    lines = [json.loads(x) for x in (out / "messages.jsonl").read_text().splitlines()]
    kept = [x for x in lines if x["source"] == "index"]
    assert len(kept) == 14 and all(x["queue_type"] == "quorum" for x in kept)
    out2 = tmp_path / "all"
    export.export([SAMPLES / qds / "mnesia"], "jsonl", out2, everything=True, queues=["qq.orders"])
    more = [json.loads(x) for x in (out2 / "messages.jsonl").read_text().splitlines()]
    from_log = [x for x in more if x["source"] == "raft_log"]
    assert from_log  # consumed and acked messages the log still holds
    assert all(x["queue_type"] == "quorum" and x["raft_index"] and x["body_base64"] is not None for x in from_log)
    ids = {x["properties"]["message_id"] for x in from_log}
    # the two acked before the stop: the first two delivered (4.0: priorities above 4 first, 4.3: by priority)
    acked = {"3.10.8": {"msg-0", "qq.orders-1"}, "4.0.5": {"msg-6", "qq.orders-5"}, "4.3.6": {"msg-9", "qq.orders-8"}}[
        qds.split("-")[0]
    ]
    assert acked <= ids and len(from_log) > 100  # and churn messages the log still holds


def test_front_ends_name_the_queue_type():
    """fsck's text table gets a type column, the HTML report says which queues are quorum (Ra
    log), audit locates a quorum message by its raft index (and its output stays valid)."""
    import io

    import jsonschema

    from cli.render import fsck_text
    from cqforensics import json_schemas as schemas
    from cqforensics.commands import audit, report

    ds = "4.0.5-quorum-kill"
    path, as_of = SAMPLES / ds / "mnesia", manifest(ds)["restarted_at_ms"]
    buf = io.StringIO()
    fsck_text(fsck.run(path, as_of=as_of), buf)
    head = next(line for line in buf.getvalue().splitlines() if line.startswith("vhost"))
    assert head.split()[:3] == ["vhost", "queue", "type"]
    assert any(line.split()[1:3] == ["qq.orders", "quorum"] for line in buf.getvalue().splitlines())
    html = report.render([path], as_of=as_of)
    assert 'data-queue="qq.orders" data-type="quorum"' in html and "quorum (Ra log)" in html
    assert 'data-queue="cq.side" data-type="classic"' in html
    a = audit.audit([path], as_of=as_of)
    jsonschema.validate(json.loads(json.dumps(a, default=str)), schemas.load("audit"))


def test_machine_versions_behave_as_their_sources_say():
    """Crafted states (no broker): 4.0-4.2 serve priorities above 4 two to one, 4.3 by level,
    and the dequeue counter is part of the state (a purge resets it)."""
    q = m_fifo.FifoQ()
    for i, hi in enumerate([False, True, False, True, True, True]):
        q.put(m_fifo.Msg(i + 1, {"size": 1}, 9 if hi else 0), hi)
    assert [q.pop().index for _ in range(6)] == [2, 4, 1, 5, 6, 3]  # hi, hi, then a lower no, ...
    p = m_fifo.PrioQ()
    for i, prio in enumerate([4, 9, 0, 4]):
        p.put(m_fifo.Msg(i + 1, {"size": 1}, prio), prio)
    assert [p.pop().index for _ in range(4)] == [2, 1, 4, 3]
