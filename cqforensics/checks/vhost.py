"""``check_vhost``: every check of one vhost in one pass over its queue indexes (one per id share
for a big vhost), and the per-queue verdict: what the next boot delivers, drops, or crashes on."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cqforensics.base import parallel
from cqforensics.base.enums import Fate
from cqforensics.base.errors import display
from cqforensics.base.findings import Finding
from cqforensics.checks.boot import boot_crash_findings, recovery_findings
from cqforensics.checks.deep import decode_checks
from cqforensics.checks.index import ChunkCheck, reader_findings
from cqforensics.checks.integrity import (
    CopyCheck,
    QueueIntegrity,
    node_findings,
    segment_count_findings,
    vhost_file_findings,
)
from cqforensics.checks.layout import (
    OrphanTally,
    lost_queue_findings,
    queue_dir_findings,
    unread_storage_findings,
    vhost_dir_findings,
)
from cqforensics.checks.quorum import quorum_checks, system_findings
from cqforensics.checks.store import StoreCheck
from cqforensics.checks.streams import stream_findings, stream_verdict
from cqforensics.model import recovery
from cqforensics.model.vhost import NodeScan, VhostScan, passes


@dataclass
class QueueVerdict:
    node: str
    vhost: str | None
    queue: str | None  # priority levels summed
    messages: int = 0  # held by the index (published, not acked)
    predicted_after_restart: int = 0
    #: what the next boot delivers whatever the timing, and at most (model.recovery.delivery_bounds:
    #: both predicted_after_restart unless the vhost's message store can crash while it serves)
    predicted_min: int = 0
    predicted_max: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    crash: str | None = None  # "queue", "vhost" or "node": the next boot crashes or hangs instead
    recovery: str = "dirty"
    index_version: int | None = None
    dirs: int = 0
    queue_type: str = "classic"  # or "quorum", "stream"

    @property
    def dropped(self) -> int:
        return self.messages - self.predicted_after_restart

    def to_dict(self) -> dict:
        return {
            "node": self.node,
            "vhost": self.vhost,
            "queue": self.queue,
            "messages": self.messages,
            "predicted_after_restart": self.predicted_after_restart,
            "predicted_min": self.predicted_min,
            "predicted_max": self.predicted_max,
            "dropped": self.dropped,
            "drop_reasons": dict(sorted(self.drops.items())),
            "crash": self.crash,
            "recovery": self.recovery,
            "index_version": self.index_version,
            "queue_dirs": self.dirs,
            "queue_type": self.queue_type,
        }


def check_vhost(vs: VhostScan, deep: bool = False) -> tuple[list[QueueVerdict], list[Finding]]:
    """Every check of one vhost, and the verdict of each of its queues; every finding is placed
    in the vhost's node and vhost. A vhost too big to index at once (``VhostScan.shares``) is
    checked in one pass per message-id share (``passes``), each holding only that share's store
    entries and references: a finding about one id (or one index entry) comes from the pass of
    its share, one about a file, a queue dir or the vhost from the first pass, and the counts
    the others carry (messages per queue, orphans, bytes per file, ...) are summed over the
    passes; the verdicts and findings are those of a whole read, in another order."""
    node = vs.node.node.node
    vhost = vs.vhost.name if vs.vhost.name is not None else vs.vhost.label
    findings: list[Finding] = []
    chunks, stores, orphans = ChunkCheck(), StoreCheck(), OrphanTally()
    held: dict[str, tuple[int, dict[str, int]]] = {}  # queue dir -> (messages its index holds, drops by reason)
    bounds: dict[str, list[int]] = {}  # queue dir -> [delivered at least, at most]
    crashes: dict[str | None, str] = {}
    index_findings: list[Finding] = []  # the readers' findings of the vhost's indexes (first pass)
    for sub in passes(vs):
        sub.lists_every_index()
        first = sub.share is None or sub.share.k == 0
        if first:
            findings += vhost_dir_findings(sub)
        copies = CopyCheck(sub)
        integrity: dict[int, QueueIntegrity] = {}  # per queue dir position, until its last chunk is in
        for part in _listing_checks(sub, first, deep):
            copies.absorb(part.copies)
            chunks.absorb(part.chunks, sub.all_queue_dirs)
            index_findings += part.index_findings
            for qi, found, state, n, drops, last, lo, hi in part.queues:
                q = sub.all_queue_dirs[qi]
                findings += found
                b = bounds.setdefault(q.dir_name, [0, 0])
                b[0], b[1] = b[0] + lo, b[1] + hi
                if state is not None:  # None: no index chunk in the range (an empty queue's dir)
                    kept = integrity.get(qi)
                    if kept is None:
                        kept = integrity[qi] = QueueIntegrity(sub, first)
                    kept.absorb(state)
                n_dir, per_dir = held.get(q.dir_name, (0, {}))
                for k, c in drops.items():
                    per_dir[k] = per_dir.get(k, 0) + c
                held[q.dir_name] = (n_dir + n, per_dir)
                if last and qi in integrity:
                    findings += [f.scoped(queue=q.name, priority=q.priority) for f in integrity.pop(qi).findings()]
        findings += copies.findings()
        stores.add(sub, first)
        orphans.add(sub)
        if first:
            crash_findings, crashes = boot_crash_findings(sub)
            findings += crash_findings
            findings += recovery_findings(sub)
            findings += vhost_file_findings(sub)
            findings += segment_count_findings(sub, index_findings)
    findings += chunks.findings(vs, stores.intact())
    findings += stores.findings(vs)
    findings += lost_queue_findings(vs, orphans)
    verdicts: dict[str | None, QueueVerdict] = {}
    node_text, vhost_text, recovery_mode = display(node), display(vhost), vs.recovery  # the same for each queue dir
    for q in vs.all_queue_dirs:
        v = verdicts.get(q.label)
        if v is None:
            v = verdicts[q.label] = QueueVerdict(node_text, vhost_text, q.label, recovery=recovery_mode)
        v.dirs += 1
        v.index_version = q.index_version or v.index_version
        n_dir, per_dir = held.get(q.dir_name, (0, {}))
        v.messages += n_dir
        v.predicted_after_restart += n_dir - sum(per_dir.values())
        lo, hi = bounds.get(q.dir_name, (0, 0))
        v.predicted_min += lo
        v.predicted_max += hi
        for k, c in per_dir.items():
            v.drops[k] = v.drops.get(k, 0) + c
        findings += queue_dir_findings(q, vs.queue_known(q), n_dir, per_dir)
    for label, what in crashes.items():
        verdicts[label].crash = what
    if vs.clean_crashes[1] or vs.start_crash:
        for v in verdicts.values():
            v.crash = v.crash or "vhost"
    for e in vs.streams:  # a stream's fate is its own: the vhost's message store does not hold it
        verdicts[("stream", e.path.name)] = stream_verdict(vs, e, QueueVerdict)
        findings += stream_findings(vs, e)
    if vs.node.boot_hangs:
        for v in verdicts.values():
            v.crash = "node"
    q_verdicts, q_findings = quorum_checks(vs)
    for (vh, name), items in vs.node.boot_dead_letters.items():  # republished into this vhost's queues at boot
        if vh == vs.vhost.name and vs.share is None or vh == vs.vhost.name and vs.share.k == 0:
            v = verdicts.get(name) or next((x for x in q_verdicts if x["queue"] == name), None)
            if isinstance(v, QueueVerdict):
                v.messages += len(items)
                v.predicted_after_restart += len(items)
            elif v is not None:
                v["messages"] += len(items)
                v["kept"] += len(items)
    out = list(verdicts.values())
    for qv in q_verdicts:
        out.append(
            QueueVerdict(
                display(node),
                display(qv["vhost"] if qv["vhost"] is not None else vhost),
                qv["queue"],
                messages=qv["messages"],
                predicted_after_restart=qv["kept"],
                predicted_min=qv["kept"],
                predicted_max=qv["kept"],
                drops=qv["drops"],
                crash=qv["crash"],
                recovery="quorum",
                queue_type="quorum",
            )
        )
    scoped = [f.scoped(node=node, vhost=vhost) for f in findings]
    scoped += [f.scoped(node=node, vhost=f.vhost or vhost) for f in q_findings]
    if vs.node.boot_hangs:  # a quorum WAL the boot refuses keeps the node down: every queue with it
        for v in out:
            v.crash = "node"
    if vs.node.carries_node_findings(vs):  # the node's own files: once per node, with its first vhost read
        scoped += [f.scoped(node=node) for f in node_level_findings(vs.node)]
    return out, scoped


@dataclass
class _Checked:
    """What the checks of a range of one pass's listing found: per queue dir met, in listing
    order, ``(position, findings, QueueIntegrity state (None: no chunk in the range), messages
    held, drops by reason, whether its last chunk was in the range, delivered at least, at
    most)``, the ``CopyCheck`` and ``ChunkCheck`` states, and (first pass) the readers'
    findings of its indexes."""

    queues: list[tuple] = field(default_factory=list)
    index_findings: list[Finding] = field(default_factory=list)
    copies: tuple = ((), ())
    chunks: tuple = ({}, {})


#: a pass whose listing holds fewer bytes of index and queue stores is checked in one process
SPLIT_BYTES = 16 << 20
#: ranges per process a big pass's listing is cut into
PARTS_PER_JOB = 4


def _listing_checks(sub: VhostScan, first: bool, deep: bool):
    """The checks of every index chunk of the pass, as ``_Checked`` ranges in listing order: one
    (the whole listing) in this process, or, with ``options.jobs`` > 1 and a big listing, ranges
    checked by that many processes (``cqforensics.base.parallel``), forked once this pass's facts
    are made here: the same findings, in the same order."""
    jobs = sub.options.jobs
    if jobs < 2 or sub.listing_bytes() < SPLIT_BYTES:
        yield _check_range(sub, None, first, deep)
        return
    sub.prepare()
    facts = sub.vhost_facts()
    ranges = sub.ranges(jobs * PARTS_PER_JOB)

    def check(only: dict):
        scan = VhostScan(sub.node, sub.vhost, only, facts, sub.share)
        try:
            yield _check_range(scan, only, first, deep)
        finally:
            scan.close()

    yield from parallel.ordered(ranges, check, jobs)


def _check_range(sub: VhostScan, only: dict | None, first: bool, deep: bool) -> _Checked:
    """The checks of the index chunks of the queue dirs (and segments) ``only`` names (None:
    all) of ``sub``'s listing, with accumulators of their own (merged in order by the caller)."""
    out = _Checked()
    chunks, copies = ChunkCheck(), CopyCheck(sub)
    for qi, q in enumerate(sub.all_queue_dirs):
        if only is not None and q.dir_name not in only:
            continue
        segments = only.get(q.dir_name) if only is not None else None
        last = segments is None or not q.qi or q.qi[-1][0] in segments
        position = None  # segment number -> its place in the queue, made at the first chunk
        integrity = None  # made at the first chunk: most queue dirs of a big node have none
        found: list[Finding] = []
        n_dir, per_dir, lo_dir, hi_dir = 0, {}, 0, 0
        for qx in sub.index_of(q, in_share=False):
            if integrity is None:
                integrity = QueueIntegrity(sub, first)
                position = {number: k for k, (number, _) in enumerate(q.qi)}
            ci = position.get(qx.segment, 0) if qx.segment is not None else 0  # the chunk's place in its queue
            if first:
                found += [f.scoped(queue=q.name, priority=q.priority) for f in reader_findings(sub, qx)]
                out.index_findings += qx.findings
            integrity.add(qx)
            copies.add(qx)
            rows = sub.chunk_rows(qx)  # the pass's share of the live entries (None: all)
            at = np.arange(len(qx.live)) if rows is None else np.flatnonzero(rows[qx.live])
            qx.live = qx.live[at]
            res = sub.resolve(qx)
            lo, hi = recovery.delivery_bounds(sub, qx, res)
            lo_dir, hi_dir = lo_dir + int(lo.sum()), hi_dir + int(hi.sum())
            chunks.add(sub, (qi, ci), qx, res, at)
            n_dir += len(qx.live)
            for code, count in zip(*np.unique(res.fate, return_counts=True)):
                name = Fate(code).reason
                if name is not None:
                    per_dir[name] = per_dir.get(name, 0) + int(count)
            if deep:
                found += decode_checks(sub, qx, res)
        out.queues.append(
            (qi, found, integrity.state() if integrity is not None else None, n_dir, per_dir, last, lo_dir, hi_dir)
        )
    out.copies, out.chunks = copies.state(), chunks.state()
    return out


def node_level_findings(ns: NodeScan) -> list[Finding]:
    """The findings about the node as a whole (its own files, its quorum queues' shared WAL, the
    storage it holds that is not read): ``check_vhost`` adds them to those of the node's first
    vhost; a check that leaves that vhost out asks for them here."""
    return node_findings(ns) + system_findings(ns) + unread_storage_findings(ns)
