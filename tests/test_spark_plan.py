"""Planning without a JVM: options, units, bin-packing and filter pruning."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from cqforensics.errors import OperationalError, UsageError
from spark_datasource import options as opt
from spark_datasource import plan

from conftest import SAMPLES


def test_options_defaults_and_parsing():
    s = opt.parse({"path": str(SAMPLES)})
    assert s.table == "messages" and s.paths == (str(SAMPLES),) and s.max_partition_bytes == 128 << 20
    s = opt.parse({"paths": json.dumps([str(SAMPLES / "4.3.6-kill"), str(SAMPLES / "4.0.5-kill")]), "TABLE": "Store",
                   "asOf": "2026-01-01T00:00:00Z", "vhosts": " /, staging/ü ", "minPartitions": "3"})
    assert s.table == "store" and len(s.paths) == 2 and s.vhosts == ("/", "staging/ü") and s.min_partitions == 3
    assert s.as_of_ms == 1767225600000


@pytest.mark.parametrize("options, message", [
    ({}, "no path given"),
    ({"path": "x", "table": "nope"}, "is not one of"),
    ({"path": "x", "batchRows": "0"}, "must be >= 1"),
    ({"path": "x", "asOf": "yesterday"}, "not ISO 8601"),
    ({"paths": "not json"}, "not a JSON list"),
    ({"path": "/no/such/*/dir"}, "matches nothing"),
])
def test_bad_options_are_usage_errors(options, message):
    with pytest.raises(UsageError, match=message):
        opt.parse(options)


def test_globs_expand_sorted():
    s = opt.parse({"path": str(SAMPLES / "4.*-clean")})
    assert s.paths == (str(SAMPLES / "4.0.5-clean"), str(SAMPLES / "4.3.6-clean"))


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


def test_pack_is_deterministic_and_respects_targets():
    units = [plan.Unit("n", "n", "v", "v", f"q{i}", f"q{i}", weight=w) for i, w in enumerate([5, 5, 5, 50, 1, 1])]
    parts = plan.pack(units, 10)
    assert [[u.queue for u in p] for p in parts] == [["q0", "q1"], ["q2"], ["q3"], ["q4", "q5"]]
    assert plan.pack(units, 10) == parts
    assert len(plan.pack(units, 1000, min_partitions=3)) >= 3
    assert plan.pack([], 10) == []


def flt(name, col, value):
    """A stand-in for pyspark's Filter classes (matched by class name, as Spark's are)."""
    return type(name, (SimpleNamespace,), {})(attribute=(col,), value=value)


def test_filter_specs_and_pruning():
    eq = flt("EqualTo", "vhost", "staging/ü")
    assert plan.filter_spec(eq) == ("vhost", "eq", "staging/ü")
    assert plan.filter_spec(flt("In", "queue", ["a", "b"])) == ("queue", "in", ("a", "b"))
    assert plan.filter_spec(flt("GreaterThan", "vhost", "a")) is None  # not ours to apply
    assert plan.filter_spec(flt("EqualTo", "size", 5)) is None
    specs, rejected = plan.accepted([eq, flt("GreaterThan", "seq_id", 3)], "messages", ["vhost", "seq_id"])
    assert specs == [("vhost", "eq", "staging/ü")] and len(rejected) == 1
    units = plan.plan_units([str(SAMPLES / "4.3.6-kill")], "messages")
    kept = [u for u in units if plan.unit_may_match(u, specs[0], "messages")]
    assert kept and {u.vhost for u in kept} == {"staging/ü"}
    f = ("file", "suffix", "/0.qi")
    assert all(plan.unit_may_match(u, f, "messages") == u.files[0].endswith("/0.qi") for u in units)
