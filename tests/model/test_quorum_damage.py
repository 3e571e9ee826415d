"""Damaged quorum queue files (tests/support/scenarios.py QUORUM_SCENARIOS on copies of the real
*-quorum-kill samples), without a broker: each damage is a finding naming the file and the
offset of the record or entry it struck, and the next boot's fate the recovery model gives
(model/recovery.py, model/quorum.py). tests/real_brokers/test_quorum_brokers.py boots the real brokers on the
same damaged copies and compares what they deliver with these predictions."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cqforensics.commands import fsck
from cqforensics.readers import ra_segment, ra_wal
from support import SAMPLES, manifest
from support.scenarios import QUORUM_SCENARIOS

KILL = ("3.10.8-quorum-kill", "4.0.5-quorum-kill", "4.3.6-quorum-kill")


def _damaged(ds: str, scenario: str, tmp_path: Path):
    """(node dir of a damaged copy, fsck report of it, what the damage did)."""
    base = tmp_path / "m"
    shutil.copytree(SAMPLES / ds / "mnesia", base, symlinks=True)
    node = base / Path(manifest(ds)["node_dir"]).name
    what = QUORUM_SCENARIOS[scenario](node)
    return node, fsck.run(node, as_of=manifest(ds)["restarted_at_ms"]), what


def _wal(node: Path) -> Path:
    return max((node / "quorum" / node.name).glob("*.wal"), key=lambda p: int(p.stem))


def _record_at(wal: Path, pos: int) -> int:
    """The offset of the record of the healthy WAL whose bytes hold ``pos``."""
    scan = ra_wal.walk(wal)
    return next(int(scan.offset[i]) for i in range(len(scan)) if int(scan.offset[i]) <= pos < scan.record_end(i))


def _quorum(report, code: str):
    return [f for f in report.findings if f.code == code]


@pytest.mark.parametrize("ds", KILL)
@pytest.mark.parametrize("scenario", ["wal_torn", "wal_zeroed_tail"])
def test_a_lost_wal_tail_is_found_at_the_record_it_cuts(ds, scenario, tmp_path):
    healthy = _wal(SAMPLES / ds / "mnesia" / Path(manifest(ds)["node_dir"]).name)
    cut = healthy.stat().st_size * 6 // 10
    node, report, _ = _damaged(ds, scenario, tmp_path)
    lost = [f for f in _quorum(report, "quorum-wal-entries-lost") if f.file and f.file.endswith(".wal")]
    assert len(lost) == 1 and lost[0].severity == "warning"
    assert lost[0].file == str(_wal(node)) and lost[0].offset == _record_at(healthy, cut)
    # zeros from the middle of a record: that record fails its checksum with zeros after it, which
    # Ra forgives as the last record (is_last_record/2)
    assert lost[0].details["stop"] == ("torn" if scenario == "wal_torn" else "bad_checksum_forgiven")
    assert report.nodes[0].boot == "ok"


@pytest.mark.parametrize("ds", KILL)
def test_a_bad_checksum_inside_the_wal_keeps_the_node_down(ds, tmp_path):
    """wal_checksum_validation_failure: the Ra system of quorum queues, then RabbitMQ, exits."""
    node, report, what = _damaged(ds, "wal_bad_checksum", tmp_path)
    pos = int(what.split("[")[1].rstrip("]"))
    refused = _quorum(report, "quorum-wal-refused")
    assert len(refused) == 1 and refused[0].severity == "error"
    assert refused[0].file == str(_wal(node)) and refused[0].offset == _record_at(_wal(node), pos)
    assert report.nodes[0].boot == "hangs" and report.exit_code == 4
    assert {q.crash for q in report.queues} == {"node"}
    assert all(q.predicted_after_restart == 0 for q in report.queues)
    assert {k for q in report.queues for k in q.drops} == {"boot_hang"}  # classic and quorum alike


@pytest.mark.parametrize("ds", KILL)
def test_a_bad_checksum_on_the_last_record_drops_that_record_only(ds, tmp_path):
    node, report, _ = _damaged(ds, "wal_bad_last_record", tmp_path)
    scan = ra_wal.walk(_wal(node))
    (f,) = [f for f in _quorum(report, "quorum-wal-entries-lost") if f.file and f.file.endswith(".wal")]
    assert f.offset == int(scan.offset[len(scan) - 1]) and f.details["stop"] == "bad_checksum_forgiven"
    m = manifest(ds)
    for q in report.queues:  # the last record is a late ack or a noop: every queue delivers what it did
        want = next(x for x in m["queues"] if x["name"] == q.queue)
        assert q.predicted_after_restart == len(want["messages"]), q.queue


def test_a_segment_entry_failing_its_crc_crashes_the_queue_and_keeps_its_messages_listed(tmp_path):
    """4.0.5 (Ra 2.14: segment_compute_checksums on): the server crashes reading the entry; the
    messages table still lists every message the files hold (an enqueue past the damaged one
    is not taken for an out-of-sequence publish)."""
    ds = "4.0.5-quorum-kill"
    node, report, what = _damaged(ds, "segment_bad_crc", tmp_path)
    pos = int(what.split("[")[1].rstrip("]"))
    (f,) = _quorum(report, "quorum-segment-damaged")
    seg = ra_segment.read_segment(Path(f.file))
    i = next(i for i in range(len(seg)) if int(seg.offset[i]) <= pos < int(seg.offset[i]) + int(seg.length[i]))
    assert f.severity == "error" and f.offset == int(seg.offset[i]) and f.details["raft_index"] == int(seg.index[i])
    v = next(q for q in report.queues if q.queue == "qq.orders")
    assert v.crash == "queue" and v.drops == {"queue_crash": 14}


def test_a_missing_segment_is_a_gap_the_boot_skips_silently(tmp_path):
    """4.0.5, the middle segment of qq.orders deleted (its index records hold entries 1024-2047):
    Ra reads only the segments present, so the queue comes up without them; the publisher's later
    enqueues are out of sequence and refused, so the queue is empty (seen: 0 delivered, no crash).
    The messages table still lists the 14 its files hold, lost."""
    node, report, _ = _damaged("4.0.5-quorum-kill", "segment_missing", tmp_path)
    (f,) = _quorum(report, "quorum-log-gap")
    assert f.queue == "qq.orders" and f.file.endswith("2F_QQODL5XGJ7H8KLC") and f.details["ranges"] == [[1024, 2047]]
    v = next(q for q in report.queues if q.queue == "qq.orders")
    assert v.crash is None and v.predicted_after_restart == 0 and v.drops == {"log_lost": 14}


def test_a_truncated_segment_is_found_at_the_entry_it_cuts(tmp_path):
    node, report, what = _damaged("4.0.5-quorum-kill", "segment_truncated", tmp_path)
    (f,) = _quorum(report, "quorum-segment-damaged")
    assert f.file.endswith("00000003.segment") and f.offset is not None and f.offset < int(what.split()[-1])


@pytest.mark.parametrize("ds", ["3.10.8-quorum-kill", "4.3.6-quorum-kill"])
def test_a_damaged_snapshot_is_found_and_deleted_by_the_boot(ds, tmp_path):
    node, report, _ = _damaged(ds, "snapshot_damaged", tmp_path)
    (f,) = _quorum(report, "quorum-snapshot-damaged")
    assert f.file.endswith("snapshot.dat") and f.offset == 0 and f.queue == "qq.orders"


def test_a_lost_wal_tail_leaves_a_queue_with_nothing_a_new_member_without_leader(tmp_path):
    """4.3.6, WAL cut at 60%: qq.orders restarts from its snapshot; the three queues declared later
    lose every entry, and Ra takes each for a new member (ra_server:is_new/1) that waits for an
    election nobody calls (seen: basic.get times out on each)."""
    node, report, _ = _damaged("4.3.6-quorum-kill", "wal_torn", tmp_path)
    crash = {q.queue: q.crash for q in report.queues if q.queue.startswith("qq.")}
    assert crash == {"qq.amo": "queue", "qq.dead": "queue", "qq.orders": None, "qq.work": "queue"}
    assert sorted(f.queue for f in _quorum(report, "quorum-queue-unavailable")) == ["qq.amo", "qq.dead", "qq.work"]


@pytest.mark.parametrize("ds", KILL)
def test_meta_dets_lost_replays_every_at_most_once_dead_letter(ds, tmp_path):
    """meta.dets gone: every server's last applied index is 0, so the boot applies the whole log
    again and republishes every at-most-once dead letter of it (qq.amo's two) into cq.dead. In
    the 3.10.8 and 4.0.5 samples the kill left them above the last applied index already (cq.dead's
    index holds none: the boot publishes them either way); in the 4.3.6 one cq.dead's index holds
    the first two copies, so the boot adds two (seen on 4.3.6: 4 delivered)."""
    node, report, _ = _damaged(ds, "meta_missing", tmp_path)
    dead = {r.queue: r.predicted_after_restart for r in report.queues}["cq.dead"]
    assert dead == {"3.10.8": 2, "4.0.5": 2, "4.3.6": 4}[ds.split("-")[0]]
