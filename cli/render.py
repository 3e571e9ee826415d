"""Output helpers: JSON lines, aligned text tables, Parquet/CSV files."""

from __future__ import annotations

import datetime as dt
import json
import sys

from cqforensics.base.errors import display, plural


def jsonable(v):
    """``v`` in the one JSON convention (``cqforensics.base.jsonout``): msg_id hex, other bytes as
    ``<key>_base64``, typed JSON nested, times ISO 8601."""
    from cqforensics.base import jsonout

    return jsonout.convert(v) if isinstance(v, dict) else jsonout.value(v)


def document(v) -> str:
    """``v`` as one indented JSON document in the convention (``fsck``/``audit``/``verify
    --json``): the text of ``json.dumps(jsonable(v), ensure_ascii=False, sort_keys=True,
    indent=1)``, made in one pass (``jsonout.document``)."""
    from cqforensics.base import jsonout

    return jsonout.document(v, indent=1)


def dump_value(v) -> str:
    """A ``dump`` field as text: strings as they are (Erlang terms come as Erlang text, see
    ``cqforensics.codecs.etf.format_term``), numbers, ``true``/``false``, bytes as an Erlang binary
    (``<<"text">>`` or ``<<1,2,3>>``), anything else (lists, header maps) as compact JSON, never
    as a Python repr."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        from cqforensics.codecs.etf import format_term

        return format_term(bytes(v))
    return json.dumps(jsonable(v), ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def write_jsonl(rows, out=None) -> None:
    out = out or sys.stdout
    for r in rows:
        out.write(json.dumps(jsonable(r), ensure_ascii=False, sort_keys=True) + "\n")


def jsonl_text(batch) -> tuple[int, int, str]:
    """A batch as JSON lines (what ``write_jsonl`` writes of its rows), with its row count and
    how many of them are expired (``drop_reason``): made where the batch is
    (``iter_batches(render=...)``: by the workers of ``read -j N``)."""
    from cqforensics.base import jsonout

    expired = batch.column("drop_reason").to_pylist().count("expired") if "drop_reason" in batch.schema.names else 0
    return (
        batch.num_rows,
        expired,
        jsonout.batch_lines(batch),
    )


#: columns holding paths: cut from the front when too wide, so the file name stays readable
PATH_COLUMNS = frozenset({"file", "store_file", "path", "source", "output"})


def fit(s: str, width: int, tail: bool = False) -> str:
    """``s`` cut to ``width`` characters with an ellipsis: its head, or with ``tail`` (paths) its
    end, where the file name is. Text is cut after a whole word (or a comma, a slash) when one
    ends in the last half of the width, never mid-word."""
    if len(s) <= width:
        return s
    if tail:
        return "…" + s[len(s) - width + 1 :]
    head = s[: width - 1]
    cut = max(head.rfind(" "), head.rfind(","), head.rfind("/"))
    if cut >= width // 2:
        head = head[: cut + (s[cut] != " ")].rstrip(" ,")
    return head + "…"


#: the columns a text table of a wide table shows (``read --format table`` without --columns)
TEXT_COLUMNS = {
    "messages": [
        "node",
        "vhost",
        "queue",
        "seq_id",
        "msg_id",
        "location",
        "size",
        "expiry",
        "exchange",
        "routing_keys",
        "survives_restart",
        "drop_reason",
    ],
    "index": [
        "node",
        "vhost",
        "queue",
        "priority",
        "file",
        "offset",
        "kind",
        "seq_id",
        "persistent",
        "location",
        "msg_id",
        "size",
        "status",
    ],
}


def cell_text(v) -> str:
    """A value as a text cell: bytes as hex, lists and structs as compact JSON (null fields left
    out), never a Python repr."""
    if v is None:
        return "-"
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).hex()
    if isinstance(v, dict):
        v = {k: x for k, x in v.items() if x is not None}
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(jsonable(v), ensure_ascii=False, separators=(",", ":"))
    if isinstance(v, dt.datetime):  # ISO 8601 in UTC, to the millisecond
        v = v.astimezone(dt.UTC) if v.tzinfo else v
        return v.isoformat(timespec="milliseconds" if v.microsecond else "seconds").replace("+00:00", "") + "Z"
    if v == "":  # an empty name (the default exchange), not a missing one
        return '""'
    return str(v)


def _cell(v, column: str, max_width: int) -> str:
    s = cell_text(v)
    return fit(s, max_width, tail=column in PATH_COLUMNS or s.startswith(("/", "./", "../")))


def text_table(rows: list[dict], columns: list[str], out=None, max_width: int = 60) -> None:
    TextTable(columns, out or sys.stdout, max_width).write(rows)


class TextTable:
    """An aligned text table written as its rows arrive (``write`` per batch, each flushed), so
    ``cqforensics read ... | head`` shows rows at once and nothing is held: the header is
    written with the first rows; column widths are those of the rows seen so far (they grow,
    never shrink, so a later batch with wider values is aligned from there on)."""

    def __init__(self, columns: list[str], out=None, max_width: int = 60, group: int | None = None):
        """``group``: rows are laid out ``group`` at a time, whatever the batches they come in
        (the rest waits for more, or ``close``), so the text is the same however the rows came
        batched (``read -j N`` cuts batches elsewhere than ``-j 1``)."""
        self.columns, self.out, self.max_width = list(columns), out or sys.stdout, max_width
        self.widths = [len(c) for c in self.columns]
        self.started = False
        self.group = group
        self.waiting: list[dict] = []

    def write(self, rows: list[dict]) -> None:
        if self.group is None:
            self._write(rows)
            return
        self.waiting += rows
        while len(self.waiting) >= self.group:
            self._write(self.waiting[: self.group])
            del self.waiting[: self.group]

    def _write(self, rows: list[dict]) -> None:
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
        """Write the rows still waiting, and the header if no row came (an empty table still
        names its columns)."""
        if self.waiting or not self.started:
            self._write(self.waiting)
            self.waiting = []


def _where(f) -> str:
    if not f.file:
        return ""
    return f.file + (f"@{f.offset:#x}" if f.offset is not None else "")


def fsck_text(report, out=None, show_all: bool = False) -> None:
    """The human report: nodes, a table of queues, findings grouped by severity and code."""
    out = out or sys.stdout
    for n in report.nodes:
        out.write(f"node {n.node}  ({n.path})\n")
        for line in version_lines(n):
            out.write(f"  {line}\n")
        for u in n.not_read:
            out.write(f"  NOT READ: {not_read_line(u)}\n")
        for vhost, mode in n.vhost_recovery.items():
            what = (
                "clean recovery: the broker trusts the shutdown state"
                if mode == "clean"
                else "dirty recovery: the broker rebuilds the indexes from the files"
            )
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
            after = q.predicted_after_restart
            if (q.predicted_min, q.predicted_max) != (after, after):  # the store may crash: bounds
                after = f"{after} ({q.predicted_min}-{q.predicted_max})"
            rows.append(
                {
                    "vhost": q.vhost,
                    "queue": q.queue,
                    "type": q.queue_type,
                    "messages": q.messages,
                    "after restart": after,
                    "dropped": q.dropped,
                    "why": why,
                }
            )
        if rows:
            # the type column when the node holds a queue other than classic (quorum)
            typed = ["type"] if any(r["type"] != "classic" for r in rows) else []
            text_table(
                rows, ["vhost", "queue", *typed, "messages", "after restart", "dropped", "why"], out, max_width=70
            )
            out.write("\n")
    s = report.summary()
    c = s["findings"]
    bounds = (
        f" (whatever the timing, at least {s['predicted_min']:,} and at most {s['predicted_max']:,}: see store-crash)"
        if (s["predicted_min"], s["predicted_max"]) != (s["predicted_after_restart"],) * 2
        else ""
    )
    out.write(
        f"{plural(s['messages'], 'message')} in {plural(s['queues'], 'queue')}: "
        f"{s['predicted_after_restart']:,} delivered after the next boot{bounds}, {s['dropped']:,} dropped"
        + (f"; crashes: {', '.join(s['crashes'])}" if s["crashes"] else "")
        + "\n"
    )
    if s["not_read"]:
        out.write(
            f"not read: {' and '.join(_kind(k).noun + 's' for k in s['not_read'])} (storage-not-read): "
            "their messages are in none of these counts\n"
        )
    ttl = ttl_line(s)
    if ttl:
        out.write(ttl + "\n")
    out.write(f"findings: {plural(c['error'], 'error')}, {plural(c['warning'], 'warning')}, {c['info']:,} info\n")
    groups: dict = {}
    for f in report.findings:
        groups.setdefault((f.severity, f.code), []).append(f)
    order = {"error": 0, "warning": 1, "info": 2}
    for (sev, code), fs in sorted(groups.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        out.write(f"\n{sev.upper()} {code} ({len(fs)})\n")
        for f in fs if show_all else fs[:5]:
            where = _where(f)
            scope = " ".join(f"{k} {v!r}" for k, v in (("vhost", f.vhost), ("queue", f.queue)) if v is not None)
            out.write(
                f"  [{scope or 'node ' + repr(f.node)}] {f.message}" + (f"\n    at {where}" if where else "") + "\n"
            )
        if not show_all and len(fs) > 5:
            out.write(f"  ... and {len(fs) - 5} more (--all-findings)\n")
    code = report.exit_code
    what = ["errors found and left (fsck repairs nothing; see cqforensics rebuild)" if code & 4 else "no errors"]
    if code & 2:
        what.append("check incomplete: queue storage not read (see NOT READ)")
    out.write(f"\nexit {code}: {'; '.join(what)}\n")


def _kind(name: str):
    from cqforensics.discovery.nodes import STORAGE_KINDS, StorageKind

    return STORAGE_KINDS.get(name) or StorageKind(name, name, f"{name} queue", False, name)


def version_lines(n) -> list[str]:
    """What a node's data was written by, and which version the next boot is predicted for: named
    (``--broker-version``), or inferred from the data, and then whether it is an assumption (the
    data allows more than one series: the newest is taken) and how to name the real one."""
    wb = n.written_by or {}
    out = []
    if wb:
        out.append(f"data written by: RabbitMQ {wb['label']} (inferred: {'; '.join(wb['why']) or 'no evidence'})")
    if not n.version_inferred:
        out.append(f"next boot predicted for: RabbitMQ {n.broker_version} (named by --broker-version)")
    elif n.broker_version_assumed:
        out.append(
            f"next boot predicted for: RabbitMQ {n.broker_version}, ASSUMED: the newest version that could "
            f"have written the data; if another will boot it, name it (e.g. --broker-version "
            f"{wb.get('low', '3.10')})"
        )
    else:
        out.append(
            f"next boot predicted for: RabbitMQ {n.broker_version} (the series that wrote the data; "
            "--broker-version names another)"
        )
    return out


def not_read_line(u: dict) -> str:
    """One kind of queue storage a node holds that is not read (``fsck`` NodeVerdict.not_read)."""
    names = ", ".join(f"{q['queue']!r} (vhost {q['vhost']!r})" for q in u["queues"][:8])
    more = f" and {len(u['queues']) - 8} more" if len(u["queues"]) > 8 else ""
    return (
        f"{plural(len(u['queues']), _kind(u['kind']).noun)}"
        + (f": {names}{more}" if names else "")
        + f" ({plural(u['data_dirs'], 'data dir')}, {u['bytes']:,} bytes under {u['path']})"
    )


def ttl_line(summary: dict) -> str | None:
    """When TTLs were judged, said when it decides something: messages past their TTL at the
    clock's time of the run (``--as-of`` judges them at another), or at the time given."""
    n, when = summary.get("expired", 0), summary.get("ttls_judged_at")
    when = when.split(".")[0] + "Z" if when and "." in when else when
    if summary.get("ttls_judged_by") == "as_of":
        return f"TTLs judged at {when} (--as-of): {plural(n, 'message')} past {'its' if n == 1 else 'their'} TTL"
    if not n:
        return None
    return (
        f"TTLs judged by the clock: {plural(n, 'message')} {'is' if n == 1 else 'are'} past "
        f"{'its' if n == 1 else 'their'} TTL at {when} (now) and counted as dropped (expired); "
        "--as-of TIME judges TTLs at another time (e.g. when the node stopped)"
    )


def _counts(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items()))


def rewrite_text(result, out=None) -> None:
    """compact/rebuild report: per queue what was written, and where the rest went."""
    out = out or sys.stdout
    rebuild = result.command == "rebuild"
    verb = "to be written" if result.dry_run else "written"
    out.write(
        f"{result.command} {result.source}\n  -> {result.output}"
        + ("  (dry run: nothing written)" if result.dry_run else "")
        + "\n"
    )
    source = getattr(result, "source_version", "")
    out.write(
        f"  written for RabbitMQ {result.broker_version}"
        + (f" (SRC read as {source})" if source and source != result.broker_version else "")
        + "\n\n"
    )
    rows = []
    for q in result.queues:
        row = {
            "vhost": q.vhost,
            "queue": q.queue if q.priority is None else f"{q.queue} [p{q.priority}]",
            "index": f"v{q.index_version}"
            + (f"->v{q.written_version}" if q.written_version not in (None, q.index_version) else "")
            if q.index_version
            else "-",
            "messages": q.messages,
            "written": q.written,
            "not written": _counts(
                {
                    **q.dropped,
                    **{f"quarantined {k}": v for k, v in q.quarantined.items()},
                    **{f"LOST {k}": v for k, v in q.lost.items()},
                }
            )
            + (f" (dir skipped: {q.skipped})" if q.skipped else ""),
        }
        if rebuild:
            row["broker would deliver"] = q.broker_would_deliver
        if q.messages or q.skipped:
            rows.append(row)
    cols = (
        ["vhost", "queue", "index", "messages"]
        + (["broker would deliver"] if rebuild else [])
        + ["written", "not written"]
    )
    if rows:
        text_table(rows, cols, out, max_width=80)
        out.write("\n")
    t = result.totals()
    out.write(
        f"messages: {t['messages']} held by the indexes, {t['written']} {verb}"
        + (f" ({t['rescued']} that the broker's own next boot would lose)" if rebuild else "")
        + "\n"
    )
    for label, key in (
        ("dropped by design", "dropped"),
        ("quarantined in lost+found", "quarantined"),
        ("LOST (no bytes left)", "lost"),
    ):
        if t[key]:
            out.write(f"  {label}: {_counts(t[key])}\n")
    restored = getattr(result, "restored", None)
    if restored:
        per: dict = {}
        for r in restored:
            per[(r["vhost"], r["queue"])] = per.get((r["vhost"], r["queue"]), 0) + 1
        out.write(
            "  orphans restored (--restore-orphans; listed in lost+found with reason 'restored'): "
            + ", ".join(f"{q!r} ({v}) {n}" for (v, q), n in sorted(per.items(), key=str))
            + "\n"
        )
    g = result.garbage
    if g:
        out.write(
            "shared-store entries no index holds (not written): "
            + ", ".join(f"{k} {n} ({plural(b, 'byte')})" for k, (n, b) in sorted(g.items()))
            + "\n"
        )
    out.write(
        f"message store bytes: {result.bytes_before} before, {result.bytes_after} after "
        f"({result.bytes_before - result.bytes_after} reclaimed); {result.store_entries_written} shared-store "
        f"entries in {plural(result.store_files_written, 'file')}\n"
    )
    files = getattr(result, "store_files", None)
    if result.threshold is not None and files:
        for action in ("rewritten", "kept"):
            picked = [f for f in files if f["action"] == action]
            out.write(
                f"store files {action} (garbage {'above' if action == 'rewritten' else 'at or below'} "
                f"{result.threshold:g}%" + (" or not keepable" if action == "rewritten" else "") + f"): {len(picked)}\n"
            )
            for f in picked:
                out.write(
                    f"  {f['file']}: {plural(f['size'], 'byte')}, {100 * f['garbage_ratio']:.1f}% garbage"
                    + (f" ({f['why']})" if f.get("why") else "")
                    + "\n"
                )
    if result.lost_found:
        where = result.lost_found_path or "lost+found/"
        out.write(f"lost+found: {plural(result.lost_found, 'item')} ({where})\n")
    for n in result.notes:
        out.write(f"note: {display(n)}\n")  # notes may quote non-UTF-8 names
    for n in result.cannot_boot:
        out.write(f"ERROR: the output cannot boot: {display(n)}\n")
    if not result.dry_run:
        out.write(f"verify: {'consistent' if result.verified else 'not run'}\n")
    code = result.exit_code
    said = ["damage repaired (see above)"] if code & 1 else []
    if code & 4:
        said.append(
            f"{'would be ' if result.dry_run else ''}written, but RabbitMQ {result.broker_version} cannot "
            "boot it as it is (see ERROR above)"
        )
    out.write(f"\nexit {code}: " + ("; ".join(said) or "done") + "\n")


def verify_text(result, out=None) -> None:
    out = out or sys.stdout
    out.write(f"verify {result.path}  (RabbitMQ {result.broker_version})\n")
    out.write(
        f"  {plural(result.nodes, 'node')}, {plural(result.vhosts, 'vhost')}, {plural(result.queues, 'queue dir')}, "
        f"{plural(result.messages, 'message')}, {plural(result.store_entries, 'shared-store entry')}\n"
    )
    for f in result.violations:
        scope = " ".join(f"{k} {v!r}" for k, v in (("vhost", f.vhost), ("queue", f.queue)) if v is not None)
        where = _where(f)
        out.write(f"  VIOLATION {f.code} [{scope}] {f.message}" + (f"\n    at {where}" if where else "") + "\n")
    for f in result.notes:
        out.write(f"  note: {f.code}: {f.message}\n")
    out.write(
        f"\nexit {result.exit_code}: "
        + ("consistent" if result.consistent else f"{plural(len(result.violations), 'violation')}")
        + "\n"
    )
