"""compact --threshold PCT (borg's): only the shared-store files whose garbage ratio is above PCT
are rewritten; the others are copied whole (their orphans stay), new files are numbered above
them, the output verifies and a real broker boots it and delivers what the original does."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from test_cli import run

from support import SAMPLES

DATASET = "4.3.6-clean"
VHOST = "628WB79CIFDYO9LJI6DKMI09L"


def fragmented_copy(dest):
    """A copy of the 4.3.6-clean sample whose biggest vhost store is split over two files: 0.rdq
    with about 60% of its bytes orphans (copies of entries under fresh ids, as acked messages
    leave them) and 1.rdq with about 10%. The clean-shutdown files of that store are removed (they
    record the old locations), so the next boot rebuilds its index, as after a kill -9."""
    import cqforensics
    from cqforensics.grammar import rdq as c_rdq
    from cqforensics.readers import rdq as r_rdq

    shutil.copytree(SAMPLES / DATASET / "mnesia", dest, symlinks=True)
    store = dest / "rabbit@localhost" / "msg_stores" / "vhosts" / VHOST / "msg_store_persistent"
    data = (store / "0.rdq").read_bytes()
    live = {
        (r["offset"], r["total_size"])
        for r in cqforensics.read_table(
            SAMPLES / DATASET / "mnesia", table="store", columns=["file", "offset", "total_size", "status"]
        ).to_pylist()
        if r["status"] == "live" and r["file"].endswith(f"{VHOST}/msg_store_persistent/0.rdq")
    }
    f = r_rdq.walk(store / "0.rdq", 0)
    entries = [data[o : o + t] for o, t in zip(f.offsets.tolist(), f.totals.tolist()) if (o, t) in live]
    assert len(entries) > 10 and not f.holes  # the sample's own orphans are left out
    half = len(entries) // 2
    fresh = iter(range(1, 1 << 20))

    def orphans(live: int, ratio: float) -> bytes:
        out, k = b"", 0
        while len(out) < live * ratio / (1 - ratio) - 200:
            e = entries[k % len(entries)]
            k += 1
            out += e[:8] + next(fresh).to_bytes(16, "big") + e[8 + c_rdq.MSG_ID_SIZE :]
        return out

    first, second = b"".join(entries[:half]), b"".join(entries[half:])
    (store / "0.rdq").write_bytes(first + orphans(len(first), 0.6))
    (store / "1.rdq").write_bytes(orphans(len(second), 0.1) + second)
    for name in ("clean.dot", "file_summary.ets", "msg_store_index.ets"):
        (store / name).unlink(missing_ok=True)
    return store


def _ratios(result) -> dict[str, float]:
    return {
        os.path.basename(f["file"]): f["garbage_ratio"]
        for f in result.store_files
        if VHOST in f["file"] and "persistent" in f["file"]
    }


def test_threshold_rewrites_only_the_fragmented_file(tmp_path):
    import cqforensics
    from cqforensics.write import compact
    from cqforensics.write.verify import verify

    store = fragmented_copy(tmp_path / "src")
    out = tmp_path / "out"
    result = compact(tmp_path / "src", out, threshold=30)
    assert result.verified
    ratios = _ratios(result)
    assert 0.55 < ratios["0.rdq"] < 0.65 and 0.05 < ratios["1.rdq"] < 0.15
    actions = {os.path.basename(f["file"]): f["action"] for f in result.store_files if VHOST in f["file"]}
    assert actions == {"0.rdq": "rewritten", "1.rdq": "kept"}
    new = out / "rabbit@localhost" / "msg_stores" / "vhosts" / VHOST / "msg_store_persistent"
    # the kept file is byte for byte the source's; the live entries of 0.rdq went to 2.rdq (above it)
    assert (new / "1.rdq").read_bytes() == (store / "1.rdq").read_bytes()
    assert sorted(p.name for p in new.glob("*.rdq")) == ["1.rdq", "2.rdq"]
    live0 = int(
        next(f["live_bytes"] for f in result.store_files if f["file"].endswith(f"{VHOST}/msg_store_persistent/0.rdq"))
    )
    assert (new / "2.rdq").stat().st_size == live0
    # the same messages as a full compaction, and as the source
    full = compact(tmp_path / "src", tmp_path / "full")
    key = ["vhost", "queue", "seq_id", "msg_id", "body", "survives_restart"]

    def kept(path):
        return sorted(str(r) for r in cqforensics.read_table(path, columns=key).to_pylist() if r["survives_restart"])

    assert kept(out) == kept(tmp_path / "full") == kept(tmp_path / "src")
    # the kept file's orphans were not reclaimed: fewer bytes reclaimed than by a full compaction
    assert result.bytes_after > full.bytes_after
    assert (new / "1.rdq").stat().st_size - (full.bytes_after - result.bytes_after) >= 0
    # a plain verify flags the orphans left in the kept file; --allow-garbage accepts them
    plain = verify(out)
    assert not plain.consistent and {v.code for v in plain.violations} == {"orphan-message"}
    assert {os.path.basename(v.file) for v in plain.violations} == {"1.rdq"}
    assert verify(out, allow_garbage=True).consistent


def test_threshold_cli_report_and_bounds(tmp_path, capsys):
    fragmented_copy(tmp_path / "src")
    code, out, err = run(
        capsys, *["compact", "--threshold", "30", "--json", str(tmp_path / "src"), str(tmp_path / "o")]
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["threshold"] == 30
    mine = {os.path.basename(f["file"]): f["action"] for f in doc["store_files"] if VHOST in f["file"]}
    assert mine == {"0.rdq": "rewritten", "1.rdq": "kept"}
    code, out, err = run(
        capsys, *["compact", "--threshold", "30", "--dry-run", str(tmp_path / "src"), str(tmp_path / "d")]
    )
    assert code == 0 and "store files rewritten (garbage above 30%" in out and "store files kept" in out
    assert "1.rdq: " in out.split("store files kept")[1]
    # threshold 100 keeps every file; 0 rewrites every file with garbage
    code, out, _ = run(
        capsys, "compact", "--threshold", "100", "--json", "--dry-run", str(tmp_path / "src"), str(tmp_path / "d")
    )
    assert {f["action"] for f in json.loads(out)["store_files"]} == {"kept"}
    code, out, _ = run(
        capsys, *["compact", "--threshold", "0", "--json", "--dry-run", str(tmp_path / "src"), str(tmp_path / "d")]
    )
    assert {os.path.basename(f["file"]): f["action"] for f in json.loads(out)["store_files"] if VHOST in f["file"]} == {
        "0.rdq": "rewritten",
        "1.rdq": "rewritten",
    }
    code, out, _ = run(capsys, *["verify", "--allow-garbage", str(tmp_path / "o")])
    assert code == 0
    code, out, _ = run(capsys, *["verify", str(tmp_path / "o")])
    assert code == 4
    for bad in ("-1", "101", "nan", "x"):
        code, _, err = run(capsys, *["compact", "--threshold", bad, str(tmp_path / "src"), str(tmp_path / "e")])
        assert code == 16 and "--threshold" in err
    assert not (tmp_path / "e").exists()
    code, _, err = run(capsys, *["rebuild", "--threshold", "30", str(tmp_path / "src"), str(tmp_path / "e")])
    assert code == 16


@pytest.mark.broker
def test_threshold_output_boots_and_delivers_what_the_original_does(broker_dir):
    from test_brokers import boot_and_drain
    from test_writers_brokers import assert_delivers_manifest

    from cqforensics.write import compact
    from support import need_broker

    need_broker("4.3.6")
    fragmented_copy(broker_dir / "src")
    out = broker_dir / "compacted"
    result = compact(broker_dir / "src", out, threshold=30)
    assert result.verified
    assert {os.path.basename(f["file"]): f["action"] for f in result.store_files if VHOST in f["file"]} == {
        "0.rdq": "rewritten",
        "1.rdq": "kept",
    }
    assert_delivers_manifest(DATASET, boot_and_drain(DATASET, broker_dir / "run", out / "rabbit@localhost"))
