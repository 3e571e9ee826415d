"""Output helpers: JSON lines, aligned text tables, Parquet/CSV files."""

from __future__ import annotations

import json
import sys

from cqforensics.errors import display


def jsonable(v):
    """``v`` in the one JSON convention (``cqforensics.jsonout``): msg_id hex, other bytes as
    ``<key>_base64``, typed JSON nested, times ISO 8601."""
    from cqforensics import jsonout

    return jsonout.convert(v) if isinstance(v, dict) else jsonout.value(v)


def dump_value(v) -> str:
    """A ``dump`` field as text: strings as they are (Erlang terms come as Erlang text, see
    ``cqforensics.etf.format_term``), numbers, ``true``/``false``, bytes as an Erlang binary
    (``<<"text">>`` or ``<<1,2,3>>``), anything else (lists, header maps) as compact JSON, never
    as a Python repr."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        from cqforensics.etf import format_term

        return format_term(bytes(v))
    return json.dumps(jsonable(v), ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def write_jsonl(rows, out=None) -> None:
    out = out or sys.stdout
    for r in rows:
        out.write(json.dumps(jsonable(r), ensure_ascii=False, sort_keys=True) + "\n")


#: columns holding paths: cut from the front when too wide, so the file name stays readable
PATH_COLUMNS = frozenset({"file", "store_file", "path", "source", "output"})


def fit(s: str, width: int, tail: bool = False) -> str:
    """``s`` cut to ``width`` characters with an ellipsis: its head, or with ``tail`` (paths) its
    end, where the file name is."""
    if len(s) <= width:
        return s
    return "…" + s[len(s) - width + 1:] if tail else s[:width - 1] + "…"


def _cell(v, column: str, max_width: int) -> str:
    if v is None:
        return "-"
    if isinstance(v, (bytes, bytearray)):
        v = bytes(v).hex()
    s = str(v)
    return fit(s, max_width, tail=column in PATH_COLUMNS or s.startswith(("/", "./", "../")))


def text_table(rows: list[dict], columns: list[str], out=None, max_width: int = 60) -> None:
    TextTable(columns, out or sys.stdout, max_width).write(rows)


class TextTable:
    """An aligned text table written as its rows arrive (``write`` per batch, each flushed), so
    ``cqforensics read ... | head`` shows rows at once and nothing is held: the header is
    written with the first rows; column widths are those of the rows seen so far (they grow,
    never shrink, so a later batch with wider values is aligned from there on)."""

    def __init__(self, columns: list[str], out=None, max_width: int = 60):
        self.columns, self.out, self.max_width = list(columns), out or sys.stdout, max_width
        self.widths = [len(c) for c in self.columns]
        self.started = False

    def write(self, rows: list[dict]) -> None:
        cells = [[_cell(r.get(c), c, self.max_width) for c in self.columns] for r in rows]
        for row in cells:
            self.widths = [max(w, len(v)) for w, v in zip(self.widths, row)]
        lines = []
        if not self.started:
            lines.append("  ".join(c.ljust(w) for c, w in zip(self.columns, self.widths)).rstrip())
            self.started = True
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, self.widths)).rstrip() for row in cells]
        if lines:
            self.out.write("\n".join(lines) + "\n")
            self.out.flush()

    def close(self) -> None:
        """Write the header if no row came (an empty table still names its columns)."""
        if not self.started:
            self.write([])


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
        if n.written_by and not n.version_source.startswith("inferred"):
            out.write(f"  data written by: RabbitMQ {n.written_by['label']}  [{'; '.join(n.written_by['why'])}]\n")
        for vhost, mode in n.vhost_recovery.items():
            what = "clean recovery: the broker trusts the shutdown state" if mode == "clean" else \
                "dirty recovery: the broker rebuilds the indexes from the files"
            out.write(f"  vhost {vhost}: {what}\n")
        if n.boot == "hangs":
            out.write("  BOOT HANGS: the broker will not come up on this data (see boot-crash, quorum-wal-refused)\n")
        out.write("\n")
        rows = []
        for q in report.queues:
            if q.node != n.node:
                continue
            why = ", ".join(f"{k} {v}" for k, v in sorted(q.drops.items()))
            if q.crash:
                why = f"CRASH ({q.crash}); " + why if why else f"CRASH ({q.crash})"
            rows.append({"vhost": q.vhost, "queue": q.queue, "type": q.queue_type, "messages": q.messages,
                         "after restart": q.predicted_after_restart, "dropped": q.dropped, "why": why})
        if rows:
            # the type column when the node holds a queue other than classic (quorum)
            typed = ["type"] if any(r["type"] != "classic" for r in rows) else []
            text_table(rows, ["vhost", "queue", *typed, "messages", "after restart", "dropped", "why"], out,
                       max_width=70)
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


def _counts(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items()))


def rewrite_text(result, out=None) -> None:
    """compact/rebuild report: per queue what was written, and where the rest went."""
    out = out or sys.stdout
    rebuild = result.command == "rebuild"
    verb = "would write" if result.dry_run else "wrote"
    out.write(f"{result.command} {result.source}\n  -> {result.output}"
              + ("  (dry run: nothing written)" if result.dry_run else "") + "\n")
    source = getattr(result, "source_version", "")
    out.write(f"  written for RabbitMQ {result.broker_version}"
              + (f" (SRC read as {source})" if source and source != result.broker_version else "") + "\n\n")
    rows = []
    for q in result.queues:
        row = {"vhost": q.vhost, "queue": q.queue if q.priority is None else f"{q.queue} [p{q.priority}]",
               "index": f"v{q.index_version}" + (f"->v{q.written_version}" if q.written_version not in
                                                   (None, q.index_version) else "") if q.index_version else "-",
               "messages": q.messages, "written": q.written,
               "not written": _counts({**q.dropped, **{f"quarantined {k}": v for k, v in q.quarantined.items()},
                                       **{f"LOST {k}": v for k, v in q.lost.items()}})
               + (f" (dir skipped: {q.skipped})" if q.skipped else "")}
        if rebuild:
            row["broker would deliver"] = q.broker_would_deliver
        if q.messages or q.skipped:
            rows.append(row)
    cols = ["vhost", "queue", "index", "messages"] + (["broker would deliver"] if rebuild else []) + \
        ["written", "not written"]
    if rows:
        text_table(rows, cols, out, max_width=80)
        out.write("\n")
    t = result.totals()
    out.write(f"messages: {t['messages']} held by the indexes, {t['written']} {verb}"
              + (f" ({t['rescued']} that the broker's own next boot would lose)" if rebuild else "") + "\n")
    for label, key in (("dropped by design", "dropped"), ("quarantined in lost+found", "quarantined"),
                       ("LOST (no bytes left)", "lost")):
        if t[key]:
            out.write(f"  {label}: {_counts(t[key])}\n")
    restored = getattr(result, "restored", None)
    if restored:
        per: dict = {}
        for r in restored:
            per[(r["vhost"], r["queue"])] = per.get((r["vhost"], r["queue"]), 0) + 1
        out.write(f"  orphans restored (--restore-orphans; listed in lost+found with reason 'restored'): "
                  + ", ".join(f"{q!r} ({v}) {n}" for (v, q), n in sorted(per.items(), key=str)) + "\n")
    g = result.garbage
    if g:
        out.write("shared-store entries no index holds (not written): "
                  + ", ".join(f"{k} {n} ({b} bytes)" for k, (n, b) in sorted(g.items())) + "\n")
    out.write(f"message store bytes: {result.bytes_before} before, {result.bytes_after} after "
              f"({result.bytes_before - result.bytes_after} reclaimed); {result.store_entries_written} shared-store "
              f"entries in {result.store_files_written} files\n")
    files = getattr(result, "store_files", None)
    if result.threshold is not None and files:
        for action in ("rewritten", "kept"):
            picked = [f for f in files if f["action"] == action]
            out.write(f"store files {action} (garbage {'above' if action == 'rewritten' else 'at or below'} "
                      f"{result.threshold:g}%" + (" or not keepable" if action == "rewritten" else "")
                      + f"): {len(picked)}\n")
            for f in picked:
                out.write(f"  {f['file']}: {f['size']} bytes, {100 * f['garbage_ratio']:.1f}% garbage"
                          + (f" ({f['why']})" if f.get("why") else "") + "\n")
    if result.lost_found:
        where = result.lost_found_path or "lost+found/"
        out.write(f"lost+found: {result.lost_found} items ({where})\n")
    for n in result.notes:
        out.write(f"note: {display(n)}\n")  # notes may quote non-UTF-8 names
    if not result.dry_run:
        out.write(f"verify: {'consistent' if result.verified else 'not run'}\n")
    code = result.exit_code
    out.write(f"\nexit {code}: " + ("damage repaired (see above)" if code == 1 else "done") + "\n")


def verify_text(result, out=None) -> None:
    out = out or sys.stdout
    out.write(f"verify {result.path}  (RabbitMQ {result.broker_version})\n")
    out.write(f"  {result.nodes} node(s), {result.vhosts} vhost(s), {result.queues} queue dirs, "
              f"{result.messages} messages, {result.store_entries} shared-store entries\n")
    for f in result.violations:
        scope = " ".join(f"{k} {v!r}" for k, v in (("vhost", f.vhost), ("queue", f.queue)) if v is not None)
        where = _where(f)
        out.write(f"  VIOLATION {f.code} [{scope}] {f.message}" + (f"\n    at {where}" if where else "") + "\n")
    for f in result.notes:
        out.write(f"  note: {f.code}: {f.message}\n")
    out.write(f"\nexit {result.exit_code}: " + ("consistent" if result.consistent else
                                               f"{len(result.violations)} violations") + "\n")
