"""Issue 33: single-bit flips, both ways. For each kind of file the issue names (``.qi``, ``.idx``,
``journal.jif``, ``file_summary.ets``, a vhost ``.config``, Khepri's files, ``.rdq``) and each
kind of byte in it, either a cross-check sees a flipped bit (a finding naming the file, or the
queue) or nothing can, and docs/findings.md's "What damage does" table and docs/hostile.md (the
bit-flip table) say why; the fuzz campaign then counts such a flip as ``undetectable``, with its
class, never as an unexplained silence.

Each test flips one bit of a private copy of a real sample (the flip is the only crafted part)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from cqforensics.commands.fsck import run
from cqforensics.grammar import qi as c_qi
from cqforensics.readers import qi as r_qi
from cqforensics.readers import terms as r_terms
from fuzz import campaign  # noqa: E402
from support import copy_node

VHOSTS = "msg_stores/vhosts/*"


def flip(path: Path, offset: int, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def new_findings(node: Path, change, deep: bool = False) -> set[tuple[str, str, int | None, str]]:
    """(code, file name, offset, severity) of the findings ``change()`` adds to ``node``'s fsck."""

    def found():
        return {(f.code, f.file, f.offset, f.severity) for f in run([node.parent], deep=deep).findings}

    before = found()
    change()
    return {(c, Path(f).name if f else None, o, s) for c, f, o, s in found() - before}


def slots(node: Path, want) -> tuple[Path, int]:
    """The first .qi slot (file, offset) whose raw slot ``want(slot)`` accepts."""
    for p in sorted(node.glob(f"{VHOSTS}/queues/*/*.qi")):
        seg = r_qi.read_qi(p, int(p.stem))
        for i, s in enumerate(seg.slots):
            if want(s):
                return p, c_qi.HEADER_SIZE + c_qi.ENTRY_SIZE * i
    raise AssertionError("no such slot")


_COPIES: dict[Path, str] = {}  # node dir of a copy -> the sample it is a copy of


def copy(dataset: str, dest: Path) -> Path:
    node = copy_node(dataset, dest)
    _COPIES[node] = dataset
    return node


def _dataset_of(node: Path) -> str:
    return _COPIES[node]


def v1_publish(node: Path, name: str, want=lambda head, body: True) -> tuple[Path, int, int]:
    """(file, record offset, head size) of the first live CQv1 publish record ``want`` accepts."""
    for p in sorted(node.glob(f"{VHOSTS}/queues/*/{name}")):
        data = p.read_bytes()
        jif = name == "journal.jif"
        head = 8 if jif else 2
        live = {o for (f, o) in campaign._live_rows(_dataset_of(node)) if f == str(p.relative_to(node.parent))}
        o = 0
        while o + head + 32 <= len(data):
            h = int.from_bytes(data[o : o + head], "big")
            pub = (h >> 62) <= 1 if jif else bool(h & 0x8000)
            if not pub:
                o += head
                continue
            (emb,) = struct.unpack_from(">I", data, o + head + 28)
            if o in live and want(h, data[o + head : o + head + 32 + emb]):
                return p, o, head
            o += head + 32 + emb
    raise AssertionError(f"no {name} publish")


# -- flips now found -----------------------------------------------------------------------------------


def test_qi_header_reserved_byte(tmp_path):
    node = copy("4.3.6-kill", tmp_path / "m")
    qi = sorted(node.glob(f"{VHOSTS}/queues/*/0.qi"))[0]
    got = new_findings(node, lambda: flip(qi, 40, 3))
    assert got == {("qi-bad-header", "0.qi", 40, "info")}


def test_qi_transient_slot_padding(tmp_path):
    node = copy("4.3.6-kill", tmp_path / "m")
    qi, at = slots(node, lambda s: s["status"] == 1 and s["flags"] == 0 and s["loc_kind"] == 2)
    got = new_findings(node, lambda: flip(qi, at + 18, 0))
    assert ("qi-bad-entry", qi.name, at, "info") in got


@pytest.mark.parametrize("loc, deep", [(1, False), (2, True)])
def test_qi_persistent_flag_of_a_durable_queue(loc, deep, tmp_path):
    """A persistent message's flag flipped to transient: its body in the persistent shared store
    says so at once; a .qs message's own persistence (its term) says so with --deep."""
    node = copy("4.3.6-kill", tmp_path / "m")
    qi, at = slots(node, lambda s: s["status"] == 1 and s["flags"] == 1 and s["loc_kind"] == loc)
    got = new_findings(node, lambda: flip(qi, at + 1, 0), deep=deep)
    assert ("persistence-mismatch", qi.name, at, "warning") in got
    if deep:  # without --deep the .qs one is a transient drop, as the next boot sees it
        assert not any(c == "persistence-mismatch" for c, *_ in new_findings(node, lambda: None))


def test_idx_relseq_past_the_segment_entry_count(tmp_path):
    node = copy("3.10.8-kill", tmp_path / "m")
    idx, at, _ = v1_publish(node, "*.idx")
    got = new_findings(node, lambda: flip(idx, at, 3))  # RelSeq bit 11: at least 2048, the count
    assert ("v1-segment-truncated", idx.name, at, "error") in got
    assert ("term-file-damaged", ".config", None, "warning") in got


def test_config_count_below_the_records_relseq(tmp_path):
    """3.10.8 with 32-entry CQv1 segments: ".config" says 32; one bit makes it 22, below the RelSeqs
    the records hold: found at the .config and at each such record (the queue crashes)."""
    node = copy("3.10.8-segments", tmp_path / "m")
    cfg = next(p for p in node.glob(f"{VHOSTS}/.config") if any(p.parent.glob("queues/*/1.idx")))
    raw = cfg.read_bytes()
    got = new_findings(node, lambda: flip(cfg, raw.rindex(b"32"), 0))  # '3' (0x33) -> '2'
    assert ("term-file-damaged", ".config", None, "warning") in got
    assert any(c == "v1-segment-truncated" for c, *_ in got)


@pytest.mark.parametrize("name", ["*.idx", "journal.jif"])
def test_v1_persistent_flag(name, tmp_path):
    """A persistent publish flipped to transient (a segment's bit, a journal's prefix 00 -> 01):
    embedded, its term says persistent (--deep); in the shared store, the persistent store holds it."""
    node = copy("3.10.8-kill", tmp_path / "m")
    jif = name == "journal.jif"
    persistent = (lambda h, b: h >> 62 == 0) if jif else (lambda h, b: bool(h & 0x4000))
    path, at, head = v1_publish(node, name, persistent)
    got = new_findings(node, lambda: flip(path, at, 6), deep=True)
    assert ("persistence-mismatch", path.name, at, "warning") in got


def test_file_summary_record_fields(tmp_path):
    node = copy("3.12.14-clean", tmp_path / "m")
    fs = max(node.glob(f"{VHOSTS}/msg_store_persistent/file_summary.ets"), key=lambda p: p.stat().st_size)
    log = r_terms.read_disk_log(fs)
    data = fs.read_bytes()
    item = log.offsets[1]
    false = data.index(b"false", item)  # the record's locked field (an atom)
    got = new_findings(node, lambda: flip(fs, false + 1, 2))  # 'false' -> 'felse'
    assert ("term-file-damaged", fs.name, item, "warning") in got
    keypos = data.index(b"keypos", log.offsets[0]) + len(b"keypos") + 1  # {keypos, 2}: the small integer
    flip(fs, false + 1, 2)
    got = new_findings(node, lambda: flip(fs, keypos, 0))
    assert ("term-file-damaged", fs.name, log.offsets[0], "warning") in got


def test_khepri_wal_version_record_header_config_and_writers_snapshot(tmp_path):
    node = copy("4.3.6-clean", tmp_path / "m")
    system = next(node.glob("coordination/*"))
    wal = next(system.glob("*.wal"))
    assert ("term-file-damaged", wal.name, 4, "warning") in new_findings(node, lambda: flip(wal, 4, 1))
    flip(wal, 4, 1)
    data = wal.read_bytes()
    first = 5 + 3 + 2 + int.from_bytes(data[8:10], "big") + 24 + struct.unpack_from(">I", data, 14 + data[9])[0]
    assert data[first] & 0x40  # the second record: a known writer
    assert ("term-file-damaged", wal.name, first, "warning") in new_findings(node, lambda: flip(wal, first + 2, 2))
    flip(wal, first + 2, 2)
    config = next(system.glob("*/config"))
    at = config.read_bytes().index(b'uid => <<"') + 12
    assert ("term-file-damaged", "config", None, "warning") in new_findings(node, lambda: flip(config, at, 0))
    flip(config, at, 0)
    snap = system / "writers.snapshot"
    assert ("term-file-damaged", snap.name, 0, "info") in new_findings(node, lambda: flip(snap, 5, 0))


def test_rdq_property_timestamp_past_its_column(tmp_path):
    """A flipped top bit of a stored message's timestamp property (2^63 s and more: no timestamp
    column holds it): --deep finds the value the row shows as null."""
    node = copy("3.10.8-kill", tmp_path / "m")
    row = next(r for r in campaign.stored_messages(node) if r["location"] == "shared_store")
    from cqforensics.codecs import amqp091, etf

    term = etf.binary_to_term(campaign.stored_term(row))
    props, headers = amqp091.decode_properties(term[3][3])
    rdq = Path(row["store_file"])
    if props["timestamp"] is None:  # give it one first (a real property list re-encoded), then flip it
        new = list(term)
        c = list(term[3])
        c[3] = amqp091.encode_properties({**props, "timestamp": 1_700_000_000}, headers)
        new[3] = tuple(c)
        campaign.put_term(row, etf.term_to_binary(tuple(new)))
        term = etf.binary_to_term(campaign.stored_term(row))
    data = rdq.read_bytes()
    ts = data.index(
        struct.pack(">Q", 1_700_000_000) if props["timestamp"] is None else struct.pack(">Q", props["timestamp"]),
        row["store_offset"],
    )
    got = new_findings(node, lambda: flip(rdq, ts, 7), deep=True)
    assert ("value-out-of-range", rdq.name, row["store_offset"], "warning") in got


# -- flips nothing can see: silent, and counted as undetectable with their class --------------------------


def _undetectable(base: Path, dataset: str, target: Path) -> str | None:
    return campaign.undetectable({"target": str(target), "base": base, "dataset": dataset, "mutation": "bitflip1"})


@pytest.mark.parametrize(
    "case",
    ["qi.expiry", "qi.dead", "v1.expiry", "rdq.payload", "ets.info-run", "config.comment", "wal.trunc", "term.value"],
)
def test_flip_nothing_can_see_is_silent_and_explained(case, tmp_path):
    dataset = {
        "qi.expiry": "4.3.6-kill",
        "qi.dead": "4.3.6-kill",
        "v1.expiry": "3.10.8-kill",
        "rdq.payload": "4.3.6-kill",
        "ets.info-run": "4.3.6-clean",
        "config.comment": "4.3.6-kill",
        "wal.trunc": "4.3.6-clean",
        "term.value": "4.3.6-clean",
    }[case]
    base = tmp_path / "m"
    node = copy(dataset, base)
    if case == "qi.expiry":
        target, at = slots(node, lambda s: s["status"] == 1 and s["flags"] == 1 and s["expiry"] == 0)
        at, bit, why = at + 24, 0, "qi.expiry"  # the expiry's top byte: a time far in the future
    elif case == "qi.dead":
        target, at = slots(node, lambda s: s["status"] == 1 and s["flags"] == 0 and s["loc_kind"] == 1)
        at, bit, why = at + 10, 4, "qi.dead"  # a transient slot's message id: never read
    elif case == "v1.expiry":
        target, at, head = v1_publish(node, "*.idx", lambda h, b: b[16:24] == bytes(8))
        at, bit, why = at + head + 16, 0, "v1.expiry"  # no expiry -> one in year 4254: not past, as plausible
    elif case == "rdq.payload":
        row = next(
            r
            for r in campaign.stored_messages(node)
            if r["location"] == "shared_store" and r["term_format"] == "mc_amqpl"
        )
        target, at, bit, why = Path(row["store_file"]), row["store_offset"] + 400, 0, "payload"
    elif case == "ets.info-run":
        target = next(node.glob(f"{VHOSTS}/msg_store_persistent/file_summary.ets"))
        data = target.read_bytes()
        at = data.index(b"memory") + len(b"memory") + 1  # {memory, Words}: the run's own value
        bit, why = 0, "ets.info-run"
    elif case == "config.comment":
        target = next(node.glob(f"{VHOSTS}/.config"))
        at, bit, why = 5, 0, "same-content"
    elif case == "wal.trunc":
        target = next(node.glob("coordination/*/*.wal"))
        at, bit, why = 5, 7, "wal.trunc"
    else:
        target = next(node.glob("coordination/*/*/config"))
        at = target.read_bytes().index(b"tick_timeout => 1000") + len(b"tick_timeout => 1")
        bit, why = 0, "term.value"  # 1000 -> 1100 (ms): a timeout as plausible as the original
    got = new_findings(node, lambda: flip(target, at, bit), deep=True)
    named = {f for _, f, _, _ in got}
    assert target.name not in named, got
    assert _undetectable(base, dataset, target) == why
