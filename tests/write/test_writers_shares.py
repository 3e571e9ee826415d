"""compact and rebuild of a vhost read in message-id shares, as every vhost whose store holds
more than ``model.store.ENTRIES_PER_SHARE`` messages is (so that memory stays bounded whatever
the store's size): the output is the one a read of the vhost whole writes, file for file and
byte for byte; the result is the same, and lost+found holds the same items (in another order:
each share's pass adds its own)."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from cqforensics.model.vhost import VhostScan
from cqforensics.write import compact, rebuild
from support import SAMPLES, copy_node
from support.damage import middle_third_of_biggest_rdq


def _tree(root: Path) -> dict:
    """Every file under the output but lost+found and the manifest (which says when it was
    written): relative path -> sha256."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "lost+found" not in p.parts and p.name != ".cqforensics-output.json"
    }


def _lost_found(root: Path) -> Counter:
    """lost+found's items, without their number and raw file name (the order they were found in)."""
    index = root / "lost+found" / "lost+found.jsonl"
    if not index.exists():
        return Counter()
    items = [json.loads(line) for line in index.read_text().splitlines()]
    return Counter(json.dumps({k: v for k, v in i.items() if k not in ("item", "raw")}, sort_keys=True) for i in items)


def _result(result, out: Path) -> dict:
    d = json.loads(json.dumps(result.to_dict()).replace(str(out), "OUT"))
    d["notes"] = sorted(d["notes"])
    d["restored_orphans"] = sorted(d["restored_orphans"], key=lambda r: (r["queue"], r["seq_id"]))
    return d


def _run(writer, src, out: Path, **kw):
    try:
        result = writer(src, out, **kw)
    except Exception as e:  # compact refuses damage: both reads must refuse it alike
        return ("refused", type(e).__name__, str(e).replace(str(out), "OUT"))
    return _result(result, out), _tree(out), _lost_found(out)


def _whole_and_shared(writer, src, tmp_path, monkeypatch, parts=3, **kw):
    whole = _run(writer, src, tmp_path / "whole", **kw)
    with monkeypatch.context() as m:
        m.setattr(VhostScan, "shares", property(lambda self: parts))
        shared = _run(writer, src, tmp_path / "shared", **kw)
    return whole, shared


CASES = [
    ("compact", "4.3.6-kill"),
    ("compact", "3.10.8-clean"),
    ("compact", "4.3.6-rolled"),
    ("rebuild", "4.3.6-kill"),
    ("rebuild", "3.10.8-kill"),
    ("rebuild", "3.12.14-clean"),
    ("rebuild", "4.0.5-proto-kill"),
    ("rebuild", "3.10.8-segments"),
]


@pytest.mark.parametrize("command, dataset", CASES, ids=[f"{c}-{d}" for c, d in CASES])
def test_a_rewrite_in_shares_writes_what_a_whole_read_writes(command, dataset, tmp_path, monkeypatch):
    writer = compact if command == "compact" else rebuild
    whole, shared = _whole_and_shared(writer, SAMPLES / dataset / "mnesia", tmp_path, monkeypatch)
    assert whole[1], "something must be written"
    assert shared == whole


@pytest.mark.parametrize("damage", ["zeroed", "garbage", "truncated"])
def test_rebuild_of_a_damaged_store_in_shares(damage, tmp_path, monkeypatch):
    """Crafted damage in the shared store: rebuild salvages, quarantines and counts the same."""
    src = tmp_path / "src"
    shutil.copytree(SAMPLES / "4.3.6-kill" / "mnesia", src, symlinks=True)
    node = next(p for p in src.iterdir() if p.is_dir())
    middle_third_of_biggest_rdq(node, damage)
    whole, shared = _whole_and_shared(rebuild, src, tmp_path, monkeypatch)
    assert whole[2], "the damage must put items in lost+found"
    assert shared == whole


def test_torn_entries_repaired_and_orphans_restored_in_shares(tmp_path, monkeypatch):
    """rebuild --restore-orphans, with an entry whose write marker alone is torn (crafted): the
    orphans come back into their queues in store order and the torn entry is written with a good
    marker, in shares as whole."""
    src = tmp_path / "src"
    node = copy_node("3.12.14-clean", src)
    import cqforensics

    rows = [
        r
        for r in cqforensics.read_table(node, "store", columns=["file", "offset", "total_size", "status"]).to_pylist()
        if r["status"] == "live"
    ]
    victim = rows[len(rows) // 2]
    path = Path(victim["file"].replace(str(SAMPLES / "3.12.14-clean" / "mnesia"), str(src)))
    data = bytearray(path.read_bytes())
    data[victim["offset"] + victim["total_size"] - 1] = 0
    path.write_bytes(bytes(data))
    for name in ("clean.dot", "file_summary.ets", "msg_store_index.ets"):
        (path.parent / name).unlink(missing_ok=True)
    whole, shared = _whole_and_shared(rebuild, src, tmp_path, monkeypatch, restore_orphans=["work", "orders", "legacy"])
    assert whole[0]["restored_orphans"] and any("write marker" in n for n in whole[0]["notes"])
    assert shared == whole


@pytest.mark.parametrize("kw", [{"threshold": 30}, {"broker_version": "3.12"}], ids=["threshold", "retarget"])
def test_compact_threshold_and_retarget_in_shares(kw, tmp_path, monkeypatch):
    """--threshold (files kept whole, known only once every share is in), and a target version
    whose store terms have another shape (each re-encoded term spilled as it is made)."""
    from cqforensics.write import salvage
    from support.damage import fragmented_copy

    fragmented_copy(tmp_path / "src")
    made = []
    store = salvage.Reterms.__setitem__
    monkeypatch.setattr(salvage.Reterms, "__setitem__", lambda self, k, v: (made.append(k), store(self, k, v)))
    whole, shared = _whole_and_shared(compact, tmp_path / "src", tmp_path, monkeypatch, **kw)
    if "threshold" in kw:
        assert {f["action"] for f in whole[0]["store_files"]} == {"kept", "rewritten"}
    else:
        assert len(made) > 20, "the target's store terms are re-encoded"
    assert shared == whole


def test_many_shares_and_a_share_with_nothing(tmp_path, monkeypatch):
    """More shares than the store has messages: most shares hold none."""
    whole, shared = _whole_and_shared(rebuild, SAMPLES / "4.3.6-clean" / "mnesia", tmp_path, monkeypatch, parts=64)
    assert shared == whole


@pytest.mark.parametrize("block", [1, 3, 1 << 16])
def test_store_keys_merge_a_file_at_a_time(block, monkeypatch):
    """The store entries of every share come back in key order, one source file per batch,
    whatever the read block (crafted keys: 7 shares, 40 files, some shares without a file)."""
    import numpy as np

    from cqforensics.write import salvage

    monkeypatch.setattr(salvage._StoreKeys, "BLOCK", block)
    rng = np.random.default_rng(5)
    keys = salvage._StoreKeys(7)
    everything = []
    for k in range(7):
        n = 0 if k == 3 else int(rng.integers(1, 200))
        files = rng.integers(0, 40 if k != 5 else 2, n)
        unique = np.unique(files * salvage._KEY + rng.integers(0, 1 << 24, n))  # sorted, as a share's are
        rec = np.zeros(len(unique), salvage.KEY_RECORD)
        rec["key"], rec["total"] = unique, unique % 997
        keys.put(k, rec)
        everything.append(rec)
    got = list(keys.by_file())
    keys.close()
    want = np.sort(np.concatenate(everything)["key"])
    assert np.array_equal(np.concatenate([g["key"] for g in got]), want)
    assert all(len(np.unique(g["key"] // salvage._KEY)) == 1 for g in got)
    assert len(got) == len(np.unique(want // salvage._KEY))
