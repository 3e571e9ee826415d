"""CQv2 queue index segment ``<N>.qi``: a 64-byte header, then 32-byte slots.

Sources: IDX2 = deps/rabbit/src/rabbit_classic_queue_index_v2.erl (same layout 3.10.0 -> main).
"""

from __future__ import annotations

import numpy as np
from construct import (
    BitsInteger,
    BitStruct,
    Bytes,
    Const,
    FixedSized,
    Flag,
    Int8ub,
    Int32ub,
    Int64ub,
    Struct,
    Switch,
    this,
)

MAGIC = b"RCQI"  # IDX2 ?MAGIC 16#52435149
VERSION = 2  # IDX2 ?VERSION
HEADER_SIZE = 64  # IDX2 ?HEADER_SIZE
RESERVED_AT = 4 + 1 + 8 + 8  # the header's <<0:344>>, after magic, version, from and to seq ids
ENTRY_SIZE = 32  # IDX2 ?ENTRY_SIZE
DEFAULT_SEGMENT_ENTRY_COUNT = 4096  # classic_queue_index_v2_segment_entry_count

# location kinds, IDX2 build_entry/parse_entry
LOC_MEMORY, LOC_SHARED_STORE, LOC_QUEUE_STORE = 0, 1, 2

header = Struct(
    "magic" / Const(MAGIC),  # IDX2 write_file_header/ check_file_header
    "version" / Const(VERSION, Int8ub),
    "from_seq_id" / Int64ub,  # first SeqId of the segment (informational)
    "to_seq_id" / Int64ub,  # exclusive; the walker uses To - From as the slot count
    "reserved" / Bytes(43),  # <<0:344>>
)

location = FixedSized(
    17,
    Struct(
        "kind" / Int8ub,  # 0 memory, 1 shared store (msg id), 2 per-queue store (.qs offset)
        "ref"
        / Switch(
            this.kind,
            {
                LOC_MEMORY: Const(bytes(16)),
                LOC_SHARED_STORE: Struct("msg_id" / Bytes(16)),
                LOC_QUEUE_STORE: Struct("offset" / Int64ub, "size" / Int32ub, "pad" / Const(bytes(4))),
            },
        ),
    ),
)

#: One slot as the broker's strict parser reads it (IDX2 parse_entry crashes on anything else).
entry = Struct(
    "status" / Int8ub,  # 0 = empty/acked/dropped, 1 = live entry
    "flags"
    / BitStruct(
        "reserved" / Const(0, BitsInteger(7)),  # must be 0
        "persistent" / Flag,  # is_persistent
    ),
    "reserved" / Const(0, Int8ub),
    "location" / location,
    "size" / Int32ub,  # message body size (stats only)
    "expiry" / Int64ub,  # absolute, microseconds since the epoch; 0 = none
)

#: numpy twin of ``entry`` (raw: no validation), with the location's variants overlaid.
ENTRY_DTYPE = np.dtype(
    {
        "names": [
            "status",
            "flags",
            "reserved",
            "loc_kind",
            "msg_id",
            "qs_offset",
            "qs_size",
            "loc_pad",
            "size",
            "expiry",
        ],
        "formats": ["u1", "u1", "u1", "u1", "V16", ">u8", ">u4", ">u4", ">u4", ">u8"],
        "offsets": [0, 1, 2, 3, 4, 4, 12, 16, 20, 24],
        "itemsize": ENTRY_SIZE,
    }
)

#: numpy twin of ``header`` (the fields readers use).
HEADER_DTYPE = np.dtype(
    {
        "names": ["magic", "version", "from_seq_id", "to_seq_id"],
        "formats": ["S4", "u1", ">u8", ">u8"],
        "offsets": [0, 4, 5, 13],
        "itemsize": HEADER_SIZE,
    }
)
