"""The tables' Arrow schemas: the single definition the embedded API and the Spark source share.

Types are limited to what Spark maps one-to-one (string, binary, int32/int64, bool, double,
timestamp[us, UTC], list<element>, struct), so ``spark_datasource`` derives its StructType
from these and Spark's ``to_arrow_schema`` gives back exactly these (a test checks it).
Every row carries ``node`` and ``vhost``; ``queue``, ``priority``, ``file`` and ``offset``
where they apply. Ids are 16-byte binaries.
"""

from __future__ import annotations

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")
STRINGS = pa.list_(pa.field("element", pa.string()))


def _f(name, typ, nullable=True):
    return pa.field(name, typ, nullable=nullable)


WHERE = [_f("node", pa.string(), False), _f("vhost", pa.string())]
QUEUE = [_f("queue", pa.string()), _f("priority", pa.int32())]
AT = [_f("file", pa.string()), _f("offset", pa.int64())]

#: The 13 scalar AMQP 0-9-1 basic properties (the 14th, headers, is the ``headers`` column).
PROPERTIES = pa.struct(
    [
        _f("content_type", pa.string()),
        _f("content_encoding", pa.string()),
        _f("delivery_mode", pa.int32()),
        _f("priority", pa.int32()),
        _f("correlation_id", pa.string()),
        _f("reply_to", pa.string()),
        _f("expiration", pa.string()),
        _f("message_id", pa.string()),
        _f("timestamp", TS),
        _f("type", pa.string()),
        _f("user_id", pa.string()),
        _f("app_id", pa.string()),
        _f("cluster_id", pa.string()),
    ]
)

SCHEMAS: dict[str, pa.Schema] = {
    "messages": pa.schema(
        WHERE
        + QUEUE
        + AT
        + [
            _f("seq_id", pa.int64()),
            _f("msg_id", pa.binary()),
            _f("index_version", pa.int32()),
            _f("persistent", pa.bool_()),
            _f("delivered", pa.bool_()),
            _f("location", pa.string()),
            _f("store_file", pa.string()),
            _f("store_offset", pa.int64()),
            _f("size", pa.int64()),
            _f("expiry", TS),
            _f("exchange", pa.string()),
            _f("routing_keys", STRINGS),
            _f("properties", PROPERTIES),
            _f("headers", pa.string()),
            _f("annotations", pa.string()),
            _f("body", pa.binary()),
            _f("body_size", pa.int64()),
            _f("term_format", pa.string()),
            _f("decode_error", pa.string()),
            _f("survives_restart", pa.bool_()),
            _f("drop_reason", pa.string()),
            # appended for quorum queues and streams (one convention: classic / quorum / stream)
            _f("queue_type", pa.string()),
            _f("stream_offset", pa.int64()),
            _f("chunk_id", pa.int64()),
            _f("chunk_timestamp", TS),
            _f("epoch", pa.int64()),
            _f("amqp091_drop_reason", pa.string()),
            _f("raft_index", pa.int64()),
            _f("raft_term", pa.int64()),
            _f("delivery_count", pa.int64()),
            _f("checked_out", pa.bool_()),
        ]
    ),
    "index": pa.schema(
        WHERE
        + QUEUE
        + AT
        + [
            _f("index_version", pa.int32()),
            _f("kind", pa.string()),
            _f("seq_id", pa.int64()),
            _f("persistent", pa.bool_()),
            _f("location", pa.string()),
            _f("msg_id", pa.binary()),
            _f("store_offset", pa.int64()),
            _f("store_size", pa.int64()),
            _f("size", pa.int64()),
            _f("expiry", TS),
            _f("status", pa.int32()),
            _f("error", pa.string()),
        ]
    ),
    "acks": pa.schema(
        WHERE
        + QUEUE
        + AT
        + [
            _f("seq_id", pa.int64()),
            _f("evidence", pa.string()),
            _f("msg_id", pa.binary()),
        ]
    ),
    "store": pa.schema(
        WHERE
        + [_f("store", pa.string())]
        + AT
        + [
            _f("total_size", pa.int64()),
            _f("msg_id", pa.binary()),
            _f("marker_ok", pa.bool_()),
            _f("status", pa.string()),
            _f("refs", pa.int32()),
            _f("routes_to", STRINGS),
            _f("body", pa.binary()),
        ]
    ),
    "refcounts": pa.schema(
        WHERE
        + [_f("store", pa.string())]
        + AT
        + [
            _f("msg_id", pa.binary()),
            _f("copies", pa.int32()),
            _f("computed_refs", pa.int32()),
            _f("recorded_refs", pa.int32()),
            _f("queues", STRINGS),
            _f("status", pa.string()),
        ]
    ),
    "holes": pa.schema(
        WHERE
        + [_f("queue", pa.string()), _f("store", pa.string())]
        + AT
        + [
            _f("length", pa.int64()),
            _f("kind", pa.string()),
        ]
    ),
    "files": pa.schema(
        WHERE
        + QUEUE
        + AT[:1]
        + [
            _f("kind", pa.string()),
            _f("size", pa.int64()),
            _f("header_ok", pa.bool_()),
            _f("from_seq_id", pa.int64()),
            _f("to_seq_id", pa.int64()),
            _f("entries", pa.int64()),
            _f("live_entries", pa.int64()),
            _f("live_bytes", pa.int64()),
            _f("garbage_bytes", pa.int64()),
            _f("garbage_ratio", pa.float64()),
        ]
    ),
    "queues": pa.schema(
        WHERE
        + QUEUE
        + [
            _f("queue_dir", pa.string()),
            _f("name_source", pa.string()),
            _f("durable_known", pa.bool_()),
            _f("index_version", pa.int32()),
            _f("segments", pa.int32()),
            _f("messages", pa.int64()),
            _f("bytes", pa.int64()),
            _f("persistent", pa.int64()),
            _f("predicted_after_restart", pa.int64()),
            _f("predicted_min", pa.int64()),
            _f("predicted_max", pa.int64()),
            _f("dropped", pa.int64()),
            _f("queue_type", pa.string()),  # appended: classic / quorum / stream
        ]
    ),
    # a stream's tracking state: each tracking block on disk (consumer offsets by reference,
    # publisher sequences, timestamps), and whether it is what the next boot holds (``current``)
    "stream_tracking": pa.schema(
        WHERE
        + [_f("queue", pa.string())]
        + AT
        + [
            _f("chunk_id", pa.int64()),
            _f("source", pa.string()),
            _f("kind", pa.string()),
            _f("reference", pa.string()),
            _f("value", pa.int64()),
            _f("sequence_chunk_id", pa.int64()),
            _f("current", pa.bool_()),
        ]
    ),
    "raft_log": pa.schema(
        WHERE
        + [_f("queue", pa.string())]
        + AT
        + [
            _f("source", pa.string()),
            _f("raft_index", pa.int64()),
            _f("raft_term", pa.int64()),
            _f("entry", pa.string()),
            _f("command", pa.string()),
            _f("entry_size", pa.int64()),
            _f("body_size", pa.int64()),
            _f("checksum", pa.string()),
            _f("recovered", pa.bool_()),
            _f("timestamp", TS),
            _f("status", pa.string()),
        ]
    ),
    "findings": pa.schema(
        WHERE
        + QUEUE
        + AT
        + [
            _f("code", pa.string(), False),
            _f("severity", pa.string(), False),
            _f("message", pa.string()),
            _f("details", pa.string()),
        ]
    ),
}

TABLES = tuple(SCHEMAS)


def schema(table: str) -> pa.Schema:
    try:
        return SCHEMAS[table]
    except KeyError:
        from cqforensics.base.errors import UsageError

        raise UsageError(f"unknown table {table!r}; one of: {', '.join(TABLES)}") from None


# -- ranges: a decoded number goes into a typed column only if it fits -----------------------------

#: The range of timestamp[us] values every consumer can render (0001-01-01 .. 9999-12-31, as
#: Python's datetime, Spark and Parquet readers do): beyond it ``as_py`` raises.
TS_MIN_US = -62135596800 * 1_000_000
TS_MAX_US = 253402300800 * 1_000_000 - 1


def type_range(typ: pa.DataType) -> tuple[int, int] | None:
    """(min, max) of the numbers a column of ``typ`` holds (timestamps in µs); None if not numeric."""
    if pa.types.is_timestamp(typ):
        return TS_MIN_US, TS_MAX_US
    if pa.types.is_integer(typ):
        bits = typ.bit_width
        return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if pa.types.is_signed_integer(typ) else (0, (1 << bits) - 1)
    return None


def fits(value, typ: pa.DataType) -> bool:
    """Whether the decoded number ``value`` fits a column of ``typ`` (non-numbers: True)."""
    rng = type_range(typ)
    if rng is None or value is None or isinstance(value, bool) or not isinstance(value, int):
        return True
    return rng[0] <= value <= rng[1]


def fit_array(values, typ: pa.DataType, none=None):
    """``values`` (a numpy integer array, e.g. a uint64 field) as int64 with those that do not
    fit ``typ`` replaced by ``none`` (0 for an expiry: no value, rendered null) -> (array, bad mask).
    Never wraps: a uint64 above 2^63 is out of range, not negative."""
    import numpy as np

    lo, hi = type_range(typ)
    values = np.asarray(values)
    if values.dtype.kind == "u":
        bad = values > np.uint64(min(hi, (1 << 63) - 1))
    else:
        bad = (values < lo) | (values > hi)
    out = np.where(bad, 0, values).astype(np.int64)
    if none is not None:
        out[bad] = none
    return out, bad


_RANGES: dict = {}  # id(struct type) -> (type, ((field name, lo, hi), ...), string field names)


def fit_struct(values: dict, typ: pa.StructType) -> list[str]:
    """Nulls, in place, each value of ``values`` that does not fit its field of ``typ`` (a
    number out of range, or a value of another kind, as a damaged term may hold); returns
    ``"name=value"`` for each (for the row's decode note or a finding). Runs once per message:
    the fields' ranges are computed once per type."""
    hit = _RANGES.get(id(typ))  # by identity: hashing an Arrow type costs more than the check
    if hit is None or hit[0] is not typ:
        hit = _RANGES[id(typ)] = (
            typ,
            tuple((f.name, *type_range(f.type)) for f in typ if type_range(f.type) is not None),
            tuple(f.name for f in typ if pa.types.is_string(f.type)),
        )
    ranges, strings = hit[1], hit[2]
    bad = []
    for name, lo, hi in ranges:
        v = values.get(name)
        if v is None:
            continue
        if v.__class__ is bool or not isinstance(v, int):
            bad.append(f"{name}={str(v)[:40]!r}")
            values[name] = None
        elif not lo <= v <= hi:
            bad.append(f"{name}={v}")
            values[name] = None
    for name in strings:
        v = values.get(name)
        if v is not None and not isinstance(v, str):
            bad.append(f"{name}={str(v)[:40]!r}")
            values[name] = None
    return bad


KIND_MARKS = "of another kind (shown as null): "
RANGE_MARKS = "out of range (shown as null): "


def properties_row(msg: dict) -> dict:
    """The ``properties`` struct value of a decoded message (``message.decode_stored``): its 13
    properties with the timestamp in the column's µs (from ``timestamp_ms``: the annotation a
    3.13+ broker keeps, else the property)."""
    p = msg["properties"]
    ts = msg["timestamp_ms"]
    p["timestamp"] = ts * 1000 if isinstance(ts, int) and not isinstance(ts, bool) else (None if ts is None else ts)
    return p


def value_marks(msg: dict, properties_fitted: list[str] | None = None) -> str | None:
    """What a ``messages`` row of the decoded ``msg`` shows as null, as its ``decode_error`` says
    it and ``fsck --deep`` reports it (``value-out-of-range``): the fields of another kind than
    the broker writes (``msg["marks"]``) and the properties that do not fit their column (the
    ``fit_struct`` of its properties, done here unless the caller did it: ``properties_fitted``).
    None when the row shows every value as stored. The one rule of both."""
    kinds = msg.get("marks") or []
    if properties_fitted is None:
        properties_fitted = fit_struct(properties_row(msg), PROPERTIES)
    parts = ([KIND_MARKS + ", ".join(kinds)] if kinds else []) + (
        [RANGE_MARKS + ", ".join(properties_fitted)] if properties_fitted else []
    )
    return "; ".join(parts) if parts else None


def binary_array(values: list) -> pa.Array:
    """Bytes (or None) -> Arrow binary with one join, much faster than pa.array on big values."""
    import numpy as np

    n = len(values)
    lengths = np.fromiter((0 if v is None else len(v) for v in values), np.int64, n)
    if lengths.sum() >= 1 << 31:
        return pa.array(values, pa.binary())  # int32 offsets cannot address it in one buffer
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    valid = np.fromiter((v is not None for v in values), bool, n)
    nulls = int(n - valid.sum())
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes()) if nulls else None
    data = b"".join(v for v in values if v is not None)
    return pa.Array.from_buffers(
        pa.binary(), n, [bitmap, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)], null_count=nulls
    )
