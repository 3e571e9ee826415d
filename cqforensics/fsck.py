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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cqforensics import exitcodes, layout, parallel, provenance
from cqforensics.errors import display
from cqforensics.model.options import make_options, parse_as_of
from cqforensics.checks import QueueVerdict, check_vhost
from cqforensics.findings import ERROR, SEVERITY_RANK, Finding
from cqforensics.model.vhost import NodeScan


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

    def to_dict(self) -> dict:
        return {"node": self.node, "path": self.path, "broker_version": self.broker_version,
                "version_source": self.version_source, "written_by": self.written_by,
                "recovery": self.vhost_recovery, "boot": self.boot, "warnings": self.warnings}


@dataclass
class Report:
    nodes: list[NodeVerdict] = field(default_factory=list)
    queues: list[QueueVerdict] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    provenance: dict | None = None  # cqforensics.provenance.record: tool, core, inputs' sha256, version, as_of

    @property
    def exit_code(self) -> int:
        """e2fsck style: 4 when errors are left (fsck fixes nothing), else 0."""
        return exitcodes.ERRORS_LEFT if any(f.severity == ERROR for f in self.findings) else exitcodes.OK

    def to_dict(self) -> dict:
        return {"format": "cqforensics-fsck/1", "nodes": [n.to_dict() for n in self.nodes],
                "queues": [q.to_dict() for q in self.queues], "findings": [f.to_dict() for f in self.findings],
                "summary": self.summary(), "exit_code": self.exit_code, "provenance": self.provenance}

    def summary(self) -> dict:
        counts = {s: sum(1 for f in self.findings if f.severity == s) for s in SEVERITY_RANK}
        return {"findings": counts, "queues": len(self.queues), "messages": sum(q.messages for q in self.queues),
                "predicted_after_restart": sum(q.predicted_after_restart for q in self.queues),
                "dropped": sum(q.dropped for q in self.queues),
                "crashes": sorted({q.crash for q in self.queues if q.crash})}


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


def fsck(paths, broker_version: str | None = None, as_of=None, deep: bool = False, assume_dirty: bool = False,
         progress: Callable[[str], None] | None = None, vhosts=None, queues=None, jobs: int = 1) -> Iterator:
    """Check every node dir under ``paths``. Yields findings as they are found and, last, the
    Report (whose findings list holds them all). ``vhosts`` (names) checks only those vhosts;
    ``queues`` (names) keeps only those queues' verdicts and findings, and the findings that
    name no queue (store-wide: a vhost's checks need all of it, so it is still read whole).
    ``jobs``: nodes checked at once, each in its own process (a folder of backups); the report
    is the same, in the same order, whatever ``jobs`` is."""
    from cqforensics.driver import names

    vhosts, queues = names(vhosts, "vhosts"), names(queues, "queues")
    as_of_ms = parse_as_of(as_of)
    if as_of_ms is None:  # judged at one instant, the one the provenance records
        as_of_ms = provenance.now_ms()
    options = make_options(broker_version, as_of_ms, bodies=False, decode=False, assume_dirty=assume_dirty,
                           jobs=jobs)
    report = Report()
    nodes = layout.discover(paths)
    work = (bool(broker_version), deep, vhosts, queues)
    if jobs > 1 and len(nodes) > 1:
        results = _parallel(nodes, options, work, jobs, progress)
    else:  # one node: its vhosts, and the listing of a big one, are checked by ``jobs`` processes
        results = (_check_node(node, options, work, progress) for node in nodes)
    for nv, verdicts, findings in results:
        report.nodes.append(nv)
        report.queues += verdicts
        for f in findings:
            report.findings.append(f)
            yield f
    report.provenance = provenance.record("fsck", paths, ", ".join(sorted({n.broker_version for n in report.nodes}))
                                          or broker_version, as_of_ms, jobs=jobs)
    yield report


def _check_node(node, options, work, progress=None) -> tuple[NodeVerdict, list[QueueVerdict], list[Finding]]:
    """One node's verdict, queue verdicts and findings (in report order)."""
    forced, deep, vhosts, queues = work
    ns = NodeScan(node, options)
    source = "--broker-version" if forced else f"inferred: {ns.inferred[1]}"
    scans = [vs for vs in ns.vhosts if vhosts is None or vs.vhost.name in vhosts]
    nv = NodeVerdict(display(node.node), display(node.path), ns.model.label, source, {}, "hangs" if ns.boot_hangs else "ok",
                     written_by=ns.version_range.to_dict())
    live = running_broker(node.path)
    if live:
        nv.warnings.append(f"a broker appears to be running on this node dir ({live}): its files change "
                           "under fsck, results may be inconsistent")
    all_verdicts, all_findings = [], []
    sizes = [layout.tree_bytes(vs.vhost.path) for vs in scans] if progress else []
    checked = _checked_vhosts(ns, scans, deep)
    for k, vs in enumerate(scans, 1):
        if progress:
            progress(f"{display(node.node)}: vhost {display(vs.vhost.label)} ({k}/{len(scans)})",
                     sum(sizes[:k - 1]), sum(sizes))
        _, recovery, verdicts, findings = next(checked)
        nv.vhost_recovery[vs.vhost.label] = recovery
        if queues is not None:
            verdicts = [v for v in verdicts if v.queue in queues]
            findings = [f for f in findings if f.queue is None or f.queue in queues]
        all_verdicts += verdicts
        all_findings += sorted(findings, key=_order)
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


#: vhosts with fewer bytes of index and store are checked one a process (a bigger one by all)
SMALL_VHOST = 32 << 20


def _parallel(nodes, options, work, jobs: int, progress):
    """``_check_node`` of each node by ``jobs`` processes (``cqforensics.parallel``), results in
    node order; progress counts nodes done (and their bytes)."""
    sizes = [layout.tree_bytes(n.path / "msg_stores") for n in nodes] if progress else [0] * len(nodes)
    one = make_options(options.broker_version, options.as_of_ms, bodies=False, decode=False,
                       assume_dirty=options.assume_dirty)  # a node a process: each checked in one

    def check(node):
        yield _check_node(node, one, work)
    for k, result in enumerate(parallel.ordered(nodes, check, jobs)):
        if progress:
            progress(f"{display(nodes[k].node)} ({k + 1}/{len(nodes)}, {jobs} at once)", sum(sizes[:k + 1]),
                     sum(sizes))
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
