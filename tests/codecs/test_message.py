"""Stored message shapes -> the normalised form. Real terms come from the samples; the shapes
no sample broker wrote (MQTT, 3.13's AMQP 1.0 records and #deaths{}) are crafted here from the
record definitions and labelled as such."""

from __future__ import annotations

import json
import random

import pytest

import cqforensics
from cqforensics.base.errors import FormatError
from cqforensics.codecs import etf
from cqforensics.codecs.etf import Atom
from cqforensics.message import reference as message
from support import SAMPLES
from support.terms import stored_terms

A = Atom


def test_each_sample_version_has_its_term_shape():
    formats = {}
    for ds in ("3.10.8-clean", "4.0.5-clean", "4.3.6-clean"):
        rows = cqforensics.read_table(SAMPLES / ds, "messages", columns=["term_format"]).to_pylist()
        formats[ds] = {r["term_format"] for r in rows} - {None}
    assert formats["3.10.8-clean"] == {"basic_message"}
    assert formats["4.0.5-clean"] == formats["4.3.6-clean"] == {"mc_amqpl", "mc_amqp"}


def test_bit_flipped_terms_fail_cleanly():
    """A flipped bit anywhere in a real term: a clean FormatError, or a valid decode."""
    rnd = random.Random(7)
    terms = stored_terms()
    for _, _, raw in rnd.sample(terms, 120):
        for _ in range(5):
            b = bytearray(raw)
            b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
            try:
                message.decode_stored(bytes(b))
            except FormatError:
                pass


def crafted_content(body: bytes) -> tuple:
    props = b"\x90\x00" + b"\x0atext/plain" + b"\x02"  # content_type + delivery_mode
    return (A("content"), 60, A("none"), props, A("rabbit_framing_amqp_0_9_1"), [body])


def test_crafted_mc_amqpl_3_13_deaths_record_becomes_x_death():
    """3.13 keeps deaths as #deaths{first, last, records = #{{Queue, Reason} => #death{}}}."""
    death = (
        A("death"),
        b"dlx",
        [b"rk"],
        2,
        {A("first_time"): 1_700_000_000_000, A("last_time"): 1_700_000_001_000, A("ttl"): 5000},
    )
    anns = {
        A("id"): b"i" * 16,
        A("x"): b"dlx",
        A("rk"): [b"rk"],
        A("deaths"): (A("deaths"), (b"q1", A("expired")), (b"q1", A("expired")), {(b"q1", A("expired")): death}),
    }
    msg = message.normalise((A("mc"), A("mc_amqpl"), crafted_content(b"hi"), anns))
    xdeath = json.loads(msg["headers"])["x-death"]["value"][0]["value"]
    assert xdeath["count"] == {"type": "long", "value": 2}
    assert xdeath["original-expiration"] == {"type": "longstr", "value": "5000"}
    assert xdeath["time"] == {"type": "timestamp", "value": 1_700_000_000}
    assert msg["properties"]["content_type"] == "text/plain" and msg["body"] == b"hi"


def test_crafted_mc_amqp_3_13_records():
    """3.13: {msg, Header, DeliveryAnns, MessageAnns, Properties, AppProps, Data, Footer}."""
    props = (
        A("v1_0.properties"),
        (A("utf8"), b"id-1"),
        A("undefined"),
        A("undefined"),
        (A("utf8"), b"subj"),
        *([A("undefined")] * 2),
        (A("symbol"), b"text/plain"),
        *([A("undefined")] * 6),
    )
    app = (A("v1_0.application_properties"), [((A("utf8"), b"k"), (A("long"), 5))])
    data = [(A("v1_0.data"), b"payload")]
    term = (
        A("mc"),
        A("mc_amqp"),
        (A("msg"), A("undefined"), A("undefined"), A("undefined"), props, app, data, A("undefined")),
        {A("id"): b"j" * 16, A("x"): b"", A("rk"): [b"q"]},
    )
    msg = message.normalise(term)
    assert msg["term_format"] == "mc_amqp_3.13"
    assert msg["body"] == b"payload" and msg["properties"]["message_id"] == "id-1"
    assert msg["properties"]["type"] == "subj" and msg["properties"]["content_type"] == "text/plain"
    assert json.loads(msg["headers"]) == {"k": {"type": "long", "value": 5}}


def test_crafted_mc_mqtt():
    """mc_mqtt state: {mqtt_msg, Retain, Qos, Topic, Dup, PacketId, Payload, Props, Timestamp}."""
    state = (A("mqtt_msg"), A("false"), 1, b"sensors/1", A("false"), 7, b"21.5", {}, 1_700_000_000_000)
    msg = message.normalise(
        (A("mc"), A("mc_mqtt"), state, {A("id"): b"k" * 16, A("x"): b"amq.topic", A("rk"): [b"sensors.1"]})
    )
    assert msg["term_format"] == "mc_mqtt" and msg["body"] == b"21.5"
    assert json.loads(msg["annotations"])["mqtt"]["topic"] == "sensors/1"
    assert msg["routing_keys"] == ["sensors.1"] and msg["exchange"] == "amq.topic"


def test_basic_message_with_decoded_properties_and_fragments():
    """3.10 dead-lettering stores decoded 'P_basic'; bodies are reversed fragment lists."""
    p_basic = (A("P_basic"), b"text/plain", A("undefined"), [(b"h", A("longstr"), b"v")], 2, *([A("undefined")] * 10))
    content = (A("content"), 60, p_basic, A("none"), A("none"), [b"world", b"hello "])
    term = (A("basic_message"), (A("resource"), b"/", A("exchange"), b"x"), [b"rk"], content, b"m" * 16, A("true"))
    msg = message.normalise(term)
    assert msg["body"] == b"hello world"
    assert json.loads(msg["headers"]) == {"h": {"type": "longstr", "value": "v"}}
    assert msg["properties"]["delivery_mode"] == 2 and msg["exchange"] == "x"
    raw = etf.term_to_binary(term, utf8_atoms=False)
    assert message.decode_stored(raw) == msg


@pytest.mark.parametrize("term", [(A("mc"), A("mc_stomp"), None, {}), (A("basic_message"), 1), 42, (A("mc"),)])
def test_unknown_shapes_raise_format_errors(term):
    with pytest.raises(FormatError):
        message.normalise(term)
