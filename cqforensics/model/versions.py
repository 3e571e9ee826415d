"""What each RabbitMQ version does with the files at boot, and which version wrote the data.

``BEHAVIOURS`` below is the version table: every behaviour the next-boot prediction
(model/recovery.py, checks) and the writers (write/) depend on, per release series from 3.10.0
to 4.3.x, each with the RabbitMQ source file/function and tag, or the release note, it comes
from (tests/model/test_versions.py checks that ``BrokerModel`` answers exactly what the table says).
Summary:

==============  =====================  ==================  ==============================  ============
version         shared-store scan      duplicate in file   CQv1 index                      message term
==============  =====================  ==================  ==============================  ============
3.10 - 3.12     sequential; stops at   last copy wins      read; default for new queues    #basic_message
                a zero size field      (reverse fold)
3.13.0          sequential             first copy wins     read; default for new queues    #mc
3.13.1 - 3.13   byte-wise resync       first copy wins     read; default for new queues    #mc
4.0 - 4.2       byte-wise + index      first copy wins     converted to v2 at boot         #mc
4.3             byte-wise + index      first copy wins     not read (removed)              #mc
==============  =====================  ==================  ==============================  ============

``Evidence.range()`` names the narrowest range of versions the data supports (``VersionRange``)
and why; prediction then uses the newest version of that range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cqforensics.base.errors import UsageError

_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?$")


@dataclass(frozen=True)
class BrokerModel:
    """One broker version. Every behaviour is answered by the version table (``BEHAVIOURS``,
    which cites the RabbitMQ source of each value) for the version's release series."""

    version: tuple[int, int, int]
    label: str

    @property
    def series(self) -> str:
        """The release series of the version table this version belongs to."""
        major, minor, patch = self.version
        if (major, minor) == (3, 13):
            return "3.13.0" if patch == 0 else "3.13.1+"
        return f"{major}.{minor}"

    def _answer(self, behaviour: str):
        return BEHAVIOURS[behaviour][0][self.series]

    @property
    def sequential_scan(self) -> bool:
        """The shared-store scan stops at a zero size field (else it resynchronises byte by byte)."""
        return self._answer("sequential_scan")

    @property
    def last_copy_wins(self) -> bool:
        """Of two copies of an id in one file, recovery claims the last one."""
        return self._answer("last_copy_wins")

    @property
    def appends_rdt(self) -> bool:
        """A ``N.rdt`` left by an interrupted file combine is appended to ``N.rdq`` at boot."""
        return self._answer("appends_rdt")

    @property
    def reads_v1(self) -> bool:
        """The CQv1 index (``.idx`` + ``journal.jif``) is read at boot."""
        return self._answer("reads_v1")

    @property
    def converts_v1(self) -> bool:
        """A CQv1 queue is converted to v2 at boot."""
        return self._answer("converts_v1")

    @property
    def large_message_own_file(self) -> bool:
        """A stored term of 4,000,000 bytes or more gets a shared-store file of its own."""
        return self._answer("large_message_own_file")

    @property
    def stores_mc(self) -> bool:
        """Messages are stored as ``#mc{}`` containers, not ``#basic_message{}``."""
        return self._answer("stores_mc")

    @property
    def amqp10_state(self) -> str | None:
        """How an AMQP 1.0 message is kept in ``#mc{mc_amqp}``: None (no containers), ``msg`` (the
        3.13 ``#msg{}`` record of decoded sections) or ``v1`` (the section bytes)."""
        return self._answer("amqp10_state")

    @property
    def utf8_atoms(self) -> bool:
        """Atoms are written as SMALL_ATOM_UTF8_EXT (the OTP the version runs on)."""
        return self._answer("utf8_atoms")

    @property
    def default_index_version(self) -> int:
        """The index version of a queue declared without x-queue-version."""
        return self._answer("default_index_version")

    @property
    def metadata_stores(self) -> tuple[str, ...]:
        """The metadata stores the version runs on, default first."""
        return self._answer("metadata_stores")

    @property
    def recovery_seq_term(self) -> str:
        """The recovery term (recovery.dets) naming a queue's delivery position."""
        return self._answer("recovery_seq_term")

    @property
    def clean_dot_index_module(self) -> bool:
        """The shared store's clean.dot records ``index_module``."""
        return self._answer("clean_dot_index_module")

    @property
    def index_v2_only(self) -> bool:
        """Every classic queue uses the v2 index, so writers write v2."""
        return self._answer("index_v2_only")

    @property
    def store_serves_current_file_reads(self) -> bool:
        """A queue's read of a message in the shared store's current file goes to the store
        process, so a read that fails there crashes the store, and with it the vhost (a read of
        any other file runs in the queue and crashes only the queue)."""
        return self._answer("store_serves_current_file_reads")

    @property
    def store_reads_in_batches(self) -> bool:
        """A queue reads the shared-store bodies of what it loads from its index in batches
        (rather than one as it delivers it): a batch whose read fails delivers none of it."""
        return self._answer("store_reads_in_batches")

    @property
    def store_gc(self) -> str:
        """How the shared store collects garbage: ``combine`` (two neighbouring files merged,
        each checked against file_summary) or ``compact`` (one file compacted in place against
        the index)."""
        return self._answer("store_gc")

    @property
    def missing_qs_reads_empty(self) -> bool:
        """A clean start reads a missing ``.qs`` segment as no messages instead of crashing the
        queue on the read."""
        return self._answer("missing_qs_reads_empty")

    @property
    def queue_starts_from_terms(self) -> bool:
        """A clean start sizes each v2 queue from its recovery terms (persistent_count between
        its first recorded segment and next_seq_id) without reading its index, and crashes the
        queue at init when the index holds another number there."""
        return self._answer("queue_starts_from_terms")

    @property
    def store_index_loaded_unverified(self) -> bool:
        """A clean start loads msg_store_index.ets with ``ets:file2tab`` without ``verify``: damaged
        items are skipped, a torn end ends the table, and the start stays clean."""
        return self._answer("store_index_loaded_unverified")

    @property
    def empty_index_bounds_at_next_seq_id(self) -> bool:
        """A v2 index with no segment recorded starts its queue at next_seq_id (else at 0)."""
        return self._answer("empty_index_bounds_at_next_seq_id")

    @property
    def stream_amqp091_reader(self) -> str:
        """How the broker reads a stream for an AMQP 0-9-1 consumer: ``parsed_chunks`` (whole
        chunks, every record converted; a compressed sub-batch cannot be) or ``chunk_iterator``
        (entry by entry, compressed sub-batches skipped)."""
        return self._answer("stream_amqp091_reader")

    @property
    def stream_amqp091_crc(self) -> str:
        """Which stream chunks an AMQP 0-9-1 consumer's reads check the CRC of (a bad one ends
        the consumer's channel): ``every_chunk`` (tracking chunks too), ``user_chunks``,
        ``one_entry_chunks`` (a chunk of one entry opened with a credit other than 1) or ``none``."""
        return self._answer("stream_amqp091_crc")

    @property
    def stream_amqp091_conversion(self) -> str:
        """How a stream record (AMQP 1.0) is converted for an AMQP 0-9-1 consumer: ``msg_record``
        (rabbit_msg_record:to_amqp091/1) or ``mc`` (mc_amqpl:convert_from(mc_amqp, ..))."""
        return self._answer("stream_amqp091_conversion")

    @property
    def amqp10_reply_to_urldecoded(self) -> bool:
        """An AMQP 1.0 reply-to ``/queues/<name>`` reaches an AMQP 0-9-1 consumer as ``<name>``."""
        return self._answer("amqp10_reply_to_urldecoded")

    @property
    def amqp10_headerless_durable(self) -> bool:
        """A stream record without a header section (and without an x-basic-delivery-mode
        annotation) counts as durable (AMQP 0-9-1 delivery mode 2) when read back."""
        return self._answer("amqp10_headerless_durable")

    @property
    def stream_missing_last_segment(self) -> str:
        """The next boot of a stream whose last index has no segment: ``fails`` (the stream does
        not start) or ``index_deleted`` (the index is deleted and the previous pair is last)."""
        return self._answer("stream_missing_last_segment")

    @property
    def stream_deletes_orphan_segments(self) -> bool:
        """The next boot deletes segments whose index is missing (osiris orphaned_segments/1)."""
        return self._answer("stream_deletes_orphan_segments")

    @property
    def ra_version(self) -> tuple[int, int, int]:
        """The Ra library the version ships (quorum queue storage: WAL, segments, snapshots)."""
        return self._answer("ra_version")

    @property
    def qq_empty_member_elected(self) -> bool | None:
        """A quorum queue member that recovers nothing of its log (no snapshot, no entry: every
        WAL record of it lost) is elected at boot and comes up empty (True); or it waits for an
        election nobody calls (Ra: ra_server:is_new/1, ra_server_proc follower(enter)) and the
        queue gets no leader (False); None: either, as the boot's timing falls (3.x)."""
        return self._answer("qq_empty_member_elected")

    @property
    def qq_recover_elects_new_member(self) -> bool:
        """At boot, a quorum queue member names.dets does not register is started afresh under
        the uid the queue record names (its own dir) and an election is triggered; before, it
        is started under a new uid (an empty dir) and nobody triggers its election."""
        return self._answer("qq_recover_elects_new_member")

    @property
    def fifo_machine_version(self) -> int:
        """The rabbit_fifo machine version its quorum queues run."""
        return self._answer("fifo_machine_version")

    def __str__(self) -> str:
        return self.label


SUPPORTED = ("3.10", "3.11", "3.12", "3.13.0", "3.13.1", "3.13", "4.0", "4.1", "4.2", "4.3")


def model(version: str) -> BrokerModel:
    """'3.10', '3.13.1', '4.3', '4.0.5' ... -> BrokerModel (3.10 <= version <= 4.3)."""
    m = _VERSION.match(version.strip())
    if not m:
        raise UsageError(f"bad broker version {version!r}; use e.g. 3.10, 3.13.1, 4.0 or 4.3.6")
    major, minor = int(m.group(1)), int(m.group(2))
    patch = int(m.group(3)) if m.group(3) is not None else (7 if (major, minor) == (3, 13) else 0)
    v = (major, minor, patch)
    if not (3, 10, 0) <= v < (4, 4, 0):
        raise UsageError(f"broker version {version} is outside the supported range 3.10 .. 4.3")
    return BrokerModel(v, version.strip())


#: Release series of the version table, each with the version ``model`` builds for it.
SERIES = {
    "3.10": "3.10",
    "3.11": "3.11",
    "3.12": "3.12",
    "3.13.0": "3.13.0",
    "3.13.1+": "3.13",
    "4.0": "4.0",
    "4.1": "4.1",
    "4.2": "4.2",
    "4.3": "4.3",
}

#: The version table: behaviour -> ({series: value}, source). A value of a BrokerModel property
#: (named by the key) is what that property answers for the series' model.
BEHAVIOURS: dict[str, tuple[dict[str, object], str]] = {
    "sequential_scan": (
        {
            "3.10": True,
            "3.11": True,
            "3.12": True,
            "3.13.0": True,
            "3.13.1+": False,
            "4.0": False,
            "4.1": False,
            "4.2": False,
            "4.3": False,
        },
        "rabbit_msg_file:scanner/4 stops at a zero size field (deps/rabbit/src/rabbit_msg_file.erl, "
        "v3.10.0 - v3.13.0); v3.13.1 removed the module: rabbit_msg_store:scan_data/6 resynchronises "
        "byte by byte",
    ),
    "last_copy_wins": (
        {
            "3.10": True,
            "3.11": True,
            "3.12": True,
            "3.13.0": False,
            "3.13.1+": False,
            "4.0": False,
            "4.1": False,
            "4.2": False,
            "4.3": False,
        },
        "rabbit_msg_store:build_index_worker: up to v3.12.14 it folds the scan's end-of-file-first "
        "list as is (the last copy in a file is claimed); v3.13.0 reverses it first (first copy)",
    ),
    "appends_rdt": (
        {
            "3.10": True,
            "3.11": True,
            "3.12": True,
            "3.13.0": False,
            "3.13.1+": False,
            "4.0": False,
            "4.1": False,
            "4.2": False,
            "4.3": False,
        },
        "rabbit_msg_store:recover_crashed_compactions (v3.10.0 - v3.12.14): each N.rdt (the tail of "
        "a combine's destination file) is appended to N.rdq and the store recovers dirty; v3.13.0 "
        "compacts in place and no longer looks at .rdt files",
    ),
    "stores_mc": (
        {
            "3.10": False,
            "3.11": False,
            "3.12": False,
            "3.13.0": True,
            "3.13.1+": True,
            "4.0": True,
            "4.1": True,
            "4.2": True,
            "4.3": True,
        },
        "#basic_message up to 3.12; deps/rabbit/src/mc.erl and feature flag message_containers "
        "(rabbit_core_ff.erl) appear in v3.13.0: #mc{} containers (mc_amqpl, mc_amqp)",
    ),
    "amqp10_state": (
        {
            "3.10": None,
            "3.11": None,
            "3.12": None,
            "3.13.0": "msg",
            "3.13.1+": "msg",
            "4.0": "v1",
            "4.1": "v1",
            "4.2": "v1",
            "4.3": "v1",
        },
        "deps/rabbit/src/mc_amqp.erl: v3.13.x keeps an AMQP 1.0 message as #msg{} of decoded "
        "'v1_0.*' section records; v4.0.0 keeps the bare message's bytes ({v1, ...}); no #mc before 3.13",
    ),
    "utf8_atoms": (
        {
            "3.10": False,
            "3.11": False,
            "3.12": False,
            "3.13.0": True,
            "3.13.1+": True,
            "4.0": True,
            "4.1": True,
            "4.2": True,
            "4.3": True,
        },
        "atom encoding follows OTP: term_to_binary writes UTF-8 atoms from OTP 26. Required OTP "
        "(release notes, which-erlang compatibility matrix): 3.10 23.2-25, 3.11 25, 3.12 25-26 "
        "(written for 25), 3.13 26 only, 4.0/4.1 26.2-27, 4.2 27, 4.3 27-28",
    ),
    "default_index_version": (
        {"3.10": 1, "3.11": 1, "3.12": 1, "3.13.0": 1, "3.13.1+": 1, "4.0": 2, "4.1": 2, "4.2": 2, "4.3": 2},
        "rabbit_variable_queue:init: classic_queue_default_version defaults to 1 (v3.10.0 - v3.13.7; "
        "3.13.0 release notes recommend CQv2); v4.0.0 has v2 only",
    ),
    "reads_v1": (
        {
            "3.10": True,
            "3.11": True,
            "3.12": True,
            "3.13.0": True,
            "3.13.1+": True,
            "4.0": True,
            "4.1": True,
            "4.2": True,
            "4.3": False,
        },
        "deps/rabbit/src/rabbit_queue_index.erl exists v3.10.0 - v4.2.x, removed in v4.3.0 "
        "(4.3.0 release notes: CQv1 Storage is Removed)",
    ),
    "converts_v1": (
        {
            "3.10": False,
            "3.11": False,
            "3.12": False,
            "3.13.0": False,
            "3.13.1+": False,
            "4.0": True,
            "4.1": True,
            "4.2": True,
            "4.3": False,
        },
        "rabbit_variable_queue:convert_from_v1_to_v2_loop/8 (v4.0.0 - v4.2.x) converts a v1 queue "
        "at boot and deletes its v1 segments",
    ),
    "index_v2_only": (
        {
            "3.10": False,
            "3.11": False,
            "3.12": False,
            "3.13.0": False,
            "3.13.1+": False,
            "4.0": True,
            "4.1": True,
            "4.2": True,
            "4.3": True,
        },
        "v4.0.0: x-queue-version no longer selects an index (queues are v2; v1 is converted)",
    ),
    "metadata_stores": (
        {
            "3.10": ("mnesia",),
            "3.11": ("mnesia",),
            "3.12": ("mnesia",),
            "3.13.0": ("mnesia", "khepri"),
            "3.13.1+": ("mnesia", "khepri"),
            "4.0": ("mnesia", "khepri"),
            "4.1": ("mnesia", "khepri"),
            "4.2": ("khepri", "mnesia"),
            "4.3": ("khepri",),
        },
        "feature flag khepri_db from v3.13.0 (rabbit_core_ff.erl); 4.2.0 release notes: Khepri is the "
        "default for new clusters; 4.3.0 release notes: Mnesia removed",
    ),
    "recovery_seq_term": (
        {
            "3.10": "next_deliver_seq_id",
            "3.11": "next_deliver_seq_id",
            "3.12": "next_deliver_seq_id",
            "3.13.0": "next_deliver_seq_id",
            "3.13.1+": "next_deliver_seq_id",
            "4.0": "next_deliver_seq_id",
            "4.1": "next_deliver_seq_id",
            "4.2": "next_deliver_seq_id",
            "4.3": "redeliver_seq_id",
        },
        "rabbit_variable_queue:terminate/2 recovery terms (v3.10.0 - v4.2.x: next_deliver_seq_id; "
        "v4.3.0: redeliver_seq_id, the old term still read)",
    ),
    "clean_dot_index_module": (
        {
            "3.10": True,
            "3.11": True,
            "3.12": True,
            "3.13.0": True,
            "3.13.1+": True,
            "4.0": False,
            "4.1": False,
            "4.2": False,
            "4.3": False,
        },
        "rabbit_msg_store terminate writes {index_module, _} into clean.dot up to v3.13.7, not from v4.0.0",
    ),
    "large_message_own_file": (
        {
            "3.10": False,
            "3.11": False,
            "3.12": False,
            "3.13.0": False,
            "3.13.1+": False,
            "4.0": True,
            "4.1": True,
            "4.2": True,
            "4.3": True,
        },
        "rabbit_msg_store:write_message/3, LARGE_MESSAGE_THRESHOLD 4,000,000 bytes (v4.0.0)",
    ),
    "store_serves_current_file_reads": (
        {
            "3.10": True,
            "3.11": True,
            "3.12": True,
            "3.13.0": False,
            "3.13.1+": False,
            "4.0": False,
            "4.1": False,
            "4.2": False,
            "4.3": False,
        },
        "rabbit_msg_store:read/2 and client_read2/5 (v3.10.0 - v3.12.14): a read of the current file "
        "(file_summary right = undefined), of a locked file or of an id the client's index lookup does "
        "not find is deferred to the store process (server_call {read, MsgId}: read_message1, "
        "read_from_disk, get_read_handle), which crashes when the bytes are not there; other reads run "
        "in the queue (client_read3). v3.13.0 reads every file in the queue (client_read3, reader_open). "
        "Seen on 3.10.8: a missing current file crashes the vhost, a missing older one only the reading "
        "queue, tests/real_brokers/test_recovery_state_brokers.py",
    ),
    "store_reads_in_batches": (
        {
            "3.10": False,
            "3.11": False,
            "3.12": False,
            "3.13.0": True,
            "3.13.1+": True,
            "4.0": True,
            "4.1": True,
            "4.2": True,
            "4.3": True,
        },
        "rabbit_variable_queue:maybe_deltas_to_betas (v3.13.0 - v4.3.x): the shared-store bodies of 10 or "
        "more messages of 12,000 bytes or less loaded from the index together are read with "
        "rabbit_msg_store:read_many (SHARED_READ_MANY_COUNT_THRESHOLD, SHARED_READ_MANY_SIZE_THRESHOLD); "
        "v3.10.0 - v3.12.14 read each body with rabbit_msg_store:read/2 as it is delivered (read_msg)",
    ),
    "store_gc": (
        {
            "3.10": "combine",
            "3.11": "combine",
            "3.12": "combine",
            "3.13.0": "compact",
            "3.13.1+": "compact",
            "4.0": "compact",
            "4.1": "compact",
            "4.2": "compact",
            "4.3": "compact",
        },
        "rabbit_msg_store maybe_compact/combine_files (v3.10.0 - v3.12.14: once the store holds more than "
        "2 files' worth and half of it is garbage, two neighbouring non-current files are merged; "
        "load_and_vacuum_message_file must find each file's file_summary valid_total_size among the "
        "entries the index places there, else the GC process crashes, and the store with it); "
        "v3.13.0: compact_file/scan_and_vacuum_message_file compacts one file in place (a file half "
        "garbage, 15 s after a remove), and crashes on an entry the index places in that file at "
        "another offset or size",
    ),
    "missing_qs_reads_empty": (
        {
            "3.10": False,
            "3.11": False,
            "3.12": False,
            "3.13.0": False,
            "3.13.1+": False,
            "4.0": True,
            "4.1": True,
            "4.2": True,
            "4.3": True,
        },
        "seen on 3.10.8 (crash) and 4.3.6 (empty) clean boots, tests/real_brokers/test_predict_brokers.py "
        "qs_missing; 3.11 - 4.2 are assumed like their neighbours (not yet checked against their source)",
    ),
    "queue_starts_from_terms": (
        {
            "3.10": True,
            "3.11": True,
            "3.12": True,
            "3.13.0": True,
            "3.13.1+": True,
            "4.0": True,
            "4.1": True,
            "4.2": True,
            "4.3": True,
        },
        "rabbit_variable_queue:init/9 (v3.10.0 - v4.3.x): with recovery terms, #delta (v4.3.0: #q_tail) "
        "{start_seq_id = LowSeqId, count = persistent_count, end_seq_id = next_seq_id}, LowSeqId from "
        "rabbit_classic_queue_index_v2:bounds over the terms' v2_index_state segments; d/1 (qt/1) asserts "
        "Start + Count =< End while reading it; rabbit_classic_queue_index_v2:recover skips the segment "
        "scan when both the terms and the store are clean. Seen on 3.10.8, 4.0.5 and 4.3.6 "
        "(function_clause in qt/1 at init, then a restart without terms), tests/real_brokers/test_recovery_state_brokers.py",
    ),
    "store_index_loaded_unverified": (
        {
            "3.10": True,
            "3.11": True,
            "3.12": True,
            "3.13.0": True,
            "3.13.1+": True,
            "4.0": True,
            "4.1": True,
            "4.2": True,
            "4.3": True,
        },
        "rabbit_msg_store_ets_index:recover (v3.10.0 - v3.13.x) and rabbit_msg_store:index_recover "
        "(v4.0.0+) call ets:file2tab/1 (no verify), which reads the dump with OTP disk_log_1:handle_chunk_ro "
        "(a byte-wise skip past a bad item header, stop at a torn item); rabbit_msg_store:read/2 and "
        "contains_message use index_lookup_positive_ref_count (not_found: the reading queue crashes). "
        "Seen on 3.10.8, 4.0.5 and 4.3.6 with flipped and truncated dumps",
    ),
    "empty_index_bounds_at_next_seq_id": (
        {
            "3.10": False,
            "3.11": False,
            "3.12": False,
            "3.13.0": False,
            "3.13.1+": False,
            "4.0": False,
            "4.1": False,
            "4.2": True,
            "4.3": True,
        },
        "rabbit_classic_queue_index_v2:bounds/2 (v4.2.0: NextSeqIdHint) returns {Hint, Hint} for an "
        "index without segments; bounds/1 (v3.10.0 - v4.1.x) returns {0, 0}",
    ),
    "stream_amqp091_reader": (
        {
            "3.10": "parsed_chunks",
            "3.11": "parsed_chunks",
            "3.12": "parsed_chunks",
            "3.13.0": "parsed_chunks",
            "3.13.1+": "parsed_chunks",
            "4.0": "chunk_iterator",
            "4.1": "chunk_iterator",
            "4.2": "chunk_iterator",
            "4.3": "chunk_iterator",
        },
        "deps/rabbit/src/rabbit_stream_queue.erl stream_entries: v3.10.0 - v3.13.7 osiris_log:read_chunk_parsed/1 "
        "then binary_to_msg/2 on every record of the chunk in one list comprehension (a {batch, ..} of a "
        "compressed sub-batch, osiris parse_records/3 or iter_all_records/2, cannot be converted); v4.0.0+ "
        "osiris_log:chunk_iterator/2 + iterator_next/1, '%% Skip compressed sub batch.'",
    ),
    "stream_amqp091_crc": (
        {
            "3.10": "every_chunk",
            "3.11": "every_chunk",
            "3.12": "user_chunks",
            "3.13.0": "user_chunks",
            "3.13.1+": "user_chunks",
            "4.0": "one_entry_chunks",
            "4.1": "one_entry_chunks",
            "4.2": "none",
            "4.3": "none",
        },
        "osiris src/osiris_log.erl as each series pins it: read_chunk_parsed/2 calls validate_crc/3 before "
        "needs_handling/3 (every chunk, tracking chunks too) in 1.3.1 (v3.10.8) to 1.6.9 (v3.11.28); from 1.7.2 "
        "(v3.12.14, v3.13.x) it is chunk_iterator(State, all), which validates only the chunks it hands over; "
        "1.8.5/1.8.8 (v4.0.5, v4.1.8) iter_read_ahead/7 returns undefined for a credit hint of 1 and validates "
        "only when the hint is all or NumEntries == 1; 1.10.2 (v4.2.2) and 1.13.1 (v4.3, read from the shipped "
        "beams) never validate on this path. 3.12.0 pins 1.5.1 (every_chunk): the series answers for its last "
        "patch",
    ),
    "stream_amqp091_conversion": (
        {
            "3.10": "msg_record",
            "3.11": "msg_record",
            "3.12": "msg_record",
            "3.13.0": "mc",
            "3.13.1+": "mc",
            "4.0": "mc",
            "4.1": "mc",
            "4.2": "mc",
            "4.3": "mc",
        },
        "deps/rabbit/src/rabbit_stream_queue.erl binary_to_msg/2: rabbit_msg_record:init/1 + to_amqp091/1 up to "
        "v3.12.14; from v3.13.0 an #mc{mc_amqp} converted at delivery by mc_amqpl:convert_from(mc_amqp, ..)",
    ),
    "amqp10_reply_to_urldecoded": (
        {
            "3.10": False,
            "3.11": False,
            "3.12": False,
            "3.13.0": False,
            "3.13.1+": False,
            "4.0": False,
            "4.1": False,
            "4.2": True,
            "4.3": True,
        },
        'deps/rabbit/src/mc_amqpl.erl convert_from(mc_amqp, ..): reply_to <<"/queues/", Q>> -> '
        "cow_uri:urldecode(Q) from v4.2.0 (not in v4.1.8)",
    ),
    "amqp10_headerless_durable": (
        {
            "3.10": False,
            "3.11": False,
            "3.12": False,
            "3.13.0": False,
            "3.13.1+": False,
            "4.0": True,
            "4.1": True,
            "4.2": False,
            "4.3": False,
        },
        "deps/rabbit/src/mc_amqp.erl get_property(durable, ..): a boolean header durable, else v4.0.5/v4.1.8 "
        "true unless x-basic-delivery-mode is {ubyte, 1}; v3.13.7, v4.2.2, v4.3.5 false unless it is "
        "{ubyte, 2}; mc_amqpl:protocol_state/2 then delivers delivery mode 2 unless durable is false (3.10 - "
        "3.12 do not use it: rabbit_msg_record:to_amqp091/1 reads x-basic-delivery-mode only)",
    ),
    "stream_missing_last_segment": (
        {
            "3.10": "fails",
            "3.11": "index_deleted",
            "3.12": "index_deleted",
            "3.13.0": "index_deleted",
            "3.13.1+": "index_deleted",
            "4.0": "index_deleted",
            "4.1": "index_deleted",
            "4.2": "index_deleted",
            "4.3": "index_deleted",
        },
        "osiris_log:maybe_fix_corrupted_files/1: 1.3.1 (3.10) file_size/1 throws missing_file; 1.7.2+ (3.12+) "
        "catches it and deletes the index (3.11 pins osiris main of its day: assumed like 3.12)",
    ),
    "stream_deletes_orphan_segments": (
        {
            "3.10": False,
            "3.11": False,
            "3.12": False,
            "3.13.0": True,
            "3.13.1+": True,
            "4.0": True,
            "4.1": True,
            "4.2": True,
            "4.3": True,
        },
        "osiris_log:maybe_fix_corrupted_files/1 deletes orphaned_segments/1 from osiris 1.8.3 (3.13) on",
    ),
    "ra_version": (
        {
            "3.10": (2, 2, 0),
            "3.11": (2, 6, 3),
            "3.12": (2, 6, 3),
            "3.13.0": (2, 9, 1),
            "3.13.1+": (2, 13, 5),
            "4.0": (2, 14, 0),
            "4.1": (2, 16, 13),
            "4.2": (2, 17, 1),
            "4.3": (3, 1, 10),
        },
        "rabbitmq-components.mk dep_ra at v3.10.8 (2.2.0; installed 3.10.8 ships plugins/ra-2.2.0), v3.11.28 "
        "and v3.12.14 (2.6.3), v3.13.0 (2.9.1), v3.13.7 (2.13.5), v4.0.5 (2.14.0; installed ra-2.14.0), "
        "v4.1.8 (2.16.13), v4.2.2 (2.17.1), v4.3.5 (3.1.10; installed 4.3.6 ships ra-3.1.10): the newest "
        "patch release of each series read (docs/formats/quorum.md section 1)",
    ),
    "qq_empty_member_elected": (
        {
            "3.10": None,
            "3.11": None,
            "3.12": None,
            "3.13.0": None,
            "3.13.1+": None,
            "4.0": False,
            "4.1": False,
            "4.2": False,
            "4.3": False,
        },
        "observed on real brokers booted on the quorum kill samples with their WAL cut at 60% (every record of "
        "three queues lost): 3.10.8 elected the three at boot and they delivered nothing; 4.0.5 and 4.3.6 never do "
        "(basic.get times out; 4.3.6's debug log: ra_log:init recovered last_index_term {0,0}, then no "
        "election timer: ra_server_proc follower(enter) sets none when ra_server:is_new/1, next_index =:= 1, "
        "after ra_log maybe_append_first_entry/1 wrote the {0, 0} entry). Ra's code for this is the same "
        "from 2.2.0 to 3.1.10, so what makes 3.10.8 elect them is not identified; 3.11-3.13 (Ra 2.6-2.13) are "
        "taken as 3.10, 4.1-4.2 (Ra 2.16-2.17) as 4.0 and 4.3, unverified. 3.10.8 is timing: on 2026-11-28 "
        "the 3.10.8-quorum-kill sample with its WAL tail zero-filled (three members left with nothing) was "
        "booted twice on a loaded machine and the three never got a leader (log: 'leader call - leader not "
        "known', basic.get times out), where the same case on a quiet machine, and the WAL cut at 60%, had "
        "them elected; so 3.x gives no answer (None) and fsck says the queue delivers nothing and may not "
        "answer at all",
    ),
    "qq_recover_elects_new_member": (
        {
            "3.10": False,
            "3.11": False,
            "3.12": False,
            "3.13.0": False,
            "3.13.1+": False,
            "4.0": False,
            "4.1": False,
            "4.2": False,
            "4.3": True,
        },
        "deps/rabbit/src/rabbit_quorum_queue.erl recover/2: on {error, name_not_registered} from "
        "ra:restart_server it starts the member with start_server(make_ra_conf(Q, ServerId)); make_ra_conf "
        "takes a fresh ra:new_uid/1 up to v4.2.2, the uid of the queue record's type state at v4.3.5, which "
        "then calls ra:trigger_election/1 (v3.10.8 .. v4.2.2 trigger none). Seen on 4.3.6 with names.dets "
        "removed: every quorum queue elected, its WAL entries skipped",
    ),
    "fifo_machine_version": (
        {"3.10": 2, "3.11": 3, "3.12": 3, "3.13.0": 3, "3.13.1+": 3, "4.0": 5, "4.1": 7, "4.2": 7, "4.3": 8},
        "deps/rabbit/src/rabbit_fifo.erl version/0: 2 at v3.10.0-v3.10.8, 3 at v3.11.0-v3.13.7, 5 at "
        "v4.0.5, 7 at v4.1.8 and v4.2.2, 8 at v4.3.5 (the machine version a queue's leader runs and writes "
        "into its log's noop entries)",
    ),
}

#: Settings every version shares (the writers and the layout readers use them): the RabbitMQ
#: defaults and where they are defined.
CONSTANTS = {
    "msg_store_file_size_limit": (16_777_216, "rabbit app env (deps/rabbit/Makefile), v3.10.0 - v4.3.x"),
    "queue_index_embed_msgs_below": (4096, "rabbit app env (deps/rabbit/Makefile), v3.10.0 - v4.3.x"),
    "classic_queue_index_v2_segment_entry_count": (
        4096,
        "rabbit_classic_queue_index_v2:segment_entry_count/0, v3.10.0 - v4.3.x",
    ),
    "vhost_restarts": (
        (2, 300),
        "rabbit_vhost_sup_wrapper:init/1 (v3.10.0 - v4.3.x): one_for_all over rabbit_vhost_sup "
        "(itself one_for_all, intensity 0: a crashed message store stops every process of the "
        "vhost) and rabbit_vhost_process (recovery), at most 2 restarts in 300 s; a third crash "
        "leaves the vhost down (rabbit_vhost_sup_sup: transient child, vhost_restart_strategy continue)",
    ),
    "queue_restarts": (
        (5, 10),
        "rabbit_amqqueue_sup:init/1 (v3.10.0 - v4.3.x): amqqueue_max_restart_intensity {5, 10}: a "
        "queue process crashing a 6th time within 10 s is left down",
    ),
    "queue_index_segment_entry_count": (
        2048,
        "CQv1: rabbit_vhost.erl writes it into the vhost's .config at creation (2048 for a "
        "vhost created on 3.8.17+, 16384 when queues already existed), v3.10.0 - v4.2.x",
    ),
}

#: Feature flags by the first release that defines them (flags declared with
#: -rabbit_feature_flag in deps/*/src at each tag from v3.10.0 to v4.3.1). An enabled flag in
#: ``<node>-feature_flags`` proves the node ran that version or a later one.
FEATURE_FLAG_SINCE = {
    "classic_queue_type_delivery_support": (3, 10, 9),
    "direct_exchange_routing_v2": (3, 11, 0),
    "feature_flags_v2": (3, 11, 0),
    "listener_records_in_ets": (3, 11, 0),
    "stream_single_active_consumer": (3, 11, 0),
    "tracking_records_in_ets": (3, 11, 0),
    "stream_sac_coordinator_unblock_group": (3, 11, 14),
    "delete_ra_cluster_mqtt_node": (3, 12, 0),
    "restart_streams": (3, 12, 0),
    "detailed_queues_endpoint": (3, 13, 0),
    "khepri_db": (3, 13, 0),
    "message_containers": (3, 13, 0),
    "mqtt_v5": (3, 13, 0),
    "stream_filtering": (3, 13, 0),
    "stream_update_config_command": (3, 13, 0),
    "quorum_queue_non_voters": (3, 13, 1),
    "message_containers_deaths_v2": (3, 13, 3),
    "rabbitmq_4.0.0": (4, 0, 0),
    "rabbitmq_4.1.0": (4, 1, 0),
    "rabbitmq_4.2.0": (4, 2, 0),
    "rabbitmq_4.3.0": (4, 3, 0),
    "track_qq_members_uids": (4, 3, 0),
    "tie_binding_to_dest_with_keep_while_cond": (4, 3, 0),
    "topic_binding_projection_v4": (4, 3, 0),
    "topic_binding_projection_v5": (4, 3, 1),
}

OLDEST = (3, 10, 0)
NEWEST = (4, 3, 999)  # any 4.3.x


def _fmt(v: tuple[int, int, int], high: bool) -> str:
    if high and v[2] == 999 or not high and v[2] == 0:
        return f"{v[0]}.{v[1]}"
    return f"{v[0]}.{v[1]}.{v[2]}"


@dataclass(frozen=True)
class VersionRange:
    """The versions (inclusive; patch 999: any patch of the series) that may have written the
    data, and the evidence that bounds them."""

    low: tuple[int, int, int] = OLDEST
    high: tuple[int, int, int] = NEWEST
    reasons: tuple[str, ...] = ()

    def contains(self, version: str) -> bool:
        m = _VERSION.match(version.strip())
        if not m:
            return False
        v = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
        return self.low <= v <= self.high

    @property
    def label(self) -> str:
        lo, hi = _fmt(self.low, False), _fmt(self.high, True)
        if self.low[:2] == self.high[:2] and self.high[2] == 999:
            return lo if self.low[2] == 0 else f"{lo} - {self.high[0]}.{self.high[1]}.x"
        return f"{lo} - {hi}"

    @property
    def newest(self) -> str:
        """The newest version of the range, as a model label: what the prediction uses."""
        return _fmt(self.high, True) if self.high[2] == 999 else _fmt(self.high, False)

    @property
    def model(self) -> BrokerModel:
        return model(self.newest)

    @property
    def oldest(self) -> str:
        """The oldest version of the range, as a model label."""
        return _fmt(self.low, False)

    @property
    def one_series(self) -> bool:
        """Whether every version of the range is one series of the version table (one model):
        a prediction for ``newest`` then holds for any of them; otherwise it is an assumption."""
        return model(self.oldest).series == self.model.series

    @property
    def why(self) -> str:
        return "; ".join(self.reasons) if self.reasons else "no version evidence in the data"

    def to_dict(self) -> dict:
        return {
            "low": _fmt(self.low, False),
            "high": _fmt(self.high, True),
            "label": self.label,
            "why": list(self.reasons),
            "one_series": self.one_series,
        }

    def __str__(self) -> str:
        return f"{self.label} ({self.why})"


#: rabbit_fifo machine version -> the RabbitMQ releases that run it (deps/rabbit/src/rabbit_fifo.erl
#: version/0 at every tag: 2 from v3.10.0, 3 from v3.11.0, 4 from v4.0.0, 5 from v4.0.3, 6 at v4.1.1,
#: 7 from v4.1.2, 8 from v4.3.0)
MACHINE_VERSION_RANGE = {
    2: ((3, 10, 0), (3, 10, 999)),
    3: ((3, 11, 0), (3, 13, 999)),
    4: ((4, 0, 0), (4, 0, 2)),
    5: ((4, 0, 3), (4, 1, 0)),
    6: ((4, 1, 1), (4, 1, 1)),
    7: ((4, 1, 2), (4, 2, 999)),
    8: ((4, 3, 0), (4, 3, 999)),
}


@dataclass
class Evidence:
    """Facts about the data that narrow down which version wrote it."""

    basic_message: bool = False  # <= 3.12 term shape
    mc: bool = False  # >= 3.13 term shape
    latin1_atoms: bool = False  # ATOM_EXT: OTP <= 25
    utf8_atoms: bool = False  # SMALL_ATOM_UTF8: OTP >= 26
    khepri: bool = False  # Khepri metadata (opt-in 3.13 - 4.1, default 4.2, only 4.3)
    mnesia: bool = False  # Mnesia metadata (schema.DAT): removed in 4.3
    redeliver_seq_id: bool = False  # recovery terms of 4.3+
    next_deliver_seq_id: bool = False  # recovery terms <= 4.2
    index_module: bool = False  # clean.dot of <= 3.13
    clean_dot_without_index_module: bool = False  # clean.dot of 4.0+
    v1_files: bool = False
    stream_msg_record: bool = False  # stream records converted by rabbit_msg_record (<= 3.12)
    stream_mc: bool = False  # stream records converted by mc_amqpl (3.13+)
    feature_flags: tuple[str, ...] = ()  # enabled flags listed in <node>-feature_flags
    fifo_machine_version: int | None = None  # the newest rabbit_fifo machine version a quorum log's noop names
    ra_wal_digits: int | None = None  # 8 (Ra < 2.16) or 16 (Ra 2.16+) digits in the quorum WAL's name
    ra_writers_snapshot: bool = False  # quorum/<node>/writers.snapshot: Ra 3 (4.3+)

    def constraints(self) -> list[tuple[tuple, tuple, str]]:
        """(low, high, reason) per piece of evidence, strongest first: files every stop
        rewrites before the stored terms (which may predate an upgrade)."""
        out = []
        known = [(FEATURE_FLAG_SINCE[f], f) for f in self.feature_flags if f in FEATURE_FLAG_SINCE]
        if known:
            since, flag = max(known)
            out.append((since, NEWEST, f"feature flag {flag} is enabled (defined from {_fmt(since, False)})"))
        if self.fifo_machine_version in MACHINE_VERSION_RANGE:
            lo, hi = MACHINE_VERSION_RANGE[self.fifo_machine_version]
            out.append(
                (
                    lo,
                    hi,
                    f"quorum queue logs run rabbit_fifo machine version {self.fifo_machine_version} "
                    f"({_fmt(lo, False)} - {_fmt(hi, True)}): each boot's leader writes its own",
                )
            )
        if self.ra_writers_snapshot:
            out.append(((4, 3, 0), NEWEST, "quorum WAL writers.snapshot (Ra 3: 4.3+)"))
        if self.ra_wal_digits == 16:
            out.append(((4, 1, 0), NEWEST, "16-digit quorum WAL name (Ra 2.16+: 4.1+)"))
        if self.ra_wal_digits == 8:
            out.append(
                (OLDEST, (4, 0, 999), "8-digit quorum WAL name (Ra before 2.16: up to 4.0; later ones rename it)")
            )
        if self.redeliver_seq_id:
            out.append(((4, 3, 0), NEWEST, "recovery terms carry redeliver_seq_id (4.3+)"))
        if self.next_deliver_seq_id:
            out.append((OLDEST, (4, 2, 999), "recovery terms carry next_deliver_seq_id (up to 4.2)"))
        if self.index_module:
            out.append((OLDEST, (3, 13, 999), "clean.dot records index_module (up to 3.13)"))
        if self.clean_dot_without_index_module:
            out.append(((4, 0, 0), NEWEST, "clean.dot without index_module (4.0+)"))
        if self.mnesia:
            out.append((OLDEST, (4, 2, 999), "Mnesia metadata store (removed in 4.3)"))
        if self.khepri:
            out.append(((3, 13, 0), NEWEST, "Khepri metadata store (khepri_db from 3.13; default from 4.2)"))
        if self.v1_files:
            out.append((OLDEST, (3, 13, 999), "CQv1 index files (4.0+ converts them at boot; 4.3 never reads them)"))
        if self.mc:
            out.append(((3, 13, 0), NEWEST, "stored messages are #mc (3.13+)"))
        if self.stream_mc and not self.stream_msg_record:
            out.append(
                ((3, 13, 0), NEWEST, "stream records of AMQP 0-9-1 publishes have a header section (mc_amqpl, 3.13+)")
            )
        if self.stream_msg_record and not self.stream_mc:
            out.append(
                (
                    OLDEST,
                    (3, 12, 999),
                    "stream records of AMQP 0-9-1 publishes carry the "
                    "x-basic-delivery-mode annotation (rabbit_msg_record, up to 3.12)",
                )
            )
        if self.basic_message and not self.mc:
            out.append((OLDEST, (3, 12, 999), "stored messages are #basic_message (up to 3.12)"))
        if self.latin1_atoms and not self.utf8_atoms:
            out.append((OLDEST, (3, 12, 999), "atoms written by OTP 25 or older (3.13+ requires OTP 26)"))
        if self.utf8_atoms:
            out.append(((3, 12, 0), NEWEST, "UTF-8 atoms: OTP 26+ (supported from 3.12)"))
        return out

    def range(self) -> VersionRange:
        """The narrowest range every piece of evidence allows; evidence contradicting the
        stronger pieces before it is left out, and said so."""
        low, high, reasons = OLDEST, NEWEST, []
        for lo, hi, why in self.constraints():
            nlo, nhi = max(low, lo), min(high, hi)
            if nlo > nhi:
                reasons.append(f"ignored, contradicts the above: {why}")
                continue
            low, high = nlo, nhi
            reasons.append(why)
        return VersionRange(low, high, tuple(reasons))

    def infer(self) -> tuple[BrokerModel, str]:
        """The version to predict for (the newest of the range), and why."""
        r = self.range()
        return r.model, f"written by {r.label}: {r.why}"


def stream_record_evidence(raw: bytes, ev: Evidence) -> None:
    """Which converter wrote a stream record of an AMQP 0-9-1 publish (it carries the
    ``x-exchange`` annotation): rabbit_msg_record:from_amqp091/2 (3.10 - 3.12) writes the
    delivery mode as the ``x-basic-delivery-mode`` annotation and no header section;
    mc_amqpl:convert_to(mc_amqp, ..) (3.13+) writes a header section (durable, priority)."""
    from cqforensics.base.errors import FormatError
    from cqforensics.codecs import amqp10

    try:
        secs = amqp10.sections(raw)
    except FormatError:
        return
    keys, header = set(), False
    for code, val, _, _ in secs:
        if code == amqp10.HEADER:
            header = True
        elif code == amqp10.MESSAGE_ANNOTATIONS and isinstance(val, dict):
            keys = {amqp10.plain(k) for k, _ in val.get("value") or []}
    if "x-exchange" not in keys:
        return
    if "x-basic-delivery-mode" in keys and not header:
        ev.stream_msg_record = True
    elif header:
        ev.stream_mc = True


def term_evidence(raw, ev: Evidence) -> None:
    """Look at the first bytes of a stored term: its record tag and atom encoding."""
    if len(raw) < 4 or raw[0] != 131 or raw[1] != 104:
        return
    tag, rest = raw[3], bytes(raw[4:24])
    if tag == 100:
        ev.latin1_atoms = True
        name = rest[2 : 2 + int.from_bytes(rest[:2], "big")]
    elif tag in (119, 115):
        ev.utf8_atoms = ev.utf8_atoms or tag == 119
        ev.latin1_atoms = ev.latin1_atoms or tag == 115
        name = rest[1 : 1 + rest[0]]
    else:
        return
    if name == b"basic_message":
        ev.basic_message = True
    elif name == b"mc":
        ev.mc = True
