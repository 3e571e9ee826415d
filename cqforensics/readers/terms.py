"""Erlang term files: disk_log logs (ets:tab2file output, Mnesia .DCD/.DCL/LATEST.LOG),
``recovery.dets`` (heuristic) and ``clean.dot``.

ets:tab2file: item 1 is the table info, then one item per object, then
``['$end_of_table', [{count, N}]]`` (OTP ets.erl tab2file; verified on the samples).
DETS v9 is not specified publicly; objects are found heuristically by their
``<<BlockSize:32, 16#12345678:32, TermSize:32, Term>>`` layout (docs/formats/classic.md §1.1).
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cqforensics import compiled as core
from cqforensics.base.errors import FormatError, plural
from cqforensics.base.findings import Finding
from cqforensics.codecs import etf, textfiles
from cqforensics.grammar import disklog as c_disklog
from cqforensics.readers import dets, files
from cqforensics.readers.files import data_extents, map_file, read_bytes, read_optional

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
    decode_at = core.term_decoder_at()  # None: the reference decodes every item
    while o < end:
        if o + 8 > end:
            log.error = FormatError(f"log ends inside an item header ({plural(end - o, 'byte')})", str(path), o)
            break
        length, magic = _ITEM_HEAD(data, o)
        if magic != c_disklog.ITEM_MAGIC:
            log.error = FormatError(f"bad item magic {magic.hex()}", str(path), o + 4)
            break
        start = o + 8 + (16 if length >= c_disklog.MIN_MD5_TERM else 0)
        if start + length > end:
            log.error = FormatError(f"item of {plural(length, 'byte')} runs past the end of the log", str(path), o)
            break
        got = decode_at(data, start, start + length) if decode_at else None  # None: the reference's
        try:
            term, used = got if got is not None else etf.decode(data, offset=start)
        except etf.EtfError as e:
            log.error = FormatError(f"undecodable item: {e.message}", str(path), e.offset)
            break
        if used != start + length:  # disk_log wrote term_to_binary of the item: it fills the item
            log.error = FormatError(
                f"item of {plural(length, 'byte')} holds a term of {used - start}: damaged inside", str(path), used
            )
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


def read_ets(path: Path, log: TermLog | None = None) -> EtsTable:
    log = read_disk_log(path) if log is None else log
    table = EtsTable(path, error=log.error)
    items = log.items[1:]  # item 0 is the table info
    if items and isinstance(items[-1], list) and items[-1] and items[-1][0] == "$end_of_table":
        counts = textfiles.proplist(items[-1][1]) if len(items[-1]) > 1 else {}
        items = items[:-1]
        table.complete = log.error is None and counts.get("count", len(items)) == len(items)
    for it in items:
        table.objects += it if isinstance(it, list) else [it]  # tab2file writes lists of objects
    return table


#: a ``#msg_location{msg_id, ref_count, file, offset, total_size}`` record of a store's message
#: index (rabbit_msg_store.hrl) whose id is a 16-byte binary and whose fields are integers of 64
#: bits: every record of an undamaged ``msg_store_index.ets``
LOCATION = np.dtype(
    [("id", "V16"), ("ref_count", np.int64), ("file", np.int64), ("offset", np.int64), ("total", np.int64)]
)
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _location_row(term) -> tuple | None:
    """``term`` as a ``LOCATION`` row, when it is such a record (else None)."""
    if (
        type(term) is tuple
        and len(term) == 6
        and isinstance(term[0], etf.Atom)
        and term[0] == "msg_location"
        and type(term[1]) is bytes
        and len(term[1]) == 16
        and all(type(v) is int and _INT64[0] <= v <= _INT64[1] for v in term[2:])
    ):
        return term[1:]
    return None


@dataclass
class LogItems:
    """A disk_log's items as a strict walk finds them (``disk_log_walk``), decoded: the items that
    are ``LOCATION`` records as rows of columns (no Python object each: a store's index dump
    holds one item per stored message), kept here or handed to a sink as they come, and every
    other item as its term."""

    n: int  # items found
    offsets: dict[
        int, int
    ]  # item -> where its header starts: every item not a row, each one after such an item, the first two and the last
    n_rows: int  # items that are rows
    rows: np.ndarray | None  # LOCATION, in file order (None: handed to the walk's sink)
    row_items: np.ndarray | None  # int64: the item each row is
    terms: dict[int, object]  # item -> its term, for every other item
    error: FormatError | None = None  # where the walk stopped early
    md5_items: bool = False  # an item long enough to carry an md5 was met

    def __len__(self) -> int:
        return self.n

    def is_row(self, k: int) -> bool:
        return 0 <= k < self.n and k not in self.terms

    def term(self, k: int):
        """Item ``k``'s term (a row as the tuple its decode gives; rows kept)."""
        if k in self.terms:
            return self.terms[k]
        row = self.rows[int(np.searchsorted(self.row_items, k))]
        return (etf.Atom("msg_location"), row["id"].tobytes(), *(int(row[c]) for c in LOCATION.names[1:]))


def _rows(found: dict, at: np.ndarray) -> np.ndarray:
    out = np.empty(len(at), LOCATION)
    for name, col in zip(LOCATION.names, ("ids", "ref_counts", "files", "locations", "totals")):
        out[name] = found[col][at]
    return out


#: items a call of the compiled walk decodes at most (its columns about 3 MB)
WALK_ITEMS = 1 << 16


def disk_log_walk(data, path: Path = Path("-"), sink=None) -> LogItems:
    """The items of a disk_log's bytes, strictly: item after item from the header on, each term
    filling its item, stopping at the first that is not whole (as ``read_disk_log``). What
    ``ets:file2tab/1`` loads of a dump is ``file2tab_load``'s (``EtsDump``). ``sink``: called
    with each run of ``LOCATION`` rows (and their item numbers) as they are decoded, which are
    then not kept. The compiled core (``core.disk_log_items``) frames the items and decodes the
    rows, ``WALK_ITEMS`` at a time (the pages of a map behind it dropped); the reference
    (``disk_log_walk_reference``) decodes every item here. Both give the same."""
    if core.native() is None:
        out = disk_log_walk_reference(data, path)
        if sink is not None and out.n_rows:
            sink(out.rows, out.row_items)
            out.rows = out.row_items = None
        return out
    out = LogItems(0, {}, 0, None, None, {})
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    start = c_disklog.HEADER_SIZE
    while start is not None:
        found = core.disk_log_items(data, start, WALK_ITEMS)
        base = out.n
        offsets, decoded = found["offsets"], found["decoded"].astype(bool)
        keep = np.ones(len(offsets), bool)
        stopped = False
        for k in np.flatnonzero(~decoded).tolist():  # the table info, the end marker, anything else
            term = _item_term(data, int(found["starts"][k]), int(found["lengths"][k]), path)
            if isinstance(term, FormatError):  # the walk stops at it
                keep[k:] = False
                out.error, stopped = term, True
                # the items the core walked past it are not read: only those up to it count
                found["md5_items"] = bool((found["lengths"][: k + 1] >= c_disklog.MIN_MD5_TERM).any())
                break
            row = _location_row(term)
            if row is None:
                out.terms[base + k] = term
            else:  # a record in an encoding the core leaves to the reference
                decoded[k] = True
                (
                    found["ids"][k],
                    found["ref_counts"][k],
                    found["files"][k],
                    found["locations"][k],
                    found["totals"][k],
                ) = row
        at = np.flatnonzero(decoded & keep)
        items = base + at
        offsets = offsets[keep]
        if len(offsets):  # the offsets an answer may name: the first two, the last, those by other items
            named = {0, 1, base + len(offsets) - 1} | {j for k in out.terms for j in (k, k + 1)}
            out.offsets.update((j, int(offsets[j - base])) for j in named if base <= j < base + len(offsets))
        out.n += len(offsets)
        if len(at):
            rows = _rows(found, at)
            out.n_rows += len(rows)
            if sink is not None:
                sink(rows, items.astype(np.int64))
            else:
                kept.append((rows, items.astype(np.int64)))
        out.md5_items |= bool(found["md5_items"])
        if stopped:
            break
        if found["stop"] is not None:
            out.error = _stop_error(data, *found["stop"], path)
        start = found["next"]
        if start is not None and isinstance(data, mmap.mmap):
            data.madvise(mmap.MADV_DONTNEED, 0, start - start % mmap.PAGESIZE)  # pages behind the walk
    named = {0, 1, out.n - 1} | {j for k in out.terms for j in (k, k + 1)}
    out.offsets = {k: o for k, o in out.offsets.items() if k in named}
    if sink is None:
        out.rows = np.concatenate([r for r, _ in kept]) if kept else np.zeros(0, LOCATION)
        out.row_items = np.concatenate([i for _, i in kept]) if kept else np.zeros(0, np.int64)
    return out


def _stop_error(data, code: int, at: int, path: Path) -> FormatError:
    """The strict walk's framing stop as ``read_disk_log`` words it."""
    if code == 1:
        return FormatError(f"log ends inside an item header ({plural(len(data) - at, 'byte')})", str(path), at)
    if code == 2:
        return FormatError(f"bad item magic {bytes(data[at : at + 4]).hex()}", str(path), at)
    (length,) = struct.unpack_from(">I", data, at)
    return FormatError(f"item of {plural(length, 'byte')} runs past the end of the log", str(path), at)


def _item_term(data, start: int, length: int, path: Path):
    """The term of the item at ``start``, or the FormatError that stops a strict walk: the term
    must fill the item (as ``read_disk_log``)."""
    got = core.decode_term_at(data, start, start + length)  # None: the reference decodes it
    try:
        term, used = got if got is not None else etf.decode(data, offset=start)
    except etf.EtfError as e:
        return FormatError(f"undecodable item: {e.message}", str(path), e.offset)
    if used != start + length:  # disk_log wrote term_to_binary of the item: it fills the item
        return FormatError(
            f"item of {plural(length, 'byte')} holds a term of {used - start}: damaged inside", str(path), used
        )
    return term


def disk_log_walk_reference(data, path: Path = Path("-")) -> LogItems:
    """``disk_log_walk`` in Python, the specification the core is tested against (as
    ``read_disk_log``)."""
    offsets, terms, error, md5_items = [], [], None, False
    o, end = c_disklog.HEADER_SIZE, len(data)
    if data[:4] == c_disklog.FILE_MAGIC:
        while o < end:
            if o + 8 > end:
                error = _stop_error(data, 1, o, path)
                break
            length, magic = _ITEM_HEAD(data, o)
            if magic != c_disklog.ITEM_MAGIC:
                error = _stop_error(data, 2, o + 4, path)
                break
            start = o + 8
            if length >= c_disklog.MIN_MD5_TERM:
                md5_items = True
                start += 16
            if start + length > end:
                error = _stop_error(data, 3, o, path)
                break
            term = _item_term(data, start, length, path)
            if isinstance(term, FormatError):
                error = term
                break
            offsets.append(o)
            terms.append(term)
            o = start + length
    rows = [(k, r) for k, r in ((k, _location_row(t)) for k, t in enumerate(terms)) if r is not None]
    out = np.zeros(len(rows), LOCATION)
    for j, (_, r) in enumerate(rows):
        out[j] = r
    odd = {k: t for k, t in enumerate(terms) if _location_row(t) is None}
    named = {0, 1, len(offsets) - 1} | set(odd) | {k + 1 for k in odd}
    return LogItems(
        len(offsets),
        {k: offsets[k] for k in sorted(named) if 0 <= k < len(offsets)},
        len(rows),
        out,
        np.array([k for k, _ in rows], np.int64),
        odd,
        error,
        md5_items,
    )


def _is_end(item) -> bool:
    return isinstance(item, list) and bool(item) and item[0] == "$end_of_table"


# -- what ets:file2tab/1 loads -----------------------------------------------------------------------


#: ``file2tab_load``: OTP's file2tab raises (ets:insert of an object that is no tuple of two
#: elements or more, e.g. a term cut to ``{}`` by zeroed bytes; a table info ets:new or
#: create_tab refuses with an exception): the message store's init crashes, the vhost does not start
RAISES = type("File2tabRaises", (), {"__repr__": lambda self: "RAISES"})()


def file2tab_objects(path: Path) -> list | None:
    """The objects ``ets:file2tab/1`` loads from an ``ets:tab2file`` dump, as the broker calls it
    (rabbit_msg_store index_recover / recover_file_summary: no ``verify``); None when file2tab
    returns an error (the store then rebuilds its index from the files), ``RAISES`` when it
    raises. ``file2tab_load`` says how; it is checked against OTP 25, 27 and 29's own file2tab
    on thousands of damaged dumps (tests/real_brokers/test_recovery_state_brokers.py). A read decodes a dump
    once (``read_ets_dump``, ``TermFiles``): ``EtsDump.file2tab`` and ``EtsDump.locations``
    give the same without reading it again, the latter without a Python object per record."""
    return read_ets_dump(path).file2tab()


def file2tab_load(data: bytes) -> list | None:
    """``ets:file2tab/1`` without ``verify`` on the bytes of a dump (OTP lib/stdlib/src/ets.erl
    file2tab/2, load_table/3; lib/kernel/src/disk_log.erl chunk/3, ichunk_end; disk_log_1.erl
    chunk_read_only, handle_chunk_ro; the same in OTP 25 to 29). The log is opened read-only
    (its header must be a disk_log's, closed or not). The table info is the first chunk of one
    item: a tuple with the 6 mandatory keys whose values ``ets:new`` accepts, else ``badfile``
    (None). Then chunks of up to 100 items, each read from a 64 KiB buffer: an item header
    whose magic is wrong is skipped a byte at a time, and every byte skipped counts against the
    100; an item of 65528 bytes and more with a wrong md5 is skipped with 17 bytes more; an item
    cut by the end of the file ends the chunk. A chunk's items are decoded in order: at the first
    one ``binary_to_term`` refuses, the chunk ends with the ones before it, and the next chunk
    starts at the end of the 64 KiB buffer minus the bytes of the items after it (wherever that
    falls, as OTP computes it). Loading stops at the first chunk that yields no object: a chunk
    that begins with a bad item, with more than 100 bytes to skip, or at a cut item, ends the
    table there. ``RAISES`` where file2tab raises instead (an object ets:insert refuses, a
    table info create_tab cannot take apart). (A header of the md5 size cut within its first 17
    bytes at the end of the file makes OTP read the same bytes forever; taken as the table ending
    there.) ``EtsDump`` takes a whole dump's objects from its strict walk (``loads_whole``),
    which this gives too (tests/model/test_store_crash.py)."""
    import hashlib

    head = c_disklog.HEADER_SIZE
    if len(data) < head or data[:4] != c_disklog.FILE_MAGIC or data[4:8] not in (c_disklog.CLOSED, c_disklog.OPENED):
        return None
    body = memoryview(data)[head:]
    item_head, big, old = c_disklog.ITEM_HEAD, c_disklog.ITEM_MAGIC, c_disklog.OLD_ITEM_MAGIC
    min_md5, max_chunk = c_disklog.MIN_MD5_TERM, c_disklog.MAX_CHUNK_SIZE

    def handle(buf, pos: int, n: int):
        """disk_log_1:handle_chunk_ro: ((next pos, leftover buffer or bytes to read), item
        binaries, bad bytes); ``pos``: the file position just after ``buf``."""
        i, items, bad, end = 0, [], 0, len(buf)
        while True:
            rem = end - i
            if n == 0 and rem >= head:
                return (pos, buf[i:]), items, bad
            if rem < head:
                return (pos - rem, None), items, bad
            size, magic = item_head.unpack_from(buf, i)
            if magic == big and size < min_md5 or magic == old:
                if rem - head >= size:
                    items.append(buf[i + head : i + head + size])
                    i, n = i + head + size, n - 1
                    continue
                return (pos - rem, size + head), items, bad
            if magic == big:
                good = bytes(buf[i + head : i + head + 16]) == hashlib.md5(bytes(buf[i : i + 4])).digest()
                if good and rem == head + 16 + size:
                    return (pos, None), items + [buf[i + head + 16 :]], bad
                if good:  # read again from its header, exactly its size (always more than 64 KiB)
                    return (pos - rem, size + head + 16), items, bad
                if rem - head >= 17:
                    i, n, bad = i + head + 17, n - 1, bad + 1
                    continue
                return (pos - rem, None), items, bad
            i, n, bad = i + 1, n - 1, bad + 1

    def chunk(pos: int, more, n: int):
        """disk_log:chunk(Log, Cont, N) in read-only mode: (continuation, terms) or None (eof)."""
        seen = set()
        while True:  # disk_log_1:do_chunk_read_only / do_handle_chunk_ro
            if isinstance(more, memoryview):
                r = handle(more, pos, n)
            else:
                if pos >= len(body):
                    return None
                buf = body[pos : pos + (max_chunk if more is None else max(more, max_chunk))]
                if len(buf) < head or more is not None and len(buf) < more:
                    return (pos + len(buf), None), []  # cut short: bad bytes, no item
                r = handle(buf, pos + len(buf), n)
            (pos, more), items, bad = r
            if items or bad:
                break
            key = (pos, more if not isinstance(more, memoryview) else len(more))
            if key in seen:  # OTP would read the same bytes forever
                return (pos, None), []
            seen.add(key)
        terms = []
        for k, raw in enumerate(items):  # disk_log:ichunk_end / ichunk_bad_end (read_only)
            try:
                terms.append(etf.decode(raw)[0])
            except etf.EtfError:
                return (pos - sum(len(b) + head for b in items[k + 1 :]), None), terms
        return (pos, more), terms

    first = chunk(0, None, 1)  # ets get_header_data: the table info
    if first is None or len(first[1]) != 1:
        return None
    info = _table_info(first[1][0])
    if not isinstance(info, int):
        return info
    cont, out = first[0], []
    while True:  # ets load_table: until a chunk yields nothing
        got = chunk(cont[0], cont[1], 100)
        if got is None or not got[1]:
            break
        cont, terms = got
        last = terms[-1]  # scan_for_endinfo: the end marker only as a chunk's last item
        if _file2tab_end(last):
            terms = terms[:-1]
        if any(not isinstance(t, tuple) or len(t) < info for t in terms):  # ets:insert raises
            return RAISES
        out += terms
    return out


def _file2tab_end(term) -> bool:
    """ets scan_for_endinfo: the end marker file2tab drops (the last item of a chunk)."""
    return isinstance(term, list) and len(term) == 2 and term[0] == "$end_of_table"


def _table_info(info):
    """ets get_header_data (no verify) and create_tab on the table info: its key position when
    the tuple names the 6 mandatory keys (name, type, protection, named_table, keypos, size,
    counted as 2-tuples) and ``ets:new`` accepts what they say; None (``badfile``,
    ``cannot_create_table``) or ``RAISES`` (a ``lists:keyfind`` match that fails) otherwise."""
    if not isinstance(info, tuple):
        return None
    mandatory = ("name", "type", "protection", "named_table", "keypos", "size")
    if sum(1 for t in info if isinstance(t, tuple) and len(t) == 2 and t[0] in mandatory) != 6:
        return None
    got = {}
    for t in info:  # lists:keyfind: the first tuple of each key
        if isinstance(t, tuple) and t and isinstance(t[0], str):
            got.setdefault(t[0], t)
    if (
        any(len(got.get(k, ())) != 2 for k in ("name", "type", "protection", "keypos", "size"))
        or got["named_table"][1:] not in (("true",), ("false",))
        or "compressed" in got
        and got["compressed"][1:] not in (("true",), ("false",))
    ):
        return RAISES  # {Key, V} = lists:keyfind(...) or a case with no clause for it
    got = {k: t[1] for k, t in got.items() if len(t) == 2}
    keypos, absent = got.get("keypos"), object()
    accepted = (
        isinstance(got.get("name"), etf.Atom)
        and got.get("type") in ("set", "ordered_set", "bag", "duplicate_bag")
        and got.get("protection") in ("public", "protected", "private")
        and isinstance(keypos, int)
        and not isinstance(keypos, bool)
        and keypos >= 1
        and got.get("write_concurrency", absent) in ("true", "false", "auto", absent)
        and got.get("read_concurrency", absent) in ("true", "false", absent)
    )
    return keypos if accepted else None


def loads_whole(status: bytes | None, items: LogItems) -> bool:
    """Whether ``ets:file2tab`` loads exactly every object of a dump's strict walk (``items``),
    as ``file2tab_load`` would find: a disk_log header closed or open; a walk that reaches the
    end of the file without damage and meets no item long enough to carry an md5 (so none is
    skipped, none fails ``binary_to_term``, every chunk is whole); a table info ``_table_info``
    accepts; an end marker, if any, only as the last item (file2tab drops it as the last of the
    last chunk); and every other item a tuple of at least the key position's elements (none
    ets:insert refuses). An undamaged dump, the common case, so decided on its columns and its
    few other items; any other dump is loaded by ``file2tab_load``."""
    if (
        status not in (c_disklog.CLOSED, c_disklog.OPENED)
        or items.error is not None
        or items.md5_items
        or not items.n
        or items.is_row(0)
    ):
        return False
    keypos = _table_info(items.terms[0])
    if not isinstance(keypos, int) or items.n_rows and keypos > 6:  # a row is a tuple of 6
        return False
    last = items.n - 1
    return all(
        isinstance(t, tuple) and len(t) >= keypos
        for k, t in items.terms.items()
        if k != 0 and not (k == last and _file2tab_end(t))
    )


@dataclass
class RecordedLocations:
    """The ``#msg_location{}`` records of a dump's objects, in order: those that are ``LOCATION``
    rows as columns, and any other (a key that is no 16-byte binary, a field that is no integer
    of 64 bits) as ``(position among all records, key, (ref_count, file, offset, total))``."""

    rows: np.ndarray  # LOCATION
    row_positions: np.ndarray  # int64: each row's position among all records
    others: list[tuple[int, object, tuple]]

    def __len__(self) -> int:
        return len(self.rows) + len(self.others)


def _locations_of(objects) -> RecordedLocations:
    """``RecordedLocations`` of objects as Python terms (a damaged dump's)."""
    rows, positions, others = [], [], []
    for o in objects:
        if not (isinstance(o, tuple) and len(o) == 6 and o[0] == "msg_location"):
            continue
        r = _location_row(o)
        if r is None:
            others.append((len(rows) + len(others), o[1], tuple(o[2:])))
        else:
            positions.append(len(rows) + len(others))
            rows.append(r)
    out = np.zeros(len(rows), LOCATION)
    for j, r in enumerate(rows):
        out[j] = r
    return RecordedLocations(out, np.array(positions, np.int64), others)


#: ``EtsDump.loaded`` of a dump ``loads_whole``: every object of its strict walk
WHOLE = type("File2tabLoadsWhole", (), {"__repr__": lambda self: "WHOLE"})()


@dataclass
class EtsDump:
    """An ``ets:tab2file`` dump (``msg_store_index.ets``, ``file_summary.ets``), decoded once: its
    items as a strict read finds them (``items``: what the file says, up to any damage), and
    what ``ets:file2tab/1`` loads of it for the broker (``loaded``): ``WHOLE`` when that is
    every object of the strict walk (``loads_whole``: an undamaged dump, whose records then
    stay columns), else ``file2tab_load``'s answer (its objects, None or ``RAISES``)."""

    path: Path
    status: bytes | None  # the header's status word (None: no disk_log header)
    items: LogItems
    loaded: object  # WHOLE, or file2tab_load's list of objects, None or RAISES
    unreadable: FormatError | None = None  # the file could not be read (not a regular file, ...)

    @property
    def closed(self) -> bool | None:
        return None if self.status is None else self.status == c_disklog.CLOSED

    @property
    def error(self) -> FormatError | None:
        return self.items.error

    def end_marker(self):
        """The last item when it is the ``'$end_of_table'`` marker (strict walk), else None."""
        n = len(self.items)
        last = self.items.terms.get(n - 1) if n > 1 else None
        return last if _is_end(last) else None

    @property
    def complete(self) -> bool:
        """The strict walk met no damage and the end marker's count is the objects' (as ``read_ets``)."""
        end = self.end_marker()
        if end is None:
            return False
        counts = textfiles.proplist(end[1]) if len(end) > 1 else {}
        return self.items.error is None and counts.get("count", len(self.items) - 2) == len(self.items) - 2

    def _object_items(self) -> np.ndarray:
        """The items that hold the table's objects strictly: every item after the table info but
        a last end marker (``read_ets``)."""
        n = len(self.items)
        return np.arange(1, max(1, n - (self.end_marker() is not None)), dtype=np.int64)

    def load_outcome(self):
        """What ``ets:file2tab`` does with the dump, without building its objects: True when it
        loads the table, None when it returns an error, ``RAISES`` when it raises."""
        return True if self.loaded is WHOLE or isinstance(self.loaded, list) else self.loaded

    def loads(self) -> bool:
        """Whether ``ets:file2tab`` loads the dump (``load_outcome``)."""
        return self.load_outcome() is True

    def rows_are_records(self) -> bool:
        """Whether the strict walk's ``LOCATION`` rows are exactly the table's objects (no other
        object, no row outside them): so in an undamaged store index, whose records can then be
        taken from the rows alone (those a sink was handed, too)."""
        ks = self._object_items()
        return self.items.n_rows == len(ks) and not np.isin(ks, list(self.items.terms)).any()

    def _objects_of(self, items: LogItems, ks: np.ndarray):
        """(item, object) of the objects items ``ks`` hold (an item is one object, or a list of them)."""
        for k in ks.tolist():
            t = items.term(k)
            for o in t if isinstance(t, list) else [t]:
                yield k, o

    def objects(self) -> list:
        """Every object the strict walk finds, as Python terms (for small dumps; ``locations``
        for a store's index)."""
        return [o for _, o in self._objects_of(self.items, self._object_items())]

    def file2tab(self) -> list | None:
        """What ``ets:file2tab`` loads (``file2tab_load``): its objects as Python terms, None or
        ``RAISES`` (for small dumps; ``locations`` for a store's index)."""
        return self.objects() if self.loaded is WHOLE else self.loaded

    def locations(self, loaded: bool = False) -> RecordedLocations | None:
        """The dump's ``#msg_location{}`` records (``RecordedLocations``): strictly, or as
        file2tab loads them (``loaded``; None when it fails or raises). A whole dump's
        (``loads_whole``) are the strict walk's, columns without a Python object per record
        when its rows are its records. Needs the rows kept (no sink)."""
        if loaded and self.loaded is not WHOLE:
            return _locations_of(self.loaded) if isinstance(self.loaded, list) else None
        ks = self._object_items()
        if self.rows_are_records():  # no Python object per record
            return RecordedLocations(self.items.rows, np.arange(len(ks), dtype=np.int64), [])
        return _locations_of(o for _, o in self._objects_of(self.items, ks))


def read_ets_dump(path: Path, sink=None) -> EtsDump:
    """An ets dump decoded once (``EtsDump``): the strict walk, and ``file2tab_load`` when
    file2tab does not load exactly the walk's objects (``loads_whole``). ``sink``: called with
    the ``LOCATION`` rows, ``(rows, items)`` a run at a time as they are decoded, which are then
    not kept (``items.rows`` is None): so when they are exactly the dump's records both ways
    (``rows_are_records`` of a dump ``loads_whole``, an undamaged index); otherwise (damage) the
    rows are kept after all (the file is walked again) and the caller drops what its sink was
    handed. A file that cannot be read has no items, and file2tab does not load it."""
    try:
        data = map_file(path)
    except FormatError as e:  # NotRegularFile, unreadable: never read
        none = LogItems(0, {}, 0, np.zeros(0, LOCATION), np.zeros(0, np.int64), {}, e)
        return EtsDump(path, None, none, None, e)
    try:
        status = bytes(data[4:8]) if data[:4] == c_disklog.FILE_MAGIC else None
        items = disk_log_walk(data, path, sink)
        if status is None:
            items.error = FormatError("not a disk_log file", str(path), 0)
        whole = loads_whole(status, items)
        dump = EtsDump(path, status, items, WHOLE if whole else file2tab_load(bytes(data)))
        if items.rows is None and not (whole and dump.rows_are_records()):
            dump.items = disk_log_walk(data, path)
            if status is None:
                dump.items.error = items.error
        return dump
    finally:
        if isinstance(data, mmap.mmap):
            data.close()


class TermFiles:
    """The term files of one read (a vhost's ``recovery.dets``, its stores' ``clean.dot`` and ets
    dumps), each decoded once however many parts of the model and the checks ask: made per read
    (``model.vhost.VhostScan.term_files``) and dropped with it, so a file changed between reads
    is read afresh."""

    def __init__(self):
        self._memo: dict = {}
        #: path -> the sink its dump's rows go to (``read_ets_dump``), set before it is read, and
        #: whatever the sink keeps them in (the caller's)
        self.sinks: dict = {}
        self.spills: dict = {}

    def _get(self, key, make):
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def recovery_terms(self, path: Path) -> dict[str, dict]:
        return self._get(("recovery", path), lambda: recovery_terms(path))

    def clean_dot(self, path: Path) -> dict | None:
        return self._get(("clean.dot", path), lambda: clean_dot(path))

    def ets(self, path: Path) -> EtsDump:
        """``read_ets_dump`` of ``path``, its rows handed to ``sinks[path]`` when there is one."""
        return self._get(("ets", path), lambda: read_ets_dump(path, self.sinks.get(path)))

    def file_summary(self, path: Path) -> dict[int, tuple]:
        return self._get(("file_summary", path), lambda: file_summary_records(path, self.ets(path)))


def read_dets_objects(path: Path, data=None, end: int | None = None) -> list:
    """Objects of a DETS file, found by the ACTIVE marker (heuristic, see module doc); the file
    is mapped, never read whole into memory. ``end``: look no further (the free lists)."""
    return [term for _, term in _dets_objects(map_file(path) if data is None else data, end)]


def read_dets_objects_at(path: Path) -> list[tuple[int, object]]:
    """(offset, object) of each object of a DETS file (as ``read_dets_objects``)."""
    return list(_dets_objects(map_file(path)))


def _dets_objects(data, end: int | None = None, extents=None):
    """(offset, term) of each object found by the ACTIVE marker before ``end``; ``extents``
    (``files.data_extents``): search only those ranges (a sparse file's holes hold no object).
    The header's type says how a block holds its objects (a bag's are grouped by key)."""
    stop = len(data) if end is None else min(end, len(data))
    bag = _dets_is_bag(data)
    if extents is not None:
        for a, b in extents:
            if a < stop:
                yield from _dets_objects_in(data, max(0, a - 4), min(b, stop), bag)
        return
    yield from _dets_objects_in(data, 0, stop, bag)


def _dets_is_bag(data) -> bool:
    """Whether the header (when it is a DETS v9 one) names a bag or duplicate_bag: their blocks
    hold ``<<KeySize:32, (ObjSize:32, Term)*>>`` per key, a set's ``(ObjSize:32, Term)*``
    (dets_v9 bin2objs / per_key)."""
    if len(data) < 20:
        return False
    _, cookie, _, kind, version = DETS_HEADER.unpack_from(data, 0)
    return cookie == DETS_COOKIE and version == DETS_VERSION and kind in (DETS_BAG, DETS_DUPLICATE_BAG)


def _dets_terms(data, pos: int, stop: int, block_end: int):
    """(offset, term, next offset) of the ``<<ObjSize:32, Term>>`` objects from ``pos`` (each
    ObjSize counting itself) that fit before ``stop`` and decode, up to the first one ending at
    or past ``block_end``."""
    decode_at = core.term_decoder_at()  # None: the reference decodes every object
    while pos + 4 <= stop:
        (obj_size,) = struct.unpack_from(">I", data, pos)
        start = pos + 4
        if not (4 < obj_size <= stop - pos and data[start] == etf.VERSION):
            return
        got = decode_at(data, start, pos + obj_size) if decode_at else None  # None: the reference's
        try:
            term = got[0] if got is not None else etf.decode(data[start : pos + obj_size])[0]
        except etf.EtfError:
            return
        yield pos, term, pos + obj_size
        pos += obj_size
        if pos >= block_end:
            return


def _dets_objects_in(data, begin: int, stop: int, bag: bool = False):
    o = files.find(data, DETS_ACTIVE, begin, stop)
    while o >= 4:
        # a slot's block holds every object whose key hashes to it: <<Size, ACTIVE, Objects>>
        (block,) = struct.unpack_from(">I", data, o - 4)
        block_end = o - 4 + block if 8 < block <= len(data) - (o - 4) else o + 8
        pos = o + 4
        if bag:  # per key: <<KeySize:32 (counting itself), Objects>>
            while pos + 4 <= block_end:
                (group,) = struct.unpack_from(">I", data, pos)
                if not 9 <= group <= block_end - pos:
                    break
                for at, term, _ in _dets_terms(data, pos + 4, pos + group, pos + group):
                    yield at, term
                pos += group
        else:
            for at, term, end in _dets_terms(data, pos, len(data), block_end):
                yield at, term
                pos = end
        o = files.find(data, DETS_ACTIVE, max(o + 4, pos), stop)


#: DETS v9 file layout (OTP dets_v9.erl): the header words, the free-list blocks written at
#: close (``<<Size:32, ?FREELIST_MAGIC:32, ...>>`` from the free-list pointer on, the last one
#: ``<<12:32, ?FREELIST_MAGIC:32, 12345:32>>`` and one more word), each checked on the samples
DETS_COOKIE = 0x00ABCDEF
DETS_VERSION = 9
DETS_SET, DETS_BAG, DETS_DUPLICATE_BAG = dets.SET, dets.BAG, dets.DUPLICATE_BAG  # the header's type codes
DETS_FREELIST_MAGIC = 0x03ABCDEF
DETS_END_WORD = 12345
DETS_HEADER = struct.Struct(">IIIII")  # free-list pointer, cookie, closed properly, type, version
DETS_COUNTS = struct.Struct(">II")  # at 32: objects, keys
DETS_MAX_FREE_BLOCKS = 1 << 20


def _damaged(message: str, path: Path, offset: int | None, **details) -> Finding:
    return Finding("term-file-damaged", message, str(path), offset, details=details)


def dets_findings(path: Path, data=None) -> list[Finding]:
    """``term-file-damaged`` for a DETS table (``recovery.dets``, ``schema.DAT``, Ra's
    ``meta.dets``/``names.dets``, MQTT's retained-message tables): the file's ends and object
    count (``_dets_ends``), then its structure as OTP reads it (``readers.dets``: header and
    MD5, part, segment and slot pointers, object blocks, free lists)."""
    data = map_file(path) if data is None else data
    out = _dets_ends(path, data)
    if len(data) >= 40 and not any(f.offset == 4 or "shorter than its header" in f.message for f in out):
        seen = {f.offset for f in out}
        out += [f for f in dets.structure_findings(path, data) if f.offset not in seen]
        words = {f.offset & ~3 for f in out if f.offset is not None}  # a header word already named
        out += [f for f in dets_shape_findings(path, data) if f.offset & ~3 not in words]
    return out


def _is_text(v) -> bool:
    return isinstance(v, (bytes, list))  # a file name: a binary or a charlist


_PLAIN_ATOM = re.compile(r"[a-z][a-z0-9_]*")


def _proplist(terms: list) -> bool:
    """Recovery terms: {Key, Value} pairs whose keys are the broker's plain lower-case atoms."""
    return all(
        isinstance(t, tuple) and len(t) == 2 and isinstance(t[0], etf.Atom) and _PLAIN_ATOM.fullmatch(str(t[0]))
        for t in terms
    )


#: the broker's DETS tables, by file name: the type and keypos its writer opens it with (a file of
#: another type or keypos makes that dets:open_file fail, {type_mismatch, F} / {keypos_mismatch, F},
#: empty or not: OTP dets.erl fopen_existing_file) and the record every object is (each checked on
#: every sample): rabbit_recovery_terms {DirBaseName, Terms}; Mnesia's schema {schema, Tab, Cs}
#: (keypos 2); Ra's ra_log_meta {UId, CurrentTerm, VotedFor, LastApplied} and ra_directory
#: {ServerName, UId}; the MQTT plugin's rabbit_mqtt_retained_msg_store_dets
#: #retained_message{topic, mqtt_msg} (keypos #retained_message.topic = 2). All are sets.
DETS_SHAPES = {
    "recovery.dets": (
        DETS_SET,
        1,
        "{QueueDirName, Terms}",
        lambda o: len(o) == 2 and _is_text(o[0]) and isinstance(o[1], list) and _proplist(o[1]),
    ),
    "schema.DAT": (
        DETS_SET,
        2,
        "{schema, Table, Cs}",
        lambda o: len(o) == 3 and o[0] == "schema" and isinstance(o[1], etf.Atom),
    ),
    # a field never stored is the atom undefined (ra_log_meta handle_batch/2 starts a record as
    # {Id, undefined, undefined, undefined}): seen for LastApplied on a 3.10.8 node killed early
    "meta.dets": (
        DETS_SET,
        1,
        "{UId, CurrentTerm, VotedFor, LastApplied}",
        lambda o: (
            len(o) == 4
            and isinstance(o[0], bytes)
            and (isinstance(o[1], int) or o[1] == "undefined")
            and (isinstance(o[3], int) or o[3] == "undefined")
        ),
    ),
    "names.dets": (
        DETS_SET,
        1,
        "{ServerName, UId}",
        lambda o: len(o) == 2 and isinstance(o[0], etf.Atom) and isinstance(o[1], bytes),
    ),
    "mqtt_retained_*.dets": (
        DETS_SET,
        2,
        "#retained_message{topic, mqtt_msg}",
        lambda o: len(o) == 3 and o[0] == "retained_message" and isinstance(o[1], bytes),
    ),
}


def dets_shape(name: str):
    """``DETS_SHAPES``' entry for a DETS file name (None: not a table of known shape)."""
    if name.startswith("mqtt_retained_") and name.endswith(".dets"):
        return DETS_SHAPES["mqtt_retained_*.dets"]
    return DETS_SHAPES.get(name)


def dets_shape_findings(path: Path, data) -> list[Finding]:
    """``term-file-damaged`` for a broker DETS table (``DETS_SHAPES``) whose header names another
    type or keypos than its writer opens it with (another table in its place, even an empty one:
    the open fails), or holding an object that is not its record (another table's objects)."""
    shape = dets_shape(path.name)
    if shape is None or len(data) < 40:
        return []
    kind, keypos, record, fits = shape
    _, cookie, _, got_kind, version = DETS_HEADER.unpack_from(data, 0)
    if cookie != DETS_COOKIE or version != DETS_VERSION:
        return []  # no DETS v9 header: _dets_ends says so
    (got_keypos,) = struct.unpack_from(">I", data, 28)
    out = []
    for off, what, want, got in ((12, "type", kind, got_kind), (28, "keypos", keypos, got_keypos)):
        if got != want:
            out.append(
                _damaged(
                    f"the header's {what} is {got}, but {path.name} is opened with {what} {want}: the "
                    f"broker's dets:open_file fails on it ({what}_mismatch); another table in its place, "
                    "or a damaged header",
                    path,
                    off,
                    field=what,
                    expected=want,
                    found=got,
                )
            )
    extents = data_extents(path, len(data)) if len(data) > (64 << 20) else None
    for off, obj in _dets_objects(data, None, extents):
        if not (isinstance(obj, tuple) and fits(obj)):
            text = etf.format_term(obj)
            out.append(
                _damaged(
                    f"holds {text[:120]}{'...' if len(text) > 120 else ''}, not the {record} records "
                    f"{path.name} holds: another table's objects in its place (swapped or copied), or "
                    "a damaged object",
                    path,
                    off,
                    expected=record,
                )
            )
            break
    return out


def _dets_ends(path: Path, data) -> list[Finding]:
    """A header that is no DETS v9 header; and, for a table closed properly (open ones are
    repaired by OTP, as after kill -9), free lists that do not end exactly at the end of the
    file (torn, or bytes appended) and an object count other than the header's (an object lost,
    torn or duplicated)."""
    size = len(data)
    if size < 40:
        return [_damaged(f"a DETS table of {plural(size, 'byte')}: shorter than its header", path, 0, size=size)]
    fl, cookie, closed, _, version = DETS_HEADER.unpack_from(data, 0)
    if cookie != DETS_COOKIE or version != DETS_VERSION:
        return [_damaged(f"no DETS v9 header (cookie {cookie:#x}, version {version})", path, 4)]
    if fl > size:  # open or closed, the pointer never lies past the end (checked on every sample)
        return [
            _damaged(
                f"the header's free-list pointer {fl} lies past the end of the file ({plural(size, 'byte')}): "
                "the table is torn",
                path,
                0,
                free_list_pointer=fl,
                size=size,
            )
        ]
    if closed != 1:
        return []  # not closed properly: OTP repairs it when it opens it (the state after kill -9)
    if fl < 40:
        return [
            _damaged(
                f"the header's free-list pointer {fl} lies inside the header: the table is damaged",
                path,
                0,
                free_list_pointer=fl,
                size=size,
            )
        ]
    o = fl
    for _ in range(DETS_MAX_FREE_BLOCKS):
        if o + 12 > size:
            return [
                _damaged(
                    f"the file ends inside its free lists at {o} ({plural(size, 'byte')}): the table is torn",
                    path,
                    o,
                    size=size,
                )
            ]
        block, magic, word = struct.unpack_from(">III", data, o)
        if magic != DETS_FREELIST_MAGIC or block < 8:
            return [
                _damaged(f"bad free-list block at {o} (size {block}, magic {magic:#x}): the table is damaged", path, o)
            ]
        if block == 12 and word == DETS_END_WORD:
            end = o + 16
            break
        o += block
    else:
        return []  # more free-list blocks than any table has: a hostile chain, not followed further
    out = []
    if end < size:
        out.append(
            _damaged(
                f"{plural(size - end, 'byte')} after the end of the table's free lists: junk appended or "
                "a torn rewrite",
                path,
                end,
                extra_bytes=size - end,
            )
        )
    elif end > size:
        out.append(_damaged("the file ends inside its last free-list block: the table is torn", path, size - 4))
    (objects, _) = DETS_COUNTS.unpack_from(data, 32)
    extents = data_extents(path, size) if size > (64 << 20) else None
    found, last = 0, 32
    for off, _ in _dets_objects(data, fl, extents):  # counted, not kept
        found, last = found + 1, off
    if found != objects:
        out.append(
            _damaged(
                f"the header records {plural(objects, 'object')}, {found} are found: an object is "
                f"{'missing or torn' if found < objects else 'extra (copied or injected)'}",
                path,
                last if found > objects else 32,
                recorded=objects,
                found=found,
            )
        )
    return out


def disk_log_findings(path: Path, data=None, table_dump: bool | None = None) -> list[Finding]:
    """``term-file-damaged`` for a disk_log (Mnesia ``.DCD``/``.DCL``/``.LOG``, ``*.ets``): where
    its items stop being items (a torn tail, junk, an undecodable item), and in a table dump
    (``.DCD``: every record once) an item repeated whole."""
    data = map_file(path) if data is None else data
    log = read_disk_log(path, data)
    out = []
    if data[:4] == c_disklog.FILE_MAGIC and data[4:8] not in (c_disklog.CLOSED, c_disklog.OPENED):
        # disk_log_1 is_head: a status word that is neither ?CLOSED nor ?OPENED is no log header
        out.append(
            _damaged(
                f"header status {bytes(data[4:8]).hex()} is neither closed ({c_disklog.CLOSED.hex()}) "
                f"nor open ({c_disklog.OPENED.hex()}): OTP's disk_log refuses the file as no log "
                "(its items are read here all the same)",
                path,
                4,
            )
        )
    if log.error is not None:
        out.append(_damaged(f"{log.error.message}: the items after it are lost", path, log.error.offset))
    kind = mnesia_log_kind(path.name)
    if kind is not None and log.items:
        why = _log_header_problem(log.items[0], kind)
        if why is not None:
            out.append(
                _damaged(
                    f"its first item is no Mnesia {kind} log header ({why}): a damaged header, or another "
                    "file in its place",
                    path,
                    log.offsets[0],
                    expected=kind,
                )
            )
        elif "@" in path.parent.name and log.items[0][4] != path.parent.name:
            # Mnesia's dir is the node dir, named after the node (RabbitMQ's layout; on every sample)
            out.append(
                Finding(
                    "term-file-damaged",
                    f"its header names node {log.items[0][4]}, not this node dir's "
                    f"({path.parent.name}): a changed byte, or another node's log (or the dir renamed)",
                    str(path),
                    log.offsets[0],
                    severity="info",
                    details={"node": str(log.items[0][4]), "node_dir": path.parent.name},
                )
            )
    if table_dump if table_dump is not None else str(path).endswith(".DCD"):
        seen: dict[str, int] = {}
        for off, item in zip(log.offsets, log.items):
            key = repr(item)
            if len(key) > 1 << 16:
                continue
            if key in seen:
                out.append(
                    _damaged(
                        f"item at {off} repeats the item at {seen[key]}: a table dump holds each "
                        "record once (a copied item)",
                        path,
                        off,
                        copy_of_offset=seen[key],
                    )
                )
            else:
                seen[key] = off
    return out


#: the kind a Mnesia log's header names, by file (mnesia_log: the transaction log LATEST.LOG and the
#: PREVIOUS.LOG it is renamed to, the decision table dump, a table's .DCL log and .DCD dump)
MNESIA_LOG_KINDS = {
    "LATEST.LOG": "trans_log",
    "PREVIOUS.LOG": "trans_log",
    "DECISION_TAB.LOG": "decision_tab",
    "DECISION.LOG": "decision_log",
    ".DCL": "dcl_log",
    ".DCD": "dcd_log",
}


def mnesia_log_kind(name: str) -> str | None:
    return MNESIA_LOG_KINDS.get(name) or MNESIA_LOG_KINDS.get(name[name.rfind(".") :]) if "." in name else None


def _version_text(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(c, int) and c in b"0123456789." for c in v)


def _log_header_problem(item, kind: str) -> str | None:
    """Why ``item`` is not the ``#log_header{log_kind, log_version, mnesia_version, node, now}``
    Mnesia writes first in a log of ``kind`` (mnesia_log log_header/2: versions are "N.N" strings,
    the node a name@host atom, now an erlang:timestamp()); None when it is (so on every sample)."""
    if not (isinstance(item, tuple) and len(item) == 6 and item[0] == "log_header"):
        return "not a 6-element log_header tuple"
    _, got, log_version, mnesia_version, node, now = item
    if got != kind:
        return f"its kind is {etf.format_term(got)[:60]}, not {kind}"
    if not (_version_text(log_version) and _version_text(mnesia_version)):
        return "a version that is not a dotted number"
    if not (isinstance(node, etf.Atom) and node.count("@") == 1 and node.isprintable() and " " not in node):
        return f"node {etf.format_term(node)[:80]} is no node name"
    if not (isinstance(now, tuple) and len(now) == 3 and all(isinstance(x, int) and x >= 0 for x in now)):
        return "its time stamp is not {MegaSecs, Secs, MicroSecs}"
    return None


#: the record every object of a store's ets dump is (MS: #file_summary{}, #msg_location{}; so on
#: every sample)
ETS_RECORDS = {"file_summary.ets": "file_summary", "msg_store_index.ets": "msg_location"}
#: the table each dump is of (its table-info item's ``name``; rabbit_msg_store, every version)
ETS_NAMES = {"file_summary.ets": "rabbit_msg_store_file_summary", "msg_store_index.ets": "rabbit_msg_store_ets_index"}
#: the options of each dump's table, as its table-info item records them (ets:tab2file of the
#: table rabbit_msg_store makes: ets:new with these options; the same on every sample, OTP 25 to
#: 27, 3.10.8 to 4.3.6); ``id``, ``owner`` and ``memory`` are the run's own
ETS_INFO = {
    "decentralized_counters": "false",
    "read_concurrency": "false",
    "write_concurrency": "false",
    "compressed": "false",
    "named_table": "false",
    "heir": "none",
    "keypos": 2,
    "protection": "public",
    "major_version": 1,
    "minor_version": 0,
    "extended_info": ["object_count"],
}
ETS_TYPES = {"file_summary.ets": "ordered_set", "msg_store_index.ets": "set"}


def file_summary_records(path: Path, dump: EtsDump | None = None) -> dict[int, tuple]:
    """A ``file_summary.ets`` dump's ``#file_summary{file, valid_total_size, ..., file_size}``
    records: file number -> (valid_total_size, file_size) (objects of another shape left out);
    ``dump``: the file decoded already."""
    dump = read_ets_dump(path) if dump is None else dump
    return {
        o[1]: (o[2], o[5])
        for o in dump.objects()
        if isinstance(o, tuple) and len(o) >= 6 and isinstance(o[1], int) and isinstance(o[5], int)
    }


def ets_findings(path: Path, dump: EtsDump | None = None) -> list[Finding]:
    """``term-file-damaged`` for an ``ets:tab2file`` dump (``file_summary.ets``,
    ``msg_store_index.ets``): damaged items, and an end marker whose count differs from the
    objects found (an item lost or added); no end marker at all is a torn dump. ``dump``: the
    file decoded already (``read_ets_dump``)."""
    dump = read_ets_dump(path) if dump is None else dump
    log = dump.items
    out = []
    if dump.status is not None and dump.status not in (c_disklog.CLOSED, c_disklog.OPENED):
        # disk_log_1 is_head: a status word that is neither ?CLOSED nor ?OPENED is no log header
        out.append(
            _damaged(
                f"header status {dump.status.hex()} is neither closed ({c_disklog.CLOSED.hex()}) "
                f"nor open ({c_disklog.OPENED.hex()}): OTP's disk_log refuses the file as no log "
                "(its items are read here all the same)",
                path,
                4,
            )
        )
    if dump.unreadable is not None:
        raise dump.unreadable
    if log.error is not None:
        out.append(_damaged(f"{log.error.message}: the items after it are lost", path, log.error.offset))
    if log.error is not None or dump.status is None:
        return out
    n = len(log)
    if dump.end_marker() is None:
        marker = next((k for k in sorted(log.terms) if k >= 1 and _is_end(log.terms[k])), None)
        if marker is not None:  # items after the end marker: appended (ets:file2tab rejects the file)
            out.append(
                _damaged(
                    f"{plural(n - marker - 1, 'item')} after the '$end_of_table' marker: extra items",
                    path,
                    log.offsets[marker + 1],
                    extra_items=n - marker - 1,
                )
            )
        else:
            out.append(
                _damaged(
                    "no '$end_of_table' marker: the dump is torn (the broker rebuilds from the files)",
                    path,
                    log.offsets[n - 1] if n else 0,
                )
            )
        return out
    info = log.term(0) if n and (not log.is_row(0) or log.rows is not None) else ()
    info = info if isinstance(info, tuple) else ()
    name = next((kv[1] for kv in info if isinstance(kv, tuple) and len(kv) == 2 and kv[0] == "name"), None)
    if path.name in ETS_NAMES and name != ETS_NAMES[path.name]:
        out.append(
            _damaged(
                f"its table info names table {name}, not {ETS_NAMES[path.name]}: another table's dump, "
                "or a damaged one",
                path,
                log.offsets.get(0, 0),
                expected=ETS_NAMES[path.name],
                found=str(name),
            )
        )
    ks = dump._object_items()
    odd = np.isin(ks, list(log.terms))
    objects = int((~odd).sum()) + sum(
        len(t) if isinstance(t, list) else 1 for t in (log.terms[k] for k in ks[odd].tolist())
    )
    if path.name in ETS_TYPES:
        out += _ets_info_findings(path, info, objects, log.offsets.get(0, 0))
    tag = ETS_RECORDS.get(path.name)
    if tag is not None:
        other = next(
            ((k, o) for k, o in dump._objects_of(log, ks[odd]) if not (isinstance(o, tuple) and o and o[0] == tag)),
            None,
        )
        first_row = next((k for k in ks.tolist() if log.is_row(k)), None) if tag != "msg_location" else None
        if first_row is not None and (other is None or first_row < other[0]):
            other = (first_row, (etf.Atom("msg_location"),))
        if other is not None:
            found = other[1][0] if isinstance(other[1], tuple) and other[1] else type(other[1]).__name__
            out.append(
                _damaged(
                    f"holds {found} objects, not the #{tag}{{}} records this dump holds: another table's "
                    "dump in its place (swapped or copied)",
                    path,
                    log.offsets.get(1, 0) if n > 1 else 0,
                    expected=str(tag),
                    found=str(found),
                )
            )
    if not dump.complete:
        end = dump.end_marker()
        counts = textfiles.proplist(end[1]) if len(end) > 1 else {}
        out.append(
            _damaged(
                f"the end marker records {counts.get('count')} objects, {objects} are "
                "found: an item is missing or extra",
                path,
                log.offsets[n - 1],
                recorded=counts.get("count"),
                found=objects,
            )
        )
    return out


def _ets_info_findings(path: Path, info: tuple, objects: int, offset: int) -> list[Finding]:
    """The table-info item of a rabbit_msg_store dump against the table the broker makes: its
    options (``ETS_INFO``, ``ETS_TYPES``), its ``size`` (the objects it holds, dumped after it),
    its ``node`` and the node of its ``id`` and ``owner`` (this node, whose dir it is in). The
    dump has no checksum: a flipped bit in the item shows here, or in nothing (a digit of the
    table's id, its owner's pid or its memory)."""
    got = {str(kv[0]): kv[1] for kv in info if isinstance(kv, tuple) and len(kv) == 2}
    want = {**ETS_INFO, "type": ETS_TYPES[path.name], "size": objects}
    problems = [f"{k} is {str(got.get(k))[:40]}, not {v}" for k, v in want.items() if got.get(k) != v]
    # the node it names three times (its own, its table's id, its owner's pid) is one node (a node
    # dir may be renamed in a backup, so not compared with the dir's name)
    node = got.get("node")
    for k in ("id", "owner"):
        v = got.get(k)
        if isinstance(node, etf.Atom) and isinstance(v, etf.Opaque) and etf.opaque_node(v) not in (None, str(node)):
            problems.append(f"its {k} names node {etf.opaque_node(v)[:40]}, its node is {str(node)[:40]}")
    unknown = sorted(set(got) - set(want) - {"id", "owner", "memory", "node", "name"})
    if unknown:
        problems.append(f"keys tab2file does not write: {', '.join(k[:30] for k in unknown[:4])}")
    if not problems:
        return []
    return [
        _damaged(
            f"its table info is not the broker's table: {'; '.join(problems[:4])} (a flipped bit: the "
            "dump has no checksum; ets:file2tab makes the table with what it says)",
            path,
            offset,
            problems=problems[:8],
        )
    ]


#: Ra WAL (ra_log_wal.erl, checked on every sample): "RAWA", version 1, then records
#: ``<<Trunc:1, Known:1, IdRef:22, [IdLen:16, UId]?, Adler32:32, Len:32, Idx:64, Term:64, Data:Len>>``
#: (the UId only where ``Known`` is 0); the checksum is adler32 of ``<<Idx, Term, Data>>``
RA_WAL_MAGIC = b"RAWA"
RA_WAL_VERSION = 1  # ra_log_wal ?CURRENT_VERSION: open_existing exits on any other


def wal_findings(path: Path, data=None) -> list[Finding]:
    """``term-file-damaged`` for a Ra write-ahead log (Khepri's metadata, quorum queues): a
    version Ra does not read (it exits: the Ra system, so the metadata store, does not start);
    the first record that is torn (runs past the end), fails its checksum, or is no record
    (junk): Ra's recovery stops there and loses what follows; and a record of a writer no
    earlier record of the file introduces (``Known`` set, its ``IdRef`` never seen with a UId):
    ra_log_wal recover_records takes it for a deleted server's and skips it, losing its entry.
    The adler32 covers a record's index, term and data, not its header: a flipped bit there
    shows only as such a writer."""
    return _wal(path, data)[0]


def wal_uids(path: Path, data=None) -> list[tuple[int, bytes]]:
    """(offset, UId) of each writer a Ra WAL introduces (its ``Known`` = 0 records)."""
    return _wal(path, data)[1]


def _wal(path: Path, data=None) -> tuple[list[Finding], list[tuple[int, bytes]]]:
    import zlib

    data = map_file(path) if data is None else data
    size = len(data)
    uids: list[tuple[int, bytes]] = []
    if size == 0:
        return [], uids
    if data[:4] != RA_WAL_MAGIC:
        return [_damaged(f"no Ra WAL header (starts {bytes(data[:5]).hex()})", path, 0)], uids
    if size < 5 or data[4] != RA_WAL_VERSION:
        got = data[4] if size > 4 else None
        return [
            _damaged(
                f"Ra WAL format version {got}, not {RA_WAL_VERSION}: Ra refuses the file "
                "(exit unknown_wal_file_format), so its Ra system does not start",
                path,
                4,
                version=got,
            )
        ], uids
    o, n = 5, 0
    refs: set[int] = set()
    out: list[Finding] = []
    while o < size:
        if size - o < 3 + 24:
            if any(data[o:size]):
                return out + [
                    _damaged(
                        f"the WAL ends inside a record header ({plural(size - o, 'byte')}): torn", path, o, records=n
                    )
                ], uids
            break
        h = int.from_bytes(data[o : o + 3], "big")
        p = o + 3
        known = h >> 22 & 1
        ref = h & 0x3FFFFF
        if not known:
            if h == 0 and not any(data[o : o + 32]):
                if any(data[o : min(size, o + (1 << 20))]):
                    return out + [
                        _damaged("bytes after the zero-filled end of the WAL: junk", path, o, records=n)
                    ], uids
                break
            uid_len = int.from_bytes(data[p : p + 2], "big")
            uids.append((o, bytes(data[p + 2 : p + 2 + uid_len])))
            refs.add(ref)
            p += 2 + uid_len
        if p + 24 > size:
            return out + [_damaged("the WAL ends inside a record header: torn", path, o, records=n)], uids
        check, length = struct.unpack_from(">II", data, p)
        if p + 24 + length > size:
            return out + [
                _damaged(
                    f"a record of {plural(length, 'byte')} runs past the end of the WAL: torn (or junk)",
                    path,
                    o,
                    records=n,
                )
            ], uids
        if zlib.adler32(data[p + 8 : p + 24 + length]) != check:
            return out + [
                _damaged("a record fails its checksum: damaged, or junk after the last record", path, o, records=n)
            ], uids
        if known and ref not in refs and len(out) < 16:
            out.append(
                _damaged(
                    f"a record of writer ref {ref}, which no earlier record of this WAL introduces: Ra "
                    "takes it for a deleted server's and skips it, so its entry is lost (its header "
                    "damaged: the checksum does not cover it)",
                    path,
                    o,
                    writer_ref=ref,
                )
            )
        n += 1
        o = p + 24 + length
    return out, uids


#: the keys a Ra server config holds (ra_server.erl ``ra_server_config()``, Ra 2.x to 3.1; and
#: ``machine_config``, which the Khepri of RabbitMQ 4.x writes too: every sample)
RA_CONFIG_KEYS = frozenset(
    {
        "id",
        "uid",
        "cluster_name",
        "log_init_args",
        "initial_members",
        "machine",
        "initial_machine_version",
        "friendly_name",
        "metrics_key",
        "metrics_labels",
        "broadcast_time",
        "tick_timeout",
        "install_snap_rpc_timeout",
        "await_condition_timeout",
        "max_pipeline_count",
        "ra_event_formatter",
        "counter",
        "membership",
        "system_config",
        "has_changed",
        "parent",
        "min_recovery_checkpoint_interval",
        "machine_config",
    }
)


def ra_config_findings(path: Path) -> list[Finding]:
    """``term-file-damaged`` for a Ra server's ``config`` (ra_log:write_config writes its config
    map as ``~p.``; ra_server_sup_sup:recover_config reads it back at every restart): NUL
    bytes, terms ``file:consult`` cannot read, not one map, or a map whose ``uid`` (and
    ``log_init_args``' uid) is not its data dir's name (Ra restarts the server with that UId: its
    log in another, empty, dir), whose ``id`` is no server id or not its Khepri machine's
    ``member``; and (info) keys no Ra writes."""
    raw = read_bytes(path)
    hit = textfiles.text_damage(raw, "ra-config")
    if hit is not None:
        return [_damaged(f"Ra server config: {hit[0]}", path, hit[1])]
    cfg = textfiles.consult(raw)[0]
    uid = os.fsencode(path.parent.name)
    problems = []
    for where, value in (
        ("uid", cfg.get("uid")),
        (
            "log_init_args uid",
            (cfg.get("log_init_args") or {}).get("uid") if isinstance(cfg.get("log_init_args"), dict) else None,
        ),
    ):
        if value != uid:
            problems.append(
                f"its {where} is {value!r:.60}, not its data dir's name {uid.decode('utf-8', 'replace')}: "
                "Ra restarts the server on another (empty) data dir"
            )
    ident = cfg.get("id")
    if not (isinstance(ident, tuple) and len(ident) == 2 and isinstance(ident[1], etf.Atom)):
        problems.append(f"its id {str(ident)[:80]} is no {{Name, Node}} server id")
    else:  # Khepri's machine config names its member: the same server
        machine = cfg.get("machine")
        member = (
            machine[2].get("member")
            if isinstance(machine, tuple) and len(machine) == 3 and isinstance(machine[2], dict)
            else None
        )
        if member is not None and member != ident:
            problems.append(f"its id {str(ident)[:60]} is not its machine's member {str(member)[:60]}")
    out = [_damaged(f"Ra server config: {p}", path, None) for p in problems]
    unknown = sorted(str(k) for k in cfg if str(k) not in RA_CONFIG_KEYS)
    if unknown:  # Ra ignores a key it does not know (and falls back to the default of the one it lost)
        keys = ", ".join(k[:40] for k in unknown[:4])
        out.append(
            Finding(
                "term-file-damaged",
                f"Ra server config: keys no Ra writes ({keys}): a flipped bit in a "
                "key's name (Ra then uses that setting's default), or a Ra newer than those known here",
                str(path),
                None,
                severity="info",
                details={"unknown_keys": unknown[:16]},
            )
        )
    return out


def writers_snapshot_findings(path: Path) -> list[Finding]:
    """``term-file-damaged`` (info) for a Ra WAL's ``writers.snapshot`` that is not the term
    ra_log_wal persist_writers writes (``term_to_binary`` of a map): recover_writers then warns
    and starts with no writers (the sequence numbers it checks writes against are lost)."""
    raw = read_bytes(path)
    try:
        term, end = etf.decode(raw)
        bad = None if isinstance(term, dict) and end == len(raw) else "not one map"
    except etf.EtfError as e:
        bad = f"not a term ({e.message})"
    if bad is None:
        return []
    return [
        Finding(
            "term-file-damaged",
            f"writers.snapshot is {bad}: Ra warns and starts its WAL with no writers",
            str(path),
            0,
            severity="info",
        )
    ]


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


TEXT_LIMIT = 1 << 20  # the broker's text files are a few KB: a larger one is read this far


def text_findings(path: Path, shape: str, node: str | None = None) -> list[Finding]:
    """``term-file-damaged`` for a broker-written text file (``textfiles.TEXT_SHAPES``: a vhost's
    ``.config``, a store's ``clean.dot``, the node's cluster files): NUL bytes, terms that do not
    parse, or terms of another shape than its writer's. None of it is checked by a checksum, so
    the shape is the only evidence a copy, swap or overwrite leaves."""
    try:
        raw = read_optional(path, TEXT_LIMIT + 1)
    except FormatError:  # not a regular file: the layout's finding, never read
        return []
    if raw is None:
        return []
    if len(raw) > TEXT_LIMIT:
        return [
            _damaged(
                f"{path.name}: larger than {plural(TEXT_LIMIT, 'byte')}, which no writer of it writes", path, TEXT_LIMIT
            )
        ]
    hit = textfiles.text_damage(raw, shape, node)
    return [] if hit is None else [_damaged(f"{path.name}: {hit[0]}", path, hit[1])]


def dump_dets(path: Path, segment_entry_count: int | None = None):
    """The per-object listing of a DETS file (``dump``) as ``(row, None)`` pairs: objects are
    found one at a time in the mapped file (never the whole file in memory)."""
    data = map_file(path)
    extents = data_extents(path, len(data)) if len(data) > (64 << 20) else None
    for off, obj in _dets_objects(data, extents=extents):
        yield {"offset": off, "kind": "object", "term": etf.format_term(obj)}, None
    for f in dets_findings(path, data):
        yield {"offset": f.offset, "kind": "problem", "status": f"{f.code}: {f.message}"}, None


def dump_disk_log(path: Path, segment_entry_count: int | None = None):
    """The per-item listing of a disk_log (``dump``) as ``(row, None)`` pairs (mapped)."""
    log = read_disk_log(path, map_file(path))
    yield {"kind": "header", "closed_properly": log.closed}, None
    for off, item in zip(log.offsets, log.items):
        yield {"offset": off, "kind": "item", "term": etf.format_term(item)}, None
    if log.error:
        yield {"offset": log.error.offset, "kind": "error", "status": log.error.message}, None
