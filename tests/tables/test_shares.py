"""A vhost read in message-id shares (``model.store.Share``, ``tables.in_shares``): the union of
the shares' rows is exactly the unshared table (as a multiset), every table of every sample."""

from __future__ import annotations

import gc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import cqforensics
from cqforensics.base.schema import SCHEMAS, TABLES
from cqforensics.model import store as m_store
from cqforensics.model.index import IndexChunk
from cqforensics.model.vhost import VhostScan
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers.qs import QsFile
from support import FAST_DATASETS
from support.damage import middle_third_of_biggest_rdq

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted(p for p in (ROOT / "sample_data").iterdir() if p.is_dir())


def rows(path: Path, table: str) -> Counter:
    t = cqforensics.read_table(path, table, as_of=1_900_000_000_000)
    return Counter(repr(sorted(r.items())) for r in t.to_pylist())


@pytest.fixture
def three_shares(monkeypatch):
    """Every vhost read in 3 shares, whatever its size."""
    monkeypatch.setattr(VhostScan, "shares", property(lambda self: 3))


@pytest.mark.parametrize(
    "sample",
    [p if p.name in FAST_DATASETS else pytest.param(p, marks=pytest.mark.slow) for p in SAMPLES],
    ids=lambda p: p.name,
)
def test_three_shares_give_the_unshared_rows(sample, monkeypatch):
    whole = {t: rows(sample, t) for t in TABLES}
    monkeypatch.setattr(VhostScan, "shares", property(lambda self: 3))
    for t in TABLES:
        assert rows(sample, t) == whole[t], (sample.name, t)


def test_shares_split_the_rows(three_shares):
    """Each share is a real restriction: no share alone gives all the store's rows."""
    sample = ROOT / "sample_data" / "4.3.6-kill"
    ns = cqforensics.model.vhost.NodeScan(next(iter(cqforensics.discovery.nodes.discover([sample]))))
    vs = ns.vhosts[0]
    counts = []
    for k in range(3):
        sub = vs.share_scan(k)
        counts.append(sum(len(st.e_id) for st in sub.stores.values()))
        sub.close()
    assert sum(counts) == sum(len(st.e_id) for st in vs.stores.values())
    assert all(0 < c < sum(counts) for c in counts), counts


def test_id_share_is_a_range_of_the_first_bytes():
    """Crafted ids: shares cut the first-4-bytes range evenly, in bytewise order."""
    raw = (
        bytes.fromhex("00000000" + "11" * 12)
        + bytes.fromhex("55555554" + "00" * 12)
        + bytes.fromhex("55555556" + "00" * 12)
        + bytes.fromhex("aaaaaaab" + "00" * 12)
        + bytes.fromhex("ff" * 16)
    )
    ids = np.frombuffer(raw, "V16")
    assert m_store.id_share(ids, 3).tolist() == [0, 0, 1, 2, 2]
    assert m_store.id_share(ids, 1).tolist() == [0] * 5
    for k in range(3):
        share = m_store.Share(k, 3)
        assert [share.holds_key(raw[i : i + 16]) for i in range(0, len(raw), 16)] == share.holds(ids).tolist()
    assert m_store.Share(0, 3).holds_key(b"short") and not m_store.Share(1, 3).holds_key(b"short")


def test_trusted_ids_built_by_shares_are_sorted(three_shares):
    """The walk's trusted ids, built a share at a time, are the sorted ids of a one-go build."""
    sample = ROOT / "sample_data" / "4.3.6-kill"
    ns = cqforensics.model.vhost.NodeScan(next(iter(cqforensics.discovery.nodes.discover([sample]))))
    vs = ns.vhosts[0]
    for kind, refs in vs.references.items():
        assert vs.trusted(kind).sorted == r_rdq.Referenced(refs.ids.ids).sorted


def _live_rows(vs, chunks) -> list[tuple]:
    """Per live entry of ``chunks`` in order: its queue dir, index file, record and resolution
    (the body's file by path: positions in a chunk's lists differ between chunks)."""
    from dataclasses import fields

    from cqforensics.model.index import Records

    out = []
    for qx in chunks:
        res = vs.resolve(qx)
        for j, row in enumerate(qx.live.tolist()):
            rec = tuple(getattr(qx.rec, f.name)[row].tobytes() for f in fields(Records) if f.name != "file")
            body = res.body_files[res.body_file[j]] if res.body_file[j] >= 0 else None
            out.append(
                (
                    qx.qdir.dir_name,
                    qx.files[qx.rec.file[row]],
                    rec,
                    body,
                    int(res.body_start[j]),
                    int(res.body_len[j]),
                    int(res.store_offset[j]),
                    int(res.qs_status[j]),
                    int(res.fate[j]),
                    None if res.crash_once is None else bool(res.crash_once[j]),
                )
            )
    return out


#: the caps of ``LiveSpill.JOIN_ROWS`` tried: one above any sample's queue, and 2 entries (which splits the joins)
JOIN_CAPS = (1 << 16, 2)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_live_chunks_of_a_share_come_from_the_spill_as_read(sample, three_shares, monkeypatch):
    """``live_chunks`` of a share (live entries from the vhost's one spill, consecutive chunks of
    a queue joined when none of their entries is in a .qs) give the entries ``chunks`` reads and
    restricts to the share, in the same order, with every record column equal, and resolve
    alike. Joining is capped (``JOIN_ROWS``: a cap of 2 entries splits the joins): each cap of
    ``JOIN_CAPS`` is checked on the same share scans (the cap is read as a share's chunks are
    handed out, so the scans, the spill and what ``chunks`` reads are made once, not per cap)."""
    from cqforensics.model import vhost as m_vhost

    ns = cqforensics.model.vhost.NodeScan(next(iter(cqforensics.discovery.nodes.discover([sample]))))
    checked = 0
    joined = Counter()
    for vs in ns.vhosts:
        for k in range(3):
            sub = vs.share_scan(k)
            read = None
            for cap in JOIN_CAPS:
                monkeypatch.setattr(m_vhost.LiveSpill, "JOIN_ROWS", cap)
                spilled = list(sub.live_chunks())
                joined[cap] += sum(len(qx.files) > 1 and qx.version == 2 for qx in spilled)
                if read is None:
                    read = _live_rows(sub, sub.chunks())
                assert _live_rows(sub, spilled) == read, f"JOIN_ROWS={cap}, vhost {vs.vhost.dir_name}, share {k}"
            checked += len(read)
            sub.close()
    rows = cqforensics.read_table(sample, "messages", columns=["queue_type", "location"]).to_pylist()
    # a stream's records and a quorum queue's messages are no index entries, nor the dead letters a
    # quorum queue's boot republishes into a classic queue (location dead_letter_replay)
    assert checked == sum(r["queue_type"] == "classic" and r["location"] != "dead_letter_replay" for r in rows)
    if sample.name == "3.10.8-segments":
        assert joined[1 << 16], "the segments of a queue are joined"


@pytest.mark.parametrize("sample", ["3.10.8-segments", "4.3.6-kill"])
def test_live_entries_spilled_after_the_references_are_those_read(sample, three_shares):
    """The live entries asked for after the references were spilled (a pass of their own over
    the indexes) are those the chunks give, row by row."""
    ns = cqforensics.model.vhost.NodeScan(
        next(iter(cqforensics.discovery.nodes.discover([ROOT / "sample_data" / sample])))
    )
    vs = ns.vhosts[0]
    sub = vs.share_scan(1)
    sub.spill("refs")
    assert ("live", 3) not in sub.spills
    assert _live_rows(sub, sub.live_chunks()) == _live_rows(sub, sub.chunks())
    sub.close()


@pytest.mark.parametrize("sample", ["4.3.6-kill", "3.10.8-segments", "4.3.6-clean"])
def test_a_read_in_shares_decodes_each_index_once_whatever_the_shares(sample, monkeypatch):
    """The passes of a ``messages`` read in shares take their entries from one spill, and so do
    the clean-start facts gathered share by share (after a clean stop): no segment is decoded
    again for each share, so more shares decode no more, and no more than a whole read (which
    decodes each segment for the references, the listing and each clean-start fact)."""
    from cqforensics.model import index as m_index

    sample = ROOT / "sample_data" / sample
    decoded = Counter()
    real = m_index.r_qi.read_qi
    monkeypatch.setattr(m_index.r_qi, "read_qi", lambda path, *a, **kw: decoded.update([path]) or real(path, *a, **kw))
    counts, tables = {}, {}
    for parts in (1, 3, 6):
        monkeypatch.setattr(VhostScan, "shares", property(lambda self, p=parts: p))
        decoded.clear()
        tables[parts] = cqforensics.read_table(sample, "messages")
        counts[parts] = sum(decoded.values())
    assert tables[1].num_rows == tables[3].num_rows == tables[6].num_rows > 0
    assert 0 < counts[3] == counts[6] <= counts[1], counts


def test_a_small_vhost_is_read_whole():
    sample = ROOT / "sample_data" / "4.3.6-kill"
    ns = cqforensics.model.vhost.NodeScan(next(iter(cqforensics.discovery.nodes.discover([sample]))))
    assert ns.vhosts[0].shares == 1


@pytest.mark.parametrize("table", ["messages", "index", "refcounts", "store", "holes", "acks", "files"])
def test_spark_units_of_a_big_vhost_are_its_shares(table, monkeypatch):
    """With shares of 10 entries, the planner gives a vhost one unit per share (shared tables),
    and reading every unit gives the embedded reader's rows."""
    pytest.importorskip("pyspark")
    from spark_datasource import options as opt
    from spark_datasource.plan import plan_units
    from spark_datasource.source import read_units

    sample = str(ROOT / "sample_data" / "4.3.6-kill")
    whole = rows(Path(sample), table)
    monkeypatch.setattr(m_store, "ENTRIES_PER_SHARE", 10)
    s = opt.parse({"path": sample, "table": table, "asOf": "1900000000000"})
    units = plan_units(s.paths, table)
    shared = [u for u in units if u.share is not None]
    if table == "files":
        assert not shared
    else:
        assert len(shared) >= 2 and {u.share for u in shared} == set(range(shared[0].shares))
    got = Counter()
    for b in read_units(units, s, list(SCHEMAS[table].names)):
        got.update(repr(sorted(r.items())) for r in b.to_pylist())
    assert got == whole


@pytest.mark.parametrize("damage", ["zeroed", "garbage", "truncated"])
def test_three_shares_on_a_damaged_store(damage, tmp_path, monkeypatch):
    """Crafted damage in the shared store (a zeroed range, garbage bytes, a cut file): the walk
    trusts every referenced id in every share, so the shares still give the whole read's rows."""
    import shutil

    node = tmp_path / "node"
    shutil.copytree(ROOT / "sample_data" / "4.3.6-kill", node, symlinks=True)
    middle_third_of_biggest_rdq(node, damage)
    tables = ["messages", "store", "refcounts", "holes", "files", "queues"]
    whole = {t: rows(node, t) for t in tables}
    assert any(
        "body_missing" in r or "truncated" in r or "garbage" in r or "zeroed" in r
        for t in ("messages", "holes")
        for r in whole[t]
    ), "the damage must show"
    monkeypatch.setattr(VhostScan, "shares", property(lambda self: 3))
    for t in tables:
        assert rows(node, t) == whole[t], (damage, t)


@pytest.mark.parametrize("sample", ["4.3.6-kill", "3.10.8-kill", "4.0.5-clean"])
def test_verify_in_shares_counts_as_whole(sample, monkeypatch):
    from cqforensics.write.verify import verify

    whole = verify([ROOT / "sample_data" / sample / "mnesia"])
    monkeypatch.setattr(VhostScan, "shares", property(lambda self: 3))
    built = []
    real = VhostScan.share_scan
    monkeypatch.setattr(VhostScan, "share_scan", lambda self, *a: built.append(a) or real(self, *a))
    from cqforensics.model import vhost as m_vhost

    scanned = []  # the share each store index is built for: never None (the whole store)
    real_scan = m_vhost.scan_store
    monkeypatch.setattr(m_vhost, "scan_store", lambda *a, **kw: scanned.append(kw.get("share")) or real_scan(*a, **kw))
    shared = verify([ROOT / "sample_data" / sample / "mnesia"])
    assert built, "no share scan was made"
    assert scanned and None not in scanned
    assert (shared.store_entries, shared.messages, shared.queues, len(shared.violations), len(shared.notes)) == (
        whole.store_entries,
        whole.messages,
        whole.queues,
        len(whole.violations),
        len(whole.notes),
    )


#: what a read builds that grows with the store
HEAVY = (m_store.StoreIndex, m_store.References, m_store.IdSet, m_store.Spill, r_rdq.RdqFile, QsFile, IndexChunk)


@pytest.mark.parametrize("shares", [1, 3])
@pytest.mark.parametrize("table", ["messages", "findings", "refcounts", "queues"])
def test_a_read_frees_what_it_built_without_the_cyclic_collector(table, shares, monkeypatch):
    """Once a read ends, reference counting alone frees its store indexes, references, spills
    and file objects: the node's scan and its vhost scans refer to each other, and what they
    held used to wait for the cyclic collector (a loop of reads of the 1x bench store, as a
    Spark worker makes, grew by 30 MB a read, to 400 MB, before it ran)."""
    monkeypatch.setattr(VhostScan, "shares", property(lambda self: shares))
    gc.collect()
    gc.disable()
    try:
        for _ in cqforensics.iter_batches(ROOT / "sample_data" / "4.3.6-kill", table):
            pass
        left = sorted(type(o).__name__ for o in gc.get_objects() if isinstance(o, HEAVY))
    finally:
        gc.enable()
    assert left == []


def test_a_vhost_read_frees_its_store_index_before_the_next_vhost():
    """In a read of a node with several vhosts, the first vhost's store indexes are freed when
    its rows end, not kept by the node's scan while the next vhost is read (memory follows the
    biggest vhost, not their sum)."""
    gc.collect()
    gc.disable()
    try:
        seen, alive = [], None
        for b in cqforensics.iter_batches(ROOT / "sample_data" / "4.3.6-kill", "store"):
            vhost = b.column("vhost")[0].as_py()
            if seen and vhost != seen[-1] and alive is None:
                alive = [o.store.path for o in gc.get_objects() if isinstance(o, m_store.StoreIndex)]
            seen.append(vhost)
    finally:
        gc.enable()
    assert len(set(seen)) == 2 and alive
    # those of the vhost being read only (its two stores)
    assert len({p.parent for p in alive}) == 1, f"store indexes of two vhosts alive: {sorted(map(str, alive))}"
