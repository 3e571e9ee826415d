"""What the tests share: where the checkout and its samples are, the skip rule (a test that needs
a broker, Java or Chromium skips with its reason here; with CQF_NO_SKIP=1, set by .ci/run, the skip
is a failure), and private copies of sample nodes. The oracle (``support.oracle``), the damage
helpers and the real-broker scenarios live beside this module."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from support.oracle import datasets, manifest

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_data"
NO_SKIP = os.environ.get("CQF_NO_SKIP") == "1"

#: the datasets a test parametrized over every sample runs on in the fast tier (-m "not slow"):
#: one killed node per storage kind, of the oldest and newest broker; the others are ``slow``
FAST_DATASETS = ("3.10.8-kill", "4.3.6-kill", "4.3.6-quorum-kill", "4.3.6-streams-kill")


def dataset_params() -> list:
    """Every dataset, as parameters: those outside ``FAST_DATASETS`` marked ``slow``."""
    return [d if d in FAST_DATASETS else pytest.param(d, marks=pytest.mark.slow) for d in datasets()]


def skip_or_fail(why: str) -> None:
    if NO_SKIP:
        pytest.fail(f"CQF_NO_SKIP=1 but {why}")
    pytest.skip(why)


def need_broker(version: str) -> None:
    from brokers import runtime

    why = runtime(version).unavailable()
    if why:
        skip_or_fail(why)


def copy_node(dataset: str, dest: Path) -> Path:
    """A private copy of a sample's mnesia base; returns the node dir inside it."""
    shutil.copytree(SAMPLES / dataset / "mnesia", dest, symlinks=True)
    return dest / Path(manifest(dataset)["node_dir"]).name


def streams_beside_two_vhosts(dest: Path) -> Path:
    """A node dir of two vhosts (``/`` and ``staging/ü``, 4.3.6-kill) holding the streams of
    4.3.6-streams-clean: a composite of two real node dirs (the streams' queues are not in this
    node's metadata, so the default vhost lists them); returns its mnesia base."""
    node = copy_node("4.3.6-kill", dest)
    streams = SAMPLES / "4.3.6-streams-clean" / "mnesia" / Path(manifest("4.3.6-streams-clean")["node_dir"]).name
    shutil.copytree(streams / "stream", node / "stream")
    return dest


__all__ = [
    "ROOT",
    "SAMPLES",
    "NO_SKIP",
    "skip_or_fail",
    "need_broker",
    "copy_node",
    "streams_beside_two_vhosts",
    "datasets",
    "manifest",
    "unreadable",
]


def unreadable(monkeypatch, path) -> None:
    """Opening ``path`` fails with an I/O error, as a failing disk does (a file root cannot read;
    a directory in its place is damage, a not-regular-file finding)."""
    import errno
    import os

    real = os.open

    def failing(p, *args, **kwargs):
        if os.fsdecode(p) == str(path):
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real(p, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing)
