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

from cqforensics.base import parallel
from cqforensics.base.errors import OperationalError, UsageError, display
from cqforensics.base.schema import schema
from cqforensics.discovery import nodes as layout
from cqforensics.discovery.nodes import STORAGE_KINDS, storage_kind
from cqforensics.model.options import Options
from cqforensics.model.vhost import NodeScan, VhostScan, passes
from cqforensics.tables.builders import BUILDERS, INDEXED_TABLES, SPLIT_WITH_TAIL

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
    def of(cls, progress, passes: int = 1) -> Progress | None:
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
                index = sum(_size(p) for q in v.queues for _, p in q.qi + q.idx) + sum(
                    _size(q.journal) for q in v.queues if q.journal is not None
                )
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
        parts = [
            f"{what} (pass {self.pass_no + 1} of {self.passes})" if self.passes > 1 else what,
            f"node {k} of {len(self.nodes)}: {display(ns.node.node)}" if len(self.nodes) > 1 else display(ns.node.node),
            f"vhost {display(vs.vhost.label)}",
        ]
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
    durable queue whose index dir is lost still matches: fsck reports it), or a quorum queue
    member's Ra ``config`` names. A queue of a kind of storage cqforensics does not read
    (``layout.STORAGE_KINDS``) is named as such."""
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
        # quorum queue members by their Ra config (a queue whose metadata record is lost is read too)
        read |= {name for vhost, name in ns.quorum_names if vhost in wanted}
        for (vhost, name), rec in ns.metadata.queues.items():
            if display(vhost) not in wanted:
                continue
            kind = storage_kind(rec.type)
            if kind is None or kind.read:
                read.add(display(name))
            else:
                unread.setdefault(display(name), kind.noun)
        read |= {e.label for e in ns.streams if e.label is not None}  # stream dirs, named by metadata or dir
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
        raise UsageError(
            "; ".join(f"queue {q!r} is a {unread[q]}" for q in kinds)
            + ": cqforensics does not read "
            + " or ".join(sorted({unread[q] + "s" for q in kinds}))
            + " yet (it reads "
            + " and ".join(k.noun + "s" for k in STORAGE_KINDS.values() if k.read)
            + ")"
        )
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


def read(
    table: str,
    options: Options,
    *,
    paths=None,
    units: Iterable | None = None,
    columns=None,
    vhosts=None,
    queues=None,
    cache: dict | None = None,
    cache_scope=None,
    build: Callable[[VhostScan], Iterator[pa.RecordBatch]] | Build | None = None,
    progress: Progress | None = None,
    render: Callable[[pa.RecordBatch], object] | None = None,
) -> Iterator:
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
    the table's own builder (``export`` adds its columns this way, a ``Build``). ``progress``:
    told of each vhost read (a read of ``paths``).

    ``options.jobs`` > 1 (paths only): the vhosts, and the share passes and ranges of the
    listing of a big vhost, are read by that many processes (``cqforensics.base.parallel``); the
    rows are the same, in the same order (batches may be cut elsewhere).

    ``render``: each (projected) batch is passed to it where it is made (by a worker, with
    ``jobs`` > 1) and what it returns is yielded instead: JSON lines are written out by every
    process, not only by the one that writes them (a ``Build``'s ``see`` then sees those)."""
    check_columns(table, columns)
    if not isinstance(build, Build) and build is None and table in SPLIT_WITH_TAIL:
        # the rows of the vhost's index chunks may be read in ranges; its streams' rows come once,
        # after them, as a serial read has them (tables.with_streams)
        part, tail = SPLIT_WITH_TAIL[table]
        build = Build(part, splittable=True, in_passes=table in INDEXED_TABLES, tail=lambda vs, _: tail(vs))
    elif not isinstance(build, Build):
        build = Build(
            build or BUILDERS[table],
            splittable=build is None and table in QUEUE_LEVEL,
            in_passes=table in INDEXED_TABLES,
        )
    if columns is not None or render is not None:
        build = dataclasses.replace(
            build,
            part=_finished(build.part, columns, render),
            tail=_finished(build.tail, columns, render) if build.tail else None,
        )
    if options.jobs > 1 and units is None:
        batches = _parallel(table, options, paths, vhosts, queues, build, progress)
    else:
        batches = _serial(table, options, paths, units, vhosts, queues, cache, cache_scope, build, progress)
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


def _serial(table, options, paths, units, vhosts, queues, cache, cache_scope, build: Build, progress=None):
    for vs in scans(
        table,
        options,
        paths=paths,
        units=units,
        vhosts=vhosts,
        queues=queues,
        cache=cache,
        cache_scope=cache_scope,
        progress=progress,
    ):
        yield from build.run(vs)


#: a vhost with fewer bytes of index and store is read by one process as a whole (with others
#: of its size side by side); a bigger one is split (its share passes, ranges of its listing)
SPLIT_BYTES = 32 << 20
#: parts per process a big vhost's listing is cut into (they are handed out as processes free up)
PARTS_PER_JOB = 4


def _parallel(
    table: str, options: Options, paths, vhosts, queues, build: Build, progress: Progress | None = None
) -> Iterator[pa.RecordBatch]:
    """``read`` by ``options.jobs`` processes: per node, runs of small vhosts one vhost a task;
    a big vhost pass by pass (``model.vhost.passes``), each pass's facts made here and its
    listing cut into ranges read by the processes (a table whose rows each belong to an index
    chunk: ``Build.splittable``), or each pass a task (other tables). ``progress`` moves here, a
    vhost at a time, as each vhost's first rows arrive (the workers do not draw it)."""
    jobs = options.jobs
    vhosts, queues = names(vhosts, "vhosts"), names(queues, "queues")
    pa.array([0])  # pyarrow's one-time probe for pandas (an import, when installed): here, not in each worker
    try:
        nodes = discovered(paths, options, vhosts, queues)
    except OSError as e:
        raise operational(e) from e
    progress = Progress.of(progress)
    if progress is not None:
        progress.plan(nodes, vhosts)
    for ns in nodes:
        if vhosts is not None:  # the first vhost read carries the node-level findings
            ns.node_level_vhost = next((b.vhost.dir_name for b in ns.vhosts if b.vhost.name in vhosts), None)
        chosen = []
        for base in ns.vhosts:
            if vhosts is not None and base.vhost.name not in vhosts:
                continue
            restrict = None if queues is None else {q.dir_name: None for q in base.all_queue_dirs if q.name in queues}
            vs = base if restrict is None else VhostScan(ns, base.vhost, restrict, base.vhost_facts())
            if queues is not None:  # the streams and quorum queues it lists, by name (as _scans)
                vs.stream_dirs = {e.path.name for e in ns.streams if e.label in queues}
                vs.quorum_names = queues
            chosen.append(vs)
        ns.model, ns.boot_hangs, ns.durable_dirs, ns.lost_queues  # node-wide facts: made once, before any fork
        i = 0
        while i < len(chosen):
            j = i
            while j < len(chosen) and chosen[j].listing_bytes() < SPLIT_BYTES:
                j += 1
            if j > i:  # small vhosts, one a task

                def whole(task: tuple[int, VhostScan]) -> Iterator[tuple[int, pa.RecordBatch]]:
                    k, vs = task
                    try:
                        for b in build.run(vs):
                            yield k, b
                    finally:
                        vs.close()

                shown = None
                for k, b in parallel.ordered(list(enumerate(chosen[i:j], i)), whole, jobs):
                    if progress is not None and k != shown:
                        progress.vhost(ns, chosen[k], table)
                        shown = k
                    yield b
                i = j
                continue
            vs = chosen[i]
            if progress is not None:
                progress.vhost(ns, vs, table)
            try:
                yield from _split_vhost(vs, build, jobs)
            finally:
                vs.close()
            i += 1
    if progress is not None:
        progress.end()


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


def scans(
    table: str,
    options: Options,
    *,
    paths=None,
    units: Iterable | None = None,
    vhosts=None,
    queues=None,
    cache: dict | None = None,
    cache_scope=None,
    progress: Progress | None = None,
) -> Iterator[VhostScan]:
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
            groups = (((str(ns.node.path), ns.node.node), ns, None, None, None, None) for ns in nodes)
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


def discovered(paths, options: Options, vhosts=None, queues=None) -> list[NodeScan]:
    """A scan of every node dir under ``paths``, once the restriction to ``vhosts``/``queues``
    is known to match something (``check_names``); the storage each node holds that is not read
    is logged as a warning (``warn_unread``). ``paths`` may be ``Nodes`` (scans made already:
    given ``options`` for this read)."""
    if isinstance(paths, Nodes):
        for ns in paths:
            ns.options = options
        nodes = list(paths)
    else:
        nodes = [NodeScan(node, options) for node in layout.discover(paths)]
    check_names(nodes, vhosts, queues)
    warn_unread(nodes)
    return nodes


#: node dirs whose unread storage this process has warned about (once each: a report reads
#: every node several times)
_WARNED: set[str] = set()


def warn_unread(nodes) -> None:
    """A warning (logger ``cqforensics.read.driver``) for each kind of queue storage a node holds that
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
    queue restriction, stream restriction, quorum restriction). A stream unit (``stream``: a dir
    name under the node's ``stream/``) names the vhost that lists it (``model.vhost.stream_home``;
    none: every vhost is asked, and the one that lists it yields its rows). A queue-level group
    reads the classic queue dirs (and segments) its units name and the quorum queue members (Ra
    server uids) they name."""
    units = list(units)
    i = 0
    while i < len(units):
        u = units[i]
        stream = getattr(u, "stream", None) is not None
        j = i + 1
        while (
            j < len(units)
            and (units[j].node_path, units[j].vhost_dir) == (u.node_path, u.vhost_dir)
            and (getattr(units[j], "stream", None) is not None) == stream
        ):
            j += 1
        if stream:
            yield (
                (u.node_path, u.node_label),
                (u.node_path, u.node_label),
                u.vhost_dir or None,
                {},
                {g.stream for g in units[i:j]},
                set(),
            )  # a stream unit: no quorum queue member
            i = j
            continue
        only, quorum = None, None
        if table in QUEUE_LEVEL and all(
            g.queue_dir is not None or getattr(g, "quorum", None) for g in units[i:j]
        ):  # else: whole vhosts
            only, quorum = {}, set()
            for g in units[i:j]:
                if getattr(g, "quorum", None):
                    quorum.add(g.quorum)
                    continue
                segs = only.setdefault(g.queue_dir, set() if g.segment is not None else None)
                if segs is not None and g.segment is not None:
                    segs.add(g.segment)
        yield (u.node_path, u.node_label), (u.node_path, u.node_label), u.vhost_dir, only, None, quorum
        i = j


def _scans(options, groups, vhosts, queues, cache, cache_scope):
    ns, ns_id = None, None
    for node_id, node, vhost_dir, only, streams, quorum in groups:
        key = (
            (cache_scope, *node_id, vhost_dir)
            if cache is not None and cache_scope is not None and vhost_dir is not None
            else None
        )
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
            vs = (
                base
                if restrict is None and not facts
                else VhostScan(ns, base.vhost, restrict, facts or base.vhost_facts())
            )
            if streams is not None or queues is not None:  # the streams it lists, by dir name
                dirs = streams
                if queues is not None:
                    named = {e.path.name for e in ns.streams if e.label in queues}
                    dirs = named if dirs is None else dirs & named
                vs.stream_dirs = dirs
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
