"""Bytes of every file a writer produces, built with the twins of ``cqforensics.grammar``
(tests check each builder against the construct grammar it twins).

What the broker accepts (docs/formats/classic.md §9.4): index entries with status 1, the
persistent flag and zero reserved bits; ``.qi``/``.qs`` segments headed by their magic, version
and the segment's SeqId range; ``.qs`` entries of the exact term size with a CRC; shared-store
entries ``[u64 16 + len][id][term][255]``; CQv1 publish records (term embedded below the
threshold) and a deliver record for a delivered message.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from cqforensics.base.errors import FormatError
from cqforensics.codecs import amqp091, etf
from cqforensics.grammar import idx as c_idx
from cqforensics.grammar import qi as c_qi
from cqforensics.grammar import qs as c_qs
from cqforensics.grammar import rdq as c_rdq
from cqforensics.message import reference as message
from cqforensics.model.versions import BrokerModel
from cqforensics.readers import rdq as r_rdq

#: queue_index_embed_msgs_below: smaller messages go to the queue's own store (.qs / embedded)
EMBED_BELOW = 4096


def segment_header(magic: bytes, number: int, entry_count: int) -> bytes:
    """The 64-byte header of a ``.qi`` or ``.qs`` segment (IDX2 new_segment_file, QS2
    maybe_write_file_header): magic, version 2, from and to SeqId, zero padding."""
    h = np.zeros(1, c_qi.HEADER_DTYPE)
    h["magic"], h["version"] = magic, c_qi.VERSION
    h["from_seq_id"] = number * entry_count
    h["to_seq_id"] = (number + 1) * entry_count
    return h.tobytes()


def qi_segment(
    number: int,
    entry_count: int,
    slots: np.ndarray,
    persistent: np.ndarray,
    loc_kind: np.ndarray,
    msg_id: np.ndarray,
    qs_offset: np.ndarray,
    qs_size: np.ndarray,
    size: np.ndarray,
    expiry: np.ndarray,
) -> bytes:
    """A ``.qi`` segment holding live entries at ``slots`` (ascending); every other slot up to
    the last is zero (acked). Arrays are aligned with ``slots``."""
    n = int(slots[-1]) + 1 if len(slots) else 0
    e = np.zeros(n, c_qi.ENTRY_DTYPE)
    e["status"][slots] = 1
    e["flags"][slots] = persistent.astype(np.uint8) & 1
    e["loc_kind"][slots] = loc_kind
    shared = loc_kind == c_qi.LOC_SHARED_STORE
    if shared.any():
        e["msg_id"][slots[shared]] = msg_id[shared]
    qs = loc_kind == c_qi.LOC_QUEUE_STORE
    if qs.any():  # the location's second variant overlays msg_id: write it after
        e["qs_offset"][slots[qs]] = qs_offset[qs]
        e["qs_size"][slots[qs]] = qs_size[qs]
        e["loc_pad"][slots[qs]] = 0
    e["size"][slots] = size
    e["expiry"][slots] = expiry
    return segment_header(c_qi.MAGIC, number, entry_count) + e.tobytes()


def qs_entry_header(term: bytes) -> bytes:
    """QS2 entry header: term size, CRC flag, low 16 bits of CRC-32 over the term, 0."""
    return c_qs.ENTRY_HEADER.pack(len(term), 1, zlib.crc32(term) & 0xFFFF, 0)


def rdq_entry(msg_id: bytes, term: bytes) -> bytes:
    """A shared-store entry (MS writer_append)."""
    return c_rdq.ENTRY_HEAD.pack(c_rdq.MSG_ID_SIZE + len(term), msg_id) + term + b"\xff"


def rdq_entry_size(term_len: int) -> int:
    """The bytes ``rdq_entry`` takes for a term of ``term_len`` bytes: the readers' framing rule
    (``readers.rdq.entry_total``), so writer and readers cannot disagree."""
    return r_rdq.entry_total(term_len)


def v1_publish_head(
    rel_seq: int, persistent: bool, msg_id: bytes, expiry: int, size: int, embedded_size: int = 0
) -> bytes:
    """A CQv1 segment publish record up to its embedded term (``embedded_size`` bytes follow;
    0: the message is in the shared store)."""
    head = 0x8000 | (0x4000 if persistent else 0) | rel_seq
    return c_idx.PUB.pack(head, msg_id, expiry, size, embedded_size)


def v1_deliver(rel_seq: int) -> bytes:
    """A CQv1 deliver (or, repeated, ack) record."""
    return c_idx.HEAD.pack(0x4000 | rel_seq)


def vhost_config(segment_entry_count: int) -> bytes:
    """A vhost's ``.config`` recording its CQv1 segment size (rabbit_vhost_msg_store /
    rabbit_queue_index write it; ``textfiles.segment_entry_count`` reads it)."""
    return (
        b"% This file is auto-generated! Edit at your own risk!\n"
        b"{segment_entry_count, " + str(int(segment_entry_count)).encode() + b"}."
    )


def queue_name_stub(vhost: bytes, name: bytes, index_version: int) -> bytes:
    """``.queue_name`` as IDX2/QI1 write it (v2 adds the INDEX line)."""
    out = b"VHOST: " + vhost + b"\nQUEUE: " + name + b"\n"
    return out + b"INDEX: v2\n" if index_version == 2 else out


# -- what each target version writes -----------------------------------------------------------------
#
# The one place that decides, per target version, the index version and the stored term shape of
# every message a writer puts down (compact, rebuild and the Spark writer ask here).


def index_version(model: BrokerModel, declared: int | None = None, current: int | None = None) -> int:
    """The index version a queue dir is written with: v2 from 4.0 (``index_v2_only``); up to
    3.13 the version the queue declares (``x-queue-version``), else the one its dir already has,
    else the version's default for new queues (``default_index_version``, 1)."""
    if model.index_v2_only:
        return 2
    for v in (declared, current):
        if v in (1, 2):
            return int(v)
    return model.default_index_version


_CONTENT = etf.Atom("content")
_NONE = etf.Atom("none")
_FRAMING = etf.Atom("rabbit_framing_amqp_0_9_1")


def stored_term(
    model: BrokerModel,
    msg_id: bytes,
    vhost: str | bytes,
    exchange: str | bytes | None,
    routing_keys: list,
    props: dict,
    props_bin: bytes,
    body: bytes,
) -> bytes:
    """The term the target version stores for a persistent AMQP 0-9-1 message published with
    ``props`` (13 scalar properties) encoded as ``props_bin``: ``#basic_message{}`` up to 3.12
    (ATOM_EXT atoms, OTP 25), ``#mc{protocol = mc_amqpl}`` from 3.13 (atoms per
    ``model.utf8_atoms``) with the annotations a publish derives (id, exchange, routing keys;
    priority, timestamp and TTL from the properties)."""
    content = (_CONTENT, 60, _NONE, props_bin, _FRAMING, [body])
    x = bytes(exchange) if isinstance(exchange, (bytes, bytearray)) else (exchange or "").encode()
    rks = [k.encode() if isinstance(k, str) else bytes(k) for k in routing_keys]
    if not model.stores_mc:
        vh = vhost if isinstance(vhost, bytes) else vhost.encode()
        term = (
            etf.Atom("basic_message"),
            (etf.Atom("resource"), vh, etf.Atom("exchange"), x),
            rks,
            content,
            msg_id,
            etf.Atom("true"),
        )
        return etf.term_to_binary(term, utf8_atoms=model.utf8_atoms)
    anns = {etf.Atom("id"): msg_id, etf.Atom("x"): x, etf.Atom("rk"): rks}
    # the annotations a publish derives from the properties (mc_amqpl essential_properties);
    # on delivery the broker rebuilds priority, expiration and timestamp from these, not from
    # the stored property bytes
    if props.get("priority") is not None:
        anns[etf.Atom("p")] = props["priority"]
    if props.get("timestamp") is not None:
        anns[etf.Atom("ts")] = props["timestamp"] * 1000
    ttl = props.get("expiration")
    if ttl and ttl.isdigit():
        anns[etf.Atom("ttl")] = int(ttl)
    return etf.term_to_binary((etf.Atom("mc"), etf.Atom("mc_amqpl"), content, anns), utf8_atoms=model.utf8_atoms)


@dataclass(frozen=True)
class TermShape:
    """A stored term's shape, read from its first bytes: record (``basic_message``, ``mc``),
    ``#mc{}`` protocol (``mc_amqpl``, ``mc_amqp``, ``mc_mqtt``) and the first atom of the
    protocol's state (``content``; ``v1`` or ``msg`` for mc_amqp; ``mqtt_msg``), and whether
    its atoms are UTF-8 (SMALL_ATOM_UTF8_EXT, OTP 26+) or Latin-1 (ATOM_EXT). None: not seen."""

    record: str | None = None
    protocol: str | None = None
    state: str | None = None
    utf8: bool | None = None

    @property
    def label(self) -> str:
        parts = [p for p in (self.record, self.protocol, self.state) if p]
        return "/".join(parts) or "unknown"


#: bytes of a stored term ``term_shape`` needs
SHAPE_HEAD = 64


def _atom_at(raw: bytes, p: int) -> tuple[str, bool, int] | None:
    if p >= len(raw):
        return None
    tag = raw[p]
    if tag in (100, 118) and p + 3 <= len(raw):  # ATOM_EXT, ATOM_UTF8_EXT: 2-byte length
        n = int.from_bytes(raw[p + 1 : p + 3], "big")
        name, end, utf8 = raw[p + 3 : p + 3 + n], p + 3 + n, tag == 118
    elif tag in (115, 119) and p + 2 <= len(raw):  # SMALL_ATOM_EXT, SMALL_ATOM_UTF8_EXT
        n = raw[p + 1]
        name, end, utf8 = raw[p + 2 : p + 2 + n], p + 2 + n, tag == 119
    else:
        return None
    if end > len(raw):
        return None
    return name.decode("utf-8", "replace"), utf8, end


def _tuple_at(raw: bytes, p: int) -> int | None:
    """Where the first element of a tuple at ``p`` starts."""
    if p < len(raw) and raw[p] == 104:
        return p + 2
    if p < len(raw) and raw[p] == 105:
        return p + 5
    return None


def term_shape(head) -> TermShape:
    """The shape of a stored term from its first ``SHAPE_HEAD`` bytes."""
    raw = bytes(head[:SHAPE_HEAD])
    if len(raw) < 3 or raw[0] != 131:
        return TermShape()
    p = _tuple_at(raw, 1)
    first = _atom_at(raw, p) if p is not None else None
    if first is None:
        return TermShape()
    record, utf8, p = first
    if record != "mc":
        return TermShape(record, None, None, utf8)
    proto = _atom_at(raw, p)
    if proto is None:
        return TermShape(record, None, None, utf8)
    q = _tuple_at(raw, proto[2])
    state = _atom_at(raw, q) if q is not None else None
    return TermShape(record, proto[0], state[0] if state else None, utf8)


KEEP, REENCODE, UNREPRESENTABLE = "keep", "reencode", "unrepresentable"

#: lost+found reason of a message the target version cannot store (``term_plan``)
NOT_REPRESENTABLE = "target_cannot_represent"


def term_plan(model: BrokerModel, shape: TermShape) -> tuple[str, str]:
    """What a writer does with a stored term of ``shape`` for target ``model``: ``KEEP`` it byte
    for byte (the target writes that shape and atom encoding itself), ``REENCODE`` it
    (``retarget_term``: an AMQP 0-9-1 message in another version's shape or atom encoding), or
    ``UNREPRESENTABLE`` (the target has no stored form for it), with why.

    ==============  ==========================  =============================  ====================
    target          #basic_message              #mc{mc_amqpl}                  #mc{mc_amqp}, mc_mqtt
    ==============  ==========================  =============================  ====================
    3.10 - 3.12     kept with Latin-1 atoms,    re-encoded as #basic_message   not representable
                    else re-encoded
    3.13            re-encoded as #mc{mc_amqpl} kept (UTF-8 atoms)             mc_amqp ``msg`` and
                                                                               mc_mqtt kept
    4.0 - 4.3       re-encoded as #mc{mc_amqpl} kept (UTF-8 atoms)             mc_amqp ``v1`` and
                                                                               mc_mqtt kept
    ==============  ==========================  =============================  ====================

    An mc_amqp state of the other series (3.13's ``msg`` records on 4.x, 4.x ``v1`` on 3.13) is
    not representable: cqforensics does not convert AMQP 1.0 sections between the two forms.
    A term whose shape is not recognised is kept (rebuild has checked that it decodes)."""
    if shape.record == "basic_message" or (shape.record == "mc" and shape.protocol == "mc_amqpl"):
        target = "mc" if model.stores_mc else "basic_message"
        if shape.record != target:
            return REENCODE, f"{shape.label} stored as {'#mc{mc_amqpl}' if model.stores_mc else '#basic_message'}"
        if shape.utf8 is not None and shape.utf8 != model.utf8_atoms:
            return REENCODE, f"atoms re-encoded as {'UTF-8' if model.utf8_atoms else 'Latin-1'}"
        return KEEP, ""
    if shape.record != "mc":
        return KEEP, ""
    fmt = {"mc_amqp": "AMQP 1.0", "mc_mqtt": "MQTT"}.get(shape.protocol or "", shape.protocol or "unknown")
    if not model.stores_mc:
        return UNREPRESENTABLE, (
            f"an {fmt} message (#mc{{{shape.protocol}}}): RabbitMQ {model} stores AMQP 0-9-1 "
            "messages only (#basic_message; message containers arrived in 3.13)"
        )
    if shape.protocol == "mc_amqp" and shape.state in ("v1", "msg") and shape.state != model.amqp10_state:
        return UNREPRESENTABLE, (
            f"an AMQP 1.0 message stored in the {'4.x' if shape.state == 'v1' else '3.13'} "
            f"form ({shape.state}): RabbitMQ {model} stores AMQP 1.0 messages as "
            f"{model.amqp10_state}"
        )
    return KEEP, ""


def retarget_term(model: BrokerModel, raw, vhost: bytes, msg_id: bytes | None = None) -> bytes:
    """An AMQP 0-9-1 message's stored term (``#basic_message`` or ``#mc{mc_amqpl}``, any atom
    encoding) re-encoded in the shape ``model`` writes (``stored_term``), losslessly for an AMQP
    0-9-1 consumer: message id, exchange, routing keys, body, and the properties as that
    consumer receives them (the stored property bytes when they say it all; else encoded from
    the delivered view, which folds ``#mc`` annotations such as dead-letter history, priority,
    TTL and timestamp back into properties and headers)."""
    term, _ = etf.decode(bytes(raw))
    m = message.normalise(term)
    if m["term_format"] not in ("basic_message", "mc_amqpl"):
        raise ValueError(f"not an AMQP 0-9-1 message: {m['term_format']}")
    content = term[3] if m["term_format"] == "basic_message" else term[2]
    props, headers = m["properties"], m["headers"]
    encoded = content[3] if isinstance(content[3], bytes) else None
    if encoded is not None and message.props_from_bin(encoded) == (props, headers):
        props_bin = encoded
    else:
        props_bin = amqp091.encode_properties(props, json.loads(headers) if headers else None)
    if m["term_format"] == "basic_message":  # exchange and routing keys as stored, not as text
        xres, rks = term[1], term[2]
        if isinstance(xres, tuple) and len(xres) == 4 and isinstance(xres[1], bytes):
            vhost = xres[1]
        exchange = xres[3] if isinstance(xres, tuple) and len(xres) == 4 else None
    else:
        exchange, rks = term[3].get("x"), term[3].get("rk", [])
    exchange = exchange if isinstance(exchange, bytes) else None
    rks = [k for k in rks if isinstance(k, bytes)] if isinstance(rks, list) else []
    mid = m["msg_id"] if m["msg_id"] is not None else msg_id
    return stored_term(model, mid, vhost, exchange, rks, props, props_bin, m["body"])


def retarget_or_damage(model: BrokerModel, raw, vhost: bytes, msg_id: bytes | None = None) -> bytes:
    """``retarget_term``, with a message whose values its target's encoding cannot hold (a
    decoded ``'P_basic'`` priority of 2^40, a value of another kind) as a FormatError: it is
    damage to quarantine, never a crash of the writer."""
    try:
        return retarget_term(model, raw, vhost, msg_id)
    except FormatError:
        raise
    except (ValueError, TypeError, OverflowError, struct.error) as e:
        raise FormatError(
            f"cannot be written as RabbitMQ {model} stores messages: {type(e).__name__}: {str(e)[:120]}"
        ) from None
