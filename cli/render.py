"""Output helpers: JSON lines, aligned text tables, Parquet/CSV files."""

from __future__ import annotations

import base64
import datetime as dt
import json
import sys


def jsonable(v):
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, dt.datetime):
        return v.isoformat()
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [jsonable(x) for x in v]
    return v


def write_jsonl(rows, out=sys.stdout) -> None:
    for r in rows:
        out.write(json.dumps(jsonable(r), ensure_ascii=False, sort_keys=True) + "\n")


def text_table(rows: list[dict], columns: list[str], out=sys.stdout, max_width: int = 60) -> None:
    def cell(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, (bytes, bytearray)):
            v = bytes(v).hex()
        s = str(v)
        return s if len(s) <= max_width else s[:max_width - 1] + "…"

    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    out.write("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip() + "\n")
    for row in cells:
        out.write("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() + "\n")
