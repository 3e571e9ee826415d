"""The one JSON convention of every output document and line (docs/commands.md, "JSON output").

* a 16-byte id (``msg_id``, and any key ending in ``msg_id``): lowercase hex, 32 digits;
* any other binary value under key ``k``: standard base64 (with padding) under ``k_base64``
  (``body`` -> ``body_base64``, ``body_preview`` -> ``body_preview_base64``);
* typed JSON kept as text in Arrow (``headers``, ``annotations``, ``details``): nested JSON;
* times: ISO 8601 strings in UTC (``2026-11-20T10:00:00+00:00``);
* offsets, sizes, counts, sequence ids: JSON integers (decimal), never hex strings.

Schemas for each document (draft 2020-12) ship in ``cqforensics/json_schemas/``.
"""

from __future__ import annotations

import base64
import datetime as dt
import json

#: Arrow string columns that hold typed JSON: emitted nested
JSON_TEXT = frozenset({"headers", "annotations", "details"})


def is_id(key) -> bool:
    return isinstance(key, str) and key.endswith("msg_id")


def value(v, key=None):
    """``v`` (under ``key``) as the convention writes it; bytes under a non-id key are base64
    (the key is renamed by ``convert`` when it converts the enclosing object)."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        return b.hex() if is_id(key) else base64.b64encode(b).decode()
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(dt.UTC)
        return v.isoformat()
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, dict):
        return convert(v)
    if isinstance(v, (list, tuple)):
        return [value(x, key) for x in v]
    if key in JSON_TEXT and isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def convert(d: dict) -> dict:
    """A row or document (a dict) in the convention: ids hex, other bytes as ``<key>_base64``,
    typed JSON nested, times ISO 8601."""
    out = {}
    for k, v in d.items():
        if isinstance(v, (bytes, bytearray, memoryview)) and not is_id(k):
            out[f"{k}_base64"] = value(v, k)
        elif k == "body" and v is None:
            out["body_base64"] = None
        else:
            out[k] = value(v, k)
    return out


def dumps(d: dict, **kw) -> str:
    """One JSON line (or, with ``indent``, a document) in the convention."""
    return json.dumps(convert(d), ensure_ascii=False, sort_keys=True, **kw)
