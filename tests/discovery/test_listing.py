"""A queue dir's short way (``nodes._named_queue_dir``: one listing, one read of its
``.queue_name``) gives the same QueueDir and problems as the long way, on every queue dir of the
samples and on crafted dirs the short way must leave to the long one; the inputs manifest made
from a discovery's ``Listing`` is the manifest made by walking and reading the tree again."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest

from cqforensics.codecs import textfiles
from cqforensics.discovery import nodes
from cqforensics.output import provenance
from support import SAMPLES, dataset_params


def _vhosts(root: Path):
    for v in sorted(root.glob("**/msg_stores/vhosts/*")):
        if (v / "queues").is_dir():
            yield v


def _both_ways(vhost_dir: Path):
    """(QueueDir, problems) of each queue dir, the short way where it applies and the long way."""
    vhost = nodes.read_vhost_dir(vhost_dir)
    for e in sorted(os.scandir(vhost_dir / "queues"), key=lambda e: e.name):
        if not e.is_dir():
            continue
        path = Path(e.path)
        short_problems, long_problems = nodes.Problems(), nodes.Problems()
        short = nodes.read_queue_dir(path, vhost.name_raw, short_problems, e.path, nodes.Listing())
        long = nodes._read_queue_dir(path, vhost.name_raw, long_problems, e.path, nodes._listdir(e.path))
        yield short, short_problems, long, long_problems


@pytest.mark.parametrize("dataset", dataset_params())
def test_short_way_is_the_long_way_on_every_sample(dataset):
    seen = 0
    for v in _vhosts(SAMPLES / dataset / "mnesia"):
        for short, sp, long, lp in _both_ways(v):
            assert short == long and short.stub == long.stub and sp == lp
            seen += 1
    assert seen


def test_short_way_leaves_what_it_does_not_decide_to_the_long_way(tmp_path):
    """Crafted (labelled so): queue dirs the short way must not decide, each next to a good one."""
    src = SAMPLES / "4.3.6-kill" / "mnesia"
    shutil.copytree(src, tmp_path / "mnesia", symlinks=True)
    vdir = next(_vhosts(tmp_path / "mnesia"))
    vhost = (vdir / ".vhost").read_bytes()
    queues = vdir / "queues"

    def stub(name: bytes, dir_name: str | None = None, body: bytes | None = None) -> Path:
        d = queues / (dir_name or textfiles.queue_dir_name(vhost, name))
        d.mkdir()
        (d / ".queue_name").write_bytes(body if body is not None else b"VHOST: " + vhost + b"\nQUEUE: " + name + b"\n")
        return d

    stub(b"good")
    stub(b"prio\x00\x03")  # a priority level's dir
    stub(b"misplaced", dir_name=textfiles.queue_dir_name(vhost, b"elsewhere"))
    stub(b"other-vhost", body=b"VHOST: another\nQUEUE: other-vhost\n")
    stub(b"empty", body=b"")
    stub(b"unterminated", body=b"VHOST: " + vhost + b"\nQUEUE: unterminated")
    stub(b"big", body=b"VHOST: " + vhost + b"\nQUEUE: big" + b"x" * (1 << 17) + b"\n")
    link = queues / textfiles.queue_dir_name(vhost, b"linked")
    link.mkdir()
    (link / ".queue_name").symlink_to(queues / textfiles.queue_dir_name(vhost, b"good") / ".queue_name")
    ways = list(_both_ways(vdir))
    for short, sp, long, lp in ways:
        assert short == long and short.stub == long.stub and sp == lp
    named = {q.name for q, *_ in ways}
    assert {"good", "prio"} <= named and not {"misplaced", "empty", "unterminated"} & named
    assert sum(len(sp) for _, sp, _, _ in ways) >= 6  # each crafted dir but the good ones says what is wrong


def test_manifest_from_the_listing_is_the_walked_one(tmp_path):
    """The sample plus three queue dirs holding only their ``.queue_name`` (crafted, labelled so:
    what an empty durable queue's dir holds), whose name files the manifest takes from the listing."""
    shutil.copytree(SAMPLES / "4.3.6-kill" / "mnesia", tmp_path / "mnesia", symlinks=True)
    root = tmp_path / "mnesia"
    vdir = next(_vhosts(root))
    vhost = (vdir / ".vhost").read_bytes()
    empty = []
    for name in (b"empty.1", b"empty.2", b"empty.3"):
        d = vdir / "queues" / textfiles.queue_dir_name(vhost, name)
        d.mkdir()
        (d / ".queue_name").write_bytes(b"VHOST: " + vhost + b"\nQUEUE: " + name + b"\n")
        empty.append(str(d / ".queue_name"))
    found = nodes.discover(root)
    listing = found[0].listing
    assert listing is not None and all(n.listing is listing for n in found)
    queue_dirs = {str(q.path) for n in found for v in n.vhosts for q in v.queues}
    assert queue_dirs <= set(listing.dirs) and set(empty) <= set(listing.files)
    assert provenance.inputs_manifest(root, listing=listing) == provenance.inputs_manifest(root)


def test_a_node_dir_pickles_without_its_listing():
    """A NodeDir sent to another process (a DirEntry cannot be pickled) arrives with an empty
    listing: what it walks there is listed there."""
    node = nodes.discover(SAMPLES / "4.3.6-kill" / "mnesia")[0]
    assert node.listing.dirs
    back = pickle.loads(pickle.dumps(node))
    assert back == node and not back.listing.dirs and not back.listing.files
