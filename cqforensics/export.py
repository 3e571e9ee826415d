"""Export recovered messages (properties, typed headers, bodies) as JSON lines or Parquet.

Rows are the ``messages`` table plus a ``source`` column: ``index`` (held by a queue index),
and with ``everything``: ``orphan``/``duplicate`` (shared-store entries no index holds: acked
messages still on disk, compaction leftovers) and ``ghost`` (v2 slots a dirty recovery dropped
whose body is still readable). As SQLite's ``.recover`` warns: acked and deleted messages come
back this way, which is the point in forensics and a hazard when republishing.

The output dir must not exist or be empty (``force``: it may, and DIR/messages.<format> is
replaced), and may not lie inside an input (``cqforensics.outputs.check_output``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from cqforensics import driver, fastpath
from cqforensics.model.options import make_options
from cqforensics.outputs import check_output
from cqforensics.errors import OperationalError, UsageError, display
from cqforensics.codes import AckEvidence, Location, StoreStatus
from cqforensics.model.vhost import VhostScan
from cqforensics.readers import qs as r_qs
from cqforensics.schema import SCHEMAS
from cqforensics.tables import messages_batches

SCHEMA = SCHEMAS["messages"].append(pa.field("source", pa.string(), False))


def _extra_rows(vs: VhostScan) -> Iterator[dict]:
    """Readable bodies no index holds: store orphans/duplicates and v2 ghosts."""
    node, vhost = display(vs.node.node.node), display(vs.vhost.name)
    for kind, st in vs.stores.items():
        status, _ = vs.store_status[kind]
        for i in np.flatnonzero(status != StoreStatus.LIVE):
            path, start, length = st.term_span(i)
            yield _row(node, vhost, None, None, display(path), int(st.e_offset[i]), vs.bodies.read(path, start, length),
                       "orphan" if status[i] == StoreStatus.ORPHAN else "duplicate", st.e_id[i].tobytes(),
                       "shared_store")
    for qx in vs.chunks():
        a = qx.acks
        for k in np.flatnonzero(a.evidence == AckEvidence.V2_DROPPED_BY_RECOVERY):
            off = int(a.offset[k])
            i = int(np.flatnonzero(qx.rec.offset == off)[0])
            r = qx.rec
            raw, where = None, None
            if r.loc[i] == Location.QUEUE_STORE and qx.qs_path is not None:
                path, off = qx.qs_path, int(r.store_offset[i])
                raw, where = vs.bodies.read(path, *r_qs.term_span(off, int(r.store_size[i]))), (display(path), off)
            elif r.loc[i] == Location.SHARED_STORE and "persistent" in vs.stores:
                st = vs.stores["persistent"]
                _, first = st.locate(r.msg_id[i:i + 1])
                if first[0] >= 0:
                    e = int(first[0])
                    path, start, length = st.term_span(e)
                    raw, where = vs.bodies.read(path, start, length), (display(path), int(st.e_offset[e]))
            if raw is not None:
                yield _row(node, vhost, qx.qdir.name, qx.qdir.priority, where[0], where[1], raw, "ghost",
                           r.msg_id[i].tobytes() if r.loc[i] == Location.SHARED_STORE else None,
                           "shared_store" if r.loc[i] == Location.SHARED_STORE else "queue_store", seq=int(r.seq[i]))


def _row(node, vhost, queue, priority, file, offset, raw, source, msg_id, location, seq=None) -> dict:
    row = {"node": node, "vhost": vhost, "queue": queue, "priority": priority, "file": file, "offset": offset,
           "seq_id": seq, "msg_id": msg_id, "location": location, "store_file": file, "store_offset": offset,
           "survives_restart": False, "drop_reason": "not_in_any_index", "source": source}
    try:
        m = fastpath.decode(raw)
    except Exception as e:  # still exported: the raw term is evidence
        row["decode_error"] = f"{type(e).__name__}: {e}"[:300]
        return row
    props = dict(m["properties"])
    props["timestamp"] = m["timestamp_ms"] * 1000 if m["timestamp_ms"] is not None else None
    row.update(exchange=m["exchange"], routing_keys=m["routing_keys"], properties=props, headers=m["headers"],
               annotations=m["annotations"], body=m["body"], body_size=len(m["body"]), term_format=m["term_format"])
    if msg_id is None:
        row["msg_id"] = m["msg_id"]
    return row


def export_batches(paths, everything: bool = False, **options) -> Iterator[pa.RecordBatch]:
    opts = make_options(**options)

    def build(vs: VhostScan) -> Iterator[pa.RecordBatch]:
        for b in messages_batches(vs):
            yield pa.RecordBatch.from_arrays(b.columns + [pa.repeat(pa.scalar("index"), b.num_rows)], schema=SCHEMA)
        if everything:
            rows = list(_extra_rows(vs))
            for k in range(0, len(rows), opts.batch_rows):
                yield pa.RecordBatch.from_pylist(rows[k:k + opts.batch_rows], schema=SCHEMA)

    yield from driver.read("messages", opts, paths=paths, build=build)  # the one read driver


def _jsonl_line(row: dict) -> str:
    row = dict(row)
    if row.get("body") is not None:
        row["body_base64"] = base64.b64encode(row.pop("body")).decode()
    else:
        row.pop("body", None)
    if row.get("msg_id") is not None:
        row["msg_id"] = row["msg_id"].hex()
    for k in ("headers", "annotations"):
        if row.get(k):
            row[k] = json.loads(row[k])
    for k in ("expiry",):
        if row.get(k) is not None:
            row[k] = row[k].isoformat()
    props = row.get("properties")
    if props and props.get("timestamp") is not None:
        props["timestamp"] = props["timestamp"].isoformat()
    return json.dumps(row, ensure_ascii=False, sort_keys=True)


def export(paths, fmt: str, out: Path | str, everything: bool = False, force: bool = False, **options) -> dict:
    """Write DIR/messages.jsonl or DIR/messages.parquet; returns counts per source. ``force``:
    DIR may exist and hold files (an existing messages file is replaced)."""
    if fmt not in ("jsonl", "parquet"):
        raise UsageError(f"unknown format {fmt!r}: jsonl or parquet")
    out = check_output(out, paths, directory=True, force=force)
    target = out / f"messages.{fmt}"
    if target.is_dir():
        raise UsageError(f"{target}: is a directory (the output is a file)")
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OperationalError(f"{out}: cannot create: {e.strerror}") from e
    counts: dict[str, int] = {}
    tmp = target.with_suffix(target.suffix + ".partial")
    writer = None
    try:
        with open(tmp, "w") if fmt == "jsonl" else open(tmp, "wb") as fh:
            if fmt == "parquet":
                import pyarrow.parquet as pq

                writer = pq.ParquetWriter(fh, SCHEMA)
            for b in export_batches(paths, everything, **options):
                for s in b.column("source").to_pylist():
                    counts[s] = counts.get(s, 0) + 1
                if writer is not None:
                    writer.write_batch(b)
                else:
                    for row in b.to_pylist():
                        fh.write(_jsonl_line(row) + "\n")
            if writer is not None:
                writer.close()
        tmp.replace(target)  # a half-written export never has the final name
    finally:
        tmp.unlink(missing_ok=True)  # a failed export leaves nothing behind
        if created and not target.exists():
            try:
                out.rmdir()
            except OSError:
                pass
    return {"file": display(target), "rows": counts}
