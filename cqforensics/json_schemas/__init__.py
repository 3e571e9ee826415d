"""JSON Schemas (draft 2020-12) of every JSON document and line cqforensics writes, in the one
convention of ``cqforensics.base.jsonout`` (docs/commands.md, "JSON output").

Shipped as package data (``cqforensics/json_schemas/*.json``): ``fsck.json`` (``cqforensics-fsck/1``,
``fsck --json``), ``finding.json`` (a finding: ``fsck --jsonl`` lines and ``fsck --json``'s
``findings``), ``audit.json`` (``audit --json``), ``dump-line.json`` (``dump --jsonl``),
``export-line.json`` (``export --format jsonl`` lines), ``read-<table>.json`` (``read --format
jsonl`` lines of each table), ``lost-found-line.json`` and ``provenance.json``. The schemas of
table rows are generated from the Arrow schemas (``python3 -m cqforensics.json_schemas`` rewrites
them; ``tests/tables/test_json_schemas.py`` checks the shipped files are current and validates real
outputs of every sample against them).
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
DIALECT = "https://json-schema.org/draft/2020-12/schema"
BASE = "https://cqforensics.invalid/schemas/"

HEX_ID = {"type": "string", "pattern": "^[0-9a-f]{32}$"}
BASE64 = {"type": "string", "contentEncoding": "base64", "pattern": "^[A-Za-z0-9+/]*={0,2}$"}
DATE_TIME = {"type": "string", "format": "date-time"}


def load(name: str) -> dict:
    """The shipped schema ``name`` (e.g. ``fsck``, ``read-messages``)."""
    return json.loads((HERE / f"{name}.json").read_text(encoding="utf-8"))


def names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.json"))


def _nullable(s: dict) -> dict:
    t = s.get("type")
    if t is None:
        return {"anyOf": [s, {"type": "null"}]}
    return {**s, "type": [t, "null"] if isinstance(t, str) else [*t, "null"]}


def _arrow(field) -> tuple[str, dict]:
    """(JSON key, schema) of one Arrow field in the convention."""
    import pyarrow as pa

    from cqforensics.base import jsonout

    t, name = field.type, field.name
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        key, s = (name, HEX_ID) if jsonout.is_id(name) else (f"{name}_base64", BASE64)
    elif name in jsonout.JSON_TEXT:
        key, s = name, {"type": "object"}
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        key, s = name, {"type": "string"}
    elif pa.types.is_boolean(t):
        key, s = name, {"type": "boolean"}
    elif pa.types.is_integer(t):
        key, s = name, {"type": "integer"}
    elif pa.types.is_floating(t):
        key, s = name, {"type": "number"}
    elif pa.types.is_timestamp(t):
        key, s = name, DATE_TIME
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        key, s = name, {"type": "array", "items": _arrow(t.value_field)[1]}
    elif pa.types.is_struct(t):
        props = dict(_arrow(t.field(i)) for i in range(t.num_fields))
        key, s = name, {"type": "object", "properties": props, "additionalProperties": False}
    else:
        raise TypeError(f"{name}: no JSON mapping for Arrow type {t}")
    return key, _nullable(s) if field.nullable else s


def row_schema(arrow_schema, sid: str, title: str, required: bool = False) -> dict:
    props = dict(_arrow(f) for f in arrow_schema)
    out = {
        "$schema": DIALECT,
        "$id": BASE + sid,
        "title": title,
        "type": "object",
        "properties": props,
        "additionalProperties": False,
    }
    if required:
        out["required"] = sorted(props)
    return out


def generated() -> dict[str, dict]:
    """The schemas generated from the Arrow schemas: read lines of every table, export lines."""
    import cqforensics
    from cqforensics.base.schema import TABLES

    out = {}
    for t in TABLES:
        out[f"read-{t}"] = row_schema(
            cqforensics.schema(t),
            f"read-{t}.json",
            f"cqforensics read --table {t} --format jsonl: one line (a row; --columns may leave columns out)",
        )
    from cqforensics.commands.export import SCHEMA

    out["export-line"] = row_schema(
        SCHEMA, "export-line.json", "cqforensics export --format jsonl: one line of messages.jsonl", required=True
    )
    return out


def write() -> list[Path]:
    written = []
    for name, s in generated().items():
        p = HERE / f"{name}.json"
        p.write_text(json.dumps(s, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        written.append(p)
    return written
