"""``check_vhost`` (fsck, ``verify`` and the ``findings`` table) on a vhost read in message-id
shares (``checks.vhost.passes``): its findings are those of a whole read as a multiset, each
once, and its queue verdicts are equal; every sample, damaged copies, and crafted damage that
puts a whole-vhost rule (caps, counts, acked heads, copies across queues) across shares."""

from __future__ import annotations

import json
import random
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import pytest

import cqforensics
from cqforensics.checks import check_vhost
from cqforensics.discovery import nodes as layout
from cqforensics.model.options import make_options
from cqforensics.model.store import Share
from cqforensics.model.vhost import NodeScan, VhostScan
from support import damage

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted(p for p in (ROOT / "sample_data").iterdir() if p.is_dir())
EXTRA = next(
    (p for p in (Path("/work/shared/samples-extra"), ROOT.parent / "shared" / "samples-extra") if p.is_dir()), None
)
EXTRA_ARCHIVES = sorted(EXTRA.glob("*/*.tar.gz")) if EXTRA else []
AS_OF = 1_900_000_000_000
PARTS = 3


def checked(path: Path, parts: int = 1, deep: bool = False, assume_dirty: bool = False) -> tuple[Counter, list]:
    """Every vhost of every node under ``path`` checked in ``parts`` shares: (findings as a
    multiset, verdicts in order)."""
    found, verdicts = Counter(), []
    share = VhostScan.shares
    VhostScan.shares = property(lambda self: parts)  # every vhost read in ``parts`` shares, whatever its size
    try:
        for node in layout.discover([path]):
            ns = NodeScan(node, make_options(as_of=AS_OF, bodies=False, decode=False, assume_dirty=assume_dirty))
            for vs in ns.vhosts:
                vv, ff = check_vhost(vs, deep)
                vs.close()
                verdicts += [v.to_dict() for v in vv]
                found.update(
                    json.dumps(
                        [
                            f.code,
                            f.severity,
                            f.file,
                            f.offset,
                            f.message,
                            f.details,
                            f.node,
                            f.vhost,
                            f.queue,
                            f.priority,
                        ],
                        sort_keys=True,
                        default=str,
                    )
                    for f in ff
                )
    finally:
        VhostScan.shares = share
    return found, verdicts


def assert_shares_equal_whole(path: Path, **kw) -> Counter:
    whole = checked(path, 1, **kw)
    shared = checked(path, PARTS, **kw)
    assert shared[0] == whole[0], _diff(whole[0], shared[0])
    assert shared[1] == whole[1]
    return whole[0]


def _diff(whole: Counter, shared: Counter) -> str:
    return (
        f"only whole: {list((whole - shared).elements())[:5]}; only in shares: {list((shared - whole).elements())[:5]}"
    )


def codes(found: Counter) -> Counter:
    return Counter(json.loads(k)[0] for k in found.elements())


@pytest.fixture(scope="module")
def extra(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for tarball in EXTRA_ARCHIVES:
        dest = tmp_path_factory.mktemp(tarball.parent.name)
        with tarfile.open(tarball) as tf:
            tf.extractall(dest, filter="data")
        out[tarball.parent.name] = dest
    return out


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_every_sample(sample):
    assert_shares_equal_whole(sample)


@pytest.mark.parametrize("sample", ["3.10.8-kill", "4.3.6-clean", "4.3.6-kill"])
def test_deep_and_assumed_dirty(sample):
    assert_shares_equal_whole(ROOT / "sample_data" / sample, deep=True, assume_dirty=True)


@pytest.mark.skipif(not EXTRA_ARCHIVES, reason="../shared/samples-extra is not here")
@pytest.mark.parametrize("name", [p.parent.name for p in EXTRA_ARCHIVES] or ["none"])
def test_every_extra_sample(name, extra):
    assert_shares_equal_whole(extra[name])


def test_a_big_vhost_is_checked_share_by_share(monkeypatch):
    """The check of a vhost of 3 shares is made of scans of its shares, and never indexes its
    whole store (which the equality above would not notice)."""
    monkeypatch.setattr(VhostScan, "shares", property(lambda self: PARTS))
    made = []
    share_scan = VhostScan.share_scan

    def spy(self, k, parts=None):
        sub = share_scan(self, k, parts)
        made.append(sub.share)
        return sub

    monkeypatch.setattr(VhostScan, "share_scan", spy)
    ns = NodeScan(layout.discover([ROOT / "sample_data" / "4.3.6-kill"])[0], make_options(as_of=AS_OF))
    vs = ns.vhosts[0]
    _, found = check_vhost(vs)
    assert found and set(made) == {Share(k, PARTS) for k in range(PARTS)}
    assert "stores" not in vs.__dict__ and "index_pass" not in vs.__dict__


def copy(sample: str, tmp_path: Path) -> Path:
    node = tmp_path / "node"
    shutil.copytree(ROOT / "sample_data" / sample, node, symlinks=True)
    return node


@pytest.mark.parametrize("damage_kind", ["zeroed", "garbage", "truncated"])
def test_damaged_store(damage_kind, tmp_path):
    """Crafted damage in the shared store, as tests/tables/test_shares.py makes it."""
    node = copy("4.3.6-kill", tmp_path)
    damage.middle_third_of_biggest_rdq(node, damage_kind)
    found = assert_shares_equal_whole(node)
    assert codes(found)["msg-missing"] or codes(found)["rdq-garbage"] or codes(found)["rdq-truncated"]


TARGETS = {
    "qi": "*.qi",
    "qs": "*.qs",
    "idx": "*.idx",
    "jif": "journal.jif",
    "rdq": "msg_store_persistent/*.rdq",
    "ets": "msg_store_persistent/*.ets",
    "dets": "recovery.dets",
}
RANDOM = [
    (ds, kind, dmg)
    for ds, kinds in {
        "3.10.8-clean": ("idx", "jif", "rdq", "ets", "dets"),
        "4.3.6-clean": ("qi", "qs", "rdq", "ets"),
        "4.3.6-kill": ("qi", "qs", "rdq"),
    }.items()
    for kind in kinds
    for dmg in damage.KINDS
]


@pytest.mark.parametrize("dataset, kind, dmg", RANDOM, ids=[f"{d}-{k}-{m}" for d, k, m in RANDOM])
def test_random_damage(dataset, kind, dmg, tmp_path):
    """tests/support/damage.py's damage at seeded random places of up to three files of a kind."""
    node = copy(dataset, tmp_path)
    rnd = random.Random(f"{dataset}{kind}{dmg}")
    targets = sorted(
        p
        for p in node.rglob(TARGETS[kind].rsplit("/", 1)[-1])
        if "/" not in TARGETS[kind] or p.parent.name == TARGETS[kind].split("/")[0]
    )
    assert targets, f"the sample has no {kind} file"
    for path in rnd.sample(targets, min(3, len(targets))):
        damage.apply(dmg, path, rnd)
    assert_shares_equal_whole(node)


def _store_entries(node: Path) -> list[dict]:
    return cqforensics.read_table(
        node, "store", columns=["file", "offset", "total_size", "msg_id", "status"], as_of=AS_OF
    ).to_pylist()


def _share(msg_id: bytes) -> int:
    return next(k for k in range(PARTS) if Share(k, PARTS).holds_key(msg_id))


def test_recorded_places_over_the_cap(tmp_path, monkeypatch):
    """Crafted: a clean stop's store with its biggest file zeroed from its first entry on: more
    of the messages msg_store_index.ets records there are gone than the rdq-garbage cap (here
    8, the samples being small), in every share; the whole read and the shares name the same."""
    from cqforensics.checks import store

    monkeypatch.setattr(store, "MAX_RECORDED", 8)
    node = copy("4.3.6-clean", tmp_path)
    entries = [e for e in _store_entries(node) if e["file"].endswith(".rdq")]
    biggest = Counter(e["file"] for e in entries).most_common(1)[0][0]
    mine = sorted((e for e in entries if e["file"] == biggest), key=lambda e: e["offset"])
    assert len(mine) > 2 * 8 and {_share(e["msg_id"]) for e in mine} == set(range(PARTS))
    damage.zero(Path(biggest), mine[0]["offset"], mine[-1]["offset"] + mine[-1]["total_size"] - mine[0]["offset"])
    found = assert_shares_equal_whole(node)
    assert codes(found)["rdq-garbage"] == 8


def test_recorded_place_holding_another_shares_entry(tmp_path):
    """Crafted: two entries of one size whose ids are in different shares swap places in their
    file: msg_store_index.ets records each where the other now lies (``an entry of another id``,
    which the pass of the record's share learns from the other share's entries)."""
    node = copy("4.3.6-clean", tmp_path)
    entries = [e for e in _store_entries(node) if e["file"].endswith(".rdq")]
    pair = None
    by_size: dict[tuple, dict] = {}
    for e in entries:
        other = by_size.get((e["file"], e["total_size"]))
        if other is not None and _share(other["msg_id"]) != _share(e["msg_id"]):
            pair = (other, e)
            break
        by_size.setdefault((e["file"], e["total_size"]), e)
    assert pair is not None
    a, b = pair
    data = bytearray(Path(a["file"]).read_bytes())
    n = a["total_size"]
    data[a["offset"] : a["offset"] + n], data[b["offset"] : b["offset"] + n] = (
        data[b["offset"] : b["offset"] + n],
        data[a["offset"] : a["offset"] + n],
    )
    Path(a["file"]).write_bytes(bytes(data))
    found = assert_shares_equal_whole(node)
    assert sum("an entry of another id" in k for k in found.elements()) == 2


@pytest.mark.parametrize("head", [True, False], ids=["acked-head", "not-the-head"])
def test_missing_messages_across_shares(head, tmp_path):
    """Crafted: index entries of a killed queue's first segment given ids no store file holds
    (first byte kept: the same share), entries of every share. The first ones of the queue are
    its acked head (one warning; judged on every share's entries together), any others are
    each a msg-missing error."""
    node = copy("4.3.6-kill", tmp_path)
    rows = cqforensics.read_table(
        node, "index", columns=["file", "offset", "seq_id", "msg_id", "location"], as_of=AS_OF
    ).to_pylist()
    by_qi: dict[str, list] = {}
    for r in sorted(rows, key=lambda r: r["seq_id"]):
        if r["location"] == "shared_store" and Path(r["file"]).name == "0.qi":
            by_qi.setdefault(r["file"], []).append(r)
    pick = None
    for qi, held in sorted(by_qi.items()):
        for n in range(PARTS, len(held)):  # the shortest head of every share, with an entry after it
            if {_share(r["msg_id"]) for r in held[:n]} == set(range(PARTS)):
                pick = (qi, held[:n] if head else held[1 : n + 1])
                break
        if pick:
            break
    assert pick is not None, "no queue whose first entries span every share"
    qi, victims = pick
    data = bytearray(Path(qi).read_bytes())
    for k, r in enumerate(victims):
        at = data.index(r["msg_id"], r["offset"])
        data[at + 1 : at + 16] = bytes([0xEE] * 14 + [k])
    Path(qi).write_bytes(bytes(data))
    found = assert_shares_equal_whole(node)
    missing = [json.loads(k) for k in found.elements() if json.loads(k)[0] == "msg-missing"]
    if head:
        assert [f[5]["entries"] for f in missing if f[5].get("acked_head")] == [len(victims)]
    else:
        assert len(missing) == len(victims) and not any(f[5].get("acked_head") for f in missing)


def test_lost_queue_counts_orphans_of_every_share(tmp_path):
    """A durable queue's index dir removed: queue-index-missing counts the vhost's orphans (its
    own messages, now in every share) over all passes."""
    node = copy("4.3.6-clean", tmp_path)
    qdirs = sorted(node.rglob("queues/*"), key=lambda p: -sum(f.stat().st_size for f in p.iterdir()))
    shutil.rmtree(qdirs[0])
    found = assert_shares_equal_whole(node)
    lost = [json.loads(k) for k in found if json.loads(k)[0] == "queue-index-missing"]
    assert lost and lost[0][5]["orphans_in_store"] > 0


def test_copied_slots_across_segments_and_shares(tmp_path):
    """Crafted: a shared-store ``.qi`` slot written, under an id of each share, over a slot of
    each of two segments of its queue (index-duplicate-entry, each found in the pass of its id's
    share only; msg-missing too, no store holds those ids)."""
    node = copy("3.10.8-segments", tmp_path)
    rows = cqforensics.read_table(
        node, "index", columns=["file", "offset", "msg_id", "location"], as_of=AS_OF
    ).to_pylist()
    by_file: dict[str, list] = {}
    for r in rows:
        if r["file"].endswith(".qi"):
            by_file.setdefault(r["file"], []).append(r)
    src = next(f for f, rs in sorted(by_file.items()) if any(r["location"] == "shared_store" for r in rs))
    dst = next(f for f in sorted(by_file) if f != src and Path(f).parent == Path(src).parent)
    shared = next(r for r in by_file[src] if r["location"] == "shared_store")
    a, b = bytearray(Path(src).read_bytes()), bytearray(Path(dst).read_bytes())
    slot = bytes(a[shared["offset"] : shared["offset"] + 32])
    at = slot.index(shared["msg_id"])
    others = [r for r in by_file[src] if r["location"] == "queue_store"]
    for k in range(PARTS):  # first four bytes in share k's range, last byte k: ids of their own
        crafted = (k * 0x55555556).to_bytes(4, "big") + shared["msg_id"][4:15] + bytes([k])
        assert _share(crafted) == k
        copy_ = slot[:at] + crafted + slot[at + 16 :]
        a[others[k]["offset"] : others[k]["offset"] + 32] = copy_
        b[by_file[dst][k]["offset"] : by_file[dst][k]["offset"] + 32] = copy_
    Path(src).write_bytes(bytes(a))
    Path(dst).write_bytes(bytes(b))
    found = assert_shares_equal_whole(node)
    assert codes(found)["index-duplicate-entry"] == PARTS
