"""Writers: ``compact``, ``rebuild`` and the Spark writer's store builder, with ``verify``.

Layers: ``formats`` (bytes of each file, from the grammars' twins) -> ``store`` (a vhost's
queue dirs and shared store) -> ``salvage`` (compact/rebuild from a scan: ``rewrite_vhost`` with
a ``RewriteContext``) and ``rows`` (the Spark writer's rows, appended through ``rewrite_vhost``)
-> ``output`` (``Staging``: the one staging dir and atomic rename or exchange every writer
commits through, and ``copy_tree``) and ``verify``. Writers import only each other's public
names; what happens to each message's fate is asked of ``model.recovery``, and entry framing
of the readers and of ``formats``.
"""

from cqforensics.write.salvage import compact, rebuild
from cqforensics.write.verify import verify

__all__ = ["compact", "rebuild", "verify"]
