"""AMQP 0-9-1 basic properties and field tables, and their typed-JSON form.

Wire format: FR091 (rabbit_framing_amqp_0_9_1.erl) decode_properties for class 60, and
BP/BG (rabbit_binary_parser / rabbit_binary_generator) for tables. Decoded Erlang form:
``{'P_basic', ContentType, ..., ClusterId}`` with headers ``[{Name, TypeAtom, Value}]``.

Typed JSON keeps every wire type, so a table round-trips (JSON -> bytes -> JSON):

    {"name": {"type": "longstr", "value": "text"},          # or "base64" when not UTF-8
     "n":    {"type": "signedint", "value": 7},
     "d":    {"type": "decimal", "value": {"scale": 2, "value": 12345}},
     "t":    {"type": "table", "value": {...}},
     "a":    {"type": "array", "value": [{"type": ..., "value": ...}, ...]}}

Type names are RabbitMQ's (longstr, timestamp, byte, unsignedbyte, short, unsignedshort,
signedint, unsignedint, double, float, long, bool, decimal, table, array, binary, void).
Wire type 'L' reads as ``long``, as RabbitMQ parses it, and is written back as 'l'.
Non-finite floats are the strings "nan", "inf", "-inf".
"""

from __future__ import annotations

import base64
import json
import math
import struct

from cqforensics.base.errors import FormatError, plural

#: The 14 basic properties in wire order (flag bit 15 down to bit 2).
PROPERTIES = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)
SCALAR_PROPERTIES = tuple(p for p in PROPERTIES if p != "headers")
_OCTET = ("delivery_mode", "priority")

TYPE_CHARS = {
    "S": "longstr",
    "T": "timestamp",
    "b": "byte",
    "B": "unsignedbyte",
    "s": "short",
    "u": "unsignedshort",
    "I": "signedint",
    "i": "unsignedint",
    "d": "double",
    "f": "float",
    "l": "long",
    "L": "long",
    "t": "bool",
    "D": "decimal",
    "F": "table",
    "A": "array",
    "x": "binary",
    "V": "void",
}
TYPE_NAMES = {v: k for k, v in TYPE_CHARS.items() if k != "L"}
_FIXED = {
    "b": struct.Struct(">b"),
    "B": struct.Struct(">B"),
    "s": struct.Struct(">h"),
    "u": struct.Struct(">H"),
    "I": struct.Struct(">i"),
    "i": struct.Struct(">I"),
    "l": struct.Struct(">q"),
    "L": struct.Struct(">q"),
    "f": struct.Struct(">f"),
    "d": struct.Struct(">d"),
    "T": struct.Struct(">Q"),
}
_U32 = struct.Struct(">I")


def _text(raw: bytes) -> dict:
    try:
        return {"value": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode("ascii")}


def _text_json(raw: bytes) -> str:
    """``_text`` as JSON members."""
    try:
        return f'"value":{_esc(raw.decode("utf-8"))}'
    except UnicodeDecodeError:
        return f'"base64":"{base64.b64encode(raw).decode("ascii")}"'


def _float(v: float):
    return v if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))


# -- wire -> typed JSON ----------------------------------------------------------------------------
# Decoding writes the JSON text directly (five times cheaper than building dicts and encoding
# them); the dict form is json.loads of that text, so there is one decoder. The text is what
# ``headers_json`` gives for the same dict.

_esc = json.encoder.encode_basestring  # what JSONEncoder(ensure_ascii=False) uses for strings


def _json_float(v: float) -> str:
    v = _float(v)
    return f'"{v}"' if isinstance(v, str) else float.__repr__(v)


def _value(buf, o: int, depth: int) -> tuple[str, int]:
    """The typed-JSON text of the field value at o, and the offset after it."""
    if depth > 100:
        raise FormatError("field tables nested deeper than 100", offset=o)
    kind = chr(buf[o])
    o += 1
    name = TYPE_CHARS.get(kind)
    if name is None:
        raise FormatError(f"unknown field type {kind!r}", offset=o - 1)
    fx = _FIXED.get(kind)
    if fx is not None:
        (v,) = fx.unpack_from(buf, o)
        return f'{{"type":"{name}","value":{_json_float(v) if kind in "fd" else v}}}', o + fx.size
    if kind == "t":
        return f'{{"type":"bool","value":{"true" if buf[o] else "false"}}}', o + 1
    if kind == "D":
        scale, v = struct.unpack_from(">BI", buf, o)
        return f'{{"type":"decimal","value":{{"scale":{scale},"value":{v}}}}}', o + 5
    if kind == "V":
        return '{"type":"void","value":null}', o
    (n,) = _U32.unpack_from(buf, o)
    start, end = o + 4, o + 4 + n
    if end > len(buf):
        raise FormatError(f"{name} of {plural(n, 'byte')} runs past the end of its table", offset=o)
    if kind in ("S", "x"):
        return f'{{"type":"{name}",{_text_json(bytes(buf[start:end]))}}}', end
    if kind == "F":
        return f'{{"type":"table","value":{_table(buf, start, end, depth + 1)}}}', end
    items = []
    while start < end:
        v, start = _value(buf, start, depth + 1)
        items.append(v)
    return f'{{"type":"array","value":[{",".join(items)}]}}', end


_I32 = struct.Struct(">i").unpack_from
_Q64 = struct.Struct(">q").unpack_from


def _table(buf, o: int, end: int, depth: int = 0) -> str:
    """The typed-JSON text of the table entries in buf[o:end]."""
    out = {}  # name -> value text: a repeated name keeps its first place and last value, as a dict does
    while o < end:
        n = buf[o]
        key = bytes(buf[o + 1 : o + 1 + n]).decode("utf-8", "replace")
        o += 1 + n
        kind = buf[o]
        if kind == 83:  # 'S', the most common: inline
            (ln,) = _U32.unpack_from(buf, o + 1)
            if o + 5 + ln > end:
                raise FormatError(f"longstr of {plural(ln, 'byte')} runs past the end of its table", offset=o)
            out[key] = f'{{"type":"longstr",{_text_json(bytes(buf[o + 5 : o + 5 + ln]))}}}'
            o += 5 + ln
        elif kind == 73:  # 'I'
            out[key] = f'{{"type":"signedint","value":{_I32(buf, o + 1)[0]}}}'
            o += 5
        elif kind == 108:  # 'l'
            out[key] = f'{{"type":"long","value":{_Q64(buf, o + 1)[0]}}}'
            o += 9
        else:
            out[key], o = _value(buf, o, depth)
    if o != end:
        raise FormatError("field table entries overrun the table length", offset=o)
    return "{" + ",".join([f"{_esc(k)}:{v}" for k, v in out.items()]) + "}"


def decode_table(raw: bytes) -> dict:
    """Encoded table contents (without the 4-byte length) -> typed JSON object."""
    return json.loads(table_json(raw))


def table_json(raw: bytes) -> str:
    """Encoded table contents (without the 4-byte length) -> typed JSON text."""
    try:
        return _table(raw, 0, len(raw))
    except (IndexError, struct.error) as e:
        raise FormatError(f"truncated field table ({e})") from None


_PLANS: dict[int, tuple] = {}


def _plan(flags: int) -> tuple:
    """The properties present for a flag word, in wire order (memoised: few distinct words)."""
    plan = _PLANS.get(flags)
    if plan is None:
        plan = _PLANS[flags] = tuple(name for bit, name in zip(range(15, 1, -1), PROPERTIES) if flags & (1 << bit))
    return plan


_EMPTY_SCALARS = dict.fromkeys(SCALAR_PROPERTIES)


def decode_properties(raw: bytes) -> tuple[dict, dict | None]:
    """Encoded basic property list -> ({13 scalar properties}, typed headers or None)."""
    props, headers = properties_json(raw)
    return props, None if headers is None else json.loads(headers)


def properties_json(raw: bytes) -> tuple[dict, str | None]:
    """Encoded basic property list -> ({13 scalar properties}, typed headers JSON text or None)."""
    try:
        flags = (raw[0] << 8) | raw[1]
        if flags & 1:
            raise FormatError("property flags continuation bit set (not used by class 60)", offset=0)
        o, props, headers = 2, _EMPTY_SCALARS.copy(), None
        for name in _plan(flags):
            if name == "headers":
                (n,) = _U32.unpack_from(raw, o)
                if o + 4 + n > len(raw):
                    raise FormatError("headers table runs past the property list", offset=o)
                headers = _table(raw, o + 4, o + 4 + n)
                o += 4 + n
            elif name == "delivery_mode" or name == "priority":
                props[name] = raw[o]
                o += 1
            elif name == "timestamp":
                props[name] = _Q64(raw, o)[0] & 0xFFFFFFFFFFFFFFFF
                o += 8
            else:
                n = raw[o]
                if o + 1 + n > len(raw):
                    raise FormatError(f"{name} runs past the property list", offset=o)
                props[name] = bytes(raw[o + 1 : o + 1 + n]).decode("utf-8", "replace")
                o += 1 + n
        return props, headers
    except (IndexError, struct.error) as e:
        raise FormatError(f"truncated property list ({e})") from None


# -- Erlang decoded form -> typed JSON -----------------------------------------------------------


#: the range of each integer field type (rabbit_binary_generator writes them in these widths)
_INT_RANGES = {
    "byte": (-(1 << 7), (1 << 7) - 1),
    "unsignedbyte": (0, (1 << 8) - 1),
    "short": (-(1 << 15), (1 << 15) - 1),
    "unsignedshort": (0, (1 << 16) - 1),
    "signedint": (-(1 << 31), (1 << 31) - 1),
    "unsignedint": (0, (1 << 32) - 1),
    "long": (-(1 << 63), (1 << 63) - 1),
    "timestamp": (0, (1 << 64) - 1),
}


def _erl_value(type_atom: str, v, depth: int = 0) -> dict:
    """A decoded field value ``{Type, Value}`` -> typed JSON; a value of another kind than its
    type (or out of its type's range) is damage: FormatError, never some text made of it."""
    t = str(type_atom)
    if depth > 100:
        raise FormatError("field tables nested deeper than 100")
    ok = True
    if t in ("longstr", "binary"):
        if isinstance(v, (bytes, bytearray)):
            return {"type": t, **_text(bytes(v))}
        ok = False
    elif t == "table":
        return {"type": t, "value": erlang_table(v, depth + 1)}
    elif t == "array":
        if isinstance(v, list) and all(isinstance(x, tuple) and len(x) == 2 for x in v):
            return {"type": t, "value": [_erl_value(a, x, depth + 1) for a, x in v]}
        ok = False
    elif t == "decimal":
        if isinstance(v, tuple) and len(v) == 2 and all(isinstance(x, int) for x in v):
            return {"type": t, "value": {"scale": v[0], "value": v[1]}}
        ok = False
    elif t == "bool":
        if v in ("true", "false") or isinstance(v, bool):
            return {"type": t, "value": v == "true" or v is True}
        ok = False
    elif t == "void":
        return {"type": t, "value": None}
    elif t in ("float", "double"):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            try:
                return {"type": t, "value": _float(float(v))}
            except OverflowError:
                pass
        ok = False
    elif t in _INT_RANGES:
        lo, hi = _INT_RANGES[t]
        if isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi:
            return {"type": t, "value": v}
        ok = False
    if not ok:
        raise FormatError(f"a {t[:20]} field holds a value of another kind or range")
    raise FormatError(f"unknown field type {t[:40]!r}")


def erlang_table(rows, depth: int = 0) -> dict:
    """``[{Name, TypeAtom, Value}]`` (rabbit_binary_parser output) -> typed JSON object."""
    if not isinstance(rows, list):
        raise FormatError("a field table is not a list")
    out = {}
    for row in rows:
        if not (isinstance(row, tuple) and len(row) == 3 and isinstance(row[0], (bytes, bytearray))):
            raise FormatError("a field table entry is not {Name, Type, Value}")
        name, t, v = row
        out[bytes(name).decode("utf-8", "replace")] = _erl_value(t, v, depth)
    return out


def p_basic(t: tuple, marks: list | None = None) -> tuple[dict, dict | None]:
    """A decoded ``'P_basic'`` tuple -> ({13 scalar properties}, typed headers or None). A field
    of another kind than rabbit_framing_amqp_0_9_1 decodes (a string property that is no binary,
    headers that are no field table) is null, and ``"name=value (...)"`` is added to ``marks``
    (an octet or timestamp of another kind is left for the column's range check)."""
    if len(t) != len(PROPERTIES) + 1:
        raise FormatError(f"a 'P_basic' record of {len(t) - 1} fields, not {len(PROPERTIES)}")
    props = {}
    headers = None
    for name, v in zip(PROPERTIES, t[1:]):
        if v == "undefined":
            v = None
        if name == "headers":
            try:
                headers = None if v is None else erlang_table(v)
            except FormatError as e:
                if marks is None:
                    raise
                marks.append(f"headers={type(v).__name__} of {len(v) if isinstance(v, list) else 1} ({e.message})")
        elif v is None or name in _OCTET or name == "timestamp":
            props[name] = v
        elif isinstance(v, (bytes, bytearray)):
            props[name] = bytes(v).decode("utf-8", "replace")
        else:
            if marks is not None:
                marks.append(f"{name}={str(v)[:40] if isinstance(v, (int, str)) else type(v).__name__} (not a binary)")
            props[name] = None
    return props, headers


# -- typed JSON -> wire ----------------------------------------------------------------------------


def _raw_of(entry: dict) -> bytes:
    """A typed-JSON string's bytes; a value of another kind (an integer: ``bytes(N)`` would make N
    zero bytes) is damage."""
    if "base64" in entry:
        return base64.b64decode(entry["base64"])
    v = entry["value"]
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    if isinstance(v, list) and all(isinstance(x, int) and 0 <= x < 256 for x in v):
        return bytes(v)
    raise FormatError(f"a {str(entry.get('type'))[:20]} value that is no text ({type(v).__name__})")


def _unfloat(v) -> float:
    return float(v)  # float("nan"), float("inf") accept our string forms


def _encode_value(entry: dict, out: bytearray) -> None:
    t = entry["type"]
    kind = TYPE_NAMES.get(t)
    if kind is None:
        raise FormatError(f"unknown field type {t!r}")
    out += kind.encode()
    fx = _FIXED.get(kind)
    if fx is not None:
        try:
            out += fx.pack(_unfloat(entry["value"]) if kind in "fd" else int(entry["value"]))
        except (struct.error, TypeError, ValueError, OverflowError):
            raise FormatError(f"a {t} value its wire type cannot hold: {str(entry['value'])[:40]}") from None
    elif kind == "t":
        out.append(1 if entry["value"] else 0)
    elif kind == "D":
        out += struct.pack(">BI", entry["value"]["scale"], entry["value"]["value"])
    elif kind == "V":
        pass
    elif kind in ("S", "x"):
        raw = _raw_of(entry)
        out += _U32.pack(len(raw)) + raw
    elif kind == "F":
        body = encode_table(entry["value"])
        out += _U32.pack(len(body)) + body
    else:  # array
        body = bytearray()
        for item in entry["value"]:
            _encode_value(item, body)
        out += _U32.pack(len(body)) + body


def encode_table(obj: dict) -> bytes:
    """Typed JSON object -> encoded table contents (without the 4-byte length)."""
    out = bytearray()
    for key, entry in obj.items():
        raw = key.encode("utf-8")
        out += bytes([len(raw)]) + raw
        _encode_value(entry, out)
    return bytes(out)


def encode_properties(props: dict, headers: dict | None) -> bytes:
    """({scalar properties}, typed headers) -> encoded basic property list."""
    flags, body = 0, bytearray()
    for bit, name in zip(range(15, 1, -1), PROPERTIES):
        v = headers if name == "headers" else props.get(name)
        if v is None:
            continue
        flags |= 1 << bit
        if name == "headers":
            t = encode_table(v)
            body += _U32.pack(len(t)) + t
        elif name in _OCTET or name == "timestamp":
            try:
                body += struct.pack(">B" if name in _OCTET else ">Q", int(v))
            except (struct.error, TypeError, ValueError, OverflowError):
                raise FormatError(f"{name} {str(v)[:40]} does not fit its wire type") from None
        else:
            raw = v.encode("utf-8") if isinstance(v, str) else bytes(v)
            if len(raw) > 255:
                raise FormatError(f"{name} is longer than 255 bytes")
            body += bytes([len(raw)]) + raw
    return struct.pack(">H", flags) + bytes(body)


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def headers_json(headers: dict | None) -> str | None:
    return None if headers is None else _JSON.encode(headers)


class PropertiesCache:
    """Memoised decode_properties + headers JSON: messages of one producer often share their
    property bytes. A plain bounded dict (cleared when full) keeps misses cheap."""

    def __init__(self, size: int = 4096):
        self.size = size
        self._cache: dict[bytes, tuple] = {}

    def get(self, raw: bytes) -> tuple[dict, str | None]:
        hit = self._cache.get(raw)
        if hit is None:
            hit = properties_json(raw)
            if len(self._cache) >= self.size:
                self._cache.clear()
            self._cache[raw if type(raw) is bytes else bytes(raw)] = hit
        return hit
