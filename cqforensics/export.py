"""Export recovered messages (properties, typed headers, bodies) as JSON lines or Parquet, and
``find`` messages by id or body text.

Rows are the ``messages`` table plus a ``source`` column: ``index`` (held by a queue index),
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

Files are written under a temporary name (``staged_file``: ``.<name>.cqf-partial-<pid>``
beside the target) and renamed when complete; an error or Ctrl-C removes the partial file, and
a partial file left by a killed run (its process gone) is removed by the next run for the same
target. The output dir must not exist or be empty (``force``: it may, and
DIR/messages.<format> is replaced), and may not lie inside an input
(``cqforensics.outputs.check_output``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from cqforensics import driver, fastpath, jsonout, layout, provenance
from cqforensics.model.options import make_options
from cqforensics.outputs import check_output
from cqforensics.errors import FormatError, OperationalError, UsageError, display
from cqforensics.codes import AckEvidence, Location, StoreStatus
from cqforensics.model.vhost import NodeScan, VhostScan
from cqforensics.readers import qs as r_qs
from cqforensics.schema import SCHEMAS
from cqforensics.tables import messages_batches

log = logging.getLogger(__name__)

SCHEMA = SCHEMAS["messages"].append(pa.field("source", pa.string(), False))

#: a Parquet row group holds this many rows at most, or about this many bytes
ROW_GROUP_ROWS = 64 * 1024
ROW_GROUP_BYTES = 64 << 20

#: a file or dir being written is named ``.<target name>.cqf-partial-<pid>`` beside its target
PARTIAL = ".cqf-partial-"

_STORE_SOURCE = {StoreStatus.ORPHAN: "orphan", StoreStatus.DUPLICATE: "duplicate", StoreStatus.CORRUPT: "corrupt"}


# -- writing files: staged, in sized row groups --------------------------------------------------


def process_gone(pid: int) -> bool:
    """Whether no process ``pid`` exists (a partial output of such a run is stale)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def partial_name(target: Path, pid: int | None = None) -> Path:
    return target.parent / f".{target.name}{PARTIAL}{os.getpid() if pid is None else pid}"


def partials(target: Path) -> list[tuple[Path, int]]:
    """Partial outputs of ``target`` (files or dirs named by ``partial_name``) with their pid."""
    prefix = f".{target.name}{PARTIAL}"
    out = []
    try:
        names = os.listdir(target.parent)
    except OSError:
        return out
    for name in names:
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            out.append((target.parent / name, int(name[len(prefix):])))
    return sorted(out)


def remove_stale_partials(target: Path) -> list[Path]:
    """Remove the partial outputs of ``target`` left by runs whose process is gone (a kill -9);
    returns them. Partial outputs of live processes are left alone."""
    import shutil

    removed = []
    for p, pid in partials(target):
        if pid == os.getpid() or not process_gone(pid):
            continue
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise OperationalError(f"{p}: a partial output of an interrupted run (pid {pid}) cannot be removed: "
                                   f"{e.strerror}; remove it by hand (rm -r '{p}')") from e
        log.warning("removed %s, the partial output of an interrupted run (pid %d)", display(p), pid)
        removed.append(p)
    return removed


@contextlib.contextmanager
def signals_held():
    """Hold SIGINT, SIGTERM and SIGALRM (delivered when the block ends) while a partial output
    is removed or committed, so a second Ctrl-C cannot leave it half done."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGALRM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def staged_file(target: Path, mode: str = "wb"):
    """Open a partial file for ``target`` (``partial_name``) and yield it; when the block ends
    normally the file is flushed, fsynced and renamed to ``target``; on any exception (Ctrl-C
    included) it is removed. Stale partial files of killed runs are removed first."""
    remove_stale_partials(target)
    tmp = partial_name(target)
    try:
        fh = open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"}))
    except OSError as e:
        raise OperationalError(f"{tmp}: cannot create: {e.strerror}") from e
    done = False
    try:
        with fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        with signals_held():
            os.replace(tmp, target)  # a half-written output never has the final name
            done = True
    finally:
        if not done:
            with signals_held(), contextlib.suppress(OSError):
                tmp.unlink()


class ParquetSink:
    """Batches to a Parquet file in row groups of ``rows`` rows at most, or about ``nbytes``
    bytes: batches are gathered until either is reached, then written as one row group (a
    reader's cost grows with the number of row groups, not with batch size)."""

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
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        self.pending_bytes += batch.nbytes
        self.num_rows += batch.num_rows
        if self.pending_bytes >= self.nbytes:
            self.flush()
        elif self.pending_rows >= self.rows:
            self._full()

    def _full(self) -> None:
        """Write the whole row groups of ``rows`` rows gathered so far; the rest waits."""
        table = pa.Table.from_batches(self.pending, schema=self.schema)
        whole = (self.pending_rows // self.rows) * self.rows
        self.writer.write_table(table.slice(0, whole), row_group_size=self.rows)
        rest = table.slice(whole)
        self.pending = rest.to_batches()
        self.pending_rows = rest.num_rows
        self.pending_bytes = rest.nbytes

    def flush(self) -> None:
        """Write what is gathered as one row group (or more, ``rows`` rows at most each)."""
        if self.pending:
            self.writer.write_table(pa.Table.from_batches(self.pending, schema=self.schema),
                                    row_group_size=self.rows)
            self.pending, self.pending_rows, self.pending_bytes = [], 0, 0

    def close(self) -> None:
        self.flush()
        self.writer.close()

    def __enter__(self) -> "ParquetSink":
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
                _, first = st.locate(r.msg_id[i:i + 1])
                if first[0] >= 0:
                    e = int(first[0])
                    path, start, length = st.term_span(e)
                    raw, where = vs.bodies.read(path, start, length), (display(path), int(st.e_offset[e]))
            if raw is not None:
                yield _row(node, vhost, qx.qdir.name, qx.qdir.priority, where[0], where[1], raw, "ghost",
                           r.msg_id[i].tobytes() if r.loc[i] == Location.SHARED_STORE else None,
                           "shared_store" if r.loc[i] == Location.SHARED_STORE else "queue_store", seq=int(r.seq[i]))


def _store_rows(vs: VhostScan, node: str, vhost: str | None) -> Iterator[dict]:
    """Shared-store entries no index holds: orphans, duplicates, corrupt copies (one row per
    entry, bodies read as they are yielded)."""
    for kind, st in vs.stores.items():
        status, _ = vs.store_status[kind]
        for i in np.flatnonzero(status != StoreStatus.LIVE):
            path, start, length = st.term_span(i)
            yield _row(node, vhost, None, None, display(path), int(st.e_offset[i]), vs.bodies.read(path, start, length),
                       _STORE_SOURCE.get(int(status[i]), "duplicate"), st.e_id[i].tobytes(), "shared_store")


def _quorum_log_rows(vs: VhostScan, node: str, vhost: str | None, seen: set) -> Iterator[dict]:
    """Messages a quorum queue's log still holds that its state no longer does (``raft_log``:
    consumed, acked or purged, until Ra truncates the log below its snapshot): every enqueue
    entry copy, recovered or not, whose bytes no row emitted yet."""
    from cqforensics import message, rabbit_fifo

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
                cmd = rabbit_fifo.decode(e.data(bodies)).command
            except FormatError:
                continue
            if cmd is None or cmd.name not in ("enqueue", "requeue") or cmd.msg is None:
                continue
            row = {"node": node, "vhost": q.vhost if q.vhost is not None else vhost, "queue": q.label,
                   "priority": None, "file": display(e.file), "offset": e.offset, "seq_id": None,
                   "location": e.source, "store_file": display(e.file), "store_offset": e.data_offset,
                   "survives_restart": False, "drop_reason": "not_in_any_index", "source": "raft_log",
                   "queue_type": "quorum", "raft_index": idx, "raft_term": e.term}
            try:
                m = message.normalise_checked(cmd.msg)
            except FormatError as err:
                row["decode_error"] = err.message
                yield row
                continue
            props = dict(m["properties"])
            props["timestamp"] = m["timestamp_ms"] * 1000 if m["timestamp_ms"] is not None else None
            mid = m["msg_id"]
            row.update(msg_id=mid if isinstance(mid, bytes) and len(mid) == 16 else None, exchange=m["exchange"], routing_keys=m["routing_keys"], properties=props,
                       headers=m["headers"], annotations=m["annotations"], body=m["body"], body_size=len(m["body"]),
                       term_format=m["term_format"])
            yield row


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


def export_batches(paths, everything: bool = False, vhosts=None, queues=None, **options) -> Iterator[pa.RecordBatch]:
    """The export rows (the ``messages`` schema plus ``source``) as batches; ``vhosts``/``queues``
    restrict them by name (a queue restriction leaves out the store rows, which belong to no
    queue)."""
    opts = make_options(**options)

    def build(vs: VhostScan) -> Iterator[pa.RecordBatch]:
        node = display(vs.node.node.node)
        vhost = display(vs.vhost.name if vs.vhost.name is not None else vs.vhost.label)
        seen: set[tuple[str, int]] = set()  # stored entries already emitted in this vhost
        for b in messages_batches(vs):
            if everything:
                files, offsets = b.column("store_file").to_pylist(), b.column("store_offset").to_pylist()
                seen.update((f, o) for f, o in zip(files, offsets) if f is not None and o is not None)
            yield pa.RecordBatch.from_arrays(b.columns + [pa.repeat(pa.scalar("index"), b.num_rows)], schema=SCHEMA)
        if not everything:
            return

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

    # the one read driver
    yield from driver.read("messages", opts, paths=paths, build=build, vhosts=vhosts, queues=queues)


def _jsonl_line(row: dict) -> str:
    """One export line in the one JSON convention (``jsonout``): msg_id hex, ``body_base64``,
    headers and annotations nested, times ISO 8601."""
    return jsonout.dumps(row)


def _provenance(paths, options: dict) -> dict:
    """The export's provenance record and the one instant its TTLs are judged at."""
    from cqforensics.model.options import parse_as_of

    as_of_ms = parse_as_of(options.get("as_of"))
    if as_of_ms is None:
        as_of_ms = provenance.now_ms()
    version = options.get("broker_version")
    if not version:  # the version each node's next boot is predicted for (inferred)
        opts = make_options(broker_version=None, bodies=False, decode=False)
        version = ", ".join(sorted({NodeScan(n, opts).model.label for n in layout.discover(paths)})) or None
    return {"as_of_ms": as_of_ms, "record": provenance.record("export", paths, version, as_of_ms)}


def _stale_note(out: Path) -> str:
    """Why a non-empty output dir refuses: the partial outputs it holds, and how to remove them."""
    held = [p for p in out.iterdir() if PARTIAL in p.name or p.name.endswith(".partial")] if out.is_dir() else []
    if not held:
        return ""
    return (f"; it holds partial output(s) of another run: {', '.join(p.name for p in held)} (if no cqforensics "
            f"is writing there, remove them: rm -r {' '.join(repr(str(p)) for p in held)})")


def export(paths, fmt: str, out: Path | str, everything: bool = False, force: bool = False, vhosts=None,
           queues=None, **options) -> dict:
    """Write DIR/messages.jsonl or DIR/messages.parquet; returns counts per source. ``force``:
    DIR may exist and hold files (an existing messages file is replaced). A partial file a
    killed run left in DIR is removed first (it would make DIR non-empty)."""
    if fmt not in ("jsonl", "parquet"):
        raise UsageError(f"unknown format {fmt!r}: jsonl or parquet")
    out = check_output(out, paths, directory=True, force=True)  # never inside an input: checked first
    target = out / f"messages.{fmt}"
    removed = remove_stale_partials(target) if out.is_dir() else []
    try:
        out = check_output(out, paths, directory=True, force=force)
    except UsageError as e:
        raise UsageError(str(e) + _stale_note(out)) from None
    if target.is_dir():
        raise UsageError(f"{target}: is a directory (the output is a file)")
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OperationalError(f"{out}: cannot create: {e.strerror}") from e
    counts: dict[str, int] = {}
    prov = _provenance(paths, options)
    options = {**options, "as_of": prov["as_of_ms"]}
    prov = prov["record"]
    try:
        with staged_file(target, "w" if fmt == "jsonl" else "wb") as fh:
            sink = ParquetSink(fh, SCHEMA.with_metadata({provenance.METADATA_KEY: json.dumps(prov, sort_keys=True)})) \
                if fmt == "parquet" else None
            with sink if sink is not None else contextlib.nullcontext():
                for b in export_batches(paths, everything, vhosts=vhosts, queues=queues, **options):
                    for s in b.column("source").to_pylist():
                        counts[s] = counts.get(s, 0) + 1
                    if sink is not None:
                        sink.write(b)
                    else:
                        fh.write("".join(_jsonl_line(row) + "\n" for row in b.to_pylist()))
        if fmt == "jsonl":  # the sidecar: written once the export is complete
            with staged_file(out / f"messages.{fmt}.provenance.json", "w") as fh:
                fh.write(provenance.to_json(prov))
    finally:
        if created and not target.exists():  # a failed export leaves nothing behind
            with signals_held(), contextlib.suppress(OSError):
                out.rmdir()
    return {"file": display(target), "rows": counts, "removed_partials": [display(p) for p in removed]}


# -- find -------------------------------------------------------------------------------------------

_FIND_COLUMNS = ("node", "vhost", "queue", "priority", "source", "msg_id", "file", "offset", "store_file",
                 "store_offset", "seq_id", "survives_restart", "drop_reason", "body_size")


def fate(row: dict) -> str:
    """What became (or becomes) of a found message, in words a table can hold."""
    src = row["source"]
    if src == "index":
        return "delivered at next boot" if row["survives_restart"] else f"dropped at next boot: {row['drop_reason']}"
    return {"ghost": "dropped by an earlier recovery (slot left in the index)",
            "orphan": "acked or deleted (no index holds it)",
            "duplicate": "second copy (no index uses it)",
            "raft_log": "consumed, acked or purged (a quorum queue's log still holds it)",
            "corrupt": "damaged copy"}.get(src, src)


def find(paths, msg_ids=(), body: bytes | None = None, message_ids=(), vhosts=None, queues=None,
         **options) -> Iterator[dict]:
    """Every message under ``paths`` (what ``export --all`` would emit: index rows, ghosts,
    orphans, duplicates) whose ``msg_id`` starts with one of ``msg_ids`` (hex), whose AMQP
    ``message_id`` property is one of ``message_ids``, or whose body contains ``body``; one dict
    per hit: where it is (node, vhost, queue, file and offset of the index entry and of the
    stored bytes), ``source`` and ``fate``."""
    prefixes = []
    for m in msg_ids:
        h = m.lower().removeprefix("0x")
        if not h or len(h) > 32 or any(c not in "0123456789abcdef" for c in h):
            raise UsageError(f"msg_id {m!r}: give hex digits (up to 32; a prefix matches)")
        prefixes.append(h)
    message_ids = set(message_ids)
    if not (prefixes or body or message_ids):
        raise UsageError("find: give a msg_id, a message id or a body text to look for")
    for b in export_batches(paths, True, vhosts=vhosts, queues=queues, **options):
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


__all__ = ["SCHEMA", "export", "export_batches", "find", "fate", "ParquetSink", "staged_file",
           "remove_stale_partials", "partials", "process_gone", "partial_name", "signals_held", "PARTIAL",
           "ROW_GROUP_ROWS", "ROW_GROUP_BYTES"]
