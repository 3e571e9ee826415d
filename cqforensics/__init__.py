"""cqforensics: read, check and rebuild RabbitMQ classic-queue storage (3.10 - 4.3).

Public API::

    cqforensics.read_table(path, table="messages", **options) -> pyarrow.Table
    cqforensics.iter_batches(path, table="messages", **options) -> Iterator[pyarrow.RecordBatch]
    cqforensics.to_pandas(path, table="messages", **options) -> pandas.DataFrame
    cqforensics.TABLES, cqforensics.schema(table)
"""

from cqforensics.base.errors import CQError, FormatError, OperationalError, UsageError

__version__ = "0.1.0"

#: the public names imported when first asked for (PEP 562): every command line run and every
#: submodule import loads this package first, and most of them need neither the read driver
#: (every table builder) nor the Arrow schemas
_LAZY = {
    "read_table": "cqforensics.read.api",
    "iter_batches": "cqforensics.read.api",
    "to_pandas": "cqforensics.read.api",
    "make_options": "cqforensics.read.api",
    "SCHEMAS": "cqforensics.base.schema",
    "TABLES": "cqforensics.base.schema",
    "schema": "cqforensics.base.schema",
}


def __getattr__(name: str):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'cqforensics' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "read_table",
    "iter_batches",
    "to_pandas",
    "make_options",
    "schema",
    "SCHEMAS",
    "TABLES",
    "CQError",
    "FormatError",
    "OperationalError",
    "UsageError",
    "__version__",
]
