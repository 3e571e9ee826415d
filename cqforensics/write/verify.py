"""``verify``: strict invariants of a node dir, the bar every writer's output must pass.

Consistent means: the next boot (dirty recovery, the way writers' output boots) delivers every
message the indexes hold, except those past their TTL; every live index entry resolves to a
body that passes its checks (``.qs`` size and CRC, shared-store framing and marker, reachable
by the version's store scan); ``.qs`` entries do not overlap; no shared-store entry is
unreferenced or stored twice; no transient messages; index and store headers are valid; recorded
reference counts (when clean-shutdown files exist) match the indexes; and every queue dir is a
durable queue of the metadata. ``deep`` also decodes every stored message and checks its id.

Anything fsck reports as a warning or an error breaks consistency, and so do the informational
findings for garbage (``orphan-message``, ``duplicate-copy``, ``transient-dropped``).

Streams are outside these invariants: the writers copy a node's stream dirs as they are (they
repair no osiris file), so what fsck finds in them (``osiris-*``, ``stream-*``) is a note, and a
stream's verdict adds no violation.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cqforensics.base import exitcodes
from cqforensics.base.enums import Fate
from cqforensics.base.errors import display
from cqforensics.base.findings import CODES, INFO, Finding
from cqforensics.checks import check_vhost, qs_overlaps, undelivered
from cqforensics.discovery import nodes as layout
from cqforensics.model.options import make_options
from cqforensics.model.vhost import NodeScan

BREAKS = frozenset({"orphan-message", "duplicate-copy", "transient-dropped"})
#: outside the invariants verify checks, and carried over as they are by the writers: notes. Damage
#: in the metadata and term files (Mnesia logs, Khepri WAL, DETS, ets), anything found in the
#: node-level files (``details["place"] == "node"``, e.g. a FIFO named like a Mnesia file), and a
#: message the index holds twice (a copied slot: every entry still resolves, the message is
#: delivered twice; the writers keep both copies as the source index holds them)
CARRIED_OVER = frozenset(
    {"term-file-damaged", "index-duplicate-entry"} | {c for c in CODES if c.startswith(("osiris-", "stream-"))}
)
#: quorum queues' Ra data (``quorum/<node>/``) is copied by the writers as it is (they rewrite
#: ``msg_stores/vhosts`` only): what is found there, and what its next boot drops, is carried over
CARRIED_OVER |= {code for code in CODES if code.startswith("quorum-")}
#: a vhost dir's ``.vhost`` missing, damaged or naming another vhost: the broker never reads it (it
#: writes it at every recovery of the vhost, rabbit_vhost:recover/1) and finds a vhost's store by
#: its name's dir, so the next boot is the same; a dir under another name than its vhost's shows
#: in its queues (``unknown-queue``). Writers leave the file out when no name is known for the dir.
NAME_NOTES = frozenset({"missing-queue-name", "queue-dir-mismatch"})


@dataclass
class VerifyResult:
    path: str
    violations: list[Finding] = field(default_factory=list)
    notes: list[Finding] = field(default_factory=list)  # findings that do not break consistency
    nodes: int = 0
    vhosts: int = 0
    queues: int = 0
    messages: int = 0
    store_entries: int = 0
    broker_version: str = ""

    @property
    def consistent(self) -> bool:
        return not self.violations

    @property
    def exit_code(self) -> int:
        return exitcodes.OK if self.consistent else exitcodes.ERRORS_LEFT

    def to_dict(self) -> dict:
        return {
            "format": "cqforensics-verify/1",
            "path": self.path,
            "consistent": self.consistent,
            "broker_version": self.broker_version,
            "nodes": self.nodes,
            "vhosts": self.vhosts,
            "queues": self.queues,
            "messages": self.messages,
            "store_entries": self.store_entries,
            "violations": [f.to_dict() for f in self.violations],
            "notes": [f.to_dict() for f in self.notes],
            "exit_code": self.exit_code,
        }


def verify(
    paths,
    broker_version: str | None = None,
    deep: bool = False,
    progress: Callable[[str, int | None, int | None], None] | None = None,
    garbage_allowed_in=(),
    allow_garbage: bool = False,
    jobs: int = 1,
) -> VerifyResult:
    """``garbage_allowed_in``: shared-store files whose orphans and extra copies are accepted
    (notes, not violations): the files ``compact --threshold`` kept whole; ``allow_garbage``:
    in every file (``verify --allow-garbage``, for a ``compact --threshold`` output); ``jobs``:
    processes checking a big vhost's listing at once (the same result)."""
    allowed = {os.path.realpath(p) for p in garbage_allowed_in}
    options = make_options(broker_version=broker_version, bodies=False, decode=False, assume_dirty=True, jobs=jobs)
    result = VerifyResult(display(paths) if isinstance(paths, (str, Path)) else " ".join(map(display, paths)))
    versions = set()
    scans = [NodeScan(node, options) for node in layout.discover(paths)]
    if progress is not None:
        from cqforensics.read.driver import Progress

        progress = Progress(progress)
        progress.plan(scans)
    for ns in scans:
        result.nodes += 1
        versions.add(ns.model.label)
        if progress is not None:
            progress.attach(ns)
        # the node does not start for the quorum queues' Ra data (a WAL its Ra refuses), which the
        # writers carry over as it is: what that costs the classic queues is carried over too
        carried_hang = ns.quorum_refusal is not None and not ns.hang_causes
        for vs in ns.vhosts:
            if progress is not None:
                progress.vhost(ns, vs)
            result.vhosts += 1
            try:
                verdicts, findings = check_vhost(vs, deep)
                findings += qs_overlaps(vs)
                result.store_entries += vs.store_entries()
            finally:
                vs.close()
            named = {(f.code, f.vhost, f.queue) for f in findings}
            for v in verdicts:
                result.queues += 1
                result.messages += v.messages
                if v.queue_type == "classic":  # a stream's or quorum queue's losses: their own findings (notes)
                    for f in undelivered(v, named):
                        carried = carried_hang and f.details.get("fate") == Fate.BOOT_HANG.label
                        (result.notes if carried else findings).append(f)
            for f in findings:
                if (
                    f.code in BREAKS
                    and f.code != "transient-dropped"
                    and f.file is not None
                    and (allow_garbage or os.path.realpath(f.file) in allowed)
                ):
                    result.notes.append(f)
                elif (
                    f.code in CARRIED_OVER
                    or f.details.get("place") == "node"
                    or (f.code in NAME_NOTES and f.file is not None and os.path.basename(f.file) == ".vhost")
                ):
                    result.notes.append(f)
                elif f.severity != INFO or f.code in BREAKS:
                    result.violations.append(f)
                elif f.code not in ("unclean-shutdown", "expired"):
                    result.notes.append(f)
    if progress is not None:
        progress.end()
    result.broker_version = ", ".join(sorted(versions))
    return result
