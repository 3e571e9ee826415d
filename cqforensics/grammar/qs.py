"""CQv2 per-queue message store segment ``<N>.qs``: a 64-byte header, then entries located
through the ``.qi`` (never scanned sequentially: acked-while-buffered entries leave holes).

Sources: QS2 = deps/rabbit/src/rabbit_classic_queue_store_v2.erl.
"""

from __future__ import annotations

import struct

from construct import Bytes, Const, Int8ub, Int16ub, Int32ub, Int64ub, Struct, this

MAGIC = b"RCQS"  # QS2 ?MAGIC 16#52435153
VERSION = 2
HEADER_SIZE = 64  # QS2 ?HEADER_SIZE
ENTRY_HEADER_SIZE = 8  # QS2 ?ENTRY_HEADER_SIZE

header = Struct(
    "magic" / Const(MAGIC),  # QS2 maybe_write_file_header / check_file_header
    "version" / Const(VERSION, Int8ub),
    "from_seq_id" / Int64ub,
    "to_seq_id" / Int64ub,
    "reserved" / Bytes(43),
)

entry_header = Struct(
    "size" / Int32ub,  # bytes of term area after these 8 (term + zero padding since 3.12)
    "flags" / Int8ub,  # bit 0 = CRC present (classic_queue_store_v2_check_crc32)
    "crc" / Int16ub,  # low 16 bits of erlang:crc32 of the term area; 0 when not used
    "reserved" / Const(0, Int8ub),
)

entry = Struct(
    "header" / entry_header,
    "term" / Bytes(this.header.size),  # term_to_binary(Msg) (+ padding to external_size)
)

#: struct twin of ``entry_header``
ENTRY_HEADER = struct.Struct(">IBHB")
