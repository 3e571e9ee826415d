"""The embedded API: read any table of one or many node dirs as Arrow, no JVM.

    import cqforensics
    t = cqforensics.read_table("/var/lib/rabbitmq/mnesia/rabbit@host", table="messages")
    for batch in cqforensics.iter_batches(path, table="store", columns=["file", "offset", "msg_id"]):
        ...
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from cqforensics import layout
from cqforensics.errors import UsageError
from cqforensics.model.options import make_options, needs
from cqforensics.model.vhost import NodeScan
from cqforensics.schema import TABLES, schema
from cqforensics.tables import BUILDERS


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
        for k, v in needs(table, columns).items():
            options.setdefault(k, v)
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
