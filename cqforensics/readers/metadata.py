"""The node's durable-queue metadata: which queues the broker will recover (a queue dir not
listed here is deleted at boot, IDX2 start/2).

* Mnesia (3.x, 4.0-4.1 by default): table ``rabbit_durable_queue`` is replayed from its dump
  (``.DCD``), its log (``.DCL``) and the transaction logs (``PREVIOUS.LOG``, ``LATEST.LOG``),
  in that order; ops are ``{{Tab, Key}, Value, write|delete|delete_object}``.
* Khepri (4.2+ by default): the Ra log under ``coordination/<node>/`` is carved for
  ``#amqqueue{}`` records (heuristic: a queue deleted since its last put may still be listed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from cqforensics import etf
from cqforensics.errors import FormatError
from cqforensics.readers.files import is_regular, read_bytes
from cqforensics.readers.terms import read_disk_log

TABLE = "rabbit_durable_queue"


@dataclass
class QueueRecord:
    vhost: bytes
    name: bytes
    durable: bool
    arguments: list  # AMQP table as decoded: [(Key, Type, Value)]
    type: str | None
    source: str


@dataclass
class Metadata:
    kind: str | None  # "mnesia", "khepri" or None (nothing readable)
    queues: dict[tuple[bytes, bytes], QueueRecord] = field(default_factory=dict)  # durable queues
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def knows(self, vhost: bytes, name: bytes) -> bool | None:
        """Whether (vhost, name) is a durable queue; None when the metadata is unreadable."""
        if self.kind is None:
            return None
        return (vhost, name) in self.queues

    def arguments(self, vhost: bytes, name: bytes) -> dict:
        q = self.queues.get((vhost, name))
        out = {}
        for item in (q.arguments if q else []):
            if isinstance(item, tuple) and len(item) == 3:
                out[bytes(item[0]).decode("utf-8", "replace") if isinstance(item[0], bytes) else str(item[0])] = item[2]
        return out


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
    return QueueRecord(vhost, name, term[2] == "true", args, qtype, source)


def _mnesia(node: Path) -> Metadata:
    meta = Metadata("mnesia")
    queues: dict = {}

    def apply(op_tuple, source):
        if not (isinstance(op_tuple, tuple) and len(op_tuple) == 3):
            return
        tab_key, value, op = op_tuple
        if not (isinstance(tab_key, tuple) and len(tab_key) == 2 and tab_key[0] == TABLE):
            return
        key = tab_key[1]
        if op == "write":
            rec = queue_record(value, source)
            if rec is not None:
                queues[(rec.vhost, rec.name)] = rec
        elif op in ("delete", "delete_object") and isinstance(key, tuple) and len(key) == 4:
            queues.pop((key[1], key[3]), None)

    dcd = node / f"{TABLE}.DCD"
    if dcd.exists():
        meta.files.append(dcd)
        log = read_disk_log(dcd)
        for item in log.items[1:]:
            for rec in item if isinstance(item, list) else [item]:
                q = queue_record(rec, dcd.name)
                if q is not None:
                    queues[(q.vhost, q.name)] = q
        if log.error:
            meta.notes.append(str(log.error))
    for name in (f"{TABLE}.DCL", "PREVIOUS.LOG", "LATEST.LOG"):
        path = node / name
        if not path.exists():
            continue
        meta.files.append(path)
        log = read_disk_log(path)
        if log.error:
            meta.notes.append(str(log.error))
        for item in log.items:
            if isinstance(item, tuple) and item and item[0] == "commit":
                # #commit{node, decision, ram_copies, disc_copies, disc_only_copies, ext, schema_ops}
                for ops in item[3:6]:
                    for op in ops if isinstance(ops, list) else []:
                        apply(op, path.name)
            else:
                apply(item, path.name)
    meta.queues = {k: v for k, v in queues.items() if v.durable}
    return meta


_AMQQUEUE = re.compile(rb"[\x68\x69].{1,4}?(?:\x64\x00\x08|\x73\x08|\x76\x00\x08|\x77\x08)amqqueue", re.S)


def _khepri(coord: Path) -> Metadata:
    meta = Metadata("khepri", notes=["Khepri metadata read heuristically (queues carved from the Ra log)"])
    queues: dict = {}
    for path in sorted(p for p in coord.rglob("*") if is_regular(p)):
        try:
            data = read_bytes(path)
        except FormatError:  # swapped for a FIFO since listed: never read
            continue
        meta.files.append(path)
        for m in _AMQQUEUE.finditer(data):
            start = m.start()
            if data[start] == 0x69 and m.end() - start < 5 + 3:
                continue
            try:
                term, _ = etf.decode(b"\x83" + data[start:start + 65536])
            except etf.EtfError:
                continue
            rec = queue_record(term, path.name)
            if rec is not None:
                queues[(rec.vhost, rec.name)] = rec
    meta.queues = {k: v for k, v in queues.items() if v.durable}
    return meta


def read_metadata(node_dir: Path) -> Metadata:
    coord = node_dir / "coordination"
    if (node_dir / "rabbitmq_metadata").exists() or not (node_dir / "schema.DAT").exists():
        if coord.is_dir():
            meta = _khepri(coord)
            if meta.queues or not (node_dir / "schema.DAT").exists():
                return meta
    if (node_dir / "schema.DAT").exists():
        return _mnesia(node_dir)
    return Metadata(None, notes=["no readable metadata store (neither Mnesia nor Khepri files)"])
