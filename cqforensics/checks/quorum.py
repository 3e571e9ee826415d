"""Checks of the node's quorum queues (``model.quorum``): each queue's verdict (what the next boot
delivers, drops, or whether it crashes or keeps the node down) and the findings about its Ra
files, each with the file and offset, in the words of what the broker then does."""

from __future__ import annotations

from collections import Counter

from cqforensics.base.enums import Fate
from cqforensics.base.errors import display
from cqforensics.base.findings import Finding
from cqforensics.model import quorum as m_quorum
from cqforensics.model.vhost import NodeScan, VhostScan

#: queue fate -> QueueVerdict.crash
_CRASH = {m_quorum.Q_NODE_DOWN: "node", m_quorum.Q_CRASH: "queue", m_quorum.Q_UNAVAILABLE: "queue"}


def system_findings(ns: NodeScan) -> list[Finding]:
    """Findings about the Ra system files (the WAL files): once per node (``node_level_findings``)."""
    out = []
    model = ns.model
    for q_sys in ns.quorum_systems:
        for scan, rec in q_sys.wal:
            lost = len(scan) - len(rec.kept) - len(rec.skipped) - len(rec.below_snapshot)
            if rec.outcome != "ok":
                why = {
                    "bad_checksum": "a record fails its checksum and records follow it: Ra's WAL recovery stops "
                    "with wal_checksum_validation_failure",
                    "unknown_reference": f"a record names a writer no earlier record did ({rec.detail}): Ra "
                    f"{'.'.join(map(str, model.ra_version))} crashes reading it",
                    "bad_header": f"no WAL header ({rec.detail}): Ra exits unknown_wal_file_format",
                }.get(rec.stop, rec.stop)
                out.append(
                    Finding(
                        "quorum-wal-refused",
                        f"{why}; the quorum queue Ra system does not start, so RabbitMQ "
                        f"{model} does not start at all (every queue of the node unavailable)",
                        display(scan.path),
                        rec.stop_offset,
                        details={"stop": rec.stop, "records_before": len(rec.kept), "records_after": lost},
                    )
                )
                continue
            if rec.stop in ("torn", "zeroed", "bad_checksum_forgiven"):
                what = {
                    "torn": "the last record is torn (the file ends inside it)",
                    "zeroed": "the file ends in zeros where records could follow",
                    "bad_checksum_forgiven": "the last record fails its checksum",
                }[rec.stop]
                out.append(
                    Finding(
                        "quorum-wal-entries-lost",
                        f"{what}: the next boot's Ra recovery stops there without "
                        "a word; the log entries in it and after it are lost (publishes never confirmed, "
                        "or acks and returns: messages come back)",
                        display(scan.path),
                        rec.stop_offset,
                        details={
                            "stop": rec.stop,
                            "records_lost": lost,
                            "bytes_lost": scan.size - (rec.stop_offset or scan.size),
                        },
                    )
                )
            if rec.skipped:
                out.append(
                    Finding(
                        "quorum-wal-entries-lost",
                        f"{len(rec.skipped)} records of writers Ra "
                        f"{'.'.join(map(str, model.ra_version))} skips at recovery (a reference no earlier "
                        "record named, or a server names.dets does not register)",
                        display(scan.path),
                        int(scan.offset[rec.skipped[0]]),
                        severity="info",
                        details={"records": len(rec.skipped)},
                    )
                )
    for c_sys in ns.coordination_systems:
        for log in c_sys.servers:
            beyond = m_quorum.applied_beyond_log(log)
            if beyond is None:
                continue
            end, applied = beyond
            what = {"rabbitmq_metadata": "Khepri, the metadata store"}.get(log.name or "", "a coordination server")
            out.append(
                Finding(
                    "term-file-damaged",
                    f"Ra server {log.name or log.uid} ({what}): meta.dets says it applied its log up to "
                    f"entry {applied}, but its log (snapshot, segments, WAL) ends at {end}: the entries "
                    "after it are gone (its WAL lost, emptied or replaced; or meta.dets damaged), and "
                    "their changes with them",
                    *_log_end(c_sys, log),
                    severity="error",
                    details={"server": log.name or log.uid, "log_end": end, "last_applied": applied},
                )
            )
    return out


def _log_end(system: m_quorum.System, log: m_quorum.ServerLog) -> tuple[str, int | None]:
    """(file, offset) where a server's log ends: where the recovery of the system's last WAL
    stops (a torn or failing record), else the end of its framed records; the server's dir when
    the system has no WAL."""
    if not system.wal:
        return display(log.path), None
    scan, rec = system.wal[-1]
    return display(scan.path), rec.stop_offset if rec.stop_offset is not None else scan.end.offset


def queue_findings(q: m_quorum.QuorumQueue, model) -> list[Finding]:
    """Findings about one quorum queue's files and state."""
    where = {"queue": q.label}
    out = []
    for sf in q.system.segments.get(q.log.uid, []):
        seg = sf.seg
        if not sf.usable:
            out.append(
                Finding(
                    "quorum-segment-damaged",
                    f"{sf.why}: the queue's Ra server crashes opening it at the next boot",
                    display(sf.path),
                    seg.index_end if seg.torn_index else 0,
                    **where,
                )
            )
            continue
        snap = q.log.snapshot.index if q.log.snapshot is not None and q.log.snapshot.index is not None else -1
        bad = [i for i in range(len(seg)) if int(seg.status[i]) in (1, 2, 4)]
        for i in bad[:1]:
            idx = int(seg.index[i])
            label = (
                "fails its CRC"
                if seg.status[i] == 1
                else "runs past the end of the file"
                if seg.status[i] == 2
                else "lies inside the index area"
            )
            used = q.log.entries.get(idx)
            applied = used is not None and used.file == sf.path and idx > snap
            out.append(
                Finding(
                    "quorum-segment-damaged",
                    f"entry {idx} {label}"
                    + (
                        ": the server crashes when it applies it at the next boot"
                        if applied
                        else " (a copy the next boot does not read)"
                    ),
                    display(sf.path),
                    int(seg.offset[i]),
                    severity="error" if applied else "warning",
                    details={"raft_index": idx, "entries": len(bad)},
                    **where,
                )
            )
    for snap in q.system.snapshots.get(q.log.uid, []):
        if not snap.ok:
            out.append(
                Finding(
                    "quorum-snapshot-damaged",
                    f"snapshot {snap.path.parent.name}: {snap.status}"
                    f"{': ' + snap.detail if snap.detail else ''}: the next boot deletes it"
                    + (
                        " and uses an older snapshot"
                        if q.log.snapshot is not None
                        else " and replays the log from its start"
                    ),
                    display(snap.path),
                    0,
                    **where,
                )
            )
    if q.fate == m_quorum.Q_UNAVAILABLE:
        out.append(
            Finding(
                "quorum-queue-unavailable",
                f"{q.why} (data dir {q.log.uid})",
                display(q.why_file or q.log.path),
                q.why_offset,
                **where,
            )
        )
    elif q.may_not_answer:  # up or not as the boot's timing falls: a bound, not an answer
        out.append(
            Finding(
                "quorum-queue-unavailable",
                f"{q.why}: the queue delivers nothing either way, and may not answer at all (data dir {q.log.uid})",
                display(q.why_file or q.log.path),
                q.why_offset,
                severity="warning",
                **where,
                details={"may_answer": True},
            )
        )
    elif q.fate == m_quorum.Q_CRASH and "gap" in q.why:
        out.append(
            Finding(
                "quorum-log-gap", f"{q.why}: the queue crashes at the next boot", display(q.log.path), None, **where
            )
        )
    holes = m_quorum.log_holes(q.log)
    if holes and q.fate == m_quorum.Q_OK:
        spans = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in holes[:5])
        out.append(
            Finding(
                "quorum-log-gap",
                f"log entries {spans} are in no segment and no WAL (a segment file lost): "
                "the next boot skips them without a word, so what they enqueued is lost, what they "
                "settled comes back, and a later enqueue of the same publisher is refused as out of "
                "sequence",
                display(q.log.path),
                None,
                **where,
                details={
                    "ranges": [list(h) for h in holes[:50]],
                    "entries": sum(b - a + 1 for a, b in holes),
                    "messages_lost": len(q.lost),
                },
            )
        )

    if q.fate == m_quorum.Q_OK and not q.may_not_answer:  # (a log left with nothing is said there)
        beyond = m_quorum.applied_beyond_log(q.log)
        if beyond is not None:
            end, applied = beyond
            file, offset = _log_end(q.system, q.log)
            out.append(
                Finding(
                    "quorum-log-gap",
                    f"meta.dets says the server applied its log up to entry {applied}, but its log "
                    f"ends at {end}: entries {end + 1}-{applied} are in no segment and no WAL (the WAL's "
                    "end lost or replaced). The next boot applies up to its last entry only (ra_server "
                    "apply_to/5: the lesser of the last index and the commit index) without a word, so "
                    "what they enqueued is lost and what they settled comes back",
                    file,
                    offset,
                    **where,
                    details={"log_end": end, "last_applied": applied, "entries": applied - end},
                )
            )

    def at(msgs) -> tuple[str | None, int | None]:
        """The file and offset of the first of ``msgs`` whose enqueue a log entry holds."""
        for m in msgs:
            e = q.entry_of(m.index)
            if e is not None:
                return display(e.file), e.offset
        return display(q.log.path), None

    dead = [d for d in q.deliveries if d.fate == "delivery_limit"]
    if dead:
        out.append(
            Finding(
                "quorum-delivery-limit",
                f"{len(dead)} messages checked out at the stop pass the queue's "
                "delivery limit when the next boot returns them: dead-lettered or dropped",
                *at(d.msg for d in dead),
                **where,
                details={"raft_indexes": [d.msg.index for d in dead][:50]},
            )
        )
    if q.pending_dlx:
        reasons = Counter(r for r, _ in q.pending_dlx)
        out.append(
            Finding(
                "quorum-dead-letter-pending",
                f"{len(q.pending_dlx)} messages wait for at-least-once "
                "dead-lettering: the next boot's dead-letter worker republishes them",
                *at(m for _, m in q.pending_dlx),
                **where,
                details={"reasons": dict(reasons)},
            )
        )
    if q.lost and not (holes and q.fate == m_quorum.Q_OK):  # the gap's finding counts them
        out.append(
            Finding(
                "quorum-wal-entries-lost",
                f"{len(q.lost)} messages the files hold are in log entries "
                "the next boot does not recover (their enqueue, or a later entry its state needs, is past "
                "the damage)",
                *at(q.lost),
                **where,
                details={"raft_indexes": [m.index for m in q.lost][:50]},
            )
        )
    for note in q.replay.notes[:5]:
        out.append(Finding("quorum-state-unmodelled", note, display(q.log.path), None, **where))
    return out


def quorum_checks(vs: VhostScan) -> tuple[list[dict], list[Finding]]:
    """Per quorum queue of the vhost: its verdict (a dict of QueueVerdict fields) and findings."""
    verdicts, findings = [], []
    for q in vs.quorum_queues:
        if vs.quorum_names is not None and q.name not in vs.quorum_names:
            continue
        c = Counter(fate for _, fate, _, _, _ in q.messages())
        reasons = {Fate(k).reason: n for k, n in c.items() if k != Fate.DELIVERED}
        verdicts.append(
            {
                "queue": q.label,
                "vhost": q.vhost,
                "messages": sum(c.values()),
                "kept": c.get(Fate.DELIVERED, 0),
                "drops": reasons,
                "crash": _CRASH.get(q.fate),
            }
        )
        findings += queue_findings(q, vs.node.model)
    return verdicts, findings


__all__ = ["queue_findings", "quorum_checks", "system_findings"]
