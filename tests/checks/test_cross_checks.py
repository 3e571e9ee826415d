"""Cross-checks of bytes no checksum covers (issue 33, the campaign of seeds 7700000-7700122): a
stream's tracking blocks against each other, an index record against its chunk, and the
coordination Ra system's log against what its server applied. Each damage is crafted on a
copy of a real broker's sample (labelled as such) and checked both ways: found where another
record repeats the bytes, not found (and documented in docs/streams.md) where none does."""

from __future__ import annotations

import json
import shutil
import zlib

import pytest

from cqforensics.grammar import osiris as g
from cqforensics.readers import osiris as r_osiris
from support import SAMPLES
from support.cli import run


def _stream_copy(tmp_path, dataset: str, name: str):
    src = next((SAMPLES / dataset / "mnesia").glob(f"*/stream/{name}_*"))
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def _tracking_findings(d):
    return [f for f in r_osiris.read_stream(d).findings if f.code in ("osiris-tracking-bad", "osiris-index-mismatch")]


def _trailer_value_at(d, chunk_id: int) -> tuple:
    """(segment, file offset of the 8-byte sequence value) of the writer block in a chunk's trailer."""
    scan = r_osiris.read_stream(d)
    c = next(c for c in scan.chunks if c.chunk_id == chunk_id)
    t0 = c.data_pos + c.data_size
    data = open(c.file, "rb").read()
    n = data[t0 + 1]
    return c.file, t0 + 2 + n


def _set_u64(path, at: int, value: int):
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(value.to_bytes(8, "big"))


@pytest.mark.parametrize("dataset", ["4.0.5-streams-kill", "4.3.6-streams-clean"])
def test_the_real_samples_are_in_step(dataset):
    for d in (SAMPLES / dataset / "mnesia").glob("*/stream/*"):
        assert _tracking_findings(d) == [], d


def test_a_writer_sequence_raised_in_a_middle_trailer_is_named_at_its_chunk(tmp_path):
    """Crafted (fuzz seed 7700068's class): chunk 370's trailer sequence raised; chunk 371 holds a
    lower one, so the block out of order is 370's."""
    d = _stream_copy(tmp_path, "4.0.5-streams-kill", "__st_retained")
    seg, at = _trailer_value_at(d, 370)
    _set_u64(seg, at, 1 << 40)
    (f,) = _tracking_findings(d)
    assert f.code == "osiris-tracking-bad" and f.details["kind"] == "sequence"
    assert f.message.startswith("chunk 370: trailer") and f.file == seg


def test_a_writer_sequence_lowered_is_named_at_its_chunk(tmp_path):
    """Crafted: chunk 360's trailer sequence set to 1 (below chunk 359's): 360 is named, not 361."""
    d = _stream_copy(tmp_path, "4.0.5-streams-kill", "__st_retained")
    seg, at = _trailer_value_at(d, 360)
    _set_u64(seg, at, 1)
    (f,) = _tracking_findings(d)
    assert f.message.startswith("chunk 360: trailer")


def test_the_last_trailer_raised_is_what_nothing_can_see(tmp_path):
    """Crafted, the other way: the writer's last trailer of the stream raised stays in order (no
    block after it): nothing names it (docs/streams.md says so)."""
    d = _stream_copy(tmp_path, "4.0.5-streams-kill", "__st_retained")
    scan = r_osiris.read_stream(d)
    last = max(t.chunk_id for t in scan.tracking if t.source == "trailer")
    seg, at = _trailer_value_at(d, last)
    _set_u64(seg, at, 1 << 40)
    assert _tracking_findings(d) == []


def test_a_snapshot_lacking_a_writer_is_found(tmp_path):
    """Crafted (fuzz seed 7700110's class): a byte of the writer reference in the snapshot at the
    start of segment 353 changed: the snapshot lacks the writer chunk 352's trailer names."""
    d = _stream_copy(tmp_path, "4.3.6-streams-clean", "__st_retained")
    scan = r_osiris.read_stream(d)
    c = next(c for c in scan.chunks if c.chunk_type == g.CHNK_TRK_SNAPSHOT and c.chunk_id == 353)
    with open(c.file, "r+b") as f:
        f.seek(c.data_pos + 4 + 2 + 5)  # the simple entry's length, type, reference length; 5 bytes in
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x20]))
        # the tracking chunk's body is CRC-covered: recompute it as osiris would have written it
    data = bytearray(open(c.file, "rb").read())
    crc = zlib.crc32(bytes(data[c.data_pos : c.data_pos + c.data_size]))
    data[c.pos + 32 : c.pos + 36] = crc.to_bytes(4, "big")  # CHUNK_HEADER: the CRC after the chunk id
    open(c.file, "wb").write(bytes(data))
    assert r_osiris.read_stream(d).segments[c.file[-28:-8]].chunks[0].valid
    found = _tracking_findings(d)
    assert any(
        f.details["kind"] == "missing" and f.message.startswith("chunk 353: snapshot lacks writer") for f in found
    )


def test_an_index_timestamp_other_than_its_chunks_is_found(tmp_path):
    """Crafted (fuzz seed 7700027's class): record 1's timestamp set to 2^64-1 (as signed: -1)."""
    d = _stream_copy(tmp_path, "3.10.8-streams-kill", "__st_retained")
    idx = sorted(d.glob("*.index"))[-1]
    _set_u64(idx, g.IDX_HEADER_SIZE + g.INDEX_RECORD_SIZE + 8, (1 << 64) - 1)
    at_index, at_chunk = _tracking_findings(d)  # both ends: either may be the damaged one
    assert {at_index.code, at_chunk.code} == {"osiris-index-mismatch"}
    assert at_index.details["kind"] == at_chunk.details["kind"] == "timestamp"
    assert (at_index.file, at_index.offset) == (str(idx), g.IDX_HEADER_SIZE + g.INDEX_RECORD_SIZE)
    assert at_chunk.file.endswith(".segment") and at_chunk.offset == at_index.details["chunk_pos"]


@pytest.mark.parametrize("dataset", ["4.3.6-rolled", "4.1.8-clean"])
def test_a_coordination_log_shorter_than_what_khepri_applied_is_found(tmp_path, capsys, dataset):
    """Crafted (fuzz seeds 7700090, 7700118): the coordination system's WAL replaced by the
    quorum system's (a header only): Khepri's meta.dets says it applied entries its log no longer
    holds. The sample as it is: nothing said."""
    base = tmp_path / "mnesia"
    shutil.copytree(SAMPLES / dataset / "mnesia", base, symlinks=True)

    def khepri_findings():
        code, out, _ = run(capsys, "fsck", "--json", str(base))
        assert code < 8
        return [f for f in json.loads(out)["findings"] if "last_applied" in f.get("details", {})]

    assert khepri_findings() == []
    (coord,) = base.glob("*/coordination/*/*.wal")
    (quorum,) = base.glob("*/quorum/*/*.wal")
    shutil.copyfile(quorum, coord)
    (f,) = khepri_findings()
    assert f["code"] == "term-file-damaged" and f["severity"] == "error" and f["file"] == str(coord)
    assert f["details"]["server"] == "rabbitmq_metadata" and f["details"]["log_end"] < f["details"]["last_applied"]


@pytest.mark.parametrize("dataset", ["4.0.5-streams-kill", "4.3.6-streams-clean"])
def test_a_tracking_byte_is_found_exactly_where_another_block_repeats_it(tmp_path, dataset):
    """Crafted, seeded: 40 single-byte changes of tracking data (trailers, and tracking chunks with
    their CRC recomputed) per stream sample. The campaign's byte classes (fuzz/campaign.py
    ``_segment_classes``) say which no other block repeats (``osiris.tracking``: a consumer
    offset, a writer's last block, a snapshot whose segment before it is gone); every other
    change must be named in the changed segment, and none of those may be."""
    import random

    from fuzz import campaign

    rng = random.Random(f"tracking:{dataset}")
    src = next((SAMPLES / dataset / "mnesia").glob("*/stream/__st_retained_*"))
    spots = []
    for c in r_osiris.read_stream(src).chunks:
        if c.chunk_type == g.CHNK_USER:
            spots += [(c, x) for x in range(c.data_pos + c.data_size, c.end)]
        else:
            spots += [(c, x) for x in range(c.data_pos + 4, c.data_pos + c.data_size)]
    seen = set()
    for n in range(40):
        c, off = rng.choice(spots)
        d = tmp_path / str(n)
        shutil.copytree(src, d)
        seg = d / c.file.rsplit("/", 1)[1]
        data = bytearray(seg.read_bytes())
        old = data[off]
        data[off] = rng.choice([0, 255, old ^ 1, old ^ 0x80]) if old not in (0, 255) else old ^ 1
        if c.chunk_type != g.CHNK_USER:
            data[c.pos + 32 : c.pos + 36] = zlib.crc32(bytes(data[c.data_pos : c.data_pos + c.data_size])).to_bytes(
                4, "big"
            )
        seg.write_bytes(bytes(data))
        found = any(f.file == str(seg) and f.code != "stream-retention" for f in r_osiris.read_stream(d).findings)
        (cls,) = campaign._segment_classes(type(seg)(c.file), bytes(data), [off])
        assert found is (cls != "osiris.tracking"), (c.chunk_id, c.type_name, off - c.pos, old, data[off], cls)
        seen.add(cls)
    assert seen == {"osiris", "osiris.tracking"}  # both ways drawn
