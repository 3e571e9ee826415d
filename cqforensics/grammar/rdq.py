"""Shared message store file ``<N>.rdq`` (msg_store_persistent / msg_store_transient):
a sequence of ``<<Size:64, MsgId:16/binary, Body:(Size-16)/binary, 255>>``; no header.

Sources: MF = rabbit_msg_file.erl (<= 3.13.0) append/read/scan; MS = rabbit_msg_store.erl
(writer_append, reader_pread_parse). Identical in every version 3.10 -> main.
"""

from __future__ import annotations

import struct

from construct import Bytes, Const, Int64ub, Struct, this

WRITE_OK_MARKER = 0xFF  # MF ?WRITE_OK_MARKER
ENTRY_HEADER_SIZE = 24  # 8-byte size + 16-byte msg id
ENTRY_OVERHEAD = 9  # size field + marker: TotalSize = Size + 9
MSG_ID_SIZE = 16
FILE_SIZE_LIMIT = 16 * 1024 * 1024  # msg_store_file_size_limit default
LARGE_MESSAGE = 4_000_000  # 4.0+: a body this big gets a file of its own (MS ?LARGE_MESSAGE_THRESHOLD)

entry = Struct(
    "size" / Int64ub,  # 16 + len(body)
    "msg_id" / Bytes(MSG_ID_SIZE),  # the message guid (not a content hash)
    "body" / Bytes(this.size - MSG_ID_SIZE),  # term_to_binary(Msg)
    "marker" / Const(bytes([WRITE_OK_MARKER])),
)

#: struct twins of the entry head (size + msg id) and of its size field alone
ENTRY_HEAD = struct.Struct(">Q16s")
ENTRY_SIZE_FIELD = struct.Struct(">Q")
