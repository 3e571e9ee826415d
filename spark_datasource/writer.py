"""``df.write.format("rabbitcq").mode("append" | "overwrite").save(DST)``: the Spark writer.

Planning (driver): the options, the DataFrame's required columns and DST are checked, so a bad
write fails before any task runs. DST follows the rule of every output of cqforensics
(``cqforensics.output.guard``, docs/evidence.md): it is new, an empty dir, or a previous output of
cqforensics, which both modes replace whole at commit; anything else (a node dir, a mnesia base,
any data cqforensics did not write) is refused whatever the mode. Spark's default mode
(``errorifexists``) cannot reach a Python data source: Spark refuses it before any Python runs
(``DataFrameWriter.saveCommand``: a table provider with batch writes takes only Append or
Overwrite), so ``mode("append")`` into a new DST is the safe form, and the one documented.

Tasks: each encodes its rows into the target version's stored terms, staged under
``.<DST>.cqf-spark-<job>/`` beside DST (``cqforensics.write.rows``). Commit (driver): the staged
parts, in partition order, become the store, built beside DST, verified, and swapped in
atomically; abort removes the staging dir. Row order is kept within a partition and partitions
are taken in order, so a read, filter and write keeps each queue's order (sort with ``orderBy``
first if the plan shuffles).

The writer's own errors (options, columns, DST, a store that fails verification) reach the user
as one line (``WriterError``), not as the Python traceback Spark puts in its message.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from cqforensics.base.errors import CQError, UsageError

#: the variable PySpark's worker reads when it formats a Python error for the JVM: set, only the
#: exception's own line is sent (``pyspark.util.handle_worker_exception``; the JVM sets it in the
#: worker's environment for ``spark.sql.execution.pyspark.udf.hideTraceback.enabled``)
_HIDE = "SPARK_HIDE_TRACEBACK"


class WriterError(Exception):
    """One of the writer's own errors, raised from a Spark entry point (planning, task, commit)
    so that Spark shows its one line. Spark formats the error in its Python worker
    (``handle_worker_exception``): with ``SPARK_HIDE_TRACEBACK`` set it sends only
    ``format_exception_only``, without the traceback that would otherwise fill 20 to 30 lines
    of the message. The variable is set when the error is made and put back as it was when the
    error is formatted (``__str__``, which that formatting calls), so a later error in the same
    (reused) worker, a bug of ours included, keeps its traceback."""

    def __init__(self, message: str):
        super().__init__(message)
        self._saved = os.environ.get(_HIDE)
        self._restored = False
        os.environ[_HIDE] = "1"

    def __str__(self) -> str:
        if not self._restored:
            self._restored = True
            if self._saved is None:
                os.environ.pop(_HIDE, None)
            else:
                os.environ[_HIDE] = self._saved
        return super().__str__()


@contextlib.contextmanager
def one_line():
    """A cqforensics error (one line by design: bad usage, a refused output, an operational
    failure) raised in the block leaves it as a ``WriterError``; anything else (a bug) keeps
    its traceback."""
    try:
        yield
    except CQError as e:
        msg = str(e)
        raise WriterError(msg if msg.startswith("rabbitcq writer") else f"rabbitcq writer: {msg}") from None


#: option name (lower case) -> (default, meaning); documented in docs/spark.md (tests/house/test_docs.py)
WRITE_OPTIONS = {
    "brokerversion": (
        "",
        "required: the RabbitMQ version that will boot the store (3.10 .. 4.3); decides the stored term shape",
    ),
    "template": (
        "",
        "for a new DST: a node dir whose metadata (and everything but its message stores) is copied into DST",
    ),
    "queueversion": ("", "3.10 - 3.13: CQ index version (1 or 2) for queues whose metadata does not say; default 1"),
    "filesizelimit": (str(16 << 20), "roll shared-store files at this many bytes (msg_store_file_size_limit)"),
}


@dataclass(frozen=True)
class WriteSettings:
    dst: str
    broker_version: str
    template: str | None
    queue_version: int | None
    file_size_limit: int
    model: object = None  # the BrokerModel of broker_version, parsed once here (pickled into the tasks)


def parse_write_options(opts: dict) -> WriteSettings:
    from cqforensics.model import versions

    opts = {k.lower(): v for k, v in opts.items()}
    unknown = sorted(set(opts) - set(WRITE_OPTIONS) - {"path"})
    if unknown:
        raise UsageError(
            f"rabbitcq writer: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(WRITE_OPTIONS))}"
        )
    if not opts.get("path"):
        raise UsageError("rabbitcq writer: no destination: use .save(path)")
    version = opts.get("brokerversion") or ""
    if not version:
        raise UsageError(
            "rabbitcq writer: option brokerVersion is required (the RabbitMQ version that will boot "
            "the store, e.g. 3.10 or 4.3): it decides how messages are stored"
        )
    model = versions.model(version)
    qv = opts.get("queueversion") or None
    if qv is not None and qv not in ("1", "2"):
        raise UsageError(f"rabbitcq writer: option queueVersion must be 1 or 2, not {qv!r}")
    limit = opts.get("filesizelimit") or WRITE_OPTIONS["filesizelimit"][0]
    if not limit.isdigit() or int(limit) < 1024:
        raise UsageError(f"rabbitcq writer: option fileSizeLimit must be a number of bytes >= 1024, not {limit!r}")
    template = opts.get("template") or None
    if template is not None and not Path(template).is_dir():
        raise UsageError(f"rabbitcq writer: template {template}: not a directory")
    return WriteSettings(
        os.path.abspath(opts["path"]),
        version,
        os.path.abspath(template) if template else None,
        int(qv) if qv else None,
        int(limit),
        model,
    )


def check_struct(schema: StructType) -> None:
    """The required columns (vhost, queue, body), by name and type, at planning time."""
    import pyarrow as pa
    from pyspark.sql.types import BinaryType, StringType

    from cqforensics.write.rows import REQUIRED, check_schema

    types = {StringType: pa.string(), BinaryType: pa.binary()}
    fields = [pa.field(f.name, types.get(type(f.dataType), pa.null())) for f in schema.fields if f.name in REQUIRED]
    check_schema(pa.schema(fields))


@dataclass
class StagedPart(WriterCommitMessage):
    partition: int
    index: str
    terms: str
    rows: int
    bytes: int


class RabbitCQWriter(DataSourceArrowWriter):
    def __init__(self, options: dict, schema: StructType, overwrite: bool):
        from cqforensics.write.rows import check_destination

        with one_line():
            self.settings = parse_write_options(dict(options))
            check_struct(schema)
            self.mode = "overwrite" if overwrite else "append"
            self.job = uuid.uuid4().hex
            s = self.settings
            # before any task writes its part beside DST (commit checks DST again, to the byte)
            check_destination(Path(s.dst), Path(s.template) if s.template else None, s.model)

    @property
    def staging(self) -> Path:
        dst = Path(self.settings.dst)
        return dst.parent / f".{dst.name}.cqf-spark-{self.job}"

    def write(self, iterator) -> StagedPart:
        from pyspark import TaskContext

        from cqforensics.write.rows import encode_part

        ctx = TaskContext.get()
        pid = ctx.partitionId() if ctx else 0
        attempt = ctx.attemptNumber() if ctx else 0
        with one_line():
            self.staging.mkdir(exist_ok=True)
            part = encode_part(iterator, self.settings.model, self.staging, f"part-{pid:05d}-{attempt}", pid)
        return StagedPart(part.partition, part.index, part.terms, part.rows, part.bytes)

    def commit(self, messages) -> None:
        from cqforensics.write.rows import PartInfo, build

        parts = [
            PartInfo(m.partition, m.index, m.terms, m.rows, m.bytes)
            for m in sorted((m for m in messages if m is not None), key=lambda m: m.partition)
        ]
        try:
            s = self.settings
            with one_line():
                build(
                    parts,
                    Path(s.dst),
                    s.model,
                    self.mode,
                    Path(s.template) if s.template else None,
                    s.queue_version,
                    s.file_size_limit,
                )
        finally:
            shutil.rmtree(self.staging, ignore_errors=True)

    def abort(self, messages) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
