"""CQv1 queue index journal ``journal.jif``: records ``<<Prefix:2, SeqId:62>>`` + payload.

Prefix 00 = persistent publish, 01 = transient publish (both followed by MsgId:16, Expiry:64,
Size:32, EmbeddedSize:32, Embedded), 10 = deliver, 11 = ack. A 40-byte all-zero publish ends
the journal (preallocated tail); so does a record that does not fit (torn write).

Sources: QI1 = rabbit_queue_index.erl ?PUB_PERSIST_JPREFIX, ?PUB_TRANS_JPREFIX,
?DEL_JPREFIX, ?ACK_JPREFIX, load_journal_entries.
"""

from __future__ import annotations

import struct

from construct import BitsInteger, BitStruct, Bytes, If, Int32ub, Int64ub, Struct, this

PUB_PERSISTENT, PUB_TRANSIENT, DELIVER, ACK = 0, 1, 2, 3
PUB_HEAD_SIZE = 8 + 16 + 8 + 4 + 4  # 40 bytes before the embedded message

record = Struct(
    "head" / BitStruct("prefix" / BitsInteger(2), "seq_id" / BitsInteger(62)),
    "pub"
    / If(
        this.head.prefix <= PUB_TRANSIENT,
        Struct(
            "msg_id" / Bytes(16),
            "expiry" / Int64ub,
            "size" / Int32ub,
            "embedded_size" / Int32ub,
            "embedded" / Bytes(this.embedded_size),
        ),
    ),
)

#: struct twins
HEAD = struct.Struct(">Q")
PUB = struct.Struct(">Q16sQII")
