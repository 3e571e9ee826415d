"""The data tables as Arrow record batches, built from a ``VhostScan``.

Index-derived columns are sliced from numpy arrays; only the ``messages`` table (and store
bodies) loops per message, to slice and decode bodies. Batches are capped by rows and bytes.
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cqforensics import compiled as core
from cqforensics.base.enums import (
    FATE_LABELS,
    LOCATION_LABELS,
    AckEvidence,
    Fate,
    Location,
    RecordKind,
    RefcountStatus,
    StoreStatus,
)
from cqforensics.base.enums import labels as code_labels
from cqforensics.base.errors import FormatError, display
from cqforensics.base.findings import Finding
from cqforensics.base.schema import (
    SCHEMAS,
    STRINGS,
    TS_MAX_US,
    TS_MIN_US,
    binary_array,
    fit_array,
    fit_struct,
    fits,
    properties_row,
)
from cqforensics.base.schema import value_marks as schema_marks
from cqforensics.checks import check_vhost
from cqforensics.grammar import qs as c_qs
from cqforensics.message import fast as fastpath
from cqforensics.message import reference as message
from cqforensics.model import quorum as m_quorum
from cqforensics.model import recovery
from cqforensics.model.index import OFFSET_OUT_OF_RANGE, IndexChunk
from cqforensics.model.options import DECODED_COLUMNS
from cqforensics.model.recovery import Resolved
from cqforensics.model.store import IdSet, distinct
from cqforensics.model.vhost import VhostScan, passes
from cqforensics.readers import qs as r_qs
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers import registry

TS = pa.timestamp("us", tz="UTC")


# -- column helpers ----------------------------------------------------------------------------


def repeat(value, n: int, typ=pa.string()) -> pa.Array:  # noqa: B008 (pa.string() is a singleton)
    """A constant column (pa.repeat is slow for long arrays): a slice of the longest one made
    so far for this value (arrays are immutable; every batch of a read repeats its node, vhost
    and queue names, and a read in shares makes many small batches)."""
    key = (value, str(typ))
    made = _REPEATS.pop(key, None)  # put back last: the dict is in order of use
    if made is not None:
        _REPEATS.total -= made.nbytes
    if made is None or len(made) < n:
        made = _repeat(value, max(n, 1024), typ)
        if made.nbytes > _REPEAT_BYTES // 16:
            return made.slice(0, n)
    _REPEATS[key] = made
    _REPEATS.total += made.nbytes
    while _REPEATS.total > _REPEAT_BYTES:
        _REPEATS.total -= _REPEATS.pop(next(iter(_REPEATS))).nbytes  # the least recently used
    return made.slice(0, n)


class _Kept(dict):
    total = 0  # bytes of the arrays held


_REPEATS = _Kept()
_REPEAT_BYTES = 8 << 20  # the constant columns kept, together


def _repeat(value, n: int, typ) -> pa.Array:
    if value is None:
        return pa.nulls(n, typ)
    if typ == pa.string():
        raw = value.encode("utf-8")
        offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(raw * n)])
    return pa.array(np.full(n, value), typ)


def id_array(ids: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """V16 numpy array -> Arrow binary (null where not ``valid``)."""
    n = len(ids)
    valid = np.ones(n, bool) if valid is None else valid.astype(bool)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.where(valid, 16, 0), out=offsets[1:])
    nulls = int(n - valid.sum())
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes()) if nulls else None
    return pa.Array.from_buffers(
        pa.binary(), n, [bitmap, pa.py_buffer(offsets.tobytes()), pa.py_buffer(ids[valid].tobytes())], null_count=nulls
    )


def _fit(cum_bytes: np.ndarray, start: int, n: int, max_rows: int, max_bytes: int) -> int:
    """Where the rows from ``start`` stop that fit in ``max_rows`` rows and ``max_bytes`` bytes
    (cumulative sizes given): ``start`` when not even one does."""
    base = int(cum_bytes[start - 1]) if start else 0
    return min(n, start + max_rows, int(np.searchsorted(cum_bytes, base + max_bytes, side="right")))


def _capped(cum_bytes: np.ndarray, n: int, max_rows: int, max_bytes: int):
    """Row slices of at most ``max_rows`` rows and about ``max_bytes`` (cumulative sizes given;
    a row bigger than that alone)."""
    start = 0
    while start < n:
        end = max(start + 1, _fit(cum_bytes, start, n, max_rows, max_bytes))
        yield slice(start, end)
        start = end


def ts_array(micros: np.ndarray) -> pa.Array:
    """Epoch microseconds (0 = none) -> timestamp[us, UTC] with nulls (also where a value lies
    outside the column's range: the model reports those as ``value-out-of-range``)."""
    micros, bad = fit_array(micros, TS)
    return pa.array(micros, TS, mask=(micros == 0) | bad)


def names_array(names, index: np.ndarray, null: np.ndarray | None = None) -> pa.Array:
    """Strings by index into ``names`` (null where ``null``). A column of one name, or of nulls
    only (a chunk's one segment file, a batch of messages the next boot delivers), is made
    without a lookup per row."""
    n = len(index)
    if not n:
        return pa.array([], pa.string())
    if null is not None and null.any():
        if null.all():
            return pa.nulls(n, pa.string())
    elif index[0] >= 0 and (index == index[0]).all():
        return repeat(names[index[0]], n)
    codes = pa.array(np.maximum(index, 0).astype(np.int32), mask=null)
    return pa.DictionaryArray.from_arrays(codes, pa.array(list(names) or [""], pa.string())).dictionary_decode()


def batch(table: str, columns: dict) -> pa.RecordBatch:
    """A batch of ``table`` from its columns; a classic queue's builder leaves out the columns
    of other queue types (``queue_type`` is then ``classic``, the others null)."""
    sch = SCHEMAS[table]
    arrays = []
    n = len(next(iter(columns.values()))) if columns else 0
    for f in sch:
        col = columns.get(f.name)
        if col is None and f.name not in columns:
            col = repeat("classic", n) if f.name == "queue_type" else pa.nulls(n, f.type)
        arrays.append(col if isinstance(col, pa.Array) else pa.array(col, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=sch)


class Rows:
    """Accumulates row dicts for the small tables and flushes capped RecordBatches."""

    def __init__(self, table: str, max_rows: int):
        self.schema = SCHEMAS[table]
        self.rows: list[dict] = []
        self.max_rows = max_rows

    def add(self, row: dict) -> pa.RecordBatch | None:
        self.rows.append(row)
        return self.flush() if len(self.rows) >= self.max_rows else None

    def flush(self) -> pa.RecordBatch | None:
        if not self.rows:
            return None
        out = pa.RecordBatch.from_pylist(self.rows, schema=self.schema)
        self.rows = []
        return out


def _where(vs: VhostScan) -> tuple[str, str | None]:
    return display(vs.node.node.node), display(vs.vhost.name if vs.vhost.name is not None else vs.vhost.label)


def _queue(qx: IndexChunk, n: int, node: str, vhost: str | None) -> dict:
    return {
        "node": repeat(node, n),
        "vhost": repeat(vhost, n),
        "queue": repeat(qx.qdir.name, n),
        "priority": repeat(qx.qdir.priority, n, pa.int32()),
    }


# -- index / acks ------------------------------------------------------------------------------


def index_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    node, vhost = _where(vs)
    step = max(1, vs.options.batch_rows)
    for qx in vs.chunks():
        r = qx.rec
        files = [display(p) for p in qx.files]
        mine = vs.chunk_rows(qx)  # the records of the scan's share (None: all)
        rows = None if mine is None else np.flatnonzero(mine)
        for start in range(0, len(r.seq) if rows is None else len(rows), step):
            sl = slice(start, start + step) if rows is None else rows[start : start + step]
            n = len(r.seq[sl])
            loc, kind = r.loc[sl], r.kind[sl]
            has_loc = (loc != Location.NONE) & np.isin(kind, (RecordKind.PUBLISH, RecordKind.GHOST, RecordKind.BAD))
            in_file = np.isin(loc, (Location.QUEUE_STORE, Location.EMBEDDED))
            at = range(start, start + n) if rows is None else sl.tolist()
            errors = [qx.errors.get(i) for i in at] if qx.errors else None
            yield batch(
                "index",
                {
                    **_queue(qx, n, node, vhost),
                    "file": names_array(files, r.file[sl]),
                    "offset": pa.array(r.offset[sl]),
                    "index_version": repeat(qx.version, n, pa.int32()),
                    "kind": names_array(code_labels(RecordKind), kind),
                    "seq_id": pa.array(r.seq[sl]),
                    "persistent": pa.array(r.persistent[sl] == 1, mask=r.persistent[sl] < 0),
                    "location": names_array(LOCATION_LABELS, loc, ~has_loc),
                    "msg_id": id_array(
                        r.msg_id[sl],
                        has_loc & ((loc == Location.SHARED_STORE) | (qx.version == 1) & (kind == RecordKind.PUBLISH)),
                    ),
                    "store_offset": pa.array(
                        r.store_offset[sl], mask=~in_file | (r.store_offset[sl] == OFFSET_OUT_OF_RANGE)
                    ),
                    "store_size": pa.array(r.store_size[sl], mask=~in_file),
                    "size": pa.array(r.size[sl], mask=~has_loc),
                    "expiry": ts_array(r.expiry[sl]),
                    "status": pa.array(r.status[sl], pa.int32(), mask=r.status[sl] < 0),
                    "error": pa.array(errors, pa.string()) if errors else pa.nulls(n, pa.string()),
                },
            )


def acks_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    node, vhost = _where(vs)
    for qx in vs.chunks():
        a = qx.acks
        mine = vs.share_mask(a.msg_id, a.has_id, a.seq)
        if mine is not None:
            a = type(a)(*(getattr(a, f.name)[mine] for f in dataclasses.fields(a)))
        n = len(a.seq)
        if n:
            yield batch(
                "acks",
                {
                    **_queue(qx, n, node, vhost),
                    "file": names_array([display(p) for p in qx.files], a.file),
                    "offset": pa.array(a.offset),
                    "seq_id": pa.array(a.seq),
                    "evidence": names_array(code_labels(AckEvidence), a.evidence),
                    "msg_id": id_array(a.msg_id, a.has_id),
                },
            )


# -- store / refcounts / holes -----------------------------------------------------------------


def store_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    node, vhost = _where(vs)
    bodies = vs.options.bodies
    for kind, st in vs.stores.items():
        status, refs = vs.store_status[kind]
        n = len(st.e_id)
        paths = [display(f.path) for f in st.files]
        sizes = np.cumsum(st.e_total) if bodies else np.zeros(n, np.int64)
        # an orphan's queues under the metadata's bindings (decoded, so only when decoding)
        dests = vs.orphan_destinations(kind) if vs.options.decode and vs.node.metadata.kind is not None else {}
        routed = np.array(sorted(dests), np.int64)
        for e in _capped(sizes, n, vs.options.batch_rows, vs.options.batch_bytes):
            m = e.stop - e.start
            body = pa.nulls(m, pa.binary())
            if bodies:
                body = vs.bodies.column(
                    [f.path for f in st.files], st.e_file[e], *r_rdq.term_span(st.e_offset[e], st.e_total[e])
                )
            yield batch(
                "store",
                {
                    "node": repeat(node, m),
                    "vhost": repeat(vhost, m),
                    "store": repeat(kind, m),
                    "file": names_array(paths, st.e_file[e]),
                    "offset": pa.array(st.e_offset[e]),
                    "total_size": pa.array(st.e_total[e]),
                    "msg_id": id_array(st.e_id[e]),
                    "marker_ok": repeat(True, m, pa.bool_()),
                    "status": names_array(code_labels(StoreStatus), status[e]),
                    "refs": pa.array(refs[e]),
                    "body": body,
                    "routes_to": _routes(dests, routed, e.start, e.stop),
                },
            )
        if st.bad:
            m = len(st.bad)
            yield batch(
                "store",
                {
                    "node": repeat(node, m),
                    "vhost": repeat(vhost, m),
                    "store": repeat(kind, m),
                    "file": [paths[f] for f, _, _, _ in st.bad],
                    "offset": [o for _, o, _, _ in st.bad],
                    "total_size": [t for _, _, t, _ in st.bad],
                    "msg_id": [i for _, _, _, i in st.bad],
                    "marker_ok": repeat(False, m, pa.bool_()),
                    "status": repeat(StoreStatus.CORRUPT.label, m),
                    "refs": repeat(0, m, pa.int32()),
                    "routes_to": pa.nulls(m, STRINGS),
                    "body": [bytes(vs.bodies.read(st.files[f].path, *r_rdq.term_span(o, t))) for f, o, t, _ in st.bad]
                    if bodies
                    else pa.nulls(m, pa.binary()),
                },
            )


def _routes(dests: dict, routed: np.ndarray, start: int, stop: int) -> pa.Array:
    """The ``routes_to`` of store entries ``start:stop``: the orphans' queues (``routed``: the
    sorted positions ``dests`` knows), null elsewhere; only the orphans are visited."""
    out: list = [None] * (stop - start)
    lo, hi = np.searchsorted(routed, [start, stop])
    for k in routed[lo:hi].tolist():
        queues = dests[k]
        out[k - start] = None if queues is None else [q.decode("utf-8", "replace") for q in queues]
    return pa.array(out, STRINGS)


def refcounts_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    """One row per distinct id of a store (ids the indexes reference but no file holds included)."""
    node, vhost = _where(vs)
    labels = [q.label for q in vs.all_queue_dirs]
    names = sorted(set(labels))
    position = {x: k for k, x in enumerate(names)}  # (a search of the list per queue was quadratic)
    name_of = np.array([position[x] for x in labels] or [0], np.int64)
    for kind, st in vs.stores.items():
        refs = vs.references[kind]
        missing = refs.ids.ids[st.distinct.lookup(refs.ids.ids) < 0]  # referenced, in no file
        ids, _, _ = IdSet.build(np.concatenate([st.distinct.ids, missing]))
        n = len(ids)
        if not n:
            continue
        g = st.distinct.lookup(ids.ids)
        in_store = g >= 0
        gg = np.maximum(g, 0)
        copies = np.where(in_store, st.copies[gg] if len(st.copies) else 0, 0).astype(np.int32)
        claim = np.where(in_store, st.claim[gg] if len(st.claim) else -1, -1)
        where = np.where(claim >= 0, claim, np.where(in_store, st.first[gg] if len(st.first) else -1, -1))
        has = where >= 0
        rg = refs.ids.lookup(ids.ids)
        computed = np.where(rg >= 0, refs.count[np.maximum(rg, 0)] if len(refs.count) else 0, 0).astype(np.int32)
        # queue lists: distinct names per id, from the (ref id, queue) pairs
        nn = max(1, len(names))
        pairs = (
            distinct(refs.pairs // refs.n_queues * nn + name_of[refs.pairs % refs.n_queues])
            if len(refs.pairs)
            else np.zeros(0, np.int64)
        )
        ref_to_row = np.full(len(refs.ids), 0, np.int64)
        ref_to_row[rg[rg >= 0]] = np.flatnonzero(rg >= 0)
        rows_of_pairs = ref_to_row[pairs // nn] if len(pairs) else pairs
        order = np.lexsort((pairs % nn, rows_of_pairs)) if len(pairs) else pairs
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(np.bincount(rows_of_pairs, minlength=n), out=offsets[1:])
        queues = pa.ListArray.from_arrays(pa.array(offsets), names_array(names, (pairs % nn)[order]))
        recorded = None
        if st.recorded is not None:
            recorded = recorded_refs(st.recorded, ids.ids)
        status = np.full(n, RefcountStatus.OK, np.int8)
        status[copies > 1] = RefcountStatus.DUPLICATE
        status[(computed == 0) & (copies > 0)] = RefcountStatus.ORPHAN
        if recorded is not None:
            status[recorded != computed] = RefcountStatus.MISMATCH
        status[(computed > 0) & (claim < 0)] = RefcountStatus.MISSING
        paths = [display(f.path) for f in st.files]
        safe = np.maximum(where, 0)
        file_ix = st.e_file[safe] if len(st.e_file) else safe
        offset = st.e_offset[safe] if len(st.e_offset) else safe
        for e in _capped(np.zeros(n, np.int64), n, vs.options.batch_rows, vs.options.batch_bytes):
            m = e.stop - e.start
            yield batch(
                "refcounts",
                {
                    "node": repeat(node, m),
                    "vhost": repeat(vhost, m),
                    "store": repeat(kind, m),
                    "file": names_array(paths, file_ix[e], ~has[e]),
                    "offset": pa.array(offset[e], mask=~has[e]),
                    "msg_id": id_array(ids.ids[e]),
                    "copies": pa.array(copies[e]),
                    "computed_refs": pa.array(computed[e]),
                    "recorded_refs": pa.array(recorded[e], pa.int32())
                    if recorded is not None
                    else pa.nulls(m, pa.int32()),
                    "queues": queues.slice(e.start, m),
                    "status": names_array(code_labels(RefcountStatus), status[e]),
                },
            )


def recorded_refs(rec, ids: np.ndarray) -> np.ndarray:
    """The reference count msg_store_index.ets records for each id (int32; 0: none recorded, or
    a count that is no integer; one beyond int32 clipped to it)."""
    g = rec.lookup(ids)
    out = np.where(g >= 0, rec.ref_count[np.maximum(g, 0)], 0) if len(rec.ref_count) else np.zeros(len(ids), np.int64)
    for raw, r in rec.other_ids().items():
        hit = np.flatnonzero(ids == np.frombuffer(raw, ids.dtype)[0])
        out[hit] = r[0] if isinstance(r[0], int) and -(1 << 31) <= r[0] < 1 << 31 else 0
    return np.clip(out, -(1 << 31), (1 << 31) - 1).astype(np.int32)


def holes_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    node, vhost = _where(vs)
    rows = Rows("holes", vs.options.batch_rows)
    first = vs.share is None or vs.share.k == 0  # rows about no message id: in the first share only
    for kind, st in vs.stores.items():
        status, _ = vs.store_status[kind]
        for f in st.files if first else ():
            for h in f.holes:
                b = rows.add(
                    {
                        "node": node,
                        "vhost": vhost,
                        "store": kind,
                        "file": display(f.path),
                        "offset": h.offset,
                        "length": h.length,
                        "kind": h.kind,
                    }
                )
                if b is not None:
                    yield b
        for i in np.flatnonzero(status != StoreStatus.LIVE):
            b = rows.add(
                {
                    "node": node,
                    "vhost": vhost,
                    "store": kind,
                    "file": display(st.files[st.e_file[i]].path),
                    "offset": int(st.e_offset[i]),
                    "length": int(st.e_total[i]),
                    "kind": "orphan" if status[i] == StoreStatus.ORPHAN else "stale",
                }
            )
            if b is not None:
                yield b
    for qx in vs.chunks(whole=True) if first else ():
        for path, start, length, kind in qs_holes(vs, qx):
            b = rows.add(
                {
                    "node": node,
                    "vhost": vhost,
                    "queue": qx.qdir.label,
                    "store": "queue",
                    "file": display(path),
                    "offset": start,
                    "length": length,
                    "kind": kind,
                }
            )
            if b is not None:
                yield b
    b = rows.flush()
    if b is not None:
        yield b


def qs_used(vs: VhostScan, qx: IndexChunk) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, lengths) of the .qs entries the chunk's live records use, sorted."""
    r, live = qx.rec, qx.live
    sel = live[r.loc[live] == Location.QUEUE_STORE]
    starts, lengths = r_qs.entry_span(r.store_offset[sel], r.store_size[sel])
    order = np.lexsort((lengths, starts))
    return starts[order], lengths[order]


def qs_holes(vs: VhostScan, qx: IndexChunk):
    """Byte ranges of the chunk's .qs segment that no live index entry uses."""
    path = qx.qs_path
    qs = vs.qs_files.get(path) if path is not None else None
    if qs is None:
        return
    starts, lengths = qs_used(vs, qx)
    starts, ends = np.append(starts, qs.size), np.append(starts + lengths, qs.size)
    # where each used range starts against the end of every range before it
    reached = np.maximum.accumulate(np.concatenate(([r_qs.first_entry_offset()], ends[:-1])))
    for k in np.flatnonzero(starts > reached).tolist():
        o, start = int(reached[k]), int(starts[k])
        gap = vs.bodies.read(path, o, min(start, qs.size) - o)
        yield path, o, start - o, "zeroed" if not any(gap) else "stale"


# -- messages ------------------------------------------------------------------------------------

_PROP_TYPE = SCHEMAS["messages"].field("properties").type
_DECODED = tuple(c for c in DECODED_COLUMNS if c != "properties")  # properties: one struct column


def _index_ids(ids: np.ndarray, has_id: np.ndarray) -> list:
    """The message id the index holds for each row (``IndexChunk.index_ids``), else None."""
    raw = ids.tobytes()
    return [raw[16 * j : 16 * j + 16] if h else None for j, h in enumerate(has_id.tolist())]


def _decode_chunk(vs: VhostScan, res, rows: slice, ids: np.ndarray, has_id: np.ndarray) -> dict:
    """The decoded columns of live entries ``rows`` (a slice of the chunk's live list), given the
    id the index holds for each live entry (V16, and whether it holds one)."""
    ids, has_id = ids[rows], has_id[rows]
    if not vs.options.decode:
        return _undecoded_chunk(vs, res, rows, ids, has_id)
    if core.native() is not None:
        return decode_core(vs, res, rows, ids, has_id)
    return decode_reference(_terms(vs, res, rows), _index_ids(ids, has_id), vs.options.bodies)


def _arrays(cols: dict) -> dict:
    sch = SCHEMAS["messages"]
    return {
        k: v
        if isinstance(v, pa.Array)
        else binary_array(v)
        if k in ("body", "msg_id")
        else pa.array(v, sch.field(k).type)
        for k, v in cols.items()
    }


def decode_core(vs: VhostScan, res, rows: slice, ids: np.ndarray, has_id: np.ndarray) -> dict:
    """``decode_reference`` by the compiled core, reading the terms where they are stored; the
    rows it hands back (shapes it does not know) are decoded by the reference and put in place."""
    used = distinct(res.body_file[rows][res.body_file[rows] >= 0])
    file_ix = np.full(len(res.body_files), -1, np.int32)
    file_ix[used] = np.arange(len(used))
    bf = res.body_file[rows]  # -1: no stored body (and no file at all when every row has none)
    file_ix = np.where(bf >= 0, file_ix[np.maximum(bf, 0)] if len(file_ix) else -1, -1).astype(np.int32)
    status, cols = core.decode_messages(
        vs.bodies.descriptors([res.body_files[f] for f in used.tolist()]),
        file_ix,
        res.body_start[rows],
        res.body_len[rows],
        np.ascontiguousarray(ids).view(np.uint8),  # the ids as bytes, not copied
        has_id,
        vs.options.bodies,
    )
    fallback = np.flatnonzero(status == core.FALLBACK)
    if not len(fallback):
        return cols
    terms = _terms(vs, res, rows.start + fallback)  # only the rows the reference decodes
    ref = _arrays(decode_reference(terms, _index_ids(ids[fallback], has_id[fallback]), vs.options.bodies))
    order = np.arange(len(ids))
    order[fallback] = len(ids) + np.arange(len(fallback))
    return {k: pa.concat_arrays([v, ref[k]]).take(order) for k, v in cols.items()}


def decode_reference(terms: list, index_ids: list, bodies: bool) -> dict:
    """The decoded columns of stored ``terms`` (bytes, or None where the body was not found),
    given the message id the index holds for each (or None): the Python reference."""
    out = {k: [] for k in _DECODED}
    props = []  # the properties dict of each row (None: not decoded)
    ex, rks, hd, an, bd, bs, tf, mi, de = (out[k] for k in _DECODED)
    for k in range(len(terms)):
        msg_id = index_ids[k]
        msg = error = None
        raw = terms[k]
        if raw is not None:
            try:
                msg = fastpath.decode(raw)
            except FormatError as e:
                error = f"{e.message} (offset {e.offset} in the term)" if e.offset is not None else e.message
            except Exception as e:  # a damaged term may break any assumption of the shape
                error = f"{type(e).__name__}: {e}"[:500]
        if msg is not None:
            if msg_id is None:
                msg_id = msg["msg_id"]
            elif msg["msg_id"] is not None and msg["msg_id"] != msg_id:
                error = "the stored term's message id differs from the index's"
            kinds = msg.get("marks")
            if kinds:  # fields of another kind, shown as null (schema.value_marks: with the ranges below)
                marked = schema_marks(msg, [])
                error = marked if error is None else f"{error}; {marked}"
            ex.append(msg["exchange"])
            rks.append(msg["routing_keys"])
            props.append(properties_row(msg))  # a dict of this message's own: the column's timestamp is in µs
            hd.append(msg["headers"])
            an.append(msg["annotations"])
            body = msg["body"]
            bd.append(body if bodies else None)
            bs.append(len(body))
            tf.append(msg["term_format"])
        else:
            props.append(None)
            ex.append(None)
            rks.append(None)
            hd.append(None)
            an.append(None)
            bd.append(None)
            bs.append(None)
            tf.append(None)
        mi.append(msg_id)
        de.append(error)
    out["properties"] = _properties(props, de)
    return out


_PROP_TS = [f.name for f in _PROP_TYPE if pa.types.is_timestamp(f.type)]


def _properties(props: list, errors: list) -> pa.Array:
    """The properties column. Numbers that do not fit their field (an integer column, or a
    timestamp beyond 9999-12-31) become null and are named in the row's ``decode_error``; the
    check costs nothing per row unless Arrow or the timestamp range says something is off."""
    try:
        arr = pa.array(props, _PROP_TYPE)
        if all(_in_ts_range(arr.field(name)) for name in _PROP_TS):
            return arr
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        pass  # a number too big for its column: found row by row below
    for k, p in enumerate(props):
        bad = fit_struct(p, _PROP_TYPE) if p is not None else None
        if bad:
            errors[k] = (errors[k] + "; " if errors[k] else "") + schema_marks({}, bad)
    return pa.array(props, _PROP_TYPE)


def _in_ts_range(col: pa.Array) -> bool:
    lo_hi = pc.min_max(col.cast(pa.int64()))
    lo, hi = lo_hi["min"].as_py(), lo_hi["max"].as_py()
    return lo is None or (TS_MIN_US <= lo and hi <= TS_MAX_US)


def _undecoded_chunk(vs: VhostScan, res, rows: slice, ids: np.ndarray, has_id: np.ndarray) -> dict:
    """``_decode_chunk`` without decoding: message ids from the index, raw bodies if wanted, and
    null decoded columns, without a Python step per row where none is needed."""
    m = rows.stop - rows.start
    sch = SCHEMAS["messages"]
    out = {k: pa.nulls(m, sch.field(k).type) for k in _DECODED}
    out["properties"] = pa.nulls(m, _PROP_TYPE)
    out["msg_id"] = id_array(ids, has_id)
    if vs.options.bodies:
        out["body"] = _terms(vs, res, rows)
    return out


def _terms(vs: VhostScan, res, rows) -> list:
    """The stored terms of live entries ``rows`` (a slice or an array of positions; None where the
    body was not found)."""
    rows = np.arange(rows.start, rows.stop) if isinstance(rows, slice) else np.asarray(rows)
    m = len(rows)
    found = np.flatnonzero(res.body_file[rows] >= 0)
    at = rows[found]
    terms = vs.bodies.read_many(
        [res.body_files[f] for f in res.body_file[at].tolist()], res.body_start[at].tolist(), res.body_len[at].tolist()
    )
    out = [None] * m
    for k, t in zip(found.tolist(), terms):
        out[k] = t
    return out


def messages_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    """The ``messages`` rows of the vhost's classic queues (``classic_messages_batches``), then
    those of its quorum queues."""
    yield from classic_messages_batches(vs)
    yield from quorum_messages_batches(vs)


def classic_messages_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    """Live index entries joined to their bodies and decoded, in delivery-listing order. A batch
    takes the live entries of consecutive chunks up to ``batch_rows`` rows and (roughly)
    ``batch_bytes`` of bodies: a read in shares has a few hundred of a chunk's entries, and a
    batch per chunk would cost more in making it than in its rows."""
    node, vhost = _where(vs)
    max_rows, max_bytes = vs.options.batch_rows, vs.options.batch_bytes
    pieces: list[tuple] = []
    rows = size = 0
    for qx in vs.live_chunks():  # (no kept index: its decode dwarfs a second read of the indexes)
        n = len(qx.live)
        if not n:
            continue
        res = vs.resolve(qx)
        sizes = np.cumsum(np.where(res.body_file >= 0, res.body_len, 0))
        start = 0
        while start < n:  # the chunk's next rows that fit in the batch
            end = _fit(sizes, start, n, max_rows - rows, max_bytes - size)
            if end == start:
                if pieces:  # full: the rows go to the next batch
                    yield _messages_batch(vs, pieces, node, vhost)
                    pieces, rows, size = [], 0, 0
                    continue
                end = start + 1  # a row bigger than a batch goes alone
            pieces.append((qx, res, slice(start, end)))
            rows += end - start
            size += int(sizes[end - 1] - (sizes[start - 1] if start else 0))
            start = end
            if rows >= max_rows or size >= max_bytes:
                yield _messages_batch(vs, pieces, node, vhost)
                pieces, rows, size = [], 0, 0
    if pieces:
        yield _messages_batch(vs, pieces, node, vhost)


def _messages_batch(vs: VhostScan, pieces: list[tuple], node: str, vhost: str | None) -> pa.RecordBatch:
    """The ``messages`` batch of ``pieces``, each ``(chunk, its Resolved, a slice of its live
    entries)``: their rows in order, one decode for all."""

    def cat(arrays: list) -> np.ndarray:
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    idx = [qx.live[sl] for qx, _, sl in pieces]

    def index_col(name: str) -> np.ndarray:
        return cat([getattr(qx.rec, name)[i] for (qx, _, _), i in zip(pieces, idx)])

    def res_col(name: str) -> np.ndarray:
        return cat([getattr(res, name)[sl] for _, res, sl in pieces])

    # the index files and store files of every piece, each once, and each piece's positions in
    # its own lists turned into positions in these
    files: dict[Path, int] = {}
    store_files: dict[Path, int] = {}
    file_ix, body_file = [], []
    for (qx, res, sl), i in zip(pieces, idx):
        file_ix.append(np.array([files.setdefault(f, len(files)) for f in qx.files], np.int32)[qx.rec.file[i]])
        at = np.array([store_files.setdefault(f, len(store_files)) for f in res.body_files] + [-1], np.int32)
        body_file.append(at[res.body_file[sl]])  # -1 (no body) takes the last
    m = sum(len(i) for i in idx)
    res = Resolved(
        list(store_files),
        cat(body_file),
        res_col("body_start"),
        res_col("body_len"),
        res_col("store_offset"),
        res_col("qs_status"),
        res_col("fate"),
    )
    ids = cat([qx.rec.msg_id[i] for (qx, _, _), i in zip(pieces, idx)])
    has_id = cat([qx.index_ids(i) for (qx, _, _), i in zip(pieces, idx)])
    dec = _decode_chunk(vs, res, slice(0, m), ids, has_id)
    per_piece = np.repeat(np.arange(len(pieces)), [len(i) for i in idx])
    queues = [qx.qdir for qx, _, _ in pieces]
    priority = np.array([q.priority if q.priority is not None else 0 for q in queues], np.int32)[per_piece]
    no_priority = np.array([q.priority is None for q in queues])[per_piece]
    delivered, loc, fate = index_col("delivered"), index_col("loc"), res.fate
    cols = {
        "node": repeat(node, m),
        "vhost": repeat(vhost, m),
        "queue": names_array([q.name for q in queues], per_piece),
        "priority": pa.array(priority, pa.int32(), mask=no_priority),
        "file": names_array([display(f) for f in files], cat(file_ix)),
        "offset": pa.array(index_col("offset")),
        "seq_id": pa.array(index_col("seq")),
        "index_version": pa.array(np.array([qx.version for qx, _, _ in pieces], np.int32)[per_piece], pa.int32()),
        "persistent": pa.array(index_col("persistent") == 1),
        "delivered": pa.array(delivered == 1, mask=delivered < 0),
        "location": names_array(LOCATION_LABELS, loc, loc < 0),
        "store_file": names_array([display(p) for p in res.body_files], res.body_file, res.body_file < 0),
        "store_offset": pa.array(
            res.store_offset, mask=(res.store_offset < 0) | (res.store_offset == OFFSET_OUT_OF_RANGE)
        ),
        "size": pa.array(index_col("size")),
        "expiry": ts_array(index_col("expiry")),
        "survives_restart": pa.array(fate == Fate.DELIVERED),
        "drop_reason": names_array(FATE_LABELS[1:], fate - 1, fate == Fate.DELIVERED),
        "queue_type": repeat("classic", m),
        "raft_index": pa.nulls(m, pa.int64()),
        "raft_term": pa.nulls(m, pa.int64()),
        "delivery_count": pa.nulls(m, pa.int64()),
        "checked_out": pa.nulls(m, pa.bool_()),
        **_arrays(dec),
    }
    return batch("messages", cols)


# -- quorum queues -----------------------------------------------------------------------------------


class _QuorumRows:
    """The ``messages`` columns of quorum rows, gathered row by row (a quorum queue's messages
    are decoded from its log entries one at a time)."""

    def __init__(self):
        self.cols = {f.name: [] for f in SCHEMAS["messages"]}
        self.props: list = []

    def add(
        self,
        where: dict,
        entry,
        m,
        fate,
        count,
        held,
        fields,
        error,
        queue_type="quorum",
        location=None,
        persistent=True,
    ):
        c = self.cols
        for k in ("node", "vhost", "queue"):
            c[k].append(where[k])
        c["priority"].append(None)
        c["file"].append(display(entry.file) if entry else None)
        c["offset"].append(entry.offset if entry else None)
        c["seq_id"].append(None)
        c["index_version"].append(None)
        c["delivered"].append(None)
        c["persistent"].append(persistent)  # a quorum queue keeps every message in its log, whatever its delivery mode
        c["location"].append(location or (entry.source if entry else None))
        c["store_file"].append(display(entry.file) if entry else None)
        c["store_offset"].append(entry.data_offset if entry else None)
        c["size"].append(m.header.get("size"))
        exp = m.header.get("expiry") if queue_type == "quorum" else None
        c["expiry"].append(exp * 1000 if isinstance(exp, int) and TS_MIN_US <= exp * 1000 <= TS_MAX_US else None)
        c["survives_restart"].append(fate == Fate.DELIVERED)
        c["drop_reason"].append(Fate(fate).reason)
        c["queue_type"].append(queue_type)
        c["raft_index"].append(m.index)
        c["raft_term"].append(entry.term if entry else None)
        c["delivery_count"].append(count)
        c["checked_out"].append(held)
        if fields is not None:
            mid = fields["msg_id"]
            c["msg_id"].append(mid if isinstance(mid, bytes) and len(mid) == 16 else None)  # 3.10 stores <<>>
            c["exchange"].append(fields["exchange"])
            c["routing_keys"].append(fields["routing_keys"])
            p = dict(fields["properties"])
            ts = fields["timestamp_ms"]
            p["timestamp"] = ts * 1000 if isinstance(ts, int) else None
            self.props.append(p)
            c["headers"].append(fields["headers"])
            c["annotations"].append(fields["annotations"])
            c["body"].append(fields["body"] if where.get("bodies", True) else None)
            c["body_size"].append(len(fields["body"]))
            c["term_format"].append(fields["term_format"])
        else:
            for k in ("msg_id", "exchange", "routing_keys", "headers", "annotations", "body_size", "term_format"):
                c[k].append(None)
            c["body"].append(None)
            self.props.append(None)
        c["decode_error"].append(error)

    def batches(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        n = len(self.cols["node"])
        if not n:
            return
        sch = SCHEMAS["messages"]
        arrays = {}
        for f in sch:
            if f.name == "properties":
                arrays[f.name] = _properties(self.props, self.cols["decode_error"])
            elif f.name in ("body", "msg_id"):
                arrays[f.name] = binary_array(self.cols[f.name])
            elif not self.cols[f.name]:  # a column of another kind of queue (a stream's offset): null
                arrays[f.name] = pa.nulls(n, f.type)
            else:
                arrays[f.name] = pa.array(self.cols[f.name], f.type)
        whole = pa.RecordBatch.from_arrays([arrays[f.name] for f in sch], schema=sch)
        for start in range(0, n, batch_rows):
            yield whole.slice(start, batch_rows)


def quorum_messages_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    """The ``messages`` rows of the vhost's quorum queues (``VhostScan.quorum_queues``), queue by
    queue: one per message the queue's replayed state holds, in the order the next boot
    delivers them, then the messages the queue dead-letters at most once at the next boot into
    other queues (``NodeScan.boot_dead_letters``, by target queue). A read of one queue's
    planned unit thus yields exactly that queue's part of a whole read."""
    node, vhost = _where(vs)
    for q in vs.quorum_queues:
        if vs.quorum_names is None or q.name in vs.quorum_names:
            yield from _quorum_rows(vs, q, node, vhost).batches(vs.options.batch_rows)
        yield from _dead_letter_rows(vs, q, node).batches(vs.options.batch_rows)


def _quorum_rows(vs: VhostScan, q, node: str, vhost: str | None) -> _QuorumRows:
    bodies = vs.node._quorum_bodies
    rows = _QuorumRows()
    where = {
        "node": node,
        "vhost": q.vhost if q.vhost is not None else vhost,
        "queue": q.label,
        "bodies": vs.options.bodies,
    }
    for m, fate, d, count, held in q.messages():
        e = q.entry_of(m.index)
        rep = q.replay if q.log.entries.get(m.index) is not None else (q.data_replay or q.replay)
        term = m_quorum.message_term(rep, m.index, bodies) if e is not None else None
        fields, error = None, None
        if term is not None and vs.options.decode:
            try:
                fields = m_quorum.delivered_view(message.normalise_checked(term), m, vs.node.model.version)
            except FormatError as err:
                error = err.message
        elif e is None:
            error = "no log entry holds this message (below the snapshot, or lost)"
        rows.add(where, e, m, fate, count, bool(held), fields, error)
    return rows


def _dead_letter_rows(vs: VhostScan, source, node: str) -> _QuorumRows:
    """The rows ``source`` adds to other queues at the next boot (location ``dead_letter_replay``)."""
    rows = _QuorumRows()
    meta = vs.node.metadata
    for (vh, name), items in sorted(vs.node.boot_dead_letters.items()):
        items = [it for it in items if it[0] is source]
        if not items or (vs.quorum_names is not None and name not in vs.quorum_names):
            continue
        rec = meta.queues.get((vh.encode(), name.encode()))
        qtype = "quorum" if rec is not None and rec.type == "rabbit_quorum_queue" else "classic"
        where = {"node": node, "vhost": vh, "queue": name, "bodies": vs.options.bodies}
        for q, reason, m, fields, exchange, rk in items:
            view = (
                m_quorum.dead_letter_view(
                    fields, reason, q.log.resource, exchange, rk, vs.options.now_ms(), vs.node.model.version
                )
                if vs.options.decode
                else None
            )
            rows.add(
                where,
                q.entry_of(m.index),
                m,
                Fate.DELIVERED,
                0,
                False,
                view,
                None,
                qtype,
                "dead_letter_replay",
                True if qtype == "quorum" else fields["persistent"],
            )
    return rows


def quorum_summaries(vs: VhostScan) -> Iterator[tuple]:
    """Per quorum queue of the vhost: (queue, counts) of what its state holds and the boot keeps."""
    meta = vs.node.metadata
    for q in vs.quorum_queues:
        if vs.quorum_names is not None and q.name not in vs.quorum_names:
            continue
        counts = {
            "messages": 0,
            "bytes": 0,
            "persistent": 0,
            "kept": 0,
            "known": None if meta.kind is None or q.log.resource is None else meta.knows(*q.log.resource),
        }
        for m, fate, _, _, _ in q.messages():
            counts["messages"] += 1
            counts["bytes"] += int(m.header.get("size", 0) or 0)
            counts["kept"] += fate == Fate.DELIVERED
        counts["persistent"] = counts["messages"]  # a quorum queue keeps every message on disk
        yield q, counts


def raft_log_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    """One row per log entry copy of the vhost's quorum queues (WAL records and segment
    entries), in file order: its index and term, the command, and whether the next boot uses it."""
    node, vhost = _where(vs)
    rows = Rows("raft_log", vs.options.batch_rows)
    bodies = vs.node._quorum_bodies if vs.quorum_queues else None
    for q in vs.quorum_queues:
        if vs.quorum_names is not None and q.name not in vs.quorum_names:
            continue
        vh = q.vhost if q.vhost is not None else vhost
        entries = q.log.entries
        used = {(e.file, e.offset) for e in entries.values()}
        replayed = q.replay.entry_rows
        uid = os.fsencode(q.log.uid)
        copies = []
        for sf in q.system.segments.get(q.log.uid, []):
            seg = sf.seg
            labels = [r_seg_labels[st] for st in seg.status.tolist()]
            offs = seg.offset.tolist()
            copies += zip(
                itertools.repeat(sf.path),
                offs,
                offs,
                seg.length.tolist(),
                seg.index.tolist(),
                seg.term.tolist(),
                itertools.repeat("segment"),
                labels,
                itertools.repeat(None),
            )
        for scan, rec in q.system.wal:
            kept = set(rec.kept)
            rows_ = scan.rows_of(uid)
            copies += zip(
                itertools.repeat(scan.path),
                scan.offset[rows_].tolist(),
                scan.data_offset[rows_].tolist(),
                scan.length[rows_].tolist(),
                scan.index[rows_].tolist(),
                scan.term[rows_].tolist(),
                itertools.repeat("wal"),
                [("ok", "bad", "not_computed")[c] for c in scan.checksum[rows_].tolist()],
                ["recovered" if i in kept else "not_recovered" for i in rows_.tolist()],
            )
        todo = []  # the copies the replay did not decode (superseded, not recovered, below the snapshot)
        for k, (path, off, data_off, length, idx, *_) in enumerate(copies):
            e = entries.get(idx) if (path, off) in used else None
            same = e is not None and (e.file, e.offset, e.data_offset, e.length) == (path, off, data_off, length)
            row = replayed.get(idx) if same else None  # the replay decoded these very bytes
            if row is None:
                todo.append(k)
            copies[k] += (row,)
        for lo in range(0, len(todo), m_quorum.DECODE_BATCH):
            ks = todo[lo : lo + m_quorum.DECODE_BATCH]
            datas = [bodies.read(copies[k][0], copies[k][2], copies[k][3]) for k in ks]
            for k, got in zip(ks, m_quorum.decode_log_entries(datas)):
                row = m_quorum.UNDECODABLE_ROW if isinstance(got, FormatError) else m_quorum.entry_row(got)
                copies[k] = copies[k][:-1] + (row,)
        for path, off, data_off, length, idx, term, source, check, wal_status, row in copies:
            recovered = (path, off) in used
            entry, command, ts, body_size = row
            status = "used" if recovered else (wal_status or ("superseded" if idx in q.log.entries else "unused"))
            b = rows.add(
                {
                    "node": node,
                    "vhost": vh,
                    "queue": q.label,
                    "file": display(path),
                    "offset": off,
                    "source": source,
                    "raft_index": idx,
                    "raft_term": term,
                    "entry": entry,
                    "command": command,
                    "entry_size": length,
                    "body_size": body_size,
                    "checksum": check,
                    "recovered": recovered,
                    "timestamp": ts * 1000 if isinstance(ts, int) and TS_MIN_US <= ts * 1000 <= TS_MAX_US else None,
                    "status": status,
                }
            )
            if b is not None:
                yield b
    b = rows.flush()
    if b is not None:
        yield b


r_seg_labels = ("ok", "crc_mismatch", "past_eof", "not_computed", "inside_index")


# -- queues / files / findings ---------------------------------------------------------------------


def each_share(vs: VhostScan) -> Iterator[VhostScan]:
    """The scans a vhost-level fact about every id is summed over: ``vs`` itself (read whole, or
    already one share: a Spark unit), else one scan per share, each made from the one before
    (``model.vhost.passes``: vhost-wide facts are computed once) and closed after use."""
    if vs.share is not None:
        yield vs
        return
    yield from passes(vs)


def queue_summaries(vs: VhostScan) -> Iterator[dict]:
    """Per queue dir: message counts and what the next boot does with them (summed share by
    share for a vhost read in shares)."""
    out = {
        q.dir_name: {
            "qdir": q,
            "version": q.index_version,
            "messages": 0,
            "bytes": 0,
            "persistent": 0,
            "kept": 0,
            "min": 0,
            "max": 0,
            "drops": {},
            "segments": len(q.qi) + len(q.idx),
        }
        for q in vs.queue_dirs
    }
    for sub in each_share(vs):
        sub.lists_every_index()
        for qx in sub.live_chunks():  # (a pass in shares: from the vhost's one spill)
            s = out[qx.qdir.dir_name]
            r, live = qx.rec, qx.live
            res = sub.resolve(qx)
            counts = np.bincount(res.fate, minlength=len(Fate))
            lo, hi = recovery.delivery_bounds(sub, qx, res)
            s["min"] += int(lo.sum())
            s["max"] += int(hi.sum())
            s["messages"] += len(live)
            s["bytes"] += int(r.size[live].sum())
            s["persistent"] += int((r.persistent[live] == 1).sum())
            s["kept"] += int(counts[Fate.DELIVERED])
            for code in np.flatnonzero(counts).tolist():
                if code != Fate.DELIVERED:
                    reason = Fate(code).reason
                    s["drops"][reason] = s["drops"].get(reason, 0) + int(counts[code])
            s["version"] = qx.version
    yield from out.values()


def queues_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    node, vhost = _where(vs)
    rows = []
    extra = {
        name: len(items)
        for (vh, name), items in vs.node.boot_dead_letters.items()
        if vh == vs.vhost.name and (vs.share is None or vs.share.k == 0)
    }
    for s in queue_summaries(vs):
        q = s["qdir"]
        if q.name in extra and (q.priority is None or q.priority == 0):  # quorum dead letters the boot republishes
            s["messages"] += extra[q.name]
            s["kept"] += extra.pop(q.name)
        rows.append(
            {
                "node": node,
                "vhost": vhost,
                "queue": q.label,
                "priority": q.priority,
                "queue_dir": display(q.path),
                "name_source": q.name_source,
                "durable_known": vs.queue_known(q),
                "index_version": s["version"],
                "segments": s["segments"],
                "messages": s["messages"],
                "bytes": s["bytes"],
                "persistent": s["persistent"],
                "predicted_after_restart": s["kept"],
                "predicted_min": s["min"],
                "predicted_max": s["max"],
                "dropped": s["messages"] - s["kept"],
                "queue_type": "classic",
            }
        )
    for q, counts in quorum_summaries(vs):
        if q.name in extra:
            counts["messages"] += extra[q.name]
            counts["kept"] += extra.pop(q.name)
        rows.append(
            {
                "node": node,
                "vhost": q.vhost if q.vhost is not None else vhost,
                "queue": q.label,
                "priority": None,
                "queue_dir": display(q.log.path),
                "name_source": "ra_config",
                "durable_known": counts["known"],
                "index_version": None,
                "segments": len(q.system.segments.get(q.log.uid, [])),
                "messages": counts["messages"],
                "bytes": counts["bytes"],
                "persistent": counts["persistent"],
                "predicted_after_restart": counts["kept"],
                "predicted_min": counts["kept"],
                "predicted_max": counts["kept"],
                "dropped": counts["messages"] - counts["kept"],
                "queue_type": "quorum",
            }
        )
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=SCHEMAS["queues"])


#: the errors of a stat that ``Path.exists`` takes for "no such file" (pathlib's ``_IGNORED_ERRNOS``)
_ABSENT = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})


def file_rows(vs: VhostScan) -> Iterator[dict]:
    node, vhost = _where(vs)
    v = vs.vhost

    def row(path: Path, kind: str, overhead: int = 0, **kw) -> dict:
        try:
            size = path.stat().st_size
        except OSError:
            size = None
        r = {"node": node, "vhost": vhost, "file": display(path), "kind": kind, "size": size, **kw}
        if kw.get("live_bytes") is not None and size is not None:
            r["garbage_bytes"] = max(0, size - kw["live_bytes"] - overhead)
            r["garbage_ratio"] = r["garbage_bytes"] / size if size else 0.0
        return r

    for name, kind in registry.fixed_names("vhost"):
        if (v.path / name).exists():
            yield row(v.path / name, kind)
    for p in v.others:
        yield row(p, registry.other_kind(p, "vhost"))
    counts = {}  # store -> (entries, live entries, live bytes) per file, summed share by share
    for sub in each_share(vs):
        for kind, st in sub.stores.items():
            status, _ = sub.store_status[kind]
            live = status == StoreStatus.LIVE
            got = (
                np.bincount(st.e_file, minlength=len(st.files)),
                np.bincount(st.e_file[live], minlength=len(st.files)),
                np.bincount(st.e_file[live], weights=st.e_total[live], minlength=len(st.files)),
            )
            counts[kind] = (
                st.store,
                st.files,
                [a + b for a, b in zip(counts[kind][2], got)] if kind in counts else got,
            )
    for kind, (st, files, (per_file, live_n, live_b)) in counts.items():
        walked = set()
        for fi, f in enumerate(files):  # .rdq files, and the .rdt files recovery appends to them
            walked.add(f.path)
            yield row(
                f.path,
                f.path.suffix[1:],
                entries=int(per_file[fi]),
                live_entries=int(live_n[fi]),
                live_bytes=int(live_b[fi]),
            )
        for k, numbered in st.numbered.items():  # numbered kinds no column covers (an ignored .rdt)
            if k != "rdq":
                for _, p in numbered:
                    if p not in walked:
                        yield row(p, k)
        for p in st.others:
            yield row(p, registry.other_kind(p, "store"))
    for q in vs.queue_dirs:
        qb = {"queue": q.label, "priority": q.priority}
        stub = os.path.join(q.path, ".queue_name")  # a path made as text: paid per queue dir
        size = len(q.stub) if q.stub is not None else None  # discovery read it whole: no stat again
        if size is None:
            try:
                size = os.stat(stub).st_size
            except OSError as e:
                if e.errno not in _ABSENT:  # what ``Path.exists`` does not take for absence
                    raise
        if size is not None:
            yield {"node": node, "vhost": vhost, "file": display(stub), "kind": "queue_name", "size": size, **qb}
        seen_qs = set()
        indexed = q.qi or q.idx or q.journal is not None  # an empty queue's dir has no index to scan
        for qx in vs.scan_queue(q) if indexed else ():
            if qx.version == 2:
                h = qx.header
                yield {
                    **row(
                        qx.files[0],
                        "qi",
                        header_ok=h.ok,
                        from_seq_id=h.from_seq_id,
                        to_seq_id=h.to_seq_id,
                        entries=h.records,
                        live_entries=h.live,
                    ),
                    **qb,
                }
                path = q.qs.get(qx.segment)
                if path is not None:
                    seen_qs.add(path)
                    qs = vs.qs_files.get(path)
                    used = qs_used(vs, qx)
                    yield {
                        **row(
                            path,
                            "qs",
                            c_qs.HEADER_SIZE,
                            header_ok=qs.header_ok if qs else None,
                            live_entries=len(used[0]),
                            live_bytes=int(used[1].sum()),
                        ),
                        **qb,
                    }
            else:
                live = set(qx.live.tolist())
                for fi, p in enumerate(qx.files):
                    sel = np.flatnonzero(qx.rec.file == fi)
                    yield {
                        **row(
                            p,
                            registry.kind_of(p, "queue"),
                            entries=len(sel),
                            live_entries=sum(1 for i in sel.tolist() if i in live),
                        ),
                        **qb,
                    }
        for number, p in sorted(q.qs.items()) if q.qs else ():
            if p not in seen_qs:  # a .qs whose .qi is gone
                yield {
                    **row(p, "qs", header_ok=vs.qs_files[p].header_ok if vs.qs_files.get(p) else None, live_entries=0),
                    **qb,
                }
        for k, numbered in q.numbered.items():  # numbered kinds the index above does not cover
            if k not in ("qi", "qs", "idx"):
                for _, p in numbered:
                    yield {**row(p, k), **qb}
        for p in q.others:
            yield {**row(p, registry.other_kind(p, "queue")), **qb}


def quorum_file_rows(vs: VhostScan) -> Iterator[dict]:
    """The Ra files: each quorum queue's (config, segments, snapshots) with its vhost; the
    system's own (WAL, names.dets, meta.dets, ...) once per node, with its first vhost."""
    node, vhost = _where(vs)

    def row(path: Path, kind: str, queue=None, vh=vhost, **kw) -> dict:
        try:
            size = path.stat().st_size
        except OSError:
            size = None
        return {"node": node, "vhost": vh, "queue": queue, "file": display(path), "kind": kind, "size": size, **kw}

    for q in vs.quorum_queues:
        srv = next((s for s in q.system.dir.servers if s.uid == q.log.uid), None)
        if srv is None:
            continue
        vh = q.vhost if q.vhost is not None else vhost
        if srv.config is not None:
            yield row(srv.config, "ra_config", q.label, vh)
        for sf in q.system.segments.get(q.log.uid, []):
            seg = sf.seg
            yield row(
                sf.path,
                "ra_segment",
                q.label,
                vh,
                header_ok=seg.header == "ok",
                from_seq_id=seg.range[0] if seg.range else None,
                to_seq_id=seg.range[1] if seg.range else None,
                entries=len(seg),
                live_entries=int((seg.status == 0).sum()) if len(seg) else 0,
            )
        for snap in srv.snapshots:
            for f, kind in ((snap.snapshot, "ra_snapshot"), (snap.indexes, "ra_indexes")):
                if f is not None:
                    yield row(f, kind, q.label, vh)
            for f in snap.others:
                yield row(f, "unknown", q.label, vh)
        for f in srv.compaction:
            yield row(f, registry.kind_of(f, "ra_server") or "ra_compaction_link", q.label, vh)
        for f in srv.others:
            yield row(f, registry.other_kind(f, "ra_server"), q.label, vh)
    if (
        vs.node.vhosts
        and vs.vhost.dir_name == vs.node.vhosts[0].vhost.dir_name
        and vs.share is None
        and vs.only is None
    ):
        for ra in vs.node.node.quorum:
            for _, path in ra.wal:
                yield row(path, "ra_wal", vh=None)
            for path, kind in ((ra.names, "ra_names"), (ra.meta, "ra_meta"), (ra.writers, "ra_writers")):
                if path is not None:
                    yield row(path, kind, vh=None)
            for path in ra.others:
                yield row(path, registry.other_kind(path, "ra_system"), vh=None)


def files_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    rows = Rows("files", vs.options.batch_rows)
    for r in itertools.chain(file_rows(vs), quorum_file_rows(vs)):
        b = rows.add(r)
        if b is not None:
            yield b
    b = rows.flush()
    if b is not None:
        yield b


def findings_batch(findings: list[Finding]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [
            {
                "node": f.node or "",
                "vhost": f.vhost,
                "queue": f.queue,
                "priority": f.priority,
                "file": f.file,
                "offset": f.offset,
                "code": f.code,
                "severity": f.severity,
                "message": f.message,
                "details": json.dumps(f.details, sort_keys=True, default=str) if f.details else None,
            }
            for f in findings
        ],
        schema=SCHEMAS["findings"],
    )


def findings_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    """fsck's checks of this vhost (cqforensics.checks), one row per finding; a vhost too big to
    index at once is checked share by share inside ``check_vhost``, so its unit is the vhost."""
    _, fs = check_vhost(vs)
    if fs:
        yield findings_batch(fs)


def in_shares(
    build: Callable[[VhostScan], Iterator[pa.RecordBatch]],
) -> Callable[[VhostScan], Iterator[pa.RecordBatch]]:
    """``build`` over a vhost too big to index at once (``VhostScan.shares`` > 1) as one pass per
    id share, each holding only its share's store entries and references: the rows are those of
    the whole vhost, each once, in another order. A scan already restricted to a share (a Spark
    unit) is built as it is."""

    def run(vs: VhostScan) -> Iterator[pa.RecordBatch]:
        for sub in each_share(vs):
            yield from build(sub)

    run.__name__ = run.__qualname__ = build.__name__
    return run


#: the tables whose rows each belong to one message-id share: a Spark read splits a big vhost
#: into one unit per share of these
SHARED_TABLES = frozenset({"messages", "index", "acks", "store", "refcounts", "holes"})
#: of those, the ones whose rows need the store's entries: a big vhost is read one pass per share
#: (``in_shares``). ``index`` and ``acks`` need none, and are read a segment at a time in one pass
#: whatever the vhost's size.
INDEXED_TABLES = frozenset({"messages", "store", "refcounts", "holes"})

BUILDERS = {
    "messages": messages_batches,
    "index": index_batches,
    "acks": acks_batches,
    "store": store_batches,
    "refcounts": refcounts_batches,
    "holes": holes_batches,
    "files": files_batches,
    "queues": queues_batches,
    "findings": findings_batches,
    "raft_log": raft_log_batches,
}
BUILDERS = {name: in_shares(build) if name in INDEXED_TABLES else build for name, build in BUILDERS.items()}


# -- streams: rows of the node's stream dirs, with the vhost that owns them ---------------------------


def _i64(v: int) -> int | None:
    """An unsigned 64-bit field of a stream file (an offset, chunk id, epoch, tracking value) in an
    int64 column: null when damage put it above the column's range (the reader's findings say so)."""
    return v if fits(v, pa.int64()) else None


def stream_message_rows(vs: VhostScan, e) -> pa.RecordBatch | None:
    from cqforensics.message.reference import decode_amqp10_entry

    node, vhost = _where(vs)
    by_chunk, amqp091 = e.fate.record_fates(e.scan.records)
    model = vs.node.model
    rows = []
    for r in e.scan.records:
        c = r.chunk
        row = {
            "node": node,
            "vhost": vhost,
            "queue": e.label,
            "file": display(c.file),
            "offset": r.entry_pos,
            "size": None if r.body is None else len(r.body),
            "queue_type": "stream",
            "stream_offset": _i64(r.offset),
            "chunk_id": _i64(c.chunk_id),
            "epoch": _i64(c.epoch),
            "persistent": True,
            "location": "stream",
            "term_format": "amqp10",
            "index_version": None,
        }
        ts_us = c.timestamp * 1000
        row["chunk_timestamp"] = ts_us if fits(ts_us, TS) else None
        if r.body is None:
            row["decode_error"] = r.error
        elif not vs.options.decode:  # the record's bytes as they are (nothing decoded)
            row["body"] = r.body if vs.options.bodies else None
        else:
            try:
                d = (e.fate.views or {}).get(r.offset)
                if d is None:
                    d = decode_amqp10_entry(r.body, model)
                elif isinstance(d, FormatError):
                    raise d
                d = dict(d, properties=dict(d["properties"]))
                props = d["properties"]
                if props.get("timestamp") is not None:
                    props["timestamp"] = props["timestamp"] * 1_000_000
                fit_struct(props, _PROP_TYPE)
                row.update(
                    exchange=d["exchange"] if d["exchange"] is not None else "",
                    routing_keys=d["routing_keys"] or [e.label],
                    properties=props,
                    headers=d["headers"],
                    annotations=d["annotations"],
                    body=d["body"] if vs.options.bodies else None,
                    body_size=len(d["body"]),
                )  # persistent: every record is on disk (the
                # delivery mode a consumer sees is in properties)
            except FormatError as err:
                row["decode_error"] = f"not an AMQP 1.0 message: {err.message}"
        own = by_chunk.get((c.file, c.pos))
        row["survives_restart"] = own is None
        row["drop_reason"] = None if own is None else own.reason
        amqp = amqp091.get(r.offset)
        row["amqp091_drop_reason"] = None if amqp is None else amqp.reason
        rows.append(row)
    return pa.RecordBatch.from_pylist(rows, schema=SCHEMAS["messages"]) if rows else None


def stream_queue_row(vs: VhostScan, e) -> dict:
    node, vhost = _where(vs)
    user = e.scan.records
    chunks, _ = e.fate.record_fates(user)
    kept = sum(1 for r in user if (r.chunk.file, r.chunk.pos) not in chunks)
    return {
        "node": node,
        "vhost": vhost,
        "queue": e.label,
        "queue_dir": display(e.path),
        "name_source": e.name_source,
        "durable_known": e.name_source == "metadata",
        "segments": len(e.scan.segments),
        "messages": len(user),
        "bytes": sum(len(r.body) for r in user if r.body is not None),
        "persistent": len(user),
        "predicted_after_restart": kept,
        "predicted_min": kept,
        "predicted_max": kept,
        "dropped": len(user) - kept,
        "queue_type": "stream",
    }


def stream_tracking_rows(vs: VhostScan, e) -> list[dict]:
    """Every tracking block, and which one per (kind, reference) the next boot holds: osiris
    recover_tracking/1 replays only the last segment the boot keeps (a snapshot resets)."""
    node, vhost = _where(vs)
    kept_files = {f for f, _ in e.fate.kept}
    last_file = max(kept_files) if kept_files else None
    current = {}
    for k, t in enumerate(e.scan.tracking):
        if t.file != last_file or (t.file, t.pos) not in e.fate.kept:
            continue
        if t.source == "snapshot" and (k == 0 or e.scan.tracking[k - 1].pos != t.pos):
            current = {}  # osiris_tracking:init/2: a snapshot replaces the state
        current[(t.kind, t.reference)] = k
    held = set(current.values())
    return [
        {
            "node": node,
            "vhost": vhost,
            "queue": e.label,
            "file": display(t.file),
            "offset": t.pos,
            "chunk_id": _i64(t.chunk_id) if t.source != "snapshot" else None,
            "source": t.source,
            "kind": t.kind,
            "reference": t.reference.decode("utf-8", "replace"),
            "value": _i64(t.value),
            "sequence_chunk_id": _i64(t.chunk_id) if t.kind == "sequence" else None,
            "current": k in held,
        }
        for k, t in enumerate(e.scan.tracking)
    ]


def stream_messages_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    """The ``messages`` rows of the streams ``vs`` lists, a batch per stream."""
    for e in vs.streams:
        b = stream_message_rows(vs, e)
        if b is not None:
            yield b


def with_streams(table: str, build):
    """``build`` followed by the rows of the streams ``vs`` lists (``VhostScan.streams``; the
    findings come with fsck's checks, ``checks.streams``)."""

    def run(vs: VhostScan) -> Iterator[pa.RecordBatch]:
        yield from build(vs)
        if table == "messages":
            yield from stream_messages_batches(vs)
            return
        for e in vs.streams:
            if table == "queues":
                yield pa.RecordBatch.from_pylist([stream_queue_row(vs, e)], schema=SCHEMAS["queues"])
            elif table == "stream_tracking":
                rows = stream_tracking_rows(vs, e)
                if rows:
                    yield pa.RecordBatch.from_pylist(rows, schema=SCHEMAS["stream_tracking"])

    run.__name__ = run.__qualname__ = getattr(build, "__name__", table)
    return run


def _no_rows(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    return iter(())


BUILDERS["stream_tracking"] = _no_rows
#: tables whose rows a read with jobs > 1 may split by ranges of the listing, then the rows that
#: come once per vhost after them: (the ranges' builder, the vhost's last rows)
SPLIT_WITH_TAIL = {
    "messages": (
        in_shares(classic_messages_batches),
        lambda vs: itertools.chain(quorum_messages_batches(vs), stream_messages_batches(vs)),
    )
}
BUILDERS = {
    name: with_streams(name, build) if name in ("messages", "queues", "stream_tracking") else build
    for name, build in BUILDERS.items()
}
