"""Stores written from rows of the ``messages`` schema (the Spark writer's engine).

Two steps, so the expensive one runs in parallel and memory stays flat:

1. ``encode_part`` (one per Spark task): each row becomes the stored term of the target
   version, appended to ``part-N.terms``; a small Arrow file ``part-N.arrow`` lists, per row,
   where its term is and what the index needs (queue, priority, expiry, size, id, placement);
2. ``build`` (once, on the driver): the parts, in partition order, become queue dirs and a
   shared store under a staging dir, which is verified and then swapped into place.

Every row is written as a persistent AMQP 0-9-1 message, exactly as the ``messages`` table
shows it to an AMQP 0-9-1 consumer: body, exchange, routing keys, the 13 properties and the
typed headers (x-death and other annotations already appear there). 3.10 - 3.12 targets get
``#basic_message{}`` terms, 3.13+ ``#mc{protocol = mc_amqpl}``. Headers typed with AMQP 1.0
names (rows read from AMQP 1.0 messages) are mapped to AMQP 0-9-1 field types
(``AMQP10_TO_091``). Each message gets a new store id, as a publish would.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from cqforensics.base.errors import OperationalError, UsageError, queue_ref
from cqforensics.codecs import amqp091, textfiles
from cqforensics.discovery import nodes as layout
from cqforensics.model import versions
from cqforensics.write import formats

REQUIRED = {"vhost": pa.string(), "queue": pa.string(), "body": pa.binary()}
OPTIONAL = ("priority", "expiry", "exchange", "routing_keys", "properties", "headers", "term_format")

PART = pa.schema(
    [
        ("vhost", pa.string()),
        ("queue", pa.string()),
        ("priority", pa.int32()),
        ("msg_priority", pa.int32()),
        ("expiry", pa.int64()),
        ("size", pa.int64()),
        ("msg_id", pa.binary(16)),
        ("term_offset", pa.int64()),
        ("term_length", pa.int64()),
        ("shared", pa.bool_()),
    ]
)


def check_schema(schema: pa.Schema) -> None:
    """Raise a UsageError naming every required column that is missing or mistyped."""
    problems = []
    for name, typ in REQUIRED.items():
        if name not in schema.names:
            problems.append(f"column {name!r} is missing")
        elif not (
            schema.field(name).type == typ
            or (typ == pa.binary() and pa.types.is_large_binary(schema.field(name).type))
            or (typ == pa.string() and pa.types.is_large_string(schema.field(name).type))
        ):
            problems.append(f"column {name!r} is {schema.field(name).type}, not {typ}")
    if problems:
        raise UsageError(
            "rabbitcq writer: " + "; ".join(problems) + " (write rows of the messages table's schema: "
            "at least vhost, queue and body)"
        )


# -- AMQP 1.0 typed values -> AMQP 0-9-1 field values --------------------------------------------------

AMQP10_TO_091 = {
    "string": "longstr",
    "symbol": "longstr",
    "uuid": "longstr",
    "char": "longstr",
    "boolean": "bool",
    "byte": "byte",
    "ubyte": "unsignedbyte",
    "short": "short",
    "ushort": "unsignedshort",
    "int": "signedint",
    "uint": "unsignedint",
    "long": "long",
    "ulong": "long",
    "float": "float",
    "double": "double",
    "timestamp": "timestamp",
    "binary": "binary",
    "null": "void",
    "map": "table",
    "list": "array",
    "array": "array",
}


def _to_091(v: dict, amqp10: bool) -> dict:
    t = v.get("type")
    if not amqp10 and t in amqp091.TYPE_NAMES:
        if t == "table":
            return {"type": t, "value": {k: _to_091(x, False) for k, x in v["value"].items()}}
        if t == "array":
            return {"type": t, "value": [_to_091(x, False) for x in v["value"]]}
        return v
    target = AMQP10_TO_091.get(t)
    if target is None:  # described values and the like: their JSON text
        return {"type": "longstr", "value": json.dumps(v, sort_keys=True)}
    val = v.get("value")
    if target == "timestamp":
        return {"type": target, "value": int(val) // 1000}  # AMQP 1.0 counts milliseconds
    if target == "table":
        return {"type": target, "value": {str(amqp10_key(k)): _to_091(x, True) for k, x in val}}
    if target == "array":
        return {"type": target, "value": [_to_091(x, True) for x in val]}
    if target == "long" and t == "ulong" and int(val) >= 1 << 63:
        return {"type": "longstr", "value": str(val)}
    if target == "longstr" and "base64" not in v:
        return {"type": target, "value": str(val)}
    return {"type": target, **({"base64": v["base64"]} if "base64" in v else {"value": val})}


def amqp10_key(k) -> str:
    return k.get("value") if isinstance(k, dict) else k


def headers_table(headers: str | None, term_format: str | None = None) -> dict | None:
    """A row's ``headers`` JSON -> AMQP 0-9-1 typed table. Rows read from an AMQP 1.0 message
    (``term_format`` mc_amqp*) carry AMQP 1.0 types, mapped as the broker maps them for an
    AMQP 0-9-1 consumer (a timestamp in ms becomes seconds)."""
    if headers is None:
        return None
    amqp10 = bool(term_format) and term_format.startswith("mc_amqp") and term_format != "mc_amqpl"
    return {k: _to_091(v, amqp10) for k, v in json.loads(headers).items()}


# -- one row -> the stored term ---------------------------------------------------------------------


def _props(p: dict | None) -> dict:
    out = dict.fromkeys(amqp091.SCALAR_PROPERTIES)
    for k, v in (p or {}).items():
        if k in out and v is not None:
            out[k] = int(v.timestamp()) if isinstance(v, dt.datetime) else v
    return out


#: the term a target version stores for an AMQP 0-9-1 message (the per-version shape decision
#: lives in ``formats``, shared with compact and rebuild)
stored_term = formats.stored_term


@dataclass
class PartInfo:
    """What a task hands to the commit."""

    partition: int
    index: str  # part-N.arrow
    terms: str  # part-N.terms
    rows: int
    bytes: int


def _column(batch: pa.RecordBatch, name: str):
    return batch.column(name).to_pylist() if name in batch.schema.names else [None] * batch.num_rows


def encode_part(
    batches: Iterable[pa.RecordBatch], model: versions.BrokerModel, out_dir: Path, name: str, partition: int
) -> PartInfo:
    """Encode rows into ``out_dir/<name>.terms`` + ``<name>.arrow``."""
    terms_path = out_dir / f"{name}.terms"
    index_path = out_dir / f"{name}.arrow"
    rows = nbytes = 0
    with (
        open(terms_path, "xb") as terms,
        pa.OSFile(str(index_path), "wb") as sink,
        pa.ipc.new_file(sink, PART) as index,
    ):
        for batch in batches:
            if not batch.num_rows:
                continue
            vh, qn, body = (_column(batch, c) for c in ("vhost", "queue", "body"))
            prio, exp, ex, rks, props, hdrs, fmts = (_column(batch, c) for c in OPTIONAL)
            cols = {k: [] for k in PART.names}
            for i in range(batch.num_rows):
                if vh[i] is None or qn[i] is None or body[i] is None:
                    raise UsageError(
                        f"rabbitcq writer: row {rows + i} of partition {partition} has no vhost, queue or body"
                    )
                p = _props(props[i])
                table = headers_table(hdrs[i], fmts[i])
                props_bin = amqp091.encode_properties(p, table)
                msg_id = uuid.uuid4().bytes
                b = bytes(body[i])
                keys = list(rks[i]) if rks[i] else [qn[i]]  # default exchange: the queue's name
                term = stored_term(model, msg_id, vh[i], ex[i], keys, p, props_bin, b)
                expiry = exp[i]
                if isinstance(expiry, dt.datetime):
                    expiry = int(expiry.timestamp() * 1_000_000)
                cols["vhost"].append(vh[i])
                cols["queue"].append(qn[i])
                cols["priority"].append(prio[i])
                cols["msg_priority"].append(p["priority"])
                cols["expiry"].append(expiry or 0)
                cols["size"].append(len(b))
                cols["msg_id"].append(msg_id)
                cols["term_offset"].append(nbytes)
                cols["term_length"].append(len(term))
                # the broker's rule (rabbit_variable_queue determine_persist_to)
                cols["shared"].append(len(b) + len(props_bin) >= formats.EMBED_BELOW)
                terms.write(term)
                nbytes += len(term)
            rows += batch.num_rows
            index.write_batch(pa.record_batch([pa.array(cols[f.name], f.type) for f in PART], schema=PART))
        terms.flush()
        os.fsync(terms.fileno())
    return PartInfo(partition, str(index_path), str(terms_path), rows, nbytes)


# -- the commit -----------------------------------------------------------------------------------


@dataclass
class QueueRows:
    """The rows going to one queue dir, in write order (numpy columns, ~50 bytes a row)."""

    vhost: bytes
    name: bytes  # as stored: a priority level's name carries its suffix
    dir_name: str
    index_version: int
    terms: list[Path]  # part k's terms file
    part: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    length: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    size: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    expiry: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    msg_id: np.ndarray = field(default_factory=lambda: np.zeros(0, "V16"))
    shared: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

    @property
    def stub(self) -> bytes:
        return formats.queue_name_stub(self.vhost, self.name, self.index_version)

    @property
    def label(self) -> str:
        q = textfiles.QueueName(self.vhost, self.name, None)
        base = q.base.decode("utf-8", "replace")
        return base if q.priority is None else f"{base}[p{q.priority}]"

    @property
    def count(self) -> int:
        """Rows going to this dir."""
        return len(self.part)

    def extend(self, k: int, cols: dict, positions: np.ndarray) -> None:
        self.part = np.concatenate([self.part, np.full(len(positions), k, np.int32)])
        for name in ("offset", "length", "size", "expiry", "msg_id", "shared"):
            setattr(self, name, np.concatenate([getattr(self, name), cols[name][positions]]))

    def entries(self, first_seq: int):
        from cqforensics.write.store import Entry

        ids = self.msg_id.tobytes()
        for n, (k, off, ln, size, exp, sh) in enumerate(
            zip(
                self.part.tolist(),
                self.offset.tolist(),
                self.length.tolist(),
                self.size.tolist(),
                self.expiry.tolist(),
                self.shared.tolist(),
            )
        ):
            yield Entry(
                first_seq + n,
                ids[16 * n : 16 * n + 16],
                size,
                exp,
                shared=sh,
                src=None if sh else (self.terms[k], off, ln),
            )

    def shared_terms(self):
        ids = self.msg_id.tobytes()
        for n in np.flatnonzero(self.shared).tolist():
            yield ids[16 * n : 16 * n + 16], self.terms[int(self.part[n])], int(self.offset[n]), int(self.length[n])


def plan_queues(
    parts: list[PartInfo], model: versions.BrokerModel, meta, queue_version: int | None, existing: dict[str, int]
) -> dict[str, QueueRows]:
    """Group the rows by queue dir (write order kept) and check each queue against the
    metadata: it must be a durable queue there; its x-max-priority picks the level dir and,
    up to 3.13, its x-queue-version the index version (``queue_version`` overrides)."""
    plans: dict[str, QueueRows] = {}
    unknown: set[tuple[str, str]] = set()
    terms = [Path(p.terms) for p in parts]
    for k, part in enumerate(parts):
        t = pa.ipc.open_file(part.index).read_all()
        if not t.num_rows:
            continue
        cols = {
            "offset": t.column("term_offset").to_numpy(),
            "length": t.column("term_length").to_numpy(),
            "size": t.column("size").to_numpy(),
            "expiry": t.column("expiry").to_numpy(),
            "shared": t.column("shared").to_numpy(zero_copy_only=False),
            "msg_id": np.frombuffer(b"".join(t.column("msg_id").to_pylist()), "V16"),
        }
        vh, qn = t.column("vhost").to_pylist(), t.column("queue").to_pylist()
        prio, mprio = t.column("priority").to_pylist(), t.column("msg_priority").to_pylist()
        dirs: dict[tuple, QueueRows | None] = {}
        positions: dict[str, list[int]] = {}
        for i in range(t.num_rows):  # each row's queue dir, in row order
            key = (vh[i], qn[i], prio[i], mprio[i])
            plan = dirs.get(key, False)
            if plan is False:
                plan = dirs[key] = _queue_dir(*key, plans, meta, model, queue_version, existing, unknown, terms)
            if plan is not None:
                positions.setdefault(plan.dir_name, []).append(i)
        for dir_name, pos in positions.items():
            plans[dir_name].extend(k, cols, np.array(pos, np.int64))
    if unknown:
        shown = ", ".join(f"{q!r} in vhost {v!r}" for v, q in sorted(unknown)[:10])
        raise UsageError(
            f"rabbitcq writer: {len(unknown)} queue(s) are not durable queues in the node's metadata "
            f"({shown}); the broker would delete their data at boot: declare them first"
        )
    return plans


def _queue_dir(v: str, q: str, p, mp, plans, meta, model, queue_version, existing, unknown, terms):
    """The QueueRows a row of (vhost v, queue q, priority column p, message priority mp) goes to."""
    vb, qb = v.encode(), q.encode()
    level, version = p, queue_version
    if meta is not None:
        if not meta.knows(vb, qb):
            unknown.add((v, q))
            return None
        args = meta.arguments(vb, qb)
        top = args.get("x-max-priority")
        if isinstance(top, int) and 0 < top < 256:  # the broker's level: min(priority, max)
            level = p if p is not None else min(max(mp or 0, 0), top)
        else:
            level = None
        if version is None and isinstance(args.get("x-queue-version"), int):
            version = args["x-queue-version"]
    stored = qb if level is None else textfiles.priority_queue_name(qb, int(level))
    dir_name = textfiles.queue_dir_name(vb, stored)
    version = formats.index_version(model, version, existing.get(dir_name))
    plan = plans.get(dir_name)
    if plan is None:
        plan = plans[dir_name] = QueueRows(vb, stored, dir_name, int(version), terms)
    return plan


@dataclass
class BuildResult:
    output: str
    mode: str
    broker_version: str
    rows: int = 0
    queues: dict[str, int] = field(default_factory=dict)  # "vhost/queue" -> rows written
    kept: int = 0  # messages DST held and still holds (append)
    verified: bool = False

    def to_dict(self) -> dict:
        return dict(self.__dict__)


V1_SEGMENT_ENTRY_COUNT = 2048  # queue_index_segment_entry_count default; recorded in the vhost's .config


def write_new_vhost(vhost: bytes, plans: list[QueueRows], out: Path, sources, limit: int) -> None:
    """A vhost's store made of rows alone."""
    from cqforensics.grammar import qi as c_qi
    from cqforensics.write.store import QueueWriter, SharedStoreWriter

    (out / "queues").mkdir(parents=True)
    (out / "msg_store_transient").mkdir()
    (out / ".vhost").write_bytes(vhost)
    if any(p.index_version == 1 for p in plans):
        (out / ".config").write_bytes(formats.vhost_config(V1_SEGMENT_ENTRY_COUNT))
    shared = SharedStoreWriter(out / "msg_store_persistent", sources, limit)
    for plan in sorted(plans, key=lambda p: p.dir_name):
        w = QueueWriter(
            out / "queues" / plan.dir_name,
            sources,
            plan.index_version,
            V1_SEGMENT_ENTRY_COUNT if plan.index_version == 1 else c_qi.DEFAULT_SEGMENT_ENTRY_COUNT,
            plan.stub,
        )
        w.add(plan.entries(0))
        w.close()
        for t in plan.shared_terms():
            shared.add_from(*t)
    shared.close()


def check_destination(dst: Path, template: Path | None, model: versions.BrokerModel, deep: bool = False) -> Path:
    """The Spark writer's DST, at planning and again at commit: the rule of every output
    (``cqforensics.output.guard.check_output``): new, empty, or a previous output of cqforensics,
    whichever the save mode (overwrite and append both replace DST whole at commit); never the
    template, nor inside or around it. A previous output written for a version whose metadata
    ``model`` cannot boot is refused too: the output would not boot (``retarget.metadata_gap``)."""
    from cqforensics.output.guard import check_output, manifest_of
    from cqforensics.write.retarget import metadata_gap

    dst = check_output(dst, [template] if template is not None else [], directory=True, force=True, deep=deep)
    if not dst.parent.is_dir():
        raise UsageError(f"rabbitcq writer: {dst.parent}: the destination's parent dir does not exist")
    before = manifest_of(dst) if dst.is_dir() and any(dst.iterdir()) else None
    if before is not None and before.get("broker_version"):
        try:
            gap = metadata_gap(versions.model(before["broker_version"]), model)
        except UsageError:
            gap = None
        if gap:
            raise UsageError(
                f"rabbitcq writer: {dst} holds metadata written for RabbitMQ {before['broker_version']}, "
                f"kept by overwrite and append: {gap}; write into a new DST with a template of the "
                "target broker"
            )
    return dst


def build(
    parts: list[PartInfo],
    dst: Path,
    model: versions.BrokerModel,
    mode: str,
    template: Path | None = None,
    queue_version: int | None = None,
    file_size_limit: int | None = None,
) -> BuildResult:
    """Write the parts' rows into ``dst`` (see the module doc). ``mode``: "overwrite" replaces
    DST's message stores, "append" adds the rows after the messages DST holds. A new DST is a
    copy of ``template`` (a node dir: its metadata comes along) with these stores, or a bare
    ``msg_stores`` tree. The result is built beside DST, verified, then swapped in atomically
    (``output.Staging`` with ``replace``). DST follows the rule of every output
    (``check_destination``): an existing DST is a previous output of cqforensics, or nothing is
    written."""
    from cqforensics.commands.fsck import running_broker
    from cqforensics.grammar import rdq as c_rdq
    from cqforensics.write.output import Staging, copy_tree
    from cqforensics.write.salvage import RewriteContext, rewrite_vhost, write_lost_queue_dirs
    from cqforensics.write.store import Sources
    from cqforensics.write.verify import verify

    dst = check_destination(Path(dst), template, model)
    exists = dst.is_dir() and any(dst.iterdir())
    if exists and template is not None:
        raise UsageError(f"rabbitcq writer: {dst} exists; the template option is for a new destination only")
    base = dst if exists else (Path(template).absolute() if template is not None else None)
    if base is not None and not any((base / n).exists() for n in ("msg_stores", "schema.DAT", "coordination")):
        raise UsageError(f"rabbitcq writer: {base} is not a RabbitMQ node dir")
    if base is not None:
        live = running_broker(base)
        if live:
            raise OperationalError(f"{base}: a broker appears to be running on it ({live}); stop it first")
    old = layout.read_node_dir(dst) if exists and layout.is_node_dir(dst) else None
    existing = {q.dir_name: q.index_version for v in (old.vhosts if old else []) for q in v.queues if q.index_version}
    plans = plan_queues(parts, model, _metadata(base), queue_version, existing)
    result = BuildResult(str(dst), mode, model.label)
    limit = file_size_limit or c_rdq.FILE_SIZE_LIMIT
    with Staging(
        dst, [template] if template is not None else [], replace=True, command="spark-write", broker_version=model.label
    ) as staging:
        sources = Sources()
        try:
            if base is not None:
                copy_tree(base, staging.path, {base / "msg_stores" / "vhosts"})
            vhosts_dir = staging.path / "msg_stores" / "vhosts"
            vhosts_dir.mkdir(parents=True, exist_ok=True)
            by_vhost: dict[bytes, list[QueueRows]] = {}
            for plan in plans.values():
                by_vhost.setdefault(plan.vhost, []).append(plan)
            if mode == "append" and old is not None:
                from cqforensics.model.options import make_options
                from cqforensics.model.vhost import NodeScan

                ns = NodeScan(old, make_options(broker_version=model.label, bodies=False, decode=False))
                ctx = RewriteContext.start("compact", dst, dst, sources, limit)
                for vs in ns.vhosts:
                    extra = {p.dir_name: p for p in by_vhost.pop(vs.vhost.name_raw, [])}
                    try:
                        rewrite_vhost(vs, vhosts_dir / vs.vhost.dir_name, ctx, extra=extra)
                    finally:
                        vs.close()
                if ctx.damage:
                    raise OperationalError(
                        f"rabbitcq writer: {dst} holds damaged messages ({ctx.damage[0]}); "
                        "append only to a consistent store (see cqforensics rebuild)"
                    )
                result.kept = sum(q.written for q in ctx.result.queues)
            for vhost, vplans in sorted(by_vhost.items()):
                write_new_vhost(vhost, vplans, vhosts_dir / textfiles.vhost_dir_name(vhost), sources, limit)
            # durable queues of the metadata with no rows and no dir: an empty dir each, as the
            # broker leaves a declared queue (the output then verifies as a broker's own)
            write_lost_queue_dirs(staging.path, _metadata(staging.path), model)
            for plan in plans.values():
                result.queues[queue_ref(plan.vhost, plan.label)] = plan.count
            result.rows = sum(result.queues.values())
        finally:
            sources.close()
        check = verify(staging.path, broker_version=model.label)
        if not check.consistent:
            f = check.violations[0]
            raise OperationalError(
                f"rabbitcq writer: the written store failed verification ({f.code}: {f.message}); {dst} is unchanged"
            )
        result.verified = True
        staging.commit()
    return result


def _metadata(node_dir: Path | None):
    if node_dir is None:
        return None
    from cqforensics.readers.metadata import read_metadata

    meta = read_metadata(node_dir)
    return meta if meta.kind is not None else None
