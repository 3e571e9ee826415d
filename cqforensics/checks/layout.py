"""Checks of the directory layout: vhost and queue dirs the broker would not recognise or that
it deletes at boot, files it does not use, and what a queue dir's messages come to at boot."""

from __future__ import annotations

from cqforensics.findings import Finding
from cqforensics.layout import QueueDir
from cqforensics.model.vhost import VhostScan


def vhost_dir_findings(vs: VhostScan) -> list[Finding]:
    """The layout's problems with the vhost dir (names, dir names) and files it does not use."""
    out = [Finding(p.code, p.message, str(p.path), p.offset) for p in vs.vhost.problems]
    out += [Finding("unknown-file", "a file the broker does not use here", str(p)) for p in vs.vhost.others]
    return out


def queue_dir_findings(q: QueueDir, known: bool | None, messages: int, drops: dict[str, int]) -> list[Finding]:
    """One queue dir: files it should not hold, whether the broker deletes it (not a durable
    queue of the metadata), and the messages the next boot drops as transient or expired.
    ``messages``: held by its index; ``drops``: drop reason -> count."""
    where = {"queue": q.name, "priority": q.priority}
    out = [Finding("unknown-file", "a file the broker does not use in a queue dir", str(p), **where)
           for p in q.others]
    if known is False:
        out.append(Finding("unknown-queue", f"queue dir {q.dir_name} ({q.label}) is not a durable queue in "
                           f"the metadata: the next boot deletes it and its {messages} messages", str(q.path),
                           **where, details={"messages": messages}))
    if drops.get("transient"):
        out.append(Finding("transient-dropped", f"{drops['transient']} transient messages on disk are "
                           "dropped by the next boot", str(q.path), **where,
                           details={"messages": drops["transient"]}))
    if drops.get("expired"):
        out.append(Finding("expired", f"{drops['expired']} messages are past their TTL: the broker drops "
                           "them when they reach the head of the queue", str(q.path), **where,
                           details={"messages": drops["expired"]}))
    return out
