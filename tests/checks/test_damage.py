"""Damaged copies of the samples: every reader keeps going, and the damage is reported with its
file and offset (a finding, a hole, or the drop reason of the messages it costs)."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import pytest

import cqforensics
from support import SAMPLES, copy_node, damage

TARGETS = {  # file kind -> glob inside a node dir
    "qi": "msg_stores/vhosts/*/queues/*/*.qi",
    "qs": "msg_stores/vhosts/*/queues/*/*.qs",
    "rdq": "msg_stores/vhosts/*/msg_store_persistent/*.rdq",
    "idx": "msg_stores/vhosts/*/queues/*/*.idx",
    "jif": "msg_stores/vhosts/*/queues/*/journal.jif",
    "ets": "msg_stores/vhosts/*/msg_store_persistent/*.ets",
    "dot": "msg_stores/vhosts/*/msg_store_persistent/clean.dot",
    "dets": "msg_stores/vhosts/*/recovery.dets",
    "queue_name": "msg_stores/vhosts/*/queues/*/.queue_name",
    "vhost": "msg_stores/vhosts/*/.vhost",
    "config": "msg_stores/vhosts/*/.config",
    "mnesia": "*.LOG",
    "khepri": "coordination/*/*.wal",
}
SOURCES = {
    "3.10.8-clean": ("qi", "qs", "rdq", "idx", "jif", "ets", "dot", "dets", "queue_name", "vhost", "config", "mnesia"),
    "4.3.6-kill": ("qi", "qs", "rdq", "queue_name", "khepri"),
}
CASES = [(ds, kind, dmg) for ds, kinds in SOURCES.items() for kind in kinds for dmg in damage.KINDS]


def read_everything(node: Path, **kw) -> dict:
    return {t: cqforensics.read_table(node, t, **kw) for t in cqforensics.TABLES}


@pytest.mark.parametrize("dataset, kind, dmg", CASES, ids=[f"{d}-{k}-{m}" for d, k, m in CASES])
def test_no_reader_crashes_on_damage(dataset, kind, dmg, tmp_path):
    node = copy_node(dataset, tmp_path / "mnesia")
    rnd = random.Random(f"{dataset}{kind}{dmg}")
    targets = sorted(node.glob(TARGETS[kind]))
    assert targets, f"the sample has no {kind} file"
    for path in rnd.sample(targets, min(3, len(targets))):
        damage.apply(dmg, path, rnd)
    tables = read_everything(node)
    assert tables["queues"].num_rows > 0
    for t in ("messages", "index", "store"):
        assert tables[t].schema == cqforensics.schema(t)


def _rows(node, table, **kw):
    return cqforensics.read_table(node, table, **kw).to_pylist()


def _findings(node):
    return [(f["code"], Path(f["file"]).name if f["file"] else None, f["offset"]) for f in _rows(node, "findings")]


def _largest_rdq(node: Path) -> Path:
    return max(node.glob(TARGETS["rdq"]), key=lambda p: p.stat().st_size)


def _entries(node: Path, path: Path):
    return [
        r
        for r in _rows(node, "store", columns=["file", "offset", "total_size", "msg_id", "status"])
        if r["file"] == str(path)
    ]


def test_rdq_zeroed_range_is_a_hole_and_costs_the_old_scanner_what_follows(tmp_path):
    node = copy_node("3.10.8-kill", tmp_path / "mnesia")
    rdq = _largest_rdq(node)
    entries = _entries(node, rdq)
    victim = entries[3]
    damage.zero(rdq, victim["offset"], victim["total_size"])
    holes = [h for h in _rows(node, "holes") if h["file"] == str(rdq) and h["kind"] == "zeroed"]
    assert [(h["offset"], h["length"]) for h in holes] == [(victim["offset"], victim["total_size"])]
    after = {e["msg_id"] for e in entries[4:]}
    # 3.13.1+ resynchronises past the zeros; <= 3.13.0 stops there and loses everything after it
    new = {r["msg_id"]: r["drop_reason"] for r in _rows(node, "messages", broker_version="4.3") if r["msg_id"] in after}
    old = {
        r["msg_id"]: r["drop_reason"] for r in _rows(node, "messages", broker_version="3.10") if r["msg_id"] in after
    }
    assert new and all(reason != "body_unreachable" for reason in new.values())
    assert {old[m] for m in new if new[m] is None} == {"body_unreachable"}


def test_rdq_truncated_tail_and_junk_are_findings_at_their_offsets(tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    rdq = _largest_rdq(node)
    entries = _entries(node, rdq)
    last = entries[-1]
    damage.truncate(rdq, last["offset"] + last["total_size"] - 5)
    mid = entries[2]
    damage.junk(rdq, mid["offset"], 40)
    f = _findings(node)
    assert ("rdq-truncated", rdq.name, last["offset"]) in f
    assert ("rdq-garbage", rdq.name, mid["offset"]) in f
    by_id = {r["msg_id"]: r for r in _rows(node, "messages")}
    assert by_id[last["msg_id"]]["drop_reason"] == "body_missing"
    assert by_id[entries[3]["msg_id"]]["survives_restart"] is True  # the scan resumed after the junk


def test_a_torn_store_entry_is_a_loss_only_when_no_intact_copy_survives(tmp_path):
    """Crafted: three entries without their 255 write marker (every version's scan skips them). A
    torn copy of a live message, as a kill during a combine or compaction leaves in its
    destination, is a warning naming the copy the next boot uses; so is a torn entry of an id no
    index refers to; a live message's only copy torn is an error."""
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    rdq = _largest_rdq(node)
    live = [e for e in _entries(node, rdq) if e["status"] == "live"]
    copied, only = live[0], live[1]
    data = rdq.read_bytes()
    torn_copy = data[copied["offset"] : copied["offset"] + copied["total_size"] - 1] + b"\0"
    at = rdq.stat().st_size  # after the file's last entry, where the walk's chain reaches it
    other = copy_node("4.3.6-kill", tmp_path / "other") / rdq.relative_to(node)
    with rdq.open("ab") as f:
        f.write(torn_copy)
    with other.open("ab") as f:
        f.write(torn_copy[:8] + bytes(range(16)) + torn_copy[24:])  # an id nothing refers to
    damage.flip(rdq, only["offset"] + only["total_size"] - 1)

    def torn(node):
        return {f["offset"]: f for f in _rows(node, "findings") if f["code"] == "msg-corrupt"}

    got = torn(node)
    assert set(got) == {at, only["offset"]}
    assert got[at]["severity"] == "warning" and "the next boot uses its intact copy" in got[at]["message"]
    assert json.loads(got[at]["details"])["copy_offset"] == copied["offset"]
    assert got[only["offset"]]["severity"] == "error"
    unreferenced = torn(other.parents[4])
    assert list(unreferenced) == [at] and unreferenced[at]["severity"] == "warning"
    by_id = {r["msg_id"]: r for r in _rows(node, "messages")}
    assert by_id[copied["msg_id"]]["survives_restart"] is True
    assert by_id[only["msg_id"]]["survives_restart"] is False


def test_rdq_flipped_body_byte_gives_a_decode_error_row(tmp_path):
    node = copy_node("4.3.6-clean", tmp_path / "mnesia")
    rdq = _largest_rdq(node)
    e = _entries(node, rdq)[1]
    damage.flip(rdq, e["offset"] + 25)  # the term's first tag byte, after the 131 version byte
    row = next(r for r in _rows(node, "messages") if r["msg_id"] == e["msg_id"])
    assert row["decode_error"] and row["body"] is None
    assert row["store_offset"] == e["offset"]


def _qi_with_live(node: Path, loc: int | None = None) -> tuple[Path, int]:
    """A .qi file and the offset of a live slot (optionally with a given location kind)."""
    for qi in sorted(node.glob(TARGETS["qi"])):
        data = qi.read_bytes()
        for off in range(64, len(data) - 31, 32):
            if data[off] == 1 and data[off + 1] == 1 and (loc is None or data[off + 3] == loc):
                return qi, off
    raise AssertionError("no live slot")


def test_qi_bad_header_deletes_the_segment(tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    qi, _ = _qi_with_live(node)
    damage.zero(qi, 0, 8)
    assert ("qi-bad-header", qi.name, 0) in _findings(node)
    rows = [r for r in _rows(node, "messages") if r["file"] == str(qi)]
    assert rows and {r["drop_reason"] for r in rows} == {"segment_deleted"}


def test_qi_reserved_bit_is_a_bad_entry_at_its_slot(tmp_path):
    node = copy_node("4.0.5-kill", tmp_path / "mnesia")
    qi, off = _qi_with_live(node)
    damage.flip(qi, off + 1, 0x04)  # a reserved flag bit
    assert ("qi-bad-entry", qi.name, off) in _findings(node)
    row = next(r for r in _rows(node, "messages") if r["file"] == str(qi) and r["offset"] == off)
    assert row["drop_reason"] == "bad_index_entry"
    idx = next(r for r in _rows(node, "index") if r["file"] == str(qi) and r["offset"] == off)
    assert idx["kind"] == "bad" and "reserved" in idx["error"]


def test_qi_truncated_mid_slot(tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    qi, off = _qi_with_live(node)
    damage.truncate(qi, off + 10)
    assert ("qi-bad-entry", qi.name, off) in _findings(node)


def test_qs_crc_and_missing_file_drop_the_message(tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    qi, off = _qi_with_live(node, loc=2)
    data = qi.read_bytes()
    qs_off, qs_size = struct.unpack_from(">QI", data, off + 4)
    qs = qi.with_suffix(".qs")
    damage.flip(qs, qs_off + 8 + qs_size // 2)
    row = next(r for r in _rows(node, "messages") if r["file"] == str(qi) and r["offset"] == off)
    assert row["drop_reason"] == "qs_bad_crc" and row["store_offset"] == qs_off
    assert ("qs-entry-crc", qs.name, qs_off) in _findings(node)
    damage.remove(qs)
    rows = [r for r in _rows(node, "messages") if r["file"] == str(qi) and r["location"] == "queue_store"]
    assert {r["drop_reason"] for r in rows} == {"qs_missing_file"}
    assert ("qs-entry-missing", qs.name, None) in _findings(node)


@pytest.mark.parametrize("insert", [b"\0" * 100, b"\x01\x83junk\x83\0\0" * 7, b"\0" * 50 + b"xyz", b"\0" * 3])
def test_qs_scan_finds_every_entry_after_zeros_or_garbage(insert):
    """crafted: bytes inserted between two entries of a real 4.3.6 segment. The scan that works
    without the .qi (dump, trailing-garbage check) must find the entry right after them, even
    though its header starts with zero bytes that a zero run's skip would step over."""
    from cqforensics.readers.qs import first_entry_offset, scan_entries

    qs = max((SAMPLES / "4.3.6-clean" / "mnesia").rglob("*.qs"), key=lambda p: p.stat().st_size).read_bytes()
    entries = [e for e in scan_entries(qs, first_entry_offset()) if e[0] == "entry"]
    assert len(entries) >= 4
    at = entries[3][1]
    data = qs[:at] + insert + qs[at:]
    found = list(scan_entries(data, first_entry_offset()))
    assert [e[1] for e in found if e[0] == "entry"] == [o if o < at else o + len(insert) for _, o, *_ in entries]
    assert [e for e in found if e[0] == "gap"] == [("gap", at, at + len(insert), not insert.strip(b"\0"))]


def test_v1_segment_and_journal_damage(tmp_path):
    node = copy_node("3.10.8-clean", tmp_path / "mnesia")
    idx = max(node.glob(TARGETS["idx"]), key=lambda p: p.stat().st_size)
    size = idx.stat().st_size
    damage.truncate(idx, size - 3)
    codes = [c for c, name, _ in _findings(node) if name == idx.name]
    assert "v1-segment-truncated" in codes
    node2 = copy_node("3.10.8-kill", tmp_path / "mnesia2")
    jif = max(node2.glob(TARGETS["jif"]), key=lambda p: p.stat().st_size)
    damage.truncate(jif, jif.stat().st_size - 7)
    f = [(c, o) for c, name, o in _findings(node2) if name == jif.name]
    assert f and f[0][0] == "v1-journal-torn"


def test_missing_queue_name_is_named_from_the_metadata(tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    qn = next(p for p in node.glob(TARGETS["queue_name"]) if b"jobs.prio" in p.read_bytes())
    level = qn.read_bytes().split(b"\x00")[-1]
    damage.remove(qn)
    q = next(r for r in _rows(node, "queues") if r["queue_dir"] == str(qn.parent))
    assert (q["queue"], q["priority"], q["name_source"]) == ("jobs.prio", level[0], "metadata")
    assert ("missing-queue-name", ".queue_name", None) in _findings(node)


def test_unreadable_input_is_an_operational_error(tmp_path):
    with pytest.raises(cqforensics.OperationalError, match="no RabbitMQ node directory"):
        cqforensics.read_table(tmp_path, "messages")
    with pytest.raises(cqforensics.OperationalError, match="no such file"):
        cqforensics.read_table(tmp_path / "nope", "messages")
