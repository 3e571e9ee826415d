"""The ``rabbitcq`` Spark data source (Python Data Source API, Spark 4.0 - 4.3).

``DefaultSource`` is what Spark's static lookup registers (through the top-level
``pyspark_rabbitcq`` shim); ``register(spark)`` registers it explicitly, safely on 4.0 where an
explicit registration of an already discovered name raises DATA_SOURCE_ALREADY_EXISTS.
"""

try:
    import pyspark  # noqa: F401  (the `spark` extra)
except ImportError:
    raise ModuleNotFoundError(
        "the rabbitcq Spark data source needs pyspark, which is not installed: pip install 'cqforensics[spark]'",
        name="pyspark",
    ) from None

from spark_datasource.schema import ANNOTATIONS_SCHEMA, DEATHS_SCHEMA, HEADERS_SCHEMA, typed_json
from spark_datasource.source import RabbitCQDataSource as DefaultSource


def register(spark) -> None:
    try:
        spark.dataSource.register(DefaultSource)
    except Exception as e:  # 4.0.x: the name is already registered by the static lookup
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(e):
            raise


__all__ = ["DefaultSource", "register", "typed_json", "HEADERS_SCHEMA", "ANNOTATIONS_SCHEMA", "DEATHS_SCHEMA"]
