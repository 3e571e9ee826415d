"""Damage made at test time to a stream directory a real broker wrote (no byte is made up: each
damage cuts, flips, deletes or truncates what the broker wrote). Used by tests/model/test_streams.py
(the model) and tests/real_brokers/test_streams_brokers.py (the real broker booted on the damaged copy).

Each function takes a stream dir (``<node dir>/stream/<name>/``) and returns what it did (a
dict for the test's messages)."""

from __future__ import annotations

from pathlib import Path

from cqforensics.grammar import osiris as g
from cqforensics.readers import osiris as r_osiris


def _pairs(d: Path) -> list[tuple[Path, Path]]:
    return [(s, s.with_suffix(".index")) for s in sorted(d.glob("*.segment"))]


def _flip(d: Path, pick, where: str) -> dict:
    """Flip one byte of the chunk ``pick`` chooses (a user chunk of one entry): the last byte of
    its data (the message body: it still decodes) or the first byte of its record (the AMQP 1.0
    section descriptor: it no longer does)."""
    scan = r_osiris.read_stream(d)
    c = pick([c for c in scan.chunks if c.chunk_type == g.CHNK_USER and c.num_entries == 1 and c.valid])
    pos = c.data_pos + c.data_size - 1 if where == "body" else c.data_pos + g.SIMPLE_HEAD_SIZE
    data = bytearray(Path(c.file).read_bytes())
    data[pos] ^= 0xFF
    Path(c.file).write_bytes(bytes(data))
    return {"chunk_id": c.chunk_id, "file": c.file, "byte": pos}


def torn(d: Path) -> dict:
    """The last segment loses its last 10 bytes (a torn last write)."""
    seg = _pairs(d)[-1][0]
    data = seg.read_bytes()
    seg.write_bytes(data[:-10])
    return {"file": str(seg), "size": len(data) - 10}


def crc_early(d: Path) -> dict:
    """A byte of the body of a one-entry chunk among the first offsets (inside an AMQP 0-9-1
    consumer's first read with prefetch 100)."""
    return _flip(d, lambda cs: next(c for c in cs if 5 <= c.chunk_id < 60), "body")


def crc_late(d: Path) -> dict:
    """A byte of the body of a one-entry chunk past the first 110 offsets."""
    return _flip(d, lambda cs: next(c for c in cs if c.chunk_id >= 110), "body")


def record_mangled(d: Path) -> dict:
    """The first byte of a late record (its first section's descriptor): the chunk fails its
    CRC and the record is no AMQP 1.0 message."""
    return _flip(d, lambda cs: next(c for c in cs if c.chunk_id >= 120), "record")


def no_index_last(d: Path) -> dict:
    """The last segment's index file is deleted."""
    idx = _pairs(d)[-1][1]
    idx.unlink()
    return {"file": str(idx)}


def no_index_all(d: Path) -> dict:
    """Every index file is deleted."""
    gone = [str(i) for _, i in _pairs(d)]
    for i in gone:
        Path(i).unlink()
    return {"files": gone}


def no_segment_last(d: Path) -> dict:
    """The last segment file is deleted (its index stays)."""
    seg = _pairs(d)[-1][0]
    seg.unlink()
    return {"file": str(seg)}


def index_behind(d: Path) -> dict:
    """The last index file loses its last 3 records (the index was not written after the last
    chunks: index and segment out of step)."""
    idx = _pairs(d)[-1][1]
    data = idx.read_bytes()
    idx.write_bytes(data[: -3 * g.INDEX_RECORD_SIZE])
    return {"file": str(idx)}


def index_ahead(d: Path) -> dict:
    """The last segment loses its last 3 chunks whole (the index still lists them)."""
    seg = _pairs(d)[-1][0]
    s, _ = r_osiris.walk_segment(seg)
    cut = s.chunks[-3].pos
    seg.write_bytes(seg.read_bytes()[:cut])
    return {"file": str(seg), "size": cut}


def gap(d: Path) -> dict:
    """A middle segment and its index are deleted: the offsets they held are a gap."""
    pairs = _pairs(d)
    seg, idx = pairs[len(pairs) // 2]
    seg.unlink()
    idx.unlink()
    return {"files": [str(seg), str(idx)]}


DAMAGES = {
    f.__name__: f
    for f in (
        torn,
        crc_early,
        crc_late,
        record_mangled,
        no_index_last,
        no_index_all,
        no_segment_last,
        index_behind,
        index_ahead,
        gap,
    )
}
