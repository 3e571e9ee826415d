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


# -- a record batch as JSON lines, column by column ------------------------------------------------


def batch_lines(batch) -> str:
    """The rows of an Arrow record batch as JSON lines in the convention: the very text of
    ``dumps(row) + "\\n"`` for each row of ``batch.to_pylist()``, made a column at a time (each
    value's text by one vectorised cast or one C call; the JSON text columns parsed and written
    again once per distinct text). Row by row, ``to_pylist``, ``convert`` and ``json.dumps`` cost
    about 140 µs a message (bodies, properties, headers): JSON Lines output of the 1x bench store
    took 69 CPU-s where Parquet took 4. A batch whose key names would depend on its values (a
    binary column other than ``body`` or an id, holding nulls) is written row by row."""
    import pyarrow as pa

    names = batch.schema.names
    keyed = []  # (the key dumps would write, the column's value texts)
    for name, col in zip(names, batch.columns):
        if _is_binary(col.type) and not is_id(name) and name != "body" and col.null_count:
            return "".join(dumps(row) + "\n" for row in batch.to_pylist())  # the key depends on the value
        key = f"{name}_base64" if _is_binary(col.type) and not is_id(name) else name
        keyed.append((key, _texts(col, name, pa)))
    if len({k for k, _ in keyed}) < len(keyed):  # two columns under one key: the later one wins, as in convert
        return "".join(dumps(row) + "\n" for row in batch.to_pylist())
    keyed.sort(key=lambda kt: kt[0])
    if not keyed:
        return "{}\n" * batch.num_rows
    line = "{" + ", ".join(_encode_str(k).replace("%", "%%") + ": %s" for k, _ in keyed) + "}\n"
    return "".join([line % row for row in zip(*(texts for _, texts in keyed))])


def _is_binary(t) -> bool:
    import pyarrow as pa

    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)


def _texts(col, key: str, pa) -> list[str]:
    """The JSON text of each value of Arrow array ``col`` under ``key``, as ``dumps`` writes it."""
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        # Arrow's decimal digits and true/false are json's (ints of any width, bools)
        return col.cast(pa.string()).fill_null("null").to_pylist()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        enc = _encode_str
        if key in JSON_TEXT:
            memo: dict = {None: "null"}

            def typed(s):
                try:
                    return memo[s]
                except KeyError:
                    try:
                        text = json.dumps(json.loads(s), ensure_ascii=False, sort_keys=True)
                    except ValueError:
                        text = enc(s)
                    memo[s] = text
                    return text

            return [typed(s) for s in col.to_pylist()]
        return [enc(s) if s is not None else "null" for s in col.to_pylist()]
    if _is_binary(t):
        if is_id(key):
            return [f'"{b.hex()}"' if b is not None else "null" for b in col.to_pylist()]
        b64 = base64.b64encode
        return [f'"{b64(b).decode()}"' if b is not None else "null" for b in col.to_pylist()]
    if pa.types.is_struct(t):
        fields = sorted(
            (f"{f.name}_base64" if _is_binary(f.type) and not is_id(f.name) else f.name, child, f)
            for f, child in zip(t, col.flatten())
        )
        if any(
            _is_binary(f.type) and not is_id(f.name) and f.name != "body" and child.null_count for _, child, f in fields
        ):
            return [json.dumps(value(v, key), ensure_ascii=False, sort_keys=True) for v in col.to_pylist()]
        children = [[f"{_encode_str(k)}: {x}" for x in _texts(child, f.name, pa)] for k, child, f in fields]
        valid = col.is_valid().to_pylist()
        if not children:
            return ["{}" if ok else "null" for ok in valid]
        return [f"{{{', '.join(parts)}}}" if ok else "null" for ok, parts in zip(valid, zip(*children))]
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_string(t.value_type):
        enc = _encode_str
        return [
            "null" if v is None else "[" + ", ".join(enc(x) if x is not None else "null" for x in v) + "]"
            for v in col.to_pylist()
        ]
    # anything else (times, floats, other nesting): each value converted and written as dumps writes it
    dump = json.dumps
    return ["null" if v is None else dump(value(v, key), ensure_ascii=False, sort_keys=True) for v in col.to_pylist()]
