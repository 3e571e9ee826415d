"""Layout discovery and the content of each table on the real samples."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest

import cqforensics
from cqforensics.codecs import textfiles
from cqforensics.discovery import nodes as layout
from support import SAMPLES, manifest
from support.oracle import delivered_counts


def test_dir_names_follow_the_md5_base36_rule():
    assert textfiles.vhost_dir_name(b"/") == "628WB79CIFDYO9LJI6DKMI09L"
    assert textfiles.queue_dir_name(b"/", b"test") == "2SVZ97PJQCBIFINCC1KIO7L5D"


def test_discovery_accepts_node_dir_mnesia_base_and_folder(tmp_path):
    node = SAMPLES / "4.3.6-kill" / "mnesia" / "rabbit@localhost"
    assert [n.path for n in layout.discover(node)] == [node]
    assert [n.path for n in layout.discover(node.parent)] == [node]
    nodes = layout.discover(SAMPLES)
    assert len(nodes) == len(list(SAMPLES.glob("*/manifest.json*")))
    # the same node name in several backups gets a unique label
    assert len({n.node for n in nodes}) == len(nodes)
    assert all(n.node.endswith(n.path.name) for n in nodes)
    assert sum(n.node.endswith("rabbit@localhost") for n in nodes) == len(
        list(SAMPLES.glob("*/mnesia/rabbit@localhost"))
    )


def test_queue_names_priorities_and_index_versions():
    node = layout.discover(SAMPLES / "3.10.8-clean")[0]
    root = next(v for v in node.vhosts if v.name == "/")
    by_name = Counter(q.name for q in root.queues)
    assert by_name["jobs.prio"] == 6  # levels 0..5
    assert sorted(q.priority for q in root.queues if q.name == "jobs.prio") == [0, 1, 2, 3, 4, 5]
    versions = {q.name: q.index_version for q in root.queues}
    assert versions["orders.v1"] == 1 and versions["orders.v2"] == 2
    assert all(q.name_source == ".queue_name" for q in root.queues)
    seg = layout.discover(SAMPLES / "3.10.8-segments")[0]
    assert {v.segment_entry_count for v in seg.vhosts} == {32}


@pytest.mark.parametrize("table", cqforensics.TABLES)
def test_batches_have_the_exact_schema_and_respect_caps(table):
    n = 0
    sample = "4.3.6-quorum-clean" if table == "raft_log" else "4.3.6-clean"  # raft_log: quorum queues
    for b in cqforensics.iter_batches(SAMPLES / sample, table, batch_rows=7):
        assert b.schema == cqforensics.schema(table)
        if table in ("messages", "store", "raft_log"):
            assert b.num_rows <= 7
        n += b.num_rows
    assert n > 0 or table in ("findings", "stream_tracking")  # 4.3.6-clean holds no stream


def test_batches_capped_by_bytes():
    sizes = [b.num_rows for b in cqforensics.iter_batches(SAMPLES / "3.10.8-clean", "messages", batch_bytes=10_000)]
    assert max(sizes) < 10 and sum(sizes) > 50


def test_projection_skips_bodies():
    t = cqforensics.read_table(SAMPLES / "4.3.6-clean", "messages", columns=["queue", "size", "body_size"])
    assert t.column_names == ["queue", "size", "body_size"]
    full = cqforensics.read_table(SAMPLES / "4.3.6-clean", "messages", columns=["queue", "body"])
    assert sum(len(b or b"") for b in full.column("body").to_pylist()) > 50_000


# the columns the messages table fills from the term (the rest come from the index and the store)
DECODED = {
    "exchange",
    "routing_keys",
    "properties",
    "headers",
    "annotations",
    "body",
    "body_size",
    "term_format",
    "decode_error",
    "msg_id",
}


def test_undecoded_reads_agree_with_the_full_read(dataset):
    """A read that skips decoding (projection, decode=False) fills every other column the same."""
    full = cqforensics.read_table(SAMPLES / dataset, "messages")
    plain = [c for c in full.column_names if c not in DECODED]
    assert cqforensics.read_table(SAMPLES / dataset, "messages", columns=plain).equals(full.select(plain))
    raw = cqforensics.read_table(SAMPLES / dataset, "messages", decode=False)
    assert raw.select(plain).equals(full.select(plain))
    for r, f in zip(
        raw.select(["msg_id", "body", "exchange", "properties"]).to_pylist(),
        full.select(["msg_id", "location", "index_version"]).to_pylist(),
    ):
        assert r["exchange"] is None and r["properties"] is None  # nothing decoded
        if f["location"] == "stream":  # a stream record: its AMQP 1.0 bytes as they are
            assert r["msg_id"] is None and r["body"][:1] == b"\x00"
            continue
        if f["location"] == "shared_store" or f["index_version"] == 1:
            assert r["msg_id"] == f["msg_id"]  # the index's own id, which the decoded term agrees with
        else:
            assert r["msg_id"] is None
        assert r["body"] is None or r["body"][:1] == b"\x83"  # with decode=False: the stored term itself
    assert raw.column("body").null_count < len(raw)


def test_messages_sizes_agree_with_bodies(dataset):
    for r in cqforensics.read_table(
        SAMPLES / dataset, "messages", columns=["size", "body_size", "term_format"]
    ).to_pylist():
        if r["term_format"] in ("basic_message", "mc_amqpl"):
            assert r["size"] == r["body_size"]


def test_fanout_refcounts_and_recorded_counts_after_clean_stop():
    rows = cqforensics.read_table(SAMPLES / "4.3.6-clean", "refcounts").to_pylist()
    fan = [r for r in rows if set(r["queues"]) >= {"audit.b", "audit.c"}]
    assert fan and max(r["computed_refs"] for r in fan) == 3
    # a clean stop recorded the reference counts: they agree with the indexes
    assert all(r["recorded_refs"] == r["computed_refs"] for r in rows if r["store"] == "persistent")
    # acked messages stay in the files until compaction: garbage, not damage
    assert {r["status"] for r in rows if r["store"] == "persistent"} == {"ok", "orphan"}
    kill = cqforensics.read_table(SAMPLES / "4.3.6-kill", "refcounts").to_pylist()
    assert all(r["recorded_refs"] is None for r in kill)


def test_rolled_store_shows_compaction_holes_and_garbage():
    holes = cqforensics.read_table(SAMPLES / "4.3.6-rolled", "holes").to_pylist()
    zeroed = [h for h in holes if h["kind"] == "zeroed" and h["store"] == "persistent"]
    assert len(zeroed) >= 10 and all(h["length"] > 100 for h in zeroed[1:])
    files = cqforensics.read_table(SAMPLES / "4.3.6-rolled", "files").to_pylist()
    rdq = [f for f in files if f["kind"] == "rdq" and f["size"]]
    assert len(rdq) >= 10 and all(0 < f["garbage_ratio"] < 0.2 for f in rdq[1:])
    store = cqforensics.read_table(SAMPLES / "4.3.6-rolled", "store", columns=["status"]).to_pylist()
    assert Counter(r["status"] for r in store)["live"] == 60


def test_acks_evidence():
    v2 = Counter(r["evidence"] for r in cqforensics.read_table(SAMPLES / "4.3.6-clean", "acks").to_pylist())
    assert v2["v2_zeroed_slot"] > 5
    # a clean v1 flush writes acked messages nowhere; a kill -9 leaves acks in the journal
    v1 = Counter(r["evidence"] for r in cqforensics.read_table(SAMPLES / "3.10.8-kill", "acks").to_pylist())
    assert v1["v1_journal_ack"] >= 1


def test_queues_table_counts_match_messages(dataset):
    m = manifest(dataset)
    queues = cqforensics.read_table(SAMPLES / dataset, "queues", as_of=m["restarted_at_ms"]).to_pylist()
    msgs = cqforensics.read_table(
        SAMPLES / dataset, "messages", as_of=m["restarted_at_ms"], columns=["queue", "priority", "survives_restart"]
    ).to_pylist()
    for q in queues:
        mine = [r for r in msgs if (r["queue"], r["priority"]) == (q["queue"], q["priority"])]
        assert q["messages"] == len(mine)
        assert q["predicted_after_restart"] == sum(r["survives_restart"] for r in mine)
    expected = delivered_counts(m)
    predicted = Counter()
    for q in queues:
        predicted[(q["vhost"], q["queue"])] += q["predicted_after_restart"]
    assert {k: v for k, v in predicted.items() if v} == {k: v for k, v in expected.items() if v}


def test_vhost_and_queue_filters():
    t = cqforensics.read_table(SAMPLES / "4.3.6-clean", "messages", vhosts=["staging/ü"], columns=["vhost", "queue"])
    assert set(t.column("vhost").to_pylist()) == {"staging/ü"}
    t = cqforensics.read_table(SAMPLES / "4.3.6-clean", "messages", queues=["dead"], columns=["queue"])
    assert set(t.column("queue").to_pylist()) == {"dead"}


def test_many_backups_in_one_read(tmp_path):
    for i in range(3):
        shutil.copytree(SAMPLES / "4.3.6-kill" / "mnesia", tmp_path / f"host{i}" / "mnesia")
    t = cqforensics.read_table(tmp_path, "queues", columns=["node"])
    assert sorted(set(t.column("node").to_pylist())) == [f"host{i}/mnesia/rabbit@localhost" for i in range(3)]


def test_a_scan_seeded_with_vhost_facts_reads_what_a_fresh_one_does():
    """The Spark reader hands one task's vhost-wide facts to the next task of the same vhost."""
    from cqforensics.model.vhost import NodeScan, VhostScan
    from cqforensics.read.api import make_options
    from cqforensics.tables.builders import BUILDERS

    node = next(iter(layout.discover(SAMPLES / "4.3.6-kill")))
    first = NodeScan(node, make_options()).vhosts[0]
    for table in ("messages", "refcounts", "findings"):
        list(BUILDERS[table](first))
    facts = first.vhost_facts()
    assert {"stores", "index_pass"} <= facts.keys()
    for q in first.all_queue_dirs:
        only = {q.dir_name: None}
        seeded = VhostScan(first.node, first.vhost, only, facts)
        fresh = VhostScan(NodeScan(node, make_options()), first.vhost, only)
        assert seeded.stores is first.stores and "stores" not in fresh.__dict__
        for table in ("messages", "index", "findings"):
            assert list(BUILDERS[table](seeded)) == list(BUILDERS[table](fresh)), (q.name, table)


@pytest.mark.parametrize("dataset", ["3.10.8-segments", "4.3.6-kill"])
def test_the_index_pass_hands_its_chunks_to_the_listing_once(dataset, monkeypatch):
    """The vhost's index pass (references for the store walk) keeps the chunks it read for the
    listing that follows: that listing reads (about) no segment again, and the tables are those
    of a read that keeps nothing. (A clean start reads the indexes in further passes of its own,
    for the crashes a damaged message would cause.)"""
    from cqforensics.model import index
    from cqforensics.model.vhost import VhostScan

    reads = Counter()
    read_chunk = index._v2_chunk

    def counted(qdir, number, path, reference=False):
        reads[path] += 1
        return read_chunk(qdir, number, path, reference)

    monkeypatch.setattr(index, "_v2_chunk", counted)
    node = SAMPLES / dataset
    segments = len(list(node.rglob("*.qi")))
    assert segments >= 3
    tables = ("findings", "queues")
    kept = {t: cqforensics.read_table(node, t) for t in tables}
    counts = {}
    for t in tables:
        reads.clear()
        cqforensics.read_table(node, t)
        counts[t] = sum(reads.values())
    # a read that lists no index afterwards (store, refcounts, ...) keeps nothing
    from cqforensics.model.options import make_options
    from cqforensics.model.vhost import NodeScan

    for lists in (False, True):
        vs = NodeScan(next(iter(layout.discover(node))), make_options()).vhosts[0]
        if lists:
            vs.lists_every_index()
        vs.index_pass
        assert any(vs.kept_chunks.values()) == lists
    monkeypatch.setattr(VhostScan, "KEEP_BYTES", 0)
    for t in tables:
        reads.clear()
        assert cqforensics.read_table(node, t).equals(kept[t]), t
        # the listing's own read of each segment is saved (but for a vhost's first chunk, read
        # before the pass has run)
        vhosts = len(list(node.glob("mnesia/*/msg_stores/vhosts/*")))
        assert sum(reads.values()) - counts[t] >= segments - vhosts, (t, sum(reads.values()), counts[t], segments)


def test_constant_and_null_name_columns_equal_the_lookup():
    """names_array's shortcuts (one name, only nulls) make what the dictionary lookup does."""
    import numpy as np
    import pyarrow as pa

    from cqforensics.tables.builders import names_array, repeat

    names = ["a", "bb", "ccc"]

    def lookup(index, null=None):
        codes = pa.array(np.maximum(index, 0).astype(np.int32), mask=null)
        return pa.DictionaryArray.from_arrays(codes, pa.array(names, pa.string())).dictionary_decode()

    for index, null in [
        (np.full(5, 2), None),
        (np.full(5, 1), np.zeros(5, bool)),
        (np.full(5, 1), np.ones(5, bool)),
        (np.array([0, 2, 1, 2]), np.array([False, True, False, False])),
        (np.array([-1, -1]), None),
        (np.array([2, 2, 2]), np.array([False, False, True])),
    ]:
        assert names_array(names, index, null).equals(lookup(index, null)), (index, null)
    assert repeat("x", 3).to_pylist() == ["x"] * 3 and repeat("x", 5000).to_pylist() == ["x"] * 5000
    assert repeat("x", 2).to_pylist() == ["x"] * 2 and repeat(None, 4).null_count == 4
    assert (
        repeat(7, 3, pa.int32()).to_pylist() == [7] * 3 and repeat("y" * 1000, 2000).to_pylist() == ["y" * 1000] * 2000
    )
    from cqforensics.tables.builders import _REPEAT_BYTES, _REPEATS

    for k in range(1500):  # more values than are kept, at growing lengths
        value = f"queue-{k % 200}" * 8
        assert repeat(value, 1000 + k).to_pylist() == [value] * (1000 + k)
    assert _REPEATS.total == sum(a.nbytes for a in _REPEATS.values()) <= _REPEAT_BYTES


def test_message_batches_are_filled_across_chunks():
    """A batch takes the rows of consecutive chunks (queues, segments) until batch_rows or
    batch_bytes: every batch of a vhost but its last is full, and none passes either cap
    (one row over batch_bytes goes alone)."""
    import pyarrow.compute as pc

    node = SAMPLES / "3.12.14-clean"
    batches = list(cqforensics.iter_batches(node, "messages", batch_rows=500, batch_bytes=1 << 30))
    by_vhost = {}
    for b in batches:
        (v,) = set(b.column("vhost").to_pylist())
        by_vhost.setdefault(v, []).append(b.num_rows)
    assert any(len(set(b.column("queue").to_pylist())) > 1 for b in batches)
    for sizes in by_vhost.values():
        assert all(n == 500 for n in sizes[:-1]) and 0 < sizes[-1] <= 500, by_vhost
    for b in cqforensics.iter_batches(node, "messages", batch_bytes=20_000):
        body = pc.sum(pc.binary_length(b.column("body"))).as_py()
        assert b.num_rows == 1 or body <= 20_000
    assert sum(b.num_rows for b in batches) == cqforensics.read_table(node, "messages").num_rows
