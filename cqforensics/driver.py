"""The one read driver: (node dirs or planned units, options, vhost/queue restriction, table) ->
Arrow batches. The Python API (``api.iter_batches``/``read_table``, hence the CLI's ``read``)
and the Spark reader (``spark_datasource.source.read_units``) both read through ``read``.

Errors are closed here: whatever the readers raise that is not a ``CQError`` but an ``OSError``
(an unreadable file or dir) leaves as an ``OperationalError`` naming the path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from cqforensics import layout, parallel
from cqforensics.errors import OperationalError, UsageError, display
from cqforensics.model.options import Options
from cqforensics.model.vhost import NodeScan, VhostScan, passes
from cqforensics.schema import schema
from cqforensics.tables import BUILDERS, INDEXED_TABLES

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


@dataclass
class Build:
    """How a vhost's batches are made, in a form a read with ``jobs`` > 1 can split: ``part``
    gives the rows of a scan (a whole vhost, one share pass of it, or a range of its listing
    when ``splittable``: each row belongs to one index chunk, in listing order); ``start``,
    ``see`` and ``tail`` run in the caller, around the parts of one vhost: ``start(vs)`` makes a
    state, ``see(state, batch)`` is shown each batch of the parts as it is handed on, and
    ``tail(vs, state)`` gives the vhost's last rows (``export --all``: the entries no index row
    emitted)."""

    part: Callable[[VhostScan], Iterator[pa.RecordBatch]]
    splittable: bool = False
    #: a big vhost's rows come pass by pass, an id share at a time (``tables.INDEXED_TABLES``:
    #: rows that need the store's entries); else in one pass whatever the vhost's size
    in_passes: bool = False
    start: Callable[[VhostScan], object] | None = None
    see: Callable[[object, pa.RecordBatch], None] | None = None
    tail: Callable[[VhostScan, object], Iterator[pa.RecordBatch]] | None = None

    def run(self, vs: VhostScan) -> Iterator[pa.RecordBatch]:
        """The vhost's batches, in this process."""
        state = self.start(vs) if self.start else None
        for b in self.part(vs):
            if self.see:
                self.see(state, b)
            yield b
        if self.tail:
            yield from self.tail(vs, state)


def read(table: str, options: Options, *, paths=None, units: Iterable | None = None, columns=None, vhosts=None,
         queues=None, cache: dict | None = None, cache_scope=None,
         build: "Callable[[VhostScan], Iterator[pa.RecordBatch]] | Build | None" = None,
         render: Callable[[pa.RecordBatch], object] | None = None) -> Iterator:
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
    the table's own builder (``export`` adds its columns this way, a ``Build``).

    ``options.jobs`` > 1 (paths only): the vhosts, and the share passes and ranges of the
    listing of a big vhost, are read by that many processes (``cqforensics.parallel``); the
    rows are the same, in the same order (batches may be cut elsewhere).

    ``render``: each (projected) batch is passed to it where it is made (by a worker, with
    ``jobs`` > 1) and what it returns is yielded instead: JSON lines are written out by every
    process, not only by the one that writes them (a ``Build``'s ``see`` then sees those)."""
    check_columns(table, columns)
    if not isinstance(build, Build):
        build = Build(build or BUILDERS[table], splittable=build is None and table in QUEUE_LEVEL,
                      in_passes=table in INDEXED_TABLES)
    if columns is not None or render is not None:
        build = dataclasses.replace(build, part=_finished(build.part, columns, render),
                                    tail=_finished(build.tail, columns, render) if build.tail else None)
    if options.jobs > 1 and units is None:
        batches = _parallel(table, options, paths, vhosts, queues, build)
    else:
        batches = _serial(table, options, paths, units, vhosts, queues, cache, cache_scope, build)
    try:
        yield from batches
    except OSError as e:
        raise operational(e) from e


def _finished(make: Callable, columns, render):
    """``make`` (a ``Build``'s part or tail) with its batches projected to ``columns`` and
    passed through ``render``, where they are made."""
    def finished(*args):
        for b in make(*args):
            if columns is not None:
                b = b.select(columns)
            yield render(b) if render is not None else b
    return finished


def _serial(table, options, paths, units, vhosts, queues, cache, cache_scope, build: Build):
    for vs in scans(table, options, paths=paths, units=units, vhosts=vhosts, queues=queues, cache=cache,
                    cache_scope=cache_scope):
        yield from build.run(vs)


#: a vhost with fewer bytes of index and store is read by one process as a whole (with others
#: of its size side by side); a bigger one is split (its share passes, ranges of its listing)
SPLIT_BYTES = 32 << 20
#: parts per process a big vhost's listing is cut into (they are handed out as processes free up)
PARTS_PER_JOB = 4


def _parallel(table: str, options: Options, paths, vhosts, queues, build: Build) -> Iterator[pa.RecordBatch]:
    """``read`` by ``options.jobs`` processes: per node, runs of small vhosts one vhost a task;
    a big vhost pass by pass (``model.vhost.passes``), each pass's facts made here and its
    listing cut into ranges read by the processes (a table whose rows each belong to an index
    chunk: ``Build.splittable``), or each pass a task (other tables)."""
    jobs = options.jobs
    vhosts, queues = names(vhosts, "vhosts"), names(queues, "queues")
    pa.array([0])  # pyarrow's one-time probe for pandas (an import, when installed): here, not in each worker
    try:
        nodes = _nodes(paths, options)
    except OSError as e:
        raise operational(e) from e
    for node in nodes:
        ns = node if isinstance(node, NodeScan) else NodeScan(node, options)
        chosen = []
        for base in ns.vhosts:
            if vhosts is not None and base.vhost.name not in vhosts:
                continue
            restrict = None if queues is None else \
                {q.dir_name: None for q in base.all_queue_dirs if q.name in queues}
            chosen.append(base if restrict is None else VhostScan(ns, base.vhost, restrict, base.vhost_facts()))
        ns.model, ns.boot_hangs, ns.durable_dirs, ns.lost_queues  # node-wide facts: made once, before any fork
        i = 0
        while i < len(chosen):
            j = i
            while j < len(chosen) and chosen[j].listing_bytes() < SPLIT_BYTES:
                j += 1
            if j > i:  # small vhosts, one a task
                def whole(vs: VhostScan) -> Iterator[pa.RecordBatch]:
                    try:
                        yield from build.run(vs)
                    finally:
                        vs.close()
                yield from parallel.ordered(chosen[i:j], whole, jobs)
                i = j
                continue
            vs = chosen[i]
            try:
                yield from _split_vhost(vs, build, jobs)
            finally:
                vs.close()
            i += 1


def _split_vhost(vs: VhostScan, build: Build, jobs: int) -> Iterator[pa.RecordBatch]:
    """A big vhost's batches: a splittable build pass by pass, each pass's listing read in
    ranges by ``jobs`` processes (its facts made here first); any other in this process (the
    checks of the ``findings`` table split their own listing: ``checks.vhost``)."""
    if not build.splittable:
        yield from build.run(vs)
        return
    state = build.start(vs) if build.start else None
    for sub in passes(vs) if build.in_passes else (vs,):
        sub.prepare()
        facts = sub.vhost_facts()

        def part(only: dict, sub=sub, facts=facts) -> Iterator[pa.RecordBatch]:
            scan = VhostScan(sub.node, sub.vhost, only, facts, sub.share)
            try:
                yield from build.part(scan)
            finally:
                scan.close()
        for b in parallel.ordered(sub.ranges(jobs * PARTS_PER_JOB), part, jobs):
            if build.see:
                build.see(state, b)
            yield b
    if build.tail:
        yield from build.tail(vs, state)


def scans(table: str, options: Options, *, paths=None, units: Iterable | None = None, vhosts=None, queues=None,
          cache: dict | None = None, cache_scope=None) -> Iterator[VhostScan]:
    """The vhost scans ``read`` builds ``table`` from (arguments: see ``read``); each is closed
    when the next is asked for."""
    if (paths is None) == (units is None):
        raise UsageError("give either paths or units")
    vhosts, queues = names(vhosts, "vhosts"), names(queues, "queues")
    try:
        groups = _discovered(paths, options) if units is None else _grouped(units, table)
        yield from _scans(options, groups, vhosts, queues, cache, cache_scope)
    except OSError as e:
        raise operational(e) from e


class Nodes(list):
    """The node scans of some paths, made once (``open_nodes``) for several reads of them (audit's
    four tables, export's provenance and rows): the node dirs are listed and their metadata read
    once, not once a read. Given as ``paths``; each read sets its own options on them."""


def open_nodes(paths, options: Options) -> Nodes:
    """``Nodes`` of every node dir under ``paths``."""
    try:
        return Nodes(NodeScan(node, options) for node in layout.discover(paths))
    except OSError as e:
        raise operational(e) from e


def _nodes(paths, options: Options) -> list:
    """Node dirs to read: ``paths`` discovered, or the node scans of a ``Nodes`` (given
    ``options`` for this read)."""
    if isinstance(paths, Nodes):
        for ns in paths:
            ns.options = options
        return list(paths)
    return layout.discover(paths)


def _discovered(paths, options: Options):
    """(node id, node dir or scan, None: every vhost, None: no unit restriction) per node."""
    for node in _nodes(paths, options):
        where = node.node if isinstance(node, NodeScan) else node
        yield (str(where.path), where.node), node, None, None


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
        elif ns is None or ns_id != node_id:
            if isinstance(node, tuple):
                node = layout.read_node_dir(Path(node[0]), node[1])
            ns, ns_id = (node if isinstance(node, NodeScan) else NodeScan(node, options)), node_id
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
