"""The compiled core: the hot paths in Rust (PyO3, sources in ``core/``, built into the
module ``cqforensics_core`` by ``pip install .``), behind the same interfaces as their Python
reference implementations, which stay the specification the core is tested against
(tests/codecs/test_core.py: equal on every sample, damaged variant and fuzz case).

* ``walk_rdq``: the shared-store walk with resynchronisation (``readers.rdq.walk``);
* ``check_qs``: the checks of the ``.qs`` entries an index points at (``readers.qs.check_entry``);
* ``disk_log_items``: the items of an ``ets:tab2file`` dump, strictly or as ``ets:file2tab``
  finds them, the store index's ``#msg_location{}`` records decoded into columns
  (``readers.terms.disk_log_walk``);
* ``decode_term``: an external term made into the reference's Python values, for the plain
  terms a Ra log entry is made of (``codecs.etf.decode``); ``decode_terms`` a run of them;
  ``decode_term_at`` one inside a bigger buffer, with where it ends (a disk_log's items);
  ``decode_fields``: a few fields of each of many records carved from one buffer
  (``codecs.etf.decode_fields_at``);
* ``decode_messages``: the two stored layouts that make up almost every store (``fastpath``)
  decoded straight into Arrow columns. A row the core does not handle (another shape, a float
  header, damage) is marked for the reference to decode; ``COUNTS`` keeps the tally.

``CQF_CORE=0`` in the environment turns the core off (the reference does everything), for
comparisons and benchmarks. A missing or stale build is not an error: the reference runs and
``status()`` says why.
"""

from __future__ import annotations

import functools
import logging
import mmap
import os
from collections import Counter

import numpy as np
import pyarrow as pa

from cqforensics.base.schema import PROPERTIES, STRINGS
from cqforensics.codecs import etf

ABI = 17  # must equal the core's ABI (core/src/bindings.rs)
log = logging.getLogger("cqforensics.compiled")

try:
    import cqforensics_core as _native
except ImportError as e:  # not built (a checkout never installed with pip)
    # every path has a pure-Python twin (differential-tested): slower, same answers
    _native, _why = (
        None,
        (
            f"not built ({e}): running the pure-Python paths (slower, same answers); "
            "to build it: install a Rust toolchain, then python3 -m pip install ."
        ),
    )
else:
    _why = None
    if getattr(_native, "ABI", None) != ABI:
        _native, _why = (
            None,
            (
                f"stale build (ABI {getattr(_native, 'ABI', '?')}, sources {ABI}): running the "
                "pure-Python paths; run: python3 -m pip install ."
            ),
        )

#: rows decoded by the core / handed to the reference, since the process started
COUNTS: Counter = Counter()


def native():
    """The compiled module, or None when it is missing, stale or turned off."""
    if _native is None or os.environ.get("CQF_CORE", "1") == "0":
        return None
    return _native


def status() -> str:
    if _native is None:
        return _why
    if native() is None:
        return "off (CQF_CORE=0)"
    if debug_build():
        return "on, a debug build (about 10x slower; python3 -m pip install . builds it for release)"
    return "on"


def debug_build() -> bool:
    """Whether the compiled core is a debug build: the same answers, measured 8-13x slower (never
    a benchmark's figure: ``bench/make_store.core_status`` refuses it)."""
    return bool(getattr(_native, "DEBUG", False))


# -- rdq walk --------------------------------------------------------------------------------------


def walk_rdq(data, extents=None, referenced: bytes | None = None, directory: bytes | None = None):
    """``(offsets, totals, msg_ids, holes, torn, rejected)`` of one ``.rdq`` file's bytes (see
    readers.rdq.walk): numpy int64, int64 and V16 arrays, the holes' ``(offsets, lengths,
    kinds)`` arrays (int64, int64, uint8: a position in ``readers.rdq.HOLE_KINDS``),
    ``[(offset, total, id)]`` and ``[(offset, total, id, reason, hidden)]``; ``referenced``: the
    ids to trust, 16 bytes each, sorted bytewise (``readers.rdq.Referenced.sorted``), and their
    ``directory`` (``readers.rdq.Referenced.directory``, or None). A map's pages are dropped
    behind the walk (memory stays flat over a huge file)."""
    w = _native.walk_rdq(data, extents, referenced, isinstance(data, mmap.mmap), directory)
    return (
        np.frombuffer(w.offsets, np.int64),
        np.frombuffer(w.totals, np.int64),
        np.frombuffer(w.ids, "V16"),
        (
            np.frombuffer(w.hole_offsets, np.int64),
            np.frombuffer(w.hole_lengths, np.int64),
            np.frombuffer(w.hole_kinds, np.uint8),
        ),
        w.torn,
        w.rejected,
    )


def check_qs(data, offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The QsStatus code (int8) of each ``.qs`` entry at ``offsets`` with term ``sizes``
    (readers.qs.check_entry)."""
    out = _native.check_qs(data, np.ascontiguousarray(offsets, np.int64), np.ascontiguousarray(sizes, np.int64))
    return np.frombuffer(out, np.int8)


def qs_garbage(data, start: int, holes: list[tuple[int, int]], limit: int = 4096):
    """``(offsets, lengths, resume)`` of at most ``limit`` garbage runs of a ``.qs`` segment's
    bytes from ``start`` (readers.qs.garbage_runs); ``resume``: where to call again, None when
    the scan reached the end. A map's pages are dropped behind the scan."""
    runs = _native.qs_garbage(data, start, holes, limit, isinstance(data, mmap.mmap))
    return np.frombuffer(runs.offsets, np.int64), np.frombuffer(runs.lengths, np.int64), runs.resume


def read_spans(sources: list, file_ix: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """Arrow binary: row k the bytes ``[starts[k], starts[k] + lengths[k])`` of
    ``sources[file_ix[k]]`` (a buffer or an open file's descriptor; cut where it ends; null where
    ``file_ix[k] < 0``), read a run of nearby spans at a time."""
    col = _native.read_spans(
        sources,
        np.ascontiguousarray(file_ix, np.int32),
        np.ascontiguousarray(starts, np.int64),
        np.ascontiguousarray(lengths, np.int64),
        pa.allocate_buffer,
    )
    return _var(pa.binary(), len(file_ix), col)


# -- disk_log items ---------------------------------------------------------------------------------


def disk_log_items(data, start: int = 8, max_items: int = 1 << 62) -> dict:
    """The items of a disk_log's bytes (readers.terms.disk_log_walk, strictly), from ``start``,
    at most ``max_items``: numpy
    arrays ``offsets``, ``starts``, ``lengths`` (int64), ``decoded`` (uint8: 1 where the item is
    a ``#msg_location{}`` record decoded into ``ids`` (V16), ``ref_counts``, ``files``,
    ``locations``, ``totals`` (int64)), ``stop`` (None or the strict walk's ``(code, offset)``:
    1 inside an item header, 2 bad magic, 3 past the end), ``md5_items`` and ``next`` (where to
    go on from; None: done)."""
    out = _native.disk_log_items(data, start, max_items)
    for k in ("offsets", "starts", "lengths", "ref_counts", "files", "locations", "totals"):
        out[k] = np.frombuffer(out[k], np.int64)
    out["decoded"] = np.frombuffer(out["decoded"], np.uint8)
    out["ids"] = np.frombuffer(out["ids"], "V16")
    return out


# -- external terms --------------------------------------------------------------------------------


#: the reference's makers of what no Python builtin is: atoms, pids/ports/references, improper
#: lists, and a list or map made a map key
_TERM_MAKERS = (etf.make_atom, etf.Opaque, etf.ImproperList, etf._hashable)


def decode_term(data):
    """The external term ``data`` holds (its version byte first; bytes after the term are
    ignored, as ``codecs.etf.decode`` ignores them) as the reference's own Python values, or
    None when the core is off or leaves the term to the reference (a compressed term, a fun,
    one past its bounds, damage): then ``etf.decode`` decodes it, errors and all."""
    n = native()
    if n is None or len(data) < 2 or data[0] != etf.VERSION:
        return None
    got = n.decode_term(data, 1, _TERM_MAKERS)
    if got is None:
        COUNTS["terms_to_reference"] += 1
        return None
    COUNTS["terms"] += 1
    return got[0]


def decode_term_at(data, start: int, end: int) -> tuple | None:
    """The external term at ``data[start:end]`` (its version byte at ``start``) as
    ``codecs.etf.decode(data, offset=start)`` gives it, ``(term, where it ends)``, when it ends
    by ``end``; None when the core is off or leaves the term to the reference (as
    ``decode_term``, and a term that would run past ``end``): then ``etf.decode`` decodes it,
    errors and all. Only the term's own bytes are copied into the core (a disk_log's item)."""
    n = native()
    return None if n is None else _decode_at(n, data, start, end)


def term_decoder_at():
    """``decode_term_at`` for a run of terms (a file's items, a table's objects), the core's
    state looked up once for the run (``native()`` reads the environment); None when the core
    is off."""
    n = native()
    return None if n is None else functools.partial(_decode_at, n)


def _decode_at(n, data, start: int, end: int) -> tuple | None:
    if end - start < 2 or data[start] != etf.VERSION:
        return None
    got = n.decode_term(memoryview(data)[start:end], 1, _TERM_MAKERS)
    if got is None:
        COUNTS["terms_to_reference"] += 1
        return None
    COUNTS["terms"] += 1
    return got[0], start + got[1]


def decode_fields(data, starts: list[int], wanted, limit: int) -> list | None:
    """For each start: ``codecs.etf.decode_fields_at(data, start, wanted, end=start + limit)``
    (the tuple with only its ``wanted`` elements made into values, and its end), or None where
    the core leaves that record to the reference (not a tuple, a compressed term, a fun, one
    past its bounds, damage: ``decode_fields_at`` decodes it, errors and all). None when the
    core is off."""
    n = native()
    if n is None:
        return None
    got = n.decode_fields(data, starts, limit, sorted(wanted), _TERM_MAKERS)
    left = got.count(None)
    COUNTS["terms"] += len(got) - left
    COUNTS["terms_to_reference"] += left
    return got


def decode_terms(datas: list) -> list | None:
    """``decode_term`` of each of ``datas`` (a list of buffers) in one call into the core, each
    distinct atom made once for the run (a Ra log's entries, a batch at a time); None when the
    core is off. A buffer that is no external term of version 131 gives None, as there."""
    n = native()
    if n is None:
        return None
    out = n.decode_terms(datas, 1, _TERM_MAKERS)
    left = out.count(None)
    COUNTS["terms"] += len(out) - left
    COUNTS["terms_to_reference"] += left
    return out


# -- message decode --------------------------------------------------------------------------------

FALLBACK, NO_TERM = 1, 2


def _buf(b) -> pa.Buffer:
    return b if isinstance(b, pa.Buffer) else pa.py_buffer(b)


def _validity(col):
    return _buf(col.validity) if col.null_count else None


def _var(typ, n: int, col, data=None) -> pa.Array:
    """A ``VarColumn`` of the core as an Arrow array (``data``: its data buffer, when cut)."""
    return pa.Array.from_buffers(
        typ, n, [_validity(col), _buf(col.offsets), _buf(col.data if data is None else data)], null_count=col.null_count
    )


def _num(typ, n: int, col) -> pa.Array:
    return pa.Array.from_buffers(typ, n, [_validity(col), _buf(col.values)], null_count=col.null_count)


def _used(col) -> pa.Buffer:
    """The data of a binary column whose buffer (a ``pa.Buffer`` from Arrow's pool) is longer than
    its values (the core's body buffer has room for whole terms), cut to its last offset (no copy)."""
    return col.data.slice(0, int(np.frombuffer(col.offsets, np.int32)[-1]))


#: in a decode without bodies, rows further apart than this, on average, in their files are
#: read a term at a time rather than through a map (a decode with bodies reads runs straight
#: into the body column, whatever the distance). A page fault maps the 64 KiB around it (the
#: kernel's fault-around) and costs a few microseconds; a read of one term costs about one.
#: Rows closer than that share their faults, rows further apart pay one each (measured when
#: bodies went through maps too: a compacted store's rows, about 19 KiB apart, 0.31 s a term at
#: a time and 0.26 s mapped; the 1x store read in 11 shares, rows about 51 KiB apart, 2.4 µs a
#: message mapped, 2.0 a term at a time).
SCATTERED = 32 << 10


def scattered(file_ix: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> bool:
    """Whether the rows with a term lie more than ``SCATTERED`` bytes apart on average (the
    bytes from each file's first term to its last end that no term takes, over the rows), and
    more bytes lie between them than in them (a long term is copied once from a map, twice when
    read first)."""
    has = file_ix >= 0
    if not has.any():
        return False
    f, s, n = file_ix[has], starts[has], lengths[has]
    order = np.argsort(f, kind="stable")
    f, s, e = f[order], s[order], s[order] + n[order]
    first = np.flatnonzero(np.r_[True, f[1:] != f[:-1]])
    between = int((np.maximum.reduceat(e, first) - np.minimum.reduceat(s, first)).sum() - n.sum())
    return between > SCATTERED * len(f) and between > int(n.sum())


def decode_messages(
    sources: list,
    file_ix: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    index_ids: bytes | np.ndarray,
    has_id: np.ndarray,
    bodies: bool,
    map_files: bool | None = None,
) -> tuple[np.ndarray, dict]:
    """The decoded ``messages`` columns of stored terms as Arrow arrays, and each row's status
    (0 decoded, ``FALLBACK``: for the reference, ``NO_TERM``). Row k's term is the byte range
    ``[starts[k], starts[k] + lengths[k])`` of ``sources[file_ix[k]]`` (-1: no term): a buffer,
    or the descriptor of a file open for reading (``Bodies.descriptors``). ``map_files`` True:
    the core maps each file for the call and copies each body from the map into its column;
    False: it reads a run of nearby terms at a time, with bodies straight into the body column
    (one ``preadv`` per run, each body then moved down to its place), without them into a
    window; None: the best way measured (bench store, 1x: runs 0.94-1.04 s, maps 1.04-1.14 s
    CPU; a compacted store's rows, about 19 KiB apart, alike): runs when bodies are wanted, a
    map otherwise, unless the rows lie far apart (``scattered``). The body column's buffer
    comes from Arrow's memory pool."""
    if map_files is None:
        map_files = not bodies and not scattered(file_ix, starts, lengths)
    if isinstance(index_ids, np.ndarray):  # V16 ids: their bytes, not a copy
        index_ids = np.ascontiguousarray(index_ids).view(np.uint8)
    has_id = np.ascontiguousarray(has_id)
    has_id = has_id.view(np.uint8) if has_id.dtype == np.bool_ else has_id.astype(np.uint8, copy=False)
    out = _native.decode_messages(
        sources,
        np.ascontiguousarray(file_ix, np.int32),
        np.ascontiguousarray(starts, np.int64),
        np.ascontiguousarray(lengths, np.int64),
        index_ids,
        has_id,
        bodies,
        pa.allocate_buffer,
        map_files,
    )
    n = len(has_id)
    status = np.frombuffer(out["status"], np.uint8)
    props = []
    for f in PROPERTIES:
        col = out[f.name]
        props.append(_num(f.type, n, col) if hasattr(col, "values") else _var(f.type, n, col))
    rks, valid = out["routing_keys"], out["properties"]
    keys = _var(pa.string(), int(np.frombuffer(rks.offsets, np.int32)[-1]), rks.items)
    cols = {
        "msg_id": _var(pa.binary(), n, out["msg_id"]),
        "exchange": _var(pa.string(), n, out["exchange"]),
        "routing_keys": pa.Array.from_buffers(
            STRINGS, n, [_validity(rks), _buf(rks.offsets)], null_count=rks.null_count, children=[keys]
        ),
        "properties": pa.Array.from_buffers(
            PROPERTIES, n, [_validity(valid)], null_count=valid.null_count, children=props
        ),
        "headers": _var(pa.string(), n, out["headers"]),
        "annotations": _var(pa.string(), n, out["annotations"]),
        "body": _var(pa.binary(), n, out["body"], _used(out["body"])),
        "body_size": _num(pa.int64(), n, out["body_size"]),
        "term_format": _var(pa.string(), n, out["term_format"]),
        "decode_error": _var(pa.string(), n, out["decode_error"]),
    }
    fallback = int(np.count_nonzero(status == FALLBACK))
    COUNTS["core"] += int(np.count_nonzero(status == 0))
    COUNTS["reference"] += fallback
    if fallback:
        log.debug("core: %d of %d messages decoded by the Python reference", fallback, n)
    return status, cols


__all__ = [
    "ABI",
    "COUNTS",
    "FALLBACK",
    "NO_TERM",
    "check_qs",
    "debug_build",
    "decode_messages",
    "decode_term",
    "decode_fields",
    "decode_terms",
    "decode_term_at",
    "term_decoder_at",
    "disk_log_items",
    "qs_garbage",
    "read_spans",
    "native",
    "status",
    "walk_rdq",
]
