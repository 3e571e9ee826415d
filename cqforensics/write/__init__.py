"""Writers: ``compact``, ``rebuild`` and the Spark writer's store builder, with ``verify``.

Layers: ``formats`` (bytes of each file, from the grammars' twins) -> ``store`` (a vhost's
queue dirs and shared store) -> ``salvage`` (compact/rebuild from a scan) and ``rows`` (the
Spark writer's rows) -> ``output`` (staging and the atomic rename) and ``verify``.
"""

from cqforensics.write.salvage import compact, rebuild
from cqforensics.write.verify import verify

__all__ = ["compact", "rebuild", "verify"]
