"""Ra snapshots: ``snapshot.dat`` of ``<UId>/snapshots/<Term>_<Index>/`` (and of a checkpoint
or Ra 3's recovery checkpoint), and Ra 3's ``indexes`` beside it (grammar: ``grammar.ra``
``snapshot``/``snapshot_indexes``; spec: docs/formats/quorum.md "Snapshots").

``read_snapshot`` checks a file as ra_log_snapshot recover/1 (validate/1) does: magic, version,
CRC-32 over everything after the CRC, then the meta term; the machine state term is decoded only
on demand (``state``), it can be large. Damage is a status, never an exception.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from cqforensics.base.errors import FormatError
from cqforensics.codecs import etf
from cqforensics.grammar import ra as c_ra
from cqforensics.readers.files import map_file

#: the status of a snapshot file (``Snapshot.status``), in ra_log_snapshot's words
SNAP_OK = "ok"
SNAP_SHORT = "unexpected_eof"  # fewer bytes than the header: read_meta_internal/1 eof
SNAP_FORMAT = "invalid_format"  # no "RASN" magic
SNAP_VERSION = "invalid_version"
SNAP_CRC = "checksum_error"  # validate/2
SNAP_META = "bad_meta"  # the CRC holds but the meta is no term (binary_to_term crashes: never in practice)

#: ``<Term>_<Index>`` of a snapshot dir, both 16 upper-case hex digits (ra_lib:zpad_hex/1)
DIR_NAME = re.compile(r"([0-9A-F]{16})_([0-9A-F]{16})")


def dir_index_term(name: str) -> tuple[int, int] | None:
    """(index, term) a snapshot or checkpoint dir name says, or None."""
    m = DIR_NAME.fullmatch(name)
    return (int(m.group(2), 16), int(m.group(1), 16)) if m else None


@dataclass
class Snapshot:
    path: Path
    size: int
    status: str
    crc: int | None = None
    meta: dict | None = None  # #{index, term, cluster, machine_version}
    meta_offset: int | None = None
    state_offset: int | None = None  # where term_to_binary(MachineState) starts
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == SNAP_OK

    @property
    def index(self) -> int | None:
        return _int(self.meta, "index")

    @property
    def term(self) -> int | None:
        return _int(self.meta, "term")

    @property
    def machine_version(self) -> int | None:
        return _int(self.meta, "machine_version")

    def state(self, data=None):
        """The machine state term (decoded now; raises FormatError when it does not decode)."""
        if self.state_offset is None:
            raise FormatError("no machine state in this snapshot", str(self.path), 0)
        data = map_file(self.path) if data is None else data
        return etf.decode(data[self.state_offset :], exact=True)[0]


def _int(meta, key):
    v = meta.get(key) if isinstance(meta, dict) else None
    return v if isinstance(v, int) else None


def read_snapshot(path: Path, data=None) -> Snapshot:
    path = Path(path)
    data = map_file(path) if data is None else data
    size = len(data)
    if size < c_ra.SNAP_HEADER_SIZE:
        return Snapshot(path, size, SNAP_SHORT, detail=f"{size} bytes")
    if bytes(data[:4]) != c_ra.SNAP_MAGIC:
        return Snapshot(path, size, SNAP_FORMAT, detail=f"starts {bytes(data[:4]).hex()}")
    if data[4] != c_ra.SNAP_VERSION:
        return Snapshot(path, size, SNAP_VERSION, detail=f"version {data[4]}")
    crc = int.from_bytes(data[5:9], "big")
    meta_size = int.from_bytes(data[9:13], "big")
    snap = Snapshot(path, size, SNAP_OK, crc, meta_offset=13)
    if zlib.crc32(data[9:]) != crc:
        snap.status = SNAP_CRC
        snap.detail = "CRC-32 of the content differs from the header's"
    if 13 + meta_size > size:
        snap.status = SNAP_CRC if snap.status == SNAP_CRC else SNAP_META
        snap.detail = snap.detail or f"a meta of {meta_size} bytes runs past the end"
        return snap
    try:
        meta = etf.decode(data[13 : 13 + meta_size], exact=True)[0]
    except FormatError as e:
        if snap.status == SNAP_OK:
            snap.status, snap.detail = SNAP_META, f"meta: {e.message}"
        return snap
    snap.meta = meta if isinstance(meta, dict) else None
    snap.state_offset = 13 + meta_size
    return snap


@dataclass
class Indexes:
    """Ra 3's ``indexes`` file: the live raft indexes kept below a snapshot (ra_seq)."""

    path: Path
    status: str  # ok / checksum_error / invalid_version / invalid_format (ra_snapshot indexes/1)
    indexes: list[int] | None = None
    detail: str = ""


def read_indexes(path: Path, data=None) -> Indexes:
    """``indexes`` as ra_snapshot indexes/1 reads it; a file without the header is tried as a
    bare term (its backward-compatible clause)."""
    path = Path(path)
    data = bytes(map_file(path) if data is None else data)
    if data[:4] == c_ra.IDX_MAGIC and len(data) >= 9:
        if data[4] != c_ra.IDX_VERSION:
            return Indexes(path, "invalid_version", detail=f"version {data[4]}")
        if zlib.crc32(data[9:]) != int.from_bytes(data[5:9], "big"):
            return Indexes(path, "checksum_error")
        body = data[9:]
    else:
        body = data
    try:
        seq = etf.decode(body, exact=True)[0]
    except FormatError as e:
        return Indexes(path, "invalid_format", detail=e.message)
    try:
        return Indexes(path, "ok", expand_seq(seq))
    except (TypeError, ValueError) as e:
        return Indexes(path, "invalid_format", detail=str(e))


MAX_SEQ = 1 << 24  # live indexes expanded at most (a hostile range could claim 2^64)


def expand_seq(seq) -> list[int]:
    """A ra_seq (a list, highest first, of indexes and ``{Start, End}`` ranges; ra_seq.erl) as
    ascending indexes."""
    if not isinstance(seq, list):
        raise TypeError("a ra_seq is a list")
    out: list[int] = []
    for item in seq:
        if isinstance(item, int):
            out.append(item)
        elif isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, int) for x in item):
            a, b = item
            if b < a or b - a >= MAX_SEQ or len(out) + b - a >= MAX_SEQ:
                raise ValueError(f"range {a}..{b} is not a range ra_seq holds")
            out.extend(range(a, b + 1))
        else:
            raise TypeError("a ra_seq item is an index or {Start, End}")
        if len(out) > MAX_SEQ:
            raise ValueError("more live indexes than a snapshot keeps")
    return sorted(out)


def dump_rows(path: Path, segment_entry_count: int | None = None):
    """``dump`` of a snapshot.dat: its header, meta and state (one row each)."""
    data = map_file(path)
    snap = read_snapshot(path, data)
    yield {"offset": 0, "kind": "header", "status": snap.status + (f": {snap.detail}" if snap.detail else "")}, None
    if snap.meta is not None:
        yield (
            {
                "offset": snap.meta_offset,
                "kind": "meta",
                "term": etf.format_term(snap.meta),
                "raft_index": snap.index,
                "status": "ok",
            },
            None,
        )
    if snap.state_offset is not None:
        yield (
            {"offset": snap.state_offset, "kind": "state", "size": snap.size - snap.state_offset, "status": "ok"},
            (data, snap.state_offset, snap.size - snap.state_offset),
        )


__all__ = [
    "DIR_NAME",
    "Indexes",
    "SNAP_CRC",
    "SNAP_FORMAT",
    "SNAP_META",
    "SNAP_OK",
    "SNAP_SHORT",
    "SNAP_VERSION",
    "Snapshot",
    "dir_index_term",
    "dump_rows",
    "expand_seq",
    "read_indexes",
    "read_snapshot",
]
