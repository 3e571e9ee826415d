"""Checks of the directory layout: vhost and queue dirs the broker would not recognise or that
it deletes at boot, files it does not use, and what a queue dir's messages come to at boot."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cqforensics.base.enums import StoreStatus
from cqforensics.base.errors import plural
from cqforensics.base.findings import Finding
from cqforensics.discovery.nodes import QueueDir
from cqforensics.model.vhost import NodeScan, VhostScan


def vhost_dir_findings(vs: VhostScan) -> list[Finding]:
    """The layout's problems with the vhost dir (names, dir names) and files it does not use."""
    out = [Finding(p.code, p.message, str(p.path), p.offset) for p in vs.vhost.problems]
    out += [Finding("unknown-file", "a file the broker does not use here", str(p)) for p in vs.vhost.others]
    return out


def unread_storage_findings(ns: NodeScan) -> list[Finding]:
    """``storage-not-read``, once per kind of queue storage the node holds that cqforensics does
    not read (``layout.STORAGE_KINDS``: quorum queues, streams), naming its queues: a check that
    leaves them out is incomplete, and says so (fsck's exit code too)."""
    return [
        Finding(
            "storage-not-read",
            u.describe(),
            str(u.root),
            details={
                **u.to_dict(),
                "queues": u.to_dict()["queues"][:64],
                "queue_count": len(u.queues),
                "place": "node",
            },
        )
        for u in ns.unread_storage
    ]


def queue_dir_findings(q: QueueDir, known: bool | None, messages: int, drops: dict[str, int]) -> list[Finding]:
    """One queue dir: files it should not hold, whether the broker deletes it (not a durable
    queue of the metadata), and the messages the next boot drops as transient or expired.
    ``messages``: held by its index; ``drops``: drop reason -> count."""
    where = {"queue": q.name, "priority": q.priority}
    out = [Finding("unknown-file", "a file the broker does not use in a queue dir", str(p), **where) for p in q.others]
    if known is False:
        out.append(
            Finding(
                "unknown-queue",
                f"queue dir {q.dir_name} ({q.label}) is not a durable queue in "
                f"the metadata: the next boot deletes it and its {plural(messages, 'message')}",
                str(q.path),
                **where,
                details={"messages": messages},
            )
        )
    if drops.get("transient"):
        n = drops["transient"]
        out.append(
            Finding(
                "transient-dropped",
                f"{plural(n, 'transient message')} on disk {'is' if n == 1 else 'are'} dropped by the next boot",
                str(q.path),
                **where,
                details={"messages": drops["transient"]},
            )
        )
    if drops.get("expired"):
        n = drops["expired"]
        out.append(
            Finding(
                "expired",
                f"{plural(n, 'message')} {'is past its' if n == 1 else 'are past their'} TTL: the "
                f"broker drops {'it when it reaches' if n == 1 else 'them when they reach'} the head of the "
                "queue",
                str(q.path),
                **where,
                details={"messages": drops["expired"]},
            )
        )
    return out


@dataclass
class OrphanTally:
    """What ``queue-index-missing`` counts in the vhost's persistent store, summed over the
    passes of a read in id shares (``add``: one share's scan, or the whole vhost's)."""

    orphans: int = 0
    orphan_bytes: int = 0
    unheld: int | None = None  # ids a clean shutdown recorded more references for than the indexes hold
    routed: dict[bytes, int] | None = None  # lost queue name -> orphans its bindings would have routed to it

    def add(self, vs: VhostScan) -> None:
        lost = vs.lost_queues
        if not lost:
            return
        st = vs.stores.get("persistent") if vs.vhost.stores else None
        if st is not None and len(st.e_id):
            status, _ = vs.store_status["persistent"]
            hit = status == StoreStatus.ORPHAN
            self.orphans += int(hit.sum())
            self.orphan_bytes += int(st.e_total[hit].sum())
        if st is not None and st.recorded is not None:
            refs = vs.references["persistent"]
            rec = st.recorded
            g = refs.ids.lookup(rec.ids.ids)
            held = np.where(g >= 0, refs.count[np.maximum(g, 0)], 0) if len(refs.count) else np.zeros(len(g), int)
            unheld = int((rec.ref_count > held).sum())
            for raw, r in rec.others.items():
                g = refs.ids.lookup(np.frombuffer(raw, "V16"))[0] if isinstance(raw, bytes) and len(raw) == 16 else -1
                if isinstance(r[0], int) and r[0] > (int(refs.count[g]) if g >= 0 else 0):
                    unheld += 1
            self.unheld = (self.unheld or 0) + unheld
        routed = _routed_orphans(vs, lost)
        if routed is not None:
            self.routed = {q: n + (self.routed or {}).get(q, 0) for q, n in routed.items()}


def lost_queue_findings(vs: VhostScan, tally: OrphanTally) -> list[Finding]:
    """``queue-index-missing``: a durable classic queue of the metadata whose index dir is
    missing or unreadable. The next boot declares it afresh, empty: everything its index held
    is lost, and only its shared-store messages may be left, as orphans; how many orphans the
    vhost's store holds (those the queue's bindings could have routed to it, when known) is
    in ``details`` (``tally``: counted over every pass)."""
    lost = vs.lost_queues
    if not lost:
        return []
    out = []
    orphans, orphan_bytes, unheld, routed = tally.orphans, tally.orphan_bytes, tally.unheld, tally.routed
    vs.node.vhosts  # names the dirs, and finds renamed ones
    found_as = {own: d for (vd, d), (own, _, _) in getattr(vs.node, "renamed", {}).items() if vd == vs.vhost.dir_name}
    for lq in lost:
        vhost = lq.vhost.decode("utf-8", "replace")
        here = lq.vhost_dir == vs.vhost.dir_name
        missing = [d for d, _, _ in lq.dirs]
        whys = sorted({w for _, _, w in lq.dirs})
        levels = [p for _, p, _ in lq.dirs if p is not None]
        what = (
            f"{len(missing)} of its {lq.levels} priority-level index dirs are" if lq.levels > 1 else "its index dir is"
        )
        details = {
            "queue_vhost": vhost,
            "dirs": missing,
            "why": whys,
            "levels_missing": levels or None,
            "home_node": lq.record.node,
            "metadata": lq.record.source,
        }
        renamed = [found_as[d] for d in missing if d in found_as]
        if renamed:
            details["renamed_dirs"] = renamed
            whys = sorted(set(whys) | {"renamed"})
        if here:
            details.update(orphans_in_store=orphans, orphan_bytes=orphan_bytes)
            if unheld is not None:
                details["recorded_refs_not_held"] = unheld
            n = routed.get(lq.name) if routed is not None else None
            if n is not None:
                details["orphans_routed_here"] = n
            could = (
                f"{n} of the vhost's {orphans} orphaned store messages its bindings would have routed to it"
                if n is not None
                else f"{orphans} orphaned store messages of the vhost could be its own"
            )
        else:
            could = "its vhost has no dir: none of its messages are left"
        if renamed:
            could = (
                f"its index is in dir(s) {', '.join(renamed)} under another name, which the next boot deletes "
                f"(rebuild writes it back); {could}"
            )
        path = (vs.vhost.path / "queues" / missing[0]) if here else (vs.vhost.path.parent / lq.vhost_dir)
        out.append(
            Finding(
                "queue-index-missing",
                f"durable queue {lq.label!r} (vhost {vhost!r}): {what} "
                f"{'/'.join(whys)}; the next boot starts it empty and its messages are lost; {could}",
                str(path),
                queue=lq.label,
                details=details,
            )
        )
    return out


def _routed_orphans(vs: VhostScan, lost) -> dict[bytes, int] | None:
    """Lost queue name -> orphaned messages of the vhost its bindings would have routed to it
    (``VhostScan.orphan_destinations``); None when the metadata is unreadable."""
    if vs.node.metadata.kind is None or not any(lq.vhost_dir == vs.vhost.dir_name for lq in lost):
        return None
    dests = vs.orphan_destinations()
    out = {lq.name: 0 for lq in lost if lq.vhost_dir == vs.vhost.dir_name}
    for queues in dests.values():
        for q in queues or ():
            if q in out:
                out[q] += 1
    return out
