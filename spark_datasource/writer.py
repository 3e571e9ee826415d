"""``df.write.format("rabbitcq").mode("overwrite" | "append").save(DST)``: the Spark writer.

Planning (driver): the options and the DataFrame's required columns are checked, so a bad
write fails before any task runs. Tasks: each encodes its rows into the target version's
stored terms, staged under ``.<DST>.cqf-spark-<job>/`` beside DST (``cqforensics.write.rows``).
Commit (driver): the staged parts, in partition order, become the store, built beside DST,
verified, and swapped in atomically; abort removes the staging dir. Row order is kept within a
partition and partitions are taken in order, so a read, filter and write keeps each queue's
order (sort with ``orderBy`` first if the plan shuffles).
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from cqforensics.errors import UsageError

#: option name (lower case) -> (default, meaning); documented in README (tests/test_docs.py)
WRITE_OPTIONS = {
    "brokerversion": ("", "required: the RabbitMQ version that will boot the store (3.10 .. 4.3); "
                          "decides the stored term shape"),
    "template": ("", "for a new DST: a node dir whose metadata (and everything but its message stores) "
                     "is copied into DST"),
    "queueversion": ("", "3.10 - 3.13: CQ index version (1 or 2) for queues whose metadata does not say; "
                         "default 1"),
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
        raise UsageError(f"rabbitcq writer: unknown option(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(WRITE_OPTIONS))}")
    if not opts.get("path"):
        raise UsageError("rabbitcq writer: no destination: use .save(path)")
    version = opts.get("brokerversion") or ""
    if not version:
        raise UsageError("rabbitcq writer: option brokerVersion is required (the RabbitMQ version that will boot "
                         "the store, e.g. 3.10 or 4.3): it decides how messages are stored")
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
    return WriteSettings(os.path.abspath(opts["path"]), version, os.path.abspath(template) if template else None,
                         int(qv) if qv else None, int(limit), model)


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
        self.settings = parse_write_options(dict(options))
        check_struct(schema)
        self.mode = "overwrite" if overwrite else "append"
        self.job = uuid.uuid4().hex
        dst = Path(self.settings.dst)
        if not dst.parent.is_dir():
            raise UsageError(f"rabbitcq writer: {dst.parent}: the destination's parent dir does not exist")
        if dst.exists() and not dst.is_dir():
            raise UsageError(f"rabbitcq writer: {dst}: exists and is not a directory")

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
        self.staging.mkdir(exist_ok=True)
        part = encode_part(iterator, self.settings.model, self.staging,
                           f"part-{pid:05d}-{attempt}", pid)
        return StagedPart(part.partition, part.index, part.terms, part.rows, part.bytes)

    def commit(self, messages) -> None:
        from cqforensics.write.rows import PartInfo, build

        parts = [PartInfo(m.partition, m.index, m.terms, m.rows, m.bytes)
                 for m in sorted((m for m in messages if m is not None), key=lambda m: m.partition)]
        try:
            s = self.settings
            build(parts, Path(s.dst), s.model, self.mode,
                  Path(s.template) if s.template else None, s.queue_version, s.file_size_limit)
        finally:
            shutil.rmtree(self.staging, ignore_errors=True)

    def abort(self, messages) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
