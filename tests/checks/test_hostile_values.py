"""Issue 33: values a ``messages`` row shows as null have a finding, and hostile AMQP 1.0 counts
stay bounded.

The rule: whatever a row marks (its ``decode_error``: a term that does not decode, a message id
other than the index's, a value of another kind than the broker writes, a number past its
column) ``fsck --deep`` reports with the stored term's file and offset. Those checks decode the
message terms, so only ``--deep`` makes them (docs/hostile.md); plain fsck stays silent about
them by design.

Every input is a real sample's message re-encoded with one crafted value (``fuzz/campaign.py``
``_odd_values``, ``_hostile_amqp10``), framed as its store frames an entry (``put_term``): a
shared-store ``.rdq`` entry, a ``.qs`` entry (its CRC and ``.qi`` slot), or a term embedded in a
CQv1 index record."""

from __future__ import annotations

import base64
import json
import random
import time
from pathlib import Path

import pytest

import cqforensics
from cqforensics.base.errors import FormatError
from cqforensics.base.schema import value_marks
from cqforensics.codecs import etf
from cqforensics.commands.fsck import run
from cqforensics.message import fast as fastpath
from fuzz import campaign  # noqa: E402
from support import copy_node


def _deep_at(node: Path, deep: bool = True) -> dict[tuple[str, int], set[str]]:
    out: dict[tuple[str, int], set[str]] = {}
    for f in run([node.parent], deep=deep).findings:
        if f.file is not None and f.offset is not None:
            out.setdefault((f.file, f.offset), set()).add(f.code)
    return out


def _rows(node: Path) -> list[dict]:
    cols = [
        "location",
        "file",
        "offset",
        "store_file",
        "store_offset",
        "decode_error",
        "properties",
        "msg_id",
        "routing_keys",
        "exchange",
    ]
    return cqforensics.read_table(node.parent, "messages", columns=cols).to_pylist()


def _edit_each(node: Path, locations) -> list[tuple[str, str]]:
    """One message of each location given each odd value its format has (one message per edit,
    the rows read again after each: an .rdq edit moves the later entries). Returns (location, edit)
    of the edits whose row marks something."""
    done, used = [], set()
    names = None
    k = 0
    while True:
        rows = [
            r
            for r in campaign.stored_messages(node)
            if r["location"] in locations and (r["file"], r["offset"]) not in used
        ]
        if names is None:
            names = sorted(
                {
                    (r["location"], n)
                    for r in rows
                    for n, _ in campaign._odd_values(etf.binary_to_term(campaign.stored_term(r)))
                }
            )
        if k >= len(names):
            return done
        loc, name = names[k]
        k += 1
        for r in rows:
            if r["location"] != loc:
                continue
            odd = dict(campaign._odd_values(etf.binary_to_term(campaign.stored_term(r))))
            if name in odd:
                raw = etf.term_to_binary(odd[name])
                try:  # an edit the row shows no value of (a priority annotation under the property's) marks nothing
                    marks = value_marks(fastpath.decode(raw))
                except FormatError:
                    marks = "does not decode"
                campaign.put_term(r, raw)
                used.add((r["file"], r["offset"]))
                if marks:
                    done.append((loc, name))
                break


@pytest.mark.slow
@pytest.mark.parametrize(
    "dataset, locations",
    [
        ("4.3.6-kill", ("shared_store", "queue_store")),  # #mc{mc_amqpl}, #mc{mc_amqp}
        ("3.10.8-kill", ("shared_store", "queue_store", "embedded")),  # #basic_message, 'P_basic' records
        ("3.13.7-clean", ("embedded", "queue_store")),  # #mc in a CQv1 index
        ("4.3.6-proto-kill", ("shared_store", "queue_store")),  # #mc{mc_mqtt}
    ],
)
def test_every_value_a_row_marks_is_a_deep_finding_at_its_term(dataset, locations, tmp_path):
    node = copy_node(dataset, tmp_path / "mnesia")
    edits = _edit_each(node, locations)
    assert len(edits) >= 6 and {loc for loc, _ in edits} == set(locations), edits
    rows = _rows(node)
    marked = [r for r in rows if r["decode_error"]]
    assert len(marked) >= len(edits), (len(marked), edits)
    deep, plain = _deep_at(node), _deep_at(node, deep=False)
    for r in marked:
        at = (r["store_file"], r["store_offset"])
        assert deep.get(at, set()) & {"value-out-of-range", "msg-corrupt", "qs-entry-undecodable"}, (r, deep.get(at))
        # decoding the terms is what only --deep does: plain fsck says nothing of these values
        assert "value-out-of-range" not in plain.get(at, set()), r


def test_the_issues_cases_are_shown_as_null_and_named(tmp_path):
    """The cases issue 33 lists, one each: a 4.x annotation timestamp of 2^70, a properties
    timestamp of 2^64-1, a priority of 2^40, an integer message id, routing keys stored as an
    atom; each row shows the value as null (never a text made of it) and says why."""
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    rows = [
        r for r in campaign.stored_messages(node) if r["term_format"] == "mc_amqpl" and r["location"] == "queue_store"
    ]
    cases = ["ts-2^70", "props-timestamp-2^64-1", "priority-2^40", "id-integer", "rk-atom"]
    for r, name in zip(rows, cases):
        odd = dict(campaign._odd_values(etf.binary_to_term(campaign.stored_term(r))))
        campaign.put_term(r, etf.term_to_binary(odd[name]))
    by_at = {(r["file"], r["offset"]): r for r in _rows(node)}
    got = [by_at[(r["file"], r["offset"])] for r in rows[: len(cases)]]
    ts, props_ts, prio, mid, rk = got
    assert ts["properties"]["timestamp"] is None and "out of range" in ts["decode_error"]
    assert props_ts["properties"]["timestamp"] is None and "timestamp=" in props_ts["decode_error"]
    assert prio["properties"]["priority"] is None and "priority=1099511627776" in prio["decode_error"]
    assert mid["msg_id"] is None and "msg_id=12345 (an integer" in mid["decode_error"]
    assert rk["routing_keys"] is None and "routing_keys=odd (an atom" in rk["decode_error"]
    deep = _deep_at(node)
    for r in got:
        assert "value-out-of-range" in deep[(r["store_file"], r["store_offset"])]


# -- hostile AMQP 1.0 values: bounded everywhere, found by --deep -------------------------------------


def _plant_hostile_amqp10(node: Path, case: str) -> None:
    """One AMQP 1.0 message of a real 4.3.6 store, in a .rdq and in a .qs entry, given an
    application property holding the campaign's hostile value ``case`` (the rest intact)."""
    from cqforensics.codecs import amqp10

    class Pick(random.Random):  # the campaign's choice of hostile value, fixed to ``case``
        def choice(self, seq):
            return case if case in seq else super().choice(seq)

    for loc in ("shared_store", "queue_store"):
        rows = [r for r in campaign.stored_messages(node) if r["term_format"] == "mc_amqp" and r["location"] == loc]
        r = rows[0]
        term = etf.binary_to_term(campaign.stored_term(r))
        name, extra = campaign._hostile_amqp10(Pick(1))
        assert name == case
        bare = term[2][2]
        props = b"".join(bare[a:b] for c, _, a, b in amqp10.sections(bare) if c == amqp10.PROPERTIES)
        rest = b"".join(
            bare[a:b]
            for c, _, a, b in amqp10.sections(bare)
            if c not in (amqp10.PROPERTIES, amqp10.APPLICATION_PROPERTIES)
        )
        v1 = list(term[2])
        v1[2] = props + extra + rest
        campaign.put_term(r, etf.term_to_binary((term[0], term[1], tuple(v1), term[3])))


@pytest.mark.parametrize("case", ["array-2^32-1", "array-2^32-1-ints", "list-2^32-1", "map-2^32-1", "nested-described"])
def test_hostile_amqp10_value_is_a_deep_finding_quickly(case, tmp_path):
    """An AMQP 1.0 message of a real 4.3.6 store given an application property holding the
    hostile value (the rest of the message intact), in a .rdq and in a .qs entry: every row says
    it does not decode, fsck --deep names both terms, in seconds and without growing by
    gigabytes (the array of 2^32-1 nulls took every entry point to 3-4 GB before)."""
    import resource

    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    _plant_hostile_amqp10(node, case)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    rows = [r for r in _rows(node) if r["decode_error"]]
    deep = _deep_at(node)
    assert time.monotonic() - t0 < 60
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) << 10 < 300 << 20
    assert {r["location"] for r in rows} == {"shared_store", "queue_store"}, rows
    for r in rows:
        assert deep[(r["store_file"], r["store_offset"])] & {"msg-corrupt", "qs-entry-undecodable"}


def test_a_string_that_is_not_utf8_is_delivered_as_its_bytes(tmp_path):
    """An AMQP 1.0 string holding a lone UTF-16 surrogate (ED A0 80: not UTF-8). RabbitMQ's
    parser takes a string's bytes as they are (amqp10_binary_parser: no UTF-8 check; 3.10 itself
    writes a non-UTF-8 longstr header as utf8), and the 0-9-1 consumer gets them as a longstr
    header. So the row decodes and keeps those bytes (base64 in the typed JSON), with no
    decode_error and nothing for --deep to report: the bytes are what the broker delivers. (This
    case was in the hostile-values test above until the reader learnt that rule.)"""
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    _plant_hostile_amqp10(node, "lone-surrogate")
    cols = ["location", "decode_error", "headers"]
    rows = cqforensics.read_table(node.parent, "messages", columns=cols).to_pylist()
    planted = [r for r in rows if r["headers"] and json.loads(r["headers"]).get("k", {}).get("type") == "string"]
    assert {r["location"] for r in planted} == {"shared_store", "queue_store"}, planted
    for r in planted:
        assert r["decode_error"] is None
        k = json.loads(r["headers"])["k"]
        assert base64.b64decode(k["base64"]) == b"\xed\xa0\x80", k
    assert not [f for f in run([node.parent], deep=True).findings if f.severity == "error"]
