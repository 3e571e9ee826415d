"""Checks ``verify`` adds to fsck's: invariants a writer's output must hold that the broker itself
never looks at (overlapping ``.qs`` entries) or tolerates (messages the next boot would drop)."""

from __future__ import annotations

import numpy as np

from cqforensics.base.enums import Fate, Location
from cqforensics.base.errors import plural
from cqforensics.base.findings import Finding
from cqforensics.checks.vhost import QueueVerdict
from cqforensics.model.recovery import FINDING_OF_FATE
from cqforensics.model.vhost import VhostScan
from cqforensics.readers import qs as r_qs


def qs_overlaps(vs: VhostScan) -> list[Finding]:
    """Two live index entries whose ``.qs`` ranges overlap (a writer bug the broker never sees)."""
    out = []
    for qx in vs.chunks():
        r, live = qx.rec, qx.live
        sel = live[r.loc[live] == Location.QUEUE_STORE]
        if len(sel) < 2:
            continue
        off, length = r_qs.entry_span(r.store_offset[sel], r.store_size[sel])
        end = off + length
        order = np.argsort(off, kind="stable")
        bad = np.flatnonzero(off[order][1:] < end[order][:-1])
        if len(bad):
            k = int(order[bad[0] + 1])
            out.append(
                Finding(
                    "qs-entry-missing",
                    f"{plural(len(bad), '.qs entry')} overlap the entry before them "
                    f"(first: seq id {int(r.seq[sel[k]])})",
                    str(qx.qdir.qs.get(qx.segment)),
                    int(off[k]),
                    severity="error",
                    queue=qx.qdir.name,
                    priority=qx.qdir.priority,
                )
            )
    return out


def undelivered(v: QueueVerdict, named=()) -> list[Finding]:
    """An error per reason the next boot would not deliver some of the queue's messages (TTL
    expiry excepted: that is the messages' own doing), but for those a finding already names:
    ``named`` holds the (code, vhost, queue) of the findings made so far, and a reason whose
    finding (``FINDING_OF_FATE``) names this queue is said once (one cause, one finding)."""
    out = []
    for fate, n in sorted(v.drops.items()):
        if fate == Fate.EXPIRED.label:
            continue
        code = FINDING_OF_FATE[Fate[fate.upper()]]
        if (code, v.vhost, v.queue) in named:
            continue
        out.append(
            Finding(
                code,
                f"{plural(n, 'message')} of queue {v.queue} would not be delivered after a restart: {fate}",
                severity="error",
                node=v.node,
                vhost=v.vhost,
                queue=v.queue,
                details={"fate": fate},
            )
        )
    return out
