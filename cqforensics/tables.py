"""The data tables as Arrow record batches, built from a ``VhostScan``.

Fixed-size facts go column-wise from numpy arrays; only the ``messages`` table (and store
bodies) loops per message, to slice and decode bodies. Batches are capped by rows and bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from cqforensics import etf, message
from cqforensics.errors import FormatError
from cqforensics.findings import Finding
from cqforensics.grammar import qs as c_qs
from cqforensics.layout import QueueDir
from cqforensics.readers.qs import OK as QS_OK
from cqforensics.scan import (BAD, EMBEDDED, GHOST, ID, KIND_NAMES, LOC_NAMES, NOLOC, QSTORE, SHARED,
                              QueueIndex, VhostScan)
from cqforensics.schema import SCHEMAS

TS = pa.timestamp("us", tz="UTC")


# -- column helpers ----------------------------------------------------------------------------


def repeat(value, n: int, typ=pa.string()) -> pa.Array:
    return pa.repeat(pa.scalar(value, typ), n) if value is not None else pa.nulls(n, typ)


def id_array(ids: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """V16 numpy array -> Arrow binary (null where not ``valid``)."""
    n = len(ids)
    valid = np.ones(n, bool) if valid is None else valid.astype(bool)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.where(valid, 16, 0), out=offsets[1:])
    data = ids[valid].tobytes()
    nulls = int(n - valid.sum())
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes()) if nulls else None
    return pa.Array.from_buffers(pa.binary(), n, [bitmap, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)],
                                 null_count=nulls)


def ts_array(micros: np.ndarray) -> pa.Array:
    """Epoch microseconds (0 = none) -> timestamp[us, UTC] with nulls."""
    return pa.array(micros.astype(np.int64), TS, mask=micros == 0)


def names_array(names: list[str], index: np.ndarray) -> pa.Array:
    if not len(index):
        return pa.array([], pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(index.astype(np.int32)), pa.array(names, pa.string())) \
        .dictionary_decode()


def batch(table: str, columns: dict) -> pa.RecordBatch:
    sch = SCHEMAS[table]
    arrays = []
    for f in sch:
        col = columns[f.name]
        arrays.append(col if isinstance(col, pa.Array) else pa.array(col, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=sch)


class Rows:
    """Accumulates row-wise values for one table and flushes capped RecordBatches."""

    def __init__(self, table: str, max_rows: int, max_bytes: int):
        self.table = table
        self.schema = SCHEMAS[table]
        self.names = self.schema.names
        self.cols = {n: [] for n in self.names}
        self.max_rows, self.max_bytes = max_rows, max_bytes
        self.bytes = 0

    def add(self, row: dict, size: int = 0) -> pa.RecordBatch | None:
        for n in self.names:
            self.cols[n].append(row.get(n))
        self.bytes += size
        if len(self.cols[self.names[0]]) >= self.max_rows or self.bytes >= self.max_bytes:
            return self.flush()
        return None

    def flush(self) -> pa.RecordBatch | None:
        if not self.cols[self.names[0]]:
            return None
        out = pa.RecordBatch.from_arrays([pa.array(self.cols[f.name], f.type) for f in self.schema],
                                         schema=self.schema)
        self.cols = {n: [] for n in self.names}
        self.bytes = 0
        return out


def _where(vs: VhostScan) -> tuple[str, str | None]:
    return vs.node.node.node, vs.vhost.name if vs.vhost.name is not None else vs.vhost.label


# -- index / acks ------------------------------------------------------------------------------


def index_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    node, vhost = _where(vs)
    for qx in vs.queues:
        r = qx.rec
        n = len(r["seq"])
        if not n:
            continue
        loc = r["loc"]
        has_loc = (loc != NOLOC) & np.isin(r["kind"], (0, GHOST, BAD))
        errors = [qx.errors.get(i) for i in range(n)] if qx.errors else None
        cols = {
            "node": repeat(node, n), "vhost": repeat(vhost, n), "queue": repeat(qx.qdir.name, n),
            "priority": repeat(qx.qdir.priority, n, pa.int32()),
            "file": names_array([str(p) for p in qx.files], r["file"]), "offset": pa.array(r["offset"]),
            "index_version": repeat(qx.version, n, pa.int32()),
            "kind": names_array(list(KIND_NAMES), r["kind"]), "seq_id": pa.array(r["seq"]),
            "persistent": pa.array(r["persistent"] == 1, mask=r["persistent"] < 0),
            "location": pa.array([LOC_NAMES.get(int(x)) for x in loc], pa.string(), mask=~has_loc),
            "msg_id": id_array(r["msg_id"], has_loc & (loc == SHARED) | ((r["kind"] == 0) & (qx.version == 1))),
            "store_offset": pa.array(r["store_offset"], mask=~np.isin(loc, (QSTORE, EMBEDDED))),
            "store_size": pa.array(r["store_size"], mask=~np.isin(loc, (QSTORE, EMBEDDED))),
            "size": pa.array(r["size"], mask=~has_loc), "expiry": ts_array(r["expiry"]),
            "status": pa.array(r["status"], pa.int32(), mask=r["status"] < 0),
            "error": pa.array(errors, pa.string()) if errors else pa.nulls(n, pa.string()),
        }
        yield batch("index", cols)


def acks_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    node, vhost = _where(vs)
    for qx in vs.queues:
        if not qx.acks:
            continue
        n = len(qx.acks)
        yield batch("acks", {
            "node": repeat(node, n), "vhost": repeat(vhost, n), "queue": repeat(qx.qdir.name, n),
            "priority": repeat(qx.qdir.priority, n, pa.int32()),
            "file": [str(qx.files[a.file]) for a in qx.acks], "offset": [a.offset for a in qx.acks],
            "seq_id": [a.seq for a in qx.acks], "evidence": [a.evidence for a in qx.acks],
            "msg_id": [a.msg_id for a in qx.acks],
        })


# -- store / refcounts / holes -----------------------------------------------------------------


def store_status(vs: VhostScan, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Per store entry: status code (0 live, 1 orphan, 2 duplicate) and computed refs."""
    st = vs.stores[kind]
    ref_ids, ref_counts, _ = vs.references[kind]
    claimed_ids, claimed_pos = vs.claims[kind]
    n = len(st.e_id)
    status = np.full(n, 2, np.int8)
    refs = np.zeros(n, np.int32)
    if n:
        i = np.searchsorted(ref_ids, st.e_id)
        i = np.minimum(i, max(len(ref_ids) - 1, 0))
        referenced = (ref_ids[i] == st.e_id) if len(ref_ids) else np.zeros(n, bool)
        # the first copy of an unreferenced id is an orphan, further copies duplicates
        order = np.lexsort((st.e_offset, st.e_file, st.e_id))
        first = np.ones(n, bool)
        sid = st.e_id[order]
        first[1:] = sid[1:] != sid[:-1]
        is_first = np.zeros(n, bool)
        is_first[order] = first
        status[~referenced & is_first] = 1
        live = np.zeros(n, bool)
        live[claimed_pos[np.isin(claimed_ids, ref_ids)]] = True
        status[live] = 0
        refs[live] = ref_counts[np.searchsorted(ref_ids, st.e_id[live])]
    return status, refs


STATUS_NAMES = ("live", "orphan", "duplicate", "corrupt")


def store_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    node, vhost = _where(vs)
    bodies = vs.options.bodies
    for kind, st in vs.stores.items():
        status, refs = store_status(vs, kind)
        n = len(st.e_id)
        paths = [str(f.path) for f in st.files]
        step = max(1, vs.options.batch_rows)
        for s in range(0, n, step):
            e = slice(s, min(n, s + step))
            m = e.stop - e.start
            body = None
            if bodies:
                body = [bytes(vs.data(st.files[f].path)[o + 24:o + t - 1])
                        for f, o, t in zip(st.e_file[e], st.e_offset[e], st.e_total[e])]
            yield batch("store", {
                "node": repeat(node, m), "vhost": repeat(vhost, m), "store": repeat(kind, m),
                "file": names_array(paths, st.e_file[e]), "offset": pa.array(st.e_offset[e]),
                "total_size": pa.array(st.e_total[e]), "msg_id": id_array(st.e_id[e]),
                "marker_ok": repeat(True, m, pa.bool_()),
                "status": names_array(list(STATUS_NAMES), status[e]), "refs": pa.array(refs[e]),
                "body": pa.array(body, pa.binary()) if bodies else pa.nulls(m, pa.binary()),
            })
        if st.bad:
            m = len(st.bad)
            yield batch("store", {
                "node": repeat(node, m), "vhost": repeat(vhost, m), "store": repeat(kind, m),
                "file": [paths[f] for f, _, _, _ in st.bad], "offset": [o for _, o, _, _ in st.bad],
                "total_size": [t for _, _, t, _ in st.bad], "msg_id": [i for _, _, _, i in st.bad],
                "marker_ok": repeat(False, m, pa.bool_()), "status": repeat("corrupt", m),
                "refs": repeat(0, m, pa.int32()),
                "body": [bytes(vs.data(st.files[f].path)[o + 24:o + t - 1]) for f, o, t, _ in st.bad] if bodies
                else pa.nulls(m, pa.binary()),
            })


REFCOUNT_STATUS = ("ok", "duplicate", "orphan", "mismatch", "missing")


def refcounts_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    node, vhost = _where(vs)
    for kind, st in vs.stores.items():
        ref_ids, ref_counts, ref_queues = vs.references[kind]
        all_ids = np.unique(np.concatenate([st.e_id, ref_ids])) if len(st.e_id) or len(ref_ids) else np.zeros(0, ID)
        n = len(all_ids)
        if not n:
            continue
        copies = np.zeros(n, np.int32)
        if len(st.e_id):
            u, c = np.unique(st.e_id, return_counts=True)
            copies[np.searchsorted(all_ids, u)] = c
        computed = np.zeros(n, np.int32)
        queues = [[] for _ in range(n)]
        if len(ref_ids):
            pos = np.searchsorted(all_ids, ref_ids)
            computed[pos] = ref_counts
            for p, q in zip(pos, ref_queues):
                queues[p] = q
        claimed_ids, claimed_pos = vs.claims[kind]
        where_file = np.full(n, -1, np.int32)
        where_off = np.zeros(n, np.int64)
        if len(claimed_ids):
            p = np.searchsorted(all_ids, claimed_ids)
            where_file[p] = st.e_file[claimed_pos]
            where_off[p] = st.e_offset[claimed_pos]
        recorded = None
        if st.recorded is not None:
            rec = st.recorded
            recorded = np.array([rec[b][0] if b in rec else 0 for b in (x.tobytes() for x in all_ids)], np.int32)
        status = np.zeros(n, np.int8)
        status[copies > 1] = 1
        status[(computed == 0) & (copies > 0)] = 2
        if recorded is not None:
            status[recorded != computed] = 3
        status[(computed > 0) & (where_file < 0)] = 4
        paths = [str(f.path) for f in st.files] + [None]
        yield batch("refcounts", {
            "node": repeat(node, n), "vhost": repeat(vhost, n), "store": repeat(kind, n),
            "file": [paths[f] for f in where_file], "offset": pa.array(where_off, mask=where_file < 0),
            "msg_id": id_array(all_ids), "copies": pa.array(copies), "computed_refs": pa.array(computed),
            "recorded_refs": pa.array(recorded, pa.int32()) if recorded is not None else pa.nulls(n, pa.int32()),
            "queues": queues, "status": names_array(list(REFCOUNT_STATUS), status),
        })


def holes_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    node, vhost = _where(vs)
    rows = Rows("holes", vs.options.batch_rows, 1 << 62)
    for kind, st in vs.stores.items():
        status, _ = store_status(vs, kind)
        for f in st.files:
            for h in f.holes:
                b = rows.add({"node": node, "vhost": vhost, "store": kind, "file": str(f.path), "offset": h.offset,
                              "length": h.length, "kind": h.kind})
                if b is not None:
                    yield b
        for i in np.flatnonzero(status != 0):
            b = rows.add({"node": node, "vhost": vhost, "store": kind, "file": str(st.files[st.e_file[i]].path),
                          "offset": int(st.e_offset[i]), "length": int(st.e_total[i]),
                          "kind": "orphan" if status[i] == 1 else "stale"})
            if b is not None:
                yield b
    for qx in vs.queues:
        for path, start, length, kind in qs_holes(vs, qx):
            b = rows.add({"node": node, "vhost": vhost, "queue": qx.qdir.label, "store": "queue", "file": str(path),
                          "offset": start, "length": length, "kind": kind})
            if b is not None:
                yield b
    b = rows.flush()
    if b is not None:
        yield b


def qs_holes(vs: VhostScan, qx: QueueIndex):
    """Byte ranges of a queue's .qs files that no live index entry uses."""
    if qx.version != 2:
        return
    r = qx.rec
    used: dict[Path, list] = {}
    for i in qx.live:
        if r["loc"][i] == QSTORE:
            qs = vs.qs_for(qx, int(i))
            if qs is not None:
                used.setdefault(qs.path, []).append((int(r["store_offset"][i]),
                                                     c_qs.ENTRY_HEADER_SIZE + int(r["store_size"][i])))
    for number, path in sorted(qx.qdir.qs.items()):
        qs = vs.qs_files.get(path)
        if qs is None:
            continue
        o = c_qs.HEADER_SIZE
        for start, length in sorted(used.get(path, [])) + [(qs.size, 0)]:
            if start > o:
                gap = bytes(qs.data[o:start])
                yield path, o, start - o, "zeroed" if not any(gap) else "stale"
            o = max(o, start + length)


# -- messages ------------------------------------------------------------------------------------


def _body_of(vs: VhostScan, qx: QueueIndex, i: int):
    """(raw term bytes or None, store file, store offset, qs status, problem) for live record i."""
    r = qx.rec
    loc = r["loc"][i]
    if loc == SHARED:
        kind = "persistent" if r["persistent"][i] == 1 else "transient"
        st = vs.stores.get(kind)
        if st is None:
            return None, None, None, None, "no shared store"
        pos = vs.shared_copy(kind, r["msg_id"][i])
        if pos is None:
            pos = vs.any_copy(kind, r["msg_id"][i])
        if pos is None:
            return None, None, None, None, "body not found in the shared store"
        f = st.files[st.e_file[pos]]
        o, t = int(st.e_offset[pos]), int(st.e_total[pos])
        return vs.data(f.path)[o + 24:o + t - 1], str(f.path), o, None, None
    if loc == QSTORE:
        qs = vs.qs_for(qx, i)
        off, size = int(r["store_offset"][i]), int(r["store_size"][i])
        if qs is None:
            return None, None, off, "missing_file", "the .qs segment is missing"
        status, _ = qs.check(off, size)
        if status in ("bad_header", "out_of_range"):
            return None, str(qs.path), off, status, f".qs entry unreadable ({status})"
        return qs.term(off, size), str(qs.path), off, status, None
    if loc == EMBEDDED:
        path = qx.files[int(r["file"][i])]
        off, size = int(r["store_offset"][i]), int(r["store_size"][i])
        return vs.data(path)[off:off + size], str(path), off, None, None
    return None, None, None, None, None


def message_rows(vs: VhostScan) -> Iterator[dict]:
    """Live index entries, joined to their bodies and decoded, in delivery-listing order."""
    node, vhost = _where(vs)
    decode, bodies = vs.options.decode, vs.options.bodies
    for qx in vs.queues:
        r = qx.rec
        files = [str(p) for p in qx.files]
        for i in qx.live:
            i = int(i)
            raw, store_file, store_offset, qs_status, _ = _body_of(vs, qx, i)
            fate = vs.fate(qx, i, qs_status)
            loc = int(r["loc"][i])
            row = {
                "node": node, "vhost": vhost, "queue": qx.qdir.name, "priority": qx.qdir.priority,
                "file": files[int(r["file"][i])], "offset": int(r["offset"][i]), "seq_id": int(r["seq"][i]),
                "msg_id": r["msg_id"][i].tobytes() if loc == SHARED or qx.version == 1 else None,
                "index_version": qx.version, "persistent": bool(r["persistent"][i] == 1),
                "delivered": None if r["delivered"][i] < 0 else bool(r["delivered"][i]),
                "location": LOC_NAMES.get(loc), "store_file": store_file, "store_offset": store_offset,
                "size": int(r["size"][i]), "expiry": int(r["expiry"][i]) or None,
                "survives_restart": fate is None, "drop_reason": fate, "decode_error": None,
            }
            if raw is not None and (decode or bodies):
                try:
                    if not decode:
                        raise _RawOnly
                    msg = message.decode_stored(raw)
                    row.update(exchange=msg["exchange"], routing_keys=msg["routing_keys"],
                               properties=_props_row(msg), headers=msg["headers"],
                               annotations=msg["annotations"], term_format=msg["term_format"],
                               body=msg["body"] if bodies else None, body_size=len(msg["body"]))
                    if row["msg_id"] is None:
                        row["msg_id"] = msg["msg_id"]
                    elif msg["msg_id"] is not None and msg["msg_id"] != row["msg_id"]:
                        row["decode_error"] = "the stored term's message id differs from the index's"
                except _RawOnly:
                    pass
                except (FormatError, etf.EtfError, ValueError, TypeError, KeyError, IndexError,
                        AttributeError) as e:
                    row["decode_error"] = f"{type(e).__name__}: {e}"[:500]
            yield row


class _RawOnly(Exception):
    pass


def _props_row(msg: dict) -> dict:
    p = dict(msg["properties"])
    p["timestamp"] = msg["timestamp_ms"] * 1000 if msg["timestamp_ms"] is not None else None
    return p


def messages_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    rows = Rows("messages", vs.options.batch_rows, vs.options.batch_bytes)
    for row in message_rows(vs):
        b = rows.add(row, len(row.get("body") or b""))
        if b is not None:
            yield b
    b = rows.flush()
    if b is not None:
        yield b


# -- files / queues / findings ---------------------------------------------------------------------


def queue_summaries(vs: VhostScan) -> list[dict]:
    out = []
    for qx in vs.queues:
        r = qx.rec
        live = qx.live
        fates = []
        for i in live:
            i = int(i)
            qs_status = None
            if r["loc"][i] == QSTORE:
                qs = vs.qs_for(qx, i)
                qs_status = "missing_file" if qs is None else qs.check(int(r["store_offset"][i]),
                                                                       int(r["store_size"][i]))[0]
            fates.append(vs.fate(qx, i, qs_status))
        kept = sum(1 for f in fates if f is None)
        drops: dict[str, int] = {}
        for f in fates:
            if f is not None:
                drops[f] = drops.get(f, 0) + 1
        out.append({"qx": qx, "messages": len(live), "bytes": int(r["size"][live].sum()) if len(live) else 0,
                    "persistent": int((r["persistent"][live] == 1).sum()), "kept": kept, "drops": drops})
    return out


def queues_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    node, vhost = _where(vs)
    rows = []
    for s in queue_summaries(vs):
        qx = s["qx"]
        q: QueueDir = qx.qdir
        rows.append({"node": node, "vhost": vhost, "queue": q.label, "priority": q.priority,
                     "queue_dir": str(q.path), "name_source": q.name_source, "durable_known": vs.queue_known(q),
                     "index_version": qx.version, "segments": len(q.qi) + len(q.idx), "messages": s["messages"],
                     "bytes": s["bytes"], "persistent": s["persistent"], "predicted_after_restart": s["kept"],
                     "dropped": s["messages"] - s["kept"]})
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=SCHEMAS["queues"])


def file_rows(vs: VhostScan) -> Iterator[dict]:
    node, vhost = _where(vs)
    v = vs.vhost
    base = {"node": node, "vhost": vhost}

    def row(path: Path, kind: str, **kw) -> dict:
        try:
            size = path.stat().st_size
        except OSError:
            size = None
        r = {**base, "file": str(path), "kind": kind, "size": size, **kw}
        if kw.get("live_bytes") is not None and size is not None:
            r.setdefault("garbage_bytes", max(0, size - kw["live_bytes"] - kw.pop("_overhead", 0)))
            r["garbage_ratio"] = r["garbage_bytes"] / size if size else 0.0
        r.pop("_overhead", None)
        return r

    for name in (".vhost", ".config", "recovery.dets"):
        if (v.path / name).exists():
            yield row(v.path / name, {".vhost": "vhost", ".config": "config", "recovery.dets": "dets"}[name])
    for p in v.others:
        yield row(p, "unknown")
    for kind, st in vs.stores.items():
        status, _ = store_status(vs, kind)
        for fi, f in enumerate(st.files):
            sel = st.e_file == fi
            live = sel & (status == 0)
            yield row(f.path, "rdq", entries=int(sel.sum()), live_entries=int(live.sum()),
                      live_bytes=int(st.e_total[live].sum()), header_ok=None)
        for _, p in st.store.rdt:
            yield row(p, "rdt")
        for p in st.store.others:
            k = {"clean.dot": "dot", "file_summary.ets": "ets", "msg_store_index.ets": "ets"}.get(p.name, "unknown")
            yield row(p, k)
    for qx in vs.queues:
        q = qx.qdir
        qb = {"queue": q.label, "priority": q.priority}
        if (q.path / ".queue_name").exists():
            yield {**row(q.path / ".queue_name", "queue_name"), **qb}
        for fi, p in enumerate(qx.files):
            sel = qx.rec["file"] == fi
            live = np.isin(np.flatnonzero(sel), qx.live)
            if qx.version == 2:
                ok, frm, to, entries, nlive = qx.segment_info.get(fi, (None, None, None, 0, 0))
                yield {**row(p, "qi", header_ok=ok, from_seq_id=frm, to_seq_id=to, entries=entries,
                             live_entries=nlive), **qb}
            else:
                kind = "jif" if p.name == "journal.jif" else "idx"
                yield {**row(p, kind, entries=int(sel.sum()), live_entries=int(live.sum())), **qb}
        if qx.version == 2:
            used = {}
            for i in qx.live:
                if qx.rec["loc"][i] == QSTORE:
                    qs = vs.qs_for(qx, int(i))
                    if qs is not None:
                        u = used.setdefault(qs.path, [0, 0])
                        u[0] += 1
                        u[1] += c_qs.ENTRY_HEADER_SIZE + int(qx.rec["store_size"][i])
            for number, p in sorted(q.qs.items()):
                qs = vs.qs_files.get(p)
                n, b = used.get(p, [0, 0])
                yield {**row(p, "qs", header_ok=qs.header_ok if qs else None, live_entries=n, live_bytes=b,
                             _overhead=c_qs.HEADER_SIZE), **qb}
        for p in q.others:
            yield {**row(p, "unknown"), **qb}


def files_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    rows = list(file_rows(vs))
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=SCHEMAS["files"])


def reader_findings(vs: VhostScan) -> list[Finding]:
    """What the readers met while decoding this vhost (fsck adds its checks on top)."""
    node, vhost = _where(vs)
    out = []
    for p in vs.vhost.problems:
        out.append(Finding(p.code, p.message, str(p.path), p.offset))
    for qx in vs.queues:
        for f in qx.findings:
            f.queue, f.priority = qx.qdir.name, qx.qdir.priority
            out.append(f)
    for kind, st in vs.stores.items():
        for f in st.files:
            for h in f.holes:
                if h.kind == "truncated_tail":
                    out.append(Finding("rdq-truncated", f"file ends inside an entry ({h.length} bytes)",
                                       str(f.path), h.offset, details={"store": kind, "length": h.length}))
                elif h.kind == "garbage":
                    out.append(Finding("rdq-garbage", f"{h.length} bytes hold no valid entry", str(f.path),
                                       h.offset, details={"store": kind, "length": h.length}))
    for f in out:
        f.node, f.vhost = node, vhost
    return out


def findings_batch(findings: list[Finding]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"node": f.node or "", "vhost": f.vhost, "queue": f.queue, "priority": f.priority, "file": f.file,
          "offset": f.offset, "code": f.code, "severity": f.severity, "message": f.message,
          "details": json.dumps(f.details, sort_keys=True, default=str) if f.details else None}
         for f in findings], schema=SCHEMAS["findings"])


def findings_batches(vs: VhostScan) -> Iterator[pa.RecordBatch]:
    fs = reader_findings(vs)
    if fs:
        yield findings_batch(fs)


BUILDERS = {
    "messages": messages_batches, "index": index_batches, "acks": acks_batches, "store": store_batches,
    "refcounts": refcounts_batches, "holes": holes_batches, "files": files_batches, "queues": queues_batches,
    "findings": findings_batches,
}
