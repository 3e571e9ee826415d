"""cqforensics: read, check and rebuild RabbitMQ classic-queue storage (3.10 - 4.3).

Public API::

    cqforensics.read_table(path, table="messages", **options) -> pyarrow.Table
    cqforensics.iter_batches(path, table="messages", **options) -> Iterator[pyarrow.RecordBatch]
    cqforensics.to_pandas(path, table="messages", **options) -> pandas.DataFrame
    cqforensics.TABLES, cqforensics.schema(table)
"""

from cqforensics.base.errors import CQError, FormatError, OperationalError, UsageError
from cqforensics.base.schema import SCHEMAS, TABLES, schema
from cqforensics.read.api import iter_batches, make_options, read_table, to_pandas

__version__ = "0.1.0"
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
