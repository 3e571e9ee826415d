"""The embedded API: read any table of one or many node dirs as Arrow, no JVM.

    import cqforensics
    t = cqforensics.read_table("/var/lib/rabbitmq/mnesia/rabbit@host", table="messages")
    for batch in cqforensics.iter_batches(path, table="store", columns=["file", "offset", "msg_id"]):
        ...
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pyarrow as pa

from cqforensics import layout
from cqforensics.errors import UsageError
from cqforensics.scan import NodeScan, Options
from cqforensics.schema import TABLES, schema
from cqforensics.tables import BUILDERS


def make_options(broker_version: str | None = None, as_of=None, bodies: bool = True, decode: bool = True,
                 batch_rows: int = 8192, batch_bytes: int = 16 << 20, assume_dirty: bool = False) -> Options:
    """Options from keyword arguments. ``as_of`` (datetime or epoch ms) is the time TTLs are
    judged at for ``survives_restart`` (default: now); ``assume_dirty`` predicts the boot as if
    the clean-shutdown files were removed (the broker then rebuilds and verifies)."""
    if isinstance(as_of, dt.datetime):
        if as_of.tzinfo is None:
            raise UsageError("as_of must be timezone-aware (e.g. datetime.now(timezone.utc))")
        as_of = int(as_of.timestamp() * 1000)
    elif as_of is not None and not isinstance(as_of, int):
        raise UsageError(f"as_of must be a datetime or epoch milliseconds, not {type(as_of).__name__}")
    if broker_version is not None:
        from cqforensics import versions

        versions.model(broker_version)  # validate early
    if batch_rows < 1 or batch_bytes < 1:
        raise UsageError("batch_rows and batch_bytes must be positive")
    return Options(broker_version, as_of, bodies, decode, batch_rows, batch_bytes, assume_dirty)


def _project(batch: pa.RecordBatch, columns: list[str] | None) -> pa.RecordBatch:
    return batch if columns is None else batch.select(columns)


def iter_batches(path, table: str = "messages", *, columns: list[str] | None = None, vhosts=None, queues=None,
                 **options) -> Iterator[pa.RecordBatch]:
    """Stream one table of every node dir under ``path`` (a path or a list of paths).

    ``columns`` projects (leaving out ``body`` skips reading bodies); ``vhosts`` restricts the
    vhosts read, ``queues`` the queues of the queue-level tables (messages, index, acks,
    queues, files, holes of .qs files). Other keywords: see ``make_options``."""
    sch = schema(table)
    if columns is not None:
        unknown = [c for c in columns if c not in sch.names]
        if unknown:
            raise UsageError(f"table {table!r} has no column(s) {', '.join(unknown)}")
        if "body" not in columns:
            options.setdefault("bodies", False)
        if table == "messages" and not set(columns) & {"exchange", "routing_keys", "properties", "headers",
                                                          "annotations", "body", "body_size", "term_format",
                                                          "decode_error", "msg_id"}:
            options.setdefault("decode", False)
    opts = make_options(**options)
    build = BUILDERS[table]
    for node in layout.discover(path):
        ns = NodeScan(node, opts)
        for vs in ns.vhosts:
            if vhosts is not None and vs.vhost.name not in vhosts:
                continue
            if queues is not None:
                vs.only = {q.dir_name: None for q in vs.all_queue_dirs if q.name in queues}
            try:
                for b in build(vs):
                    yield _project(b, columns)
            finally:
                vs.close()


def read_table(path, table: str = "messages", **kwargs) -> pa.Table:
    """One table of every node dir under ``path``, as a pyarrow Table (see ``iter_batches``)."""
    batches = list(iter_batches(path, table, **kwargs))
    sch = schema(table) if kwargs.get("columns") is None else pa.schema([schema(table).field(c)
                                                                          for c in kwargs["columns"]])
    return pa.Table.from_batches(batches, schema=sch)


def to_pandas(path, table: str = "messages", **kwargs):
    """``read_table(...).to_pandas()``."""
    return read_table(path, table, **kwargs).to_pandas()


__all__ = ["TABLES", "iter_batches", "read_table", "to_pandas", "make_options"]
