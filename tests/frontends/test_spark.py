"""spark.read.format("rabbitcq") on a real local[2] session: discovery without register(), every
table equal to the embedded reader on every sample, paths, globs, pushdown on and off, a
narrowed schema, damaged inputs and clear errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

import cqforensics
from support import SAMPLES, copy_node, damage, datasets, manifest, streams_beside_two_vhosts

pytestmark = pytest.mark.spark


def read(spark, path, table="messages", **options):
    r = spark.read.format("rabbitcq").option("table", table)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load(path)


def test_discovered_without_register(spark):
    # the very first use of the format in this JVM: found by the static lookup of pyspark_* modules
    df = spark.read.format("rabbitcq").load(str(SAMPLES / "4.3.6-clean"))
    assert df.schema.names == cqforensics.schema("messages").names
    assert df.count() > 0


def test_discovered_by_a_fresh_session_after_pip_install(spark, tmp_path):
    """The user's first read: a new Python outside this checkout (no PYTHONPATH) and a new JVM
    find the source that pip installed (the session above sees the checkout instead)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = textwrap.dedent("""
        import sys
        from pyspark.sql import SparkSession
        s = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
        print(s.read.format("rabbitcq").option("table", "queues").load(sys.argv[1]).count())
        s.stop()""")
    p = subprocess.run(
        [sys.executable, "-c", code, str(SAMPLES / "4.3.6-clean")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, f"install the project first (python3 -m pip install '.[test]'): {p.stderr[-2000:]}"
    assert int(p.stdout.split()[-1]) == cqforensics.read_table(SAMPLES / "4.3.6-clean", "queues").num_rows


def test_register_helper_is_safe_when_already_discovered(spark):
    from spark_datasource import register

    register(spark)
    register(spark)
    assert read(spark, str(SAMPLES / "4.0.5-kill"), "queues").count() > 0


#: the streams and the quorum samples differ in their streams and Ra logs only by version and stop: two of
#: each stand for the six here (the plan's units of both kinds, ordering and partitioning are what Spark
#: adds); tests/model/test_streams.py and tests/model/test_quorum.py read all six with the embedded reader
SPARK_DATASETS = [
    d
    for d in datasets()
    if ("-streams-" not in d and "-quorum-" not in d)
    or d in ("3.10.8-streams-kill", "4.3.6-streams-clean", "3.10.8-quorum-kill", "4.3.6-quorum-clean")
]


@pytest.mark.parametrize("table", cqforensics.TABLES)
def test_every_table_equals_the_embedded_reader(spark, table):
    """Every sample in one read of each table: Spark's fixed cost of a read (its planner
    processes and the JVM's planning, about 2 CPU-s) is paid once per table, not once per table
    and sample. 200 KB partitions split the bigger vhosts' queues over several tasks (90 of them
    for ``messages``), so ordering across partitions and the per-task store index are exercised.
    One clock for every sample: the two readers judge each TTL by the same ``asOf``."""
    paths = [str(SAMPLES / d) for d in SPARK_DATASETS]
    as_of = max(manifest(d)["restarted_at_ms"] for d in SPARK_DATASETS)
    got = read(spark, paths, table, asOf=as_of, maxPartitionBytes=200_000).toArrow()
    want = cqforensics.read_table(paths, table, as_of=as_of)
    assert got.schema == want.schema, table
    if not got.equals(want):
        pytest.fail(f"table {table} differs from the embedded reader: {_first_difference(got, want)}")


def _first_difference(got: pa.Table, want: pa.Table) -> str:
    if got.num_rows != want.num_rows:
        return f"{got.num_rows} rows against {want.num_rows}"
    row = next(i for i in range(got.num_rows) if not got.slice(i, 1).equals(want.slice(i, 1)))
    where = want.slice(row, 1).to_pylist()[0]
    return (
        f"first at row {row} (node {where.get('node')!r}, vhost {where.get('vhost')!r}, queue {where.get('queue')!r})"
    )


def test_partitions_are_bin_packed(spark):
    small = read(spark, str(SAMPLES), "messages", maxPartitionBytes=200_000)
    big = read(spark, str(SAMPLES), "messages")
    assert small.rdd.getNumPartitions() > 5 > big.rdd.getNumPartitions()
    assert small.count() == big.count()
    assert read(spark, str(SAMPLES / "4.3.6-kill"), "store", minPartitions=3).rdd.getNumPartitions() == 2  # 2 vhosts


def test_paths_list_and_globs(spark):
    p1, p2 = str(SAMPLES / "4.0.5-kill"), str(SAMPLES / "4.3.6-kill")
    both = spark.read.format("rabbitcq").option("table", "queues").load([p1, p2]).toArrow()
    assert both.equals(cqforensics.read_table([p1, p2], "queues"))
    glob = read(spark, str(SAMPLES / "4.?.?-kill"), "queues").toArrow()  # not the -proto- ones
    assert glob.equals(both)


def test_a_fleet_of_backups_in_one_read(spark, tmp_path):
    for i in range(4):
        shutil.copytree(SAMPLES / "4.3.6-kill" / "mnesia", tmp_path / f"host{i}" / "mnesia")
    df = read(spark, str(tmp_path), "findings", maxPartitionBytes=1)
    assert df.rdd.getNumPartitions() == 8  # one task per vhost: checks run in parallel
    nodes = read(spark, str(tmp_path), "queues").select("node").distinct().count()
    assert nodes == 4


@pytest.mark.parametrize("pushdown", ["false", "true"])
def test_filters_with_pushdown_on_and_off(spark, pushdown):
    spark.conf.set("spark.sql.python.filterPushdown.enabled", pushdown)
    try:
        df = read(spark, str(SAMPLES), "messages").filter("vhost = 'staging/ü' AND queue IN ('events', 'x')")
        rows = df.select("vhost", "queue").collect()
        assert rows and {(r.vhost, r.queue) for r in rows} == {("staging/ü", "events")}
        expected = cqforensics.read_table(
            SAMPLES, "messages", vhosts=["staging/ü"], queues=["events"], columns=["queue"]
        ).num_rows  # names match on some of the nodes
        assert len(rows) == expected
        plan = df._jdf.queryExecution().executedPlan().toString()
        spark_side = plan.split("BatchScan")[0]  # nothing is pushed: Spark applies every filter
        assert "staging" in spark_side and "events" in spark_side
        f = read(spark, str(SAMPLES / "4.3.6-kill"), "index").filter("file LIKE '%/0.qi'").count()
        assert f == sum(
            1
            for r in cqforensics.read_table(SAMPLES / "4.3.6-kill", "index", columns=["file"])
            .column("file")
            .to_pylist()
            if r.endswith("/0.qi")
        )
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


@pytest.mark.parametrize("pushdown", ["false", "true"])
def test_a_filtered_query_does_not_change_later_queries_of_the_same_dataframe(spark, pushdown):
    """Spark 4.1 .. 4.3 reuse the read planned with pushed filters for later plans of the same
    DataFrame: with a reader accepting filters, count / filtered count / count again gave
    93 / 2 / 2 here, and a sum after a filtered query summed the filtered rows only."""
    path = SAMPLES / "4.3.6-kill"
    want = cqforensics.read_table(path, "messages", columns=["queue", "body"]).to_pylist()
    queue = min(r["queue"] for r in want if r["body"])
    in_queue = [r for r in want if r["queue"] == queue]
    assert 0 < len(in_queue) < len(want)
    total, part = (sum(len(r["body"]) for r in rows if r["body"] is not None) for rows in (want, in_queue))
    assert 0 < part < total
    spark.conf.set("spark.sql.python.filterPushdown.enabled", pushdown)
    try:
        df = read(spark, str(path), "messages")
        where = f"queue = '{queue}'"
        assert [df.count(), df.where(where).count(), df.count()] == [len(want), len(in_queue), len(want)]
        assert df.where(where).selectExpr("sum(length(body))").first()[0] == part
        assert df.selectExpr("sum(length(body))").first()[0] == total
        assert df.where(where).union(df.where(f"queue <> '{queue}'")).count() == len(want)  # sibling scans
        assert df.where(where).union(df.where(where)).count() == 2 * len(in_queue)
        assert df.count() == len(want)
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


def test_narrowed_schema_skips_bodies(spark):
    df = (
        spark.read.format("rabbitcq")
        .schema("queue STRING, size BIGINT, survives_restart BOOLEAN")
        .load(str(SAMPLES / "4.3.6-clean"))
    )
    got = df.toArrow()
    want = cqforensics.read_table(SAMPLES / "4.3.6-clean", "messages", columns=["queue", "size", "survives_restart"])
    assert got.equals(want)


def test_damaged_input_yields_findings_not_task_failures(spark, tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    for qi in sorted(node.glob("msg_stores/vhosts/*/queues/*/0.qi"))[:3]:
        damage.zero(qi, 0, 8)
    rdq = max(node.glob("msg_stores/vhosts/*/msg_store_persistent/*.rdq"), key=lambda p: p.stat().st_size)
    entry = [
        r
        for r in cqforensics.read_table(node, "store", columns=["file", "offset"]).to_pylist()
        if r["file"] == str(rdq)
    ][2]
    damage.junk(rdq, entry["offset"], 300)  # over an entry's header: the chain breaks there
    codes = {r.code for r in read(spark, str(tmp_path), "findings").select("code").collect()}
    assert {"qi-bad-header", "rdq-garbage"} <= codes
    assert read(spark, str(tmp_path), "messages").filter("drop_reason = 'segment_deleted'").count() > 0


@pytest.mark.parametrize(
    "path, options, message",
    [
        ("/no/such/dir", {}, "no such file or directory"),
        ("EMPTY", {}, "no RabbitMQ node directory"),
        (str(SAMPLES), {"table": "nope"}, "is not one of"),
        (str(SAMPLES), {"maxPartitionBytes": "lots"}, "not an integer"),
        (str(SAMPLES), {"brokerVersion": "2.8"}, "outside the supported range"),
        (str(SAMPLES), {"colour": "blue"}, "unknown option"),
    ],
)
def test_clear_errors_at_planning(spark, tmp_path, path, options, message):
    path = str(tmp_path) if path == "EMPTY" else path
    with pytest.raises(Exception) as e:
        r = spark.read.format("rabbitcq")
        for k, v in options.items():
            r = r.option(k, v)
        r.load(path).count()
    assert message in str(e.value)
    if path != str(SAMPLES):
        assert path in str(e.value)


def test_a_vhost_or_queue_option_that_matches_nothing_fails_at_planning(spark):
    """Before: queues=ordrs.v2 read zero rows, as if the queue were empty."""
    with pytest.raises(Exception, match="no queue named 'ordrs.v2' on the node read; did you mean 'orders.v2'"):
        read(spark, str(SAMPLES / "4.3.6-kill"), queues="ordrs.v2").count()
    with pytest.raises(Exception, match="did you mean 'staging/ü'"):
        read(spark, str(SAMPLES / "4.3.6-kill"), vhosts="staging").count()


def test_headers_and_annotations_become_maps_in_one_call(spark):
    """``typed_json``: the JSON text of headers and annotations as Spark maps (HEADERS_SCHEMA,
    ANNOTATIONS_SCHEMA); DEATHS_SCHEMA reads the dead-letter history. Before: JSON strings only,
    every user writing their own schema."""
    import json

    from pyspark.sql import functions as F

    from spark_datasource import DEATHS_SCHEMA, typed_json

    path = str(SAMPLES / "3.13.7-clean")
    df = typed_json(read(spark, path))
    assert dict(df.dtypes)["headers"].startswith("map<string,struct<type:string,value:string")
    rows = (
        df.where("queue = 'dead'")
        .select(
            "seq_id",
            F.col("headers")["str"]["value"].alias("str"),
            F.col("headers")["int"]["type"].alias("t"),
            F.col("headers")["bytes"]["base64"].alias("b64"),
            F.col("headers")["dec"]["value"].alias("dec"),
            F.col("annotations")["p"].alias("p"),
            F.from_json(F.col("annotations")["deaths"], DEATHS_SCHEMA).alias("deaths"),
        )
        .orderBy("seq_id")
        .collect()
    )
    want = cqforensics.read_table(
        path, "messages", columns=["queue", "seq_id", "headers", "annotations"], queues="dead"
    ).to_pylist()
    assert len(rows) == len(want) > 0
    for r, w in zip(rows, sorted(want, key=lambda w: w["seq_id"])):
        h, a = json.loads(w["headers"]), json.loads(w["annotations"])
        assert (r.str, r.t, r.b64) == (h["str"]["value"], h["int"]["type"], h["bytes"]["base64"])
        assert json.loads(r.dec) == h["dec"]["value"] and json.loads(r.p) == a["p"]
        assert [(d["queue"], d["reason"], d["count"], list(d["routing_keys"])) for d in r.deaths] == [
            (d["queue"], d["reason"], d["count"], d["routing_keys"]) for d in a["deaths"]
        ]
    assert typed_json(read(spark, path, "queues")).columns == read(spark, path, "queues").columns  # no such columns


def test_narrowed_schema_with_unknown_column_fails_clearly(spark):
    with pytest.raises(Exception, match="has no column"):
        spark.read.format("rabbitcq").schema("queue STRING, colour STRING").load(str(SAMPLES / "4.3.6-clean")).count()


def test_arrow_schemas_match_spark_for_every_table():
    from spark_datasource.schema import arrow_schema, struct_type

    for table in cqforensics.TABLES:
        assert arrow_schema(struct_type(table)) == cqforensics.schema(table)
        assert isinstance(cqforensics.schema(table), pa.Schema)


def test_streams_through_spark(spark):
    """A stream is a unit of its own (spark_datasource.plan): its records come as messages rows,
    restricted by the queue option like any queue; its tracking is a table of its own."""
    path = str(SAMPLES / "4.3.6-streams-clean")
    for queues in (None, "st.retained", "cq.events"):
        opts = {"queues": queues} if queues else {}
        got = read(spark, path, "messages", maxPartitionBytes=20_000, **opts).toArrow()
        want = cqforensics.read_table(path, "messages", queues=queues.split(",") if queues else None)
        assert got.equals(want), queues
        kinds = set(got.column("queue_type").to_pylist())
        assert kinds == (
            {"classic", "stream"} if queues is None else {"classic"} if queues == "cq.events" else {"stream"}
        )
    tracking = read(spark, path, "stream_tracking").toArrow()
    assert tracking.equals(cqforensics.read_table(path, "stream_tracking")) and tracking.num_rows > 0


def test_stream_rows_come_in_the_embedded_order_on_a_node_of_two_vhosts(spark, tmp_path):
    """The default vhost lists the streams, after its classic queues and before the second
    vhost's (the embedded order): Spark gives the same rows in the same order, whatever the
    partitioning (a composite node: tests/conftest.streams_beside_two_vhosts)."""
    base = streams_beside_two_vhosts(tmp_path / "mnesia")
    want = cqforensics.read_table(base, "messages")
    assert {"classic", "stream"} == set(want.column("queue_type").to_pylist())
    for size in (20_000, 10_000_000):
        assert read(spark, str(base), "messages", maxPartitionBytes=size).toArrow().equals(want), size
