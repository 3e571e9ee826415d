"""Spark discovers Python data sources in top-level ``pyspark_*`` modules exposing
``DefaultSource``: this shim makes ``spark.read.format("rabbitcq")`` work after ``pip install``
with no ``register()`` call. It must stay import-light and free of side effects: a failing
``pyspark_*`` import disables the lookup of every Python data source."""

from spark_datasource import DefaultSource, register

__all__ = ["DefaultSource", "register"]
