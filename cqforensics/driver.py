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
from cqforensics.layout import storage_kind
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


class Progress:
    """How far a long command is, in bytes of the vhost dirs it reads, for a display
    ``show(text, done, total)`` (the CLI's bar on a terminal; tqdm gives the rate and the time
    left). ``passes``: how many times the command reads every vhost (``report``: fsck and five
    tables). Within a vhost it moves as its queue indexes are listed (each chunk's share of the
    vhost's bytes, by its index bytes: ``NodeScan.progress``), and to the vhost's end when the
    vhost is done; the text names the node (``node 8 of 30``), the vhost and the pass."""

    def __init__(self, show: Callable[[str, int | None, int | None], None], passes: int = 1):
        self.show, self.passes = show, passes
        self.sizes: dict[tuple[str, str], tuple[int, int]] = {}  # (node, vhost dir) -> (bytes, index bytes)
        self.nodes: list[str] = []
        self.total = self.done = 0
        self.pass_no = 0
        self._base = self._span = 0.0
        self._scale = 0.0
        self._text = ""

    @classmethod
    def of(cls, progress, passes: int = 1) -> "Progress | None":
        """``progress`` as a ``Progress``: None stays None, a display ``(text, done, total)`` is
        wrapped (for ``passes`` passes)."""
        if progress is None or isinstance(progress, Progress):
            return progress
        return cls(progress, passes)

    def plan(self, scans, vhosts=None) -> None:
        """The node scans every pass reads (and the vhost restriction): the total; the first call
        sets it, a later pass starts the next round."""
        if self.nodes:
            self.pass_no += 1
            return
        for ns in scans:
            self.nodes.append(str(ns.node.path))
            for v in (vs.vhost for vs in ns.vhosts):  # named as the read names them (metadata too)
                if vhosts is not None and v.name not in vhosts:
                    continue
                index = sum(_size(p) for q in v.queues for _, p in q.qi + q.idx) + \
                    sum(_size(q.journal) for q in v.queues if q.journal is not None)
                self.sizes[(str(ns.node.path), v.dir_name)] = (layout.tree_bytes(v.path), index)
        self.total = max(1, self.passes * sum(b for b, _ in self.sizes.values()))

    def attach(self, ns: NodeScan) -> None:
        ns.progress = self.advance

    def vhost(self, ns: NodeScan, vs: VhostScan, what: str = "") -> None:
        """A vhost's read begins (the one before it is done)."""
        self.end()
        nbytes, index = self.sizes.get((str(ns.node.path), vs.vhost.dir_name), (0, 0))
        self._base, self._span = self.done, nbytes
        self._scale = nbytes / index if index else 0.0
        node = str(ns.node.path)
        k = self.nodes.index(node) + 1 if node in self.nodes else 0
        parts = [f"{what} (pass {self.pass_no + 1} of {self.passes})" if self.passes > 1 else what,
                 f"node {k} of {len(self.nodes)}: {display(ns.node.node)}" if len(self.nodes) > 1 else
                 display(ns.node.node), f"vhost {display(vs.vhost.label)}"]
        self._text = " · ".join(p for p in parts if p)
        self.show(self._text, int(self.done), self.total)

    def advance(self, index_bytes: float) -> None:
        """Index bytes listed in the current vhost (from ``NodeScan.progress``)."""
        if not self._span:
            return
        self.done = min(self._base + self._span, self.done + index_bytes * self._scale)
        self.show(self._text, int(self.done), self.total)

    def end(self) -> None:
        """The current vhost is done."""
        if self._span:
            self.done = self._base + self._span
            self._span = 0
            self.show(self._text, int(self.done), self.total)


def _size(path) -> int:
    import os

    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def check_names(scans, vhosts, queues) -> None:
    """A vhost or queue restriction whose names match nothing on the node dirs read is a
    ``UsageError`` naming the close names that exist: a typo must not read as an empty, clean
    answer. ``scans``: the ``NodeScan`` of every node read; ``vhosts``/``queues``: as ``names``
    returns them (None: no restriction). A name matches when a node has it: a vhost its dirs or
    metadata name, a queue of those vhosts its queue dirs or durable-queue metadata name (a
    durable queue whose index dir is lost still matches: fsck reports it). A queue of a kind of
    storage cqforensics does not read (``layout.STORAGE_KINDS``) is named as such."""
    if vhosts is None and queues is None:
        return
    known_vhosts: set[str] = set()
    read: set[str] = set()  # queues of the kinds cqforensics reads
    unread: dict[str, str] = {}  # queue name -> the kind's noun
    for ns in scans:
        named = {vs.vhost.name for vs in ns.vhosts if vs.vhost.name is not None}
        named |= {display(v) for v in ns.metadata.vhosts}
        known_vhosts |= named
        wanted = named if vhosts is None else named & vhosts
        for vs in ns.vhosts:
            if vs.vhost.name in wanted:
                read |= {q.name for q in vs.all_queue_dirs if q.name is not None}
        for (vhost, name), rec in ns.metadata.queues.items():
            if display(vhost) not in wanted:
                continue
            kind = storage_kind(rec.type)
            if kind is None or kind.read:
                read.add(display(name))
            else:
                unread.setdefault(display(name), kind.noun)
    where = f"on {'the node' if len(scans) == 1 else f'the {len(scans)} nodes'} read"
    if vhosts is not None:
        missing = sorted(vhosts - known_vhosts)
        if missing:
            raise UsageError(unmatched("vhost", missing, known_vhosts, where))
    if queues is None:
        return
    missing = sorted(queues - read)
    kinds = [q for q in missing if q in unread]
    if kinds:
        raise UsageError("; ".join(f"queue {q!r} is a {unread[q]}" for q in kinds) + ": cqforensics does not read "
                         + " or ".join(sorted({unread[q] + "s" for q in kinds})) + " yet (it reads classic queues)")
    if missing:
        if vhosts is not None:
            where = f"in vhost {' or '.join(map(repr, sorted(vhosts)))} {where}"
        raise UsageError(unmatched("queue", missing, read, where))


def unmatched(what: str, missing: list[str], existing: set[str], where: str) -> str:
    """The usage error of names that match nothing: the close names that exist (else some)."""
    import difflib

    pool = sorted(existing)
    close = sorted({c for m in missing for c in difflib.get_close_matches(m, pool, n=5, cutoff=0.6)})
    text = f"no {what} named {' or '.join(map(repr, missing))} {where}"
    if close:
        return text + f"; did you mean {' or '.join(map(repr, close))}?"
    if not pool:
        return text + f" (there is no {what} there)"
    shown = ", ".join(map(repr, pool[:12]))
    return text + f" ({what}s there: {shown}{f' and {len(pool) - 12} more' if len(pool) > 12 else ''})"


def operational(e: OSError) -> OperationalError:
    """An ``OSError`` as the ``OperationalError`` naming its path."""
    where = display(e.filename) if e.filename is not None else "input"
    return OperationalError(f"{where}: {e.strerror or e}")


def read(table: str, options: Options, *, paths=None, units: Iterable | None = None, columns=None, vhosts=None,
         queues=None, cache: dict | None = None, cache_scope=None,
         build: Callable[[VhostScan], Iterator[pa.RecordBatch]] | None = None,
         progress: Progress | None = None) -> Iterator[pa.RecordBatch]:
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
    the table's own builder (``export`` adds its columns this way). ``progress``: told of each
    vhost read (a read of ``paths``)."""
    check_columns(table, columns)
    build = build or BUILDERS[table]
    for vs in scans(table, options, paths=paths, units=units, vhosts=vhosts, queues=queues, cache=cache,
                    cache_scope=cache_scope, progress=progress):
        try:
            for b in build(vs):
                yield b if columns is None else b.select(columns)
        except OSError as e:
            raise operational(e) from e


def scans(table: str, options: Options, *, paths=None, units: Iterable | None = None, vhosts=None, queues=None,
          cache: dict | None = None, cache_scope=None, progress: Progress | None = None) -> Iterator[VhostScan]:
    """The vhost scans ``read`` builds ``table`` from (arguments: see ``read``); each is closed
    when the next is asked for."""
    if (paths is None) == (units is None):
        raise UsageError("give either paths or units")
    vhosts, queues = names(vhosts, "vhosts"), names(queues, "queues")
    try:
        if units is None:
            nodes = discovered(paths, options, vhosts, queues)
            progress = Progress.of(progress)
            if progress is not None:
                progress.plan(nodes, vhosts)
                for ns in nodes:
                    progress.attach(ns)
            groups = (((str(ns.node.path), ns.node.node), ns, None, None) for ns in nodes)
        else:
            groups = _grouped(units, table)
        for vs in _scans(options, groups, vhosts, queues, cache, cache_scope):
            if progress is not None:
                progress.vhost(vs.node, vs, table)
            yield vs
        if progress is not None:
            progress.end()
    except OSError as e:
        raise operational(e) from e


def discovered(paths, options: Options, vhosts=None, queues=None) -> list[NodeScan]:
    """A scan of every node dir under ``paths``, once the restriction to ``vhosts``/``queues``
    is known to match something (``check_names``); the storage each node holds that is not read
    is logged as a warning (``warn_unread``)."""
    nodes = [NodeScan(node, options) for node in layout.discover(paths)]
    check_names(nodes, vhosts, queues)
    warn_unread(nodes)
    return nodes


#: node dirs whose unread storage this process has warned about (once each: a report reads
#: every node several times)
_WARNED: set[str] = set()


def warn_unread(nodes) -> None:
    """A warning (logger ``cqforensics.driver``) for each kind of queue storage a node holds that
    cqforensics does not read (``NodeScan.unread_storage``), once per node dir and process: a
    read of the tables leaves them out, and says so. The ``findings`` table has them too
    (``storage-not-read``)."""
    import logging

    for ns in nodes:
        key = str(ns.node.path)
        if key in _WARNED:
            continue
        _WARNED.add(key)
        for u in ns.unread_storage:
            logging.getLogger(__name__).warning("%s: %s", display(ns.node.node), u.describe())


def _grouped(units, table: str):
    """Consecutive units of one vhost as (node id, (path, label) of the node dir, vhost dir,
    queue restriction)."""
    units = list(units)
    i = 0
    while i < len(units):
        u = units[i]
        j = i + 1
        while j < len(units) and (units[j].node_path, units[j].vhost_dir) == (u.node_path, u.vhost_dir):
            j += 1
        only = None
        if table in QUEUE_LEVEL and all(g.queue_dir is not None for g in units[i:j]):  # else: whole vhosts
            only = {}
            for g in units[i:j]:
                segs = only.setdefault(g.queue_dir, set() if g.segment is not None else None)
                if segs is not None and g.segment is not None:
                    segs.add(g.segment)
        yield (u.node_path, u.node_label), (u.node_path, u.node_label), u.vhost_dir, only
        i = j


def _scans(options, groups, vhosts, queues, cache, cache_scope):
    ns, ns_id = None, None
    for node_id, node, vhost_dir, only in groups:
        key = (cache_scope, *node_id, vhost_dir) if cache is not None and cache_scope is not None \
            and vhost_dir is not None else None
        cached, facts = cache.get(key, (None, {})) if key is not None else (None, {})
        if cached is not None:
            ns, ns_id = cached, node_id
        elif isinstance(node, NodeScan):
            ns, ns_id = node, node_id
        elif ns is None or ns_id != node_id:
            if isinstance(node, tuple):
                node = layout.read_node_dir(Path(node[0]), node[1])
            ns, ns_id = NodeScan(node, options), node_id
        if vhosts is not None:  # the first vhost read carries the node-level findings (the same in every task)
            ns.node_level_vhost = next((b.vhost.dir_name for b in ns.vhosts if b.vhost.name in vhosts), None)
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
            try:
                yield vs
            finally:
                if key is not None:
                    cache.clear()
                    cache[key] = (ns, vs.vhost_facts())
                vs.close()
