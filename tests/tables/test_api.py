"""The Python API's contract: one read driver, one options path, documented error types only."""

from __future__ import annotations

import datetime as dt
import os

import pytest

import cqforensics
from cqforensics.base.errors import CQError, OperationalError, UsageError
from support import SAMPLES, copy_node, unreadable

NODE = SAMPLES / "4.3.6-clean"


def test_a_string_names_one_vhost_or_queue_not_its_characters():
    as_list = cqforensics.read_table(NODE, "messages", vhosts=["staging/ü"], columns=["vhost", "queue"])
    as_str = cqforensics.read_table(NODE, "messages", vhosts="staging/ü", columns=["vhost", "queue"])
    assert as_list.num_rows and as_str.equals(as_list)
    slash = cqforensics.read_table(NODE, "queues", vhosts="/", columns=["vhost"])
    assert slash.num_rows and set(slash.column("vhost").to_pylist()) == {"/"}
    with pytest.raises(UsageError, match="no vhost named 's'"):  # not a char set: one name, which no vhost has
        cqforensics.read_table(NODE, "queues", vhosts="s", columns=["vhost"])
    dead = cqforensics.read_table(NODE, "messages", queues="dead", columns=["queue"])
    assert dead.num_rows and set(dead.column("queue").to_pylist()) == {"dead"}
    assert dead.equals(cqforensics.read_table(NODE, "messages", queues=["dead"], columns=["queue"]))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"vhosts": 3}, "vhosts"),
        ({"queues": [b"dead"]}, "queues"),
        ({"columns": ["colour"]}, "has no column"),
        ({"colour": "blue"}, "unknown option"),
        ({"broker_version": "2.8"}, "outside the supported range"),
        ({"as_of": "yesterday"}, "not ISO 8601"),
    ],
)
def test_bad_arguments_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message):
        cqforensics.read_table(NODE, "queues", **kwargs)


def test_an_unreadable_file_is_an_operational_error_naming_it(tmp_path, monkeypatch):
    node = copy_node("4.3.6-kill", tmp_path / "in")
    marker = next(node.glob("msg_stores/vhosts/*/.vhost"))
    unreadable(monkeypatch, marker)
    with pytest.raises(OperationalError, match=str(marker)):
        cqforensics.read_table(node, "queues")


def test_a_raw_os_error_leaves_the_driver_as_an_operational_error(monkeypatch):
    from cqforensics.model import vhost

    def denied(path):
        raise PermissionError(13, "Permission denied", str(path / "metadata"))

    monkeypatch.setattr(vhost, "read_metadata", denied)
    with pytest.raises(OperationalError, match="metadata: Permission denied") as e:
        cqforensics.read_table(NODE, "queues")
    assert isinstance(e.value, CQError) and e.value.exit_code == 8 and isinstance(e.value.__cause__, OSError)


def test_a_missing_path_is_an_operational_error():
    with pytest.raises(OperationalError, match="/no/such/node"):
        cqforensics.read_table("/no/such/node")


def test_options_parse_the_broker_version_once(monkeypatch):
    from cqforensics.model import versions
    from cqforensics.model.options import make_options

    opts = make_options(broker_version="3.13.1")
    assert opts.broker_model.version == (3, 13, 1)
    calls = []
    real = versions.model
    monkeypatch.setattr(versions, "model", lambda v: calls.append(v) or real(v))
    t = cqforensics.read_table(NODE, "queues", broker_version="4.0")
    assert t.num_rows and calls == ["4.0"]


def test_no_module_constructs_options_but_make_options():
    import re

    root = os.path.dirname(os.path.dirname(cqforensics.__file__))
    offenders = []
    for base in ("cqforensics", "cli", "spark_datasource"):
        for dirpath, _, files in os.walk(os.path.join(root, base)):
            for n in files:
                if n.endswith(".py"):
                    p = os.path.join(dirpath, n)
                    with open(p, encoding="utf-8") as f:
                        text = f.read()
                    for m in re.finditer(r"(?<![\w.])Options\(", text):
                        offenders.append(f"{p}:{text[: m.start()].count(chr(10)) + 1}")
    assert [o for o in offenders if not o.startswith(os.path.join(root, "cqforensics", "model", "options.py"))] == []


@pytest.mark.parametrize(
    "iso, ms",
    [
        ("2026-01-01T00:00:00Z", 1767225600000),
        ("2026-01-01T01:00:00+01:00", 1767225600000),
        ("2026-01-01T00:00:00", 1767225600000),
    ],
)
def test_spark_cli_and_api_share_one_as_of_parser(iso, ms):
    from types import SimpleNamespace

    from cli.main import read_options
    from cqforensics.model.options import make_options, parse_as_of
    from spark_datasource import options as spark_options

    for text in (iso, str(ms)):
        spark = spark_options.parse({"path": str(NODE), "asOf": text})
        cli = read_options(SimpleNamespace(as_of=text, broker_version=None))
        assert spark.as_of_ms == spark.options.as_of_ms == cli["as_of"] == parse_as_of(text) == ms
        assert make_options(**cli).as_of_ms == ms
    assert parse_as_of(dt.datetime(2026, 1, 1, tzinfo=dt.UTC)) == ms
    for bad in ("yesterday", "2026-13-01"):
        with pytest.raises(UsageError, match="option asOf: not ISO 8601"):
            spark_options.parse({"path": str(NODE), "asOf": bad})
        with pytest.raises(UsageError, match="--as-of: not ISO 8601"):
            read_options(SimpleNamespace(as_of=bad, broker_version=None))


def test_the_spark_reader_reads_through_the_driver(monkeypatch):
    """read_units (outside a task: no cache) gives what the embedded reader gives, via driver.read."""
    pytest.importorskip("pyspark")
    from cqforensics.read import driver
    from spark_datasource import options as spark_options
    from spark_datasource import plan, source

    calls = []
    real = driver.read
    monkeypatch.setattr(driver, "read", lambda *a, **k: calls.append(k.get("units")) or real(*a, **k))
    s = spark_options.parse({"path": str(NODE), "table": "messages", "queues": "dead"})
    units = plan.plan_units(s.paths, s.table, s.vhosts, s.queues)
    cols = ["vhost", "queue", "seq_id", "body"]
    got = [b for b in source.read_units(units, s, cols)]
    assert calls and calls[0] is units
    import pyarrow as pa

    want = cqforensics.read_table(NODE, "messages", queues="dead", columns=cols)
    assert pa.Table.from_batches(got, schema=want.schema).equals(want)
