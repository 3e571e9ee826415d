"""Writers and a vhost dir renamed away from the dir its .vhost names (fuzz seed 25026: a
non-UTF-8 suffix). The broker reads a vhost's store only under md5/base-36 of its name, so the
writers write it back there (messages kept, output verifies) or, when that dir is present too,
leave it out with a note; they never refuse their own output."""

import os
import shutil
from pathlib import Path

import pytest

from cqforensics.write.salvage import compact, rebuild

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "4.0.5-proto-clean"
VHOSTS = Path("mnesia/rabbit@localhost/msg_stores/vhosts")
DEFAULT = "628WB79CIFDYO9LJI6DKMI09L"  # the dir of vhost "/"


def _copy(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    shutil.copytree(SAMPLE, src, symlinks=True)
    return src


def _messages(result) -> int:
    return sum(q.written for q in result.queues)


@pytest.mark.parametrize("writer", [rebuild, compact])
def test_renamed_vhost_dir_written_back_under_its_own_dir(writer, tmp_path):
    baseline = _messages(writer(SAMPLE, tmp_path / "base"))
    src = _copy(tmp_path)
    vhosts = src / VHOSTS
    # crafted: the "/" vhost dir renamed with a non-UTF-8 suffix, as the fuzz mutation odd_name does
    os.rename(os.fsencode(vhosts / DEFAULT), os.fsencode(vhosts / DEFAULT) + b"\xff\xfe")
    result = writer(src, tmp_path / "out")
    assert result.verified
    assert _messages(result) == baseline > 0
    assert (tmp_path / "out" / VHOSTS / DEFAULT / ".vhost").read_bytes() == b"/"
    assert any("written back as " + DEFAULT in n for n in result.notes)


@pytest.mark.parametrize("writer", [rebuild, compact])
def test_renamed_vhost_dir_left_out_when_its_own_dir_is_present(writer, tmp_path):
    src = _copy(tmp_path)
    vhosts = src / VHOSTS
    # crafted: a second copy of the "/" vhost dir under another name; the broker reads only the original
    shutil.copytree(vhosts / DEFAULT, Path(os.fsdecode(os.fsencode(vhosts / DEFAULT) + b"\xff\xfe")))
    result = writer(src, tmp_path / "out")
    assert result.verified
    assert sorted(os.listdir(tmp_path / "out" / VHOSTS)) == sorted(os.listdir(SAMPLE / VHOSTS))
    assert any("present too" in n for n in result.notes)
