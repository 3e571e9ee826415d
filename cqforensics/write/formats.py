"""Bytes of every file a writer produces, built with the twins of ``cqforensics.grammar``
(tests check each builder against the construct grammar it twins).

What the broker accepts (rabbitmq-formats.md section 9.4): index entries with status 1, the
persistent flag and zero reserved bits; ``.qi``/``.qs`` segments headed by their magic, version
and the segment's SeqId range; ``.qs`` entries of the exact term size with a CRC; shared-store
entries ``[u64 16 + len][id][term][255]``; CQv1 publish records (term embedded below the
threshold) and a deliver record for a delivered message.
"""

from __future__ import annotations

import zlib

import numpy as np

from cqforensics.grammar import idx as c_idx
from cqforensics.grammar import qi as c_qi
from cqforensics.grammar import qs as c_qs
from cqforensics.grammar import rdq as c_rdq

#: queue_index_embed_msgs_below: smaller messages go to the queue's own store (.qs / embedded)
EMBED_BELOW = 4096


def segment_header(magic: bytes, number: int, entry_count: int) -> bytes:
    """The 64-byte header of a ``.qi`` or ``.qs`` segment (IDX2 new_segment_file, QS2
    maybe_write_file_header): magic, version 2, from and to SeqId, zero padding."""
    h = np.zeros(1, c_qi.HEADER_DTYPE)
    h["magic"], h["version"] = magic, c_qi.VERSION
    h["from_seq_id"] = number * entry_count
    h["to_seq_id"] = (number + 1) * entry_count
    return h.tobytes()


def qi_segment(number: int, entry_count: int, slots: np.ndarray, persistent: np.ndarray, loc_kind: np.ndarray,
               msg_id: np.ndarray, qs_offset: np.ndarray, qs_size: np.ndarray, size: np.ndarray,
               expiry: np.ndarray) -> bytes:
    """A ``.qi`` segment holding live entries at ``slots`` (ascending); every other slot up to
    the last is zero (acked). Arrays are aligned with ``slots``."""
    n = int(slots[-1]) + 1 if len(slots) else 0
    e = np.zeros(n, c_qi.ENTRY_DTYPE)
    e["status"][slots] = 1
    e["flags"][slots] = persistent.astype(np.uint8) & 1
    e["loc_kind"][slots] = loc_kind
    shared = loc_kind == c_qi.LOC_SHARED_STORE
    if shared.any():
        e["msg_id"][slots[shared]] = msg_id[shared]
    qs = loc_kind == c_qi.LOC_QUEUE_STORE
    if qs.any():  # the location's second variant overlays msg_id: write it after
        e["qs_offset"][slots[qs]] = qs_offset[qs]
        e["qs_size"][slots[qs]] = qs_size[qs]
        e["loc_pad"][slots[qs]] = 0
    e["size"][slots] = size
    e["expiry"][slots] = expiry
    return segment_header(c_qi.MAGIC, number, entry_count) + e.tobytes()


def qs_entry_header(term: bytes) -> bytes:
    """QS2 entry header: term size, CRC flag, low 16 bits of CRC-32 over the term, 0."""
    return c_qs.ENTRY_HEADER.pack(len(term), 1, zlib.crc32(term) & 0xFFFF, 0)


def rdq_entry(msg_id: bytes, term: bytes) -> bytes:
    """A shared-store entry (MS writer_append)."""
    return c_rdq.ENTRY_HEAD.pack(c_rdq.MSG_ID_SIZE + len(term), msg_id) + term + b"\xff"


def rdq_entry_size(term_len: int) -> int:
    return term_len + c_rdq.ENTRY_HEADER_SIZE + 1


def v1_publish_head(rel_seq: int, persistent: bool, msg_id: bytes, expiry: int, size: int,
                    embedded_size: int = 0) -> bytes:
    """A CQv1 segment publish record up to its embedded term (``embedded_size`` bytes follow;
    0: the message is in the shared store)."""
    head = 0x8000 | (0x4000 if persistent else 0) | rel_seq
    return c_idx.PUB.pack(head, msg_id, expiry, size, embedded_size)


def v1_deliver(rel_seq: int) -> bytes:
    """A CQv1 deliver (or, repeated, ack) record."""
    return c_idx.HEAD.pack(0x4000 | rel_seq)


def queue_name_stub(vhost: bytes, name: bytes, index_version: int) -> bytes:
    """``.queue_name`` as IDX2/QI1 write it (v2 adds the INDEX line)."""
    out = b"VHOST: " + vhost + b"\nQUEUE: " + name + b"\n"
    return out + b"INDEX: v2\n" if index_version == 2 else out
