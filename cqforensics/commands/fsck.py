"""fsck: every check, and what the next boot of a given broker version will deliver or drop.

Read-only: files are opened for reading and memory-mapped read-only; nothing is written under
the input. The prediction is the one the ``messages`` table carries (``survives_restart`` /
``drop_reason``), summed per queue; the checks add what the broker never looks at (orphans,
duplicates, reference counts, fragmentation) and name where each problem is (file + offset).

Two recovery paths (per vhost): *dirty* (after a crash or kill -9: the broker rebuilds from the
files and silently drops what it cannot verify; modelled exactly and tested against real
brokers) and *clean* (after a clean stop: the broker trusts its shutdown state and crashes when
it reads a damaged message; fsck names those queues and says how to force a dirty recovery).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cqforensics.base import exitcodes, parallel
from cqforensics.base.errors import display
from cqforensics.base.findings import ERROR, SEVERITY_RANK, Finding
from cqforensics.checks import QueueVerdict, check_vhost, node_level_findings
from cqforensics.discovery import nodes as layout
from cqforensics.model.options import make_options, parse_as_of
from cqforensics.model.vhost import NodeScan
from cqforensics.output import provenance


@dataclass
class NodeVerdict:
    node: str
    path: str
    broker_version: str
    version_source: str  # why this version (inferred evidence, or the option)
    vhost_recovery: dict[str, str]
    boot: str  # "ok" or "hangs"
    warnings: list[str] = field(default_factory=list)
    written_by: dict = field(default_factory=dict)  # the inferred VersionRange (low, high, label, why)
    #: the version predicted for is an assumption: inferred from data that more than one series
    #: of the version table could have written (the newest of them is taken), not named
    broker_version_assumed: bool = False
    not_read: list[dict] = field(default_factory=list)  # model.vhost.UnreadStorage.to_dict of each kind

    @property
    def version_inferred(self) -> bool:
        return self.version_source.startswith("inferred")

    def to_dict(self) -> dict:
        return {
            "node": self.node,
            "path": self.path,
            "broker_version": self.broker_version,
            "version_source": self.version_source,
            "written_by": self.written_by,
            "broker_version_assumed": self.broker_version_assumed,
            "not_read": self.not_read,
            "recovery": self.vhost_recovery,
            "boot": self.boot,
            "warnings": self.warnings,
        }


@dataclass
class Report:
    nodes: list[NodeVerdict] = field(default_factory=list)
    queues: list[QueueVerdict] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    provenance: dict | None = None  # cqforensics.output.provenance.record: tool, core, inputs' sha256, version, as_of
    as_of_ms: int | None = None  # when TTLs were judged
    as_of_given: bool = False  # by the caller (--as-of), not the clock

    @property
    def incomplete(self) -> bool:
        """Whether a node holds queue storage fsck does not read (``storage-not-read``)."""
        return any(f.code == "storage-not-read" for f in self.findings)

    @property
    def exit_code(self) -> int:
        """e2fsck style, bits: 4 when errors are left (fsck fixes nothing), 2 when the check is
        incomplete (queue storage not read: quorum queues, streams); 0 when neither."""
        return (exitcodes.ERRORS_LEFT if any(f.severity == ERROR for f in self.findings) else exitcodes.OK) | (
            exitcodes.INCOMPLETE if self.incomplete else exitcodes.OK
        )

    def to_dict(self) -> dict:
        return {
            "format": "cqforensics-fsck/1",
            "nodes": [n.to_dict() for n in self.nodes],
            "queues": [q.to_dict() for q in self.queues],
            "findings": [f.to_dict() for f in self.findings],
            "summary": self.summary(),
            "exit_code": self.exit_code,
            "provenance": self.provenance,
        }

    def summary(self) -> dict:
        """Counts, and when TTLs were judged: ``expired`` messages are past their TTL at
        ``ttls_judged_at``, the clock's time of the run (``ttls_judged_by`` "clock") or the one
        given (``--as-of``: "as_of")."""
        counts = {s: sum(1 for f in self.findings if f.severity == s) for s in SEVERITY_RANK}
        return {
            "findings": counts,
            "queues": len(self.queues),
            "messages": sum(q.messages for q in self.queues),
            "predicted_after_restart": sum(q.predicted_after_restart for q in self.queues),
            "predicted_min": sum(q.predicted_min for q in self.queues),
            "predicted_max": sum(q.predicted_max for q in self.queues),
            "dropped": sum(q.dropped for q in self.queues),
            "crashes": sorted({q.crash for q in self.queues if q.crash}),
            "expired": sum(q.drops.get("expired", 0) for q in self.queues),
            "ttls_judged_at": provenance.iso(self.as_of_ms) if self.as_of_ms is not None else None,
            "ttls_judged_by": "as_of" if self.as_of_given else "clock",
            "not_read": sorted({u["kind"] for n in self.nodes for u in n.not_read}),
        }


def running_broker(node_dir: Path) -> str | None:
    """A live broker on this node dir: its pid file, or a beam process naming the dir."""
    pid_file = node_dir.parent / f"{node_dir.name}.pid"
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
        return f"pid {pid} from {display(pid_file)} is alive"
    except (OSError, ValueError):
        pass
    try:
        procs = os.listdir("/proc")
    except OSError:
        return None
    needle = os.fsencode(node_dir.parent)
    for p in procs:
        if not p.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        if b"beam" in cmd and needle in cmd:
            return f"process {p} (beam) runs on {display(node_dir.parent)}"
    return None


def fsck(
    paths,
    broker_version: str | None = None,
    as_of=None,
    deep: bool = False,
    assume_dirty: bool = False,
    progress=None,
    vhosts=None,
    queues=None,
    jobs: int = 1,
    scans: list[NodeScan] | None = None,
    record: bool = True,
) -> Iterator:
    """Check every node dir under ``paths``. Yields findings as they are found and, last, the
    Report (whose findings list holds them all). ``vhosts`` (names) checks only those vhosts;
    ``queues`` (names) keeps only those queues' verdicts and findings, and the findings that
    name no queue (store-wide: a vhost's checks need all of it, so it is still read whole).
    ``jobs``: nodes checked at once, each in its own process (a folder of backups); the report
    is the same, in the same order, whatever ``jobs`` is. A vhost or queue name that matches
    nothing is a ``UsageError`` naming the close names that exist. ``progress``: a
    ``driver.Progress``, or a display ``(text, done, total)`` one is made for. ``scans``: the
    node scans of ``paths`` made already (``read.driver.open_nodes``: a report's, which its
    table reads share), checked with this check's options instead of listing the nodes again.
    ``record``: False leaves out the provenance record (``Report.provenance`` None) and with it
    the hashing of every input file, for a caller that shows neither (the report page)."""
    from cqforensics.read.driver import Progress, check_names, names

    vhosts, queues = names(vhosts, "vhosts"), names(queues, "queues")
    as_of_ms = parse_as_of(as_of)
    given = as_of_ms is not None
    if as_of_ms is None:  # judged at one instant, the one the provenance records
        as_of_ms = provenance.now_ms()
    options = make_options(broker_version, as_of_ms, bodies=False, decode=False, assume_dirty=assume_dirty, jobs=jobs)
    report = Report(as_of_ms=as_of_ms, as_of_given=given)
    nodes = layout.discover(paths) if scans is None else [ns.node for ns in scans]
    # with -j N beside the checks; the dirs and name files discovery lists are not listed again
    inputs = provenance.hashing(paths, jobs, nodes[0].listing if nodes else None) if record else None
    work = (bool(broker_version), deep, vhosts, queues)
    if jobs > 1 and len(nodes) > 1:
        if vhosts is not None or queues is not None:
            check_names([NodeScan(n, options) for n in nodes], vhosts, queues)
        results = _parallel(nodes, options, work, jobs, progress)
    else:  # one node: its vhosts, and the listing of a big one, are checked by ``jobs`` processes
        if scans is None:
            scans = [NodeScan(n, options) for n in nodes]
        else:
            scans = list(scans)
            for ns in scans:
                ns.options = options
        check_names(scans, vhosts, queues)
        progress = Progress.of(progress)
        if progress is not None:
            progress.plan(scans, vhosts)
        results = _each_node(scans, options, work, progress)
    for nv, verdicts, findings in results:
        report.nodes.append(nv)
        report.queues += verdicts
        for f in findings:
            report.findings.append(f)
            yield f
    if record:
        report.provenance = provenance.record(
            "fsck",
            paths,
            ", ".join(sorted({n.broker_version for n in report.nodes})) or broker_version,
            as_of_ms,
            inputs=inputs,
        )
    yield report


def _check_node(node, options, work, progress=None) -> tuple[NodeVerdict, list[QueueVerdict], list[Finding]]:
    """One node's verdict, queue verdicts and findings (in report order). ``node``: its
    ``NodeScan`` or ``NodeDir``; ``progress``: a ``driver.Progress`` (planned)."""
    forced, deep, vhosts, queues = work
    ns = node if isinstance(node, NodeScan) else NodeScan(node, options)
    node = ns.node
    source = "--broker-version" if forced else f"inferred: {ns.inferred[1]}"
    scans = [vs for vs in ns.vhosts if vhosts is None or vs.vhost.name in vhosts]
    nv = NodeVerdict(
        display(node.node),
        display(node.path),
        ns.model.label,
        source,
        {},
        "hangs" if ns.boot_hangs else "ok",
        written_by=ns.version_range.to_dict(),
        broker_version_assumed=not forced and not ns.version_range.one_series,
        not_read=[u.to_dict() for u in ns.unread_storage],
    )
    live = running_broker(node.path)
    if live:
        nv.warnings.append(
            f"a broker appears to be running on this node dir ({live}): its files change "
            "under fsck, results may be inconsistent"
        )
    all_verdicts, all_findings = [], []
    if scans:  # the first vhost checked makes the findings about the node as a whole
        ns.node_level_vhost = scans[0].vhost.dir_name
    else:
        all_findings += sorted((f.scoped(node=node.node) for f in node_level_findings(ns)), key=_order)
    if progress is not None and ns.options.jobs < 2:  # within a vhost; never drawn by a worker
        progress.attach(ns)
    checked = _checked_vhosts(ns, scans, deep)
    for vs in scans:
        if progress is not None:
            progress.vhost(ns, vs, "fsck" if progress.passes > 1 else "")
        _, recovery, verdicts, findings = next(checked)
        nv.vhost_recovery[vs.vhost.label] = recovery
        if queues is not None:
            verdicts = [v for v in verdicts if v.queue in queues]
            findings = [f for f in findings if f.queue is None or f.queue in queues]
        all_verdicts += verdicts
        all_findings += sorted(findings, key=_order)
    if progress is not None:
        progress.end()
    return nv, all_verdicts, all_findings


def _checked_vhosts(ns: NodeScan, scans: list, deep: bool):
    """``(scan, recovery mode, verdicts, findings)`` of each vhost, in order: with ``jobs`` > 1,
    runs of small vhosts checked one a process, a big one by all of them (``check_vhost``
    splits its listing); each scan closed once checked."""
    jobs = ns.options.jobs
    if jobs > 1:
        ns.model, ns.boot_hangs, ns.durable_dirs, ns.lost_queues  # node-wide facts: made once, before any fork
    i = 0
    while i < len(scans):
        j = i
        while jobs > 1 and j < len(scans) and scans[j].listing_bytes() < SMALL_VHOST:
            j += 1
        if j - i > 1:

            def one(vs):
                try:
                    yield (vs.recovery, *check_vhost(vs, deep))
                finally:
                    vs.close()

            for vs, result in zip(scans[i:j], parallel.ordered(scans[i:j], one, jobs)):
                yield (vs, *result)
            i = j
            continue
        vs = scans[i]
        try:
            yield (vs, vs.recovery, *check_vhost(vs, deep))
        finally:
            vs.close()
        i += 1


def _each_node(scans: list[NodeScan], options, work, progress):
    """``_check_node`` of each node in turn, letting go of each node's scan once it is checked."""
    for k in range(len(scans)):
        ns, scans[k] = scans[k], None
        yield _check_node(ns, options, work, progress)


#: vhosts with fewer bytes of index and store are checked one a process (a bigger one by all)
SMALL_VHOST = 32 << 20


def _parallel(nodes, options, work, jobs: int, progress):
    """``_check_node`` of each node by ``jobs`` processes (``cqforensics.base.parallel``), results in
    node order; progress counts nodes done (and their bytes)."""
    sizes = [layout.tree_bytes(n.path / "msg_stores") for n in nodes] if progress else [0] * len(nodes)
    one = make_options(
        options.broker_version, options.as_of_ms, bodies=False, decode=False, assume_dirty=options.assume_dirty
    )  # a node a process: each checked in one

    def check(node):
        yield _check_node(node, one, work)

    for k, result in enumerate(parallel.ordered(nodes, check, jobs)):
        if progress:
            progress(
                f"node {k + 1} of {len(nodes)}: {display(nodes[k].node)} ({jobs} at once)",
                sum(sizes[: k + 1]),
                sum(sizes),
            )
        yield result


def _order(f: Finding):
    return (-SEVERITY_RANK[f.severity], f.code, f.file or "", f.offset or 0)


def run(paths, **kw) -> Report:
    """fsck and return only the Report."""
    out = None
    for item in fsck(paths, **kw):
        out = item
    return out


__all__ = ["fsck", "run", "Report", "QueueVerdict", "NodeVerdict", "running_broker"]
