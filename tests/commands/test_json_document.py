"""``jsonout.document``: the indented JSON documents of ``fsck``/``audit``/``verify --json``
made in one pass are the very text ``json.dumps(convert(v), ensure_ascii=False,
sort_keys=True, indent=1)`` makes (the convention of ``cqforensics.base.jsonout``)."""

from __future__ import annotations

import datetime as dt
import enum
import json

import pytest

from cqforensics.base import jsonout
from cqforensics.commands import fsck
from support import FAST_DATASETS, SAMPLES


class _Int(enum.IntEnum):
    A = 3


class _Str(enum.StrEnum):
    X = "x"


CASES = [
    {
        "a": 1,
        "msg_id": b"\x00" * 16,
        "body": None,
        "payload": b"\x01\x02",
        "headers": '{"x": [1, {"b": "headers"}]}',
        "details": "not json",
        "annotations": '{"body": null, "headers": "[1]"}',
        "t": dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        "d": dt.date(2020, 1, 2),
        "l": [b"ab", {"msg_id": b"\x01" * 16}, [], {}, (1, 2.5, float("nan"), float("inf"), -float("inf"))],
        "ids_msg_id": [b"\x02" * 16],
        "u": 'é\u2028"\\\n',
        "bools": [True, False, None],
        "big": 10**30,
        "tiny": -1.5e-300,
        "int_keys": {3: "a", 1: "b"},
        "nested": {"headers": "[1]", "p": bytearray(b"x"), "body": None},
        "flat": {"a": 1, "b": "x\n", "c": None, "d": [], "e": {}, "f": 1.5, "g": True},
        "flats": [{"z": 1, "a": 2}, {"details": "[1]"}, {"x": {"y": {"k": 1, "j": [1]}}}],
    },
    [1, 2, {"x": b"\xff"}],
    "text",
    b"bytes",
    None,
    {},
    [],
    {"e": _Int.A, "s": _Str.X, "k": {_Str.X: 1}},
    {"body": None, "body_base64": 1},
    {"body_base64": 1, "body": None},
]


def _reference(v) -> str:
    v = jsonout.convert(v) if isinstance(v, dict) else jsonout.value(v)
    return json.dumps(v, ensure_ascii=False, sort_keys=True, indent=1)


@pytest.mark.parametrize("v", CASES, ids=range(len(CASES)))
def test_same_text_as_json_dumps(v):
    assert jsonout.document(v) == _reference(v)


@pytest.mark.parametrize("v", [{"x": object()}, {1: 1, "a": 2}, {"a": [{"b": {1: 1, "a": 2}}]}])
def test_same_errors_as_json_dumps(v):
    with pytest.raises(TypeError):
        _reference(v)
    with pytest.raises(TypeError):
        jsonout.document(v)


def test_an_fsck_report():
    report = fsck.run([SAMPLES / "4.3.6-kill"], jobs=1).to_dict()
    assert report["queues"] and report["findings"]
    assert jsonout.document(report) == _reference(report)


# -- JSON lines of a record batch, made column by column ---------------------------------------------


def _lines_reference(batch) -> str:
    return "".join(jsonout.dumps(row) + "\n" for row in batch.to_pylist())


@pytest.mark.parametrize("dataset", FAST_DATASETS)
def test_batch_lines_of_every_table(dataset):
    """``read --format jsonl`` and ``export --format jsonl`` write ``batch_lines``: the text the
    row-by-row ``dumps`` writes, on every table of the samples that hold every kind of row
    (``#basic_message`` and ``#mc`` bodies, quorum and stream messages, damage findings)."""
    import pyarrow as pa

    import cqforensics

    path = SAMPLES / dataset
    for table in cqforensics.TABLES:
        t = cqforensics.read_table(path, table)
        for batch in t.to_batches(max_chunksize=700) or [pa.RecordBatch.from_pylist([], schema=t.schema)]:
            assert jsonout.batch_lines(batch) == _lines_reference(batch), table


def test_batch_lines_of_crafted_values():
    """Crafted, not broker output: every type a table holds, with the values json writes its own
    way (NaN, the infinities, escapes, line separators, nulls at every level, a null struct, an
    empty list), a JSON text column holding no JSON, and the two shapes written row by row (a
    binary column whose key would depend on its nulls; two columns under one key)."""
    import pyarrow as pa

    props = pa.struct([("content_type", pa.string()), ("timestamp", pa.timestamp("us", tz="UTC")), ("p", pa.int32())])
    batch = pa.RecordBatch.from_pydict(
        {
            "s": ['é\u2028"\\\n\x00', None, "", "%s {} %%"],
            "n": [1, None, -(2**62), 0],
            "b": [True, False, None, True],
            "f": [float("nan"), float("inf"), -1.5e-300, None],
            "msg_id": [b"\x00" * 16, None, b"\xff" * 16, b"\x01" * 16],
            "body": [b"\x00\xff", None, b"", b"x" * 1000],
            "headers": ['{"b": 1, "a": [1.0, "é"]}', "not json", None, "[]"],
            "details": ["1e400", '"x"', None, "{}"],
            "t": [
                dt.datetime(2026, 1, 1, 1, 2, 3, 4, tzinfo=dt.UTC),
                None,
                dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
                None,
            ],
            "l": [["a", None], [], None, ['"']],
            "props": [
                {"content_type": "x", "timestamp": None, "p": 1},
                None,
                {"content_type": None, "timestamp": dt.datetime(2000, 1, 1, tzinfo=dt.UTC), "p": None},
                {},
            ],
        },
        schema=pa.schema(
            [
                ("s", pa.string()),
                ("n", pa.int64()),
                ("b", pa.bool_()),
                ("f", pa.float64()),
                ("msg_id", pa.binary()),
                ("body", pa.binary()),
                ("headers", pa.string()),
                ("details", pa.string()),
                ("t", pa.timestamp("us", tz="UTC")),
                ("l", pa.list_(pa.string())),
                ("props", props),
            ]
        ),
    )
    assert jsonout.batch_lines(batch) == _lines_reference(batch)
    assert jsonout.batch_lines(batch.slice(1, 2)) == _lines_reference(batch.slice(1, 2))
    odd = pa.RecordBatch.from_pydict({"payload": [b"x", None], "payload_base64": [1, 2]})
    assert jsonout.batch_lines(odd) == _lines_reference(odd)
    assert jsonout.batch_lines(odd.slice(0, 0)) == ""
