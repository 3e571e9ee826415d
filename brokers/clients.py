"""AMQP clients for driving a real broker and recording what it delivers (the ground truth).

AMQP 0-9-1 goes through pika, AMQP 1.0 through the proton bundled with
rabbitmq-amqp-python-client, MQTT 3.1.1 / 5.0 through paho-mqtt and STOMP through stomp.py
(publishers only: what they sent is recorded by ``mqtt_publish`` / ``stomp_send``; what the
broker delivered is always recorded by an AMQP 0-9-1 or 1.0 consumer). Two pika limitations are worked around here, on the client side
only, so that the recorded ground truth is independent of cqforensics' own decoders:

* pika can only *send* a few field types (S, x, t, I, l, D, T, F, A, V). ``Typed(kind, value)``
  lets a header carry any type RabbitMQ parses (b B s u I i l L f d D t T S x F A V).
* pika's decoder truncates 'f'/'d' values to integers and drops the wire type. pika is patched
  to keep the raw content-header bytes, which ``decode_properties`` (a deliberately separate,
  minimal decoder: the oracle must not share code with the readers it checks) turns into
  typed JSON ({"type": <RabbitMQ type name>, "value": ...}).
"""

from __future__ import annotations

import base64
import decimal
import hashlib
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

from cqforensics.codecs.amqp091 import TYPE_CHARS

#: AMQP 0-9-1 field-table type characters -> RabbitMQ's type names (rabbit_binary_parser): the
#: codec's one table
FIELD_TYPES = TYPE_CHARS

#: The 13 basic properties other than headers, in wire order.
PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
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


@dataclass(frozen=True)
class Typed:
    """A field-table value with an explicit AMQP 0-9-1 type character."""

    kind: str
    value: Any


_SIMPLE = {
    "b": ">b",
    "B": ">B",
    "s": ">h",
    "u": ">H",
    "I": ">i",
    "i": ">I",
    "l": ">q",
    "L": ">q",
    "f": ">f",
    "d": ">d",
    "T": ">Q",
}


#: Every field type RabbitMQ parses in a header table, nested tables and arrays included.
ALL_TYPES = {
    "str": "plain text ✓",
    "str-latin1": Typed("S", b"caf\xe9 not utf-8"),
    "bytes": Typed("x", b"\x00\x01\xfe\xff"),
    "byte": Typed("b", -7),
    "ubyte": Typed("B", 250),
    "short": Typed("s", -30000),
    "ushort": Typed("u", 65000),
    "int": Typed("I", -2_000_000_000),
    "uint": Typed("i", 4_000_000_000),
    "long": Typed("l", -(2**62)),
    "long-L": Typed("L", 2**62),
    "float": Typed("f", 3.25),
    "double": Typed("d", -1.0e-300),
    "decimal": Typed("D", (3, 1234567)),
    "bool": False,
    "timestamp": Typed("T", 1_700_000_000),
    "void": None,
    "table": {"inner": Typed("I", 1), "deeper": {"x": "y", "list": [1, "two", Typed("d", 3.5)]}},
    "array": [Typed("b", 1), "s", Typed("x", b"\xff"), {"k": True}, [Typed("u", 2)], None],
}


def _install_pika_patches() -> None:
    import pika.data
    import pika.spec

    if getattr(pika.data, "_cqf_patched", False):
        return
    encode_orig = pika.data.encode_value

    def encode_value(pieces, value):
        if not isinstance(value, Typed):
            return encode_orig(pieces, value)
        k, v = value.kind, value.value
        if k in _SIMPLE:
            pieces.append(k.encode() + struct.pack(_SIMPLE[k], v))
            return 1 + struct.calcsize(_SIMPLE[k])
        if k in ("S", "x"):
            raw = v.encode() if isinstance(v, str) else v
            pieces.append(k.encode() + struct.pack(">I", len(raw)) + raw)
            return 5 + len(raw)
        if k == "t":
            pieces.append(b"t" + bytes([1 if v else 0]))
            return 2
        if k == "D":  # (scale, unsigned value) exactly as RabbitMQ parses it
            pieces.append(b"D" + struct.pack(">BI", *v))
            return 6
        if k == "V":
            pieces.append(b"V")
            return 1
        return encode_orig(pieces, v)

    props_decode = pika.spec.BasicProperties.decode

    def props_decode_keep_raw(self, encoded, offset=0):
        self._cqf_raw = bytes(encoded[offset:])
        return props_decode(self, encoded, offset)

    pika.data.encode_value = encode_value
    pika.spec.BasicProperties.decode = props_decode_keep_raw
    pika.data._cqf_patched = True


def pika_module():
    """pika with the typed-table patches installed."""
    _install_pika_patches()
    import pika

    return pika


def _value(buf: bytes, o: int) -> tuple[Typed, int]:
    kind = chr(buf[o])
    o += 1
    if kind in _SIMPLE:
        fmt = _SIMPLE[kind]
        return Typed(kind, struct.unpack_from(fmt, buf, o)[0]), o + struct.calcsize(fmt)
    if kind == "t":
        return Typed(kind, buf[o] != 0), o + 1
    if kind == "D":
        return Typed(kind, struct.unpack_from(">BI", buf, o)), o + 5
    if kind == "V":
        return Typed(kind, None), o
    (n,) = struct.unpack_from(">I", buf, o)
    raw, end = buf[o + 4 : o + 4 + n], o + 4 + n
    if kind in ("S", "x"):
        return Typed(kind, bytes(raw)), end
    if kind == "F":
        return Typed(kind, _table(raw)), end
    if kind == "A":
        items, i = [], 0
        while i < len(raw):
            v, i = _value(raw, i)
            items.append(v)
        return Typed(kind, items), end
    raise ValueError(f"unknown field type {kind!r}")


def _table(raw: bytes) -> dict:
    out, i = {}, 0
    while i < len(raw):
        n = raw[i]
        key = raw[i + 1 : i + 1 + n].decode("utf-8", "surrogateescape")
        out[key], i = _value(raw, i + 1 + n)
    return out


def decode_properties(raw: bytes) -> tuple[dict, dict | None]:
    """AMQP 0-9-1 basic property list (flags word + fields) -> (properties, headers)."""
    (flags,) = struct.unpack_from(">H", raw, 0)
    o, props, headers = 2, {n: None for n in PROPERTY_NAMES}, None
    for bit, name in zip(range(15, 1, -1), ("content_type", "content_encoding", "headers", *PROPERTY_NAMES[2:])):
        if not flags & (1 << bit):
            continue
        if name == "headers":
            (n,) = struct.unpack_from(">I", raw, o)
            headers, o = table_json(_table(raw[o + 4 : o + 4 + n])), o + 4 + n
        elif name in ("delivery_mode", "priority"):
            props[name], o = raw[o], o + 1
        elif name == "timestamp":
            props[name], o = struct.unpack_from(">Q", raw, o)[0], o + 8
        else:
            n = raw[o]
            props[name] = raw[o + 1 : o + 1 + n].decode("utf-8", "surrogateescape")
            o += 1 + n
    return props, headers


def _text_or_b64(raw: bytes) -> dict:
    try:
        return {"value": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode()}


def _float_json(v: float):
    return v if math.isfinite(v) else repr(v)  # "nan", "inf", "-inf": JSON has no such numbers


def typed_json(v: Any) -> dict:
    """A decoded ``Typed`` value -> {"type": name, "value"|"base64": ...}."""
    assert isinstance(v, Typed), v
    name = FIELD_TYPES[v.kind]
    if v.kind in ("S", "x"):
        return {"type": name, **_text_or_b64(v.value)}
    if v.kind == "F":
        return {"type": name, "value": table_json(v.value)}
    if v.kind == "A":
        return {"type": name, "value": [typed_json(x) for x in v.value]}
    if v.kind == "D":
        return {"type": name, "value": {"scale": v.value[0], "value": v.value[1]}}
    if v.kind in ("f", "d"):
        return {"type": name, "value": _float_json(v.value)}
    return {"type": name, "value": v.value}


def table_json(table: dict | None) -> dict | None:
    if table is None:
        return None
    return {k: typed_json(v) for k, v in table.items()}


def record_091(method, props, body: bytes) -> dict:
    """One delivered AMQP 0-9-1 message as a ground-truth record."""
    properties, headers = decode_properties(props._cqf_raw)
    return {
        "protocol": "amqp091",
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "body_len": len(body),
        "exchange": method.exchange,
        "routing_key": method.routing_key,
        "redelivered": bool(method.redelivered),
        "properties": properties,
        "headers": headers,
    }


def drain_091(channel, queue: str) -> list[dict]:
    """basic.get + ack until the queue is empty; returns records in delivery order."""
    out = []
    while True:
        method, props, body = channel.basic_get(queue, auto_ack=False)
        if method is None:
            return out
        out.append(record_091(method, props, body))
        channel.basic_ack(method.delivery_tag)


# -- AMQP 1.0 ---------------------------------------------------------------------------------


def proton():
    """The proton package bundled with rabbitmq-amqp-python-client."""
    from rabbitmq_amqp_python_client.qpid import proton as p  # noqa: F401
    from rabbitmq_amqp_python_client.qpid.proton import _utils  # noqa: F401

    return p


def amqp10_connection(port: int, vhost: str = "/"):
    """A blocking AMQP 1.0 connection to ``vhost`` (RabbitMQ 4.x selects it by 'vhost:' hostname)."""
    from rabbitmq_amqp_python_client.qpid.proton.utils import BlockingConnection

    return BlockingConnection(
        f"amqp://guest:guest@127.0.0.1:{port}", virtual_host=f"vhost:{vhost}", allowed_mechs="PLAIN", timeout=30
    )


def amqp10_json(v: Any):
    """A proton-decoded AMQP 1.0 value -> JSON with its AMQP type name."""
    p = proton()
    t = type(v)
    named = {
        p.symbol: "symbol",
        p.ulong: "ulong",
        p.ubyte: "ubyte",
        p.ushort: "ushort",
        p.uint: "uint",
        p.byte: "byte",
        p.short: "short",
        p.int32: "int",
        p.float32: "float",
        p.char: "char",
        p.timestamp: "timestamp",
        p.decimal32: "decimal32",
        p.decimal64: "decimal64",
        p.decimal128: "decimal128",
    }
    if t in named:
        return {
            "type": named[t],
            "value": v
            if not isinstance(v, (bytes, float))
            else (_float_json(v) if isinstance(v, float) else base64.b64encode(v).decode()),
        }
    if isinstance(v, bool):
        return {"type": "boolean", "value": v}
    if isinstance(v, int):
        return {"type": "long", "value": v}
    if isinstance(v, float):
        return {"type": "double", "value": _float_json(v)}
    if isinstance(v, str):
        return {"type": "string", "value": v}
    if isinstance(v, (bytes, memoryview)):
        return {"type": "binary", "base64": base64.b64encode(bytes(v)).decode()}
    if v is None:
        return {"type": "null", "value": None}
    if isinstance(v, dict):
        return {"type": "map", "value": [[amqp10_json(k), amqp10_json(x)] for k, x in v.items()]}
    if isinstance(v, (list, tuple)):
        return {"type": "list", "value": [amqp10_json(x) for x in v]}
    if isinstance(v, decimal.Decimal):
        return {"type": "decimal", "value": str(v)}
    import uuid

    if isinstance(v, uuid.UUID):
        return {"type": "uuid", "value": str(v)}
    return {"type": t.__name__, "value": repr(v)}


def record_amqp10(msg) -> dict:
    """One delivered AMQP 1.0 message as a ground-truth record."""
    body = msg.body
    if isinstance(body, (bytes, memoryview)) and msg.inferred:
        section, raw, value = "data", bytes(body), None
    else:  # amqp-value (or amqp-sequence): compare the decoded value, not bytes of our choosing
        section, raw, value = "amqp-value", None, amqp10_json(body)
    ann = {str(k): amqp10_json(v) for k, v in (msg.annotations or {}).items()}

    def opt(v):
        return None if v is None or v == b"" else amqp10_json(v)

    def msg_id(v):  # message-id / correlation-id: an integer can only be a ulong (AMQP 1.0 3.2.11)
        if type(v) is int:
            v = proton().ulong(v)
        return opt(v)

    def sym(v):  # proton reports an absent symbol as symbol('None')
        return None if v is None or str(v) == "None" else str(v)

    header = {"durable": bool(msg.durable)}
    if msg.priority != 4:  # AMQP 1.0 default priority: proton cannot tell absent from 4
        header["priority"] = msg.priority
    if msg.ttl:
        header["ttl"] = msg.ttl

    return {
        "protocol": "amqp10",
        "body_section": section,
        "body_sha256": None if raw is None else hashlib.sha256(raw).hexdigest(),
        "body_len": None if raw is None else len(raw),
        "body_value": value,
        "exchange": (msg.annotations or {}).get("x-exchange"),
        "routing_key": (msg.annotations or {}).get("x-routing-key"),
        "redelivered": (msg.delivery_count or 0) > 0,
        "header": header,
        "properties": {
            "message_id": msg_id(msg.id),
            "user_id": opt(msg.user_id),
            "to": msg.address,
            "subject": msg.subject,
            "reply_to": msg.reply_to,
            "correlation_id": msg_id(msg.correlation_id),
            "content_type": sym(msg.content_type),
            "content_encoding": sym(msg.content_encoding),
            "absolute_expiry_time": msg.expiry_time or None,
            "creation_time": msg.creation_time or None,
            "group_id": msg.group_id,
            "group_sequence": msg.group_sequence or None,
            "reply_to_group_id": msg.reply_to_group_id,
        },
        "application_properties": {str(k): amqp10_json(v) for k, v in (msg.application_properties or {}).items()},
        "message_annotations": ann,
    }


def drain_amqp10(port: int, vhost: str, queue: str, count: int) -> list[dict]:
    """Receive and accept up to ``count`` messages over AMQP 1.0, in delivery order.

    ``count`` is the queue length the broker reports, which may include messages it will drop
    on delivery (expired): receiving stops at the first 5 s without a message.
    """
    from rabbitmq_amqp_python_client.qpid.proton import Timeout

    if count == 0:
        return []
    conn = amqp10_connection(port, vhost)
    try:
        rcv = conn.create_receiver(f"/queues/{queue}", credit=1)
        out = []
        for _ in range(count):
            try:
                msg = rcv.receive(timeout=5)
            except Timeout:
                break
            out.append(record_amqp10(msg))
            rcv.accept()
        rcv.close()
        return out
    finally:
        conn.close()


# -- MQTT (paho-mqtt) and STOMP (stomp.py) publishers -------------------------------------------

#: MQTT 5.0 PUBLISH properties we set, by their paho attribute name -> manifest key
MQTT5_PROPERTIES = {
    "ContentType": "content_type",
    "ResponseTopic": "response_topic",
    "CorrelationData": "correlation_data",
    "MessageExpiryInterval": "message_expiry_interval",
    "PayloadFormatIndicator": "payload_format_indicator",
    "UserProperty": "user_property",
}


def mqtt_client(
    port: int,
    client_id: str,
    version: str = "5.0",
    clean: bool = True,
    session_expiry: int | None = None,
    timeout: float = 30.0,
):
    """A connected paho client (network loop running) of MQTT ``version`` "3.1.1" or "5.0".

    ``clean``: clean_session (3.1.1) / clean_start (5.0); ``session_expiry``: the 5.0 CONNECT
    Session Expiry Interval in seconds (a 5.0 session outlives its connection only with one)."""
    import threading

    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    v5 = version == "5.0"
    c = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
        clean_session=None if v5 else clean,
    )
    c.username_pw_set("guest", "guest")
    connected, result = threading.Event(), {}

    def on_connect(client, userdata, flags, reason_code, properties):
        result["rc"] = reason_code
        connected.set()

    c.on_connect = on_connect
    kw = {}
    if v5:
        props = Properties(PacketTypes.CONNECT)
        if session_expiry is not None:
            props.SessionExpiryInterval = session_expiry
        kw = {"clean_start": clean, "properties": props}
    c.connect("127.0.0.1", port, keepalive=60, **kw)
    c.loop_start()
    if not connected.wait(timeout) or result["rc"].is_failure:
        c.loop_stop()
        raise RuntimeError(f"MQTT {version} connect of {client_id!r} failed: {result.get('rc')}")
    return c


def mqtt_subscribe(client, topic: str, qos: int = 1, timeout: float = 30.0) -> None:
    import threading

    done = threading.Event()
    client.on_subscribe = lambda *a: done.set()
    client.subscribe(topic, qos=qos)
    if not done.wait(timeout):
        raise RuntimeError(f"MQTT subscribe to {topic!r} was not acknowledged")


def mqtt_close(client) -> None:
    client.disconnect()
    client.loop_stop()


def mqtt_publish(
    client,
    version: str,
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool = False,
    props: dict | None = None,
    timeout: float = 30.0,
) -> dict:
    """Publish one message and wait until it left (QoS 0) or the broker acknowledged it (QoS 1);
    returns what was sent. ``props``: MQTT 5.0 properties by paho name (``UserProperty`` a list of
    pairs, kept in order, duplicates allowed)."""
    properties = None
    if props:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        properties = Properties(PacketTypes.PUBLISH)
        for name, value in props.items():
            setattr(properties, name, value)
    info = client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
    info.wait_for_publish(timeout)
    if not info.is_published():
        raise RuntimeError(f"MQTT publish to {topic!r} not confirmed")
    sent = {}
    for name, value in (props or {}).items():
        key = MQTT5_PROPERTIES.get(name, name)
        if isinstance(value, (bytes, bytearray)):
            sent[key] = {"base64": base64.b64encode(bytes(value)).decode()}
        elif name == "UserProperty":
            sent[key] = [list(kv) for kv in value]
        else:
            sent[key] = value
    return {
        "protocol": "mqtt",
        "version": version,
        "client_id": client._client_id.decode(),
        "topic": topic,
        "qos": qos,
        "retain": retain,
        "properties": sent,
        "body_sha256": hashlib.sha256(payload).hexdigest(),
        "body_len": len(payload),
    }


def stomp_connection(port: int, vhost: str = "/"):
    """A connected STOMP 1.2 connection (stomp.py) whose ``sent_receipts`` can be awaited."""
    import threading

    import stomp

    class Receipts(stomp.ConnectionListener):
        def __init__(self):
            self.seen, self.cond = set(), threading.Condition()

        def on_receipt(self, frame):
            with self.cond:
                self.seen.add(frame.headers.get("receipt-id"))
                self.cond.notify_all()

        def wait(self, receipt, timeout):
            with self.cond:
                return self.cond.wait_for(lambda: receipt in self.seen, timeout)

    conn = stomp.Connection12([("127.0.0.1", port)], vhost=vhost, heartbeats=(0, 0))
    conn.receipts = Receipts()
    conn.set_listener("receipts", conn.receipts)
    conn.connect("guest", "guest", wait=True)
    return conn


def stomp_send(conn, destination: str, payload: bytes, headers: dict[str, str], timeout: float = 30.0) -> dict:
    """SEND one frame and wait for its receipt (the broker confirmed the publish); returns what was sent."""
    import uuid

    receipt = f"r-{uuid.uuid4()}"
    conn.send(destination, payload, headers=dict(headers, receipt=receipt))
    if not conn.receipts.wait(receipt, timeout):
        raise RuntimeError(f"no STOMP receipt for a SEND to {destination!r}")
    return {
        "protocol": "stomp",
        "version": "1.2",
        "destination": destination,
        "headers": dict(headers),
        "body_sha256": hashlib.sha256(payload).hexdigest(),
        "body_len": len(payload),
    }


# -- draining a whole node -----------------------------------------------------------------------


def list_queues(broker, vhost: str) -> list[dict]:
    out = broker.ctl("list_queues", "-p", vhost, "name", "durable", "messages", "--formatter", "json", "-q")
    return json.loads(out or "[]")


#: every queue of the node, one line each: vhost and name hex-encoded (any bytes survive the
#: CLI's printing), and whether it is durable. ``amqqueue`` is the queue record's API since 3.8.
_ALL_QUEUES = (
    "[begin {resource, V, queue, N} = amqqueue:get_name(Q), "
    'io:format("~s ~s ~s~n", [binary:encode_hex(V), binary:encode_hex(N), amqqueue:is_durable(Q)]) end '
    "|| Q <- rabbit_amqqueue:list()], ok."
)


def list_all_queues(broker) -> dict[str, list[dict]]:
    """Per vhost, its queues (name, durable), from one ``rabbitmqctl eval``: a rabbitmqctl call
    boots a CLI VM (about 1.2 CPU-seconds), and ``rabbitmqctl list_queues`` takes one vhost per call."""
    out: dict[str, list[dict]] = {}
    for line in broker.ctl("eval", _ALL_QUEUES).splitlines():
        fields = line.split()
        if len(fields) != 3:
            continue  # the expression's value (ok)
        vhost, name = (bytes.fromhex(f).decode() for f in fields[:2])
        out.setdefault(vhost, []).append({"name": name, "durable": fields[2] == "true"})
    return out


def drain_all(broker, vhosts: list[str], known: dict | None = None) -> list[dict]:
    """Drain every queue of ``vhosts``; returns per-queue records in delivery order.

    ``known`` maps (vhost, name) to what is known of a queue (its "drain" protocol: amqp091 or
    amqp10, and anything else to keep in the record). Known queues that no longer exist
    (exclusive ones after a restart) are listed with ``exists_after_restart: false``."""
    pika = pika_module()
    known = known or {}
    result, seen = [], set()
    listed = list_all_queues(broker)
    for vhost in vhosts:
        params = pika.URLParameters(broker.url)
        params.virtual_host = vhost
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        for q in sorted(listed.get(vhost, []), key=lambda q: q["name"]):
            info = known.get((vhost, q["name"]), {"vhost": vhost, "name": q["name"], "drain": "amqp091"})
            if info["drain"] == "amqp10":
                count = ch.queue_declare(q["name"], passive=True).method.message_count
                msgs = drain_amqp10(broker.port, vhost, q["name"], count)
            else:
                msgs = drain_091(ch, q["name"])
            result.append({**info, "durable": q["durable"], "exists_after_restart": True, "messages": msgs})
            seen.add((vhost, q["name"]))
        conn.close()
    for key, info in sorted(known.items()):
        if key not in seen:
            result.append({**info, "durable": False, "exists_after_restart": False, "messages": []})
    return result


def drain_counts(broker, vhosts: list[str], amqp10_queues=()) -> dict:
    """Drain every queue; per (vhost, queue) the number of messages delivered, or "crash" when
    the broker failed the queue (a channel or link error while draining). The queues are listed
    per vhost with ``list_queues``, not ``list_all_queues``: after the latter the first
    basic.get on a queue that crashes at boot took 62 s to fail (4.0.5, qi_reserved_bit; after
    ``list_queues``, which asks each queue for its count, it fails at once). Why is not known."""
    pika = pika_module()
    out: dict = {}
    for vhost in vhosts:
        try:
            listed = list_queues(broker, vhost)
        except Exception:  # the vhost itself is down
            out[(vhost, None)] = "crash"
            continue
        for q in listed:
            key = (vhost, q["name"])
            try:
                if key in amqp10_queues:
                    out[key] = len(drain_amqp10(broker.port, vhost, q["name"], q["messages"] or 0))
                else:
                    params = pika.URLParameters(broker.url)
                    params.virtual_host = vhost
                    conn = pika.BlockingConnection(params)
                    try:
                        out[key] = len(drain_091(conn.channel(), q["name"]))
                    finally:
                        if conn.is_open:
                            conn.close()
            except Exception:  # the broker crashed this queue (or its vhost) while we read it
                out[key] = "crash"
    return out
