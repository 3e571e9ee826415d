"""Erlang term files: disk_log logs (ets:tab2file output, Mnesia .DCD/.DCL/LATEST.LOG),
``recovery.dets`` (heuristic) and ``clean.dot``.

ets:tab2file: item 1 is the table info, then one item per object, then
``['$end_of_table', [{count, N}]]`` (OTP ets.erl tab2file; verified on the samples).
DETS v9 is not specified publicly; objects are found heuristically by their
``<<BlockSize:32, 16#12345678:32, TermSize:32, Term>>`` layout (rabbitmq-formats.md 1.1).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from cqforensics import etf, textfiles
from cqforensics.errors import FormatError
from cqforensics.grammar import disklog as c_disklog
from cqforensics.readers.files import read_bytes, read_optional

_ITEM_HEAD = c_disklog.ITEM_HEAD.unpack_from
DETS_ACTIVE = b"\x12\x34\x56\x78"


@dataclass
class TermLog:
    path: Path
    closed: bool | None  # header status: closed properly (None: no valid header)
    items: list = field(default_factory=list)  # decoded terms
    offsets: list[int] = field(default_factory=list)
    error: FormatError | None = None  # where decoding stopped early


def read_disk_log(path: Path, data: bytes | None = None) -> TermLog:
    """Items of a disk_log internal-format file; stops (with ``error``) at the first damage
    (a file that is not a regular file is never read: ``error`` says what it is)."""
    if data is None:
        try:
            data = read_bytes(path)
        except FormatError as e:  # NotRegularFile
            return TermLog(path, None, error=e)
    if data[:4] != c_disklog.FILE_MAGIC:
        return TermLog(path, None, error=FormatError("not a disk_log file", str(path), 0))
    log = TermLog(path, data[4:8] == c_disklog.CLOSED)
    o = c_disklog.HEADER_SIZE
    end = len(data)
    while o < end:
        if o + 8 > end:
            log.error = FormatError(f"log ends inside an item header ({end - o} bytes)", str(path), o)
            break
        length, magic = _ITEM_HEAD(data, o)
        if magic != c_disklog.ITEM_MAGIC:
            log.error = FormatError(f"bad item magic {magic.hex()}", str(path), o + 4)
            break
        start = o + 8 + (16 if length >= c_disklog.MIN_MD5_TERM else 0)
        if start + length > end:
            log.error = FormatError(f"item of {length} bytes runs past the end of the log", str(path), o)
            break
        try:
            term, _ = etf.decode(data, offset=start)
        except etf.EtfError as e:
            log.error = FormatError(f"undecodable item: {e.message}", str(path), e.offset)
            break
        log.items.append(term)
        log.offsets.append(o)
        o = start + length
    return log


@dataclass
class EtsTable:
    """An ets:tab2file dump: its objects and whether the end marker's count matched."""

    path: Path
    objects: list = field(default_factory=list)
    complete: bool = False
    error: FormatError | None = None


def read_ets(path: Path) -> EtsTable:
    log = read_disk_log(path)
    table = EtsTable(path, error=log.error)
    items = log.items[1:]  # item 0 is the table info
    if items and isinstance(items[-1], list) and items[-1] and items[-1][0] == "$end_of_table":
        counts = textfiles.proplist(items[-1][1]) if len(items[-1]) > 1 else {}
        items = items[:-1]
        table.complete = log.error is None and counts.get("count", len(items)) == len(items)
    for it in items:
        table.objects += it if isinstance(it, list) else [it]  # tab2file writes lists of objects
    return table


def read_dets_objects(path: Path) -> list:
    """Objects of a DETS file, found by the ACTIVE marker (heuristic, see module doc)."""
    data = read_bytes(path)
    out = []
    o = data.find(DETS_ACTIVE)
    while o >= 4:
        if o + 8 <= len(data):
            (term_size,) = struct.unpack_from(">I", data, o + 4)
            start = o + 8
            if 0 < term_size <= len(data) - start and data[start] == etf.VERSION:
                try:
                    term, _ = etf.decode(data[start:start + term_size])
                    out.append(term)
                except etf.EtfError:
                    pass
        o = data.find(DETS_ACTIVE, o + 4)
    return out


def recovery_terms(path: Path) -> dict[str, dict]:
    """recovery.dets: queue dir name -> recovery terms (present only after a clean stop; {}
    when absent or not a regular file)."""
    if not path.exists():
        return {}
    out = {}
    try:
        objects = read_dets_objects(path)
    except FormatError:  # NotRegularFile: reported by the layout, never read
        return {}
    for obj in objects:
        if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], list):
            try:
                name = bytes(obj[0]).decode("latin-1")
            except (TypeError, ValueError):
                continue
            out[name] = textfiles.proplist(obj[1]) if isinstance(obj[1], list) else {}
    return out


def clean_dot(path: Path) -> dict | None:
    """clean.dot terms ({client_refs, [...]}, {index_module, ...}); None when absent or unreadable."""
    try:
        raw = read_optional(path)
    except FormatError:  # NotRegularFile: reported by the layout, never read
        return None
    if raw is None:
        return None
    try:
        return textfiles.proplist(textfiles.consult(raw))
    except FormatError:
        return None


def dump_dets(path: Path, segment_entry_count: int | None = None):
    """The per-object listing of a DETS file (``dump``) as ``(row, None)`` pairs."""
    for obj in read_dets_objects(path):
        yield {"kind": "object", "term": etf.format_term(obj)}, None


def dump_disk_log(path: Path, segment_entry_count: int | None = None):
    """The per-item listing of a disk_log (``dump``) as ``(row, None)`` pairs."""
    log = read_disk_log(path)
    yield {"kind": "header", "closed_properly": log.closed}, None
    for off, item in zip(log.offsets, log.items):
        yield {"offset": off, "kind": "item", "term": etf.format_term(item)}, None
    if log.error:
        yield {"offset": log.error.offset, "kind": "error", "status": log.error.message}, None
