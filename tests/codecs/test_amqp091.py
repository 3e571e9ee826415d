"""AMQP 0-9-1 properties and field tables: typed JSON round-trips every type."""

import json

import pytest

from cqforensics.base.errors import FormatError
from cqforensics.codecs import amqp091
from support import manifest

ALL = {
    "s": {"type": "longstr", "value": "plain ✓"},
    "latin1": {"type": "longstr", "base64": "Y2Fm6Q=="},
    "x": {"type": "binary", "base64": "AAH+/w=="},
    "b": {"type": "byte", "value": -7},
    "B": {"type": "unsignedbyte", "value": 250},
    "sh": {"type": "short", "value": -30000},
    "u": {"type": "unsignedshort", "value": 65000},
    "I": {"type": "signedint", "value": -2000000000},
    "i": {"type": "unsignedint", "value": 4000000000},
    "l": {"type": "long", "value": -(2**62)},
    "f": {"type": "float", "value": 3.25},
    "d": {"type": "double", "value": -1e-300},
    "nan": {"type": "double", "value": "nan"},
    "D": {"type": "decimal", "value": {"scale": 3, "value": 1234567}},
    "t": {"type": "bool", "value": False},
    "T": {"type": "timestamp", "value": 1700000000},
    "V": {"type": "void", "value": None},
    "F": {"type": "table", "value": {"inner": {"type": "signedint", "value": 1}}},
    "A": {"type": "array", "value": [{"type": "byte", "value": 1}, {"type": "table", "value": {}}]},
}


def test_table_roundtrip_every_type():
    raw = amqp091.encode_table(ALL)
    assert amqp091.decode_table(raw) == ALL
    assert amqp091.encode_table(amqp091.decode_table(raw)) == raw


def test_table_json_text_is_the_encoders_text():
    """The decoder writes JSON text directly; it must be what the encoder gives for the dict
    (the ``headers`` column), repeated names included (first place, last value, as a dict)."""
    raw = amqp091.encode_table(ALL)
    assert amqp091.table_json(raw) == amqp091.headers_json(ALL)
    twice = b"\x01kS\x00\x00\x00\x01a" + b"\x01jI\x00\x00\x00\x02" + b"\x01kS\x00\x00\x00\x01b"
    assert amqp091.table_json(twice) == amqp091.headers_json(
        {"k": {"type": "longstr", "value": "b"}, "j": {"type": "signedint", "value": 2}}
    )
    ctl = amqp091.encode_table({'q"\\\n': {"type": "longstr", "value": '\u2028\x00"é'}})
    assert amqp091.table_json(ctl) == amqp091.headers_json(amqp091.decode_table(ctl))


def test_properties_roundtrip():
    props = dict.fromkeys(amqp091.SCALAR_PROPERTIES)
    props.update(
        content_type="application/json",
        delivery_mode=2,
        priority=9,
        timestamp=1700000000,
        user_id="guest",
        cluster_id="c",
    )
    raw = amqp091.encode_properties(props, ALL)
    assert amqp091.decode_properties(raw) == (props, ALL)


def test_sample_headers_of_every_type_decode_like_the_oracle():
    """The all-types header the generator sent, as the broker delivered it."""
    msg = next(
        m
        for q in manifest("4.3.6-clean")["queues"]
        if q["name"] == "orders.v2"
        for m in q["messages"]
        if m["headers"] and "decimal" in m["headers"]
    )
    raw = amqp091.encode_table(msg["headers"])
    assert json.loads(json.dumps(amqp091.decode_table(raw))) == msg["headers"]


def test_wire_L_reads_as_long_like_rabbitmq():
    raw = b"\x01kL" + (5).to_bytes(8, "big")
    assert amqp091.decode_table(raw) == {"k": {"type": "long", "value": 5}}


@pytest.mark.parametrize("raw", [b"\x01kS\x00\x00\x00\x09ab", b"\x01kZ", b"\x01kF\x00\x00\x00\x05\x01a", b"\x05"])
def test_damaged_tables_raise_format_errors(raw):
    with pytest.raises(FormatError):
        amqp091.decode_table(raw)


def test_typed_json_values_the_wire_cannot_hold_are_format_errors():
    """Issue 33: a typed-JSON string holding an integer (an edited export) made ``bytes(N)``, N
    zero bytes (a terabyte for 10^12); a number past its wire type's range failed deep in struct.
    Both are FormatErrors naming the value, before anything is allocated."""
    for props, headers in [
        ({}, {"h": {"type": "longstr", "value": 10**12}}),
        ({}, {"h": {"type": "byte", "value": 300}}),
        ({"priority": 1 << 40}, None),
        ({"timestamp": -1}, None),
    ]:
        with pytest.raises(FormatError):
            amqp091.encode_properties(props, headers)
