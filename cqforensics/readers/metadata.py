"""The node's durable metadata: which queues the broker will recover (a queue dir not listed
here is deleted at boot, IDX2 start/2), the vhosts, and the durable exchanges and bindings a
message was routed by (``model.routing``).

* Mnesia (3.x, 4.0-4.1 by default): tables ``rabbit_durable_queue``, ``rabbit_vhost``,
  ``rabbit_durable_exchange`` and ``rabbit_durable_route`` are replayed from their dumps
  (``.DCD``), their logs (``.DCL``) and the transaction logs (``PREVIOUS.LOG``, ``LATEST.LOG``),
  in that order; ops are ``{{Tab, Key}, Value, write|delete|delete_object}``. A transaction log's
  commit of the presume-abort protocol counts only when its ``committed`` outcome is logged too.
* Khepri (4.2+ by default): the Ra log under ``coordination/<node>/`` is carved for
  ``#amqqueue{}``, ``#vhost{}``, ``#exchange{}`` and ``#binding{}`` records (heuristic: a record
  deleted since its last put may still be listed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cqforensics import compiled
from cqforensics.base import heap
from cqforensics.base.errors import FormatError
from cqforensics.codecs import etf
from cqforensics.readers.files import is_regular, read_bytes
from cqforensics.readers.terms import read_disk_log

TABLE = "rabbit_durable_queue"
VHOST_TABLE = "rabbit_vhost"
EXCHANGE_TABLE = "rabbit_durable_exchange"
ROUTE_TABLE = "rabbit_durable_route"
#: bindings also found in the transaction logs: semi-durable (transient exchange, durable queue) and all
LOG_ROUTE_TABLES = ("rabbit_semi_durable_route", "rabbit_route")
TABLES = (TABLE, VHOST_TABLE, EXCHANGE_TABLE, ROUTE_TABLE) + LOG_ROUTE_TABLES
TRANSACTION_LOGS = ("PREVIOUS.LOG", "LATEST.LOG")
#: transaction outcomes Mnesia keeps beyond the transaction logs (``{decision_list, [...]}``)
DECISION_TABLE_LOG = "DECISION_TAB.LOG"


@dataclass
class QueueRecord:
    vhost: bytes
    name: bytes
    durable: bool
    arguments: list  # AMQP table as decoded: [(Key, Type, Value)]
    type: str | None
    source: str
    node: str | None = None  # the node its pid names (the queue's home), None when unknown

    @property
    def classic(self) -> bool:
        """A classic queue (its messages live in ``msg_stores``; quorum and stream queues do not)."""
        return self.type in (None, "rabbit_classic_queue")


@dataclass(frozen=True)
class Binding:
    """A durable binding: messages published to exchange ``source`` of ``vhost`` with a routing
    key (or headers) that ``key``/``args`` match go to ``destination`` (a queue or an exchange)."""

    vhost: bytes
    source: bytes  # exchange name (b"" is the default exchange)
    key: bytes
    dest_kind: str  # "queue" or "exchange"
    destination: bytes
    args: tuple = field(default=(), hash=False)  # AMQP table as decoded: ((Key, Type, Value), ...)


@dataclass
class Metadata:
    kind: str | None  # "mnesia", "khepri" or None (nothing readable)
    queues: dict[tuple[bytes, bytes], QueueRecord] = field(default_factory=dict)  # durable queues
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    vhosts: set[bytes] = field(default_factory=set)  # the vhosts the metadata lists
    exchanges: dict[tuple[bytes, bytes], str] = field(default_factory=dict)  # durable exchange -> its type
    exchange_args: dict[tuple[bytes, bytes], list] = field(default_factory=dict)  # its arguments (AMQP table)
    bindings: list[Binding] = field(default_factory=list)  # durable bindings
    #: (vhost, name) -> the index dirs of the queue, as ``model.vhost.queue_dirs_of`` names them
    #: (asked for each queue by several checks: computed once)
    queue_dirs: dict = field(default_factory=dict, repr=False, compare=False)

    def knows(self, vhost: bytes, name: bytes) -> bool | None:
        """Whether (vhost, name) is a durable queue; None when the metadata is unreadable."""
        if self.kind is None:
            return None
        return (vhost, name) in self.queues

    def arguments(self, vhost: bytes, name: bytes) -> dict:
        q = self.queues.get((vhost, name))
        out = {}
        for item in q.arguments if q else []:
            if isinstance(item, tuple) and len(item) == 3:
                out[bytes(item[0]).decode("utf-8", "replace") if isinstance(item[0], bytes) else str(item[0])] = item[2]
        return out


#: the fields of an #amqqueue{} tuple ``queue_record`` reads (the others may be left undecoded)
QUEUE_FIELDS = frozenset({0, 1, 2, 5, 6, 19})


def queue_record(term, source: str) -> QueueRecord | None:
    """An #amqqueue{} tuple -> QueueRecord (fields: name, durable, auto_delete, exclusive_owner,
    arguments, ...; type is the 20th field in the records of 3.8+)."""
    if not (isinstance(term, tuple) and len(term) > 5 and term[0] == "amqqueue"):
        return None
    res = term[1]
    if not (isinstance(res, tuple) and len(res) == 4 and res[0] == "resource"):
        return None
    vhost, name = res[1], res[3]
    if not isinstance(vhost, bytes) or not isinstance(name, bytes):
        return None
    qtype = term[19] if len(term) > 19 and isinstance(term[19], str) else None
    args = term[5] if isinstance(term[5], list) else []
    node = etf.pid_node(term[6]) if len(term) > 6 else None
    if (
        node is None
        and len(term) > 6
        and isinstance(term[6], tuple)
        and len(term[6]) == 2
        and isinstance(term[6][1], etf.Atom)
    ):  # a quorum queue's leader: {RaName, Node}
        node = str(term[6][1])
    return QueueRecord(vhost, name, term[2] == "true", args, qtype, source, node)


def _resource(t, kind: str) -> tuple[bytes, bytes] | None:
    """A #resource{virtual_host, kind, name} of ``kind`` -> (vhost, name)."""
    if (
        isinstance(t, tuple)
        and len(t) == 4
        and t[0] == "resource"
        and t[2] == kind
        and isinstance(t[1], bytes)
        and isinstance(t[3], bytes)
    ):
        return t[1], t[3]
    return None


def vhost_record(term) -> bytes | None:
    """A #vhost{virtual_host, limits[, metadata]} tuple -> the vhost name."""
    if isinstance(term, tuple) and len(term) in (3, 4) and term[0] == "vhost" and isinstance(term[1], bytes):
        return term[1]
    return None


def exchange_record(term) -> tuple[tuple[bytes, bytes], str, list] | None:
    """An #exchange{name, type, durable, auto_delete, internal, arguments, ...} tuple ->
    ((vhost, name), type, arguments)."""
    if not (isinstance(term, tuple) and len(term) > 3 and term[0] == "exchange" and isinstance(term[2], str)):
        return None
    name = _resource(term[1], "exchange")
    args = term[6] if len(term) > 6 and isinstance(term[6], list) else []
    return (name, str(term[2]), args) if name is not None else None


def binding_record(term) -> Binding | None:
    """A #binding{source, key, destination, args} (or the #route{binding} around it) -> Binding."""
    if isinstance(term, tuple) and len(term) >= 2 and term[0] == "route":
        term = term[1]
    if not (isinstance(term, tuple) and len(term) == 5 and term[0] == "binding" and isinstance(term[2], bytes)):
        return None
    src = _resource(term[1], "exchange")
    if src is None:
        return None
    for kind in ("queue", "exchange"):
        dst = _resource(term[3], kind)
        if dst is not None and dst[0] == src[0]:
            args = (
                tuple(a for a in term[4] if isinstance(a, tuple) and len(a) == 3) if isinstance(term[4], list) else ()
            )
            return Binding(src[0], src[1], term[2], kind, dst[1], args)
    return None


def _key_of(table: str, rec):
    """The Mnesia key of a record of ``table`` (its second field), hashable."""
    if table == ROUTE_TABLE and isinstance(rec, tuple) and len(rec) >= 2 and rec[0] == "route":
        return _frozen(rec[1])
    return _frozen(rec[1]) if isinstance(rec, tuple) and len(rec) >= 2 else None


def _frozen(t):
    if isinstance(t, list):
        return ("$list",) + tuple(_frozen(x) for x in t)
    if isinstance(t, tuple):
        try:  # a #resource{} key of plain values: itself (a list or map in it is never hashable)
            hash(t)
            return t
        except TypeError:
            return tuple(_frozen(x) for x in t)
    if isinstance(t, dict):
        return ("$map",) + tuple((_frozen(k), _frozen(v)) for k, v in t.items())
    return t


def _fill(meta: Metadata, tables: dict[str, dict], records: dict | None = None) -> None:
    """Metadata from the replayed records of each table (key -> (record, source));
    ``records``: the QueueRecord of each key of the queue table, when already made."""
    queues = {}
    for key, (rec, source) in tables[TABLE].items():
        q = records[key] if records is not None else queue_record(rec, source)
        if q is not None:
            queues[(q.vhost, q.name)] = q
    meta.queues = {k: v for k, v in queues.items() if v.durable}
    for rec, _ in tables[VHOST_TABLE].values():
        name = vhost_record(rec)
        if name is not None:
            meta.vhosts.add(name)
    for rec, _ in tables[EXCHANGE_TABLE].values():
        x = exchange_record(rec)
        if x is not None:
            meta.exchanges[x[0]] = x[1]
            meta.exchange_args[x[0]] = x[2]
    seen = set()
    for table in (ROUTE_TABLE,) + LOG_ROUTE_TABLES:
        for key, (rec, _) in tables[table].items():  # one record per key: no binding twice
            b = binding_record(rec)
            if b is not None and key not in seen:
                seen.add(key)
                meta.bindings.append(b)


def _mnesia(node: Path) -> Metadata:
    meta = Metadata("mnesia")
    tables: dict[str, dict] = {t: {} for t in TABLES}

    def apply(op_tuple, source):
        if not (isinstance(op_tuple, tuple) and len(op_tuple) == 3):
            return
        tab_key, value, op = op_tuple
        if not (isinstance(tab_key, tuple) and len(tab_key) == 2 and tab_key[0] in tables):
            return
        table = tables[str(tab_key[0])]
        try:
            key = _frozen(tab_key[1])
            hash(key)
        except TypeError:  # an unhashable key: not a record of ours
            return
        if op == "write":
            table[key] = (value, source)
        elif op in ("delete", "delete_object"):
            table.pop(key, None)

    for name in TABLES:
        dcd = node / f"{name}.DCD"
        if not dcd.exists():
            continue
        meta.files.append(dcd)
        log = read_disk_log(dcd)
        for item in log.items[1:]:
            for rec in item if isinstance(item, list) else [item]:
                key = _key_of(name, rec)
                try:
                    hash(key)
                except TypeError:
                    continue
                if key is not None:
                    tables[name][key] = (rec, dcd.name)
        if log.error:
            meta.notes.append(str(log.error))
    logs = []
    for name in [f"{t}.DCL" for t in TABLES] + list(TRANSACTION_LOGS):
        path = node / name
        if not path.exists():
            continue
        meta.files.append(path)
        log = read_disk_log(path)
        if log.error:
            meta.notes.append(str(log.error))
        logs.append((path, log.items))
    committed = _committed_tids(node, meta, [items for path, items in logs if path.name in TRANSACTION_LOGS])
    for path, items in logs:
        for item in items:
            if isinstance(item, tuple) and len(item) > 2 and item[0] == "commit":
                # #commit{node, decision, ram_copies, disc_copies, disc_only_copies, ext, schema_ops}
                if not _commits_at_boot(item[2], committed):
                    meta.notes.append(
                        f"{path.name}: a transaction without its logged outcome: Mnesia aborts it at boot"
                    )
                    continue
                for ops in item[3:6]:
                    for op in ops if isinstance(ops, list) else []:
                        apply(op, path.name)
            else:
                apply(item, path.name)
    _fill(meta, tables)
    return meta


def _committed_tids(node: Path, meta: Metadata, transaction_logs: list[list]) -> set:
    """The transactions a ``#decision{tid, outcome = committed, ...}`` of the logs settles, as
    Mnesia's boot finds them (mnesia_recover: the decision table file, then a scan of the
    transaction logs before their replay)."""
    items = []
    path = node / DECISION_TABLE_LOG
    if path.exists():
        meta.files.append(path)
        log = read_disk_log(path)
        if log.error:
            meta.notes.append(str(log.error))
        for item in log.items:
            if isinstance(item, tuple) and len(item) == 2 and item[0] == "decision_list" and isinstance(item[1], list):
                items += item[1]
    for log_items in transaction_logs:
        items += log_items
    out = set()
    for item in items:
        if isinstance(item, tuple) and len(item) == 5 and item[0] == "decision" and item[2] == "committed":
            try:
                out.add(_frozen(item[1]))
            except TypeError:  # an unhashable tid: no transaction of ours
                continue
    return out


def _commits_at_boot(decision, committed: set) -> bool:
    """Whether Mnesia's boot applies a logged commit (mnesia_recover:wait_for_decision): one of
    the presume-commit protocol always; one of the presume-abort protocol (a #decision{} record,
    as queue declarations carry on 3.10.8 and 4.0.5) only when its outcome was logged as
    committed. The two are appended to the log one after the other, each asynchronously, so a
    kill -9 can come between them; a node alone then aborts the transaction."""
    if decision == "presume_commit":
        return True
    if not (isinstance(decision, tuple) and len(decision) == 5 and decision[0] == "decision"):
        return False
    try:
        return _frozen(decision[1]) in committed
    except TypeError:  # an unhashable tid: never logged as committed
        return False


def _carver(atom: bytes) -> tuple[bytes, frozenset[bytes]]:
    """What finds the tuples tagged with ``atom`` (any atom encoding): the atom's text, and the
    tag bytes that may precede it (``_carved``)."""
    n = bytes([len(atom)])
    return atom, frozenset((b"\x64\x00" + n, b"\x73" + n, b"\x76\x00" + n, b"\x77" + n))


def _carved(data: bytes, carver: tuple[bytes, frozenset[bytes]]):
    """Where a tuple tagged with the carver's atom may start: each occurrence of the atom's
    text (a literal search) preceded by an atom tag and, before that, a small tuple's tag and
    arity (2 bytes) or a large tuple's (5 bytes); both are tried, the decode decides."""
    atom, tags = carver
    at = data.find(atom)
    while at >= 0:
        for t in (2, 3):
            if data[at - t : at] in tags:
                a = at - t  # the atom term's start
                if a >= 2 and data[a - 2] == 0x68:
                    yield a - 2
                if a >= 5 and data[a - 5] == 0x69:
                    yield a - 5
        at = data.find(atom, at + 1)


#: a carved record ends within this many bytes of its start
RECORD_LIMIT = 65536

_CARVE = {
    TABLE: _carver(b"amqqueue"),
    VHOST_TABLE: _carver(b"vhost"),
    EXCHANGE_TABLE: _carver(b"exchange"),
    ROUTE_TABLE: _carver(b"binding"),
}
_CARVE_CHECK = {  # the queue table's check is making its QueueRecord (_khepri)
    VHOST_TABLE: lambda t: vhost_record(t) is not None,
    EXCHANGE_TABLE: lambda t: exchange_record(t) is not None,
    ROUTE_TABLE: lambda t: binding_record(t) is not None,
}


def _khepri(coord: Path) -> Metadata:
    meta = Metadata("khepri", notes=["Khepri metadata read heuristically (records carved from the Ra log)"])
    tables: dict[str, dict] = {t: {} for t in TABLES}
    records: dict = {}  # key -> the QueueRecord of the #amqqueue{} in tables[TABLE]
    for path in sorted(p for p in coord.rglob("*") if is_regular(p)):
        try:
            data = read_bytes(path)
        except FormatError:  # swapped for a FIFO since listed: never read
            continue
        meta.files.append(path)
        view = memoryview(data)
        for table, carver in _CARVE.items():
            starts = list(_carved(data, carver))
            # the queue table's: the fields queue_record reads (a node may hold many queues), by
            # the compiled core where it decides a record, else by the reference (which words
            # any error); either the same value
            core = compiled.decode_fields(data, starts, QUEUE_FIELDS, RECORD_LIMIT) if table == TABLE else None
            for k, start in enumerate(starts):
                try:  # a record within 64 KiB of its start (a view: no copy per candidate)
                    if core is not None and core[k] is not None:
                        term = core[k][0]
                    elif table == TABLE:
                        term, _ = etf.decode_fields_at(data, start, QUEUE_FIELDS, end=start + RECORD_LIMIT)
                    else:
                        term, _ = etf.decode_at(view[start : start + RECORD_LIMIT], 0)
                except etf.EtfError:
                    continue
                if table == TABLE:  # the record is made once: checking it is making it
                    rec = queue_record(term, path.name)
                    if rec is None:
                        continue
                elif not _CARVE_CHECK[table](term):
                    continue
                key = _key_of(table, term) if table != ROUTE_TABLE else _frozen(term)
                try:
                    hash(key)
                except TypeError:
                    continue
                tables[table][key] = (term, path.name)
                if table == TABLE:
                    records[key] = rec
    _fill(meta, tables, records)
    return meta


def read_metadata(node_dir: Path) -> Metadata:
    """The node's metadata (Khepri, else Mnesia), read with the cyclic collector paused
    (``heap.building``: a record a queue, each decoded into a few dozen objects, all kept)."""
    with heap.building():
        return _read_metadata(node_dir)


def _read_metadata(node_dir: Path) -> Metadata:
    coord = node_dir / "coordination"
    if (node_dir / "rabbitmq_metadata").exists() or not (node_dir / "schema.DAT").exists():
        if coord.is_dir():
            meta = _khepri(coord)
            if meta.queues or not (node_dir / "schema.DAT").exists():
                return meta
    if (node_dir / "schema.DAT").exists():
        return _mnesia(node_dir)
    return Metadata(None, notes=["no readable metadata store (neither Mnesia nor Khepri files)"])
