"""Issue 3's correctness bar: for every sample, the messages the readers say survive a restart
are exactly what the real broker delivered after its restart (count, order, body, exchange,
routing key, properties, typed headers; AMQP 1.0 sections for 1.0 messages)."""

import pytest

import cqforensics
from support import SAMPLES, dataset_params, manifest
from support.oracle import compare


@pytest.mark.parametrize("dataset", dataset_params())
def test_survivors_equal_what_the_broker_delivered(dataset):
    m = manifest(dataset)
    rows = cqforensics.read_table(SAMPLES / dataset, "messages", as_of=m["restarted_at_ms"]).to_pylist()
    assert rows
    # a stream's records are what a consumer from first is served, not a queue drained: the
    # manifest's streams, compared record by record in tests/model/test_streams.py
    assert compare(dataset, [r for r in rows if r["queue_type"] != "stream"]) == []


@pytest.mark.parametrize("dataset", dataset_params())
def test_every_message_decodes(dataset):
    rows = cqforensics.read_table(
        SAMPLES / dataset,
        "messages",
        columns=["queue", "decode_error", "term_format", "store_file", "drop_reason", "queue_type"],
    ).to_pylist()
    assert [r for r in rows if r["decode_error"]] == []
    # every body found decodes; the ones not found are transient bodies a kill -9 never flushed (a
    # stream's record is in its segment, not a store: its file is the row's file)
    assert all(r["term_format"] for r in rows if r["store_file"] or r["queue_type"] == "stream")
    assert all(
        r["drop_reason"] in ("transient", "queue_deleted")
        for r in rows
        if not r["store_file"] and r["queue_type"] != "stream"
    )


def test_drop_reasons_explain_every_non_survivor():
    """The datasets drop messages for the reasons the scenario set up: TTL, transient, exclusive queue."""
    reasons = {}
    for ds in ("3.10.8-kill", "4.3.6-kill"):
        m = manifest(ds)
        for r in cqforensics.read_table(
            SAMPLES / ds, "messages", as_of=m["restarted_at_ms"], columns=["queue", "drop_reason"]
        ).to_pylist():
            if r["drop_reason"]:
                reasons.setdefault(ds, {}).setdefault(r["drop_reason"], set()).add(r["queue"])
    for ds in reasons:
        assert "ttl.mixed" in reasons[ds]["expired"] and "ttl.queue" in reasons[ds]["expired"]
        assert "transient.mix" in reasons[ds]["transient"]
    # 4.x pages an exclusive queue's messages to disk; the boot deletes its dir
    assert reasons["4.3.6-kill"]["queue_deleted"] == {"session.exclusive"}


def test_as_of_moves_ttl_expiry():
    """Judged before the stop, the TTL messages were still deliverable."""
    m = manifest("4.3.6-clean")
    early = cqforensics.read_table(
        SAMPLES / "4.3.6-clean", "messages", as_of=m["stopped_at_ms"] - 60_000, columns=["queue", "drop_reason"]
    ).to_pylist()
    assert not [r for r in early if r["drop_reason"] == "expired"]
