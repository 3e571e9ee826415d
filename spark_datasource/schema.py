"""Spark schemas derived from the single Arrow definition in ``cqforensics.base.schema``.

Spark's ``to_arrow_schema`` maps these StructTypes back to exactly the Arrow schemas the
readers produce (tests/frontends/test_spark.py checks every table), which Spark 4.2+ requires of
every batch a Python data source yields.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from cqforensics.base.schema import SCHEMAS


def spark_type(t: pa.DataType) -> DataType:
    if pa.types.is_string(t):
        return StringType()
    if pa.types.is_binary(t):
        return BinaryType()
    if pa.types.is_int32(t):
        return IntegerType()
    if pa.types.is_int64(t):
        return LongType()
    if pa.types.is_boolean(t):
        return BooleanType()
    if pa.types.is_float64(t):
        return DoubleType()
    if pa.types.is_timestamp(t):
        return TimestampType()
    if pa.types.is_list(t):
        return ArrayType(spark_type(t.value_type), t.value_field.nullable)
    if pa.types.is_struct(t):
        return StructType([StructField(f.name, spark_type(f.type), f.nullable) for f in t])
    raise TypeError(f"no Spark type for {t}")


def struct_type(table: str) -> StructType:
    """The Spark schema of a table."""
    return StructType([StructField(f.name, spark_type(f.type), f.nullable) for f in SCHEMAS[table]])


def arrow_schema(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark's worker expects for ``schema`` (4.0 .. 4.3)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(schema, timezone="UTC")  # 4.2+: keyword-only, timezone required
    except TypeError:
        return to_arrow_schema(schema)  # 4.0/4.1: timestamp[us, tz=UTC] by default


#: Spark DDL of the ``headers`` column's JSON (typed AMQP 0-9-1 headers, docs/tables.md): per
#: header name its AMQP type and its value; ``value`` holds the JSON text of a number, a decimal
#: ``{"scale", "value"}``, a nested table or array (parse it again with ``from_json`` and a schema
#: of its own), ``base64`` the bytes of a binary or non-UTF-8 string
HEADERS_SCHEMA = "MAP<STRING, STRUCT<type: STRING, value: STRING, base64: STRING>>"
#: Spark DDL of the ``annotations`` column's JSON: per key the JSON text of its value (``p``,
#: ``ts``, ``deaths``, ``amqp10``, ``mqtt``, ...)
ANNOTATIONS_SCHEMA = "MAP<STRING, STRING>"
#: Spark DDL of the dead-letter history in ``annotations["deaths"]`` (3.13+ messages)
DEATHS_SCHEMA = (
    "ARRAY<STRUCT<queue: STRING, reason: STRING, exchange: STRING, routing_keys: ARRAY<STRING>, "
    "count: BIGINT, first_time: BIGINT, last_time: BIGINT, ttl: BIGINT>>"
)
JSON_SCHEMAS = {"headers": HEADERS_SCHEMA, "annotations": ANNOTATIONS_SCHEMA}


def typed_json(df, columns=("headers", "annotations")):
    """``df`` with its ``headers`` and ``annotations`` JSON text turned into Spark maps, in one
    call (``HEADERS_SCHEMA``, ``ANNOTATIONS_SCHEMA``): ``typed_json(df).select(
    col("headers")["order-id"]["value"], col("annotations")["p"])``. Columns the frame lacks are
    left out; the others are kept as they are."""
    from pyspark.sql import functions as F

    for c in columns:
        if c in df.columns:
            df = df.withColumn(c, F.from_json(F.col(c), JSON_SCHEMAS[c]))
    return df
