"""Ra's on-disk formats (rabbitmq/ra): what a quorum queue (and Khepri) keeps under
``<node>/quorum/<node>/`` (``coordination/<node>/`` for Khepri).

Sources (tags: Ra v2.2.0 = RabbitMQ 3.10.8, v2.6.3 = 3.12.14, v2.13.5 = 3.13.7, v2.14.0 = 4.0.5,
v2.16.13 = 4.1.8, v2.17.1 = 4.2.2, v3.1.10 = 4.3.6; the layouts below are the same in all of
them unless said): WAL = src/ra_log_wal.erl, SEG = src/ra_log_segment.erl, SNAP =
src/ra_log_snapshot.erl, RSNAP = src/ra_snapshot.erl, DIR = src/ra_directory.erl, META =
src/ra_log_meta.erl, LOG = src/ra_log.erl, SEGS = src/ra_log_segments.erl (Ra 3). The byte-level
spec with its citations: docs/formats/quorum.md.
"""

from __future__ import annotations

import struct

from construct import (
    BitsInteger,
    BitStruct,
    Bytes,
    Const,
    Flag,
    GreedyBytes,
    If,
    Int8ub,
    Int16ub,
    Int32ub,
    Int64ub,
    Prefixed,
    Struct,
    this,
)

# -- write-ahead log ``<N>.wal`` (8 digits up to Ra 2.14, 16 from Ra 2.16: ra_lib zpad_upgrade) -----

WAL_MAGIC = b"RAWA"  # WAL ?MAGIC
WAL_VERSION = 1  # WAL ?CURRENT_VERSION
WAL_HEADER_SIZE = 5  # WAL ?HEADER_SIZE
WAL_RECOVERY_CHUNK = 33554432  # ra.hrl ?WAL_RECOVERY_CHUNK_SIZE: recovery reads the file in chunks of this
WAL_LAST_RECORD_PROBE = 13  # WAL is_last_record/2: a bad checksum is forgiven when fewer bytes follow, or 104 zero bits

wal_header = Struct(
    "magic" / Const(WAL_MAGIC),  # WAL make_tmp/1, open_at_first_record/1
    "version" / Const(WAL_VERSION, Int8ub),
)

#: the first 3 bytes of a record (WAL serialize_header/3)
wal_record_head = BitStruct(
    "truncate" / Flag,  # 1: a truncating write (a follower overwriting its log from here)
    "cached" / Flag,  # 0: the writer's UId follows (its first record in this file); 1: ``ref`` names it
    "ref" / BitsInteger(22),  # the writer's number in this file (WAL writer_name_cache)
)

wal_record = Struct(
    "head" / wal_record_head,
    "uid" / If(~this.head.cached, Prefixed(Int16ub, GreedyBytes)),  # <<IdDataLen:16, UId/binary>>
    "checksum" / Int32ub,  # erlang:adler32(<<Idx:64, Term:64, Data/binary>>); 0: not computed (WAL validate_checksum)
    "length" / Int32ub,  # byte_size(Data)
    "index" / Int64ub,  # raft index
    "term" / Int64ub,  # raft term
    "data" / Bytes(this.length),  # term_to_binary of the log entry (WAL to_binary/1; Ra 2.16+: {ttb, Bin} as given)
)

#: struct twin of the fixed part after the head (and the UId when not cached)
WAL_FIXED = struct.Struct(">IIQQ")
WAL_FIXED_SIZE = WAL_FIXED.size  # 24

# -- segment ``<N>.segment`` (SEG) ------------------------------------------------------------------

SEG_MAGIC = b"RASG"  # SEG ?MAGIC
SEG_VERSION = 2  # SEG ?VERSION; a header naming a version above it is refused (invalid_segment_format)
SEG_HEADER_SIZE = 8  # SEG ?HEADER_SIZE = 4 + 2 + 2
SEG_DEFAULT_MAX_COUNT = 4096  # ra.hrl ?SEGMENT_MAX_ENTRIES (the system's segment_max_entries)

seg_header = Struct(
    "magic" / Const(SEG_MAGIC),  # SEG write_header/2, read_header/1
    "version" / Int16ub,  # 2 written since Ra 1.x; 1 still read (32-bit offsets)
    "max_count" / Int16ub,  # index slots reserved after the header
)

#: index record of a version 2 segment (SEG ?INDEX_RECORD_SIZE_V2 = 32); all zeros ends the index
seg_index_v2 = Struct(
    "index" / Int64ub,
    "term" / Int64ub,
    "offset" / Int64ub,  # absolute file offset of the entry's data
    "length" / Int32ub,
    "crc" / Int32ub,  # erlang:crc32(Data); 0: not computed (SEG compute_checksum/validate_checksum)
)

#: index record of a version 1 segment (SEG ?INDEX_RECORD_SIZE_V1 = 28)
seg_index_v1 = Struct(
    "index" / Int64ub,
    "term" / Int64ub,
    "offset" / Int32ub,
    "length" / Int32ub,
    "crc" / Int32ub,
)

SEG_INDEX = {2: struct.Struct(">QQQII"), 1: struct.Struct(">QQIII")}  # struct twins, by version
SEG_INDEX_SIZE = {v: s.size for v, s in SEG_INDEX.items()}  # 32, 28

# -- snapshot ``snapshots/<Term:16 hex>_<Index:16 hex>/snapshot.dat`` (SNAP), also the
#    checkpoints (``checkpoints/``, Ra 2.14+) and Ra 3's ``recovery_checkpoint/`` -----------------

SNAP_MAGIC = b"RASN"  # SNAP ?MAGIC
SNAP_VERSION = 1  # SNAP ?VERSION
SNAP_HEADER_SIZE = 9 + 4  # SNAP read_meta_internal: magic, version, CRC, meta size

snapshot = Struct(
    "magic" / Const(SNAP_MAGIC),  # SNAP write/4
    "version" / Const(SNAP_VERSION, Int8ub),
    "crc" / Int32ub,  # erlang:crc32 of everything after it (meta size, meta, state)
    "meta" / Prefixed(Int32ub, GreedyBytes),  # term_to_binary(#{index, term, cluster, machine_version})
    "state" / GreedyBytes,  # term_to_binary(MachineState)
)

# -- Ra 3: ``indexes`` beside a snapshot's snapshot.dat (RSNAP write_indexes/2) --------------------

IDX_MAGIC = b"RASI"  # RSNAP ?IDX_MAGIC
IDX_VERSION = 1  # RSNAP ?IDX_VERSION

snapshot_indexes = Struct(
    "magic" / Const(IDX_MAGIC),
    "version" / Const(IDX_VERSION, Int8ub),
    "crc" / Int32ub,  # erlang:crc32 of the data
    "data" / GreedyBytes,  # term_to_binary(ra_seq): the live raft indexes below the snapshot
)

# -- small files -----------------------------------------------------------------------------------

#: ``<UId>/config``: the server's config map as text, ``io_lib:format("~p.", [Config])`` (LOG write_config/2)
CONFIG_NAME = "config"
#: ``names.dets``: DETS set of ``{ServerName :: atom(), UId :: binary()}`` (DIR init/2, register_name/6)
NAMES_DETS = "names.dets"
#: ``meta.dets``: DETS set of ``{UId, CurrentTerm, VotedFor, LastApplied}`` (META, update_key/3)
META_DETS = "meta.dets"
#: ``writers.snapshot`` (Ra 3): term_to_binary(#{UId => {in_seq, LastIdx}}) (WAL persist_writers/2)
WRITERS_SNAPSHOT = "writers.snapshot"
#: an empty file marking the 8- to 16-digit rename of WAL and segment files (Ra 2.16+, ra_log_segment_writer)
UPGRADE_MARKER = "segment_name_upgrade_marker"
#: Ra 3 compaction (SEGS major_compaction/recover_compaction): ``<N>.compaction_group``
#: (term_to_binary([Target | LinkTargets])), ``<N>.compacting`` (a segment being written), ``<N>.link``
#: (a symlink being made); a finished compaction leaves the linked segments as symlinks to the target
COMPACTION_SUFFIXES = (".compaction_group", ".compacting", ".link")
