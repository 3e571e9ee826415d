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


def document(v, indent: int = 1) -> str:
    """``v`` as a JSON document in the convention, indented: the very text of
    ``json.dumps(convert(v), ensure_ascii=False, sort_keys=True, indent=indent)`` (``value(v)``
    when ``v`` is no dict), made in one pass. The standard library's C encoder cannot indent
    (before Python 3.14), and its Python one resumes a generator per value: for a report of
    20,000 queues (tens of MB) that was seconds, most of the cost of ``fsck --json``."""
    out: list[str] = []
    put = out.append
    enc = _encode_str
    newlines: list[str] = []

    def newline(level: int) -> str:
        while len(newlines) <= level:
            newlines.append("\n" + " " * (indent * len(newlines)))
        return newlines[level]

    def write(v, level: int, conv: bool, key) -> None:
        t = type(v)
        if t is str:
            if conv and key in JSON_TEXT:
                try:
                    parsed = json.loads(v)
                except ValueError:
                    pass
                else:
                    write(parsed, level, False, None)  # emitted as parsed, not converted further
                    return
            put(enc(v))
        elif t is int:
            put(int.__repr__(v))
        elif v is None:
            put("null")
        elif v is True:
            put("true")
        elif v is False:
            put("false")
        elif t is dict or isinstance(v, dict):
            write_dict(v, level, conv)
        elif t is list or t is tuple or isinstance(v, (list, tuple)):
            if not v:
                put("[]")
                return
            inner = newline(level + 1)
            put("[")
            sep = inner
            for x in v:
                put(sep)
                write(x, level + 1, conv, key)
                sep = "," + inner
            put(newline(level))
            put("]")
        elif conv and isinstance(v, (bytes, bytearray, memoryview, dt.date)):
            put(enc(value(v, key)))
        elif isinstance(v, str):
            write(str.__str__(v), level, conv, key)
        elif isinstance(v, int):
            put(int.__repr__(v))
        elif isinstance(v, float):
            put(_float_text(v))
        else:
            raise TypeError(f"Object of type {v.__class__.__name__} is not JSON serializable")

    def write_dict(d: dict, level: int, conv: bool) -> None:
        if d and _flat(d, conv) and leaf is not None:  # a record of scalars: all of it in C
            text = leaf(level + 1)(d, 0)
            put("{")
            put(newline(level + 1))
            put("".join(text)[1:-1])
            put(newline(level))
            put("}")
            return
        if conv:  # the keys convert() gives (a later one of the same name replaces an earlier)
            items: dict = {}
            for k, v in d.items():
                if isinstance(v, (bytes, bytearray, memoryview)) and not is_id(k):
                    items[f"{k}_base64"] = (v, k)
                elif k == "body" and v is None:
                    items["body_base64"] = (None, k)
                else:
                    items[k] = (v, k)
        else:
            items = {k: (v, None) for k, v in d.items()}
        if not items:
            put("{}")
            return
        inner = newline(level + 1)
        put("{")
        sep = inner
        for k, (v, orig) in sorted(items.items()):
            put(sep)
            put(enc(k) if type(k) is str else enc(_key_text(k)))
            put(": ")
            write(v, level + 1, conv, orig)
            sep = "," + inner
        put(newline(level))
        put("}")

    leaves: dict[int, object] = {}

    def make_leaf(level: int):
        """The C encoder of a flat record at ``level``: its item separator is the newline and
        indent of that level (nothing nested in it to indent further)."""
        if level not in leaves:
            leaves[level] = _c_make_encoder(
                None, _unserializable, _encode_str, None, ": ", "," + newline(level), True, False, True
            )
        return leaves[level]

    leaf = make_leaf if _c_make_encoder is not None else None
    write(v, 0, True, None)
    return "".join(out)


_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
#: the types of a value a flat record may hold as it is (written by the C encoder as ``json`` does)
_SCALARS = frozenset({str, int, float, bool, type(None)})
#: the keys whose value the convention may change without changing its type (typed JSON text;
#: a null ``body``)
_CONVERTED_KEYS = JSON_TEXT | {"body"}


def _flat(d: dict, conv: bool) -> bool:
    """Whether ``d`` holds only scalars and empty containers, none that the convention changes:
    what the C encoder writes the same way."""
    vals = d.values()
    if not _SCALARS.issuperset(map(type, vals)) and not all(
        type(x) in _SCALARS or (type(x) is dict or type(x) is list) and not x for x in vals
    ):
        return False
    return not conv or _CONVERTED_KEYS.isdisjoint(d)


def _unserializable(o):
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


_encode_str = getattr(json.encoder, "c_encode_basestring", None) or json.encoder.py_encode_basestring


def _float_text(v: float) -> str:
    """A float as ``json`` writes it (``allow_nan``: NaN and the infinities as JavaScript names)."""
    if v != v:
        return "NaN"
    if v == float("inf"):
        return "Infinity"
    if v == -float("inf"):
        return "-Infinity"
    return float.__repr__(v)


def _key_text(k) -> str:
    """A dict key that is no str, as ``json`` writes it (or its TypeError)."""
    if isinstance(k, str):
        return str.__str__(k)
    if k is True:
        return "true"
    if k is False:
        return "false"
    if k is None:
        return "null"
    if isinstance(k, int):
        return int.__repr__(k)
    if isinstance(k, float):
        return _float_text(k)
    raise TypeError(f"keys must be str, int, float, bool or None, not {k.__class__.__name__}")
