"""Findings: what is wrong (or worth knowing), where, with a stable code.

Codes are public API: they are listed in docs/findings.md (tests/house/test_docs.py checks it) and never
change meaning. ``CODES`` maps each code to its default severity and a one-line meaning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from cqforensics.base.errors import display, display_all

INFO, WARNING, ERROR = "info", "warning", "error"
MAX_TEXT = 1000  # characters of a message (or a text in details) kept; the rest is cut
SEVERITY_RANK = {INFO: 0, WARNING: 1, ERROR: 2}

CODES: dict[str, tuple[str, str]] = {
    "qi-bad-header": (ERROR, "a .qi segment has a missing or wrong header; the broker deletes it and its .qs"),
    "qi-bad-entry": (ERROR, "a .qi slot breaks the strict entry layout (status, reserved bits, location)"),
    "qs-bad-header": (ERROR, "a .qs segment has a missing or wrong header; its messages cannot be read"),
    "qs-entry-missing": (ERROR, "an index entry points into a .qs file or range that is not there"),
    "qs-entry-crc": (ERROR, "a .qs entry fails its size or CRC check; the broker drops it"),
    "qs-entry-undecodable": (ERROR, "a .qs entry passes its checks but its term does not decode"),
    "msg-missing": (ERROR, "an index entry refers to a shared-store message that is not there"),
    "msg-corrupt": (
        ERROR,
        "a stored message term does not decode, or a store entry is torn (a warning when the "
        "next boot reaches an intact copy, or nothing refers to it)",
    ),
    "rdq-truncated": (WARNING, "a shared-store file ends inside an entry"),
    "rdq-garbage": (WARNING, "bytes in a shared-store file that are no valid entry (zeroed or damaged)"),
    "rdq-rejected-candidate": (
        INFO,
        "a byte range of a shared-store file that frames an entry but was not taken: no index "
        "references its id and its term is no message, or it would hide a referenced entry",
    ),
    "orphan-message": (INFO, "shared-store messages no queue index refers to (garbage until compaction)"),
    "duplicate-copy": (INFO, "the same message id stored more than once"),
    "refcount-mismatch": (WARNING, "recorded reference count differs from the references the indexes hold"),
    "transient-dropped": (INFO, "transient messages on disk that the next boot drops"),
    "expired": (INFO, "messages whose TTL has passed; the broker drops them on delivery"),
    "queue-dir-mismatch": (WARNING, "a dir name does not match the md5/base-36 of the name it holds"),
    "missing-queue-name": (WARNING, "a queue or vhost dir without a readable .queue_name/.vhost"),
    "queue-index-missing": (
        ERROR,
        "a durable queue of the metadata has no readable index dir: the next boot "
        "starts it empty and its messages are lost",
    ),
    "unknown-queue": (WARNING, "a queue dir not in the durable-queue metadata: the broker deletes it at boot"),
    "unknown-file": (INFO, "a file the broker does not use in this place"),
    "not-regular-file": (
        WARNING,
        "a FIFO, socket, device, directory or unfollowable symlink where a file is expected; never read",
    ),
    "value-out-of-range": (
        WARNING,
        "a decoded value does not fit its column: a number past its range (e.g. an "
        "expiry past 2^63 or year 9999) or, in a message term (--deep), a value of "
        "another kind than the broker writes there; shown as null",
    ),
    "v1-journal-torn": (WARNING, "a CQv1 journal ends in a partial or invalid record"),
    "v1-segment-truncated": (
        ERROR,
        "a CQv1 segment ends inside a record, or holds one the broker cannot load "
        "(a record prefix 00, a RelSeq past the segment entry count)",
    ),
    "v1-orphan-ack": (WARNING, "a CQv1 deliver/ack record for a message that was never published"),
    "unclean-shutdown": (INFO, "the node was not stopped cleanly: the next boot rebuilds its indexes"),
    "fragmented-file": (INFO, "a shared-store file is mostly garbage; compaction would reclaim it"),
    "combine-interrupted": (
        INFO,
        "a .rdt file: a <= 3.12 file combine was cut short; the next boot of those versions "
        "appends it to its .rdq and recovers the store dirty, later versions ignore it",
    ),
    "boot-crash": (ERROR, "damage that makes the named broker version crash or hang at boot"),
    "recovery-terms-mismatch": (
        ERROR,
        "clean start: a queue's recovery terms do not describe its index (stale "
        "recovery.dets): the queue crashes at init and restarts, or never reads some messages",
    ),
    "store-index-mismatch": (
        ERROR,
        "clean start: the trusted msg_store_index.ets lacks messages queues hold: "
        "reading one crashes the queue (541), its restart drops them",
    ),
    "store-crash": (
        ERROR,
        "clean start: the vhost's message store can crash while it serves (a remove or read of a "
        "message its recorded index lacks or misplaces, its garbage collector, an ack repeated by a "
        "restarted queue); the vhost restarts, clean or dirty: the prediction is given as bounds (a "
        "warning when the crash depends on timing)",
    ),
    "index-duplicate-entry": (
        WARNING,
        "two index entries of one queue (.qi slots or CQv1 records) hold the same "
        "seq id, message id or .qs location: one is a copy of the other",
    ),
    "segment-misplaced": (
        WARNING,
        "an index segment holds the seq ids (or the messages) of another segment "
        "number: swapped or renamed; the broker reads them under the wrong seq ids",
    ),
    "qs-garbage": (
        INFO,
        "bytes between .qs entries that are neither an entry nor zeros: an entry no live index entry "
        "refers to was damaged (the broker never reads it)",
    ),
    "qs-trailing-garbage": (
        WARNING,
        "bytes after the last entry of a .qs segment that are no entry (junk "
        "appended or a torn write); the broker never reads them",
    ),
    "term-file-damaged": (
        WARNING,
        "a Mnesia log, Khepri (Ra) WAL, DETS table or ets dump is torn, holds bytes "
        "that are no item, or holds more or fewer items than it records (a Ra log of the coordination "
        "system that ends before the entry meta.dets says its server applied); or a text "
        "file the broker writes (.config, clean.dot, cluster_nodes.config, ...) holds "
        "NUL bytes, unreadable terms or terms of another shape than its writer's",
    ),
    "storage-not-read": (
        WARNING,
        "the node holds queues of a kind of storage cqforensics does not read "
        "(layout.STORAGE_KINDS): named, their messages are in no count; fsck's "
        "check is incomplete (exit bit 2)",
    ),
    "index-size-mismatch": (
        WARNING,
        "--deep: an index entry's size field is not the size of the body it refers to (a damaged size field, or body)",
    ),
    "quorum-wal-refused": (
        ERROR,
        "a quorum queue WAL (quorum/<node>/*.wal) the next boot's Ra refuses: a record failing "
        "its checksum with records after it (wal_checksum_validation_failure), a writer "
        "reference no record named (Ra < 2.16), or no WAL header: the node does not start",
    ),
    "quorum-wal-entries-lost": (
        WARNING,
        "quorum queue WAL records the next boot's Ra recovery silently drops: after a "
        "torn record, a zero-filled tail or a last record failing its checksum (the "
        "entries there, publishes and acks, are lost: acked messages come back), or "
        "records of writers it skips (info)",
    ),
    "quorum-segment-damaged": (
        ERROR,
        "a Ra segment its server cannot open (header, torn index) or an entry failing its "
        "CRC or cut by the end of the file: the queue crashes when it recovers",
    ),
    "quorum-log-gap": (
        ERROR,
        "log entries of a quorum queue in no segment and no WAL (a segment file lost): right "
        "after its snapshot the queue crashes when it recovers; further on the next boot "
        "skips them silently (what they enqueued is lost, what they settled comes back); at its end, "
        "entries meta.dets says the server applied (a WAL's end lost or replaced), which the next "
        "boot cannot apply again",
    ),
    "quorum-snapshot-damaged": (
        WARNING,
        "a Ra snapshot that fails its CRC or format check: the next boot deletes it "
        "and starts from an older one, or from the log alone",
    ),
    "quorum-queue-unavailable": (
        ERROR,
        "a quorum queue whose Ra server gets no leader at the next boot: its data dir "
        "not registered in names.dets (up to 4.2), or nothing of its log left after "
        "recovery (Ra takes it for a new member): every command to it times out",
    ),
    "quorum-dead-letter-pending": (
        INFO,
        "quorum queue messages waiting in its at-least-once dead-letter state: the "
        "next boot's dead-letter worker republishes them, this queue never delivers them",
    ),
    "quorum-delivery-limit": (
        INFO,
        "quorum queue messages checked out at the stop whose return at the next boot passes "
        "the queue's delivery limit: dead-lettered (or dropped) instead of delivered again",
    ),
    "quorum-state-unmodelled": (
        WARNING,
        "a quorum queue log entry the replay does not apply: the predicted state of "
        "that queue may differ from the broker's",
    ),
    "persistence-mismatch": (
        WARNING,
        "an index entry's persistent flag is not its message's: a transient entry of a "
        "durable queue whose body is in the persistent shared store, or (--deep) a "
        "stored message whose own persistence is not the index's (a flipped flag)",
    ),
    "osiris-bad-header": (ERROR, "a stream segment or index file has a missing or wrong header (OSIL/OSII version 1)"),
    "osiris-index-torn": (
        WARNING,
        "a stream index file ends inside a 29-byte record; the next boot ignores the partial record",
    ),
    "osiris-chunk-torn": (
        ERROR,
        "a stream segment ends inside a chunk (a torn last write): the next boot cuts it, no consumer is served it",
    ),
    "osiris-trailing-bytes": (
        INFO,
        "zero bytes after the last chunk of a stream segment; the next boot truncates them",
    ),
    "osiris-chunk-bad-header": (
        ERROR,
        "bytes that are no chunk header where a stream chunk should start (or an unknown chunk type): readers stop there",
    ),
    "osiris-chunk-crc": (
        ERROR,
        "a stream chunk fails its CRC-32: whether it is served depends on the version and the protocol (see docs/streams.md)",
    ),
    "osiris-entry-bad": (
        ERROR,
        "the entries of a stream chunk do not frame (lengths, record counts) or a sub-batch does not decompress",
    ),
    "osiris-tracking-bad": (
        ERROR,
        "the tracking data of a stream chunk (trailer, delta or snapshot) does not parse, or is out of step with "
        "the stream's other tracking blocks (a writer's sequence going down, a snapshot that lacks a writer or "
        "offset the blocks before it hold, or names another chunk or sequence for it)",
    ),
    "osiris-segment-missing": (ERROR, "a stream index file without its segment: its chunks are gone"),
    "osiris-index-missing": (
        ERROR,
        "a stream segment without its index file: the next boot deletes the segment (osiris 1.8+) or, the only index missing, starts the stream empty",
    ),
    "osiris-chunk-id-gap": (
        ERROR,
        "a stream chunk's id is not the offset the previous chunk ends at: readers stop at the gap",
    ),
    "osiris-index-mismatch": (
        WARNING,
        "a stream index and its segment are out of step (a record naming no chunk, differing ids or timestamps, "
        "records out of chunk order, chunks the index does not list, zero records)",
    ),
    "stream-retention": (INFO, "a stream starts above offset 0: the offsets below were deleted (retention or by hand)"),
    "stream-boot-loss": (
        ERROR,
        "what the named broker version's next boot of a stream deletes or cuts (chunks after the last valid indexed chunk, a segment, the whole stream)",
    ),
    "stream-not-served": (
        WARNING,
        "stream records the next boot keeps that a consumer from first of the named version "
        "is not served (after a gap in chunk ids; compressed sub-batches over AMQP 0-9-1 on "
        "4.x; from a read that fails an AMQP 0-9-1 consumer's channel on)",
    ),
    "message-copies-differ": (
        WARNING,
        "two copies of one message embedded in CQv1 indexes (one message id routed "
        "to two queues) hold different bytes: one is damaged",
    ),
}


def _cut(text: str) -> str:
    return text[:MAX_TEXT] + f"... ({len(text) - MAX_TEXT} more characters cut)"


def _capped(value):
    """``value`` (details: dicts, lists, strings) with every over-long string cut."""
    if isinstance(value, str):
        return _cut(value) if len(value) > MAX_TEXT else value
    if isinstance(value, dict):
        return {k: _capped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_capped(v) for v in value)
    return value


#: where ``Finding.scoped`` places a finding
_PLACES = frozenset({"node", "vhost", "queue", "priority"})


@dataclass(frozen=True)
class Finding:
    """One finding, immutable and located when it is made: readers name the file and offset,
    checks add where in the node it is (``scoped``) by making a new finding.

    ``crashes_queue``: the damage crashes the queue's recovery at boot (a record the broker's
    index parser or merge has no clause for); the boot-crash check collects these."""

    code: str
    message: str
    file: str | None = None
    offset: int | None = None
    severity: str | None = None
    node: str | None = None
    vhost: str | None = None
    queue: str | None = None
    priority: int | None = None
    details: dict = field(default_factory=dict, hash=False)  # never mutated after creation
    crashes_queue: bool = False

    def __post_init__(self):
        if self.code not in CODES:
            raise ValueError(f"unknown finding code {self.code!r}")
        if self.severity is None:
            object.__setattr__(self, "severity", CODES[self.code][0])
        object.__setattr__(self, "details", _capped(display_all(dict(self.details))))  # a copy of its own
        for name in ("message", "file", "node", "vhost", "queue"):  # undecodable names as \\xNN text
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, display(v))
        if len(self.message) > MAX_TEXT:  # never an unbounded repr of damaged data
            object.__setattr__(self, "message", _cut(self.message))

    def scoped(self, **where) -> Finding:
        """This finding placed in a node, vhost, queue and/or priority level (a new finding).
        Only the new places are made text (``display``): the rest was made once, when this
        finding was (made again, a cut text would be cut again, its count of cut characters
        lost; and a node of many queues scopes as many findings, each twice)."""
        bad = where.keys() - _PLACES
        if bad:
            raise TypeError(f"scoped() takes node, vhost, queue, priority, not {sorted(bad)}")
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        for name, v in where.items():
            object.__setattr__(new, name, display(v) if v is not None and name != "priority" else v)
        return new

    def to_dict(self) -> dict:
        return {
            "code": self.code,
            "severity": self.severity,
            "node": self.node,
            "vhost": self.vhost,
            "queue": self.queue,
            "priority": self.priority,
            "file": self.file,
            "offset": self.offset,
            "message": self.message,
            "details": dict(self.details),
        }

    @classmethod
    def out_of_range(cls, name: str, value: int, file, offset: int | None) -> Finding:
        """A decoded number that does not fit its column: the column shows null (never a wrapped
        or clamped value) and this finding says where the number is."""
        return cls(
            "value-out-of-range",
            f"{name} {value} is outside the range of its column: shown as null",
            display(file) if file is not None else None,
            offset,
            details={"field": name, "value": str(value)},
        )

    def details_json(self) -> str:
        return json.dumps(self.details, sort_keys=True, default=str)
