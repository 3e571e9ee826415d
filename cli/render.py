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


def write_jsonl(rows, out=None) -> None:
    out = out or sys.stdout
    for r in rows:
        out.write(json.dumps(jsonable(r), ensure_ascii=False, sort_keys=True) + "\n")


def text_table(rows: list[dict], columns: list[str], out=None, max_width: int = 60) -> None:
    out = out or sys.stdout
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


def _where(f) -> str:
    if not f.file:
        return ""
    return f.file + (f"@{f.offset:#x}" if f.offset is not None else "")


def fsck_text(report, out=None, show_all: bool = False) -> None:
    """The human report: nodes, a table of queues, findings grouped by severity and code."""
    out = out or sys.stdout
    for n in report.nodes:
        out.write(f"node {n.node}  ({n.path})\n")
        out.write(f"  next boot: RabbitMQ {n.broker_version}  [{n.version_source}]\n")
        for vhost, mode in n.vhost_recovery.items():
            what = "clean recovery: the broker trusts the shutdown state" if mode == "clean" else \
                "dirty recovery: the broker rebuilds the indexes from the files"
            out.write(f"  vhost {vhost}: {what}\n")
        if n.boot == "hangs":
            out.write("  BOOT HANGS: the broker will not come up on this data (see boot-crash)\n")
        out.write("\n")
        rows = []
        for q in report.queues:
            if q.node != n.node:
                continue
            why = ", ".join(f"{k} {v}" for k, v in sorted(q.drops.items()))
            if q.crash:
                why = f"CRASH ({q.crash}); " + why if why else f"CRASH ({q.crash})"
            rows.append({"vhost": q.vhost, "queue": q.queue, "messages": q.messages,
                         "after restart": q.predicted_after_restart, "dropped": q.dropped, "why": why})
        if rows:
            text_table(rows, ["vhost", "queue", "messages", "after restart", "dropped", "why"], out, max_width=70)
            out.write("\n")
    s = report.summary()
    c = s["findings"]
    out.write(f"{s['messages']} messages in {s['queues']} queues: {s['predicted_after_restart']} delivered after "
              f"the next boot, {s['dropped']} dropped" + (f"; crashes: {', '.join(s['crashes'])}" if s["crashes"] else "")
              + "\n")
    out.write(f"findings: {c['error']} errors, {c['warning']} warnings, {c['info']} info\n")
    groups: dict = {}
    for f in report.findings:
        groups.setdefault((f.severity, f.code), []).append(f)
    order = {"error": 0, "warning": 1, "info": 2}
    for (sev, code), fs in sorted(groups.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        out.write(f"\n{sev.upper()} {code} ({len(fs)})\n")
        for f in fs if show_all else fs[:5]:
            where = _where(f)
            scope = " ".join(f"{k} {v!r}" for k, v in (("vhost", f.vhost), ("queue", f.queue)) if v is not None)
            out.write(f"  [{scope}] {f.message}" + (f"\n    at {where}" if where else "") + "\n")
        if not show_all and len(fs) > 5:
            out.write(f"  ... and {len(fs) - 5} more (--all-findings)\n")
    code = report.exit_code
    out.write(f"\nexit {code}: " + ("no errors" if code == 0 else "errors found and left (fsck repairs nothing; "
                                     "see cqforensics rebuild)") + "\n")

