"""``check_vhost``: every check of one vhost in one pass over its queue indexes, and the
per-queue verdict: what the next boot delivers, drops, or crashes on."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cqforensics.codes import Fate
from cqforensics.errors import display
from cqforensics.findings import Finding
from cqforensics.model.vhost import VhostScan

from cqforensics.checks.boot import boot_crash_findings, recovery_findings
from cqforensics.checks.deep import decode_checks
from cqforensics.checks.index import chunk_findings
from cqforensics.checks.integrity import CopyCheck, QueueIntegrity, node_findings, vhost_file_findings
from cqforensics.checks.layout import lost_queue_findings, queue_dir_findings, vhost_dir_findings
from cqforensics.checks.store import store_checks


@dataclass
class QueueVerdict:
    node: str
    vhost: str | None
    queue: str | None  # priority levels summed
    messages: int = 0  # held by the index (published, not acked)
    predicted_after_restart: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    crash: str | None = None  # "queue", "vhost" or "node": the next boot crashes or hangs instead
    recovery: str = "dirty"
    index_version: int | None = None
    dirs: int = 0

    @property
    def dropped(self) -> int:
        return self.messages - self.predicted_after_restart

    def to_dict(self) -> dict:
        return {"node": self.node, "vhost": self.vhost, "queue": self.queue, "messages": self.messages,
                "predicted_after_restart": self.predicted_after_restart, "dropped": self.dropped,
                "drop_reasons": dict(sorted(self.drops.items())), "crash": self.crash, "recovery": self.recovery,
                "index_version": self.index_version, "queue_dirs": self.dirs}


def check_vhost(vs: VhostScan, deep: bool = False) -> tuple[list[QueueVerdict], list[Finding]]:
    """Every check of one vhost, in one pass over its queue indexes; every finding is placed in
    the vhost's node and vhost."""
    node = vs.node.node.node
    vhost = vs.vhost.name if vs.vhost.name is not None else vs.vhost.label
    findings = vhost_dir_findings(vs)
    verdicts: dict[str | None, QueueVerdict] = {}
    copies = CopyCheck(vs)
    for q in vs.all_queue_dirs:
        v = verdicts.setdefault(q.label, QueueVerdict(display(node), display(vhost), q.label, recovery=vs.recovery))
        v.dirs += 1
        v.index_version = q.index_version or v.index_version
        known = vs.queue_known(q)
        per_dir: dict[str, int] = {}
        n_dir = 0
        integrity = QueueIntegrity(vs)
        for qx in vs.scan_queue(q):
            findings += chunk_findings(vs, qx)
            integrity.add(qx)
            copies.add(qx)
            res = vs.resolve(qx)
            n_dir += len(qx.live)
            for code, count in zip(*np.unique(res.fate, return_counts=True)):
                name = Fate(code).reason
                if name is not None:
                    per_dir[name] = per_dir.get(name, 0) + int(count)
            if deep:
                findings += decode_checks(vs, qx, res)
        v.messages += n_dir
        v.predicted_after_restart += n_dir - sum(per_dir.values())
        for k, c in per_dir.items():
            v.drops[k] = v.drops.get(k, 0) + c
        findings += queue_dir_findings(q, known, n_dir, per_dir)
        findings += [f.scoped(queue=q.name, priority=q.priority) for f in integrity.findings()]
    findings += copies.findings()
    crash_findings, crashes = boot_crash_findings(vs)
    findings += crash_findings
    for label, what in crashes.items():
        verdicts[label].crash = what
    if vs.clean_crashes[1]:
        for v in verdicts.values():
            v.crash = v.crash or "vhost"
    if vs.node.boot_hangs:
        for v in verdicts.values():
            v.crash = "node"
    findings += store_checks(vs)
    findings += lost_queue_findings(vs)
    findings += recovery_findings(vs)
    findings += vhost_file_findings(vs)
    scoped = [f.scoped(node=node, vhost=vhost) for f in findings]
    if vs.node.vhosts and vs is vs.node.vhosts[0]:  # the node's own files: once per node, with its first vhost
        scoped += [f.scoped(node=node) for f in node_findings(vs.node)]
    return list(verdicts.values()), scoped
