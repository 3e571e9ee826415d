"""Messages published over MQTT 3.1.1 and 5.0 (issue 14): the messages table shows what an AMQP
0-9-1 consumer of the real broker received (the ``*-proto-*`` samples' manifests), field by
field, and keeps the MQTT view (topic, QoS, retain, MQTT 5.0 properties) in ``annotations``.

4.x stores them as ``#mc{mc_mqtt}`` and converts them at delivery (mc_mqtt:convert_to(mc_amqpl)
then mc_amqpl:protocol_state); 3.10 stores what its plugin published over AMQP 0-9-1."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

import cqforensics
from cqforensics.codecs import etf
from cqforensics.message import reference as message
from support import SAMPLES, datasets, manifest
from support.oracle import compare

PROTO = [d for d in datasets() if "-proto-" in d]
PROTO_4X = [d for d in PROTO if d.startswith("4.")]
PROTO_310 = [d for d in PROTO if d.startswith("3.10.")]

#: manifest key of a published MQTT 5.0 property -> its MQTT name in annotations["mqtt"]
MQTT_NAMES = {
    "content_type": "Content-Type",
    "response_topic": "Response-Topic",
    "correlation_data": "Correlation-Data",
    "message_expiry_interval": "Message-Expiry-Interval",
    "payload_format_indicator": "Payload-Format-Indicator",
    "user_property": "User-Property",
}


def _rows(dataset: str) -> list[dict]:
    return cqforensics.read_table(SAMPLES / dataset, "messages", as_of=manifest(dataset)["restarted_at_ms"]).to_pylist()


def _sha(row) -> str:
    return hashlib.sha256(row["body"] or b"").hexdigest()


def test_the_protocol_samples_exist():
    """Both stop modes on every version a broker runs here; MQTT 5.0 on 4.x."""
    for version in ("3.10.8", "4.0.5", "4.3.6"):
        assert {f"{version}-proto-clean", f"{version}-proto-kill"} <= set(PROTO), version
    for ds in PROTO:
        m = manifest(ds)
        assert m["plugins"] == ["rabbitmq_mqtt", "rabbitmq_stomp"]
        versions = {p["version"] for p in m["published"] if p["protocol"] == "mqtt"}
        assert versions == ({"3.1.1", "5.0"} if ds.startswith("4.") else {"3.1.1"}), ds
        assert any(p["protocol"] == "stomp" for p in m["published"])


@pytest.mark.parametrize("dataset", PROTO)
def test_messages_equal_the_amqp091_deliveries(dataset):
    """Count, order, body, exchange, routing key, all 13 properties and typed headers."""
    rows = _rows(dataset)
    assert compare(dataset, rows) == []
    delivered = [msg for q in manifest(dataset)["queues"] for msg in q["messages"]]
    assert len(delivered) == sum(r["survives_restart"] for r in rows)


@pytest.mark.parametrize("dataset", PROTO_4X)
def test_mqtt5_properties_reach_the_amqp091_view(dataset):
    """The conversions the issue names are all exercised (and, by the test above, right)."""
    delivered = [msg for q in manifest(dataset)["queues"] if q["name"].startswith("mqtt") for msg in q["messages"]]
    props = [m["properties"] for m in delivered]
    headers = [m["headers"] or {} for m in delivered]
    assert {"application/json", "text/plain", "application/octet-stream"} <= {p["content_type"] for p in props}
    assert any(p["expiration"] == str(10 * 365 * 86400 * 1000) and p["timestamp"] for p in props)
    assert {"corr-5-1", "off-1"} <= {p["correlation_id"] for p in props}
    assert any("x-correlation-id" in h and "base64" in h["x-correlation-id"] for h in headers)
    assert {"replies.v5.client-1", "replies.a.b", "back.to.me"} <= {
        h["x-reply-to-topic"]["value"] for h in headers if "x-reply-to-topic" in h
    }
    user = next(h for h in headers if "region" in h)
    assert user["dup"]["value"] == "first" and user["x-tenant"]["value"] == "acme" and "ключ" in user
    assert {p["delivery_mode"] for p in props} == {2}


@pytest.mark.parametrize("dataset", PROTO_4X)
def test_mc_mqtt_annotations_keep_what_the_publisher_sent(dataset):
    """annotations["mqtt"]: topic, QoS, retain and the MQTT 5.0 properties as published."""
    published = {(p["topic"], p["body_sha256"]): p for p in manifest(dataset)["published"] if p["protocol"] == "mqtt"}
    rows = [r for r in _rows(dataset) if r["term_format"] == "mc_mqtt"]
    assert len(rows) >= 20
    for r in rows:
        mqtt = json.loads(r["annotations"])["mqtt"]
        sent = published[(mqtt["topic"], _sha(r))]
        assert (mqtt["qos"], mqtt["retain"], mqtt["dup"]) == (sent["qos"], sent["retain"], False)
        assert (
            r["exchange"] == "amq.topic"
            and r["routing_keys"][0] == message.mqtt_to_amqp(sent["topic"].encode()).decode()
        )
        want = {}
        for k, v in sent["properties"].items():
            if k == "correlation_data":
                v = base64.b64decode(v["base64"])
            want[MQTT_NAMES[k]] = v
        got = dict(mqtt["properties"])
        if "Correlation-Data" in got:
            c = got["Correlation-Data"]
            got["Correlation-Data"] = base64.b64decode(c["base64"]) if isinstance(c, dict) else c.encode()
        assert got == want, (r["queue"], mqtt["topic"])
        # QoS 0 is a transient message: the restart drops it
        assert r["persistent"] == (sent["qos"] == 1)
        assert r["survives_restart"] or r["drop_reason"] in ("transient", "expired")


@pytest.mark.parametrize("dataset", PROTO_4X)
def test_offline_sessions_hold_their_queued_messages(dataset):
    """Persistent sessions (3.1.1 clean_session false; 5.0 session expiry) that went offline:
    their QoS 1 queue holds what was published meanwhile, and the QoS 0 ones are dropped."""
    rows = _rows(dataset)
    for q in ("mqtt-subscription-sub311qos1", "mqtt-subscription-sub5qos1"):
        mine = [r for r in rows if r["queue"] == q]
        kept = [r for r in mine if r["survives_restart"]]
        assert kept and len(kept) == len(next(x for x in manifest(dataset)["queues"] if x["name"] == q)["messages"])
        if dataset.endswith("-clean"):  # a kill -9 may leave the transient ones unwritten
            assert {r["drop_reason"] for r in mine} == {None, "transient"}


@pytest.mark.parametrize("dataset", PROTO_310)
def test_310_stores_what_its_plugin_published_over_amqp091(dataset):
    """3.10's MQTT plugin is an AMQP 0-9-1 client: x-mqtt-publish-qos / x-mqtt-dup headers."""
    published = {p["body_sha256"]: p for p in manifest(dataset)["published"] if p["protocol"] == "mqtt"}
    rows = [r for r in _rows(dataset) if _sha(r) in published and r["exchange"] == "amq.topic"]
    assert len(rows) >= 8 and {r["term_format"] for r in rows} == {"basic_message"}
    for r in rows:
        sent = published[_sha(r)]
        h = json.loads(r["headers"])
        assert h["x-mqtt-publish-qos"] == {"type": "byte", "value": sent["qos"]}
        assert h["x-mqtt-dup"] == {"type": "bool", "value": False}
        assert r["routing_keys"][0] == sent["topic"].replace("/", ".")
        assert r["properties"]["delivery_mode"] == (2 if sent["qos"] else 1)


# -- crafted #mc{mc_mqtt} terms: the conversion rules one by one -----------------------------------

A = etf.Atom


def _mc(props: dict, qos: int = 1, anns: dict | None = None, topic: bytes = b"a/b", payload=b"p"):
    state = (A("mqtt_msg"), A("false"), qos, topic, A("false"), 3, payload, props, A("undefined"))
    base = {A("x"): b"amq.topic", A("rk"): [mqtt_rk(topic)], A("d"): A("true" if qos else "false")}
    return message.normalise((A("mc"), A("mc_mqtt"), state, {**base, **(anns or {})}))


def mqtt_rk(topic: bytes) -> bytes:
    return message.mqtt_to_amqp(topic)


def test_mqtt_311_message_is_a_bare_persistent_message():
    m = _mc({})
    assert m["properties"] == {**dict.fromkeys(m["properties"]), "delivery_mode": 2}
    assert m["headers"] is None and m["body"] == b"p" and m["term_format"] == "mc_mqtt"
    assert _mc({}, qos=0)["properties"]["delivery_mode"] == 1
    mqtt = json.loads(m["annotations"])["mqtt"]
    assert mqtt == {"topic": "a/b", "qos": 1, "retain": False, "dup": False, "packet_id": 3, "properties": {}}


def test_content_type_only_when_ascii_and_short():
    assert _mc({A("Content-Type"): b"application/json"})["properties"]["content_type"] == "application/json"
    assert _mc({A("Content-Type"): "text/ü".encode()})["properties"]["content_type"] is None
    assert _mc({A("Content-Type"): b"a" * 256})["properties"]["content_type"] is None
    assert _mc({A("Content-Type"): b"a" * 255})["properties"]["content_type"] == "a" * 255


def test_correlation_data_is_the_correlation_id_or_an_x_header():
    assert _mc({A("Correlation-Data"): b"c-1"})["properties"]["correlation_id"] == "c-1"
    for corr in (b"\x00bin", b"x" * 256, b"\xff"):
        m = _mc({A("Correlation-Data"): corr})
        assert m["properties"]["correlation_id"] is None
        h = json.loads(m["headers"])["x-correlation-id"]
        assert h["type"] == "longstr" and (h.get("value", "").encode() or base64.b64decode(h["base64"])) == corr


def test_response_topic_user_properties_and_header_order():
    m = _mc(
        {
            A("Response-Topic"): b"re/ply.x/+",
            A("User-Property"): [
                (b"z", b"1"),
                (b"a", b"2"),
                (b"a", b"3"),
                (b"x-reply-to-topic", b"user"),
                (b"k" * 256, b"too long a name"),
            ],
        }
    )
    h = json.loads(m["headers"])
    assert list(h) == ["a", "x-reply-to-topic", "z"]  # sorted by name, the first of a name wins
    assert h["a"]["value"] == "2" and h["x-reply-to-topic"]["value"] == "re.ply.x.*"


def test_message_expiry_gives_expiration_and_the_timestamp_annotation_the_timestamp():
    m = _mc({A("Message-Expiry-Interval"): 60}, anns={A("ttl"): 60_000, A("ts"): 1_700_000_000_123})
    assert m["properties"]["expiration"] == "60000" and m["properties"]["timestamp"] == 1_700_000_000
    assert m["timestamp_ms"] == 1_700_000_000_123
    assert json.loads(m["annotations"])["mqtt"]["properties"] == {"Message-Expiry-Interval": 60}


def test_x_annotations_become_headers_as_for_every_mc_message():
    m = _mc({}, anns={b"x-opt": b"v"})
    assert json.loads(m["headers"]) == {"x-opt": {"type": "longstr", "value": "v"}}


def test_iodata_payload_and_bad_states():
    assert _mc({}, payload=[b"ab", [b"c", 100], b""])["body"] == b"abcd"
    from cqforensics.base.errors import FormatError

    with pytest.raises(FormatError):
        _mc({}, qos=2)
    with pytest.raises(FormatError):
        _mc({}, payload=[b"a", A("x")])
