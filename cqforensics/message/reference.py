"""Stored message terms -> one normalised form.

Shapes (docs/formats/classic.md §6):

* ``#basic_message{}`` (<= 3.12): properties encoded (``properties_bin``) or decoded
  (``'P_basic'``, e.g. after dead-lettering in 3.10);
* ``#mc{protocol = mc_amqpl}`` (3.13+): AMQP 0-9-1 content + annotations map;
* ``#mc{protocol = mc_amqp}``: AMQP 1.0, 4.x ``{v1, ...}`` (original section bytes) or the 3.13
  ``{msg, ...}`` record of ``'v1_0.*'`` records;
* ``#mc{protocol = mc_mqtt}`` (3.13+ MQTT publishes): converted as mc_mqtt:convert_to(mc_amqpl)
  does at delivery; the MQTT view (topic, QoS, retain, MQTT 5.0 properties) is kept under
  ``annotations["mqtt"]``.

The normalised AMQP 0-9-1 view is what the broker hands an AMQP 0-9-1 consumer
(mc_amqpl:protocol_state): for ``#mc`` messages, dead-letter history (``deaths``) becomes the
``x-death`` header, ``x-*`` annotations become headers, and the ``ttl``/``p``/``d``/``ts``
annotations fill expiration, priority, delivery mode and timestamp. AMQP 1.0 messages map
their properties onto the 0-9-1 ones (message-id, correlation-id, content-type,
content-encoding, reply-to, user-id, subject -> type, creation-time -> timestamp) and their
application properties onto ``headers`` (AMQP 1.0 typed JSON); every 1.0 section is kept,
typed, under ``annotations["amqp10"]``.
"""

from __future__ import annotations

import base64
import json

from cqforensics.base.errors import FormatError
from cqforensics.codecs import amqp091, amqp10, etf

FIELDS = (
    "msg_id",
    "persistent",
    "exchange",
    "routing_keys",
    "properties",
    "timestamp_ms",
    "headers",
    "annotations",
    "body",
    "term_format",
)

_PROPS_CACHE = amqp091.PropertiesCache()
_EMPTY_PROPS = dict.fromkeys(amqp091.SCALAR_PROPERTIES)
# annotation keys that become columns (id, exchange, routing keys) rather than annotations JSON
_COLUMN_ANNS = frozenset({"id", "x", "rk"})


def _s(v) -> str | None:
    if v is None or (isinstance(v, etf.Atom) and v == "undefined"):
        return None
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    return str(v)


# -- values a column shows: as the broker writes them, or null with a mark -----------------------
#
# A stored field of the kind its broker writes there is shown; one of another kind (an integer
# where a binary belongs, an atom for a list of routing keys) is shown as null, never as some
# text made of it, and named in the message's ``marks`` ("name=value (what it is)"): the row's
# ``decode_error`` and ``fsck --deep``'s ``value-out-of-range`` finding say it (schema.value_marks).


def short(v, n: int = 40) -> str:
    """A bounded text of a decoded value for a mark or an error (never a repr of a whole huge or
    deeply nested term)."""
    if isinstance(v, etf.Atom):
        text = str(v)
    elif isinstance(v, bool) or isinstance(v, int):
        text = str(v) if v.bit_length() < 200 else f"an integer of {v.bit_length()} bits"
    elif isinstance(v, (bytes, bytearray)):
        text = repr(bytes(v[:n]))
    elif isinstance(v, float):
        text = repr(v)
    elif isinstance(v, (list, tuple, dict)):
        text = f"{type(v).__name__} of {len(v)}"
    else:
        text = type(v).__name__
    return text if len(text) <= n else text[:n] + "..."


def _kind(v) -> str:
    if isinstance(v, etf.Atom):
        return "an atom"
    if isinstance(v, bool) or isinstance(v, int):
        return "an integer"
    return {
        bytes: "a binary",
        float: "a float",
        list: "a list",
        tuple: "a tuple",
        dict: "a map",
        etf.ImproperList: "an improper list",
        etf.BitBinary: "a bit string",
    }.get(type(v), "a pid, port, ref or fun")


def mark(marks: list, name: str, v, want: str) -> None:
    """Record that the field ``name`` holds ``v``, not ``want``: the column shows null."""
    marks.append(f"{name}={short(v)} ({_kind(v)}, not {want})")


def _absent(v) -> bool:
    return v is None or (isinstance(v, etf.Atom) and v == "undefined")


def _binary(marks: list, name: str, v, want: str = "a binary") -> bytes | None:
    """``v`` when it is a binary; None when absent (undefined) or, marked, of another kind."""
    if isinstance(v, bytes):
        return v
    if not _absent(v):
        mark(marks, name, v, want)
    return None


def _text(marks: list, name: str, v) -> str | None:
    b = _binary(marks, name, v)
    return None if b is None else b.decode("utf-8", "replace")


def _texts(marks: list, name: str, v) -> list[str] | None:
    """A list of binaries (routing keys) as text; anything else null and marked."""
    if isinstance(v, list) and all(isinstance(k, bytes) for k in v):
        return [k.decode("utf-8", "replace") for k in v]
    if not _absent(v):
        mark(marks, name, v, "a list of binaries")
    return None


def _guid(marks: list, v) -> bytes | None:
    """A message id: the 16-byte guid the broker gives every message (rabbit_guid)."""
    if isinstance(v, bytes) and len(v) == 16:
        return v
    if not _absent(v):
        mark(marks, "msg_id", v, "a 16-byte binary")
    return None


def _flag(marks: list, name: str, v, default: bool | None) -> bool | None:
    """An Erlang boolean (the atoms true and false); absent: ``default``."""
    if isinstance(v, etf.Atom) and v in ("true", "false"):
        return v == "true"
    if not _absent(v):
        mark(marks, name, v, "true or false")
    return default


def _integer(marks: list, name: str, v) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if not _absent(v):
        mark(marks, name, v, "an integer")
    return None


def to_json_value(v):
    """An Erlang term -> something json.dumps accepts (atoms and UTF-8 binaries as strings)."""
    if isinstance(v, (bool, int, float)) or v is None:
        return v
    if isinstance(v, etf.Atom):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, (list, tuple)):
        return [to_json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(to_json_value(k)) if not isinstance(k, str) else str(k): to_json_value(x) for k, x in v.items()}
    if isinstance(v, etf.ImproperList):
        return {"improper_list": [to_json_value(x) for x in v.items], "tail": to_json_value(v.tail)}
    return repr(v)


def _body(content: tuple) -> bytes:
    frags = content[5]
    if isinstance(frags, bytes):
        return frags
    if not isinstance(frags, list):
        raise FormatError("payload fragments are not a list")
    return _fragments(frags)


def _fragments(frags) -> bytes:
    """A body from its fragments (``payload_fragments_rev``: a binary or a list of binaries);
    anything else (a list of lists, numbers) is damage."""
    if isinstance(frags, bytes):
        return frags
    if not isinstance(frags, list) or not all(isinstance(f, bytes) for f in frags):
        raise FormatError("payload fragments are not binaries")
    if len(frags) == 1:
        return frags[0]
    return b"".join(reversed(frags))


def props_from_bin(encoded: bytes) -> tuple[dict, str | None]:
    """(13 scalar properties, headers JSON) of an encoded property list (memoised)."""
    props, headers = _PROPS_CACHE.get(encoded)
    return dict(props), headers


def _content_props(content: tuple, marks: list) -> tuple[dict, str | None]:
    """(13 scalar properties, headers JSON) of a #content{} (encoded form preferred; the
    decoded ``'P_basic'`` record's fields of another kind are marked)."""
    if not (isinstance(content, tuple) and len(content) == 6 and content[0] == "content"):
        raise FormatError("not a #content{} record")
    decoded, encoded = content[2], content[3]
    if isinstance(encoded, bytes):
        props, headers = _PROPS_CACHE.get(encoded)
        return dict(props), headers
    if isinstance(decoded, tuple) and decoded and decoded[0] == "P_basic":
        props, headers = amqp091.p_basic(decoded, marks)
        return props, amqp091.headers_json(headers)
    # rabbit_binary_parser keeps one of the two: an encoded list (a binary) or the record
    mark(marks, "properties", encoded if not _absent(encoded) else decoded, "a binary or a 'P_basic' record")
    return dict(_EMPTY_PROPS), None


def _deaths(deaths) -> tuple[list[dict], list]:
    """Annotation ``deaths`` (4.x list or 3.13 #deaths{}) -> (JSON records, x-death tables in
    delivery order, as mc_amqpl:deaths_to_headers builds them)."""
    if isinstance(deaths, tuple) and deaths and deaths[0] == "deaths":  # 3.13: {deaths, First, Last, Records}
        recs = sorted(deaths[3].items(), key=lambda kv: kv[1][4].get("last_time", 0), reverse=True)
    elif isinstance(deaths, list):
        recs = deaths
    else:
        return [], []
    out, tables = [], []
    for (queue, reason), death in recs:
        _, exchange, rks, count, anns = death
        if not (
            isinstance(queue, bytes)
            and isinstance(reason, etf.Atom)
            and isinstance(exchange, bytes)
            and isinstance(rks, list)
            and all(isinstance(k, bytes) for k in rks)
            and isinstance(count, int)
            and isinstance(anns, dict)
            and all(isinstance(anns.get(k, 0), int) for k in ("first_time", "last_time"))
        ):
            raise FormatError("a dead-letter record (#death{}) holds values of another kind than the broker writes")
        ttl = anns.get("ttl")
        out.append(
            {
                "queue": _s(queue),
                "reason": _s(reason),
                "exchange": _s(exchange),
                "routing_keys": [_s(k) for k in rks],
                "count": count,
                "first_time": anns.get("first_time"),
                "last_time": anns.get("last_time"),
                **({"ttl": ttl} if ttl is not None else {}),
            }
        )
        t = {}
        if ttl is not None:
            t["original-expiration"] = {"type": "longstr", "value": str(ttl)}
        t.update(
            {
                "count": {"type": "long", "value": count},
                "reason": {"type": "longstr", "value": _s(reason)},
                "queue": {"type": "longstr", "value": _s(queue)},
                "time": {"type": "timestamp", "value": anns.get("first_time", 0) // 1000},
                "exchange": {"type": "longstr", "value": _s(exchange)},
                "routing-keys": {"type": "array", "value": [{"type": "longstr", "value": _s(k)} for k in rks]},
            }
        )
        tables.append({"type": "table", "value": t})
    return out, tables


def _amqpl_view(props: dict, headers_json: str | None, anns: dict, marks: list) -> tuple[dict, str | None, int | None]:
    """Apply mc_amqpl:protocol_state: what an AMQP 0-9-1 consumer receives (the annotations
    that fill a property, of another kind than the broker writes, are marked and not applied)."""
    extra = {}
    if "deaths" in anns:
        _, tables = _deaths(anns["deaths"])
        extra["x-death"] = {"type": "array", "value": tables}
    for k, v in anns.items():
        if isinstance(k, bytes) and k.startswith(b"x-"):
            key = k.decode("utf-8", "replace")
            if isinstance(v, bool) or v in ("true", "false"):
                extra[key] = {"type": "bool", "value": v is True or v == "true"}
            elif isinstance(v, int):
                extra[key] = {"type": "long", "value": v}
            elif isinstance(v, bytes):
                extra[key] = {"type": "longstr", "value": v.decode("utf-8", "replace")}
        elif k == b"timestamp_in_ms" and isinstance(v, int):
            extra["timestamp_in_ms"] = {"type": "long", "value": v}
    if extra:
        merged = json.loads(headers_json) if headers_json else {}
        merged.update(extra)
        headers_json = amqp091.headers_json(dict(sorted(merged.items())))
    ttl = anns.get("ttl", ...)
    if ttl is not ...:
        ttl = _integer(marks, "expiration", ttl)
        props["expiration"] = None if ttl is None else str(ttl)
    p = _integer(marks, "priority", anns.get("p"))
    if props["priority"] is None and p is not None:
        props["priority"] = p
    if props["delivery_mode"] is None:
        props["delivery_mode"] = None if anns.get("d") == "false" else 2
    ts = _integer(marks, "timestamp", anns.get("ts"))
    if ts is not None:
        props["timestamp"] = ts // 1000
    return props, headers_json, ts


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_SCALARS = (int, float, str)


def _annotations_json(anns: dict, extra: dict | None = None) -> str | None:
    out = {}
    for k, v in anns.items():
        key = k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)
        if key in _COLUMN_ANNS:
            continue
        if key == "deaths":
            out[key] = _deaths(v)[0]
        elif type(v) in _SCALARS:
            out[key] = v
        else:
            out[key] = to_json_value(v)
    if extra:
        out.update(extra)
    return _JSON.encode(out) if out else None


def _amqp10_bare(bare: bytes, anns_list) -> tuple[dict, str | None, dict, bytes]:
    """4.x #v1: decode BareAndFooter (properties, application-properties, body, footer)."""
    secs = amqp10.sections(bare)
    props10, app, body_parts, section, value, footer = None, None, [], None, None, None
    for code, val, start, end in secs:
        if code == amqp10.PROPERTIES:
            props10 = val
        elif code == amqp10.APPLICATION_PROPERTIES:
            app = val
        elif code == amqp10.DATA:
            section = "data"
            body_parts.append(base64.b64decode(val["base64"]))
        elif code in (amqp10.AMQP_VALUE, amqp10.AMQP_SEQUENCE):
            section = amqp10.SECTION_NAMES[code]
            value = val if code == amqp10.AMQP_VALUE else (value or []) + [val]
            body_parts.append(bytes(bare[start:end]))
        elif code == amqp10.FOOTER:
            footer = val
    msg_anns = (
        {
            amqp10.plain(k) if not isinstance(k, tuple) else amqp10.erlang_value(k)["value"]: amqp10.erlang_value(v)
            for k, v in (anns_list or [])
        }
        if isinstance(anns_list, list)
        else {}
    )
    detail = {
        "properties": amqp10.fields(props10, amqp10.PROPERTY_FIELDS),
        "application_properties": amqp10.map_object(app),
        "message_annotations": {str(k): v for k, v in msg_anns.items()},
        "body_section": section,
    }
    if value is not None:
        detail["body_value"] = value
    if footer is not None:
        detail["footer"] = amqp10.map_object(footer)
    return (
        detail,
        amqp091.headers_json(detail["application_properties"]) if app is not None else None,
        detail["properties"],
        b"".join(body_parts),
    )


def _amqp10_records(msg: tuple) -> tuple[dict, str | None, dict, bytes]:
    """3.13 {msg, Header, DeliveryAnns, MessageAnns, Properties, AppProps, Data, Footer}."""
    _, header, _da, ma, props, app, data, footer = msg
    p = {}
    if isinstance(props, tuple) and props and props[0] == "v1_0.properties":
        for name, v in zip(amqp10.PROPERTY_FIELDS, props[1:]):
            p[name] = None if v in ("undefined", None) else amqp10.erlang_value(v)
    else:
        p = dict.fromkeys(amqp10.PROPERTY_FIELDS)
    app_obj = {}
    if isinstance(app, tuple) and app and app[0] == "v1_0.application_properties":
        for k, v in app[1]:
            app_obj[str(amqp10.plain(amqp10.erlang_value(k)))] = amqp10.erlang_value(v)
    parts, section, value = [], None, None
    for d in data if isinstance(data, list) else [data]:
        if isinstance(d, tuple) and d and d[0] == "v1_0.data":
            if not (len(d) == 2 and isinstance(d[1], bytes)):
                raise FormatError("a 'v1_0.data' section holds no binary")
            section = "data"
            parts.append(d[1])
        elif isinstance(d, tuple) and d and d[0] == "v1_0.amqp_value":
            section, value = "amqp-value", amqp10.erlang_value(d[1])
        elif isinstance(d, tuple) and d and d[0] == "v1_0.amqp_sequence":
            section, value = "amqp-sequence", amqp10.erlang_value(("list", d[1]))
    ma_obj = {}
    if isinstance(ma, tuple) and ma and ma[0] == "v1_0.message_annotations":
        for k, v in ma[1]:
            ma_obj[str(amqp10.plain(amqp10.erlang_value(k)))] = amqp10.erlang_value(v)
    detail = {
        "properties": p,
        "application_properties": app_obj,
        "message_annotations": ma_obj,
        "body_section": section,
    }
    if value is not None:
        detail["body_value"] = value
    return detail, amqp091.headers_json(app_obj) if app_obj else None, p, b"".join(parts)


def _amqp10_props(p10: dict, anns: dict, marks: list) -> tuple[dict, int | None]:
    """AMQP 1.0 properties (+ annotations p/d/ttl) -> the 13 AMQP 0-9-1 properties."""

    def text(name):
        v = p10.get(name)
        if v is None:
            return None
        pv = amqp10.plain(v)
        return pv.decode("utf-8", "replace") if isinstance(pv, bytes) else str(pv)

    created = p10.get("creation_time")
    if created is not None:
        created = (
            amqp10.plain(created)
            if created.get("type") == "timestamp"
            else mark(marks, "timestamp", created.get("type"), "an AMQP 1.0 timestamp")
        )
    ttl = _integer(marks, "expiration", anns.get("ttl"))
    props = {
        "content_type": text("content_type"),
        "content_encoding": text("content_encoding"),
        "delivery_mode": 1 if anns.get("d") == "false" else 2,
        "priority": _integer(marks, "priority", anns.get("p")),
        "correlation_id": text("correlation_id"),
        "reply_to": text("reply_to"),
        "expiration": None if ttl is None else str(ttl),
        "message_id": text("message_id"),
        "timestamp": created // 1000 if isinstance(created, int) else None,
        "type": text("subject"),
        "user_id": text("user_id"),
        "app_id": None,
        "cluster_id": None,
    }
    return props, created if isinstance(created, int) else None


# -- MQTT (#mc{mc_mqtt}, 3.13+) ------------------------------------------------------------------
#
# The state is {mqtt_msg, Retain, Qos, Topic, Dup, PacketId, Payload, Props, Timestamp}; Props is
# the PUBLISH properties map of MQTT 5.0 ('Content-Type', 'Correlation-Data', 'Response-Topic',
# 'User-Property' [{Name, Value}], 'Message-Expiry-Interval', 'Payload-Format-Indicator', ...;
# empty for MQTT 3.1.1). A 0-9-1 consumer receives mc_mqtt:convert_to(mc_amqpl) (unchanged from
# 3.13 to 4.3) followed by mc_amqpl:protocol_state.

_MQTT_PROPERTY_NAMES = (
    "Payload-Format-Indicator",
    "Message-Expiry-Interval",
    "Content-Type",
    "Response-Topic",
    "Correlation-Data",
    "Subscription-Identifier",
    "Topic-Alias",
    "User-Property",
    "Will-Delay-Interval",
)


def _utf8_no_null(b: bytes) -> bool:
    """mc_util:is_utf8_no_null: valid UTF-8 without NUL."""
    try:
        return "\x00" not in b.decode("utf-8")
    except UnicodeDecodeError:
        return False


def _ascii(b: bytes) -> bool:
    """mc_util:utf8_string_is_ascii."""
    return all(c < 0x80 for c in b)


def mqtt_to_amqp(topic: bytes) -> bytes:
    """rabbit_mqtt_util:mqtt_to_amqp (no Sparkplug rewriting): '/' -> '.', '+' -> '*'."""
    return topic.replace(b"/", b".").replace(b"+", b"*")


def _mqtt_json(v):
    """An MQTT property value -> JSON (text, or {"base64"} when not UTF-8)."""
    if isinstance(v, list):
        return [[_mqtt_json(x) for x in kv] if isinstance(kv, tuple) else _mqtt_json(kv) for kv in v]
    return to_json_value(v)


#: the MQTT 5.0 properties the conversion to AMQP 0-9-1 reads, and the kind each holds
_MQTT_KINDS = {
    "Content-Type": (bytes, "a binary"),
    "Correlation-Data": (bytes, "a binary"),
    "Response-Topic": (bytes, "a binary"),
    "Message-Expiry-Interval": (int, "an integer"),
    "User-Property": (list, "a list of {Name, Value} binaries"),
}


def _mqtt(data, marks: list) -> tuple[dict, dict, str | None, bytes]:
    """#mqtt_msg{} -> (the MQTT view for annotations, the 13 properties and the headers JSON an
    AMQP 0-9-1 consumer gets before mc_amqpl:protocol_state, body). Fields of another kind than
    mc_mqtt writes are marked (``mqtt.<field>``) and shown as null."""
    if not (isinstance(data, tuple) and len(data) >= 8 and data[0] == "mqtt_msg"):
        raise FormatError("unknown mc_mqtt state")
    _, retain, qos, topic, dup, packet_id, payload, mprops = data[:8]
    if not isinstance(mprops, dict):
        raise FormatError("mc_mqtt properties are not a map")
    if qos not in (0, 1):
        raise FormatError(f"mc_mqtt QoS {short(qos)} is not 0 or 1")
    named = {str(k): v for k, v in mprops.items()}
    for name, (kind, want) in _MQTT_KINDS.items():
        v = named.get(name)
        if v is None:
            continue
        ok = isinstance(v, kind) and not isinstance(v, bool)
        if ok and name == "User-Property":
            ok = all(isinstance(kv, tuple) and len(kv) == 2 and all(isinstance(x, bytes) for x in kv) for kv in v)
        if not ok:
            mark(marks, f"mqtt.{name}", v, want)
            del named[name]
    order = {n: i for i, n in enumerate(_MQTT_PROPERTY_NAMES)}
    view = {
        "topic": _text(marks, "mqtt.topic", topic),
        "qos": qos,
        "retain": _flag(marks, "mqtt.retain", retain, None),
        "dup": _flag(marks, "mqtt.dup", dup, None),
        "packet_id": _integer(marks, "mqtt.packet_id", packet_id),
        "properties": {k: _mqtt_json(named[k]) for k in sorted(named, key=lambda k: (order.get(k, 99), k))},
    }
    if len(data) > 8:
        ts = _integer(marks, "mqtt.timestamp", data[8])
        if ts is not None:
            view["timestamp"] = ts
    # mc_mqtt:convert_to(mc_amqpl, ...)
    props = dict(_EMPTY_PROPS)
    props["delivery_mode"] = 1 if qos == 0 else 2
    ct = named.get("Content-Type")
    if isinstance(ct, bytes) and len(ct) < 256 and _ascii(ct):
        props["content_type"] = ct.decode("ascii")
    headers: list[tuple[bytes, dict]] = []  # in mc_mqtt's order: usort keeps the first of a key
    corr = named.get("Correlation-Data")
    if isinstance(corr, bytes):
        if len(corr) < 256 and _utf8_no_null(corr):
            props["correlation_id"] = corr.decode("utf-8")
        else:
            headers.append((b"x-correlation-id", _longstr(corr)))
    reply = named.get("Response-Topic")
    if isinstance(reply, bytes):
        headers.append((b"x-reply-to-topic", _longstr(mqtt_to_amqp(reply))))
    for kv in named.get("User-Property") or []:
        if (
            isinstance(kv, tuple)
            and len(kv) == 2
            and isinstance(kv[0], bytes)
            and len(kv[0]) < 256
            and isinstance(kv[1], bytes)
        ):
            headers.append((kv[0], _longstr(kv[1])))
    mei = named.get("Message-Expiry-Interval")
    if isinstance(mei, int):
        props["expiration"] = str(mei * 1000)
    table: dict[bytes, dict] = {}
    for k, v in headers:
        table.setdefault(k, v)
    headers_json = None
    if table:
        headers_json = amqp091.headers_json({k.decode("utf-8", "replace"): table[k] for k in sorted(table)})
    return view, props, headers_json, _iodata(payload)


def _longstr(b: bytes) -> dict:
    try:
        return {"type": "longstr", "value": b.decode("utf-8")}
    except UnicodeDecodeError:
        return {"type": "longstr", "base64": base64.b64encode(b).decode()}


def _iodata(v) -> bytes:
    """An MQTT payload (iodata: a binary or a deep list of binaries and bytes) -> bytes."""
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    if isinstance(v, list):
        out = bytearray()
        stack = [iter(v)]
        while stack:
            for x in stack[-1]:
                if isinstance(x, (bytes, bytearray)):
                    out += x
                elif isinstance(x, int) and 0 <= x < 256:
                    out.append(x)
                elif isinstance(x, list):
                    if len(stack) > 100:
                        raise FormatError("payload iodata nested too deeply")
                    stack.append(iter(x))
                    break
                else:
                    raise FormatError("payload is not iodata")
            else:
                stack.pop()
        return bytes(out)
    raise FormatError("payload is not iodata")


def _mc_common(anns: dict, marks: list) -> dict:
    """The columns every ``#mc{}`` takes from its annotations: the message id (``id``), whether
    it is persistent (``d``), the exchange (``x``) and the routing keys (``rk``)."""
    return {
        "msg_id": _guid(marks, anns.get("id")),
        "persistent": _flag(marks, "persistent", anns.get("d"), True),
        "exchange": _text(marks, "exchange", anns.get("x")),
        "routing_keys": _texts(marks, "routing_keys", anns.get("rk", [])),
    }


def normalise(term) -> dict:
    """A decoded stored term -> dict with ``FIELDS`` and ``marks`` (the fields of another kind
    than the broker writes, shown as null). Raises FormatError on an unknown shape."""
    if not isinstance(term, tuple) or not term:
        raise FormatError(f"stored term is not a record: {type(term).__name__}")
    tag = term[0]
    marks: list[str] = []
    if tag == "basic_message" and len(term) == 6:
        _, xres, rks, content, msg_id, persistent = term
        props, headers = _content_props(content, marks)
        if isinstance(xres, tuple) and len(xres) == 4 and xres[0] == "resource":
            exchange = _text(marks, "exchange", xres[3])
        else:
            exchange = None
            mark(marks, "exchange", xres, "an exchange's #resource{}")
        return {
            "msg_id": _guid(marks, msg_id),
            "persistent": _flag(marks, "persistent", persistent, False),
            "exchange": exchange,
            "routing_keys": _texts(marks, "routing_keys", rks),
            "properties": props,
            "timestamp_ms": None if props["timestamp"] is None else props["timestamp"] * 1000,
            "headers": headers,
            "annotations": None,
            "body": _body(content),
            "term_format": "basic_message",
            "marks": marks,
        }
    if tag == "mc" and len(term) == 4:
        _, proto, data, anns = term
        if not isinstance(anns, dict):
            raise FormatError("#mc{} annotations are not a map")
        common = _mc_common(anns, marks)
        if proto == "mc_amqpl":
            props, headers = _content_props(data, marks)
            props, headers, ts = _amqpl_view(props, headers, anns, marks)
            if ts is None and props["timestamp"] is not None:
                ts = props["timestamp"] * 1000
            return {
                **common,
                "properties": props,
                "timestamp_ms": ts,
                "headers": headers,
                "annotations": _annotations_json(anns),
                "body": _body(data),
                "term_format": "mc_amqpl",
                "marks": marks,
            }
        if proto == "mc_amqp":
            if isinstance(data, tuple) and data and data[0] == "v1":
                if not isinstance(data[2], bytes):
                    raise FormatError("the AMQP 1.0 message (#v1{}) holds no binary of its sections")
                detail, headers, p10, body = _amqp10_bare(data[2], data[1])
                fmt = "mc_amqp"
            elif isinstance(data, tuple) and data and data[0] == "msg":
                detail, headers, p10, body = _amqp10_records(data)
                fmt = "mc_amqp_3.13"
            else:
                raise FormatError(
                    f"unknown mc_amqp state {short(data[0] if isinstance(data, tuple) and data else data)!r}"
                )
            props, created = _amqp10_props(p10, anns, marks)
            return {
                **common,
                "properties": props,
                "timestamp_ms": created,
                "headers": headers,
                "annotations": _annotations_json(anns, {"amqp10": detail}),
                "body": body,
                "term_format": fmt,
                "marks": marks,
            }
        if proto == "mc_mqtt":
            mqtt, props, headers, body = _mqtt(data, marks)
            props, headers, ts = _amqpl_view(props, headers, anns, marks)
            return {
                **common,
                "properties": props,
                "timestamp_ms": ts,
                "headers": headers,
                "annotations": _annotations_json(anns, {"mqtt": mqtt}),
                "body": body,
                "term_format": "mc_mqtt",
                "marks": marks,
            }
        raise FormatError(f"unknown #mc{{}} protocol {short(proto)!r}")
    raise FormatError(f"unknown stored term {short(tag)!r}/{len(term)}")


def decode_stored(raw) -> dict:
    """Stored term bytes (ETF) -> normalised dict."""
    term, _ = etf.decode(raw)
    return normalise_checked(term)


def normalise_checked(term) -> dict:
    """``normalise`` of a decoded term, with its texts checked as valid UTF-8 and any surprise
    in a term of a shape no broker writes turned into a FormatError (a quorum queue's log entry
    carries the message as a decoded part of a larger term)."""
    try:
        out = normalise(term)
        for k in ("headers", "annotations"):  # must be valid UTF-8 text (no lone surrogates)
            if isinstance(out.get(k), str):
                out[k].encode("utf-8")
        for v in out["properties"].values():
            if isinstance(v, str):
                v.encode("utf-8")
        return out
    except FormatError:
        raise
    except (TypeError, ValueError, IndexError, KeyError, AttributeError, RecursionError, OverflowError) as e:
        # a decodable term of a shape no broker writes (e.g. a list where a binary belongs)
        raise FormatError(f"malformed stored term ({type(e).__name__}: {str(e)[:120]})") from None


# -- stream entries (osiris records: a whole AMQP 1.0 message) ----------------------------------------
#
# A stream record is the AMQP 1.0 message bytes (every protocol's: RabbitMQ converts at publish).
# An AMQP 0-9-1 consumer of the broker receives it converted at delivery, differently per version:
#
# * ``msg_record`` (3.10 - 3.12): rabbit_stream_queue:binary_to_msg/2 -> rabbit_msg_record:init/1 +
#   to_amqp091/1 (deps/rabbit/src/rabbit_msg_record.erl v3.10.8): the message annotations
#   x-basic-priority / -delivery-mode / -expiration and the application properties x-basic-type /
#   -app-id become those properties (no look at the header section); the other application
#   properties become headers (to_091/2: no clause for symbol, ulong, char, uuid, decimal, list,
#   map, array: the conversion fails); a message without a data section cannot be converted.
# * ``mc`` (3.13+): mc_amqp -> mc_amqpl:convert_from(mc_amqp, ..) (deps/rabbit/src/mc_amqpl.erl
#   v4.0.5, v4.3.5): header durable / priority / ttl first, x-basic-* annotations else; group-id
#   is app_id; application properties with UTF-8 keys and x-* message annotations (not x-basic-*,
#   x-exchange, x-routing-key, x-death) become headers; a body that is not data sections is
#   the encoded sections with type ``amqp-1.0``.
#
# Both add the ``x-stream-offset`` header (long) at delivery: that is the ``stream_offset``
# column, not repeated in ``headers``.

_T091 = {
    "string": "longstr",
    "long": "long",
    "byte": "byte",
    "ubyte": "unsignedbyte",
    "short": "short",
    "ushort": "unsignedshort",
    "uint": "unsignedint",
    "int": "signedint",
    "double": "double",
    "float": "float",
    "timestamp": "timestamp",
    "boolean": "bool",
    "null": "void",
}


def _h(t: str, v) -> dict:
    """A typed-JSON header value; text that is not UTF-8 as base64 (amqp091.headers_json's form)."""
    if isinstance(v, (bytes, bytearray)):
        try:
            return {"type": t, "value": bytes(v).decode("utf-8")}
        except UnicodeDecodeError:
            return {"type": t, "base64": base64.b64encode(bytes(v)).decode()}
    return {"type": t, "value": v}


def _raw_text(v: dict):
    """A typed AMQP 1.0 string/symbol/binary value -> its bytes (None for null)."""
    if v is None or v.get("type") == "null":
        return None
    if "base64" in v:
        return base64.b64decode(v["base64"])
    return v["value"].encode("utf-8") if isinstance(v["value"], str) else v["value"]


def _to091_msg_record(v: dict) -> dict:
    """rabbit_msg_record:to_091/2 (3.10 - 3.12) of one application property value."""
    t = v.get("type")
    if t == "string":
        return _h("longstr", _raw_text(v))
    if t == "binary":
        return _h("binary", _raw_text(v))
    if t == "timestamp":
        return {"type": "timestamp", "value": v["value"] // 1000}
    if t == "null":
        return {"type": "void", "value": None}
    if t in _T091 and t != "string":
        return {"type": _T091[t], "value": v["value"]}
    raise FormatError(
        f"an application property of AMQP 1.0 type {t} has no AMQP 0-9-1 form "
        "(rabbit_msg_record:to_091/2): the conversion fails"
    )


def _to091_mc(v: dict) -> dict:
    """mc_amqpl:to_091/1,2 (3.13+) of one value."""
    t = v.get("type")
    if t in ("string", "symbol", "binary"):
        return _h("longstr", _raw_text(v))
    if t == "ulong":
        return {"type": "long", "value": v["value"]}
    if t == "timestamp":
        return {"type": "timestamp", "value": v["value"] // 1000}
    if t == "null":
        return {"type": "void", "value": None}
    if t in ("list", "array"):
        return {"type": "array", "value": [_to091_mc(x) for x in v["value"]]}
    if t == "map":
        return {"type": "table", "value": {_key(k): _to091_mc(x) for k, x in v["value"]}}
    if t in _T091:
        return {"type": _T091[t], "value": v["value"]}
    raise FormatError(f"a value of AMQP 1.0 type {t} has no AMQP 0-9-1 form (mc_amqpl:to_091): the conversion fails")


def _key(k: dict) -> str:
    raw = _raw_text(k) if k.get("type") in ("string", "symbol", "binary") else str(amqp10.plain(k)).encode()
    return raw.decode("utf-8", "replace")


def _sections_of(raw: bytes) -> dict:
    """The sections of an encoded message by name; body sections in order."""
    out: dict = {"body": []}
    for code, val, start, end in amqp10.sections(raw):
        if code == amqp10.HEADER:
            out["header"] = amqp10.fields(val, amqp10.HEADER_FIELDS)
        elif code == amqp10.MESSAGE_ANNOTATIONS:
            out["message_annotations"] = val.get("value") or [] if isinstance(val, dict) else []
        elif code == amqp10.PROPERTIES:
            out["properties"] = amqp10.fields(val, amqp10.PROPERTY_FIELDS)
        elif code == amqp10.APPLICATION_PROPERTIES:
            out["application_properties"] = val.get("value") or [] if isinstance(val, dict) else []
        elif code in (amqp10.DATA, amqp10.AMQP_VALUE, amqp10.AMQP_SEQUENCE):
            out["body"].append((code, val, bytes(raw[start:end])))
        elif code == amqp10.FOOTER:
            out["footer"] = val
        elif code != amqp10.DELIVERY_ANNOTATIONS:
            raise FormatError(f"a section of unknown descriptor at byte {start}", offset=start)
    return out


def _message_id(v: dict | None, hkey: str, headers: dict, conversion: str):
    """rabbit_msg_record:message_id/3 (3.10) or mc_amqpl:message_id/3 (3.13+): a message or
    correlation id as a short string, or as a header where it does not fit."""
    if v is None or v.get("type") == "null":
        return None
    t = v["type"]
    if conversion == "msg_record":
        if t == "uuid":
            headers[hkey] = _h("longstr", b"uuid")
            return v["value"]
        if t == "ulong":
            headers[hkey] = _h("longstr", b"ulong")
            return str(v["value"])
        if t == "binary":
            raw = _raw_text(v)
            enc = base64.b64encode(raw)
            if len(enc) > 256:
                headers[hkey.replace("-type", "")] = _h("longstr", raw)
                return None
            headers[hkey] = _h("longstr", b"binary")
            return enc.decode()
        raw = _raw_text(v)
        if t == "string" and len(raw) > 256:
            headers[hkey.replace("-type", "")] = _h("longstr", raw)
            return None
        return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if t == "uuid":
        return f"urn:uuid:{v['value']}"
    if t == "ulong":
        return str(v["value"])
    if t == "binary":
        headers[hkey] = _h("binary", _raw_text(v))
        return None
    raw = _raw_text(v)
    if len(raw) <= 255:
        return raw.decode("utf-8", "replace")
    headers[hkey] = _h("longstr", raw)
    return None


def _short(v: dict | None):
    """mc_amqpl:unwrap_shortstr/1: a UTF-8 string of at most 255 bytes, else nothing."""
    if v is None or v.get("type") != "string":
        return None
    raw = _raw_text(v)
    return raw.decode("utf-8", "replace") if len(raw) <= 255 else None


def _amqp10_text(v: dict | None):
    raw = _raw_text(v) if v is not None and v.get("type") in ("string", "symbol", "binary") else None
    if raw is None:
        return None if v is None or v.get("type") == "null" else str(amqp10.plain(v))
    return raw.decode("utf-8", "replace")


def decode_amqp10_entry(raw: bytes, model) -> dict:
    """A stream record (the AMQP 1.0 message bytes osiris stores) -> ``FIELDS`` as an AMQP 0-9-1
    consumer of the broker version ``model`` (a ``model.versions.BrokerModel``) receives it:
    its ``stream_amqp091_conversion`` (``msg_record`` for 3.10 - 3.12, ``mc`` for 3.13+),
    ``amqp10_reply_to_urldecoded`` (4.2+: a ``/queues/<name>`` reply-to becomes the name) and
    ``amqp10_headerless_durable`` (whether a record without a header section, nor an
    ``x-basic-delivery-mode`` annotation, counts as durable: delivery mode 2);
    ``annotations`` holds the AMQP 1.0 sections as a stream-protocol consumer receives them.
    Exchange and routing key come from the message annotations ``x-exchange`` /
    ``x-routing-key`` (absent: ``""`` and the queue's name, which the caller fills). Raises
    FormatError on bytes that are no message, and on a message the version cannot convert
    (then the broker's conversion fails too: model.recovery counts the read as failing)."""
    conversion = model.stream_amqp091_conversion
    secs = _sections_of(raw)
    header = secs.get("header") or {}
    ma = {_key(k): v for k, v in secs.get("message_annotations", [])}
    p10 = secs.get("properties") or dict.fromkeys(amqp10.PROPERTY_FIELDS)
    ap = [(_key(k), v) for k, v in secs.get("application_properties", [])]
    body_secs = secs["body"]
    headers: dict = {}

    def ma_plain(name):
        v = ma.get(name)
        return None if v is None else amqp10.plain(v)

    if conversion == "msg_record":
        if not body_secs or body_secs[0][0] != amqp10.DATA:
            raise FormatError("no data section: rabbit_msg_record:to_amqp091/1 cannot convert the message")
        body = base64.b64decode(body_secs[0][1]["base64"])
        typ = app = None
        rest = []
        for k, v in ap:
            if k == "x-basic-type" and typ is None:
                typ = _amqp10_text(v)
            elif k == "x-basic-app-id" and app is None:
                app = _amqp10_text(v)
            else:
                rest.append((k, v))
        for k, v in rest:
            headers[k] = _to091_msg_record(v)
        prio, mode, exp = ma_plain("x-basic-priority"), ma_plain("x-basic-delivery-mode"), ma.get("x-basic-expiration")
        props = {
            "delivery_mode": mode,
            "priority": prio,
            "expiration": _amqp10_text(exp),
            "type": typ,
            "app_id": app,
            "user_id": _amqp10_text(p10.get("user_id")),
            "reply_to": _amqp10_text(p10.get("reply_to")),
        }
    else:
        if body_secs and all(c == amqp10.DATA for c, _, _ in body_secs):
            body, typ0 = b"".join(base64.b64decode(v["base64"]) for _, v, _ in body_secs), None
        else:  # the encoded body sections (and footer) as they are
            body, typ0 = b"".join(b for _, _, b in body_secs), "amqp-1.0"
        durable = amqp10.plain(header["durable"]) if header.get("durable") else None
        basic_mode = ma_plain("x-basic-delivery-mode")
        mode = 2 if durable is True else 1 if durable is False else basic_mode
        if mode is None:  # mc_amqpl:protocol_state/2: 2 unless the durable annotation is false
            # (mc_amqp get_property(durable, ..): the header, else the x-basic-delivery-mode annotation)
            durable_ann = (basic_mode != 1) if model.amqp10_headerless_durable else (basic_mode == 2)
            mode = 2 if durable_ann else None
        prio = amqp10.plain(header["priority"]) if header.get("priority") else ma_plain("x-basic-priority")
        ttl = amqp10.plain(header["ttl"]) if header.get("ttl") else None
        exp = str(ttl) if ttl is not None else _amqp10_text(ma.get("x-basic-expiration"))
        typ = typ0 if typ0 is not None else _amqp10_text(ma.get("x-basic-type"))
        for k, v in ma.items():
            if k == "x-cc":
                headers["CC"] = _to091_mc(v)
            elif k == "x-opt-rabbitmq-received-time" and v.get("type") == "timestamp":
                headers["timestamp_in_ms"] = {"type": "long", "value": v["value"]}
            elif (
                k.startswith("x-")
                and len(k.encode()) <= 255
                and not k.startswith("x-basic-")
                and k not in ("x-routing-key", "x-exchange", "x-death", "x-opt-deaths")
            ):
                headers[k] = _to091_mc(v)
        for k, v in ap:
            if len(k.encode()) <= 255:
                headers[k] = _to091_mc(v)
        reply = _short(p10.get("reply_to"))
        if model.amqp10_reply_to_urldecoded and reply is not None and reply.startswith("/queues/"):
            from urllib.parse import unquote_to_bytes

            try:
                reply = unquote_to_bytes(reply[len("/queues/") :]).decode("utf-8")
            except UnicodeDecodeError:
                reply = None
        user = _raw_text(p10.get("user_id")) if p10.get("user_id") else None
        props = {
            "delivery_mode": mode,
            "priority": prio,
            "expiration": exp,
            "type": typ,
            "app_id": _short(p10.get("group_id")),
            "reply_to": reply,
            "user_id": user.decode("utf-8", "replace") if user is not None and len(user) <= 255 else None,
        }
    msg_id = _message_id(
        p10.get("message_id"),
        "x-message-id-type" if conversion == "msg_record" else "x-message-id",
        headers,
        conversion,
    )
    corr_id = _message_id(
        p10.get("correlation_id"),
        "x-correlation-id-type" if conversion == "msg_record" else "x-correlation-id",
        headers,
        conversion,
    )
    created = amqp10.plain(p10["creation_time"]) if p10.get("creation_time") else None
    props.update(
        content_type=_amqp10_text(p10.get("content_type")),
        content_encoding=_amqp10_text(p10.get("content_encoding")),
        message_id=msg_id,
        correlation_id=corr_id,
        cluster_id=None,
        timestamp=created // 1000 if isinstance(created, int) else None,
    )
    for k in ("delivery_mode", "priority"):
        if props[k] is not None and not isinstance(props[k], int):
            raise FormatError(f"{k} annotation is no integer: the conversion fails")
    exchange, rk = ma.get("x-exchange"), ma.get("x-routing-key")
    detail = {
        "header": header or None,
        "message_annotations": {k: v for k, v in ma.items()},
        "properties": p10,
        "application_properties": {k: v for k, v in ap},
        "body_section": None if not body_secs else amqp10.SECTION_NAMES[body_secs[0][0]],
    }
    if "footer" in secs:
        detail["footer"] = amqp10.map_object(secs["footer"])
    return {
        "msg_id": None,
        "persistent": props["delivery_mode"] == 2,
        "exchange": _amqp10_text(exchange),
        "routing_keys": [_amqp10_text(rk)] if rk is not None else [],
        "properties": props,
        "timestamp_ms": created if isinstance(created, int) else None,
        "headers": amqp091.headers_json(headers) if headers else None,
        "annotations": _annotations_json({}, {"amqp10": detail}),
        "body": body,
        "term_format": "amqp10",
    }
