"""compact --threshold PCT (borg's): only the shared-store files whose garbage ratio is above PCT
are rewritten; the others are copied whole (their orphans stay), new files are numbered above
them, the output verifies and a real broker boots it and delivers what the original does."""

from __future__ import annotations

import json
import os

import pytest

from support.cli import run
from support.damage import fragmented_copy

DATASET = "4.3.6-clean"
VHOST = "628WB79CIFDYO9LJI6DKMI09L"


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
    from cqforensics.write import compact
    from support import need_broker
    from support.live import assert_delivers_manifest, boot_and_drain

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
