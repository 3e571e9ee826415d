"""Messages published over STOMP 1.2 (issue 14). The STOMP plugin publishes them as AMQP 0-9-1
messages (rabbit_stomp_util:message_properties): the headers that name a basic property fill
it, ``persistent:true`` makes delivery mode 2, every other header (custom ones, and the frame's
``receipt`` and ``content-length``) becomes a longstr header. The stored message keeps no mark of
STOMP, so the messages table shows it as the AMQP 0-9-1 message it is; these tests check it
against the broker's delivery and against what the STOMP client sent."""

from __future__ import annotations

import hashlib
import json

import pytest

import cqforensics
from support import SAMPLES, datasets, manifest

PROTO = [d for d in datasets() if "-proto-" in d]

#: STOMP header -> basic property (rabbit_stomp_util:message_properties)
MAPPED = {
    "content-type": "content_type",
    "content-encoding": "content_encoding",
    "correlation-id": "correlation_id",
    "reply-to": "reply_to",
    "expiration": "expiration",
    "amqp-message-id": "message_id",
    "type": "type",
    "user-id": "user_id",
    "app-id": "app_id",
}
NOT_HEADERS = set(MAPPED) | {"priority", "timestamp", "persistent", "destination"}


def _by_body(dataset):
    rows = cqforensics.read_table(SAMPLES / dataset, "messages", as_of=manifest(dataset)["restarted_at_ms"]).to_pylist()
    return {hashlib.sha256(r["body"] or b"").hexdigest(): r for r in rows}


@pytest.mark.parametrize("dataset", PROTO)
def test_stomp_frames_become_the_amqp091_messages_the_table_shows(dataset):
    rows = _by_body(dataset)
    sent = [p for p in manifest(dataset)["published"] if p["protocol"] == "stomp"]
    assert len(sent) == 11
    delivered = {msg["body_sha256"] for q in manifest(dataset)["queues"] for msg in q["messages"]}
    for p in sent:
        persistent = p["headers"].get("persistent") == "true"
        assert (p["body_sha256"] in delivered) == persistent, p["destination"]  # transient: dropped at restart
        r = rows.get(p["body_sha256"])
        if r is None:  # a transient message need not reach the disk
            assert not persistent
            continue
        assert r["survives_restart"] == persistent and r["persistent"] == persistent
        props = r["properties"]
        assert props["delivery_mode"] == (2 if persistent else None)
        for h, prop in MAPPED.items():
            assert props[prop] == p["headers"].get(h), h
        ts = props["timestamp"]
        assert (None if ts is None else int(ts.timestamp())) == (
            int(p["headers"]["timestamp"]) if "timestamp" in p["headers"] else None
        )
        assert props["priority"] == (int(p["headers"]["priority"]) if "priority" in p["headers"] else None)
        headers = json.loads(r["headers"])
        custom = {k: v for k, v in p["headers"].items() if k not in NOT_HEADERS}
        assert {k: headers[k] for k in custom} == {k: {"type": "longstr", "value": v} for k, v in custom.items()}
        assert headers["content-length"] == {"type": "longstr", "value": str(p["body_len"])}
        assert "receipt" in headers and not NOT_HEADERS & set(headers)
        dest = p["destination"]
        if dest.startswith("/queue/") or dest.startswith("/amq/queue/"):
            assert (r["exchange"], r["routing_keys"][0]) == ("", dest.rsplit("/", 1)[1])
        elif dest.startswith("/topic/"):
            assert (r["exchange"], r["routing_keys"][0]) == ("amq.topic", dest[len("/topic/") :])
        else:
            _, _, x, rk = dest.split("/")
            assert (r["exchange"], r["routing_keys"][0]) == (x, rk)


@pytest.mark.parametrize("dataset", PROTO)
def test_stomp_queue_declared_by_stomp_is_durable_and_delivered(dataset):
    q = next(q for q in manifest(dataset)["queues"] if q["name"] == "stomp.q")
    assert q["durable"] and len(q["messages"]) == 3
