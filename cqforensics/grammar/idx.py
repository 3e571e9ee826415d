"""CQv1 queue index segment ``<N>.idx``: appended records, no header, no alignment.

Publish: ``<<1:1, IsPersistent:1, RelSeq:14, MsgId:16/binary, Expiry:64, Size:32,
EmbeddedSize:32, Embedded/binary>>``; deliver or ack: ``<<0:1, 1:1, RelSeq:14>>`` (the first
such record for a RelSeq marks delivery, the second its ack). Prefix 00 is invalid.

Sources: QI1 = deps/rabbit/src/rabbit_queue_index.erl (3.10 -> 4.2; removed in 4.3):
?PUB_PREFIX, ?REL_SEQ_ONLY_PREFIX, create_pub_record_body, parse_segment_publish_entry.
"""

from __future__ import annotations

import struct

from construct import BitsInteger, BitStruct, Bytes, Flag, If, Int32ub, Int64ub, Struct, this

REL_SEQ_BITS = 14  # QI1 ?REL_SEQ_BITS
LEGACY_SEGMENT_ENTRY_COUNT = 16384  # used when the vhost has no .config
PUB_HEAD_SIZE = 2 + 16 + 8 + 4 + 4  # 34 bytes before the embedded message

record = Struct(
    "head"
    / BitStruct(
        "publish" / Flag,  # 1 = publish record
        "bit2" / Flag,  # publish: is_persistent; otherwise must be 1 (deliver/ack)
        "rel_seq" / BitsInteger(REL_SEQ_BITS),
    ),
    "pub"
    / If(
        this.head.publish,
        Struct(
            "msg_id" / Bytes(16),
            "expiry" / Int64ub,  # microseconds since the epoch; 0 = none
            "size" / Int32ub,  # body size
            "embedded_size" / Int32ub,  # 0 = body in the shared store
            "embedded" / Bytes(this.embedded_size),  # term_to_binary(Msg)
        ),
    ),
)

#: struct twins
HEAD = struct.Struct(">H")
PUB = struct.Struct(">H16sQII")
