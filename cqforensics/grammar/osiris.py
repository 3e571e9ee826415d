"""Stream (osiris) files: ``<N>.segment`` (a header, then chunks) and ``<N>.index`` (a header,
then one 29-byte record per chunk); the entries inside a chunk (simple entries and
sub-batches) and the tracking blocks of trailers, delta and snapshot chunks.

Sources (docs/formats/streams.md has the full spec): OL = osiris ``src/osiris_log.erl``, OH =
``src/osiris.hrl``, OT = ``src/osiris_tracking.erl``, at the tags RabbitMQ 3.10.8 (osiris 1.3.1)
to 4.2 (1.10.2) pin, and osiris 1.13.1 (4.3) read from the shipped beams' debug info. Every
constant here is the same in all of them; 1.3.1 has 32 reserved bits where 1.7+ has the bloom
filter size and 24 reserved bits (1.3.1 writes 0 there, which 1.7+ reads as "no filter").
All integers are big-endian.
"""

from __future__ import annotations

import struct

import numpy as np
from construct import (
    BitsInteger,
    BitStruct,
    Bytes,
    Const,
    GreedyRange,
    Int8ub,
    Int16ub,
    Int32ub,
    Int64sb,
    Int64ub,
    Prefixed,
    Struct,
    Switch,
    this,
)

LOG_MAGIC = b"OSIL"  # OH ?LOG_HEADER
IDX_MAGIC = b"OSII"  # OH ?IDX_HEADER
LOG_VERSION = 1  # OH ?LOG_VERSION
IDX_VERSION = 1  # OH ?IDX_VERSION
LOG_HEADER_SIZE = 8  # OH ?LOG_HEADER_SIZE
IDX_HEADER_SIZE = 8  # OH ?IDX_HEADER_SIZE
CHUNK_HEADER_SIZE = 48  # OH ?HEADER_SIZE_B
INDEX_RECORD_SIZE = 29  # OH ?INDEX_RECORD_SIZE_B
CHUNK_MAGIC = 5  # OH ?MAGIC
CHUNK_VERSION = 0  # OH ?VERSION (the OL comment says 1; make_chunk/7 writes 0 and parse_header/2 matches 0)
NAME_DIGITS = 20  # OL make_file_name/2: "~20..0B.segment"

# chunk types, OH ?CHNK_USER / ?CHNK_TRK_DELTA / ?CHNK_TRK_SNAPSHOT
CHNK_USER, CHNK_TRK_DELTA, CHNK_TRK_SNAPSHOT = 0, 1, 2
CHUNK_TYPES = {CHNK_USER: "user", CHNK_TRK_DELTA: "tracking_delta", CHNK_TRK_SNAPSHOT: "tracking_snapshot"}

# sub-batch compression codes: the stream protocol's (deps/rabbitmq_stream/docs/PROTOCOL.adoc, "Publish")
COMPRESSIONS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

# tracking block types, OT ?TRK_TYPE_SEQUENCE / ?TRK_TYPE_OFFSET / ?TRK_TYPE_TIMESTAMP (2: osiris 1.7+)
TRK_SEQUENCE, TRK_OFFSET, TRK_TIMESTAMP = 0, 1, 2
TRACKING_TYPES = {TRK_SEQUENCE: "sequence", TRK_OFFSET: "offset", TRK_TIMESTAMP: "timestamp"}

log_header = Struct(
    "magic" / Const(LOG_MAGIC), "version" / Const(LOG_VERSION, Int32ub)
)  # OL init/2, open_new_segment/1
index_header = Struct("magic" / Const(IDX_MAGIC), "version" / Const(IDX_VERSION, Int32ub))

#: OL make_chunk/7 (writer) and parse_header/2 (reader).
chunk_header = Struct(
    "mv" / BitStruct("magic" / Const(CHUNK_MAGIC, BitsInteger(4)), "version" / Const(CHUNK_VERSION, BitsInteger(4))),
    "chunk_type" / Int8ub,  # CHUNK_TYPES
    "num_entries" / Int16ub,  # simple entries + sub-batches
    "num_records" / Int32ub,  # offsets the chunk takes
    "timestamp" / Int64sb,  # ms since the epoch (erlang:system_time(millisecond))
    "epoch" / Int64ub,
    "chunk_id" / Int64ub,  # offset of the chunk's first record
    "crc" / Int32ub,  # erlang:crc32 of the entry data only
    "data_size" / Int32ub,
    "trailer_size" / Int32ub,
    "bloom_size" / Int8ub,  # 0 or 16..255 (osiris_bloom); 0 in 1.3.1 (part of 32 reserved bits)
    "reserved" / Bytes(3),  # 0:24
)

#: A whole chunk: header, bloom filter, entry data, trailer.
chunk = Struct(
    "header" / chunk_header,
    "bloom" / Bytes(this.header.bloom_size),
    "data" / Bytes(this.header.data_size),
    "trailer" / Bytes(this.header.trailer_size),
)

#: OL write_chunk/6: ``<<ChunkId:64, Timestamp:64/signed, Epoch:64, FilePos:32, ChType:8>>``.
index_record = Struct(
    "chunk_id" / Int64ub,
    "timestamp" / Int64sb,
    "epoch" / Int64ub,
    "file_pos" / Int32ub,  # where the chunk header starts in the segment
    "chunk_type" / Int8ub,
)

#: An entry's header (OL process_entry0/2): simple ``<<0:1, Len:31>>`` or sub-batch
#: ``<<1:1, Cmp:3, 0:4, NumRecords:16, UncompressedLen:32, Len:32>>``.
entry_head = BitStruct(
    "sub_batch" / BitsInteger(1),
    "rest"
    / Switch(
        this.sub_batch,
        {
            0: Struct("length" / BitsInteger(31)),
            1: Struct(
                "compression" / BitsInteger(3),
                "reserved" / BitsInteger(4),
                "num_records" / BitsInteger(16),
                "uncompressed_length" / BitsInteger(32),
                "length" / BitsInteger(32),
            ),
        },
    ),
)

#: A record inside an (uncompressed or decompressed) sub-batch: ``<<0:1, Len:31, Msg>>``
#: (OL parse_subbatch/3; the stream protocol's ``Size:32, Message``).
sub_record = Prefixed(Int32ub, GreedyRange(Int8ub))

#: A tracking block of a delta chunk or a user chunk's trailer (OT flush/1, parse_trailer/3).
tracking_delta_block = Struct(
    "type" / Int8ub,
    "id_size" / Int8ub,
    "id" / Bytes(this.id_size),
    "value" / Switch(this.type, {TRK_TIMESTAMP: Int64sb}, default=Int64ub),  # sequence, offset or timestamp
)

#: A tracking block of a snapshot chunk (OT snapshot/3, parse_snapshot/2): a sequence also
#: carries the chunk id it was written in.
tracking_snapshot_block = Struct(
    "type" / Int8ub,
    "id_size" / Int8ub,
    "id" / Bytes(this.id_size),
    "chunk_id" / Switch(this.type, {TRK_SEQUENCE: Int64ub}, default=None),
    "value" / Switch(this.type, {TRK_TIMESTAMP: Int64sb}, default=Int64ub),
)

# -- struct twins (the readers' fast paths; tests check they agree with the Structs above) ------

#: chunk header: magic/version byte, type, entries, records, timestamp, epoch, chunk id, crc,
#: data size, trailer size, bloom size, reserved
CHUNK_HEADER = struct.Struct(">BBHIqQQIIIB3s")
INDEX_RECORD = struct.Struct(">QqQIB")
SIMPLE_HEAD = struct.Struct(">I")  # top bit 0
SUB_BATCH_HEAD = struct.Struct(">BHII")  # 1:1 Cmp:3 0:4, records, uncompressed length, length
SIMPLE_HEAD_SIZE, SUB_BATCH_HEAD_SIZE = 4, 11
MAGIC_VERSION_BYTE = CHUNK_MAGIC << 4 | CHUNK_VERSION

#: numpy twin of ``index_record`` (raw: no validation)
INDEX_DTYPE = np.dtype(
    {
        "names": ["chunk_id", "timestamp", "epoch", "file_pos", "chunk_type"],
        "formats": [">u8", ">i8", ">u8", ">u4", "u1"],
        "offsets": [0, 8, 16, 24, 28],
        "itemsize": INDEX_RECORD_SIZE,
    }
)


def file_name(first_chunk_id: int, kind: str) -> str:
    """The name osiris gives the segment or index file starting at ``first_chunk_id``."""
    return f"{first_chunk_id:0{NAME_DIGITS}d}.{kind}"
