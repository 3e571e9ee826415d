"""OTP disk_log "internal" logs: ets:tab2file output (``file_summary.ets``,
``msg_store_index.ets``) and Mnesia ``.DCD``/``.DCL`` table files.

``<<1,2,3,4, Status:4/binary>>`` then items ``<<Len:32, "bWLA", [md5(<<Len:32>>)], Term:Len/binary>>``
(the md5 is present when Len >= 65528). Sources: OTP lib/kernel/src/disk_log_1.erl,
disk_log.hrl (?LOGMAGIC, ?OPENED, ?CLOSED, ?BIGMAGICHEAD, ?MIN_MD5_TERM).
"""

from __future__ import annotations

import struct

from construct import Bytes, Const, If, Int32ub, Struct, this

FILE_MAGIC = b"\x01\x02\x03\x04"  # ?LOGMAGIC
CLOSED = b"\x63\x58\x4d\x0b"  # ?CLOSED: the log was closed properly
OPENED = b"\x06\x07\x08\x09"  # ?OPENED: still open (crash) when read
ITEM_MAGIC = b"bWLA"  # ?BIGMAGICHEAD
OLD_ITEM_MAGIC = b"\x0c\x21\x2c\x37"  # ?MAGICHEAD: items of logs written before format 2(a), no md5 ever
MIN_MD5_TERM = 65528  # ?MIN_MD5_TERM
HEADER_SIZE = 8  # the file header (?HEADSZ), and each item's header (?HEADERSZ)
MAX_CHUNK_SIZE = 65536  # ?MAX_CHUNK_SIZE: what disk_log reads at a time

header = Struct("magic" / Const(FILE_MAGIC), "status" / Bytes(4))

item = Struct(
    "length" / Int32ub,
    "magic" / Const(ITEM_MAGIC),
    "md5" / If(this.length >= MIN_MD5_TERM, Bytes(16)),
    "term" / Bytes(this.length),  # term_to_binary(Item)
)

ITEM_HEAD = struct.Struct(">I4s")
