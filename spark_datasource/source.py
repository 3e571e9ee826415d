"""``spark.read.format("rabbitcq")``: the Python data source (thin over cqforensics).

Planning (driver): options are parsed and validated, node dirs discovered, work units planned
and bin-packed (``plan.py``). Tasks: each partition reads its units with the embedded engine
and yields Arrow batches whose schema is exactly what Spark expects for the read schema.

The DataSource, reader and partitions are pickled into every task, so they carry plain values
only (the unit lists travel in the partitions, never on the reader).

No filter pushdown (no ``pushFilters``), on purpose. In Spark 4.1 .. 4.3 the read function and
partitions planned by the pushdown pass are cached on the DataFrame's relation and reused by every
later plan of that DataFrame that pushes nothing (``PythonDataSourceV2.setReadInfo`` /
``getOrCreateReadInfo``), and by a sibling scan of the same DataFrame (a self-union or self-join).
A reader that accepted ``queue = 'work'`` would then answer a later ``df.count()`` with the
filtered rows: no reader-side state can prevent it, the reuse happens in the JVM. Without
``pushFilters`` every plan reads the same units and Spark applies every filter itself, so the rows
are right whatever ``spark.sql.python.filterPushdown.enabled`` says (with it on, Spark calls the
inherited ``pushFilters``, which pushes nothing). Pruning at planning is what the ``vhosts`` and
``queues`` options are for: they belong to the DataFrame, so no other plan can leak them.
"""

from __future__ import annotations

import gc
import json
import os
import time

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

# imported with the module (once per Python worker, when the first task unpickles the reader),
# not per task or per batch
from cqforensics import compiled as core
from cqforensics.model.options import narrowed
from cqforensics.read import driver
from cqforensics.tables.builders import BUILDERS
from spark_datasource import options as opt
from spark_datasource.plan import Unit, check_columns, pack, plan_units
from spark_datasource.schema import arrow_schema, struct_type


class UnitsPartition(InputPartition):
    """The units one task reads (plain dataclasses of strings and ints)."""

    def __init__(self, units: list):
        super().__init__(len(units))
        self.units = units

    def __repr__(self) -> str:
        return f"UnitsPartition({len(self.units)} units)"


class RabbitCQDataSource(DataSource):
    """RabbitMQ classic-queue storage as tables. Options (strings; see docs/spark.md):
    table, maxPartitionBytes, minPartitions, brokerVersion, asOf, vhosts, queues, batchRows,
    batchBytes; paths via load(path) or load([p1, p2]), globs allowed."""

    @classmethod
    def name(cls) -> str:
        return "rabbitcq"

    def schema(self) -> StructType:
        return struct_type(opt.parse(self.options).table)

    def reader(self, schema: StructType) -> RabbitCQReader:
        # a fresh reader per plan, holding the options and the read schema only
        return RabbitCQReader(opt.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool):
        from spark_datasource.writer import RabbitCQWriter

        return RabbitCQWriter(self.options, schema, overwrite)


class RabbitCQReader(DataSourceReader):
    def __init__(self, settings: opt.Settings, schema: StructType):
        self.settings = settings
        self.schema = schema
        self.columns = [f.name for f in schema.fields]
        check_columns(settings.table, self.columns)

    def partitions(self) -> list[InputPartition]:
        s = self.settings
        units = plan_units(s.paths, s.table, s.vhosts, s.queues)
        return [UnitsPartition(p) for p in pack(units, s.max_partition_bytes, s.min_partitions)]

    def read(self, partition):
        units = getattr(partition, "units", None) or []  # read(None) on 4.0 for an empty plan
        expected = arrow_schema(self.schema)
        batches = (
            pa.RecordBatch.from_arrays(b.columns, schema=expected)
            for b in read_units(units, self.settings, self.columns)
        )
        stats_dir = os.environ.get(TASK_STATS)
        yield from batches if not stats_dir else _timed(batches, stats_dir, len(units))


def read_units(units: list[Unit], s: opt.Settings, columns: list[str]):
    """Batches of the given units through the one read driver (``cqforensics.read.driver.read``):
    consecutive units of one vhost are read by one scan, so its store is indexed once; a unit of
    one id share of a big vhost is read by a scan of that share only."""
    options, scope = narrowed(s.options, s.table, columns), _task_scope()
    if all(u.share is None for u in units):
        yield from driver.read(
            s.table,
            options,
            units=units,
            columns=columns,
            vhosts=s.vhosts,
            queues=s.queues,
            cache=_VHOST_FACTS,
            cache_scope=scope,
        )
        return
    for share, run in _share_runs(units):
        build = None if share is None else _share_builder(s.table, *share)
        yield from driver.read(
            s.table,
            options,
            units=run,
            columns=columns,
            vhosts=s.vhosts,
            queues=s.queues,
            cache=_VHOST_FACTS,
            cache_scope=scope,
            build=build,
        )


def _share_runs(units: list[Unit]):
    """Consecutive units of one share ((k, parts), or None for units of every id)."""
    run, key = [], None
    for u in units:
        k = (u.share, u.shares) if u.share is not None else None
        if run and (k != key or k is not None):  # a share unit is a whole vhost: one per run
            yield key, run
            run = []
        run.append(u)
        key = k
    if run:
        yield key, run


def _share_builder(table: str, k: int, parts: int):
    """A vhost's batches of ``table`` read as share ``k`` of ``parts`` only."""

    def build(vs):
        sub = vs.share_scan(k, parts)
        try:
            yield from BUILDERS[table](sub)
        finally:
            sub.close()

    return build


# A Python worker runs many tasks of a stage one after another. The vhost-wide facts (the shared
# store's index, the pass over every queue index) of the last vhost read are kept for the next
# task of the same stage reading the same vhost: a big vhost split over many partitions is
# indexed once per worker, not once per partition. One vhost at most; a new read is a new stage,
# so no read uses another's facts (the last ones stay in the idle worker until its next task).
_VHOST_FACTS: dict = {}


def _task_scope():
    """The stage of the running task (None outside a task: nothing is cached)."""
    tc = TaskContext.get()
    return None if tc is None else tc.stageId()


#: a directory in the executors' environment: every task writes there a JSON record of its read
#: (the core's status and row counts, where the time went); for benchmarks and for checking a
#: cluster's workers run the compiled core
TASK_STATS = "CQF_SPARK_TASK_STATS"


def _timed(batches, stats_dir: str, units: int):
    """``batches``, timing the reader (making each batch) apart from Spark (what the worker does
    with a batch before asking for the next: Arrow IPC to the JVM, which blocks while the JVM is
    busy)."""
    counts, gc_runs = dict(core.COUNTS), {"n": 0, "full": 0, "s": 0.0}
    gc_start = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_runs["n"], gc_runs["full"] = gc_runs["n"] + 1, gc_runs["full"] + (info["generation"] == 2)
            gc_runs["s"] += time.perf_counter() - gc_start[0]

    gc.callbacks.append(on_gc)
    reader = spark = 0.0
    rows = nbytes = n = 0
    start = time.perf_counter()
    try:
        while True:
            t0 = time.perf_counter()
            b = next(batches, None)
            t1 = time.perf_counter()
            reader += t1 - t0
            if b is None:
                break
            rows, nbytes, n = rows + b.num_rows, nbytes + b.nbytes, n + 1
            yield b
            spark += time.perf_counter() - t1
    finally:
        gc.callbacks.remove(on_gc)
        tc = TaskContext.get()
        record = {
            "pid": os.getpid(),
            "stage": tc.stageId() if tc else None,
            "partition": tc.partitionId() if tc else None,
            "units": units,
            "batches": n,
            "rows": rows,
            "arrow_bytes": nbytes,
            "task_s": time.perf_counter() - start,
            "reader_s": reader,
            "spark_s": spark,
            "core": core.status(),
            "core_rows": core.COUNTS["core"] - counts.get("core", 0),
            "reference_rows": core.COUNTS["reference"] - counts.get("reference", 0),
            "gc_collections": gc_runs["n"],
            "gc_full": gc_runs["full"],
            "gc_s": gc_runs["s"],
        }
        name = f"{record['pid']}-{record['stage']}-{record['partition']}-{time.time_ns()}.json"
        os.makedirs(stats_dir, exist_ok=True)
        with open(os.path.join(stats_dir, name), "w") as f:
            json.dump(record, f)


__all__ = ["RabbitCQDataSource", "RabbitCQReader", "UnitsPartition"]
