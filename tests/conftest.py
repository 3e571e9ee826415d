"""Shared fixtures. Broker-backed tests call ``need_broker(version)``: it skips with the reason
when that RabbitMQ cannot be started here, and fails instead when CQF_REQUIRE_BROKERS=1 (CI)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_data"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from oracle import datasets, manifest  # noqa: E402

REQUIRE_BROKERS = os.environ.get("CQF_REQUIRE_BROKERS") == "1"


def need_broker(version: str) -> None:
    from cqforensics.broker import runtime

    why = runtime(version).unavailable()
    if why:
        if REQUIRE_BROKERS:
            pytest.fail(f"CQF_REQUIRE_BROKERS=1 but {why}")
        pytest.skip(why)


def copy_node(dataset: str, dest: Path) -> Path:
    """A private copy of a sample's mnesia base; returns the node dir inside it."""
    shutil.copytree(SAMPLES / dataset / "mnesia", dest, symlinks=True)
    return dest / "rabbit@localhost"


@pytest.fixture
def broker_dir(tmp_path_factory):
    """A temp dir the broker's rabbitmq user can enter (pytest's own tmp root is 0700)."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="cqf-broker-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=datasets())
def dataset(request) -> str:
    return request.param


__all__ = ["ROOT", "SAMPLES", "need_broker", "copy_node", "datasets", "manifest"]
