"""Planning without a JVM: options, units, bin-packing and filter pruning."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from cqforensics.base.errors import OperationalError, UsageError
from spark_datasource import options as opt
from spark_datasource import plan
from support import SAMPLES, streams_beside_two_vhosts


def test_options_defaults_and_parsing():
    s = opt.parse({"path": str(SAMPLES)})
    assert s.table == "messages" and s.paths == (str(SAMPLES),) and s.max_partition_bytes == 128 << 20
    s = opt.parse(
        {
            "paths": json.dumps([str(SAMPLES / "4.3.6-kill"), str(SAMPLES / "4.0.5-kill")]),
            "TABLE": "Store",
            "asOf": "2026-01-01T00:00:00Z",
            "vhosts": " /, staging/ü ",
            "minPartitions": "3",
        }
    )
    assert s.table == "store" and len(s.paths) == 2 and s.vhosts == ("/", "staging/ü") and s.min_partitions == 3
    assert s.as_of_ms == 1767225600000


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, "no path given"),
        ({"path": "x", "table": "nope"}, "is not one of"),
        ({"path": "x", "batchRows": "0"}, "must be >= 1"),
        ({"path": "x", "asOf": "yesterday"}, "not ISO 8601"),
        ({"paths": "not json"}, "not a JSON list"),
        ({"path": "/no/such/*/dir"}, "matches nothing"),
    ],
)
def test_bad_options_are_usage_errors(options, message):
    with pytest.raises(UsageError, match=message):
        opt.parse(options)


def test_globs_expand_sorted():
    s = opt.parse({"path": str(SAMPLES / "4.*-clean")})
    assert s.paths == tuple(
        str(SAMPLES / d)
        for d in (
            "4.0.5-clean",
            "4.0.5-proto-clean",
            "4.0.5-quorum-clean",
            "4.0.5-streams-clean",
            "4.1.8-clean",
            "4.2.2-clean",
            "4.3.6-clean",
            "4.3.6-proto-clean",
            "4.3.6-quorum-clean",
            "4.3.6-streams-clean",
        )
    )


def test_units_per_segment_and_per_vhost():
    q = plan.plan_units([str(SAMPLES / "3.10.8-segments")], "messages")
    segs = [u for u in q if u.queue == "seg.v2"]
    assert len(segs) > 2 and all(u.segment is not None for u in segs)  # one unit per .qi segment
    v1 = [u for u in q if u.queue == "seg.v1"]
    assert len(v1) == 1 and v1[0].segment is None and len(v1[0].files) > 1  # a v1 queue is read whole
    v = plan.plan_units([str(SAMPLES / "3.10.8-segments")], "refcounts")
    assert [u.queue_dir for u in v] == [None, None]  # two vhosts
    with pytest.raises(OperationalError):
        plan.plan_units(["/no/such"], "messages")


@pytest.mark.slow
def test_quorum_units_read_what_a_whole_read_reads():
    """``messages`` gets one unit per quorum queue member; reading the units one by one (as
    separate tasks would) gives exactly the rows of one whole read: each quorum message once,
    and the dead letters a boot republishes into a classic queue once."""
    from cqforensics.model.options import Options
    from cqforensics.read import driver

    path = str(SAMPLES / "4.0.5-quorum-kill")
    units = plan.plan_units([path], "messages")
    quorum = [u for u in units if u.quorum]
    assert sorted(u.queue for u in quorum) == ["qq.amo", "qq.dead", "qq.orders", "qq.work"] and all(
        u.queue_dir is None for u in quorum
    )
    assert not [u for u in plan.plan_units([path], "index") if u.quorum]  # classic-only tables have none
    cols = ["queue", "queue_type", "raft_index", "location", "body"]

    def rows(batches):
        return sorted(tuple(r.values()) for b in batches for r in b.to_pylist())

    whole = rows(driver.read("messages", Options(), paths=[path], columns=cols))
    one_by_one = rows(b for u in units for b in driver.read("messages", Options(), units=[u], columns=cols))
    assert whole == one_by_one
    assert {r[1] for r in whole} == {"classic", "quorum"}
    assert any(r[3] == "dead_letter_replay" and r[1] == "classic" for r in whole)  # cq.dead's, from qq.orders
    named = rows(
        b
        for u in plan.plan_units([path], "messages", queues={"qq.orders"})
        for b in driver.read("messages", Options(), units=[u], columns=cols, queues={"qq.orders"})
    )
    assert named == [r for r in whole if r[0] == "qq.orders"] and named


def test_pack_is_deterministic_and_respects_targets():
    units = [plan.Unit("n", "n", "v", "v", f"q{i}", f"q{i}", weight=w) for i, w in enumerate([5, 5, 5, 50, 1, 1])]
    parts = plan.pack(units, 10)
    assert [[u.queue for u in p] for p in parts] == [["q0", "q1"], ["q2"], ["q3"], ["q4", "q5"]]
    assert plan.pack(units, 10) == parts
    assert len(plan.pack(units, 1000, min_partitions=3)) >= 3
    assert plan.pack([], 10) == []


def test_no_filter_is_pushed_and_every_plan_gets_a_fresh_reader():
    """Spark 4.1 .. 4.3 reuse the read function planned with pushed filters for later plans of the
    same DataFrame (see spark_datasource/source.py): the reader pushes nothing, keeps no state a
    plan could change, and never looks at Spark's private stack frames to guess the conf."""
    import ast
    import inspect

    from pyspark.sql.datasource import DataSourceReader

    from spark_datasource import source

    assert not any("pushFilters" in vars(c) for c in source.RabbitCQReader.__mro__ if c is not DataSourceReader)
    ds = source.RabbitCQDataSource({"path": str(SAMPLES / "4.3.6-kill")})
    schema = ds.schema()
    r1, r2 = ds.reader(schema), ds.reader(schema)
    assert r1 is not r2 and vars(r1).keys() == {"settings", "schema", "columns"}
    assert [p.units for p in r1.partitions()] == [p.units for p in r2.partitions()]
    if hasattr(DataSourceReader, "pushFilters"):  # Spark 4.1+
        filters = [type("EqualTo", (SimpleNamespace,), {})(attribute=("queue",), value="x")]
        assert list(r1.pushFilters(filters)) == filters  # everything stays with Spark
    names = {
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(ast.parse(inspect.getsource(source)))
        if isinstance(n, (ast.Name, ast.Attribute))
    }
    assert not names & {"_getframe", "f_back", "f_locals", "currentframe", "stack"}


def test_a_stream_is_a_unit_of_the_messages_table():
    from spark_datasource.plan import plan_units

    units = plan_units([str(SAMPLES / "4.3.6-streams-clean")], "messages")
    streams = [u for u in units if u.stream is not None]
    assert sorted(u.stream.split("_")[3] for u in streams) == ["events", "retained"]
    assert all(u.weight > 0 and u.files for u in streams)
    assert not [u for u in plan_units([str(SAMPLES / "4.3.6-streams-clean")], "queues") if u.stream]


def test_a_stream_unit_comes_where_the_embedded_reader_lists_its_rows(tmp_path):
    """Streams come with the vhost that lists them, after its classic queues, before the next
    vhost's: the planned units read in plan order give the embedded reader's rows, in its order
    (on a node of two vhosts, streams in the first: they used to come last)."""
    import pyarrow as pa

    import cqforensics
    from cqforensics.read import driver
    from cqforensics.read.api import make_options, needs
    from spark_datasource.plan import plan_units

    base = streams_beside_two_vhosts(tmp_path / "mnesia")
    units = plan_units([str(base)], "messages")
    kinds = [(u.vhost, u.stream is not None) for u in units]
    assert kinds.index(("/", True)) < kinds.index(("staging/ü", False))
    want = cqforensics.read_table(base, "messages")
    assert {"classic", "stream"} == set(want.column("queue_type").to_pylist())
    opts = make_options(**needs("messages", None))
    got = pa.Table.from_batches(list(driver.read("messages", opts, units=units)), schema=want.schema)
    assert got.equals(want)
    narrowed = plan_units([str(base)], "messages", queues=["events"])  # a queue of the second vhost only
    assert narrowed and not [u for u in narrowed if u.stream is not None]
