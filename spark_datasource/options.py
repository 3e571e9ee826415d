"""The data source's options: strings in, typed settings out, validated at planning time.

Kept free of pyspark imports so it is tested without a JVM. Every option is documented in
docs/spark.md (tests/house/test_docs.py checks that the table there lists exactly ``OPTIONS``).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass

from cqforensics.base.errors import UsageError
from cqforensics.base.schema import TABLES
from cqforensics.model.options import Options, make_options, parse_as_of

#: option name (lower case, as Spark hands them over) -> (default, meaning)
OPTIONS = {
    "table": ("messages", f"which table to read: {', '.join(TABLES)}"),
    "maxpartitionbytes": (str(128 << 20), "target input bytes per partition (bin-packing; a task costs ~30 ms)"),
    "minpartitions": ("1", "split the input into at least this many partitions when it is big enough"),
    "brokerversion": ("", "RabbitMQ version whose next boot to predict (3.10 .. 4.3); default: inferred"),
    "asof": ("", "time TTLs are judged at: ISO 8601 or epoch milliseconds; default: now"),
    "vhosts": ("", "comma-separated vhost names to read (default: all)"),
    "queues": ("", "comma-separated queue names for the queue-level tables (default: all)"),
    "batchrows": ("8192", "rows per Arrow batch at most"),
    "batchbytes": (str(16 << 20), "body bytes per Arrow batch, about"),
}


@dataclass(frozen=True)
class Settings:
    paths: tuple[str, ...]
    table: str
    max_partition_bytes: int
    min_partitions: int
    broker_version: str | None
    as_of_ms: int | None
    vhosts: tuple[str, ...] | None
    queues: tuple[str, ...] | None
    batch_rows: int
    batch_bytes: int
    options: Options  # the reading options, built once by make_options (pickled into the tasks)


def _int(opts: dict, key: str, low: int = 1) -> int:
    raw = opts.get(key, OPTIONS[key][0])
    try:
        v = int(raw)
    except ValueError:
        raise UsageError(f"option {key}: not an integer: {raw!r}") from None
    if v < low:
        raise UsageError(f"option {key}: must be >= {low}, got {v}")
    return v


def _list(opts: dict, key: str) -> tuple[str, ...] | None:
    raw = opts.get(key, "")
    items = tuple(x.strip() for x in raw.split(",") if x.strip())
    return items or None


def expand_paths(opts: dict) -> tuple[str, ...]:
    """``path`` or the JSON list ``paths`` (load([p1, p2])), globs expanded, made absolute."""
    if "paths" in opts:
        try:
            raw = json.loads(opts["paths"])
        except json.JSONDecodeError:
            raise UsageError(f"option paths: not a JSON list: {opts['paths']!r}") from None
    elif opts.get("path"):
        raw = [opts["path"]]
    else:
        raise UsageError("no path given: use spark.read.format('rabbitcq').load(path)")
    out = []
    for p in raw:
        if any(ch in p for ch in "*?["):
            hits = sorted(glob.glob(p, recursive=True))
            if not hits:
                raise UsageError(f"path {p}: the pattern matches nothing")
            out += hits
        else:
            out.append(p)
    return tuple(os.path.abspath(p) for p in out)


def parse(opts: dict) -> Settings:
    """Spark's options (a case-insensitive dict of strings) -> Settings, or UsageError."""
    opts = {k.lower(): v for k, v in opts.items()}
    known = set(OPTIONS) | {"path", "paths"}
    unknown = sorted(set(opts) - known)
    if unknown:
        raise UsageError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(OPTIONS))}")
    table = opts.get("table", "messages").lower()
    if table not in TABLES:
        raise UsageError(f"option table: {table!r} is not one of {', '.join(TABLES)}")
    version = opts.get("brokerversion") or None
    as_of_ms = parse_as_of(opts.get("asof") or None, "option asOf")  # the one as-of parser
    batch_rows, batch_bytes = _int(opts, "batchrows"), _int(opts, "batchbytes")
    options = make_options(version, as_of_ms, batch_rows=batch_rows, batch_bytes=batch_bytes)  # validates the version
    return Settings(
        expand_paths(opts),
        table,
        _int(opts, "maxpartitionbytes"),
        _int(opts, "minpartitions"),
        version,
        as_of_ms,
        _list(opts, "vhosts"),
        _list(opts, "queues"),
        batch_rows,
        batch_bytes,
        options,
    )
