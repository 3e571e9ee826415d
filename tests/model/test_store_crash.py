"""The message store crashing under a running vhost (docs/store-crash.md), without a broker: what
a clean start loads of a damaged ``msg_store_index.ets`` (``ets:file2tab`` as OTP runs it), who a
failed read crashes, and the bounds fsck gives where the store itself can crash. Real samples,
damage made at test time (labelled where crafted); tests/real_brokers/test_recovery_state_brokers.py holds
the same classes against the real brokers."""

from __future__ import annotations

import pytest

import cqforensics
from cqforensics.commands import fsck
from cqforensics.readers.terms import RAISES, file2tab_load
from support import copy_node
from support.nodes import ets_items, root_vhost


def _dump(tmp_path):
    node = copy_node("3.12.14-clean", tmp_path / "n")
    return node, root_vhost(node) / "msg_store_persistent" / "msg_store_index.ets"


def test_a_bad_item_can_end_the_table(tmp_path):
    """Crafted damage on a real dump: a bad item header is skipped (the next items load), a
    term binary_to_term refuses at the start of a chunk ends the table (file2tab's load stops
    at a chunk with nothing in it), and a term cut to ``{}`` makes file2tab raise."""
    _, ets = _dump(tmp_path)
    data = ets.read_bytes()
    items = ets_items(ets)
    whole = len(file2tab_load(data))
    assert whole == len(items) - 2  # the table info and the end marker are no objects
    first = items[1][0]  # the first object: the first item of the first chunk after the info
    magic = bytearray(data)
    magic[first + 4 : first + 8] = bytes(4)
    assert len(file2tab_load(bytes(magic))) == whole - 1
    term = bytearray(data)
    term[first + 8] = 0  # not 131: binary_to_term refuses it
    assert file2tab_load(bytes(term)) == []
    empty = bytearray(data)
    size = int.from_bytes(data[first : first + 4], "big")
    empty[first + 8 : first + 8 + size] = bytes([131, 104, 0]) + bytes(size - 3)
    assert file2tab_load(bytes(empty)) is RAISES


@pytest.mark.slow  # ~10 s: two fsck passes over a 21 MB sample
def test_a_flipped_index_predicts_the_store_crash_and_its_bounds(tmp_path):
    """The issue's case: 3.12.14's clean stop, 64 bytes of msg_store_index.ets inverted in the
    middle, predicted for 4.0.5. OTP loses the 458 objects after the undecodable item; the
    ``ttl`` queue drops expired messages the index lacks without reading them, which crashes
    the store at boot (``remove``); ``audit.a`` and ``audit.b`` share stored messages and crash
    on what the index lost (``double-ack``). Booting this very damage while the model was
    written, 4.0.5 delivered 68, 143, 152, 240, 164 and 149 messages from audit.a, audit.b,
    dead, legacy, orders and work (its log: remove_message, then a clean restart): each within
    the bounds, and all but audit.b the prediction itself."""
    node, ets = _dump(tmp_path)
    data = bytearray(ets.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(b ^ 0xFF for b in data[mid : mid + 64])
    ets.write_bytes(bytes(data))
    report = fsck.run(node, broker_version="4.0.5")
    got = {q.queue: q for q in report.queues if q.vhost == "/"}
    seen = {"audit.a": 68, "audit.b": 143, "dead": 152, "legacy": 240, "orders": 164, "work": 149}
    for name, n in seen.items():
        q = got[name]
        assert q.predicted_min <= n <= q.predicted_max, (name, n, q.to_dict())
        assert q.predicted_after_restart == n or name == "audit.b"
    crash = [f for f in report.findings if f.code == "store-crash"]
    assert crash and crash[0].severity == "warning"
    assert crash[0].details["triggers"]["remove"] == ["ttl"]
    assert set(crash[0].details["triggers"]["double-ack"]) == {"audit.a", "audit.b"}
    assert got["prio"].predicted_min == got["prio"].predicted_max == got["prio"].predicted_after_restart == 400
    table: dict[str, list[int]] = {}  # the queues table: one row per queue dir (priority level)
    for r in cqforensics.read_table(node, "queues", broker_version="4.0.5").to_pylist():
        if r["vhost"] == "/":
            t = table.setdefault(r["queue"], [0, 0])
            t[0], t[1] = t[0] + r["predicted_min"], t[1] + r["predicted_max"]
    assert table == {name: [q.predicted_min, q.predicted_max] for name, q in got.items()}


def _first_in(node, version: str, number: int) -> dict[str, int]:
    """Per queue of vhost /: how many messages the undamaged clean start delivers that come
    before the first one it delivers that msg_store_index.ets records in file ``number`` (seq
    order; no priority queue here): where a clean start reads it from."""
    ets = root_vhost(node) / "msg_store_persistent" / "msg_store_index.ets"
    where = {o[1]: o[3] for o in file2tab_load(ets.read_bytes())}
    rows = cqforensics.read_table(
        node,
        "messages",
        broker_version=version,
        columns=["vhost", "queue", "seq_id", "msg_id", "location", "survives_restart"],
    ).to_pylist()
    out: dict[str, int] = {}
    for q in {r["queue"] for r in rows if r["vhost"] == "/"}:
        mine = sorted((r for r in rows if r["vhost"] == "/" and r["queue"] == q), key=lambda r: r["seq_id"])
        cut = next(
            (
                r["seq_id"]
                for r in mine
                if r["survives_restart"] and r["location"] == "shared_store" and where.get(r["msg_id"]) == number
            ),
            None,
        )
        if cut is not None:
            out[q] = sum(1 for r in mine if r["seq_id"] < cut and r["survives_restart"])
    return out


def test_a_missing_older_store_file_loses_its_readers_from_there(tmp_path):
    """3.12.14's clean stop without its older 0.rdq: up to 3.12 a queue reads an older file
    itself, so each queue holding a message there crashes at every read of it and delivers
    exactly what precedes it (its restart asks the store, which still records the message);
    from 3.13 (bodies read in batches) at most that, none at least. The vhost does not crash."""
    node = copy_node("3.12.14-clean", tmp_path / "n")
    before = _first_in(node, "3.12.14", 0)
    before.pop("prio", None)  # a priority queue delivers its levels highest first: not seq order
    (root_vhost(node) / "msg_store_persistent" / "0.rdq").unlink()
    for version in ("3.12.14", "4.0.5"):
        report = fsck.run(node, broker_version=version)
        got = {q.queue: q for q in report.queues if q.vhost == "/"}
        assert before and all(got[q].crash == "queue" for q in before), version
        assert not any(q.crash == "vhost" for q in report.queues)
        for q, n in before.items():
            # (audit.a and audit.b share their messages: a double ack can crash the store, whose
            # dirty restart would deliver what is not in 0.rdq: a larger maximum)
            if version == "3.12.14":
                assert got[q].predicted_after_restart == n and got[q].predicted_min <= n <= got[q].predicted_max, q
                assert got[q].predicted_min == n or q.startswith("audit."), q
            else:
                assert got[q].predicted_min == 0 and got[q].predicted_max >= n, q


@pytest.mark.slow  # ~10 s: fsck of a 21 MB sample for two versions
def test_a_missing_current_store_file_crashes_the_vhost_up_to_3_12(tmp_path):
    """3.12.14's clean stop without its current (last) 1.rdq: up to 3.12 the store process
    reads the current file, crashes, and the vhost restarts dirty (a ``read`` store crash,
    certain); 4.0 reads it in the queue, which crashes alone."""
    node = copy_node("3.12.14-clean", tmp_path / "n")
    (root_vhost(node) / "msg_store_persistent" / "1.rdq").unlink()
    old = fsck.run(node, broker_version="3.12.14")
    assert {q.crash for q in old.queues if q.vhost == "/"} == {"vhost"}
    crash = [f for f in old.findings if f.code == "store-crash"]
    assert crash and crash[0].severity == "error" and "read" in crash[0].details["triggers"]
    new = fsck.run(node, broker_version="4.0.5")
    assert "vhost" not in {q.crash for q in new.queues}
