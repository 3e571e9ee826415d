"""Export recovered messages (properties, typed headers, bodies) as JSON lines or Parquet, and
``find`` messages by id or body text.

Rows are the ``messages`` table plus a ``source`` column: ``index`` (held by a queue index),
``stream`` (a record of a stream, every record on disk: ``survives_restart`` and
``amqp091_drop_reason`` say which a consumer is served),
and with ``everything``: ``ghost`` (v2 slots a dirty recovery dropped whose body is still
readable), ``orphan``/``duplicate``/``corrupt`` (shared-store entries no index holds: acked
messages still on disk, compaction leftovers, entries whose bytes fail a check). Each stored
entry is emitted once: an entry an index row already carries (same file and offset) is not
emitted again as a ghost or store row, and a ghost's entry not again as a store row. As
SQLite's ``.recover`` warns: acked and deleted messages come back this way, which is the point
in forensics and a hazard when republishing.

Memory: rows are streamed, vhost by vhost, in batches of ``batch_rows`` rows / about
``batch_bytes`` body bytes (orphans too); what is kept per vhost is the (file, offset) of the
stored entries already emitted. Parquet is written in row groups of ``ROW_GROUP_ROWS`` rows or
about ``ROW_GROUP_BYTES`` bytes (``ParquetSink``), not one per batch.

The output dir is written as every output dir is (``cqforensics.output.guard``: the rule and
``Staging``): built as ``.<DIR>.cqf-partial-<pid>`` beside DIR and renamed into place when
complete, with its manifest; an error or Ctrl-C removes the partial dir, and one left by a killed
run (its process gone) is removed by the next run for the same DIR. DIR must not exist or be
empty; with ``force`` it may be a previous output of cqforensics, replaced whole at commit. It may
never be or lie inside an input, nor inside RabbitMQ data.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from cqforensics.base import jsonout
from cqforensics.base.enums import AckEvidence, Location, StoreStatus
from cqforensics.base.errors import FormatError, OperationalError, UsageError, display
from cqforensics.base.schema import SCHEMAS
from cqforensics.message import fast as fastpath
from cqforensics.model.options import make_options
from cqforensics.model.vhost import NodeScan, VhostScan
from cqforensics.output import provenance
from cqforensics.output.guard import PARTIAL, Staging, check_output
from cqforensics.read import driver
from cqforensics.readers import qs as r_qs
from cqforensics.tables.builders import classic_messages_batches, quorum_messages_batches, stream_messages_batches

log = logging.getLogger(__name__)

SCHEMA = SCHEMAS["messages"].append(pa.field("source", pa.string(), False))

#: a Parquet row group holds this many rows at most, or about this many bytes
ROW_GROUP_ROWS = 64 * 1024
ROW_GROUP_BYTES = 64 << 20

_STORE_SOURCE = {StoreStatus.ORPHAN: "orphan", StoreStatus.DUPLICATE: "duplicate", StoreStatus.CORRUPT: "corrupt"}


# -- writing files: in sized row groups ----------------------------------------------------------


def row_bytes(batch: pa.RecordBatch) -> np.ndarray:
    """The bytes of each row's variable-width values (its top-level binary and string columns:
    bodies, typed JSON, names): what an output's row groups are measured by, the same however
    the rows come batched."""
    import pyarrow.compute as pc

    total = np.zeros(batch.num_rows, np.int64)
    for col in batch.columns:
        t = col.type
        if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t):
            total += pc.fill_null(pc.binary_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    return total


class ParquetSink:
    """Batches to a Parquet file in row groups of ``rows`` rows at most, or about ``nbytes``
    bytes of variable-width values (``row_bytes``; a group ends at the row that reaches it):
    rows are gathered until either is reached, then written as one row group (a reader's cost
    grows with the number of row groups, not with batch size). The groups depend on the rows
    only, never on how they came batched (``-j N`` cuts batches elsewhere than ``-j 1``)."""

    def __init__(self, where, schema: pa.Schema, rows: int | None = None, nbytes: int | None = None):
        import pyarrow.parquet as pq

        self.schema = schema
        self.rows, self.nbytes = rows or ROW_GROUP_ROWS, nbytes or ROW_GROUP_BYTES
        self.writer = pq.ParquetWriter(where, schema)
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = self.pending_bytes = 0
        self.num_rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        self.num_rows += batch.num_rows
        cum = np.cumsum(row_bytes(batch))
        start = 0
        while start < batch.num_rows:
            done = int(cum[start - 1]) if start else 0
            # the rows up to the one that fills the group (by bytes), at most the rows it has room for
            reach = int(np.searchsorted(cum, done + self.nbytes - self.pending_bytes, side="left")) + 1
            end = min(batch.num_rows, start + self.rows - self.pending_rows, max(reach, start + 1))
            self.pending.append(batch.slice(start, end - start))
            self.pending_rows += end - start
            self.pending_bytes += int(cum[end - 1]) - done
            start = end
            if self.pending_rows >= self.rows or self.pending_bytes >= self.nbytes:
                self.flush()

    def flush(self) -> None:
        """Write what is gathered as one row group."""
        if self.pending:
            self.writer.write_table(pa.Table.from_batches(self.pending, schema=self.schema), row_group_size=self.rows)
            self.pending, self.pending_rows, self.pending_bytes = [], 0, 0

    def close(self) -> None:
        self.flush()
        self.writer.close()

    def __enter__(self) -> ParquetSink:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # the partial file is removed by its owner; close without writing what is pending
            with contextlib.suppress(Exception):
                self.writer.close()


# -- rows no index holds --------------------------------------------------------------------------


def _ghost_rows(vs: VhostScan, node: str, vhost: str | None) -> Iterator[dict]:
    """v2 slots a dirty recovery dropped whose body is still readable (``ghost``)."""
    for qx in vs.chunks():
        a, r = qx.acks, qx.rec
        ghosts = np.flatnonzero(a.evidence == AckEvidence.V2_DROPPED_BY_RECOVERY)
        if not len(ghosts):
            continue
        at = {int(o): i for i, o in enumerate(r.offset)}
        for k in ghosts:
            i = at.get(int(a.offset[k]))
            if i is None:
                continue
            raw, where = None, None
            if r.loc[i] == Location.QUEUE_STORE and qx.qs_path is not None:
                path, off = qx.qs_path, int(r.store_offset[i])
                raw, where = vs.bodies.read(path, *r_qs.term_span(off, int(r.store_size[i]))), (display(path), off)
            elif r.loc[i] == Location.SHARED_STORE and "persistent" in vs.stores:
                st = vs.stores["persistent"]
                _, first = st.locate(r.msg_id[i : i + 1])
                if first[0] >= 0:
                    e = int(first[0])
                    path, start, length = st.term_span(e)
                    raw, where = vs.bodies.read(path, start, length), (display(path), int(st.e_offset[e]))
            if raw is not None:
                yield _row(
                    node,
                    vhost,
                    qx.qdir.name,
                    qx.qdir.priority,
                    where[0],
                    where[1],
                    raw,
                    "ghost",
                    r.msg_id[i].tobytes() if r.loc[i] == Location.SHARED_STORE else None,
                    "shared_store" if r.loc[i] == Location.SHARED_STORE else "queue_store",
                    seq=int(r.seq[i]),
                )


def _store_rows(vs: VhostScan, node: str, vhost: str | None) -> Iterator[dict]:
    """Shared-store entries no index holds: orphans, duplicates, corrupt copies (one row per
    entry, bodies read as they are yielded)."""
    for kind, st in vs.stores.items():
        status, _ = vs.store_status[kind]
        for i in np.flatnonzero(status != StoreStatus.LIVE):
            path, start, length = st.term_span(i)
            yield _row(
                node,
                vhost,
                None,
                None,
                display(path),
                int(st.e_offset[i]),
                vs.bodies.read(path, start, length),
                _STORE_SOURCE.get(int(status[i]), "duplicate"),
                st.e_id[i].tobytes(),
                "shared_store",
            )


def _quorum_log_rows(vs: VhostScan, node: str, vhost: str | None, seen: set) -> Iterator[dict]:
    """Messages a quorum queue's log still holds that its state no longer does (``raft_log``:
    consumed, acked or purged, until Ra truncates the log below its snapshot): every enqueue
    entry copy, recovered or not, whose bytes no row emitted yet."""
    from cqforensics.message import reference as message
    from cqforensics.model import quorum as m_quorum

    bodies = vs.node._quorum_bodies if vs.quorum_queues else None
    for q in vs.quorum_queues:
        if vs.quorum_names is not None and q.name not in vs.quorum_names:
            continue
        entries = q.file_entries()
        for idx in sorted(entries):
            e = entries[idx]
            key = (display(e.file), e.data_offset)
            if key in seen:
                continue
            try:
                cmd = m_quorum.decode_log_entry(e.data(bodies)).command
            except FormatError:
                continue
            if cmd is None or cmd.name not in ("enqueue", "requeue") or cmd.msg is None:
                continue
            row = {
                "node": node,
                "vhost": q.vhost if q.vhost is not None else vhost,
                "queue": q.label,
                "priority": None,
                "file": display(e.file),
                "offset": e.offset,
                "seq_id": None,
                "location": e.source,
                "store_file": display(e.file),
                "store_offset": e.data_offset,
                "survives_restart": False,
                "drop_reason": "not_in_any_index",
                "source": "raft_log",
                "queue_type": "quorum",
                "raft_index": idx,
                "raft_term": e.term,
            }
            try:
                m = message.normalise_checked(cmd.msg)
            except FormatError as err:
                row["decode_error"] = err.message
                yield row
                continue
            props = dict(m["properties"])
            props["timestamp"] = m["timestamp_ms"] * 1000 if m["timestamp_ms"] is not None else None
            mid = m["msg_id"]
            row.update(
                msg_id=mid if isinstance(mid, bytes) and len(mid) == 16 else None,
                exchange=m["exchange"],
                routing_keys=m["routing_keys"],
                properties=props,
                headers=m["headers"],
                annotations=m["annotations"],
                body=m["body"],
                body_size=len(m["body"]),
                term_format=m["term_format"],
            )
            yield row


def _row(node, vhost, queue, priority, file, offset, raw, source, msg_id, location, seq=None) -> dict:
    row = {
        "node": node,
        "vhost": vhost,
        "queue": queue,
        "priority": priority,
        "file": file,
        "offset": offset,
        "seq_id": seq,
        "msg_id": msg_id,
        "location": location,
        "store_file": file,
        "store_offset": offset,
        "survives_restart": False,
        "drop_reason": "not_in_any_index",
        "source": source,
    }
    try:
        m = fastpath.decode(raw)
    except Exception as e:  # still exported: the raw term is evidence
        row["decode_error"] = f"{type(e).__name__}: {e}"[:300]
        return row
    props = dict(m["properties"])
    props["timestamp"] = m["timestamp_ms"] * 1000 if m["timestamp_ms"] is not None else None
    row.update(
        exchange=m["exchange"],
        routing_keys=m["routing_keys"],
        properties=props,
        headers=m["headers"],
        annotations=m["annotations"],
        body=m["body"],
        body_size=len(m["body"]),
        term_format=m["term_format"],
    )
    if msg_id is None:
        row["msg_id"] = m["msg_id"]
    return row


def _batched(rows: Iterator[dict], max_rows: int, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """Row dicts as batches of ``max_rows`` rows or about ``max_bytes`` body bytes."""
    buf, size = [], 0
    for row in rows:
        buf.append(row)
        size += len(row.get("body") or b"")
        if len(buf) >= max_rows or size >= max_bytes:
            yield pa.RecordBatch.from_pylist(buf, schema=SCHEMA)
            buf, size = [], 0
    if buf:
        yield pa.RecordBatch.from_pylist(buf, schema=SCHEMA)


def export_batches(
    paths, everything: bool = False, vhosts=None, queues=None, progress=None, render=None, **options
) -> Iterator[pa.RecordBatch]:
    """The export rows (the ``messages`` schema plus ``source``) as batches; ``vhosts``/``queues``
    restrict them by name (a queue restriction leaves out the store rows, which belong to no
    queue; a name that matches nothing is a ``UsageError``). ``progress``: a ``driver.Progress``
    or a display ``(text, done, total)``."""
    opts = make_options(**options)
    progress = driver.Progress.of(progress)

    def part(vs: VhostScan) -> Iterator[pa.RecordBatch]:
        for b in classic_messages_batches(vs):  # a big vhost's in ranges (jobs > 1): quorum and streams in tail
            yield pa.RecordBatch.from_arrays(b.columns + [pa.repeat(pa.scalar("index"), b.num_rows)], schema=SCHEMA)

    def see(seen: set, b) -> None:  # stored entries already emitted in this vhost
        if everything:
            seen.update(b.stored if isinstance(b, Lines) else stored(b))

    def tail(vs: VhostScan, seen: set) -> Iterator[pa.RecordBatch]:
        for b in quorum_messages_batches(vs):  # quorum queues' messages, as the messages table has them
            b = pa.RecordBatch.from_arrays(b.columns + [pa.repeat(pa.scalar("index"), b.num_rows)], schema=SCHEMA)
            see(seen, b)  # a message the queue's state holds is not listed again from its log (--all)
            yield b
        for b in stream_messages_batches(vs):  # a stream's records, as the messages table has them (once per vhost)
            yield pa.RecordBatch.from_arrays(b.columns + [pa.repeat(pa.scalar("stream"), b.num_rows)], schema=SCHEMA)
        if not everything:
            return
        node = display(vs.node.node.node)
        vhost = display(vs.vhost.name if vs.vhost.name is not None else vs.vhost.label)

        def once(rows: Iterator[dict]) -> Iterator[dict]:
            for row in rows:
                key = (row["store_file"], row["store_offset"])
                if key not in seen:
                    seen.add(key)
                    yield row

        extra = itertools.chain(_ghost_rows(vs, node, vhost), _quorum_log_rows(vs, node, vhost, seen))
        if queues is None:
            extra = itertools.chain(extra, _store_rows(vs, node, vhost))
        yield from _batched(once(extra), opts.batch_rows, opts.batch_bytes)

    # the one read driver: the index rows of a big vhost read in ranges by ``jobs`` processes,
    # the rest (the entries no index row emitted) in this one, once its index rows have passed
    build = driver.Build(part, splittable=True, in_passes=True, start=lambda vs: set(), see=see, tail=tail)
    yield from driver.read(
        "messages",
        opts,
        paths=paths,
        build=build,
        vhosts=vhosts,
        queues=queues,
        progress=progress,
        render=None if render is None else lambda b: render(b, everything),
    )


def stored(b: pa.RecordBatch) -> list[tuple[str, int]]:
    """(store file, offset) of the batch's rows that have their bytes in a store."""
    files, offsets = b.column("store_file").to_pylist(), b.column("store_offset").to_pylist()
    return [(f, o) for f, o in zip(files, offsets) if f is not None and o is not None]


@dataclass
class Lines:
    """A batch of export rows as JSON lines (``jsonl_lines``), made where the batch is (by the
    workers of ``export -j N``): the text, the rows per source and those past their TTL, and
    (``--all``) where the rows' bytes are, which the rows to come must not emit again."""

    text: str
    sources: dict[str, int]
    expired: int
    stored: list[tuple[str, int]]


def sources(b: pa.RecordBatch) -> dict[str, int]:
    """The batch's rows per source."""
    counts: dict[str, int] = {}
    for s in b.column("source").to_pylist():
        counts[s] = counts.get(s, 0) + 1
    return counts


def expired_rows(b: pa.RecordBatch) -> int:
    """The batch's rows past their TTL."""
    return b.column("drop_reason").to_pylist().count("expired")


def jsonl_lines(b: pa.RecordBatch, everything: bool) -> Lines:
    return Lines(
        jsonout.batch_lines(b),
        sources(b),
        expired_rows(b),
        stored(b) if everything else [],
    )


def _provenance(paths, options: dict, nodes: list[NodeScan]) -> dict:
    """The export's provenance record and the one instant its TTLs are judged at (``nodes``:
    the scans of the nodes exported)."""
    from cqforensics.model.options import parse_as_of

    as_of_ms = parse_as_of(options.get("as_of"))
    given = as_of_ms is not None
    if as_of_ms is None:
        as_of_ms = provenance.now_ms()
    version = options.get("broker_version")
    if not version:  # the version each node's next boot is predicted for (inferred)
        version = ", ".join(sorted({ns.model.label for ns in nodes})) or None
    return {
        "as_of_ms": as_of_ms,
        "as_of_given": given,
        "record": provenance.record(
            "export",
            paths,
            version,
            as_of_ms,
            jobs=options.get("jobs", 1),
            listing=nodes[0].node.listing if nodes else None,  # the dirs and name files listed: not again
        ),
    }


def _stale_note(out: Path) -> str:
    """Why a non-empty output dir refuses: the partial outputs it holds, and how to remove them."""
    held = [p for p in out.iterdir() if PARTIAL in p.name or p.name.endswith(".partial")] if out.is_dir() else []
    if not held:
        return ""
    return (
        f"; it holds partial output(s) of another run: {', '.join(p.name for p in held)} (if no cqforensics "
        f"is writing there, remove them: rm -r {' '.join(repr(str(p)) for p in held)})"
    )


def export(
    paths,
    fmt: str,
    out: Path | str,
    everything: bool = False,
    force: bool = False,
    vhosts=None,
    queues=None,
    progress=None,
    **options,
) -> dict:
    """Write DIR/messages.jsonl or DIR/messages.parquet; returns counts per source, the messages
    past their TTL (``expired``; ``as_of``: when TTLs were judged, ``as_of_given``: not by the
    clock) and the storage not read (``not_read``, per node). ``force``: DIR may be a previous
    output of cqforensics, replaced whole when the export is complete (the rule of every output,
    cqforensics.output.guard). ``progress``: a display ``(text, done, total)``."""
    if fmt not in ("jsonl", "parquet"):
        raise UsageError(f"unknown format {fmt!r}: jsonl or parquet")
    out = Path(out).absolute()
    try:  # before anything is read: an output aimed at evidence is refused whatever the input holds
        check_output(out, paths, directory=True, force=force, deep=False)
    except UsageError as e:
        raise UsageError(str(e) + _stale_note(out)) from None
    nodes = driver.discovered(
        paths,
        make_options(options.get("broker_version"), bodies=False, decode=False),
        driver.names(vhosts, "vhosts"),
        driver.names(queues, "queues"),
    )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OperationalError(f"{out.parent}: cannot create: {e.strerror}") from e
    counts: dict[str, int] = {}
    expired = 0
    prov = _provenance(paths, options, nodes)
    options = {**options, "as_of": prov["as_of_ms"]}
    as_of_ms, as_of_given, prov = prov["as_of_ms"], prov["as_of_given"], prov["record"]
    with Staging(out, paths, replace=force, command="export") as staging:
        target = staging.path / f"messages.{fmt}"
        with open(target, "w" if fmt == "jsonl" else "wb", **({"encoding": "utf-8"} if fmt == "jsonl" else {})) as fh:
            sink = (
                ParquetSink(fh, SCHEMA.with_metadata({provenance.METADATA_KEY: json.dumps(prov, sort_keys=True)}))
                if fmt == "parquet"
                else None
            )
            with sink if sink is not None else contextlib.nullcontext():
                # the node dirs listed and their metadata read once, for the provenance and the rows
                for b in export_batches(
                    driver.Nodes(nodes),
                    everything,
                    vhosts=vhosts,
                    queues=queues,
                    progress=progress,
                    render=jsonl_lines if sink is None else None,
                    **options,
                ):
                    if sink is not None:
                        more, n_expired = sources(b), expired_rows(b)
                        sink.write(b)
                    else:  # JSON lines made by every process
                        more, n_expired = b.sources, b.expired
                        fh.write(b.text)
                    for k, n in more.items():
                        counts[k] = counts.get(k, 0) + n
                    expired += n_expired
            fh.flush()
            os.fsync(fh.fileno())
        if fmt == "jsonl":  # the sidecar: written once the export is complete
            (staging.path / f"messages.{fmt}.provenance.json").write_text(provenance.to_json(prov), encoding="utf-8")
        staging.commit()
    return {
        "file": display(out / f"messages.{fmt}"),
        "rows": counts,
        "removed_partials": [display(p) for p in staging.removed_stale],
        "expired": expired,
        "as_of": provenance.iso(as_of_ms),
        "as_of_given": as_of_given,
        "not_read": {
            display(ns.node.node): [u.to_dict() for u in ns.unread_storage] for ns in nodes if ns.unread_storage
        },
    }


# -- find -------------------------------------------------------------------------------------------

_FIND_COLUMNS = (
    "node",
    "vhost",
    "queue",
    "priority",
    "source",
    "msg_id",
    "file",
    "offset",
    "store_file",
    "store_offset",
    "seq_id",
    "survives_restart",
    "drop_reason",
    "body_size",
)


def fate(row: dict) -> str:
    """What became (or becomes) of a found message, in words a table can hold."""
    src = row["source"]
    if src == "index":
        return "delivered at next boot" if row["survives_restart"] else f"dropped at next boot: {row['drop_reason']}"
    return {
        "ghost": "dropped by an earlier recovery (slot left in the index)",
        "orphan": "acked or deleted (no index holds it)",
        "duplicate": "second copy (no index uses it)",
        "raft_log": "consumed, acked or purged (a quorum queue's log still holds it)",
        "corrupt": "damaged copy",
    }.get(src, src)


def find(
    paths, msg_ids=(), body: bytes | None = None, message_ids=(), vhosts=None, queues=None, progress=None, **options
) -> Iterator[dict]:
    """Every message under ``paths`` (what ``export --all`` would emit: index rows, ghosts,
    orphans, duplicates) whose ``msg_id`` starts with one of ``msg_ids`` (hex), whose AMQP
    ``message_id`` property is one of ``message_ids``, or whose body contains ``body``; one dict
    per hit: where it is (node, vhost, queue, file and offset of the index entry and of the
    stored bytes), ``source`` and ``fate``. ``progress``: a display ``(text, done, total)``."""
    prefixes = []
    for m in msg_ids:
        h = m.lower().removeprefix("0x")
        if not h or len(h) > 32 or any(c not in "0123456789abcdef" for c in h):
            raise UsageError(f"msg_id {m!r}: give hex digits (up to 32; a prefix matches)")
        prefixes.append(h)
    message_ids = set(message_ids)
    if not (prefixes or body or message_ids):
        raise UsageError("find: give a msg_id, a message id or a body text to look for")
    for b in export_batches(paths, True, vhosts=vhosts, queues=queues, progress=progress, **options):
        hit = np.zeros(b.num_rows, bool)
        if prefixes:
            ids = [None if v is None else v.hex() for v in b.column("msg_id").to_pylist()]
            hit |= [v is not None and v.startswith(tuple(prefixes)) for v in ids]
        if message_ids:
            mids = b.column("properties").field("message_id").to_pylist()
            hit |= [v in message_ids for v in mids]
        if body:
            hit |= [v is not None and body in v for v in b.column("body").to_pylist()]
        for i in np.flatnonzero(hit):
            row = b.slice(int(i), 1).select(list(_FIND_COLUMNS)).to_pylist()[0]
            row["fate"] = fate(row)
            yield row


__all__ = ["SCHEMA", "export", "export_batches", "find", "fate", "ParquetSink", "ROW_GROUP_ROWS", "ROW_GROUP_BYTES"]
