"""The reader registry: the one place a file's name becomes its kind and its reader, and the
callers (discovery, the files table, dump) that go through it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cqforensics.base.errors import UsageError
from cqforensics.commands import dump as dump_mod
from cqforensics.discovery import nodes as layout
from cqforensics.grammar import rdq as c_rdq
from cqforensics.model.vhost import NodeScan
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers import registry
from cqforensics.tables import builders as tables
from support import SAMPLES, copy_node

NODES = sorted(p for p in SAMPLES.glob("*/mnesia/*") if layout.is_node_dir(p))


def _place(path: Path) -> str:
    """Where a file under msg_stores/vhosts/<vhost>/ sits, from its parents."""
    parent = path.parent
    if parent.name.startswith("msg_store_"):
        return "store"
    if parent.parent.name == "queues":
        return "queue"
    return "vhost"


def test_there_are_samples():
    assert len(NODES) >= 5


@pytest.mark.parametrize("node", NODES, ids=lambda p: p.parent.parent.name)
def test_every_file_of_every_sample_store_is_classified(node):
    files = [p for p in (node / "msg_stores" / "vhosts").rglob("*") if p.is_file()]
    assert files
    for p in files:
        where = _place(p)
        kind = registry.kind_of(p, where)
        assert kind is not None, p
        assert registry.READERS[kind].where == where
        assert registry.kind_of(p) == kind  # the name alone gives the same answer
    for p in node.glob("*"):
        if p.suffix in (".DCD", ".DCL", ".LOG"):
            assert registry.kind_of(p) == "disk_log"


@pytest.mark.parametrize("node", NODES, ids=lambda p: p.parent.parent.name)
def test_discovery_leaves_nothing_unclassified_in_the_samples(node):
    (n,) = layout.discover(node)
    for v in n.vhosts:
        assert v.others == []
        for st in v.stores.values():
            assert {registry.kind_of(p, "store") for p in st.others} <= {"dot", "ets"}
            assert all(registry.kind_of(p, "store") == "rdq" for _, p in st.rdq)
        for q in v.queues:
            assert q.others == []
            assert all(registry.kind_of(p, "queue") == "qi" for _, p in q.qi)
            assert all(registry.kind_of(p, "queue") == "qs" for p in q.qs.values())
            assert all(registry.kind_of(p, "queue") == "idx" for _, p in q.idx)
            assert q.journal is None or registry.kind_of(q.journal, "queue") == "jif"


KINDS = [
    (".vhost", "vhost", "vhost"),
    (".config", "vhost", "config"),
    ("recovery.dets", "vhost", "dets"),
    ("0.rdq", "store", "rdq"),
    ("17.rdt", "store", "rdt"),
    ("clean.dot", "store", "dot"),
    ("file_summary.ets", "store", "ets"),
    ("msg_store_index.ets", "store", "ets"),
    (".queue_name", "queue", "queue_name"),
    ("3.qi", "queue", "qi"),
    ("3.qs", "queue", "qs"),
    ("12.idx", "queue", "idx"),
    ("journal.jif", "queue", "jif"),
    ("00000000000000000000.segment", "stream", "osiris_segment"),
    ("00000000000000004096.index", "stream", "osiris_index"),
    ("00000003.wal", "ra_system", "ra_wal"),
    ("0000000000000001.wal", "ra_system", "ra_wal"),
    ("names.dets", "ra_system", "ra_names"),
    ("meta.dets", "ra_system", "ra_meta"),
    ("writers.snapshot", "ra_system", "ra_writers"),
    ("segment_name_upgrade_marker", "ra_system", "ra_marker"),
    ("config", "ra_server", "ra_config"),
    ("00000005.segment", "ra_server", "ra_segment"),
    ("0000000000000005.segment", "ra_server", "ra_segment"),
    ("0000000000000007.compacting", "ra_server", "ra_compacting"),
    ("0000000000000007.compaction_group", "ra_server", "ra_compaction_group"),
    ("snapshot.dat", "ra_snapshot", "ra_snapshot"),
    ("indexes", "ra_snapshot", "ra_indexes"),
]


@pytest.mark.parametrize("name,where,kind", KINDS)
def test_kind_of_each_kind(name, where, kind):
    assert registry.kind_of(name, where) == kind
    assert registry.kind_of(Path("/some/dir") / name) == kind
    others = [w for w in registry.PLACES if w != where]
    assert all(registry.kind_of(name, w) is None for w in others)


def test_every_kind_is_covered():
    assert {k for _, _, k in KINDS} | {"disk_log"} == set(registry.READERS)
    assert all(r.where in registry.PLACES + (None,) for r in registry.READERS.values())


@pytest.mark.parametrize(
    "name,kind",
    [
        ("rabbit_durable_queue.DCD", "disk_log"),
        ("rabbit_durable_queue.DCL", "disk_log"),
        ("LATEST.LOG", "disk_log"),
        ("names.dets", "ra_names"),
        ("other.dets", "dets"),
        ("copy-of.rdq", "rdq"),
        ("x.qi", "qi"),
        ("old.jif", "jif"),
        ("t.ets", "ets"),
    ],
)
def test_lone_files_are_known_by_extension(name, kind):
    assert registry.kind_of(name) == kind


@pytest.mark.parametrize(
    "name", ["schema.DAT", "README", "0.walx", "a.rdq.bak", "cluster_nodes.config", ".rdq", "rdq", "0.RDQ", ""]
)
def test_unknown_names(name):
    assert registry.kind_of(name) is None
    for where in registry.PLACES:
        assert registry.kind_of(name, where) is None
        assert registry.other_kind(name, where) == "unknown"


def test_numbered_files_need_a_number_where_the_broker_puts_them():
    assert registry.kind_of("a.rdq", "store") is None and registry.kind_of("a.rdq") == "rdq"
    assert registry.numbered("42.rdq", "store") == ("rdq", 42)
    assert registry.numbered("42.rdq", "queue") is None
    assert registry.numbered("clean.dot", "store") is None
    assert registry.number_of("7.qs") == 7 and registry.number_of("journal.jif") is None
    assert registry.other_kind("0.rdq", "store") == "unknown"  # a numbered name that is not a file
    assert registry.other_kind("clean.dot", "store") == "dot"
    assert registry.file_name("rdq", 3) == "3.rdq" and registry.file_name("jif") == "journal.jif"
    assert registry.file_name("osiris_segment", 3) == "00000000000000000003.segment"
    assert registry.numbered("00000000000000000042.index", "stream") == ("osiris_index", 42)
    assert registry.kind_of("42.index", "stream") is None  # osiris names have exactly 20 digits
    with pytest.raises(ValueError):
        registry.file_name("qi")


def test_fixed_names_keep_registry_order():
    assert registry.fixed_names("vhost") == [(".vhost", "vhost"), (".config", "config"), ("recovery.dets", "dets")]


def test_dump_lists_what_the_registry_can_dump():
    assert registry.dumpable() == [
        ".DCD",
        ".DCL",
        ".LOG",
        ".compacting",
        ".compaction_group",
        ".dets",
        ".ets",
        ".idx",
        ".index",
        ".jif",
        ".qi",
        ".qs",
        ".rdq",
        ".segment",
        ".wal",
    ]
    with pytest.raises(UsageError, match=r"known: \.DCD, \.DCL, \.LOG, \.compacting"):
        dump_mod.kind_of(Path("clean.dot"))  # a kind with no dump
    with pytest.raises(UsageError):
        list(dump_mod.dump(SAMPLES / "3.10.8-kill" / "mnesia" / "rabbit@localhost" / "schema.DAT"))


def test_dump_dispatches_through_the_registry(tmp_path, monkeypatch):
    seen = []

    def fake_dump(path, count):
        seen.append((path, count))
        data = path.read_bytes()
        yield {"offset": 0, "kind": "entry", "status": "ok"}, (data, 2, len(data) - 2)
        yield {"offset": 9, "kind": "hole"}, None

    readers = dict(registry.READERS)
    readers["sqs"] = registry.Reader("sqs", "store", "a new format", ext=".sqs", numbered=True, dump=fake_dump)
    monkeypatch.setattr(registry, "READERS", readers)
    f = tmp_path / "0.sqs"
    f.write_bytes(b"xx\x83garbage")
    assert registry.kind_of(f) == "sqs" and registry.kind_of(f, "store") == "sqs"
    rows = list(dump_mod.dump(f, segment_entry_count=5))
    assert seen == [(f, 5)] and rows == [{"offset": 0, "kind": "entry", "status": "ok"}, {"offset": 9, "kind": "hole"}]
    deep = list(dump_mod.dump(f, deep=True))
    assert "decode_error" in deep[0] and "decode_error" not in deep[1]  # the term (not a message) was decoded
    assert ".sqs" in registry.dumpable()

    # an existing kind: replacing its reader's dump changes what dump lists
    readers["rdq"] = dataclasses.replace(readers["rdq"], dump=fake_dump)
    rdq = next((SAMPLES / "4.3.6-kill").rglob("msg_store_persistent/0.rdq"))
    assert list(dump_mod.dump(rdq))[1] == {"offset": 9, "kind": "hole"}


def test_dump_reads_terms_through_the_reader_spans():
    rdq = next((SAMPLES / "4.3.6-kill").rglob("msg_store_persistent/0.rdq"))
    data = rdq.read_bytes()
    rows = [(row, term) for row, term in registry.READERS["rdq"].dump(rdq, 0)]
    entries = [(row, term) for row, term in rows if term is not None]
    assert entries
    for row, (source, start, length) in entries:
        assert (start, length) == r_rdq.term_span(row["offset"], row["size"])
        assert source[start : start + 1] == b"\x83" and data[start + length] == c_rdq.WRITE_OK_MARKER
        assert r_rdq.entry_total(length) == row["size"]
    qi = next(p for p in (SAMPLES / "4.3.6-kill").rglob("*.qi") if any(t for _, t in registry.READERS["qi"].dump(p, 0)))
    for row, term in registry.READERS["qi"].dump(qi, 0):
        if term is not None:
            source, start, length = term  # the sibling .qs, as a Path or as the reader's map of it
            raw = source.read_bytes() if isinstance(source, Path) else bytes(source)
            assert raw == qi.with_suffix(".qs").read_bytes() and length == row["qs_size"]
            assert raw[start : start + 1] == b"\x83"


def test_the_files_table_names_kinds_from_the_registry(tmp_path):
    node = copy_node("3.10.8-clean", tmp_path / "in")  # clean: clean.dot, .ets and recovery.dets exist
    (n,) = layout.discover(node)
    v = n.vhosts[0]
    (v.path / "stray.txt").write_bytes(b"x")
    (v.path / "msg_store_persistent" / "notes.ets.bak").write_bytes(b"x")
    q = v.queues[0]
    (q.path / "copy.qi").write_bytes(b"x")
    (n,) = layout.discover(node)
    ns = NodeScan(n)
    rows = {Path(r["file"]).name: r["kind"] for vs in ns.vhosts for r in tables.file_rows(vs)}
    assert rows["stray.txt"] == rows["notes.ets.bak"] == rows["copy.qi"] == "unknown"
    kinds = {r["kind"] for vs in ns.vhosts for r in tables.file_rows(vs)}
    assert {"vhost", "config", "dets", "rdq", "dot", "ets", "queue_name", "qi", "qs", "idx", "unknown"} <= kinds
    for vs in ns.vhosts:
        for r in tables.file_rows(vs):
            if r["kind"] != "unknown":
                assert registry.kind_of(r["file"]) == r["kind"], r["file"]


def test_a_new_numbered_kind_needs_only_a_registry_line(tmp_path, monkeypatch):
    node = copy_node("4.3.6-kill", tmp_path / "in")
    (n,) = layout.discover(node)
    q = n.vhosts[0].queues[0]
    (q.path / "0.sqs").write_bytes(b"x")
    store = n.vhosts[0].stores["persistent"].path
    (store / "3.sqs").write_bytes(b"x")
    assert [p.name for p in layout.discover(node)[0].vhosts[0].queues[0].others] == ["0.sqs"]  # unknown today
    readers = dict(registry.READERS)
    readers["sqs"] = registry.Reader("sqs", "queue", "a new per-queue format", ext=".sqs", numbered=True)
    monkeypatch.setattr(registry, "READERS", readers)
    (n,) = layout.discover(node)
    q = n.vhosts[0].queues[0]
    assert q.others == [] and q.numbered["sqs"] == [(0, q.path / "0.sqs")]
    assert [p.name for p in n.vhosts[0].stores["persistent"].others] == ["3.sqs"]  # not a store kind
    rows = {Path(r["file"]).name: r["kind"] for vs in NodeScan(n).vhosts for r in tables.file_rows(vs)}
    assert rows["0.sqs"] == "sqs" and rows["3.sqs"] == "unknown"
