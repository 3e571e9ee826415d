"""The one read driver: (node dirs or planned units, options, vhost/queue restriction, table) ->
Arrow batches. The Python API (``api.iter_batches``/``read_table``, hence the CLI's ``read``)
and the Spark reader (``spark_datasource.source.read_units``) both read through ``read``.

Errors are closed here: whatever the readers raise that is not a ``CQError`` but an ``OSError``
(an unreadable file or dir) leaves as an ``OperationalError`` naming the path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pyarrow as pa

from cqforensics import layout
from cqforensics.errors import OperationalError, UsageError, display
from cqforensics.model.options import Options
from cqforensics.model.vhost import NodeScan, VhostScan
from cqforensics.schema import schema
from cqforensics.tables import BUILDERS

#: tables whose rows come queue by queue (a unit of them may name a queue dir and a segment)
QUEUE_LEVEL = frozenset({"messages", "index", "acks"})


def check_columns(table: str, columns) -> pa.Schema:
    """The schema of ``table`` projected to ``columns`` (None: all), or UsageError."""
    sch = schema(table)
    if columns is None:
        return sch
    unknown = [c for c in columns if c not in sch.names]
    if unknown:
        raise UsageError(f"table {table!r} has no column(s) {', '.join(unknown)}")
    return pa.schema([sch.field(c) for c in columns])


def names(value, what: str) -> frozenset[str] | None:
    """A vhost or queue restriction: None (all), one name (a string) or an iterable of names."""
    if value is None:
        return None
    if isinstance(value, str):
        return frozenset((value,))
    if isinstance(value, bytes):
        raise UsageError(f"{what}: give names as str, not bytes")
    try:
        out = frozenset(value)
    except TypeError:
        raise UsageError(f"{what}: a name or a list of names, not {type(value).__name__}") from None
    bad = [v for v in out if not isinstance(v, str)]
    if bad:
        raise UsageError(f"{what}: names must be strings, not {bad[0]!r}")
    return out


def operational(e: OSError) -> OperationalError:
    """An ``OSError`` as the ``OperationalError`` naming its path."""
    where = display(e.filename) if e.filename is not None else "input"
    return OperationalError(f"{where}: {e.strerror or e}")


def read(table: str, options: Options, *, paths=None, units: Iterable | None = None, columns=None, vhosts=None,
         queues=None, cache: dict | None = None, cache_scope=None,
         build: Callable[[VhostScan], Iterator[pa.RecordBatch]] | None = None) -> Iterator[pa.RecordBatch]:
    """Batches of ``table`` (projected to ``columns``), read with ``options``.

    Either ``paths`` (node dirs, mnesia bases or folders of them; every node dir found is read,
    its vhosts restricted to ``vhosts`` and the queue dirs to ``queues``, by name: one name as a
    str, or a list of names), or ``units``: planned work units (objects with ``node_path``,
    ``node_label``, ``vhost_dir``, ``queue_dir`` and ``segment``, as
    ``spark_datasource.plan.Unit``); consecutive units of one vhost are read by one scan, so its
    shared store is indexed once.

    ``cache`` (a dict the caller keeps, e.g. per worker process) with a ``cache_scope`` (e.g. a
    Spark stage id): the vhost-wide facts of the last vhost read are kept there and reused by
    the next read of the same vhost in the same scope. ``build``: a vhost's batches instead of
    the table's own builder (``export`` adds its columns this way)."""
    check_columns(table, columns)
    build = build or BUILDERS[table]
    for vs in scans(table, options, paths=paths, units=units, vhosts=vhosts, queues=queues, cache=cache,
                    cache_scope=cache_scope):
        try:
            for b in build(vs):
                yield b if columns is None else b.select(columns)
        except OSError as e:
            raise operational(e) from e


def scans(table: str, options: Options, *, paths=None, units: Iterable | None = None, vhosts=None, queues=None,
          cache: dict | None = None, cache_scope=None) -> Iterator[VhostScan]:
    """The vhost scans ``read`` builds ``table`` from (arguments: see ``read``); each is closed
    when the next is asked for."""
    if (paths is None) == (units is None):
        raise UsageError("give either paths or units")
    vhosts, queues = names(vhosts, "vhosts"), names(queues, "queues")
    try:
        groups = _discovered(paths) if units is None else _grouped(units, table)
        yield from _scans(options, groups, vhosts, queues, cache, cache_scope)
    except OSError as e:
        raise operational(e) from e


def _discovered(paths):
    """(node id, node dir, None: every vhost, None: no unit restriction) per node dir found."""
    for node in layout.discover(paths):
        yield (str(node.path), node.node), node, None, None, None


def _grouped(units, table: str):
    """Consecutive units of one vhost as (node id, (path, label) of the node dir, vhost dir,
    queue restriction, quorum restriction). A queue-level group reads the classic queue dirs
    (and segments) its units name and the quorum queue members (Ra server uids) they name."""
    units = list(units)
    i = 0
    while i < len(units):
        u = units[i]
        j = i + 1
        while j < len(units) and (units[j].node_path, units[j].vhost_dir) == (u.node_path, u.vhost_dir):
            j += 1
        only, quorum = None, None
        if table in QUEUE_LEVEL and all(g.queue_dir is not None or getattr(g, "quorum", None)
                                        for g in units[i:j]):  # else: whole vhosts
            only, quorum = {}, set()
            for g in units[i:j]:
                if getattr(g, "quorum", None):
                    quorum.add(g.quorum)
                    continue
                segs = only.setdefault(g.queue_dir, set() if g.segment is not None else None)
                if segs is not None and g.segment is not None:
                    segs.add(g.segment)
        yield (u.node_path, u.node_label), (u.node_path, u.node_label), u.vhost_dir, only, quorum
        i = j


def _scans(options, groups, vhosts, queues, cache, cache_scope):
    ns, ns_id = None, None
    for node_id, node, vhost_dir, only, quorum in groups:
        key = (cache_scope, *node_id, vhost_dir) if cache is not None and cache_scope is not None \
            and vhost_dir is not None else None
        cached, facts = cache.get(key, (None, {})) if key is not None else (None, {})
        if cached is not None:
            ns, ns_id = cached, node_id
        elif ns is None or ns_id != node_id:
            if isinstance(node, tuple):
                node = layout.read_node_dir(Path(node[0]), node[1])
            ns, ns_id = NodeScan(node, options), node_id
        for base in ns.vhosts:
            if vhost_dir is not None and base.vhost.dir_name != vhost_dir:
                continue
            if vhosts is not None and base.vhost.name not in vhosts:
                continue
            restrict = only
            if restrict is None and queues is not None:
                restrict = {q.dir_name: None for q in base.all_queue_dirs if q.name in queues}
            # the node's own scan when reading a whole vhost afresh: facts computed for it (the
            # index pass a boot-hang check needs) serve the whole node
            vs = base if restrict is None and not facts else \
                VhostScan(ns, base.vhost, restrict, facts or base.vhost_facts())
            if vs is not base:
                vs.quorum_names = queues
                vs.quorum_uids = frozenset(quorum) if quorum is not None else None
            try:
                yield vs
            finally:
                if key is not None:
                    cache.clear()
                    cache[key] = (ns, vs.vhost_facts())
                vs.close()
