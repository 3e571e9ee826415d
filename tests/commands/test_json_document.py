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
from support import SAMPLES


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
