"""Routing as the broker does it, from the metadata's durable exchanges and bindings: which
queues a message published to an exchange with some routing keys (and headers) reaches.

Used to attribute orphaned shared-store messages (acked, or whose queue's index is gone) to the
queues they were routed to (``orphan_queues``): the store keeps each message's exchange and
routing keys, the metadata its bindings. Exchange types, after the broker's modules:

* the default exchange (``""``): the queue named by each routing key (rabbit_exchange_type_direct
  with the implicit bindings of every queue);
* ``direct``: bindings whose key equals a routing key;
* ``fanout``: every binding;
* ``topic``: AMQP 0-9-1 topic patterns (``*`` one word, ``#`` zero or more; words split on ``.``);
* ``headers``: binding arguments against the message headers, ``x-match`` all (default) / any /
  all-with-x / any-with-x; a ``void`` argument matches presence; values of the same type class
  compare equal (rabbit_exchange_type_headers);
* exchange-to-exchange bindings are followed (each exchange once), and an exchange's
  ``alternate-exchange`` argument when it routes nowhere.

Anything else (another exchange type, an exchange the metadata does not list) cannot be told:
``route`` returns None. Policies (an alternate exchange set by policy) are not read.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from cqforensics.readers.metadata import Binding, Metadata

_INT = {
    "byte",
    "short",
    "signedint",
    "long",
    "unsignedbyte",
    "unsignedshort",
    "unsignedint",
    "signedbyte",
    "unsignedlong",
    "int",
    "long_int",
    "short_int",
    "timestamp",
}
_FLOAT = {"float", "double"}
_STR = {"longstr", "shortstr", "binary", "string", "symbol", "utf8"}


def _class(t: str) -> str:
    t = str(t)
    return "int" if t in _INT else "float" if t in _FLOAT else "str" if t in _STR else t


def _arg_value(typ, value):
    """A binding argument's (type class, comparable value)."""
    c = _class(typ)
    if c == "str" and isinstance(value, (bytes, bytearray)):
        return c, bytes(value)
    if c == "bool":
        return c, value is True or value == "true"
    return c, value


def _header_value(h: dict):
    """A typed-JSON header value (``{"type": t, "value": v}`` or ``"base64"``) -> (class, value)."""
    t = h.get("type", "")
    c = _class(t)
    if "base64" in h:
        v = base64.b64decode(h["base64"])
    else:
        v = h.get("value")
    if c == "str" and isinstance(v, str):
        v = v.encode("utf-8", "surrogateescape")
    return c, v


def topic_match(pattern: bytes, key: bytes) -> bool:
    """AMQP 0-9-1 topic matching: ``*`` is one word, ``#`` zero or more (words split on ``.``)."""
    # rabbit_exchange_type_topic split_topic_key: an empty key has no words, "a..b" an empty one
    p, k = (pattern.split(b".") if pattern else []), (key.split(b".") if key else [])
    # positions of k each prefix of p can end at
    states = {0}
    for w in p:
        nxt = set()
        for s in states:
            if w == b"#":
                nxt.update(range(s, len(k) + 1))
            elif s < len(k) and (w == b"*" or w == k[s]):
                nxt.add(s + 1)
        states = nxt
        if not states:
            return False
    return len(k) in states


def headers_match(args: Iterable, headers: dict | None) -> bool:
    """rabbit_exchange_type_headers: binding ``args`` ((Key, Type, Value), ...) against the
    message's typed-JSON ``headers``."""
    headers = headers or {}
    mode = b"all"
    pattern = []
    for item in args:
        k, t, v = item
        k = bytes(k) if isinstance(k, (bytes, bytearray)) else str(k).encode()
        if k == b"x-match":
            mode = bytes(v) if isinstance(v, (bytes, bytearray)) else str(v).encode()
            continue
        pattern.append((k, t, v))
    with_x = mode.endswith(b"-with-x")
    pattern = [(k, t, v) for k, t, v in pattern if with_x or not k.startswith(b"x-")]
    have = {}
    for name, h in headers.items():
        key = name.encode("utf-8", "surrogateescape")
        if with_x or not key.startswith(b"x-"):
            have[key] = h
    if not pattern:
        return mode.startswith(b"all")
    hits = 0
    for k, t, v in pattern:
        h = have.get(k)
        if h is None:
            ok = False
        elif str(t) == "void":
            ok = True
        else:
            ok = isinstance(h, dict) and _arg_value(t, v) == _header_value(h)
        hits += ok
        if mode.startswith(b"any") and ok:
            return True
    return mode.startswith(b"all") and hits == len(pattern)


@dataclass
class Router:
    """The durable routing of one node's metadata."""

    meta: Metadata
    by_source: dict[tuple[bytes, bytes], list[Binding]] = field(default_factory=dict)

    def __post_init__(self):
        for b in self.meta.bindings:
            self.by_source.setdefault((b.vhost, b.source), []).append(b)

    def route(
        self,
        vhost: bytes,
        exchange: bytes,
        routing_keys: list[bytes],
        headers: dict | None = None,
        _seen: set | None = None,
    ) -> set[bytes] | None:
        """The queue names (of ``vhost``) a message published to ``exchange`` reaches; None when
        the routing cannot be told (unknown exchange or exchange type)."""
        if exchange == b"":  # the default exchange: the queue each routing key names
            return {k for k in routing_keys if (vhost, k) in self.meta.queues}
        xtype = self.meta.exchanges.get((vhost, exchange))
        if xtype not in ("direct", "fanout", "topic", "headers"):
            return None  # not in the metadata, or a plugin's type (consistent hash, delayed, ...)
        seen = _seen if _seen is not None else set()
        if exchange in seen:
            return set()
        seen.add(exchange)
        hits: list[Binding] = []
        for b in self.by_source.get((vhost, exchange), []):
            if xtype == "fanout":
                ok = True
            elif xtype == "direct":
                ok = b.key in routing_keys
            elif xtype == "topic":
                ok = any(topic_match(b.key, k) for k in routing_keys)
            else:
                ok = headers_match(b.args, headers)
            if ok:
                hits.append(b)
        out: set[bytes] = set()
        for b in hits:
            if b.dest_kind == "queue":
                out.add(b.destination)
            else:
                more = self.route(vhost, b.destination, routing_keys, headers, seen)
                if more is None:
                    return None
                out |= more
        if not out:
            alt = _alternate(self.meta.exchange_args.get((vhost, exchange), []))
            if alt is not None:
                more = self.route(vhost, alt, routing_keys, headers, seen)
                return more
        return out


def _alternate(args: list) -> bytes | None:
    for item in args:
        if (
            isinstance(item, tuple)
            and len(item) == 3
            and item[0] == b"alternate-exchange"
            and isinstance(item[2], (bytes, bytearray))
        ):
            return bytes(item[2])
    return None


def route_message(router: Router, vhost: bytes, msg: dict) -> set[bytes] | None:
    """The queues a decoded stored message (``fastpath.decode``) was routed to."""
    exchange = msg.get("exchange")
    if exchange is None:
        return None
    keys = [
        k.encode("utf-8", "surrogateescape") if isinstance(k, str) else bytes(k) for k in msg.get("routing_keys") or []
    ]
    headers = msg.get("headers")
    if isinstance(headers, str):
        try:
            headers = json.loads(headers)
        except ValueError:
            headers = None
    return router.route(vhost, exchange.encode("utf-8", "surrogateescape"), keys, headers)
