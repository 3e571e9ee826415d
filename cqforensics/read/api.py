"""The embedded API: read any table of one or many node dirs as Arrow, no JVM.

import cqforensics
t = cqforensics.read_table("/var/lib/rabbitmq/mnesia/rabbit@host", table="messages")
for batch in cqforensics.iter_batches(path, table="store", columns=["file", "offset", "msg_id"]):
    ...
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pyarrow as pa

from cqforensics.base import heap
from cqforensics.base.errors import UsageError
from cqforensics.base.schema import TABLES
from cqforensics.model.options import make_options, needs
from cqforensics.read import driver

_OPTIONS = frozenset(inspect.signature(make_options).parameters)


def iter_batches(
    path,
    table: str = "messages",
    *,
    columns: list[str] | None = None,
    vhosts=None,
    queues=None,
    progress=None,
    render=None,
    **options,
) -> Iterator[pa.RecordBatch]:
    """Stream one table of every node dir under ``path`` (a path or a list of paths).

    ``columns`` projects (leaving out ``body`` skips reading bodies); ``vhosts`` restricts the
    vhosts read, ``queues`` the queues of the queue-level tables (messages, index, acks,
    queues, files, holes of .qs files); each is one name (a str) or a list of names, and a name
    that matches nothing is a ``UsageError`` naming the close names that exist. ``progress``: a
    ``driver.Progress`` told of every vhost read. Other keywords: see ``make_options``.

    Raises only ``cqforensics.base.errors`` types: ``UsageError`` (bad arguments), ``OperationalError``
    (missing or unreadable input, naming the path); damage in the files is reported in the rows
    (the ``findings`` table), not raised. Queues of a kind of storage cqforensics does not read
    (quorum queues, streams) are named in a warning (logger ``cqforensics.read.driver``) and in the
    ``findings`` table (``storage-not-read``).

    ``jobs=N`` reads with N processes (the same rows, in the same order; batches may be cut
    elsewhere); ``render``: a function each batch is passed to where it is made (in a worker,
    with ``jobs``), whose results are yielded instead of the batches (e.g. text to write)."""
    driver.check_columns(table, columns)
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise UsageError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(_OPTIONS))}")
    opts = make_options(**{**needs(table, columns), **options})
    yield from driver.read(
        table, opts, paths=path, columns=columns, vhosts=vhosts, queues=queues, progress=progress, render=render
    )


def read_table(path, table: str = "messages", **kwargs) -> pa.Table:
    """One table of every node dir under ``path``, as a pyarrow Table (see ``iter_batches``)."""
    with heap.command():
        batches = list(iter_batches(path, table, **kwargs))
    return pa.Table.from_batches(batches, schema=driver.check_columns(table, kwargs.get("columns")))


def to_pandas(path, table: str = "messages", **kwargs):
    """``read_table(...).to_pandas()``."""
    return read_table(path, table, **kwargs).to_pandas()


__all__ = ["TABLES", "iter_batches", "read_table", "to_pandas", "make_options"]
