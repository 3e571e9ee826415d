"""``spark.read.format("rabbitcq")``: the Python data source (thin over cqforensics).

Planning (driver): options are parsed and validated, node dirs discovered, work units planned
and bin-packed (``plan.py``). Tasks: each partition reads its units with the embedded engine
and yields Arrow batches whose schema is exactly what Spark expects for the read schema.

The DataSource, reader and partitions are pickled into every task, so they carry plain values
only (the unit lists travel in the partitions, never on the reader).
"""

from __future__ import annotations

import sys
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from spark_datasource import options as opt
from spark_datasource.plan import (QUEUE_LEVEL, Unit, accepted, check_columns, matches, pack, plan_units,
                                   unit_may_match)
from spark_datasource.schema import arrow_schema, struct_type


class UnitsPartition(InputPartition):
    """The units one task reads (plain dataclasses of strings and ints)."""

    def __init__(self, units: list):
        super().__init__(len(units))
        self.units = units

    def __repr__(self) -> str:
        return f"UnitsPartition({len(self.units)} units)"


class RabbitCQDataSource(DataSource):
    """RabbitMQ classic-queue storage as tables. Options (strings; see README):
    table, maxPartitionBytes, minPartitions, brokerVersion, asOf, vhosts, queues, batchRows,
    batchBytes; paths via load(path) or load([p1, p2]), globs allowed."""

    @classmethod
    def name(cls) -> str:
        return "rabbitcq"

    def schema(self) -> StructType:
        return struct_type(opt.parse(self.options).table)

    def reader(self, schema: StructType) -> "RabbitCQReader":
        settings = opt.parse(self.options)
        cls = RabbitCQPushdownReader if _pushdown_enabled() else RabbitCQReader
        return cls(settings, schema)

    def writer(self, schema: StructType, overwrite: bool):
        from spark_datasource.writer import RabbitCQWriter

        return RabbitCQWriter(self.options, schema, overwrite)


def _pushdown_enabled() -> bool:
    """Whether Spark will push filters (spark.sql.python.filterPushdown.enabled, 4.1+).

    With the conf off, Spark refuses to plan a reader whose class overrides pushFilters, and
    the reader cannot see the conf. The planner worker that calls ``reader()`` can: the
    pushdown worker only runs when the conf is on; the plain planner has read the flag into its
    ``enable_pushdown`` local before calling us (pyspark.sql.worker, 4.1 .. 4.3)."""
    try:
        frame = sys._getframe(2)
    except ValueError:
        return False
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.endswith("data_source_pushdown_filters"):
            return True
        if module.endswith("plan_data_source_read"):
            return bool(frame.f_locals.get("enable_pushdown", False))
        frame = frame.f_back
    return False


class RabbitCQReader(DataSourceReader):
    def __init__(self, settings: opt.Settings, schema: StructType):
        self.settings = settings
        self.schema = schema
        self.columns = [f.name for f in schema.fields]
        check_columns(settings.table, self.columns)
        self.filters: list = []  # (column, op, value) specs applied exactly in read()

    def partitions(self) -> list[InputPartition]:
        s = self.settings
        units = plan_units(s.paths, s.table, s.vhosts, s.queues)
        units = [u for u in units if all(unit_may_match(u, f, s.table) for f in self.filters)]
        return [UnitsPartition(p) for p in pack(units, s.max_partition_bytes, s.min_partitions)]

    def read(self, partition):
        import pyarrow as pa

        units = getattr(partition, "units", None) or []  # read(None) on 4.0 for an empty plan
        expected = arrow_schema(self.schema)
        for b in read_units(units, self.settings, self.columns):
            if self.filters:
                b = apply_filters(b, self.filters)
                if not b.num_rows:
                    continue
            yield pa.RecordBatch.from_arrays(b.columns, schema=expected)


class RabbitCQPushdownReader(RabbitCQReader):
    """The reader Spark gets when filter pushdown is on: node, vhost, queue and file filters
    skip whole units at planning and are applied exactly to the rows."""

    def pushFilters(self, filters):
        specs, rejected = accepted(list(filters), self.settings.table, self.columns)
        self.filters = specs
        yield from rejected


def read_units(units: list[Unit], s: opt.Settings, columns: list[str]):
    """Batches of the given units, grouped per vhost so a vhost's store is indexed once."""
    from cqforensics import layout
    from cqforensics.model.options import make_options, needs
    from cqforensics.model.vhost import NodeScan, VhostScan
    from cqforensics.tables import BUILDERS

    options = make_options(s.broker_version, s.as_of_ms, batch_rows=s.batch_rows, batch_bytes=s.batch_bytes,
                           **needs(s.table, columns))
    build = BUILDERS[s.table]
    i = 0
    while i < len(units):
        u = units[i]
        group = [u]
        while i + len(group) < len(units) and (units[i + len(group)].node_path, units[i + len(group)].vhost_dir) \
                == (u.node_path, u.vhost_dir):
            group.append(units[i + len(group)])
        i += len(group)
        key = _task_key(u)
        ns, facts = _VHOST_FACTS.get(key, (None, {})) if key is not None else (None, {})
        if ns is None:
            ns = NodeScan(layout.read_node_dir(layout.Path(u.node_path), u.node_label), options)
        vhost = next((v for v in ns.vhosts if v.vhost.dir_name == u.vhost_dir), None)
        if vhost is None:
            continue
        only = None
        if s.table in QUEUE_LEVEL:
            only = {}
            for g in group:
                segs = only.setdefault(g.queue_dir, set() if g.segment is not None else None)
                if segs is not None and g.segment is not None:
                    segs.add(g.segment)
        vs = VhostScan(ns, vhost.vhost, only, facts)
        try:
            for b in build(vs):
                yield b.select(columns)
        finally:
            vs.close()
            if key is not None:
                _VHOST_FACTS.clear()
                _VHOST_FACTS[key] = (ns, vs.vhost_facts())


# A Python worker runs many tasks of a stage one after another. The vhost-wide facts (the shared
# store's index, the pass over every queue index) of the last vhost read are kept for the next
# task of the same stage reading the same vhost: a big vhost split over many partitions is
# indexed once per worker, not once per partition. One vhost at most; a new read is a new stage,
# so no read uses another's facts (the last ones stay in the idle worker until its next task).
_VHOST_FACTS: dict = {}


def _task_key(u: Unit):
    from pyspark import TaskContext

    tc = TaskContext.get()
    return None if tc is None else (tc.stageId(), u.node_path, u.node_label, u.vhost_dir)


def apply_filters(batch, specs):
    import pyarrow as pa
    import pyarrow.compute as pc

    mask = None
    for spec in specs:
        col, op, v = spec
        arr = batch.column(col)
        if op == "eq":
            m = pc.equal(arr, pa.scalar(v, pa.string()))
        elif op == "in":
            m = pc.is_in(arr, value_set=pa.array(list(v), pa.string()))
        elif op == "prefix":
            m = pc.starts_with(arr, v)
        elif op == "suffix":
            m = pc.ends_with(arr, v)
        else:
            m = pc.match_substring(arr, v)
        m = pc.fill_null(m, False)
        mask = m if mask is None else pc.and_(mask, m)
    return batch.filter(mask)


__all__ = ["RabbitCQDataSource", "RabbitCQReader", "RabbitCQPushdownReader", "UnitsPartition", "matches"]
