"""Every integer code of the project, as one family of enums.

Readers, the model, checks and tables store these codes in numpy arrays (one byte each); their
``label`` is the public spelling used in tables, findings and reports (part of the API, listed
in docs/tables.md). No bare integer stands for any of them anywhere else.

``labels(E)`` lists the labels of the non-negative members in value order, the dictionary
``tables.names_array`` expands codes with.
"""

from __future__ import annotations

from enum import IntEnum


class _Coded(IntEnum):
    @property
    def label(self) -> str:
        return self.name.lower()


def labels(enum: type[_Coded]) -> tuple[str, ...]:
    members = sorted((m for m in enum if m >= 0), key=int)
    assert [int(m) for m in members] == list(range(len(members))), enum  # dense from 0
    return tuple(m.label for m in members)


class Location(_Coded):
    """Where an index entry says the message body is (CQv2 location kinds; v1 adds embedded)."""

    NONE = -1  # no usable location (ghost, bad slot, malformed)
    MEMORY = 0
    SHARED_STORE = 1
    QUEUE_STORE = 2
    EMBEDDED = 3


class RecordKind(_Coded):
    """One record of a queue index (the ``index`` table's ``kind``)."""

    PUBLISH = 0
    DELIVER = 1
    ACK = 2
    GHOST = 3  # a v2 slot dirty recovery dropped (status zeroed, other bytes left)
    BAD = 4  # a v2 slot the strict parser rejects


class SlotClass(_Coded):
    """A CQv2 ``.qi`` slot as IDX2 recover_segment sees it (readers.qi)."""

    EMPTY = 0
    LIVE = 1
    GHOST = 2
    BAD = 3


class AckEvidence(_Coded):
    """Why an index says a message is gone (the ``acks`` table's ``evidence``)."""

    V1_ACK = 0
    V1_JOURNAL_ACK = 1
    V2_ZEROED_SLOT = 2
    V2_DROPPED_BY_RECOVERY = 3


class Fate(_Coded):
    """What the next boot does with a message the index holds (``drop_reason``; DELIVERED: kept).

    model.recovery decides it, in one decision table for every broker version."""

    DELIVERED = 0
    QUEUE_DELETED = 1
    V1_UNSUPPORTED = 2
    SEGMENT_DELETED = 3
    BAD_INDEX_ENTRY = 4
    TRANSIENT = 5
    NOT_ON_DISK = 6
    BAD_LOCATION = 7
    BODY_MISSING = 8
    BODY_UNREACHABLE = 9
    QS_MISSING_FILE = 10
    QS_BAD_HEADER = 11
    QS_OUT_OF_RANGE = 12
    QS_BAD_SIZE = 13
    QS_BAD_CRC = 14
    EXPIRED = 15
    QUEUE_CRASH = 16
    BOOT_HANG = 17
    DELIVERY_CRASH = 18
    VHOST_CRASH = 19
    #: clean start: an index entry outside the seq ids its queue's recovery terms name (stale
    #: terms: published after them); the queue never reads it, and new publishes reuse its slot
    NOT_IN_RECOVERY_TERMS = 20
    #: clean start: a shared-store message the trusted msg_store_index.ets does not record; the
    #: queue crashes reading it (541) and its restart drops it
    NOT_IN_STORE_INDEX = 21
    # streams (model.recovery.stream_fate): a record's fate is its chunk's
    #: the next boot cuts the chunk (after the last valid indexed chunk, with a segment whose
    #: index is gone, or the whole stream when it restarts empty)
    STREAM_CHUNK_CUT = 22
    #: the stream does not start at the next boot (osiris 1.3.1: its last segment is missing)
    STREAM_NOT_STARTED = 23
    #: kept, but a reader from ``first`` stops before it (a gap in chunk ids)
    STREAM_UNREACHED = 24
    #: AMQP 0-9-1 only (``amqp091_drop_reason``): a compressed sub-batch, which 4.x skips
    STREAM_COMPRESSED_SKIPPED = 25
    #: AMQP 0-9-1 only: the broker's read that fails the consumer's channel (a bad CRC, a
    #: compressed sub-batch on 3.x, a record that is no AMQP 1.0 message) takes it, or comes before it
    STREAM_READ_FAILS = 26
    #: quorum queue: returned at the boot (its consumer gone with the old node) past the queue's
    #: delivery limit, so dead-lettered (or dropped) instead of delivered again
    DELIVERY_LIMIT = 27
    #: quorum queue: waiting in the queue's at-least-once dead-letter state; the boot's
    #: dead-letter worker publishes it to the dead-letter exchange, this queue never delivers it
    DEAD_LETTERED = 28
    #: quorum queue: held by the log as the files keep it, but in entries the next boot's Ra
    #: recovery does not read (after a torn, zero-filled or damaged WAL record)
    LOG_LOST = 29
    #: quorum queue: its Ra server does not come up as a leader (not registered in names.dets,
    #: or its log lost below what meta.dets says it applied): every command to it times out
    QUEUE_UNAVAILABLE = 30

    @property
    def reason(self) -> str | None:
        """The ``drop_reason`` spelling (None when delivered)."""
        return None if self is Fate.DELIVERED else self.label


class QsStatus(_Coded):
    """The check of a ``.qs`` entry an index entry points at (QS2 check_msg_on_disk)."""

    NONE = 0  # not a .qs entry
    OK = 1
    MISSING_FILE = 2
    BAD_HEADER = 3
    OUT_OF_RANGE = 4
    BAD_SIZE = 5
    BAD_CRC = 6


class StoreStatus(_Coded):
    """A shared-store entry (the ``store`` table's ``status``)."""

    LIVE = 0
    ORPHAN = 1
    DUPLICATE = 2
    CORRUPT = 3


class RefcountStatus(_Coded):
    """A shared-store message id (the ``refcounts`` table's ``status``)."""

    OK = 0
    DUPLICATE = 1
    ORPHAN = 2
    MISMATCH = 3
    MISSING = 4


# Public spellings that differ from the member names.
LOCATION_LABELS = ("memory", "shared_store", "queue_store", "embedded")
assert LOCATION_LABELS == labels(Location)
FATE_LABELS = labels(Fate)  # index 0 is "delivered"; drop reasons are FATE_LABELS[1:]
