"""Silent damage becomes findings; dumps stream; node-level special files never block (issue 12).

Every test damages a private copy of a real sample at test time (``conftest.copy_node``,
``tests/support/damage.py``); the damage is the only hand-made part. Each asserts the code, the file and
the offset of the finding, never message text."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import cqforensics
from cqforensics.grammar import qi as c_qi
from cqforensics.readers import terms as r_terms
from cqforensics.readers import v1 as r_v1
from support import ROOT, SAMPLES, copy_node, damage

VHOSTS = "msg_stores/vhosts/*"


def findings(node: Path) -> set[tuple[str, str | None, int | None]]:
    """(code, file name relative to the node dir's parent, offset) of every finding."""
    rows = cqforensics.read_table(node, "findings").to_pylist()
    return {(f["code"], os.path.relpath(f["file"], node.parent) if f["file"] else None, f["offset"]) for f in rows}


def codes_at(node: Path, path: Path) -> set[tuple[str, int | None]]:
    rel = os.path.relpath(path, node.parent)
    return {(c, o) for c, f, o in findings(node) if f == rel}


def _used_slots(data: bytes, loc: int | None = None) -> list[int]:
    n = (len(data) - c_qi.HEADER_SIZE) // c_qi.ENTRY_SIZE
    return [
        i
        for i in range(n)
        if data[c_qi.HEADER_SIZE + i * 32] == 1 and (loc is None or data[c_qi.HEADER_SIZE + i * 32 + 3] == loc)
    ]


def _slot(i: int) -> slice:
    return slice(c_qi.HEADER_SIZE + i * c_qi.ENTRY_SIZE, c_qi.HEADER_SIZE + (i + 1) * c_qi.ENTRY_SIZE)


# -- index copies and swaps ---------------------------------------------------------------------------


@pytest.mark.parametrize("loc", [1, 2])
def test_qi_slot_copied_over_another_is_a_duplicate_at_the_copy(tmp_path, loc):
    node = copy_node("4.3.6-clean", tmp_path / "m")
    for qi in sorted(node.glob(f"{VHOSTS}/queues/*/*.qi")):
        data = bytearray(qi.read_bytes())
        used = _used_slots(data, loc)
        if len(used) >= 2:
            break
    else:
        pytest.skip(f"no .qi with two live slots of location {loc}")
    a, b = used[0], used[-1]
    data[_slot(b)] = data[_slot(a)]
    qi.write_bytes(bytes(data))
    assert ("index-duplicate-entry", _slot(b).start) in codes_at(node, qi)


def test_qi_slot_copied_into_another_segment_is_a_duplicate(tmp_path):
    node = copy_node("3.10.8-segments", tmp_path / "m")
    q = next(p.parent for p in node.glob(f"{VHOSTS}/queues/*/2.qi"))
    one, two = bytearray((q / "1.qi").read_bytes()), bytearray((q / "2.qi").read_bytes())
    src = _used_slots(one, 1)
    dst = _used_slots(two)
    if not src:  # the sample's messages are all in the .qs: make one a shared-store slot, a copy of another
        pytest.skip("no shared-store slot in 1.qi")
    two[_slot(dst[0])] = one[_slot(src[0])]
    (q / "2.qi").write_bytes(bytes(two))
    assert ("index-duplicate-entry", _slot(dst[0]).start) in codes_at(node, q / "2.qi")


def test_qi_segments_swapped_are_misplaced(tmp_path):
    node = copy_node("3.10.8-segments", tmp_path / "m")
    q = next(p.parent for p in node.glob(f"{VHOSTS}/queues/*/2.qi"))
    one, two = (q / "1.qi").read_bytes(), (q / "2.qi").read_bytes()
    (q / "1.qi").write_bytes(two)
    (q / "2.qi").write_bytes(one)
    assert ("segment-misplaced", 5) in codes_at(node, q / "1.qi")
    assert ("segment-misplaced", 5) in codes_at(node, q / "2.qi")


def _publishes(path: Path, number: int, count: int) -> list:
    out = r_v1.V1Index()
    r_v1.parse_segment(path, number, count, path.read_bytes(), out)
    return [r for r in out.records if r.kind == "publish"]


def test_v1_publish_record_copied_over_another_is_a_duplicate_seq_id(tmp_path):
    node = copy_node("3.10.8-segments", tmp_path / "m")
    idx = next(node.glob(f"{VHOSTS}/queues/*/2.idx"))
    pubs = _publishes(idx, 2, 32)
    a = pubs[0]
    b = next(r for r in pubs[1:] if r.embedded_size == a.embedded_size)
    length = 34 + a.embedded_size  # a publish record: 34-byte head and its embedded message
    data = bytearray(idx.read_bytes())
    data[b.offset : b.offset + length] = data[a.offset : a.offset + length]
    idx.write_bytes(bytes(data))
    assert ("index-duplicate-entry", b.offset) in codes_at(node, idx)


def test_v1_segments_swapped_are_misplaced_by_the_recorded_counts(tmp_path):
    node = copy_node("3.10.8-segments", tmp_path / "m")
    q = next(p.parent for p in node.glob(f"{VHOSTS}/queues/*/2.idx"))
    one, two = (q / "1.idx").read_bytes(), (q / "2.idx").read_bytes()
    (q / "1.idx").write_bytes(two)
    (q / "2.idx").write_bytes(one)
    assert ("segment-misplaced", 0) in codes_at(node, q / "1.idx")
    assert ("segment-misplaced", 0) in codes_at(node, q / "2.idx")


def test_v1_segments_swapped_between_queues(tmp_path):
    """Fuzz seed 16018: segment 0 of two CQv1 queues exchanged after a clean stop: each holds
    another unacked count than its queue's recovery terms record for it."""
    node = copy_node("3.12.14-clean", tmp_path / "m")
    a, b = sorted((p for p in node.glob(f"{VHOSTS}/queues/*/0.idx")), key=lambda p: p.stat().st_size)[-2:]
    da, db = a.read_bytes(), b.read_bytes()
    assert da != db and not codes_at(node, a) and not codes_at(node, b)
    a.write_bytes(db)
    b.write_bytes(da)
    assert ("recovery-terms-mismatch", 0) in codes_at(node, a) and ("recovery-terms-mismatch", 0) in codes_at(node, b)


def test_qs_junk_after_the_last_entry(tmp_path):
    node = copy_node("4.3.6-clean", tmp_path / "m")
    qs = max(node.glob(f"{VHOSTS}/queues/*/*.qs"), key=lambda p: p.stat().st_size)
    size = qs.stat().st_size
    damage.junk(qs, size, 200, seed=3)  # 200 junk bytes appended
    assert ("qs-trailing-garbage", size) in codes_at(node, qs)


@pytest.mark.slow
def test_no_silent_damage_codes_on_the_healthy_samples():
    """The new checks never fire on what real brokers wrote (every sample, clean and kill -9)."""
    from support import datasets

    new = {
        "index-duplicate-entry",
        "segment-misplaced",
        "qs-trailing-garbage",
        "term-file-damaged",
        "not-regular-file",
        "message-copies-differ",
    }
    for ds in datasets():
        got = {c for c, _, _ in findings(SAMPLES / ds / "mnesia") if c in new}
        assert not got, (ds, got)


# -- the broker's text files: no checksum, so their writer's shape is the evidence ---------------------


def _text_case(node: Path, rel: str, new: bytes) -> tuple[Path, set]:
    path = next(node.glob(rel))
    path.write_bytes(new)
    return path, codes_at(node, path)


@pytest.mark.parametrize(
    "ds,rel,mutate,offset",
    [
        ("4.0.5-clean", f"{VHOSTS}/.config", lambda b: b[:15], None),  # cut inside its comment: no term left
        ("3.13.7-clean", f"{VHOSTS}/.config", lambda b: b[:49] + bytes(len(b) - 49), 49),  # zeroed
        ("4.0.5-clean", f"{VHOSTS}/.config", lambda b: b.replace(b"segment_entry_count", b"segment_entry_counu"), None),
        ("4.2.2-clean", f"{VHOSTS}/msg_store_transient/clean.dot", lambda b: b[:2] + bytes(9) + b[11:], 2),
        ("3.10.8-clean", "cluster_nodes.config", lambda b: b.replace(b"rabbit@", b"rabbiu@", 1), None),  # flipped bit
        (
            "3.10.8-clean",
            "cluster_nodes.config",
            lambda b: b + b"\x83junk",
            len(b"{[rabbit@localhost],[rabbit@localhost]}.\n"),
        ),
        ("4.0.5-kill", "nodes_running_at_shutdown", lambda b: b[:-3], None),  # torn: no full stop
        ("4.0.5-kill", "rabbit_serial", lambda b: b"-1.\n", None),
    ],
)
def test_text_file_damage_is_a_finding(tmp_path, ds, rel, mutate, offset):
    node = copy_node(ds, tmp_path / "m")
    path = next(node.glob(rel))
    (got,) = [o for c, o in _text_case(node, rel, mutate(path.read_bytes()))[1] if c == "term-file-damaged"]
    if offset is not None:
        assert got == offset
    elif rel == "nodes_running_at_shutdown":
        assert got is not None  # where the terms stop
    else:
        assert got is None  # the terms parse: their shape is what is wrong


def test_transient_clean_dot_replaced_by_a_persistent_one(tmp_path):
    """A swap the fuzz campaign made: a persistent store's clean.dot (of another vhost) in the
    transient store's place is a finding at the transient file; the persistent store that got
    the transient file recovers dirty, and says so at its clean.dot."""
    node = copy_node("4.0.5-clean", tmp_path / "m")
    vhosts = sorted(node.glob(VHOSTS))
    transient, persistent = vhosts[0] / "msg_store_transient/clean.dot", vhosts[1] / "msg_store_persistent/clean.dot"
    a, b = transient.read_bytes(), persistent.read_bytes()
    transient.write_bytes(b)
    persistent.write_bytes(a)
    assert ("term-file-damaged", None) in codes_at(node, transient)
    assert ("unclean-shutdown", None) in codes_at(node, persistent)


def test_disk_log_header_status_neither_closed_nor_open(tmp_path):
    node = copy_node("4.0.5-kill", tmp_path / "m")
    dcd = node / "rabbit_runtime_parameters.DCD"
    data = dcd.read_bytes()
    dcd.write_bytes(data[:5] + bytes(3) + data[8:])
    assert ("term-file-damaged", 4) in codes_at(node, dcd)


def test_quorum_dir_dets_tables_are_checked(tmp_path):
    node = copy_node("3.10.8-proto-clean", tmp_path / "m")
    names = next(node.glob("quorum/*/names.dets"))
    damage.truncate(names, names.stat().st_size - 932)
    assert any(c == "term-file-damaged" for c, _ in codes_at(node, names))


def test_deep_index_size_field_that_is_not_the_body_size(tmp_path):
    """A fuzz case: one byte of a .qi slot's size field zeroed (the body's size at publish).
    Only --deep can tell, by decoding the body it refers to."""
    from cqforensics.commands import fsck

    node = copy_node("3.13.7-clean", tmp_path / "m")
    for qi in sorted(node.glob(f"{VHOSTS}/queues/*/*.qi")):
        data = bytearray(qi.read_bytes())
        used = _used_slots(data, 2)
        if used:
            break
    at = c_qi.HEADER_SIZE + used[0] * c_qi.ENTRY_SIZE
    size_at = at + c_qi.ENTRY_DTYPE.fields["size"][1]
    data[size_at : size_at + 4] = (int.from_bytes(data[size_at : size_at + 4], "big") + 1).to_bytes(4, "big")
    qi.write_bytes(bytes(data))
    assert not [f for f in fsck.run(node).findings if f.code == "index-size-mismatch"]
    got = [(f.file, f.offset) for f in fsck.run(node, deep=True).findings if f.code == "index-size-mismatch"]
    assert got == [(str(qi), at)]


def test_file_summary_that_does_not_describe_the_store_files(tmp_path):
    """A swap the fuzz campaign made: the persistent store's file_summary.ets and the transient
    store's (both valid dumps) exchanged after a clean stop: each is a finding at its file."""
    node = copy_node("4.3.6-clean", tmp_path / "m")
    vhost = max(node.glob(VHOSTS), key=lambda p: sum(f.stat().st_size for f in p.rglob("*.rdq")))
    a, b = vhost / "msg_store_persistent/file_summary.ets", vhost / "msg_store_transient/file_summary.ets"
    assert not codes_at(node, a) and not codes_at(node, b)
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)
    assert ("term-file-damaged", None) in codes_at(node, a)
    assert ("term-file-damaged", None) in codes_at(node, b)


def test_ets_dump_of_another_table_in_its_place(tmp_path):
    """A swap the fuzz campaign made: a store's msg_store_index.ets replaced by a file_summary.ets
    (both whole, valid dumps): its objects are not #msg_location{} records."""
    node = copy_node("3.10.8-clean", tmp_path / "m")
    index = next(
        p
        for p in sorted(node.glob(f"{VHOSTS}/msg_store_persistent/msg_store_index.ets"))
        if r_terms.read_ets(p).objects
    )
    index.write_bytes((index.parent / "file_summary.ets").read_bytes())
    assert any(c == "term-file-damaged" and o is not None for c, o in codes_at(node, index))


def test_transient_store_files_swapped_between_vhosts(tmp_path):
    """After a clean stop a transient store holds the bodies its queues' indexes refer to; swapped
    with another vhost's, they are missing: a finding at the store, though the broker drops
    transient messages at boot anyway."""
    node = copy_node("3.10.8-clean", tmp_path / "m")
    a, b = sorted(node.glob(f"{VHOSTS}/msg_store_transient/0.rdq"))
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)
    got = {
        (f["code"], f["file"], f["severity"])
        for f in cqforensics.read_table(node, "findings").to_pylist()
        if f["code"] == "msg-missing"
    }
    assert ("msg-missing", str(a.parent), "info") in got or ("msg-missing", str(b.parent), "info") in got


def test_ra_names_dets_that_does_not_register_the_server_dir(tmp_path):
    """A swap the fuzz campaign made: Khepri's names.dets replaced by the (valid, empty) DETS
    table recovery.dets; the Ra server's data dir is then registered nowhere. And a dir renamed:
    the registered UId has no data dir."""
    node = copy_node("4.3.6-kill", tmp_path / "m")
    names = next(node.glob("coordination/*/names.dets"))
    original = names.read_bytes()
    names.write_bytes(next(node.glob(f"{VHOSTS}/recovery.dets")).read_bytes())
    assert ("term-file-damaged", None) in codes_at(node, names)
    names.write_bytes(original)
    assert not codes_at(node, names)
    uid = next(p for p in names.parent.iterdir() if (p / "config").exists())
    uid.rename(uid.with_name("RABBITXXXXXXXXXXXX"))
    assert {c for c, _ in codes_at(node, names)} == {"term-file-damaged"}
    assert (
        len(codes_at(node, names)) == 1
        and len([f for f in cqforensics.read_table(node, "findings").to_pylist() if f["file"] == str(names)]) == 2
    )


def test_embedded_copies_of_one_message_that_differ(tmp_path):
    """crafted placement, real bytes: a 3.10.8 queue dir copied under a second queue's name
    stands for a message routed to two CQv1 queues (each embeds the same bytes under the same
    id); a byte changed in one copy's body is a finding at that copy."""
    node = copy_node("3.10.8-clean", tmp_path / "m")
    src = next(
        d
        for d in sorted(node.glob(f"{VHOSTS}/queues/*"))
        if any(
            r["location"] == "embedded"
            for r in cqforensics.read_table(node, "index").to_pylist()
            if r["file"].startswith(str(d))
        )
    )
    copy = src.parent / ("Z" * len(src.name))
    shutil.copytree(src, copy)
    rows = [
        r
        for r in cqforensics.read_table(node, "index").to_pylist()
        if r["location"] == "embedded" and r["file"].startswith(str(copy))
    ]
    assert not {c for c, _, _ in findings(node)} & {"message-copies-differ"}
    r = rows[0]
    damage.flip(Path(r["file"]), r["store_offset"] + r["store_size"] - 3)
    flipped = Path(r["file"])
    twins = {os.path.relpath(p, node.parent) for p in (flipped, src / flipped.relative_to(copy))}
    got = {(f, o) for c, f, o in findings(node) if c == "message-copies-differ"}
    assert len(got) == 1 and next(iter(got))[0] in twins and next(iter(got))[1] == r["store_offset"]


# -- Mnesia, Khepri, DETS, ets ---------------------------------------------------------------------


def test_dcd_torn_junk_and_repeated_items(tmp_path):
    """The samples' table dumps are header-only (their records are in the .DCL logs): an item of
    the .DCL framed into the .DCD twice is a repeated item; the .DCL torn mid-item, and junk
    after the .DCD's header, are where the items stop."""
    node = copy_node("3.10.8-clean", tmp_path / "m")
    dcd, dcl = node / "rabbit_durable_queue.DCD", node / "rabbit_durable_queue.DCL"
    first = r_terms.read_disk_log(dcl).offsets[0]
    item, size = dcl.read_bytes()[first:], dcd.stat().st_size
    with open(dcd, "ab") as f:
        f.write(item + item)
    assert ("term-file-damaged", size + len(item)) in codes_at(node, dcd)
    damage.truncate(dcd, size)
    damage.junk(dcd, size, 12, seed=5)
    assert ("term-file-damaged", size + 4) in codes_at(node, dcd)  # the bad item magic
    damage.truncate(dcl, dcl.stat().st_size - 3)  # its last item torn
    assert ("term-file-damaged", first) in codes_at(node, dcl)


def test_transaction_log_junk(tmp_path):
    node = copy_node("4.0.5-kill", tmp_path / "m")
    log = node / "LATEST.LOG"
    size = log.stat().st_size
    with open(log, "ab") as f:
        f.write(b"\x00\x00")
    assert ("term-file-damaged", size) in codes_at(node, log)


def test_khepri_wal_torn_and_junk(tmp_path):
    node = copy_node("4.2.2-clean", tmp_path / "m")
    wal = next(node.glob("coordination/*/*.wal"))
    size = wal.stat().st_size
    damage.truncate(wal, size - 1)
    torn = {o for c, o in codes_at(node, wal) if c == "term-file-damaged"}
    assert len(torn) == 1 and 5 <= next(iter(torn)) < size
    wal.write_bytes((SAMPLES / "4.2.2-clean" / "mnesia" / wal.relative_to(node.parent)).read_bytes())
    with open(wal, "ab") as f:
        f.write(bytes(range(7, 90)))
    assert ("term-file-damaged", size) in codes_at(node, wal)


def test_recovery_dets_junk_torn_and_extra_object(tmp_path):
    node = copy_node("3.10.8-clean", tmp_path / "m")
    dets = max(node.glob(f"{VHOSTS}/recovery.dets"), key=lambda p: p.stat().st_size)
    original, size = dets.read_bytes(), dets.stat().st_size
    with open(dets, "ab") as f:
        f.write(b"junk")
    assert ("term-file-damaged", size) in codes_at(node, dets)
    damage.truncate(dets, size - 6)
    assert any(c == "term-file-damaged" for c, _ in codes_at(node, dets))
    (objects,) = struct.unpack_from(">I", original, 32)
    dets.write_bytes(original[:32] + struct.pack(">I", objects - 1) + original[36:])  # one more than recorded
    assert any(c == "term-file-damaged" for c, _ in codes_at(node, dets))


def test_khepri_meta_dets_and_store_ets(tmp_path):
    node = copy_node("4.3.6-clean", tmp_path / "m")
    meta = next(node.glob("coordination/*/meta.dets"))
    size = meta.stat().st_size
    with open(meta, "ab") as f:
        f.write(b"\x01\x02")
    assert ("term-file-damaged", size) in codes_at(node, meta)
    ets = next(node.glob(f"{VHOSTS}/msg_store_persistent/msg_store_index.ets"))
    log = r_terms.read_disk_log(ets)
    original = ets.read_bytes()
    ets.write_bytes(original + original[log.offsets[1] : log.offsets[2]])  # an object item after the end marker
    assert ("term-file-damaged", len(original)) in codes_at(node, ets)
    ets.write_bytes(original)
    damage.truncate(ets, log.offsets[-1] + 3)
    assert ("term-file-damaged", log.offsets[-1]) in codes_at(node, ets)


def test_dets_left_open_by_kill_and_truncated_is_torn(tmp_path):
    """A table open at kill -9 (not closed properly: OTP repairs it) cut below the size its header
    recorded when it was opened (fuzz seed 4041)."""
    node = copy_node("4.3.6-kill", tmp_path / "m")
    meta = next(node.glob("coordination/*/meta.dets"))
    assert struct.unpack_from(">I", meta.read_bytes(), 8)[0] != 1  # left open by the kill
    damage.truncate(meta, 684)
    assert ("term-file-damaged", 0) in codes_at(node, meta)


def test_dets_table_of_another_shape_in_its_place(tmp_path):
    """A swap the fuzz campaign made (seed 13001): an MQTT retained-message table and an empty
    recovery.dets exchanged. Each header names the other's keypos (the broker's open fails,
    keypos_mismatch, empty or not); the recovery.dets also holds a #retained_message{}."""
    node = copy_node("4.3.6-proto-kill", tmp_path / "m")
    retained = max(node.glob("mqtt_retained_*.dets"), key=lambda p: len(r_terms.read_dets_objects(p)))
    recovery = next(node.glob(f"{VHOSTS}/recovery.dets"))
    assert not codes_at(node, retained) and not codes_at(node, recovery)
    a, b = retained.read_bytes(), recovery.read_bytes()
    retained.write_bytes(b)
    recovery.write_bytes(a)
    assert ("term-file-damaged", 28) in codes_at(node, retained)  # the header's keypos
    ((at, _),) = r_terms._dets_objects(a)
    assert {("term-file-damaged", 28), ("term-file-damaged", at)} <= codes_at(node, recovery)


def test_dets_table_holding_another_tables_records(tmp_path):
    """Crafted placement, real bytes: a non-empty recovery.dets replaced by Khepri's meta.dets (both
    sets of keypos 1): its objects are no {QueueDirName, Terms}."""
    node = copy_node("4.3.6-clean", tmp_path / "m")
    meta = next(node.glob("coordination/*/meta.dets"))
    recovery = next(p for p in node.glob(f"{VHOSTS}/recovery.dets") if r_terms.read_dets_objects(p))
    recovery.write_bytes(meta.read_bytes())
    ((at, _),) = r_terms._dets_objects(meta.read_bytes())
    assert ("term-file-damaged", at) in codes_at(node, recovery)


def test_ra_meta_dets_swapped_between_systems(tmp_path):
    """Crafted swap, real bytes: Khepri's meta.dets (the record of its one Ra server) and the quorum
    system's empty one exchanged (both sets of keypos 1, left open by kill -9): Khepri's server has
    no record; the quorum system's table holds the record of a server it does not know."""
    node = copy_node("4.3.6-kill", tmp_path / "m")
    khepri, quorum = next(node.glob("coordination/*/meta.dets")), next(node.glob("quorum/*/meta.dets"))
    a, b = khepri.read_bytes(), quorum.read_bytes()
    assert not codes_at(node, khepri) and not codes_at(node, quorum)
    khepri.write_bytes(b)
    quorum.write_bytes(a)
    ((at, _),) = r_terms._dets_objects(a)
    assert codes_at(node, khepri) == {("term-file-damaged", None)}
    assert codes_at(node, quorum) == {("term-file-damaged", at)}


@pytest.mark.parametrize("word", [596, 1376, 4200])  # part pointer 71, segment pointer 10, slot 102
def test_open_dets_table_word_otp_never_writes(tmp_path, word):
    """Fuzz seeds 13091 and 7120: a bit flipped in a zero word of a DETS table left open by kill -9
    (OTP repairs it from its object blocks and never reads the word): info at the word."""
    node = copy_node("4.3.6-kill", tmp_path / "m")
    meta = next(node.glob("quorum/*/meta.dets"))
    data = meta.read_bytes()
    assert struct.unpack_from(">I", data, 8)[0] == 0 and data[word : word + 4] == bytes(4)
    damage.flip(meta, word + 1, 0x10)
    rows = [r for r in cqforensics.read_table(node, "findings").to_pylist() if r["file"] == str(meta)]
    assert [(r["code"], r["offset"], r["severity"]) for r in rows] == [("term-file-damaged", word, "info")]


def test_open_dets_table_block_header_zeroed(tmp_path):
    """A DETS table left open by kill -9 (Khepri's meta.dets): OTP's repair at open finds objects
    by their <<Size, ACTIVE>> block headers; one zeroed, its objects are lost: a warning there."""
    node = copy_node("4.3.6-kill", tmp_path / "m")
    meta = next(node.glob("coordination/*/meta.dets"))
    ((at, _),) = r_terms._dets_objects(meta.read_bytes())
    damage.zero(meta, at - 8, 8)  # the block header before its first object
    rows = [r for r in cqforensics.read_table(node, "findings").to_pylist() if r["file"] == str(meta)]
    assert ("term-file-damaged", at - 8, "warning") in {(r["code"], r["offset"], r["severity"]) for r in rows}


def test_open_dets_table_truncated_inside_its_first_segment(tmp_path):
    """Fuzz seed 15027: an empty DETS table left open by kill -9 cut to 877 bytes, inside the
    part and segment OTP writes when it creates any table: torn, at the end."""
    node = copy_node("4.0.5-proto-kill", tmp_path / "m")
    meta = next(node.glob("quorum/*/meta.dets"))
    damage.truncate(meta, 877)
    assert ("term-file-damaged", 877) in codes_at(node, meta)


def test_transient_rdq_replaced_after_a_clean_stop(tmp_path):
    """Fuzz seed 15020: a vhost's transient 0.rdq and persistent 0.rdq exchanged after a clean
    stop: each store's file_summary.ets records other sizes; the transient file is named too (info)."""
    node = copy_node("4.3.6-clean", tmp_path / "m")
    vhost = min(node.glob(VHOSTS), key=lambda p: sum(f.stat().st_size for f in p.rglob("*.rdq")))
    a, b = vhost / "msg_store_transient/0.rdq", vhost / "msg_store_persistent/0.rdq"
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)
    rows = [r for r in cqforensics.read_table(node, "findings").to_pylist() if r["file"] == str(a)]
    assert ("rdq-garbage", min(len(da), len(db)), "info") in {(r["code"], r["offset"], r["severity"]) for r in rows}


def test_recovery_dets_replaced_by_an_empty_one_after_a_clean_stop(tmp_path):
    """Crafted placement, real bytes: a clean stop's recovery.dets replaced by another vhost's (empty,
    of the same shape): every queue stores its terms at a clean stop, so the table is stale."""
    node = copy_node("3.10.8-clean", tmp_path / "m")
    tables = sorted(node.glob(f"{VHOSTS}/recovery.dets"), key=lambda p: len(r_terms.read_dets_objects(p)))
    assert len(r_terms.read_dets_objects(tables[0])) < len(r_terms.read_dets_objects(tables[-1]))
    assert not codes_at(node, tables[-1])
    tables[-1].write_bytes(tables[0].read_bytes())
    assert ("term-file-damaged", None) in codes_at(node, tables[-1])


def test_mnesia_log_header_byte_zeroed(tmp_path):
    """Fuzz seed 13125: one byte of DECISION_TAB.LOG's header item zeroed (a NUL in the node name)."""
    node = copy_node("3.10.8-proto-clean", tmp_path / "m")
    log = node / "DECISION_TAB.LOG"
    first = r_terms.read_disk_log(log).offsets[0]
    damage.zero(log, 76, 1)
    assert ("term-file-damaged", first) in codes_at(node, log)


def test_transient_store_entry_zeroed_after_a_clean_stop(tmp_path):
    """A whole transient-store entry zeroed (a zero hole, normal in a compacted file): the clean
    stop's msg_store_index.ets records a message there. Info: the broker deletes the store at boot."""
    from cqforensics.readers import rdq as r_rdq

    node = copy_node("3.13.7-clean", tmp_path / "m")
    rdq = max(node.glob(f"{VHOSTS}/msg_store_transient/0.rdq"), key=lambda p: p.stat().st_size)
    f = r_rdq.walk(rdq, 0)
    at, total = int(f.offsets[5]), int(f.totals[5])
    damage.zero(rdq, at, total)
    rows = [r for r in cqforensics.read_table(node, "findings").to_pylist() if r["file"] == str(rdq)]
    assert [(r["code"], r["offset"], r["severity"]) for r in rows] == [("rdq-garbage", at, "info")]


def test_rdq_body_changed_in_place_is_undetectable_payload(tmp_path):
    """Fuzz seed 13073: 64 bytes zeroed inside a transient-store message's body. rabbit_msg_file
    frames an entry with no checksum: the campaign counts it as undetectable, not silent; a change
    to the entry's structure is not counted so."""
    sys.path.insert(0, str(ROOT / "fuzz"))
    try:
        import campaign
    finally:
        sys.path.remove(str(ROOT / "fuzz"))
    from cqforensics.readers import rdq as r_rdq

    base = tmp_path / "m"
    node = copy_node("3.13.7-clean", base)
    rdq = max(node.glob(f"{VHOSTS}/msg_store_transient/0.rdq"), key=lambda p: p.stat().st_size)
    f = r_rdq.walk(rdq, 0)
    at, total = next((int(o), int(t)) for o, t in zip(f.offsets, f.totals) if t > 60000)
    inp = {"target": str(rdq), "base": base, "dataset": "3.13.7-clean"}
    damage.zero(rdq, at + total // 2, 64)
    assert campaign._payload_only(inp)
    damage.zero(rdq, at + 24, 4)  # the term's head: no longer the same message
    assert not campaign._payload_only(inp)


# -- node-level special files ----------------------------------------------------------------------

NODE_LEVEL = [
    "rabbit_durable_queue.DCD",
    "cluster_nodes.config",
    "schema.DAT",
    "LATEST.LOG",
    "FEATURE_FLAGS",
    "nodes_running_at_shutdown",
    "node-type.txt",
    "rabbit_serial",
    "coordination/*/meta.dets",
    "coordination/*/*.wal",
    "quorum/*/names.dets",
]


#: the child that reads each copy's findings, a copy after the other: a line when it starts one (so
#: that a read that blocks is named) and a line with its findings, or the traceback it raised
_READ_EACH = """
import json, sys, traceback
sys.path.insert(0, sys.argv[1])
import cqforensics
for name, node in json.loads(sys.argv[2]):
    print(json.dumps({"reading": name}), flush=True)
    try:
        rows = cqforensics.read_table(node, "findings").to_pylist()
        print(json.dumps({"name": name, "findings": [[r["code"], r["file"]] for r in rows]}), flush=True)
    except BaseException:
        print(json.dumps({"name": name, "raised": traceback.format_exc()}), flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_node_level_fifo_is_a_finding_and_never_blocks(tmp_path):
    """Each of NODE_LEVEL made a FIFO (crafted) in a copy of its own of the 4.0.5 node, whose
    findings name it ``not-regular-file``. The copies are read in one child, one after the other
    (one interpreter, not one per copy): a read that blocks hangs the child, not the test run, and
    the child's last line names the copy it blocks on; a read that raises is reported by name."""
    import json

    targets = {}
    for i, name in enumerate(NODE_LEVEL):
        node = copy_node("4.0.5-clean", tmp_path / f"m{i}")
        if name == "FEATURE_FLAGS":
            target = node.parent / f"{node.name}-feature_flags"
        else:
            target = next(node.glob(name))
        target.unlink()
        os.mkfifo(target)
        targets[name] = (node, target)
    argv = [
        sys.executable,
        "-c",
        _READ_EACH,
        str(ROOT),
        json.dumps([[n, str(node)] for n, (node, _) in targets.items()]),
    ]
    try:  # the bound the reads had one child each: 120 s a copy
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120 * len(NODE_LEVEL))
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        started = [json.loads(line)["reading"] for line in out.splitlines() if '"reading"' in line]
        pytest.fail(f"the read of the copy with a FIFO for {started[-1] if started else '(none started)'} blocks")
    assert p.returncode == 0, p.stderr[-1500:]
    done = {r["name"]: r for r in map(json.loads, p.stdout.splitlines()) if "name" in r}
    bad = {}
    for name, (_, target) in targets.items():
        r = done.get(name, {"raised": "not read"})
        if "raised" in r:
            bad[name] = r["raised"][-1500:]
        elif ["not-regular-file", str(target)] not in r["findings"]:
            bad[name] = "no not-regular-file finding names it"
    assert not bad, bad


# -- dump streams: a sparse 50 GB file, bounded memory --------------------------------------------------

_PEAK = """
import sys
from cli.main import main
try:
    rc = main(sys.argv[1:])
finally:  # this process's own peak (VmHWM: its own memory since exec; see _dump_in_child)
    peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    sys.stderr.write("\\n" + peak)
sys.exit(rc)
"""


def _dump_in_child(path: Path) -> tuple[int, float, int, str]:
    """``cqforensics dump PATH`` in a child: (exit code, seconds, the child's own peak RSS in MB,
    stderr tail). The peak is the child's VmHWM, read by the child at exit: getrusage and wait4
    report the larger of it and the RSS of the process the child was forked from (Linux copies
    the parent's high-water mark at exec), which is this pytest process, hundreds of MB after
    some earlier tests."""
    import time

    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", _PEAK, "dump", str(path)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    wall = time.monotonic() - t0
    err, _, peak = p.stderr.rpartition("\nVmHWM:")
    return p.returncode, wall, int(peak.split()[0]) // 1024 if peak else 1 << 20, err[-800:]


def _sparse(path: Path, head: bytes, size: int = 50 << 30, tail: bytes = b"") -> Path:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
        if tail:
            f.seek(size - len(tail))
            f.write(tail)
    if os.stat(path).st_blocks * 512 > 64 << 20:
        pytest.skip("the file system does not keep sparse files")
    return path


def test_dump_of_sparse_50gb_qs_qi_idx_dets_is_fast_and_small(tmp_path):
    src = copy_node("4.3.6-clean", tmp_path / "m")
    qs_src = max(src.glob(f"{VHOSTS}/queues/*/*.qs"), key=lambda p: p.stat().st_size).read_bytes()
    qi_src = max(src.glob(f"{VHOSTS}/queues/*/*.qi"), key=lambda p: p.stat().st_size).read_bytes()
    v1 = copy_node("3.10.8-clean", tmp_path / "v1")
    idx_src = max(v1.glob(f"{VHOSTS}/queues/*/*.idx"), key=lambda p: p.stat().st_size).read_bytes()
    dets_src = max(v1.glob(f"{VHOSTS}/recovery.dets"), key=lambda p: p.stat().st_size).read_bytes()
    d = tmp_path / "sparse"
    d.mkdir()
    cases = [
        _sparse(d / "0.qs", qs_src, tail=qs_src[-4096:]),
        _sparse(d / "0.qi", qi_src),
        _sparse(d / "0.idx", idx_src),
        _sparse(d / "recovery.dets", dets_src, tail=dets_src[-64:]),
    ]
    for path in cases:
        rc, wall, rss_mb, tail = _dump_in_child(path)
        assert rc in (0, 4), (path.name, rc, tail)
        assert "Traceback" not in tail and "internal error" not in tail, tail
        assert wall < 60, (path.name, wall)
        assert rss_mb < 400, (path.name, rss_mb)
    shutil.rmtree(d)


@pytest.mark.slow
def test_dump_of_half_gigabyte_of_real_zeros_keeps_memory_flat(tmp_path):
    """The same files, with their zeros written out (a file system that reports no holes, or a
    file zero-filled for real): every scan must drop the pages it has passed, so the dump's
    peak RSS stays far below the file's size."""
    src = copy_node("4.3.6-clean", tmp_path / "m")
    v1 = copy_node("3.10.8-clean", tmp_path / "v1")

    def biggest(node, pattern):
        return max(node.glob(f"{VHOSTS}/{pattern}"), key=lambda p: p.stat().st_size).read_bytes()

    qs, dets = biggest(src, "queues/*/*.qs"), biggest(v1, "recovery.dets")
    cases = [
        ("0.qs", qs, qs[-4096:]),
        ("0.qi", biggest(src, "queues/*/*.qi"), b""),
        ("0.idx", biggest(v1, "queues/*/*.idx"), b""),
        ("journal.jif", biggest(v1, "queues/*/journal.jif"), b""),
        ("recovery.dets", dets, dets[-64:]),
        ("0.rdq", biggest(src, "msg_store_persistent/*.rdq"), b""),
    ]
    zeros = bytes(1 << 20)
    for name, head, tail in cases:
        path = tmp_path / name
        with open(path, "wb") as f:
            f.write(head)
            for _ in range(512):
                f.write(zeros)
            f.write(tail)
        rc, wall, rss_mb, err = _dump_in_child(path)
        path.unlink()
        assert rc in (0, 4), (name, rc, err)
        assert "Traceback" not in err and "internal error" not in err, err
        assert wall < 60, (name, wall)
        assert rss_mb < 300, (name, rss_mb)


def test_qs_bytes_damaged_between_entries_no_live_entry_uses(tmp_path):
    """Fuzz seed 21118: 32 zeroed bytes across the end of an acked .qs entry and the head of
    the next (3.10.8 clean stop): QS2 leaves only zero-filled gaps, so a run that is neither an
    entry nor zeros is damage, reported where it starts though no live entry lies there."""
    node = copy_node("3.10.8-clean", tmp_path / "a")
    qs = next(node.glob("msg_stores/vhosts/*/queues/6YDEAK08VTDS4A3FHUQKO4Z1Y/0.qs"))
    data = bytearray(qs.read_bytes())
    data[1195:1227] = bytes(32)
    qs.write_bytes(bytes(data))
    assert ("qs-garbage", 64) in codes_at(node, qs)


def test_cluster_file_whose_disc_nodes_are_not_its_nodes(tmp_path):
    """Fuzz seed 23104: a flipped bit in the disc-node list of cluster_nodes.config
    ({AllNodes, DiscNodes}: rabbit_node_monitor writes DiscNodes as a subset)."""
    node = copy_node("3.10.8-kill", tmp_path / "a")
    cfg = node / "cluster_nodes.config"
    raw = cfg.read_bytes()
    i = raw.rindex(b"localhost")
    cfg.write_bytes(raw[:i] + b"locaLhost" + raw[i + 9 :])
    assert "term-file-damaged" in {c for c, _ in codes_at(node, cfg)}


def test_store_index_dump_of_another_store_in_its_place(tmp_path):
    """Fuzz seed 23149: the persistent store's msg_store_index.ets copied over the transient
    store's (4.0.5 clean stop): its records lie past the end of the transient files, whose sizes
    file_summary.ets confirms."""
    node = copy_node("4.0.5-clean", tmp_path / "a")
    vhost = next(
        v
        for v in node.glob("msg_stores/vhosts/*")
        if (v / "msg_store_transient" / "0.rdq").exists()
        and (v / "msg_store_persistent" / "msg_store_index.ets").exists()
    )
    t = vhost / "msg_store_transient" / "msg_store_index.ets"
    t.write_bytes((vhost / "msg_store_persistent" / "msg_store_index.ets").read_bytes())
    assert "term-file-damaged" in {c for c, _ in codes_at(node, t)}


@pytest.mark.parametrize("case", ["ets_table_name", "log_item_inside", "recovery_term_key"])
def test_damage_inside_terms_that_still_decode(tmp_path, case):
    """Fuzz seeds 25016, 25103, 25121: bytes changed inside a term that still decodes: the table
    name in an ets dump's info (ets:file2tab reads it; another table's dump names another), a
    Mnesia log item whose term no longer fills the item (disk_log wrote term_to_binary of it),
    a recovery term whose key is no atom the broker writes."""
    if case == "ets_table_name":
        node = copy_node("3.10.8-segments", tmp_path / "a")
        path = next(node.glob("msg_stores/vhosts/*/msg_store_persistent/msg_store_index.ets"))
        old, new = b"rabbit_msg_store_ets_index", b"rabbit_msg_store_ets_yndex"
    elif case == "log_item_inside":
        node = copy_node("3.10.8-segments", tmp_path / "a")
        path = node / "DECISION_TAB.LOG"
        old, new = b"h\x02d\x00\rdecision_list", b"h\x00" + bytes(16)
    else:
        node = copy_node("4.1.8-clean", tmp_path / "a")
        path = next(node.glob("msg_stores/vhosts/*/recovery.dets"))
        old, new = b"persistent_ref", b"pers" + bytes(8) + b"ef"
    raw = path.read_bytes()
    assert old in raw and len(old) == len(new)
    path.write_bytes(raw.replace(old, new, 1))
    assert "term-file-damaged" in {c for c, _ in codes_at(node, path)}
