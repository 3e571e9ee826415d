"""The shared store's GC cut short by a kill (issue 14): a 3.10-3.12 file combine leaves
``N.rdt``, the tail of its destination file, which the next boot of those versions appends to
``N.rdq`` before a dirty recovery (rabbit_msg_store:recover_crashed_compactions); 3.13+ never
looks at it. The real-broker case (RabbitMQ 3.10.8 killed while it combines files, then booted)
is tests/real_brokers/test_requeue_brokers.py::test_kill_during_compaction_gives_no_error_and_an_exact_prediction;
the cases here are crafted from the 3.10.8 kill -9 sample, as do_combine_files leaves a file:
its live entries after some offset moved to ``N.rdt`` and ``N.rdq`` cut there."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import copy_node


def _messages(node: Path, version: str) -> dict:
    import cqforensics

    t = cqforensics.read_table(
        node, "messages", broker_version=version, columns=["queue", "seq_id", "survives_restart", "body"]
    ).to_pylist()
    return {(r["queue"], r["seq_id"]): (r["survives_restart"], r["body"]) for r in t}


def _combine_cut(node: Path, keep_entries: int) -> tuple[Path, Path]:
    """Move every entry of the biggest .rdq after its first ``keep_entries`` into its .rdt."""
    from cqforensics.readers import rdq as r_rdq

    rdq = max(node.glob("msg_stores/vhosts/*/msg_store_persistent/*.rdq"), key=lambda p: p.stat().st_size)
    f = r_rdq.walk(rdq, int(rdq.stem))
    assert len(f) > keep_entries + 10 and not f.holes
    cut = int(f.offsets[keep_entries])
    data = rdq.read_bytes()
    rdt = rdq.with_suffix(".rdt")
    rdt.write_bytes(data[cut:])
    rdq.write_bytes(data[:cut])
    return rdq, rdt


def _codes(node: Path, version: str):
    from cqforensics.commands import fsck

    report = fsck.run(node, broker_version=version)
    return report, {(f.code, f.severity, f.file) for f in report.findings}


@pytest.mark.parametrize("keep_entries", [0, 5])
def test_rdt_is_appended_to_its_rdq_up_to_312(tmp_path, keep_entries):
    """Crafted: every message whose bytes went to the .rdt is still delivered by 3.10-3.12."""
    before = _messages(copy_node("3.10.8-kill", tmp_path / "a"), "3.10.8")
    node = copy_node("3.10.8-kill", tmp_path / "b")
    rdq, rdt = _combine_cut(node, keep_entries)
    assert _messages(node, "3.10.8") == before
    report, codes = _codes(node, "3.10.8")
    assert ("combine-interrupted", "info", str(rdt)) in codes
    assert not [c for c in codes if c[1] == "error"], codes
    import cqforensics

    files = cqforensics.read_table(node, "files", columns=["file", "kind", "entries"]).to_pylist()
    rdt_rows = [r for r in files if r["file"] == str(rdt)]
    assert rdt_rows and rdt_rows[0]["kind"] == "rdt" and rdt_rows[0]["entries"] > 0


def test_rdt_makes_a_clean_stop_recover_dirty(tmp_path):
    """Crafted: after a clean stop an .rdt still makes 3.10-3.12 distrust file_summary and the
    store index (recover_crashed_compactions returns false)."""
    from cqforensics.discovery.nodes import read_node_dir
    from cqforensics.model import recovery
    from cqforensics.model.versions import model

    node = copy_node("3.10.8-clean", tmp_path / "a")
    rdq, rdt = _combine_cut(node, 3)
    v = next(v for v in read_node_dir(node).vhosts if "persistent" in v.stores and v.stores["persistent"].rdt)
    mode, why, path = recovery.clean_state(v, False, model("3.10.8"))
    assert (mode, path) == ("dirty", rdt) and "interrupted file combine" in why
    assert recovery.clean_state(v, False, model("4.0.5"))[0] == "clean"


def test_rdt_is_ignored_from_313(tmp_path):
    """Crafted: 3.13+ does not append it: the messages only it holds are missing."""
    node = copy_node("3.10.8-kill", tmp_path / "a")
    rdq, rdt = _combine_cut(node, 5)
    report, codes = _codes(node, "4.0.5")
    assert ("combine-interrupted", "info", str(rdt)) in codes
    assert any(c[0] == "msg-missing" and c[1] == "error" for c in codes)


def test_rdt_without_its_rdq_fails_the_boot(tmp_path):
    """Crafted: recover_crashed_compactions asserts the .rdq exists."""
    node = copy_node("3.10.8-kill", tmp_path / "a")
    rdq, rdt = _combine_cut(node, 5)
    rdq.unlink()
    _, codes = _codes(node, "3.10.8")
    assert ("combine-interrupted", "error", str(rdt)) in codes


def _drop_from_store(node: Path, ids: set[bytes]) -> None:
    """Rewrite the .rdq files without the entries of ``ids`` (what the store's GC does to
    messages whose last reference was removed)."""
    from cqforensics.readers import rdq as r_rdq

    for p in node.glob("msg_stores/vhosts/*/msg_store_persistent/*.rdq"):
        f = r_rdq.walk(p, int(p.stem))
        data = p.read_bytes()
        keep = [
            data[o : o + t]
            for o, t, i in zip(f.offsets.tolist(), f.totals.tolist(), f.msg_ids)
            if i.tobytes() not in ids
        ]
        p.write_bytes(b"".join(keep))


@pytest.mark.parametrize("where", ["head", "middle"])
def test_acked_head_gone_from_the_store_is_a_warning(tmp_path, where):
    """Crafted from the 3.10.8 kill -9 sample: the oldest messages of a queue gone from the store
    with no damage anywhere (acks that reached the store, not the index, before the kill) are
    one msg-missing warning; the same number gone from the middle of the queue is an error each."""
    import cqforensics

    node = copy_node("3.10.8-kill", tmp_path / "a")
    t = cqforensics.read_table(
        node, "messages", columns=["queue", "seq_id", "msg_id", "location", "survives_restart"]
    ).to_pylist()
    by_queue: dict[str, list] = {}
    for r in t:
        if r["location"] == "shared_store" and r["survives_restart"]:
            by_queue.setdefault(r["queue"], []).append(r)
    queue, rows = max(by_queue.items(), key=lambda kv: len(kv[1]))
    rows.sort(key=lambda r: r["seq_id"])
    assert len(rows) >= 6
    pick = rows[:3] if where == "head" else rows[2:5]
    _drop_from_store(node, {bytes(r["msg_id"]) for r in pick})
    report, _ = _codes(node, "3.10.8")
    missing = [f for f in report.findings if f.code == "msg-missing" and f.queue == queue]
    if where == "head":
        assert [(f.severity, f.details["entries"]) for f in missing] == [("warning", 3)], missing
    else:
        assert [f.severity for f in missing] == ["error"] * 3, missing
    q = next(v for v in report.queues if v.queue == queue)
    assert q.drops.get("body_missing") == 3


def test_rdt_read_in_shares_gives_the_whole_rows(tmp_path, monkeypatch):
    """Crafted: with an appended .rdt, a vhost read in message-id shares gives the rows of the
    whole read (tests/tables/test_shares.py does it for every sample, none of which holds one)."""
    from collections import Counter

    import cqforensics
    from cqforensics.model.vhost import VhostScan

    node = copy_node("3.10.8-kill", tmp_path / "a")
    _combine_cut(node, 5)

    def rows(table):
        t = cqforensics.read_table(node, table, broker_version="3.10.8", as_of=1_900_000_000_000)
        return Counter(repr(sorted(r.items())) for r in t.to_pylist())

    tables = ("messages", "store", "refcounts", "files")
    whole = {t: rows(t) for t in tables}
    monkeypatch.setattr(VhostScan, "shares", property(lambda self: 3))
    for t in tables:
        assert rows(t) == whole[t], t


def test_rdt_after_a_zero_extended_rdq_is_never_reached(tmp_path):
    """Crafted: killed after the combine extended N.rdq with zeros to its final size (before
    copying the .rdt back): 3.10's scan stops at the zeros, the appended entries are lost."""
    before = _messages(copy_node("3.10.8-kill", tmp_path / "a"), "3.10.8")
    node = copy_node("3.10.8-kill", tmp_path / "b")
    rdq, rdt = _combine_cut(node, 5)
    with rdq.open("r+b") as f:
        f.truncate(rdq.stat().st_size + rdt.stat().st_size)
    after = _messages(node, "3.10.8")
    lost = [k for k, v in before.items() if v[0] and not after[k][0]]
    assert lost and all(after[k] == v for k, v in before.items() if k not in lost), lost
    _, codes = _codes(node, "3.10.8")
    assert ("combine-interrupted", "error", str(rdt)) in codes


@pytest.mark.broker
@pytest.mark.parametrize("extended", [False, True])
def test_interrupted_combine_prediction_matches_the_real_310(tmp_path, broker_dir, extended):
    """Crafted from the 3.10.8 kill -9 sample as a combine leaves it (``extended``: also after it
    grew N.rdq with zeros to its final size), then booted by the real 3.10.8: every queue holds
    what fsck predicts (with ``extended``, the .rdt's messages are lost by the broker itself, as
    a real 3.10.8 killed at that moment of a combine lost 894 of 5,000)."""
    import time

    from brokers import Broker
    from cqforensics.commands import fsck
    from support import need_broker
    from support.live import list_counts

    need_broker("3.10.8")
    base = tmp_path / "a"
    node = copy_node("3.10.8-kill", base)
    rdq, rdt = _combine_cut(node, 5)
    if extended:
        with rdq.open("r+b") as f:
            f.truncate(rdq.stat().st_size + rdt.stat().st_size + 100)
    report = fsck.run(node, broker_version="3.10.8")
    # (queues with expired messages are left out: the broker lists them until they reach the head)
    predicted = {(v.vhost, v.queue): v.predicted_after_restart for v in report.queues if not v.drops.get("expired")}
    assert any(
        f.code == "combine-interrupted" and f.severity == ("error" if extended else "info") for f in report.findings
    )
    got = {}
    with Broker("3.10.8", broker_dir / "run") as b:
        b.install_node(base)
        b.start(timeout=300)
        time.sleep(2)
        for vhost in sorted({v for v, _ in predicted}):
            counts = list_counts(b, vhost)
            assert isinstance(counts, dict), counts
            got.update({(vhost, q): n for q, n in counts.items()})
        # no clean stop: leaving the block kills the broker (Broker.close), and nothing is read after it
    assert {k: got.get(k) for k in predicted} == predicted
