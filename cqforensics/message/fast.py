"""Fast decoding of the common stored-message layouts, falling back to ``message.normalise``.

Almost every stored message is one of two byte layouts whose leading terms never vary:

* 3.13+/4.x ``{mc, mc_amqpl, {content, 60, none, PropsBin, rabbit_framing_amqp_0_9_1, [Body]}, Anns}``
* 3.10-3.12 ``{basic_message, {resource, VHost, exchange, X}, Rks, {content, 60, none, PropsBin,
  rabbit_framing_amqp_0_9_1, [Body]}, Id, IsPersistent}``

Matching the constant byte runs with ``startswith`` and reading binaries with one struct
unpack replaces about twenty generic term decodes. Anything else (decoded properties, several
body fragments, other protocols, damage) goes through the generic path; tests check that both
paths give the same result on every sample message.
"""

from __future__ import annotations

import struct

from cqforensics.base.errors import FormatError
from cqforensics.codecs import etf
from cqforensics.message import reference as message

_U32 = struct.Struct(">I").unpack_from
_I32 = struct.Struct(">i").unpack_from
_ATOMS: dict[bytes, etf.Atom] = {}
_PROPS = message._PROPS_CACHE
# annotations with no part in the 0-9-1 view: the id, exchange and routing key columns and the
# receive timestamp (4.x stamps every message with it)
_PLAIN_ANNS = frozenset({"id", "x", "rk", "rts"})


def _atom_of(raw: bytes, utf8: bool) -> etf.Atom:
    a = _ATOMS.get(raw)
    if a is None:
        a = etf.Atom(raw.decode("utf-8" if utf8 else "latin-1"), utf8)
        if len(_ATOMS) < 4096:
            _ATOMS[raw] = a
    return a


def _map(raw: bytes, p: int) -> tuple[dict, int]:
    """The annotations map at p (tag 't'), with the common key/value tags decoded inline."""
    (n,) = _U32(raw, p + 1)
    p += 5
    out = {}
    for _ in range(n):
        tag = raw[p]
        if tag == 119:  # SMALL_ATOM_UTF8
            k = raw[p + 2 : p + 2 + raw[p + 1]]
            key, p = _atom_of(k, True), p + 2 + len(k)
        elif tag == 100:  # ATOM_EXT
            ln = (raw[p + 1] << 8) | raw[p + 2]
            key, p = _atom_of(raw[p + 3 : p + 3 + ln], False), p + 3 + ln
        else:
            key, p = etf.decode_at(raw, p)
        tag = raw[p]
        if tag == 109:  # BINARY
            (ln,) = _U32(raw, p + 1)
            v, p = raw[p + 5 : p + 5 + ln], p + 5 + ln
        elif tag == 97:  # SMALL_INTEGER
            v, p = raw[p + 1], p + 2
        elif tag == 98:  # INTEGER
            v, p = _I32(raw, p + 1)[0], p + 5
        elif tag == 110 and raw[p + 2] == 0:  # SMALL_BIG, positive (ms timestamps)
            ln = raw[p + 1]
            v, p = int.from_bytes(raw[p + 3 : p + 3 + ln], "little"), p + 3 + ln
        elif tag == 119:
            a = raw[p + 2 : p + 2 + raw[p + 1]]
            v, p = _atom_of(a, True), p + 2 + len(a)
        elif tag == 108 and raw[p + 5] == 109:  # LIST of binaries (routing keys)
            v, p = _binaries(raw, p)
        elif tag == 106:  # NIL
            v, p = [], p + 1
        else:
            v, p = etf.decode_at(raw, p)
        out[key] = v
    if p > len(raw):
        raise FormatError("annotations run past the term", offset=p)
    return out, p


def _binaries(raw: bytes, p: int) -> tuple[list, int]:
    """A proper list of binaries at p (tag 'l'); anything else goes to the generic decoder."""
    (n,) = _U32(raw, p + 1)
    q, items = p + 5, []
    for _ in range(n):
        if raw[q] != 109:
            return etf.decode_at(raw, p)
        (ln,) = _U32(raw, q + 1)
        items.append(raw[q + 5 : q + 5 + ln])
        q += 5 + ln
    if raw[q] != 106:
        return etf.decode_at(raw, p)
    return items, q + 1


def _atom(name: bytes, utf8: bool) -> bytes:
    return (b"w" + bytes([len(name)]) if utf8 else b"d" + len(name).to_bytes(2, "big")) + name


def _layout(utf8: bool) -> dict:
    def a(n):
        return _atom(n, utf8)

    return {
        "mc": b"\x83h\x04" + a(b"mc") + a(b"mc_amqpl"),
        "bm": b"\x83h\x06" + a(b"basic_message") + b"h\x04" + a(b"resource") + b"m",
        "exchange": a(b"exchange") + b"m",
        "content": b"h\x06" + a(b"content") + b"a<" + a(b"none") + b"m",
        "framing": a(b"rabbit_framing_amqp_0_9_1") + b"l\x00\x00\x00\x01m",
        "true": a(b"true"),
        "false": a(b"false"),
    }


_LAYOUTS = (_layout(True), _layout(False))


def _binary(raw: bytes, p: int) -> tuple[bytes, int]:
    (n,) = _U32(raw, p)
    end = p + 4 + n
    if end > len(raw):
        raise FormatError("binary runs past the term", offset=p)
    return raw[p + 4 : end], end


def _content(raw: bytes, p: int, lay: dict):
    """A #content{} with encoded properties and one body fragment at p: (props, body, end) or None."""
    if not raw.startswith(lay["content"], p):
        return None
    props, p = _binary(raw, p + len(lay["content"]))
    if not raw.startswith(lay["framing"], p):
        return None
    body, p = _binary(raw, p + len(lay["framing"]))
    if raw[p : p + 1] != b"j":
        return None
    return props, body, p + 1


def decode(raw) -> dict:
    """Stored term bytes -> what ``message.decode_stored`` returns (same values)."""
    raw = bytes(raw)
    try:  # any surprise in the fast path (damage, an unusual term) means: take the generic path
        for lay in _LAYOUTS:
            if raw.startswith(lay["mc"]):
                return _mc_amqpl(raw, lay) or message.decode_stored(raw)
            if raw.startswith(lay["bm"]):
                return _basic_message(raw, lay) or message.decode_stored(raw)
    except (FormatError, etf.EtfError, struct.error, IndexError, UnicodeDecodeError):
        pass
    return message.decode_stored(raw)


def _mc_amqpl(raw: bytes, lay: dict) -> dict | None:
    c = _content(raw, len(lay["mc"]), lay)
    if c is None:
        return None
    props_bin, body, p = c
    if raw[p : p + 1] != b"t":
        return None
    anns, end = _map(raw, p)
    props, headers = _PROPS.get(props_bin)
    props = props.copy()
    marks: list[str] = []
    common = message._mc_common(anns, marks)
    if anns.keys() <= _PLAIN_ANNS:  # nothing for the 0-9-1 view to apply (mc_amqpl:protocol_state)
        rts = anns.get("rts")
        annotations = (
            None if rts is None else f'{{"rts":{rts}}}' if type(rts) is int else message._annotations_json(anns)
        )
        if props["delivery_mode"] is None:
            props["delivery_mode"] = 2
        ts = None if props["timestamp"] is None else props["timestamp"] * 1000
    else:
        props, headers, ts = message._amqpl_view(props, headers, anns, marks)
        if ts is None and props["timestamp"] is not None:
            ts = props["timestamp"] * 1000
        annotations = message._annotations_json(anns)
    return {
        **common,
        "properties": props,
        "timestamp_ms": ts,
        "headers": headers,
        "annotations": annotations,
        "body": body,
        "term_format": "mc_amqpl",
        "marks": marks,
    }


def _basic_message(raw: bytes, lay: dict) -> dict | None:
    _, p = _binary(raw, len(lay["bm"]))  # vhost
    if not raw.startswith(lay["exchange"], p):
        return None
    x, p = _binary(raw, p + len(lay["exchange"]))
    rks, p = etf.decode_at(raw, p)
    c = _content(raw, p, lay)
    if c is None:
        return None
    props_bin, body, p = c
    if raw[p : p + 5] != b"m\x00\x00\x00\x10":
        return None
    msg_id = raw[p + 5 : p + 21]
    p += 21
    if raw.startswith(lay["true"], p):
        persistent = True
    elif raw.startswith(lay["false"], p):
        persistent = False
    else:
        return None
    props, headers = message.props_from_bin(props_bin)
    marks: list[str] = []
    return {
        "msg_id": msg_id,
        "persistent": persistent,
        "exchange": x.decode("utf-8", "replace"),
        "routing_keys": message._texts(marks, "routing_keys", rks),
        "properties": props,
        "timestamp_ms": None if props["timestamp"] is None else props["timestamp"] * 1000,
        "headers": headers,
        "annotations": None,
        "body": body,
        "term_format": "basic_message",
        "marks": marks,
    }
