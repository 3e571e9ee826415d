"""Findings are made one way: immutable, located when made, and only by readers and checks."""

from __future__ import annotations

import dataclasses
import re

import pytest

from cqforensics.base.findings import Finding
from support import ROOT


def test_a_finding_is_immutable_and_scoping_makes_a_new_one():
    details = {"seq_id": 7}
    f = Finding("qi-bad-entry", "slot 7", "/x/0.qi", 64, details=details, crashes_queue=True)
    assert f.severity == "error"  # the code's default
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.queue = "q"  # type: ignore[misc]
    details["seq_id"] = 8  # the caller's dict is not the finding's
    assert f.details == {"seq_id": 7}
    g = f.scoped(node="rabbit@h", vhost="/", queue="q", priority=2)
    assert (f.node, f.vhost, f.queue, f.priority) == (None, None, None, None)
    assert (g.node, g.vhost, g.queue, g.priority, g.file, g.offset, g.crashes_queue) == (
        "rabbit@h",
        "/",
        "q",
        2,
        "/x/0.qi",
        64,
        True,
    )
    assert g.to_dict() == {
        "code": "qi-bad-entry",
        "severity": "error",
        "node": "rabbit@h",
        "vhost": "/",
        "queue": "q",
        "priority": 2,
        "file": "/x/0.qi",
        "offset": 64,
        "message": "slot 7",
        "details": {"seq_id": 7},
    }
    with pytest.raises(TypeError):
        f.scoped(code="expired")


def test_scoping_keeps_a_cut_text_as_it_was_cut():
    """A text over MAX_TEXT is cut once, when the finding is made: scoping it (twice, as a check
    and then fsck do) neither cuts it again nor loses the count of characters cut; undecodable
    names it is scoped to are shown as escapes, as when made."""
    from cqforensics.base.findings import MAX_TEXT

    f = Finding("unknown-queue", "m" * (MAX_TEXT + 500), details={"text": "d" * (MAX_TEXT + 300)})
    g = f.scoped(queue=b"q\xff").scoped(node="rabbit@h", vhost="/")
    assert g.message == f.message and g.message.endswith("... (500 more characters cut)")
    assert g.details == f.details and g.details["text"].endswith("... (300 more characters cut)")
    assert (g.queue, g.node, g.vhost) == ("q\\xff", "rabbit@h", "/")


def test_only_readers_and_checks_make_findings():
    made = []
    for path in (
        sorted((ROOT / "cqforensics").rglob("*.py"))
        + sorted((ROOT / "cli").rglob("*.py"))
        + sorted((ROOT / "spark_datasource").rglob("*.py"))
    ):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("cqforensics/readers/", "cqforensics/checks/")) or rel == "cqforensics/base/findings.py":
            continue
        if re.search(r"\bFinding\(|\breplace\([^)]*\bFinding\b", path.read_text()):
            made.append(rel)
    assert not made, made
