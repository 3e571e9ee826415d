"""Planning a read: work units, bin-packed into partitions.

A unit is what one task can read on its own and get exactly the rows the embedded reader gives:

* queue-level tables (messages, index, acks): one CQv2 ``.qi`` segment, or one CQv1 queue. A
  task that reads several units of one vhost builds that vhost's shared-store index once.
  ``messages`` also has one unit per quorum queue member (a Ra server of ``quorum/<node>/``,
  by uid): its messages and the dead letters its next boot republishes, with the vhost its
  config names (the node's first vhost for a vhost without a dir). A task reading quorum units
  of a node reads the node's WAL once.
* vhost-level tables (store, refcounts, holes, files, queues, findings): a whole vhost, since
  their statuses and checks need every queue of the vhost and its whole shared store.
* a stream (``messages``): one unit per stream dir of the node (``stream``), placed right after
  the units of the vhost that lists it (its owner's, ``model.vhost.stream_home``: the embedded
  reader yields a vhost's stream rows after its classic rows, and the two orders are one).
* a vhost too big to index at once (``model.store.shares_for`` > 1): for the tables whose rows
  each belong to one message-id share (``tables.SHARED_TABLES``), one unit per share, every queue
  of the vhost; a task indexes only its share's store entries and references.

Units are weighed in bytes (segment and store bytes a unit is likely to touch), kept in a
deterministic order (node, vhost, queue, segment), and packed greedily into partitions of about
``maxPartitionBytes`` (a task costs ~30 ms, so small units share a task). No pyspark imports:
this module is tested without a JVM.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from cqforensics.base.errors import CQError, UsageError
from cqforensics.base.schema import SCHEMAS
from cqforensics.model.options import make_options
from cqforensics.model.store import shares_for
from cqforensics.read import driver
from cqforensics.read.driver import QUEUE_LEVEL
from cqforensics.readers.ra_system import read_config
from cqforensics.tables.builders import SHARED_TABLES


@dataclass(frozen=True)
class Unit:
    node_path: str
    node_label: str
    vhost_dir: str
    vhost: str | None
    queue_dir: str | None = None  # None: the whole vhost
    queue: str | None = None
    segment: int | None = None  # v2 segment number (None: the whole queue)
    files: tuple[str, ...] = ()  # files whose rows this unit yields (queue-level units)
    weight: int = 0
    share: int | None = None  # the message-id share of the vhost it reads (None: all ids)
    shares: int = 1  # of how many
    stream: str | None = None  # a stream dir (under the node's stream/) whose records this unit yields
    quorum: str | None = None  # a quorum queue member: its Ra server uid (then queue_dir is None)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _tree_size(root: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(root):
        for n in names:
            total += _size(Path(dirpath) / n)
    return total


def plan_units(paths, table: str, vhosts=None, queues=None) -> list[Unit]:
    """Every unit of ``table`` under ``paths``, in listing order. A ``vhosts``/``queues`` name
    that matches nothing is a ``UsageError`` naming the close names that exist; the queue storage
    a node holds that is not read (quorum queues, streams) is logged as a warning on the driver
    (and is in the ``findings`` table: ``storage-not-read``)."""
    out = []
    nodes = driver.discovered(
        list(paths),
        make_options(bodies=False, decode=False),
        driver.names(vhosts, "vhosts"),
        driver.names(queues, "queues"),
    )
    for node in (ns.node for ns in nodes):
        vhost_list = sorted(node.vhosts, key=lambda v: (v.name is None, v.label))
        streams = _streams(node, queues) if table == "messages" else {}
        quorum_units = _quorum_units(node, vhost_list) if table == "messages" else {}
        for v in vhost_list:
            if vhosts is not None and v.name not in vhosts:
                continue
            base = {"node_path": str(node.path), "node_label": node.node, "vhost_dir": v.dir_name, "vhost": v.name}
            units = _vhost_units(v, base, table, queues)
            out += units
            if table in QUEUE_LEVEL and all(u.share is None for u in units):
                # after the classic queues, in the order a whole read yields them (``tables.messages_batches``)
                out += [Unit(**base, **u) for u in quorum_units.get(v.dir_name, ())]
            out += [
                Unit(**base, stream=d.name, weight=_tree_size(d), files=tuple(str(p) for p in sorted(d.iterdir())))
                for d in streams.get(v.dir_name, [])
            ]
    return out


def _streams(node, queues) -> dict[str, list[Path]]:
    """Vhost dir name -> the node's stream dirs its tables list (``queues``: those of these
    names), in name order."""
    from cqforensics.model.vhost import stream_home, stream_owners
    from cqforensics.readers.metadata import read_metadata

    root = Path(node.path) / "stream"
    if not root.is_dir():
        return {}
    out: dict[str, list[Path]] = {}
    for d, vhost, name, _ in stream_owners(node.path, read_metadata(node.path)):
        home = stream_home(vhost, node.vhosts)
        if home is not None and (queues is None or (name if name is not None else d.name) in queues):
            out.setdefault(home, []).append(d)
    return out


def _quorum_units(node, vhost_list) -> dict[str, list[dict]]:
    """vhost dir name -> the quorum units of its quorum queue members (fields of ``Unit``),
    weighed by their server dir's bytes and their share of the WAL. Every quorum queue is
    listed, whatever the ``queues`` option: a queue's dead letters land in other queues."""
    if not vhost_list:
        return {}
    by_name = {v.name: v.dir_name for v in vhost_list}
    out: dict[str, list[dict]] = {}
    for ra in node.quorum:
        wal = sum(_size(p) for _, p in ra.wal) // max(1, len(ra.servers))
        for srv in ra.servers:
            vhost = name = None
            if srv.config is not None:
                try:
                    res = read_config(srv.config).queue_resource
                except (CQError, OSError):
                    res = None
                if res is not None:
                    vhost, name = (x.decode("utf-8", "replace") for x in res)
            dir_name = by_name.get(vhost, vhost_list[0].dir_name)
            out.setdefault(dir_name, []).append(
                {"queue": name, "quorum": srv.uid, "weight": _tree_size(srv.path) + wal}
            )
    for units in out.values():
        units.sort(key=lambda u: u["quorum"])  # as model.quorum.read_system lists the servers
    return out


def _vhost_units(v, base: dict, table: str, queues) -> list[Unit]:
    """The units of vhost ``v``'s own files."""
    out = []
    parts = shares_for(v.stores.values()) if table in SHARED_TABLES else 1
    if parts > 1:
        weight = _tree_size(v.path) // parts
        return [Unit(**base, weight=weight, share=k, shares=parts) for k in range(parts)]
    if table not in QUEUE_LEVEL:
        return [Unit(**base, weight=_tree_size(v.path))]
    store = sum(_size(p) for st in v.stores.values() for _, p in st.rdq) if table == "messages" else 0
    qdirs = [q for q in v.queues if queues is None or q.name in queues]
    qdirs.sort(
        key=lambda q: (
            q.name is None,
            q.name or q.dir_name,
            -(q.priority if q.priority is not None else -1),
            q.dir_name,
        )
    )
    # the store's bytes are shared out in proportion to index bytes (a proxy for messages)
    index_bytes = {q.dir_name: sum(_size(p) for _, p in q.qi + q.idx) + _size(q.journal or Path("/-")) for q in qdirs}
    total_index = max(1, sum(index_bytes.values()))
    for q in qdirs:
        qb = {**base, "queue_dir": q.dir_name, "queue": q.name}
        if q.qi:
            for number, p in q.qi:
                qs = q.qs.get(number)
                w = _size(p) + (_size(qs) if qs else 0) + store * _size(p) // total_index
                out.append(Unit(**qb, segment=number, files=(str(p),), weight=w))
        elif q.idx or q.journal is not None:
            files = tuple(str(p) for _, p in q.idx) + ((str(q.journal),) if q.journal else ())
            w = index_bytes[q.dir_name] + store * index_bytes[q.dir_name] // total_index
            out.append(Unit(**qb, files=files, weight=w))
    return out


def pack(units: list[Unit], max_bytes: int, min_partitions: int = 1) -> list[list[Unit]]:
    """Greedy sequential packing (keeps unit order): about ``max_bytes`` per partition, at least
    ``min_partitions`` when there are enough units."""
    if not units:
        return []
    total = sum(u.weight for u in units)
    target = max(1, min(max_bytes, math.ceil(total / max(1, min_partitions))))
    parts, cur, size = [], [], 0
    for u in units:
        if cur and size + u.weight > target:
            parts.append(cur)
            cur, size = [], 0
        cur.append(u)
        size += u.weight
    parts.append(cur)
    return parts


def check_columns(table: str, names: list[str]) -> None:
    unknown = [n for n in names if n not in SCHEMAS[table].names]
    if unknown:
        raise UsageError(f"table {table!r} has no column(s) {', '.join(unknown)}")
