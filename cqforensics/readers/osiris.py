"""Streams (osiris logs): one stream directory ``stream/<name>/`` of ``<N>.segment`` and
``<N>.index`` pairs, read into its chunks, records (with offsets) and tracking blocks.

The layout is ``grammar.osiris`` (docs/formats/streams.md). Damage never raises: it becomes a
``Finding`` with the file and the byte offset, and the walk goes on where the bytes allow (a
chunk header that does not parse ends a segment's walk unless the index names a later chunk
position). Decompressing a sub-batch needs a codec: gzip is Python's own; snappy, lz4 and zstd
come from ``cramjam`` (the ``streams`` extra); without it such a sub-batch's records are listed
with a ``decode_error`` saying which codec is missing, never a traceback.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cqforensics.base.errors import FormatError
from cqforensics.base.findings import Finding
from cqforensics.grammar import osiris as g
from cqforensics.readers.files import file_type, read_bytes, read_head

_CHUNK_HEADER = g.CHUNK_HEADER.unpack_from
_SUB_HEAD = g.SUB_BATCH_HEAD.unpack_from
_U32 = g.SIMPLE_HEAD.unpack_from
MAX_FINDINGS_PER_FILE = 200  # a file of garbage yields a bounded number of findings


class CodecMissing(Exception):
    """A sub-batch's compression needs a codec that is not installed."""


def decompress(code: int, data: bytes, uncompressed_length: int) -> bytes:
    """The body of a sub-batch compressed with stream-protocol code ``code`` (1 gzip, 2 snappy
    framed, 3 lz4 frame, 4 zstd frame: the formats of the reference client's codecs,
    rabbitmq-stream-java-client ``compression/CompressionUtils.java``). Raises ``CodecMissing``
    or ``ValueError`` (damaged or not of that format)."""
    if code == 0:
        return bytes(data)
    if code == 1:
        try:
            return zlib.decompress(bytes(data), 16 + zlib.MAX_WBITS)
        except zlib.error as e:
            raise ValueError(f"gzip: {e}") from None
    if code not in (2, 3, 4):
        raise ValueError(f"unknown compression code {code}")
    try:
        import cramjam
    except ImportError:
        raise CodecMissing(
            f"{g.COMPRESSIONS[code]} sub-batch: the codec is not installed (pip install 'cqforensics[streams]')"
        ) from None
    mod = {2: cramjam.snappy, 3: cramjam.lz4, 4: cramjam.zstd}[code]
    try:
        return bytes(mod.decompress(bytes(data)))
    except Exception as e:  # cramjam raises its own DecompressionError (and ValueError)
        if code == 2:  # a client may write raw snappy instead of the framing format
            try:
                return bytes(cramjam.snappy.decompress_raw(bytes(data)))
            except Exception:
                pass
        raise ValueError(f"{g.COMPRESSIONS[code]}: {str(e)[:200]}") from None


@dataclass
class Record:
    """One record (a message) of a user chunk."""

    offset: int  # the stream offset
    chunk: Chunk
    entry_pos: int  # file position of its entry (simple entry or the sub-batch holding it)
    body: bytes | None  # the AMQP 1.0 message bytes; None when they cannot be had
    sub_batch: bool = False
    compression: str = "none"
    error: str | None = None


@dataclass
class Tracking:
    """One tracking block: a publisher's sequence, a consumer's offset or a timestamp."""

    kind: str  # sequence | offset | timestamp
    reference: bytes
    value: int
    chunk_id: int  # the chunk it was written in (a snapshot's sequence: the chunk it names)
    source: str  # trailer | delta | snapshot
    file: str
    pos: int  # file position of the chunk holding it


@dataclass
class Chunk:
    file: str
    pos: int
    chunk_type: int
    num_entries: int
    num_records: int
    timestamp: int
    epoch: int
    chunk_id: int
    crc: int
    data_size: int
    trailer_size: int
    bloom_size: int
    bloom: bytes = b""
    complete: bool = True  # all its bytes are in the file
    crc_ok: bool | None = None  # None: the data is not all there

    @property
    def end(self) -> int:
        return self.pos + g.CHUNK_HEADER_SIZE + self.bloom_size + self.data_size + self.trailer_size

    @property
    def data_pos(self) -> int:
        return self.pos + g.CHUNK_HEADER_SIZE + self.bloom_size

    @property
    def type_name(self) -> str:
        return g.CHUNK_TYPES.get(self.chunk_type, f"unknown({self.chunk_type})")

    @property
    def valid(self) -> bool:
        """What osiris is_valid_chunk_on_disk/2 accepts: a header that parses and a matching CRC."""
        return self.complete and bool(self.crc_ok)


@dataclass
class IndexFile:
    path: Path
    size: int
    header_ok: bool
    records: np.ndarray  # INDEX_DTYPE, every whole record after the header (zero records included)
    partial: int  # bytes of a last, partial record


@dataclass
class Segment:
    path: Path
    size: int
    header_ok: bool
    chunks: list[Chunk] = field(default_factory=list)
    end: int = 0  # end of the last whole chunk walked (8 for none)


def parse_header(buf, pos: int) -> tuple | None:
    """The 48-byte chunk header at ``pos`` as a tuple (CHUNK_HEADER order), or None when the
    bytes are not one (magic/version byte, as osiris parse_header/2 matches it)."""
    if pos + g.CHUNK_HEADER_SIZE > len(buf):
        return None
    h = _CHUNK_HEADER(buf, pos)
    if h[0] != g.MAGIC_VERSION_BYTE:
        return None
    return h


def read_index(path: Path) -> tuple[IndexFile, list[Finding]]:
    data = read_bytes(path)
    name = str(path)
    findings = []
    ok = data[: g.IDX_HEADER_SIZE] == g.IDX_MAGIC + g.IDX_VERSION.to_bytes(4, "big")
    if not ok:
        findings.append(Finding("osiris-bad-header", f"index file header is {bytes(data[:8])!r}, not OSII v1", name, 0))
    body = data[g.IDX_HEADER_SIZE :] if len(data) > g.IDX_HEADER_SIZE else b""
    n = len(body) // g.INDEX_RECORD_SIZE
    recs = np.frombuffer(bytes(body[: n * g.INDEX_RECORD_SIZE]), g.INDEX_DTYPE)
    partial = len(body) - n * g.INDEX_RECORD_SIZE
    if partial:
        findings.append(
            Finding(
                "osiris-index-torn",
                f"index ends inside a record ({partial} of {g.INDEX_RECORD_SIZE} bytes): the next boot ignores them",
                name,
                g.IDX_HEADER_SIZE + n * g.INDEX_RECORD_SIZE,
            )
        )
    return IndexFile(path, len(data), ok, recs, partial), findings


def walk_segment(path: Path, index: IndexFile | None = None, data=None) -> tuple[Segment, list[Finding]]:
    """Every chunk of a segment from its header on, following sizes; at bytes that are no chunk
    header, the walk goes on at the next position the index names (if any)."""
    if data is None:
        data = read_bytes(path)
    name = str(path)
    findings: list[Finding] = []
    ok = data[: g.LOG_HEADER_SIZE] == g.LOG_MAGIC + g.LOG_VERSION.to_bytes(4, "big")
    seg = Segment(path, len(data), ok, end=min(len(data), g.LOG_HEADER_SIZE))
    if not ok:
        findings.append(
            Finding("osiris-bad-header", f"segment file header is {bytes(data[:8])!r}, not OSIL v1", name, 0)
        )
    positions = sorted({int(p) for p in index.records["file_pos"]} if index is not None else set())
    pos = g.LOG_HEADER_SIZE
    while pos < len(data):
        h = parse_header(data, pos)
        if h is None:
            rest = bytes(data[pos : pos + g.CHUNK_HEADER_SIZE])
            if pos + g.CHUNK_HEADER_SIZE > len(data) and rest and rest[0] == g.MAGIC_VERSION_BYTE:
                findings.append(
                    Finding(
                        "osiris-chunk-torn",
                        f"the segment ends inside a chunk header ({len(data) - pos} of {g.CHUNK_HEADER_SIZE} bytes)",
                        name,
                        pos,
                    )
                )
            elif not any(data[pos:]):
                findings.append(
                    Finding(
                        "osiris-trailing-bytes",
                        f"{len(data) - pos} zero bytes after the last chunk",
                        name,
                        pos,
                        details={"length": len(data) - pos},
                    )
                )
            else:
                findings.append(
                    Finding(
                        "osiris-chunk-bad-header",
                        "bytes that are no chunk header where a chunk should start",
                        name,
                        pos,
                        details={"length": len(data) - pos},
                    )
                )
            nxt = next((p for p in positions if p > pos), None)
            if nxt is None or len(findings) >= MAX_FINDINGS_PER_FILE:
                break
            pos = nxt
            continue
        (_, ctype, n_entries, n_records, ts, epoch, chunk_id, crc, dsize, tsize, bsize, _res) = h
        c = Chunk(name, pos, ctype, n_entries, n_records, ts, epoch, chunk_id, crc, dsize, tsize, bsize)
        if c.end > len(data):
            c.complete = False
            have = data[c.data_pos : c.data_pos + dsize]
            c.crc_ok = None if len(have) < dsize else zlib.crc32(have) == crc
            findings.append(
                Finding(
                    "osiris-chunk-torn",
                    f"chunk {chunk_id} ({c.type_name}) needs "
                    f"{c.end - pos} bytes, the segment has {len(data) - pos} left",
                    name,
                    pos,
                    details={"chunk_id": chunk_id, "missing": c.end - len(data)},
                )
            )
            seg.chunks.append(c)
            break
        c.bloom = bytes(data[pos + g.CHUNK_HEADER_SIZE : c.data_pos])
        c.crc_ok = zlib.crc32(data[c.data_pos : c.data_pos + dsize]) == crc
        if not c.crc_ok:
            findings.append(
                Finding(
                    "osiris-chunk-crc",
                    f"chunk {chunk_id} ({c.type_name}) fails its CRC-32",
                    name,
                    pos,
                    details={"chunk_id": chunk_id, "crc": crc},
                )
            )
        if ctype not in g.CHUNK_TYPES:
            findings.append(Finding("osiris-chunk-bad-header", f"chunk {chunk_id} has unknown type {ctype}", name, pos))
        seg.chunks.append(c)
        seg.end = c.end
        pos = c.end
    return seg, findings


def records_of(chunk: Chunk, data) -> tuple[list[Record], list[Tracking], list[Finding]]:
    """The records of a user chunk, or the tracking blocks of a tracking chunk, and the tracking
    blocks of its trailer. ``data`` is the segment's bytes."""
    recs: list[Record] = []
    trk: list[Tracking] = []
    findings: list[Finding] = []
    if not chunk.complete:
        return recs, trk, findings
    p, end = chunk.data_pos, chunk.data_pos + chunk.data_size
    offset = chunk.chunk_id
    for _ in range(chunk.num_entries):
        if p + 4 > end:
            findings.append(
                Finding(
                    "osiris-entry-bad",
                    f"chunk {chunk.chunk_id}: entry data ends before its {chunk.num_entries} entries",
                    chunk.file,
                    p,
                )
            )
            break
        first = data[p]
        if not first & 0x80:  # simple entry
            (n,) = _U32(data, p)
            if p + 4 + n > end:
                findings.append(
                    Finding(
                        "osiris-entry-bad",
                        f"chunk {chunk.chunk_id}: a simple entry of {n} bytes runs past the chunk's data",
                        chunk.file,
                        p,
                    )
                )
                break
            body = bytes(data[p + 4 : p + 4 + n])
            if chunk.chunk_type == g.CHNK_USER:
                recs.append(Record(offset, chunk, p, body))
            else:
                trk.extend(
                    parse_tracking(
                        body, chunk, "snapshot" if chunk.chunk_type == g.CHNK_TRK_SNAPSHOT else "delta", findings
                    )
                )
            offset += 1
            p += 4 + n
            continue
        if p + g.SUB_BATCH_HEAD_SIZE > end:
            findings.append(
                Finding(
                    "osiris-entry-bad",
                    f"chunk {chunk.chunk_id}: a sub-batch header runs past the chunk's data",
                    chunk.file,
                    p,
                )
            )
            break
        b0, n_recs, ulen, clen = _SUB_HEAD(data, p)
        code = (b0 >> 4) & 0x7
        start = p + g.SUB_BATCH_HEAD_SIZE
        if start + clen > end:
            findings.append(
                Finding(
                    "osiris-entry-bad",
                    f"chunk {chunk.chunk_id}: a sub-batch of {clen} bytes runs past the chunk's data",
                    chunk.file,
                    p,
                )
            )
            break
        comp = g.COMPRESSIONS.get(code, f"unknown({code})")
        error = None
        bodies: list[bytes] = []
        try:
            raw = decompress(code, data[start : start + clen], ulen)
            if len(raw) != ulen:
                raise ValueError(f"{len(raw)} bytes after decompression, the header says {ulen}")
            q = 0
            while q < len(raw) and len(bodies) < n_recs:
                (n,) = _U32(raw, q)
                if n & 0x80000000 or q + 4 + n > len(raw):
                    raise ValueError(f"record {len(bodies)} of the sub-batch runs past its body")
                bodies.append(bytes(raw[q + 4 : q + 4 + n]))
                q += 4 + n
            if len(bodies) != n_recs or q != len(raw):
                raise ValueError(
                    f"the sub-batch holds {len(bodies)} records in {q} of {len(raw)} bytes, its header says {n_recs}"
                )
        except CodecMissing as e:
            error = str(e)
        except (ValueError, IndexError, Exception) as e:  # noqa: B014 - a codec's own error types
            error = f"sub-batch does not decode: {str(e)[:200]}"
            findings.append(
                Finding(
                    "osiris-entry-bad",
                    f"chunk {chunk.chunk_id}: {comp} sub-batch of {n_recs} records: {error}",
                    chunk.file,
                    p,
                    details={"chunk_id": chunk.chunk_id, "compression": comp},
                )
            )
        for i in range(n_recs):
            body = bodies[i] if error is None else None
            recs.append(Record(offset + i, chunk, p, body, True, comp, error))
        offset += n_recs
        p = start + clen
    if p != end and not findings:
        findings.append(
            Finding(
                "osiris-entry-bad",
                f"chunk {chunk.chunk_id}: its {chunk.num_entries} entries end {end - p} bytes before its data does",
                chunk.file,
                p,
            )
        )
    if offset - chunk.chunk_id != chunk.num_records and not findings:
        findings.append(
            Finding(
                "osiris-entry-bad",
                f"chunk {chunk.chunk_id}: its entries hold "
                f"{offset - chunk.chunk_id} records, its header says {chunk.num_records}",
                chunk.file,
                chunk.pos,
            )
        )
    if chunk.trailer_size:
        t0 = chunk.data_pos + chunk.data_size
        trk.extend(parse_tracking(bytes(data[t0 : t0 + chunk.trailer_size]), chunk, "trailer", findings))
    return recs, trk, findings


def parse_tracking(buf: bytes, chunk: Chunk, source: str, findings: list) -> list[Tracking]:
    """Tracking blocks (grammar ``tracking_delta_block`` / ``tracking_snapshot_block``)."""
    out = []
    p = 0
    snap = source == "snapshot"
    while p < len(buf):
        typ, n = buf[p], buf[p + 1] if p + 1 < len(buf) else 0
        q = p + 2 + n
        ref = buf[p + 2 : q]
        size = 16 if snap and typ == g.TRK_SEQUENCE else 8
        # a byte left over is no block either: osiris_tracking parse_trailer/3 has no clause for it
        if typ not in g.TRACKING_TYPES or q + size > len(buf):
            findings.append(
                Finding(
                    "osiris-tracking-bad",
                    f"chunk {chunk.chunk_id}: {source} tracking data does not parse at byte {p} of {len(buf)}",
                    chunk.file,
                    chunk.pos,
                    details={"chunk_id": chunk.chunk_id, "source": source},
                )
            )
            break
        ch = chunk.chunk_id
        if snap and typ == g.TRK_SEQUENCE:
            ch = int.from_bytes(buf[q : q + 8], "big")
            q += 8
        value = int.from_bytes(buf[q : q + 8], "big", signed=typ == g.TRK_TIMESTAMP)
        out.append(Tracking(g.TRACKING_TYPES[typ], bytes(ref), value, ch, source, chunk.file, chunk.pos))
        p = q + 8
    return out


@dataclass
class StreamScan:
    """One stream directory read whole: its segment/index pairs in name order, every chunk,
    record and tracking block, and the findings about the files themselves."""

    dir: Path
    pairs: list[tuple[str, Path | None, Path | None]] = field(default_factory=list)  # (stem, segment, index)
    segments: dict[str, Segment] = field(default_factory=dict)  # stem -> walked segment
    indexes: dict[str, IndexFile] = field(default_factory=dict)  # stem -> index
    records: list[Record] = field(default_factory=list)
    tracking: list[Tracking] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    other_files: list[Path] = field(default_factory=list)

    @property
    def chunks(self) -> list[Chunk]:
        return [c for s in self.segments.values() for c in s.chunks]

    @property
    def first_offset(self) -> int | None:
        cs = self.chunks
        return cs[0].chunk_id if cs else None

    @property
    def next_offset(self) -> int | None:
        """The offset after the last chunk's records."""
        cs = [c for c in self.chunks if c.complete]
        return cs[-1].chunk_id + cs[-1].num_records if cs else None


def _stem(name: str, ext: str) -> str | None:
    stem = name[: -len(ext)]
    return stem if name.endswith(ext) and len(stem) == g.NAME_DIGITS and stem.isdigit() else None


def read_stream(stream_dir: Path | str, with_records: bool = True) -> StreamScan:
    """Read a stream directory. Never raises on damage (findings); an unreadable directory is
    an operational error of the caller's listing."""
    d = Path(stream_dir)
    scan = StreamScan(d)
    segs, idxs = {}, {}
    for p in sorted(d.iterdir()):
        try:
            what = file_type(p)
        except OSError as e:  # gone, or a link that cannot be followed
            what = f"unreadable ({e.strerror})"
        s = _stem(p.name, ".segment")
        i = _stem(p.name, ".index")
        if what == "a directory" and s is None and i is None:  # a dir of its own: not osiris's
            scan.other_files.append(p)
            continue
        if what is not None:  # a FIFO would block the read; a segment or index cannot be a dir
            scan.findings.append(Finding("not-regular-file", f"{what}, not a regular file: never read", str(p)))
            continue
        if s is not None:
            segs[s] = p
        elif i is not None:
            idxs[i] = p
        else:
            scan.other_files.append(p)
    stems = sorted(set(segs) | set(idxs))
    scan.pairs = [(s, segs.get(s), idxs.get(s)) for s in stems]
    expected = None  # the next chunk id the previous chunk leads to
    for n, (stem, seg_path, idx_path) in enumerate(scan.pairs):
        index = None
        if idx_path is not None:
            index, f = read_index(idx_path)
            scan.indexes[stem] = index
            scan.findings += f
        if seg_path is None:
            scan.findings.append(
                Finding(
                    "osiris-segment-missing",
                    f"index {idx_path.name} has no segment {stem}.segment",
                    str(idx_path),
                    None,
                    details={"last": n == len(scan.pairs) - 1},
                )
            )
            continue
        if idx_path is None:
            scan.findings.append(
                Finding(
                    "osiris-index-missing",
                    f"segment {seg_path.name} has no index {stem}.index",
                    str(seg_path),
                    None,
                    details={"last": n == len(scan.pairs) - 1},
                )
            )
        data = read_bytes(seg_path)
        seg, f = walk_segment(seg_path, index, data)
        scan.segments[stem] = seg
        scan.findings += f
        if seg.chunks and int(stem) != seg.chunks[0].chunk_id:
            scan.findings.append(
                Finding(
                    "osiris-chunk-id-gap",
                    f"segment {seg_path.name} starts with chunk {seg.chunks[0].chunk_id}, not the chunk its name says",
                    str(seg_path),
                    seg.chunks[0].pos,
                )
            )
        for c in seg.chunks:
            if expected is not None and c.chunk_id != expected:
                what = "gap" if c.chunk_id > expected else "overlap"
                scan.findings.append(
                    Finding(
                        "osiris-chunk-id-gap",
                        f"chunk {c.chunk_id} follows a chunk that ends "
                        f"at offset {expected} ({what} of {abs(c.chunk_id - expected)}): a "
                        "reader stops there",
                        c.file,
                        c.pos,
                        details={"expected": expected, "chunk_id": c.chunk_id},
                    )
                )
            expected = c.chunk_id + c.num_records
            if with_records:
                recs, trk, f = records_of(c, data)
                scan.records += recs
                scan.tracking += trk
                scan.findings += f
        if index is not None:
            scan.findings += compare_index(seg, index)
    if with_records:
        scan.findings += compare_tracking(scan)
    if scan.pairs and scan.chunks and scan.chunks[0].chunk_id > 0:
        c0 = scan.chunks[0]
        scan.findings.append(
            Finding(
                "stream-retention",
                f"the stream starts at offset {c0.chunk_id}: offsets "
                "below it were deleted (retention or by hand); nothing of them is on disk",
                c0.file,
                c0.pos,
                details={"first_offset": c0.chunk_id},
            )
        )
    return scan


def compare_index(seg: Segment, index: IndexFile) -> list[Finding]:
    """Index records against the chunks walked: each record must name a chunk's position, id,
    epoch, type and timestamp, in chunk order; a chunk the index does not list is one the next boot cuts off
    (if it is after the last record) or a reader never finds by index."""
    out = []
    by_pos = {c.pos: c for c in seg.chunks}
    listed = set()
    name = str(index.path)
    last = None  # the chunk id of the record before
    for k, r in enumerate(index.records):
        at = g.IDX_HEADER_SIZE + k * g.INDEX_RECORD_SIZE
        if not any(r.tobytes()):
            out.append(
                Finding(
                    "osiris-index-mismatch",
                    "an all-zero index record (pre-allocated or zeroed)",
                    name,
                    at,
                    details={"kind": "zero_record"},
                )
            )
            continue
        c = by_pos.get(int(r["file_pos"]))
        if c is None:
            out.append(
                Finding(
                    "osiris-index-mismatch",
                    f"index record of chunk {int(r['chunk_id'])} points at "
                    f"segment position {int(r['file_pos'])}, where no chunk starts",
                    name,
                    at,
                    details={"kind": "no_chunk", "chunk_id": int(r["chunk_id"]), "file_pos": int(r["file_pos"])},
                )
            )
            continue
        listed.add(c.pos)
        if last is not None and c.chunk_id <= last:
            # osiris searches an index as a sorted file (offset and timestamp scans, its last
            # record as the segment's last chunk at recovery: osiris_log last_idx_record/1)
            out.append(
                Finding(
                    "osiris-index-mismatch",
                    f"index record of chunk {c.chunk_id} comes after the record of chunk {last}: "
                    "an index is in chunk order (a search for an offset or a timestamp goes wrong)",
                    name,
                    at,
                    details={"kind": "order", "chunk_id": c.chunk_id},
                )
            )
        last = c.chunk_id
        differs = None
        if (c.chunk_id, c.epoch, c.chunk_type) != (int(r["chunk_id"]), int(r["epoch"]), int(r["chunk_type"])):
            differs = (
                "differs",
                f"index record says chunk {int(r['chunk_id'])} epoch {int(r['epoch'])} type "
                f"{int(r['chunk_type'])}, the segment has chunk {c.chunk_id} epoch {c.epoch} type "
                f"{c.chunk_type} there",
            )
        elif c.timestamp != int(r["timestamp"]):
            # osiris_log write_chunk/6 writes the chunk's one timestamp into both; readers that
            # attach by timestamp ({timestamp, Ts}) search the index's copy (timestamp_search_fun/3)
            differs = (
                "timestamp",
                f"index record of chunk {c.chunk_id} says timestamp {int(r['timestamp'])}, the "
                f"chunk says {c.timestamp}: a consumer attaching by timestamp starts at the wrong chunk",
            )
        if differs is not None:
            # both ends of the disagreement, either may be the damaged one: the index record, and
            # the chunk's header (no checksum covers it)
            kind, text = differs
            for file, pos in ((name, at), (str(seg.path), c.pos)):
                details = {"kind": kind, "chunk_id": c.chunk_id, "index_record": at, "chunk_pos": c.pos}
                out.append(Finding("osiris-index-mismatch", text, file, pos, details=details))
    unlisted = [c for c in seg.chunks if c.pos not in listed]
    if unlisted:
        out.append(
            Finding(
                "osiris-index-mismatch",
                f"{len(unlisted)} chunk(s) of the segment are not in its index "
                f"(first: chunk {unlisted[0].chunk_id}); chunks after the last indexed one are cut by "
                "the next boot",
                str(seg.path),
                unlisted[0].pos,
                details={"kind": "unlisted", "chunks": [c.chunk_id for c in unlisted[:50]]},
            )
        )
    return out


#: osiris_tracking ?MAX_SEQUENCES: a snapshot keeps the 255 writers of the highest chunk ids
#: (trim_sequences/2); RabbitMQ sets no other limit
MAX_SEQUENCES = 255


def compare_tracking(scan: StreamScan) -> list[Finding]:
    """The stream's tracking blocks against each other, as osiris keeps them: a writer's
    sequence only grows (osiris_writer is_duplicate/4 drops a write whose sequence is not above
    the writer's last, so each chunk's trailer holds a higher one than the chunk before); a
    snapshot, the first chunk of every segment after the first, is the tracking state at the
    roll (osiris_tracking snapshot/3): every writer known by then (up to ``MAX_SEQUENCES``) at
    the chunk and sequence it last wrote, or at the snapshot's own chunk id for the write that
    rolled the segment, and every consumer offset at or above the stream's first. What no other
    block repeats (the last trailer of a writer and no snapshot after it; a snapshot whose
    segment before it retention deleted) nothing can check: docs/streams.md says so. The next
    boot recovers the tracking from the last segment (osiris_log init: its snapshot, then
    trailers and deltas), so damage there is what the publishers' deduplication starts from."""
    out: list[Finding] = []
    chunks = {(c.file, c.pos): c for c in scan.chunks}
    last_file = str(next(reversed(scan.segments.values())).path) if scan.segments else None

    def found(file: str, pos: int, kind: str, text: str, reference: bytes, source: str) -> None:
        tail = " (the last segment: the next boot's deduplication starts from it)" if file == last_file else ""
        out.append(
            Finding(
                "osiris-tracking-bad",
                f"chunk {chunks[(file, pos)].chunk_id}: {text}{tail}",
                file,
                pos,
                details={"kind": kind, "reference": reference, "source": source},
            )
        )

    def bad(t: Tracking, kind: str, text: str) -> None:  # about the block ``t``, at its chunk
        found(t.file, t.pos, kind, text, t.reference, t.source)

    # 1. each writer's sequences upwards, chunk after chunk: strictly from trailer to trailer,
    # a snapshot's copy at least its writer's last (the block that breaks the order is named)
    by_writer: dict[bytes, list[Tracking]] = {}
    for t in scan.tracking:
        if t.kind == "sequence" and (t.file, t.pos) in chunks:
            by_writer.setdefault(t.reference, []).append(t)

    def below(a: Tracking, b: Tracking) -> bool:  # whether a may come before b
        return a.value < b.value or (a.value == b.value and "snapshot" in (a.source, b.source))

    for ref, ts in by_writer.items():
        for k in range(1, len(ts)):
            a, b = ts[k - 1], ts[k]
            if below(a, b):
                continue
            # the outlier is a when leaving it out mends the order (the block before a leads to b,
            # or a is the first and b leads on to the next), else b
            a_out = below(ts[k - 2], b) if k >= 2 else k + 1 < len(ts) and below(b, ts[k + 1])
            outlier = a if a_out else b
            other = b if outlier is a else a
            bad(
                outlier,
                "sequence",
                f"{outlier.source} holds writer {ref.decode('utf-8', 'replace')!r} at sequence {outlier.value}; "
                f"chunk {chunks[(other.file, other.pos)].chunk_id} "
                f"{'after' if outlier is a else 'before'} it holds {other.value}: osiris accepts a writer's "
                "sequences only upwards",
            )

    # 2. each snapshot against the state the blocks before it make, where all of them are here
    seqs: dict[bytes, tuple[int, int]] = {}  # writer -> (chunk id, sequence) of its last block
    offsets: dict[bytes, int] = {}
    named: dict[bytes, Tracking] = {}  # reference -> the last block naming it
    first = scan.first_offset
    known = first == 0  # the state before this point is all on disk (from chunk 0, or a snapshot)
    expected = None
    by_chunk: dict[tuple[str, int], list[Tracking]] = {}
    for t in scan.tracking:
        by_chunk.setdefault((t.file, t.pos), []).append(t)
    for c in scan.chunks:
        if expected is not None and c.chunk_id != expected or not c.valid:
            known = False  # a gap or a chunk not read whole: the state after it is not all here
        expected = c.chunk_id + c.num_records
        blocks = by_chunk.get((c.file, c.pos), [])
        if c.chunk_type != g.CHNK_TRK_SNAPSHOT or not c.valid:
            for t in blocks:
                if t.kind == "offset":
                    offsets[t.reference] = t.value
                elif t.kind == "sequence":
                    seqs[t.reference] = (c.chunk_id, t.value)
                named[t.reference] = t
            continue
        snap_seqs = {t.reference: t for t in blocks if t.kind == "sequence"}
        for ref, t in snap_seqs.items():
            name = ref.decode("utf-8", "replace")
            if t.chunk_id > c.chunk_id:
                bad(t, "sequence", f"snapshot names writer {name!r} at chunk {t.chunk_id}, after the snapshot itself")
            elif not known or t.chunk_id == c.chunk_id:
                continue  # the write that rolled the segment: its chunk comes next
            elif ref not in seqs:
                bad(
                    t,
                    "sequence",
                    f"snapshot holds writer {name!r} at chunk {t.chunk_id}, which no block before it names",
                )
            elif (t.chunk_id, t.value) != seqs[ref]:
                c0, v0 = seqs[ref]
                bad(
                    t,
                    "sequence",
                    f"snapshot holds writer {name!r} at chunk {t.chunk_id} sequence {t.value}; its last "
                    f"block before says chunk {c0} sequence {v0}",
                )
        if known and len(seqs) <= MAX_SEQUENCES:
            snap_offsets = {t.reference for t in blocks if t.kind == "offset"}
            lacking = [
                ("writer", ref, f"last at chunk {c0}, sequence {v0}")
                for ref, (c0, v0) in seqs.items()
                if ref not in snap_seqs
            ]
            lacking += [
                ("consumer", ref, f"offset {v}")
                for ref, v in offsets.items()
                if ref not in snap_offsets and first is not None and v >= first
            ]
            for who, ref, what in lacking:
                # both ends of the disagreement: the snapshot, and the block naming what it lacks
                # (either may be the damaged one: a reference changed in the one or the other)
                text = ref.decode("utf-8", "replace")
                t = named.get(ref)
                if t is not None:
                    bad(
                        t,
                        "not_in_snapshot",
                        f"{t.source} names {who} {text!r}, which the snapshot of chunk {c.chunk_id} lacks",
                    )
                found(
                    c.file,
                    c.pos,
                    "missing",
                    f"snapshot lacks {who} {text!r} ({what}): osiris snapshots every writer it tracks "
                    "and every offset at or above the stream's first",
                    ref,
                    "snapshot",
                )
        seqs = {ref: (t.chunk_id, t.value) for ref, t in snap_seqs.items()}
        offsets = {t.reference: t.value for t in blocks if t.kind == "offset"}
        named = {t.reference: t for t in blocks}
        known = True
    return out


def head_records(stream_dir: Path | str, limit: int = 8, head: int = 1 << 16) -> list[bytes]:
    """Up to ``limit`` record bodies from the first ``head`` bytes of a stream's first segment
    (simple entries and uncompressed sub-batches of user chunks): a cheap look at what wrote
    them (version evidence). Damage yields fewer, never an error."""
    segs = sorted(p for p in Path(stream_dir).iterdir() if _stem(p.name, ".segment") is not None)
    if not segs:
        return []
    try:
        data = read_head(segs[0], head)
    except FormatError:  # not a regular file (NotRegularFile): read_stream names it
        return []
    seg, _ = walk_segment(segs[0], None, data)
    out: list[bytes] = []
    for c in seg.chunks:
        if c.chunk_type != g.CHNK_USER or not c.complete:
            continue
        recs, _, _ = records_of(c, data)
        out += [r.body for r in recs if r.body is not None and r.compression == "none"]
        if len(out) >= limit:
            break
    return out[:limit]


# -- dump: the per-chunk / per-record listing of one file ---------------------------------------


def dump_segment(path: Path, segment_entry_count: int | None = None):
    """``dump`` rows of a segment: its header, each chunk, each record and tracking block, and
    each problem, in file order (``term`` is None: bodies are AMQP 1.0, not Erlang terms)."""
    path = Path(path)
    idx = path.with_suffix(".index")
    index = read_index(idx)[0] if idx.is_file() else None
    data = read_bytes(path)
    seg, findings = walk_segment(path, index, data)
    yield {"offset": 0, "kind": "header", "status": "ok" if seg.header_ok else "bad header"}, None
    for c in seg.chunks:
        yield (
            {
                "offset": c.pos,
                "kind": "chunk",
                "chunk_type": c.type_name,
                "chunk_id": c.chunk_id,
                "entries": c.num_entries,
                "records": c.num_records,
                "timestamp_ms": c.timestamp,
                "epoch": c.epoch,
                "size": c.end - c.pos,
                "bloom_size": c.bloom_size,
                "trailer_size": c.trailer_size,
                "status": "ok" if c.valid else ("torn" if not c.complete else "bad crc"),
            },
            None,
        )
        recs, trk, f = records_of(c, data)
        findings += f
        for r in recs:
            yield (
                {
                    "offset": r.entry_pos,
                    "kind": "record",
                    "stream_offset": r.offset,
                    "chunk_id": c.chunk_id,
                    "sub_batch": r.sub_batch,
                    "compression": r.compression,
                    "size": None if r.body is None else len(r.body),
                    "status": r.error or "ok",
                },
                None,
            )
        for t in trk:
            yield (
                {
                    "offset": c.pos,
                    "kind": "tracking",
                    "tracking": t.kind,
                    "source": t.source,
                    "reference": t.reference.decode("utf-8", "replace"),
                    "value": t.value,
                    "chunk_id": t.chunk_id,
                    "status": "ok",
                },
                None,
            )
    for f in findings:
        yield {"offset": f.offset, "kind": "problem", "status": f"{f.code}: {f.message}"}, None


def dump_index(path: Path, segment_entry_count: int | None = None):
    """``dump`` rows of an index file: its header and each 29-byte record."""
    index, findings = read_index(Path(path))
    yield {"offset": 0, "kind": "header", "status": "ok" if index.header_ok else "bad header"}, None
    for k, r in enumerate(index.records):
        yield (
            {
                "offset": g.IDX_HEADER_SIZE + k * g.INDEX_RECORD_SIZE,
                "kind": "index_record",
                "chunk_id": int(r["chunk_id"]),
                "timestamp_ms": int(r["timestamp"]),
                "epoch": int(r["epoch"]),
                "file_pos": int(r["file_pos"]),
                "chunk_type": g.CHUNK_TYPES.get(int(r["chunk_type"]), str(int(r["chunk_type"]))),
                "status": "zero record" if not any(r.tobytes()) else "ok",
            },
            None,
        )
    for f in findings:
        yield {"offset": f.offset, "kind": "problem", "status": f"{f.code}: {f.message}"}, None
