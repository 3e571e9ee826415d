"""Ra's files (quorum queues): the grammars (grammar/ra.py) against the bytes real brokers wrote,
and the readers (readers/ra_*.py) on healthy and damaged copies. Crafted damage is labelled as
such: a byte flipped, a file cut, a tail zero-filled; every base byte comes from a real broker."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from cqforensics.codecs import etf
from cqforensics.grammar import ra as c_ra
from cqforensics.message import rabbit_fifo
from cqforensics.readers import ra_segment, ra_snapshot, ra_system, ra_wal
from cqforensics.readers.files import map_file
from support import SAMPLES

QUORUM = sorted(p.name for p in SAMPLES.glob("*-quorum-*") if (p / "mnesia").is_dir())
SYSTEMS = sorted(p for ds in QUORUM for p in (SAMPLES / ds / "mnesia").glob("*/quorum/*"))
WALS = sorted(p for s in SYSTEMS for p in s.glob("*.wal"))
SEGMENTS = sorted(p for s in SYSTEMS for p in s.glob("*/*.segment"))
SNAPSHOTS = sorted(p for s in SYSTEMS for p in s.glob("*/snapshots/*/snapshot.dat"))
ALL_SYSTEMS = sorted(p for p in SAMPLES.glob("*/mnesia/*/quorum/*") if p.is_dir())


def _id(p: Path) -> str:
    parts = p.parts
    return f"{parts[parts.index('sample_data') + 1]}/{p.name}"


def test_the_quorum_samples_hold_every_file_kind():
    assert {v.split("-quorum-")[0] for v in QUORUM} == {"3.10.8", "4.0.5", "4.3.6"}
    assert WALS and SEGMENTS and SNAPSHOTS
    assert any(len(p.stem) == 8 for p in WALS) and any(len(p.stem) == 16 for p in WALS)  # Ra 2.2 and 2.14 vs 3
    # a Ra 3 (4.3.6) snapshot; its ``indexes`` file is written only with live indexes below it (none here)
    assert any("4.3.6" in str(p) for p in SNAPSHOTS) and any("3.10.8" in str(p) for p in SNAPSHOTS)


def test_indexes_files_crafted_as_ra_3_writes_them(tmp_path):
    """Crafted (no sample holds one): RSNAP write_indexes/2's bytes for the live indexes 3, 7-9."""
    seq = etf.term_to_binary([(7, 9), 3])
    p = tmp_path / "indexes"
    p.write_bytes(b"RASI\x01" + zlib.crc32(seq).to_bytes(4, "big") + seq)
    idx = ra_snapshot.read_indexes(p)
    assert idx.status == "ok" and idx.indexes == [3, 7, 8, 9]
    assert c_ra.snapshot_indexes.build(c_ra.snapshot_indexes.parse(p.read_bytes())) == p.read_bytes()
    p.write_bytes(b"RASI\x01" + (zlib.crc32(seq) ^ 1).to_bytes(4, "big") + seq)
    assert ra_snapshot.read_indexes(p).status == "checksum_error"
    p.write_bytes(seq)  # the headerless form before the header was added
    assert ra_snapshot.read_indexes(p).indexes == [3, 7, 8, 9]
    p.write_bytes(b"RASI\x02" + bytes(8))
    assert ra_snapshot.read_indexes(p).status == "invalid_version"


# -- grammars ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", WALS, ids=_id)
def test_wal_records_round_trip_through_the_grammar(path):
    data = path.read_bytes()
    assert c_ra.wal_header.build(c_ra.wal_header.parse(data)) == data[:5]
    scan = ra_wal.walk(path)
    assert len(scan) > 0
    for i in range(len(scan)):
        start, end = int(scan.offset[i]), scan.record_end(i)
        rec = c_ra.wal_record.parse(data[start:end])
        assert c_ra.wal_record.build(rec) == data[start:end]
        assert (rec.index, rec.term, rec.length) == (scan.index[i], scan.term[i], scan.length[i])
        assert rec.head.ref == scan.ref[i] and rec.head.truncate == scan.truncate[i]
        assert (rec.uid is None) == bool(rec.head.cached)
        assert zlib.adler32(struct.pack(">QQ", rec.index, rec.term) + rec.data) == rec.checksum


@pytest.mark.parametrize("path", SEGMENTS, ids=_id)
def test_segment_header_and_index_round_trip_through_the_grammar(path):
    data = path.read_bytes()
    head = c_ra.seg_header.parse(data)
    assert c_ra.seg_header.build(head) == data[:8] and head.version == 2
    seg = ra_segment.read_segment(path)
    grammar = c_ra.seg_index_v2 if head.version == 2 else c_ra.seg_index_v1
    for i in range(len(seg)):
        at = c_ra.SEG_HEADER_SIZE + int(seg.slot[i]) * seg.record_size()
        raw = data[at : at + seg.record_size()]
        rec = grammar.parse(raw)
        assert grammar.build(rec) == raw
        assert c_ra.SEG_INDEX[head.version].unpack(raw) == (rec.index, rec.term, rec.offset, rec.length, rec.crc)
        assert zlib.crc32(data[rec.offset : rec.offset + rec.length]) == rec.crc


def test_the_v1_index_layout_is_28_bytes_with_a_32_bit_offset():
    raw = struct.pack(">QQIII", 7, 2, 4096 + 8, 10, 0xDEADBEEF)
    rec = c_ra.seg_index_v1.parse(raw)
    assert (rec.index, rec.term, rec.offset, rec.length, rec.crc) == (7, 2, 4104, 10, 0xDEADBEEF)
    assert c_ra.seg_index_v1.build(rec) == raw and c_ra.SEG_INDEX_SIZE == {2: 32, 1: 28}


@pytest.mark.parametrize("path", SNAPSHOTS, ids=_id)
def test_snapshots_round_trip_through_the_grammar(path):
    data = path.read_bytes()
    snap = c_ra.snapshot.parse(data)
    assert c_ra.snapshot.build(snap) == data
    assert zlib.crc32(data[9:]) == snap.crc
    meta = etf.decode(snap.meta)[0]
    assert path.parent.name == f"{meta['term']:016X}_{meta['index']:016X}"
    idx = path.parent / "indexes"
    if idx.exists():
        raw = idx.read_bytes()
        parsed = c_ra.snapshot_indexes.parse(raw)
        assert c_ra.snapshot_indexes.build(parsed) == raw and zlib.crc32(parsed.data) == parsed.crc


# -- readers on healthy bytes --------------------------------------------------------------------


@pytest.mark.parametrize("path", WALS, ids=_id)
def test_wal_reader_frames_every_record_of_a_healthy_wal(path):
    data = map_file(path)
    scan = ra_wal.walk(path, data)
    assert scan.header_ok and scan.end.kind == ra_wal.END_EOF and scan.end.offset == scan.size
    assert set(scan.checksum.tolist()) == {ra_wal.CHECK_OK} and scan.known.all()
    names = {r.uid for r in ra_system.read_names(path.parent / "names.dets").records}
    assert set(scan.writers.values()) <= names | {p.name.encode() for p in path.parent.iterdir() if p.is_dir()}
    for i in range(len(scan)):  # every entry is a Ra entry rabbit_fifo's codec knows
        entry = rabbit_fifo.decode(ra_wal.record_data(data, scan, i))
        assert entry.kind != "other" and (entry.command is None or entry.command.name != "unknown")


@pytest.mark.parametrize("path", SEGMENTS, ids=_id)
def test_segment_reader_checks_every_entry_of_a_healthy_segment(path):
    seg = ra_segment.read_segment(path)
    assert seg.readable and seg.trimmed == 0
    if not len(seg):  # opened by the segment writer but never written (LOG recover_range/3 skips it)
        assert seg.range is None and seg.size <= c_ra.SEG_HEADER_SIZE + seg.max_count * 32
        return
    assert set(seg.status.tolist()) == {ra_segment.ENTRY_OK}
    first, last = seg.range
    assert list(seg.index) == list(range(first, last + 1))


@pytest.mark.parametrize("path", SNAPSHOTS, ids=_id)
def test_snapshot_reader_validates_and_decodes(path):
    snap = ra_snapshot.read_snapshot(path)
    assert snap.ok and (snap.index, snap.term) == ra_snapshot.dir_index_term(path.parent.name)
    state = snap.state()
    assert isinstance(state, tuple) and state[0] == "rabbit_fifo"
    if (path.parent / "indexes").exists():
        assert ra_snapshot.read_indexes(path.parent / "indexes").status == "ok"


@pytest.mark.parametrize("system", ALL_SYSTEMS, ids=lambda p: p.parts[p.parts.index("sample_data") + 1])
def test_small_files_of_every_sample_system(system):
    names = ra_system.read_names(system / "names.dets")
    meta = ra_system.read_meta(system / "meta.dets")
    assert names.error is None and meta.error is None and not names.other and not meta.other
    configs = {p.parent.name: ra_system.read_config(p) for p in system.glob("*/config")}
    assert {r.uid.decode() for r in names.records} == set(configs)
    assert {r.uid.decode() for r in meta.records} == set(configs)
    for uid, cfg in configs.items():
        assert cfg.error is None and cfg.uid == uid.encode() and cfg.machine_module == "rabbit_fifo"
        vhost, name = cfg.queue_resource
        assert cfg.cluster_name.endswith("_" + name.decode())
    if (system / "writers.snapshot").exists():
        writers, why = ra_system.read_writers(system / "writers.snapshot")
        assert why is None and set(writers) <= {u.encode() for u in configs}


# -- readers on damaged bytes (crafted from the real files) --------------------------------------


def _wal(tmp_path) -> tuple[Path, bytes, ra_wal.WalScan]:
    src = next(p for p in WALS if "4.3.6-quorum-kill" in str(p))
    dst = tmp_path / src.name
    dst.write_bytes(src.read_bytes())
    return dst, dst.read_bytes(), ra_wal.walk(dst)


def test_a_flipped_byte_in_a_record_fails_its_checksum_at_that_record(tmp_path):
    path, data, scan = _wal(tmp_path)
    i = len(scan) // 2
    at = int(scan.data_offset[i]) + int(scan.length[i]) // 2
    path.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :])
    bad = ra_wal.walk(path)
    assert bad.first_bad() == i and int(bad.offset[i]) == int(scan.offset[i])
    assert not bad.bad_is_last(i)  # records follow: Ra refuses to start
    assert len(bad) == len(scan)  # the framing still holds after it


def test_a_bad_checksum_on_the_last_record_is_forgiven(tmp_path):
    path, data, scan = _wal(tmp_path)
    last = len(scan) - 1
    at = int(scan.data_offset[last])
    path.write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :] + bytes(13))
    bad = ra_wal.walk(path)
    assert bad.first_bad() == last and bad.bad_is_last(last)


def test_a_cut_wal_ends_torn_at_the_cut_record(tmp_path):
    path, data, scan = _wal(tmp_path)
    cut = int(len(data) * 0.6)
    path.write_bytes(data[:cut])
    torn = ra_wal.walk(path)
    assert torn.end.kind == ra_wal.END_TORN
    whole = [i for i in range(len(scan)) if scan.record_end(i) <= cut]
    assert len(torn) == len(whole) and torn.end.offset == (scan.record_end(whole[-1]) if whole else 5)


def test_a_zero_filled_tail_ends_the_wal(tmp_path):
    path, data, scan = _wal(tmp_path)
    at = int(scan.offset[len(scan) // 3])
    path.write_bytes(data[:at] + bytes(len(data) - at))
    z = ra_wal.walk(path)
    assert z.end.kind == ra_wal.END_ZEROED and z.end.offset == at and len(z) == len(scan) // 3


@pytest.mark.parametrize(
    "content,kind",
    [
        (b"", ra_wal.END_SHORT),
        (b"RAW", ra_wal.END_SHORT),
        (b"RAWB\x01" + bytes(40), ra_wal.END_NO_HEADER),
        (b"RAWA\x02" + bytes(40), ra_wal.END_NO_HEADER),
    ],
)
def test_a_wal_without_its_header(tmp_path, content, kind):
    p = tmp_path / "00000001.wal"
    p.write_bytes(content)
    scan = ra_wal.walk(p)
    assert not scan.header_ok and scan.end.kind == kind and len(scan) == 0


def test_a_cached_reference_no_record_named_is_flagged_unknown(tmp_path):
    path, data, scan = _wal(tmp_path)
    # crafted: the first record's head says "cached, ref 5" and its UId bytes are dropped
    uid_len = len(scan.writers[int(scan.ref[0])])
    head = (0x400000 | 5).to_bytes(3, "big")
    path.write_bytes(data[:5] + head + data[5 + 3 + 2 + uid_len :])
    bad = ra_wal.walk(path)
    assert not bad.known[0] and bad.uid(0) is None and bad.ref[0] == 5


def test_hostile_lengths_never_raise(tmp_path):
    path, data, scan = _wal(tmp_path)
    at = int(scan.data_offset[0]) - 20  # the first record's length field
    path.write_bytes(data[:at] + b"\xff\xff\xff\xff" + data[at + 4 :])
    bad = ra_wal.walk(path)
    assert bad.end.kind == ra_wal.END_TORN and bad.end.offset == 5 and len(bad) == 0


def _segment(tmp_path) -> tuple[Path, bytes, ra_segment.Segment]:
    src = next(p for p in SEGMENTS if len(ra_segment.read_segment(p)) > 10)
    dst = tmp_path / src.name
    dst.write_bytes(src.read_bytes())
    return dst, dst.read_bytes(), ra_segment.read_segment(dst)


def test_a_flipped_byte_in_a_segment_entry_fails_its_crc(tmp_path):
    path, data, seg = _segment(tmp_path)
    i = len(seg) // 2
    at = int(seg.offset[i]) + 3
    path.write_bytes(data[:at] + bytes([data[at] ^ 0x55]) + data[at + 1 :])
    bad = ra_segment.read_segment(path)
    assert bad.status[i] == ra_segment.ENTRY_BAD_CRC
    assert (bad.status != ra_segment.ENTRY_OK).sum() == 1


def test_a_truncated_segment_loses_its_last_entries_data(tmp_path):
    path, data, seg = _segment(tmp_path)
    i = len(seg) - 3
    path.write_bytes(data[: int(seg.offset[i]) + 1])
    bad = ra_segment.read_segment(path)
    assert len(bad) == len(seg)  # the index is whole
    assert (bad.status[:i] == ra_segment.ENTRY_OK).all() and (bad.status[i:] == ra_segment.ENTRY_PAST_EOF).all()


def test_a_segment_cut_inside_its_index(tmp_path):
    path, data, seg = _segment(tmp_path)
    path.write_bytes(data[: c_ra.SEG_HEADER_SIZE + 32 * 3 + 10])
    bad = ra_segment.read_segment(path)
    assert bad.torn_index and not bad.readable and len(bad) == 3
    assert (bad.status == ra_segment.ENTRY_PAST_EOF).all()


@pytest.mark.parametrize(
    "content,header",
    [
        (b"", ra_segment.HEADER_MISSING),
        (b"RASG\x00", ra_segment.HEADER_MISSING),
        (b"RASX\x00\x02\x10\x00", ra_segment.HEADER_BAD),
        (b"RASG\x00\x03\x10\x00", ra_segment.HEADER_BAD),
        (b"RASG\x00\x00\x10\x00", ra_segment.HEADER_VERSION0),
    ],
)
def test_segment_headers(tmp_path, content, header):
    p = tmp_path / "0000000000000001.segment"
    p.write_bytes(content)
    seg = ra_segment.read_segment(p)
    assert seg.header == header and not seg.readable and len(seg) == 0


def test_an_index_record_going_back_trims_the_records_above_it(tmp_path):
    path, data, seg = _segment(tmp_path)
    # crafted: the 4th record rewritten to carry the 2nd one's index (a follower's overwrite)
    at = c_ra.SEG_HEADER_SIZE + 3 * 32
    path.write_bytes(data[:at] + struct.pack(">Q", int(seg.index[1])) + data[at + 8 :])
    bad = ra_segment.read_segment(path)
    assert bad.trimmed == 1 and list(bad.index[:3]) == [seg.index[0], seg.index[1], seg.index[1]]  # the 3rd went


def test_a_damaged_snapshot_fails_its_crc_and_short_ones_say_so(tmp_path):
    src = SNAPSHOTS[0]
    data = src.read_bytes()
    p = tmp_path / "snapshot.dat"
    p.write_bytes(data[:-10] + bytes([data[-10] ^ 1]) + data[-9:])
    assert ra_snapshot.read_snapshot(p).status == ra_snapshot.SNAP_CRC
    p.write_bytes(data[:7])
    assert ra_snapshot.read_snapshot(p).status == ra_snapshot.SNAP_SHORT
    p.write_bytes(b"RASX" + data[4:])
    assert ra_snapshot.read_snapshot(p).status == ra_snapshot.SNAP_FORMAT
    p.write_bytes(data[:4] + b"\x02" + data[5:])
    assert ra_snapshot.read_snapshot(p).status == ra_snapshot.SNAP_VERSION
    p.write_bytes(data[: len(data) // 2])
    cut = ra_snapshot.read_snapshot(p)
    assert cut.status == ra_snapshot.SNAP_CRC and not cut.ok


def test_ra_seq_expansion_is_bounded():
    assert ra_snapshot.expand_seq([(7, 9), 4, (1, 2)]) == [1, 2, 4, 7, 8, 9]
    with pytest.raises(ValueError):
        ra_snapshot.expand_seq([(0, 1 << 40)])
    with pytest.raises(TypeError):
        ra_snapshot.expand_seq("no")


def test_a_damaged_config_is_a_note_not_an_exception(tmp_path):
    src = next(p for s in SYSTEMS for p in s.glob("*/config"))
    p = tmp_path / "config"
    p.write_bytes(src.read_bytes()[:200])
    cfg = ra_system.read_config(p)
    assert cfg.terms is None and cfg.error and cfg.queue_resource is None
    p.write_bytes(b"#{a => 1}.")
    assert ra_system.read_config(p).terms == {"a": 1}
