"""AMQP 1.0 message sections: a bounded decoder of the AMQP 1.0 type system, and the typed
JSON form of its values (and of the Erlang-tagged values RabbitMQ keeps in ``#mc{}``).

Used for ``#mc{mc_amqp}`` bodies: 4.x stores the bare message and footer as the original
bytes (``BareAndFooter``), 3.13 stored ``'v1_0.*'`` records. Encoding: OASIS AMQP 1.0
part 1 (types) and part 3 (message format); RabbitMQ's amqp10_binary_parser.erl.

Typed JSON: ``{"type": "<amqp type>", "value": ...}``; binary values carry ``"base64"``;
``map`` values are ``[[key, value], ...]`` (keys are typed too); described values
``{"type": "described", "descriptor": ..., "value": ...}``.
"""

from __future__ import annotations

import base64
import math
import struct
import uuid as _uuid

from cqforensics.base.errors import FormatError, plural


def _char(v) -> str:
    """An AMQP 1.0 char: a Unicode scalar value (a UTF-16 surrogate or a number past U+10FFFF
    is damage: it has no UTF-8 form)."""
    if not isinstance(v, int) or not (0 <= v < 0x110000) or 0xD800 <= v <= 0xDFFF:
        raise FormatError(f"char {v!r} is not a Unicode scalar value")
    return chr(v)


# section descriptors (ulong codes, part 3 section 3.2)
HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES = 0x70, 0x71, 0x72, 0x73, 0x74
DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x75, 0x76, 0x77, 0x78
SECTION_NAMES = {
    HEADER: "header",
    DELIVERY_ANNOTATIONS: "delivery-annotations",
    MESSAGE_ANNOTATIONS: "message-annotations",
    PROPERTIES: "properties",
    APPLICATION_PROPERTIES: "application-properties",
    DATA: "data",
    AMQP_SEQUENCE: "amqp-sequence",
    AMQP_VALUE: "amqp-value",
    FOOTER: "footer",
}
_SYMBOLIC = {
    f"amqp:{n}:{k}": c
    for c, n, k in (
        (HEADER, "header", "list"),
        (DELIVERY_ANNOTATIONS, "delivery-annotations", "map"),
        (MESSAGE_ANNOTATIONS, "message-annotations", "map"),
        (PROPERTIES, "properties", "list"),
        (APPLICATION_PROPERTIES, "application-properties", "map"),
        (DATA, "data", "binary"),
        (AMQP_SEQUENCE, "amqp-sequence", "list"),
        (AMQP_VALUE, "amqp-value", "*"),
        (FOOTER, "footer", "map"),
    )
}

PROPERTY_FIELDS = (
    "message_id",
    "user_id",
    "to",
    "subject",
    "reply_to",
    "correlation_id",
    "content_type",
    "content_encoding",
    "absolute_expiry_time",
    "creation_time",
    "group_id",
    "group_sequence",
    "reply_to_group_id",
)
HEADER_FIELDS = ("durable", "priority", "ttl", "first_acquirer", "delivery_count")

_FIXED = {
    0x50: ("ubyte", ">B"),
    0x60: ("ushort", ">H"),
    0x70: ("uint", ">I"),
    0x52: ("uint", ">B"),
    0x80: ("ulong", ">Q"),
    0x53: ("ulong", ">B"),
    0x51: ("byte", ">b"),
    0x61: ("short", ">h"),
    0x71: ("int", ">i"),
    0x54: ("int", ">b"),
    0x81: ("long", ">q"),
    0x55: ("long", ">b"),
    0x72: ("float", ">f"),
    0x82: ("double", ">d"),
    0x83: ("timestamp", ">q"),
    0x73: ("char", ">I"),
}
_FIXED = {k: (n, struct.Struct(f)) for k, (n, f) in _FIXED.items()}
MAX_DEPTH = 100

#: constructors of an array's elements (amqp10_binary_parser parse_constructor) and the fewest
#: bytes each element takes: its fixed width, or its size field. The constants null, true,
#: false, uint0 and ulong0 take one byte each in an array (parse_array_primitive), not none.
_UNIT = frozenset({0x40, 0x41, 0x42, 0x43, 0x44})
_ARRAY_WIDTH = {
    **{c: st.size for c, (_, st) in _FIXED.items()},
    **dict.fromkeys(_UNIT, 1),
    0x56: 1,
    0x98: 16,
    0x74: 4,
    0x84: 8,
    0x94: 16,
    0xA0: 1,
    0xA1: 1,
    0xA3: 1,
    0xB0: 4,
    0xB1: 4,
    0xB3: 4,
    0xC0: 2,
    0xC1: 2,
    0xD0: 8,
    0xD1: 8,
    0xE0: 3,
    0xF0: 9,
}


def _num(v):
    return v if not isinstance(v, float) or math.isfinite(v) else repr(v)


class Decoder:
    """Decodes AMQP 1.0 encoded values from ``buf`` into typed JSON."""

    def __init__(self, buf):
        self.buf = buf
        self.end = len(buf)

    def need(self, o: int, n: int) -> None:
        if o + n > self.end:
            raise FormatError(f"AMQP value needs {plural(n, 'byte')}, {self.end - o} left", offset=o)

    def value(self, o: int, depth: int = 0, code: int | None = None) -> tuple[dict, int]:
        if depth > MAX_DEPTH:
            raise FormatError("AMQP values nested too deeply", offset=o)
        if code is None:
            self.need(o, 1)
            code, o = self.buf[o], o + 1
        buf = self.buf
        if code == 0x00:
            desc, o = self.value(o, depth + 1)
            val, o = self.value(o, depth + 1)
            return {"type": "described", "descriptor": desc, "value": val}, o
        fx = _FIXED.get(code)
        if fx is not None:
            name, st = fx
            self.need(o, st.size)
            (v,) = st.unpack_from(buf, o)
            if name == "char":
                v = _char(v)
            return {"type": name, "value": _num(v)}, o + st.size
        if code == 0x40:
            return {"type": "null", "value": None}, o
        if code in (0x41, 0x42):
            return {"type": "boolean", "value": code == 0x41}, o
        if code == 0x56:
            self.need(o, 1)
            return {"type": "boolean", "value": buf[o] != 0}, o + 1
        if code in (0x43, 0x44):
            return {"type": "uint" if code == 0x43 else "ulong", "value": 0}, o
        if code == 0x45:
            return {"type": "list", "value": []}, o
        if code == 0x98:
            self.need(o, 16)
            return {"type": "uuid", "value": str(_uuid.UUID(bytes=bytes(buf[o : o + 16])))}, o + 16
        if code in (0x74, 0x84, 0x94):
            n = {0x74: 4, 0x84: 8, 0x94: 16}[code]
            self.need(o, n)
            return {"type": f"decimal{n * 8}", "base64": base64.b64encode(bytes(buf[o : o + n])).decode()}, o + n
        if code in (0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xB3):
            wide = code >= 0xB0
            self.need(o, 4 if wide else 1)
            n = struct.unpack_from(">I", buf, o)[0] if wide else buf[o]
            o += 4 if wide else 1
            self.need(o, n)
            raw = bytes(buf[o : o + n])
            if code in (0xA0, 0xB0):
                return {"type": "binary", "base64": base64.b64encode(raw).decode()}, o + n
            kind = "string" if code in (0xA1, 0xB1) else "symbol"
            try:
                return {"type": kind, "value": raw.decode("utf-8")}, o + n
            except UnicodeDecodeError:  # RabbitMQ's parser takes the bytes as they are (3.10 writes a
                # non-UTF-8 longstr header as utf8): kept, as base64
                return {"type": kind, "base64": base64.b64encode(raw).decode()}, o + n
        if code in (0xC0, 0xD0, 0xC1, 0xD1):
            wide = code >= 0xD0
            self.need(o, 8 if wide else 2)
            size, count = struct.unpack_from(">II" if wide else ">BB", buf, o)
            body = o + (4 if wide else 1)
            o += 8 if wide else 2
            if body + size > self.end or count > size:
                raise FormatError(
                    f"compound of {plural(size, 'byte')} / {plural(count, 'item')} does not fit", offset=body
                )
            items = []
            for _ in range(count):
                v, o = self.value(o, depth + 1)
                items.append(v)
            if o != body + size:
                raise FormatError("compound items do not fill its size", offset=o)
            if code in (0xC0, 0xD0):
                return {"type": "list", "value": items}, o
            if count % 2:
                raise FormatError("map with an odd number of items", offset=body)
            return {"type": "map", "value": [[items[i], items[i + 1]] for i in range(0, count, 2)]}, o
        if code in (0xE0, 0xF0):
            wide = code == 0xF0
            self.need(o, 8 if wide else 2)
            size, count = struct.unpack_from(">II" if wide else ">BB", buf, o)
            body = o + (4 if wide else 1)
            o += 8 if wide else 2
            if body + size > self.end or size < (5 if wide else 2):
                raise FormatError(f"array of {size} bytes does not fit", offset=body)
            elem, o = buf[o], o + 1
            if elem == 0x00:
                raise FormatError("described array elements are not supported", offset=o - 1)
            end = body + size
            width = _ARRAY_WIDTH.get(elem)
            if width is None:
                raise FormatError(f"{elem:#04x} is no array element constructor", offset=o - 1)
            # checked before anything is built: every element takes at least ``width`` bytes
            if count * width > end - o:
                raise FormatError(f"array of {count} elements does not fit its {end - o} bytes", offset=body)
            items = []
            for _ in range(count):
                if elem in _UNIT:  # amqp10_binary_parser parse_array_primitive: one byte each
                    v, o = self.value(o + 1, depth + 1, code=elem)
                else:
                    v, o = self.value(o, depth + 1, code=elem)
                items.append(v)
            if o != end:
                raise FormatError("array elements do not fill its size", offset=o)
            return {"type": "array", "value": items}, o
        raise FormatError(f"unknown AMQP 1.0 type code {code:#04x}", offset=o - 1)


def section_code(desc: dict) -> int | None:
    if desc.get("type") == "ulong":
        return desc["value"]
    if desc.get("type") == "symbol":
        return _SYMBOLIC.get(desc["value"])
    return None


def sections(buf) -> list[tuple[int, dict, int, int]]:
    """Top-level sections of an encoded message: (code, value, start, end) in order."""
    d = Decoder(buf)
    out, o = [], 0
    while o < len(buf):
        start = o
        if buf[o] != 0x00:
            raise FormatError(f"section does not start with a descriptor (byte {buf[o]:#04x})", offset=o)
        v, o = d.value(o)
        out.append((section_code(v["descriptor"]), v["value"], start, o))
    return out


def plain(v):
    """Typed JSON -> a plain Python value (strings, ints, bytes for binary) for simple fields."""
    if v is None:
        return None
    if "base64" in v:
        return base64.b64decode(v["base64"])
    if v["type"] == "null":
        return None
    return v["value"]


def fields(list_value: dict | None, names: tuple[str, ...]) -> dict:
    """A section's list value -> {field name: typed value} (absent / null fields are None)."""
    items = list_value["value"] if list_value and list_value.get("type") == "list" else []
    out = dict.fromkeys(names)
    for name, v in zip(names, items):
        out[name] = None if v["type"] == "null" else v
    return out


def map_object(map_value: dict | None) -> dict:
    """A map section with string/symbol keys -> {key: typed value}."""
    out = {}
    for k, v in map_value["value"] if map_value and map_value.get("type") == "map" else []:
        out[str(plain(k)) if not isinstance(plain(k), bytes) else plain(k).decode("utf-8", "replace")] = v
    return out


# -- Erlang-tagged values (#mc annotations, 3.13 'v1_0.*' records) -------------------------------

_ERL_NUMERIC = {"ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long", "timestamp"}


def _bin(t: tuple) -> bytes:
    """The binary of a tagged value ``{Tag, Bin}``: anything else is damage (never ``bytes(N)``,
    which would allocate N bytes)."""
    if len(t) < 2 or not isinstance(t[1], (bytes, bytearray)):
        raise FormatError(f"AMQP 1.0 {str(t[0])[:20]} value holds no binary")
    return bytes(t[1])


def erlang_value(t) -> dict:
    """An amqp10_binary_parser term ({utf8, Bin}, {ulong, N}, {map, [...]}, null, ...) -> typed JSON."""
    if t == "null" or t is None or t == "undefined":
        return {"type": "null", "value": None}
    if t in ("true", "false") and isinstance(t, str):
        return {"type": "boolean", "value": t == "true"}
    if isinstance(t, tuple) and t:
        tag = str(t[0])
        if tag == "utf8":
            return {"type": "string", "value": _bin(t).decode("utf-8", "replace")}
        if tag == "symbol":
            return {"type": "symbol", "value": _bin(t).decode("utf-8", "replace")}
        if tag == "binary":
            return {"type": "binary", "base64": base64.b64encode(_bin(t)).decode()}
        if tag in _ERL_NUMERIC:
            if len(t) < 2 or not isinstance(t[1], int) or isinstance(t[1], bool):
                raise FormatError(f"AMQP 1.0 {tag} value holds no integer")
            return {"type": tag, "value": t[1]}
        if tag in ("float", "double"):
            return {"type": tag, "value": _num(float(t[1]))}
        if tag == "boolean":
            return {"type": "boolean", "value": t[1] in ("true", True)}
        if tag == "char":
            return {"type": "char", "value": _char(t[1])}
        if tag == "uuid":
            return {"type": "uuid", "value": str(_uuid.UUID(bytes=_bin(t)))}
        if tag == "list":
            return {"type": "list", "value": [erlang_value(x) for x in t[1]]}
        if tag == "map":
            return {"type": "map", "value": [[erlang_value(k), erlang_value(v)] for k, v in t[1]]}
        if tag == "array":
            return {"type": "array", "value": [erlang_value(x) for x in t[2]]}
        if tag == "described":
            return {"type": "described", "descriptor": erlang_value(t[1]), "value": erlang_value(t[2])}
        if tag.startswith("decimal"):
            return {"type": tag, "base64": base64.b64encode(_bin(t)).decode()}
    if isinstance(t, bytes):
        return {"type": "binary", "base64": base64.b64encode(t).decode()}
    raise FormatError(f"unknown AMQP 1.0 term ({type(t).__name__})")
