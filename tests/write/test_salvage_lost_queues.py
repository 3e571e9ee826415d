"""Issue 13: lost queues are named (``queue-index-missing``), writers give them back their empty
dir, and the ``store`` table says ``duplicate`` only of an id stored more than once.

Damage is made on copies of real-broker samples: a durable queue's index dir deleted, as by hand
or with a disk; a zeroed range in a shared-store file (3.10's scanner stops at it)."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

import cqforensics
from cqforensics.codecs import textfiles
from cqforensics.commands.fsck import run as fsck_run
from cqforensics.discovery import nodes as layout
from cqforensics.model.vhost import lost_queues
from cqforensics.readers.metadata import Metadata, QueueRecord, read_metadata
from support import copy_node, damage, dataset_params

ROOT_VHOST = textfiles.vhost_dir_name(b"/")


def _queue_dir(node: Path, vhost: bytes, name: bytes) -> Path:
    return (
        node
        / "msg_stores"
        / "vhosts"
        / textfiles.vhost_dir_name(vhost)
        / "queues"
        / textfiles.queue_dir_name(vhost, name)
    )


def _lost(report, code="queue-index-missing"):
    return [f for f in report.findings if f.code == code]


@pytest.mark.parametrize(
    "dataset, kind",
    [("3.10.8-kill", "mnesia"), ("3.12.14-clean", "mnesia"), ("4.2.2-clean", "khepri"), ("4.3.6-kill", "khepri")],
)
def test_deleted_queue_dir_is_named_with_an_error_and_exit_4(dataset, kind, tmp_path):
    from cli.main import main

    node = copy_node(dataset, tmp_path / "mnesia")
    assert read_metadata(node).kind == kind
    victim = _queue_dir(node, b"/", b"audit.a")
    assert victim.is_dir()
    shutil.rmtree(victim)
    report = fsck_run([node])
    (f,) = _lost(report)
    assert f.severity == "error" and f.queue == "audit.a" and f.vhost == "/"
    assert f.file == str(victim) and f.details["dirs"] == [victim.name] and f.details["why"] == ["missing"]
    assert f.details["orphans_in_store"] >= 0 and "orphan_bytes" in f.details
    assert report.exit_code == 4
    assert main(["fsck", str(node)]) == 4
    # the other queues are untouched: only this one is named
    assert {x.queue for x in _lost(report)} == {"audit.a"}


def test_lost_queue_counts_the_orphans_that_could_be_its_own(tmp_path):
    """4.2.2 clean stop: queue work's large messages are in the shared store; with its index gone
    they become orphans (those no other queue holds), and the clean shutdown's
    msg_store_index.ets still counts the references its index held."""
    node = copy_node("4.2.2-clean", tmp_path / "mnesia")
    store = cqforensics.read_table(node, "store", columns=["vhost", "store", "msg_id", "status"]).to_pylist()
    before = sum(r["status"] == "orphan" for r in store if r["vhost"] == "/" and r["store"] == "persistent")
    msgs = cqforensics.read_table(node, "messages", columns=["vhost", "queue", "location", "msg_id"]).to_pylist()
    own = {m["msg_id"] for m in msgs if m["queue"] == "work" and m["location"] == "shared_store"}
    others = {m["msg_id"] for m in msgs if m["queue"] != "work" and m["vhost"] == "/"}
    assert len(own - others) > 50
    shutil.rmtree(_queue_dir(node, b"/", b"work"))
    (f,) = _lost(fsck_run([node]))
    assert f.queue == "work"
    assert f.details["orphans_in_store"] == before + len(own - others)
    assert f.details["recorded_refs_not_held"] == len(own)


def test_a_missing_priority_level_dir_is_named(tmp_path):
    node = copy_node("3.10.8-kill", tmp_path / "mnesia")
    level = _queue_dir(node, b"/", textfiles.priority_queue_name(b"jobs.prio", 2))
    shutil.rmtree(level)
    (f,) = _lost(fsck_run([node]))
    assert f.queue == "jobs.prio" and f.details["levels_missing"] == [2] and f.details["dirs"] == [level.name]


def test_a_file_in_place_of_the_dir_is_unreadable(tmp_path):
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    victim = _queue_dir(node, b"/", b"audit.b")
    shutil.rmtree(victim)
    victim.write_bytes(b"not a dir")
    (f,) = _lost(fsck_run([node]))
    assert f.queue == "audit.b" and f.details["why"] == ["not a directory"]


def test_a_deleted_vhost_dir_names_its_queues(tmp_path):
    node = copy_node("4.2.2-clean", tmp_path / "mnesia")
    shutil.rmtree(node / "msg_stores" / "vhosts" / textfiles.vhost_dir_name(b"prod"))
    (f,) = _lost(fsck_run([node]))
    assert f.queue == "payments" and f.details["queue_vhost"] == "prod" and f.details["why"] == ["its vhost has no dir"]


@pytest.mark.parametrize("dataset", dataset_params())
def test_no_sample_has_a_lost_queue(dataset):
    from support import SAMPLES

    for node in layout.discover([SAMPLES / dataset / "mnesia"]):
        assert lost_queues(node, read_metadata(node.path)) == []


def test_queues_homed_on_another_cluster_node_are_not_lost(tmp_path):
    node = layout.discover([copy_node("4.3.6-kill", tmp_path / "mnesia")])[0]
    meta = read_metadata(node.path)
    elsewhere = QueueRecord(b"/", b"on.other.node", True, [], "rabbit_classic_queue", "test", "rabbit@other")
    here = QueueRecord(b"/", b"lost.here", True, [], "rabbit_classic_queue", "test", node.path.name)
    quorum = QueueRecord(b"/", b"a.quorum", True, [], "rabbit_quorum_queue", "test", node.path.name)
    meta.queues.update({(r.vhost, r.name): r for r in (elsewhere, here, quorum)})
    assert [lq.name for lq in lost_queues(node, meta)] == [b"lost.here"]
    assert lost_queues(node, Metadata(None)) == []


@pytest.mark.parametrize("dataset", ["3.10.8-kill", "4.2.2-clean"])
def test_rebuild_gives_the_lost_queue_an_empty_dir_and_verifies(dataset, tmp_path):
    from cqforensics.write.salvage import rebuild

    node = copy_node(dataset, tmp_path / "mnesia")
    victim = _queue_dir(node, b"/", b"audit.a")
    shutil.rmtree(victim)
    out = tmp_path / "out"
    result = rebuild(tmp_path / "mnesia", out)
    assert result.verified
    assert any("audit.a" in n and "no index dir" in n for n in result.notes)
    written = out / node.name / victim.relative_to(node)
    assert sorted(p.name for p in written.iterdir()) == [".queue_name"]
    assert textfiles.parse_queue_name(written.joinpath(".queue_name").read_bytes(), b"/").name == b"audit.a"
    assert not _lost(fsck_run([out]))


# -- exact labels ------------------------------------------------------------------------------------


def test_duplicate_only_for_an_id_stored_more_than_once(tmp_path):
    """3.10.8 stops its store scan at a zeroed range: the referenced entries after it are
    unreachable (their messages say ``body_unreachable``), yet each is stored once, so none is a
    ``duplicate``; export --all does not emit them a second time as store rows."""
    node = copy_node("3.10.8-kill", tmp_path / "mnesia")
    rdq = max(node.glob("msg_stores/vhosts/*/msg_store_persistent/*.rdq"), key=lambda p: p.stat().st_size)
    cols = ["file", "offset", "total_size", "msg_id", "status"]
    entries = [r for r in cqforensics.read_table(node, "store", columns=cols).to_pylist() if r["file"] == str(rdq)]
    victim = entries[3]
    damage.zero(rdq, victim["offset"], victim["total_size"])
    msgs = cqforensics.read_table(
        node, "messages", columns=["msg_id", "drop_reason"], broker_version="3.10"
    ).to_pylist()
    unreachable = {m["msg_id"] for m in msgs if m["drop_reason"] == "body_unreachable"}
    assert unreachable
    store = cqforensics.read_table(node, "store", columns=cols, broker_version="3.10").to_pylist()
    copies = Counter(r["msg_id"] for r in store)
    for r in store:
        if r["status"] == "duplicate":
            assert copies[r["msg_id"]] > 1, r
    by_id = {r["msg_id"]: r["status"] for r in store}
    assert {by_id[i] for i in unreachable if copies[i] == 1} == {"live"}
    referenced = {m["msg_id"] for m in msgs}
    assert all(
        r["status"] == "orphan"
        for r in store
        if copies[r["msg_id"]] == 1 and r["msg_id"] not in referenced and r["status"] != "corrupt"
    )


def test_duplicate_labels_on_every_sample(dataset):
    from support import SAMPLES

    store = cqforensics.read_table(SAMPLES / dataset / "mnesia", "store", columns=["node", "vhost", "msg_id", "status"])
    rows = store.to_pylist()
    copies = Counter((r["node"], r["vhost"], r["msg_id"]) for r in rows)
    assert all(copies[(r["node"], r["vhost"], r["msg_id"])] > 1 for r in rows if r["status"] == "duplicate")


# -- a renamed queue dir -------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset, queue", [("4.3.6-kill", b"audit.c"), ("3.10.8-kill", b"orders.v1")])
def test_renamed_queue_dir_is_lost_at_boot_and_written_back_by_rebuild(dataset, queue, tmp_path):
    """A queue dir renamed (its .queue_name whole): the broker deletes it as no durable queue's
    dir and boots the queue empty; fsck says both, rebuild writes the index back as the queue's
    own dir, and the output verifies and holds the queue's messages."""
    from cqforensics.write.salvage import compact, rebuild

    node = copy_node(dataset, tmp_path / "mnesia")
    cols = ["vhost", "queue", "seq_id", "msg_id", "body", "drop_reason"]
    before = [
        r
        for r in cqforensics.read_table(node, "messages", columns=cols).to_pylist()
        if r["queue"] == queue.decode() and r["drop_reason"] is None
    ]
    assert before
    own = _queue_dir(node, b"/", queue)
    moved = own.with_name("RENAMEDQUEUEDIR0000000000")
    own.rename(moved)
    report = fsck_run([node])
    (lost,) = _lost(report)
    assert lost.queue == queue.decode() and lost.details["renamed_dirs"] == [moved.name]
    unknown = [f for f in report.findings if f.code == "unknown-queue"]
    assert [f.file for f in unknown if f.queue == queue.decode()] == [str(moved)]
    after = [
        r for r in cqforensics.read_table(node, "messages", columns=cols).to_pylist() if r["queue"] == queue.decode()
    ]
    assert {r["drop_reason"] for r in after} == {"queue_deleted"} and len(after) >= len(before)
    queues = {r["queue_dir"]: r for r in cqforensics.read_table(node, "queues").to_pylist()}
    assert queues[str(moved)]["name_source"] == "renamed" and queues[str(moved)]["durable_known"] is False

    result = rebuild(tmp_path / "mnesia", tmp_path / "out")
    assert result.verified and any(moved.name in n for n in result.notes)
    out_node = tmp_path / "out" / node.name
    assert (out_node / own.relative_to(node)).is_dir() and not (out_node / moved.relative_to(node)).exists()
    got = [
        r
        for r in cqforensics.read_table(out_node, "messages", columns=cols).to_pylist()
        if r["queue"] == queue.decode()
    ]
    assert [(r["msg_id"], r["body"]) for r in got] == [(r["msg_id"], r["body"]) for r in before]
    assert all(r["drop_reason"] is None for r in got)
    # compact keeps what the next boot keeps: the queue, empty, and verifies
    result = compact(tmp_path / "mnesia", tmp_path / "compacted")
    assert result.verified
    out_node = tmp_path / "compacted" / node.name
    assert sorted(p.name for p in (out_node / own.relative_to(node)).iterdir()) == [".queue_name"]
