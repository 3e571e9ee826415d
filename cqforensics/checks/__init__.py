"""The checks: every finding that is not a reader's own is made here, shared by
``cqforensics fsck``, ``verify`` and the ``findings`` table (so Spark audits a fleet with exactly
this code, one vhost per task).

Each check names where the problem is (file + offset) and carries a stable code
(``findings.CODES``); findings are immutable, placed in their node, vhost and queue when made
(``Finding.scoped``). ``check_vhost`` runs them all in one pass over the vhost's indexes (one per
message-id share for a big vhost) and also returns the per-queue verdict: what the next boot
delivers, drops, or crashes on.

Modules by concern: ``index`` (a chunk's reader findings and body lookups), ``store`` (shared
stores), ``deep`` (``--deep`` decoding), ``layout`` (dirs and files), ``boot`` (crashes, dirty
recovery), ``consistency`` (what ``verify`` adds); ``vhost`` puts them together.
"""

from cqforensics.checks.consistency import qs_overlaps, undelivered
from cqforensics.checks.vhost import QueueVerdict, check_vhost, node_level_findings

__all__ = ["QueueVerdict", "check_vhost", "node_level_findings", "qs_overlaps", "undelivered"]
