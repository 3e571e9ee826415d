"""``cqforensics`` command line. Each subcommand: arguments -> one library call -> render ->
exit code (e2fsck style: 0 clean, 1 fixed, 4 errors left, 8 operational error, 16 usage,
32 interrupted). No traceback reaches the user: operational failures print one line naming
the file, and so does any unexpected exception (a bug: exit 8); ``--traceback`` shows its
traceback for a bug report."""

from __future__ import annotations

import argparse
import logging
import sys

from cli import exitcodes

log = logging.getLogger("cqforensics.cli")


class Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors: one line, exit 16 (not argparse's usage block and 2)
        self.exit(
            exitcodes.USAGE,
            f"{self.prog}: error: {' '.join(message.split())}{did_you_mean(message)} (see {self.prog} --help)\n",
        )


def did_you_mean(message: str) -> str:
    """``; did you mean 'fsck'?`` for argparse's "invalid choice" of a command or an option value
    (the close choices), else ''."""
    import difflib
    import re

    m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message, re.S)
    if not m:
        return ""
    choices = re.findall(r"'([^']*)'", m.group(2))
    close = difflib.get_close_matches(m.group(1), choices, n=3, cutoff=0.5)
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
        return v

    parse.__name__ = f"integer >= {low}"
    return parse


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"a percentage from 0 to 100 expected, got {text!r}")
    return value


def _as_of(text: str) -> int:
    """--as-of through the one parser (``cqforensics.model.options.parse_as_of``: ISO 8601 or
    epoch ms, within 1970 .. 9999), so a bad time is a usage error at parse time."""
    from cqforensics.base.errors import UsageError
    from cqforensics.model.options import parse_as_of

    try:
        return parse_as_of(text, "--as-of")
    except UsageError as e:  # argparse names the option itself
        raise argparse.ArgumentTypeError(str(e).removeprefix("--as-of: ").removeprefix("--as-of ")) from None


def add_force(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--force",
        action="store_true",
        help=f"replace {what} if it is a previous output of cqforensics, unchanged since written "
        "(never anything else: an input, RabbitMQ data, a file cqforensics did not write)",
    )


def add_quiet(p: argparse.ArgumentParser, text: str = "no progress on stderr (shown only on a terminal)") -> None:
    p.add_argument("-q", "--quiet", action="store_true", help=text)


def add_read_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--broker-version",
        metavar="V",
        help="the RabbitMQ version whose next boot to predict (3.10 .. 4.3; default: inferred)",
    )
    p.add_argument(
        "--as-of",
        metavar="TIME",
        type=_as_of,
        help="judge message TTLs at this time (ISO 8601 or epoch ms, 1970 .. 9999; default: now)",
    )


def add_jobs(p: argparse.ArgumentParser, what: str = "") -> None:
    p.add_argument(
        "-j",
        "--jobs",
        type=_int_at_least(1),
        metavar="N",
        help=f"processes to use{what} (default: every usable CPU, at most 8); the output is the "
        "same, in the same order, whatever N",
    )


def jobs(args) -> int:
    """-j, or the default: every usable CPU, at most 8 (``cqforensics.base.parallel.default_jobs``)."""
    from cqforensics.base import parallel

    return args.jobs if getattr(args, "jobs", None) else parallel.default_jobs()


def add_filters(p: argparse.ArgumentParser, queues_help: str = "only this queue (repeatable)") -> None:
    p.add_argument(
        "--vhost",
        action="append",
        metavar="NAME",
        dest="vhosts",
        help="only this vhost (repeatable; default: every vhost)",
    )
    p.add_argument("--queue", action="append", metavar="NAME", dest="queues", help=queues_help)


def filters(args) -> dict:
    """--vhost/--queue as the ``vhosts``/``queues`` keywords of the read path (absent: all)."""
    out = {}
    if getattr(args, "vhosts", None):
        out["vhosts"] = list(args.vhosts)
    if getattr(args, "queues", None):
        out["queues"] = list(args.queues)
    return out


def read_options(args) -> dict:
    """--broker-version and --as-of as keywords of ``make_options`` (as-of parsed by the one
    parser, ``cqforensics.model.options.parse_as_of``, into epoch ms)."""
    from cqforensics.model.options import parse_as_of

    out = {}
    if getattr(args, "broker_version", None):
        out["broker_version"] = args.broker_version
    as_of = parse_as_of(getattr(args, "as_of", None), "--as-of")
    if as_of is not None:
        out["as_of"] = as_of
    return out


def cmd_read(args) -> int:
    """Print or save one table (see docs/tables.md), streamed: rows are printed or written as
    they are read, so the first rows show at once and memory stays flat. --out FILE: an output
    (``cqforensics.output.guard``: never inside an input or RabbitMQ data; an existing file only with
    --force and only if cqforensics wrote it); written under a temporary name and renamed when
    complete (removed on an error or Ctrl-C), with its manifest beside it. Parquet is written in
    row groups of up to 64k rows / about 64 MB."""
    import cqforensics

    columns = args.columns.split(",") if args.columns else None
    opts = {**read_options(args), **filters(args), "jobs": jobs(args)}
    if args.out:
        from cqforensics.output.guard import check_output

        target = check_output(args.out, args.paths, force=args.force)
    elif args.format == "parquet":
        from cqforensics.base.errors import UsageError

        raise UsageError("--format parquet needs --out FILE")
    else:
        _say_expired(_read_rows(args, columns, opts, sys.stdout)[1], opts)
        return exitcodes.OK
    from cqforensics.base.errors import plural
    from cqforensics.commands.export import ParquetSink
    from cqforensics.output.guard import staged_file

    progress = _shown(args)
    opts["progress"] = progress
    try:
        with staged_file(
            target, "wb" if args.format == "parquet" else "w", replace=args.force, command="read", inputs=args.paths
        ) as out:
            if args.format == "parquet":
                from cqforensics.read.driver import check_columns

                with ParquetSink(out, check_columns(args.table, columns)) as sink:
                    for batch in _limited(
                        cqforensics.iter_batches(args.paths, args.table, columns=columns, **opts), args.limit
                    ):
                        sink.write(batch)
                rows, expired = sink.num_rows, 0
            else:
                rows, expired = _read_rows(args, columns, opts, out)
    finally:
        if progress:
            progress.close()
    print(f"{plural(rows, 'row')} -> {target}", file=sys.stderr)
    _say_expired(expired, opts)
    return exitcodes.OK


def _limited(batches, limit: int | None):
    """``batches`` cut to ``limit`` rows in all (None: no limit); stops reading once reached."""
    n = 0
    for b in batches:
        if limit is not None:
            if n >= limit:
                break
            b = b.slice(0, limit - n)
        n += b.num_rows
        yield b
        if limit is not None and n >= limit:
            break


#: rows a text table lays out at a time (its column widths grow group by group)
TEXT_GROUP = 1024


def _read_rows(args, columns, opts, out) -> tuple[int, int]:
    """Rows as JSON lines or an aligned text table, written (and flushed) batch by batch; the
    number of rows, and of those the clock judged expired. The text table of a wide table shows
    its main columns (``render.TEXT_COLUMNS``; a terminal is told so)."""
    import cqforensics
    from cli import render

    n = expired = 0
    if args.format == "jsonl":  # the lines are made by every process (one row, one line)
        left = args.limit
        for rows, dropped, text in cqforensics.iter_batches(
            args.paths, args.table, columns=columns, render=render.jsonl_text, **opts
        ):
            if left is not None and rows > left:
                # the first ``left`` lines: "\n" ends a row's line (a JSON string may hold U+2028,
                # where str.splitlines would cut too)
                cut = -1
                for _ in range(left):
                    cut = text.index("\n", cut + 1)
                out.write(text[: cut + 1])
                # the expired among them: the key, quoted, can only be a key (quotes in a value are escaped)
                return n + left, expired + (text[: cut + 1].count('"drop_reason": "expired"') if dropped else 0)
            out.write(text)
            out.flush()
            n, expired = n + rows, expired + dropped
            if left is not None:
                left -= rows
                if not left:
                    break
        return n, expired
    table = None
    if args.format == "table":
        cols = (
            columns
            or render.TEXT_COLUMNS.get(args.table)
            or [c for c in cqforensics.schema(args.table).names if c not in ("body",)]
        )
        if not columns and args.table in render.TEXT_COLUMNS and sys.stderr.isatty():
            print(
                f"cqforensics: the {args.table} table's main columns; --columns A,B or --format jsonl for others",
                file=sys.stderr,
            )
        table = render.TextTable(cols, out, group=TEXT_GROUP)
    for batch in _limited(cqforensics.iter_batches(args.paths, args.table, columns=columns, **opts), args.limit):
        rows = batch.to_pylist()
        n += len(rows)
        if "drop_reason" in batch.schema.names:
            expired += batch.column("drop_reason").to_pylist().count("expired")
        if table is not None:
            table.write(rows)
        else:
            render.write_jsonl(rows, out)
            out.flush()
    if table is not None:
        table.close()
    return n, expired


def _say_expired(expired: int, opts: dict) -> None:
    """On stderr: how many rows the clock's time made expired (when --as-of named no time)."""
    if expired and not opts.get("as_of"):
        from cli import render
        from cqforensics.output.provenance import iso, now_ms

        print(f"cqforensics: {render.ttl_line({'expired': expired, 'ttls_judged_at': iso(now_ms())})}", file=sys.stderr)


class ProgressDisplay:
    """Where a long command shows how far it is, on stderr: ``(text, done, total)`` per step
    (``cqforensics.read.driver.Progress`` makes them). On a terminal, one tqdm bar: bytes done and in
    all, rate and time left, the step's text (``node 8 of 30: ...``); elsewhere (``--progress``
    with stderr piped), one line each time the text changes. ``close`` clears the bar;
    ``suspended`` clears it while the command writes to a terminal it shares."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.bar = None
        self.last = None

    def __call__(self, text: str, done: int | None = None, total: int | None = None) -> None:
        if not self.tty:
            if text != self.last:
                self.stream.write(f"{text}\n")
                self.stream.flush()
            self.last = text
            return
        import os

        from tqdm import tqdm

        if self.bar is None or (total is not None and self.bar.total != total):
            if self.bar is not None:
                self.bar.close()
            self.bar = tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                file=self.stream,
                leave=False,
                dynamic_ncols=True,
                # tqdm's own variable wins (TQDM_MININTERVAL=0: every update drawn)
                mininterval=float(os.environ.get("TQDM_MININTERVAL", "0.2")),
            )
        if text != self.last:
            self.bar.set_description_str(text, refresh=False)
            self.last = text
        if done is not None and done != self.bar.n:
            self.bar.update(done - self.bar.n)  # tqdm redraws at most every mininterval

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def suspended(self):
        """A context in which the bar is cleared (and redrawn after): for output to the terminal."""
        import contextlib

        if self.bar is None:
            return contextlib.nullcontext()
        from tqdm import tqdm

        return tqdm.external_write_mode(file=self.stream)


def _progress(enabled: bool) -> ProgressDisplay | None:
    """The progress display of a long command when ``enabled`` (see ``ProgressDisplay``)."""
    return ProgressDisplay() if enabled else None


def _shown(args, *exclusive: str) -> ProgressDisplay | None:
    """Progress for a command that shows it on a terminal: stderr is one, and neither -q nor an
    option in ``exclusive`` (a machine output on stdout: --json) is given; ``--progress``
    (where the command has it) shows it whatever stderr is."""
    on = getattr(args, "progress", False) or (
        sys.stderr.isatty()
        and not getattr(args, "quiet", False)
        and not any(getattr(args, o, False) for o in exclusive)
    )
    return _progress(on)


def cmd_fsck(args) -> int:
    """Check node dirs read-only and predict what the next boot delivers, drops or crashes on.

    Exit: 0 no errors, 4 errors found (nothing is repaired), 8 operational error, 16 usage."""
    from cli import render
    from cqforensics.commands import fsck as fsck_mod

    if args.json and args.jsonl:
        from cqforensics.base.errors import UsageError

        raise UsageError("--json and --jsonl exclude each other")
    progress = _shown(args, "json", "jsonl")
    report = None
    try:
        for item in fsck_mod.fsck(
            args.paths,
            deep=args.deep,
            assume_dirty=args.assume_dirty,
            progress=progress,
            jobs=jobs(args),
            **read_options(args),
            **filters(args),
        ):
            if isinstance(item, fsck_mod.Report):
                report = item
            elif args.jsonl:
                render.write_jsonl([item.to_dict()])
    finally:
        if progress:
            progress.close()
    for n in report.nodes:
        for w in n.warnings:
            print(f"cqforensics: warning: {n.path}: {w}", file=sys.stderr)
    if args.json:
        print(render.document(report.to_dict()))
    elif not args.jsonl:
        render.fsck_text(report, sys.stdout, show_all=args.all_findings)
    return report.exit_code


def cmd_dump(args) -> int:
    """List every entry of one file (.rdq, .qi, .qs, .idx, journal.jif, .ets, .dets, Mnesia logs):
    offset, size, id, status, and holes; --deep decodes the messages."""
    from cli import render
    from cqforensics.commands.dump import dump

    rows = dump(args.file, deep=args.deep, segment_entry_count=args.segment_entry_count)
    if args.jsonl:
        render.write_jsonl(rows)
        return exitcodes.OK
    for r in rows:
        head = f"{r['offset']:>10}" if r.get("offset") is not None else " " * 10
        rest = " ".join(
            f"{k}={render.dump_value(v)}" for k, v in r.items() if k not in ("offset", "kind") and v is not None
        )
        print(f"{head}  {r['kind']:<8} {rest}")
    return exitcodes.OK


def cmd_export(args) -> int:
    """Recover the messages the indexes hold (properties, typed headers, bodies) into
    DIR/messages.jsonl or DIR/messages.parquet; --all adds acked and dropped messages whose
    bodies are still readable."""
    from cli import render
    from cqforensics.commands.export import export

    progress = _shown(args)
    try:
        result = export(
            args.paths,
            args.format,
            args.out,
            everything=args.all,
            force=args.force,
            progress=progress,
            jobs=jobs(args),
            **read_options(args),
            **filters(args),
        )
    finally:
        if progress:
            progress.close()
    counts = ", ".join(f"{n:,} {k}" for k, n in sorted(result["rows"].items())) or "no rows"
    print(f"{result['file']}: {counts}", file=sys.stderr)
    ttl = render.ttl_line(
        {
            "expired": result["expired"],
            "ttls_judged_at": result["as_of"],
            "ttls_judged_by": "as_of" if result["as_of_given"] else "clock",
        }
    )
    if ttl:
        print(ttl, file=sys.stderr)
    for node, kinds in result["not_read"].items():
        for u in kinds:
            print(f"NOT READ on {node}: {render.not_read_line(u)}: not in the export", file=sys.stderr)
    return exitcodes.OK


def cmd_find(args) -> int:
    """Find messages by shared-store msg_id (hex; a prefix matches), AMQP message id or body
    text, among everything still readable (what export --all recovers: messages held by a queue
    index, ghosts of dropped index slots, orphaned and duplicate store entries). One line per
    hit: where its bytes are (file, offset), its queue and index entry, and its fate.

    Exit: 0 (also when nothing is found: "0 hit(s)" on stderr), 8 operational error, 16 usage."""
    import contextlib

    from cli import render
    from cqforensics.base.errors import plural
    from cqforensics.commands.export import find

    body = args.body.encode() if args.body is not None else None
    if args.body_hex is not None:
        try:
            body = bytes.fromhex(args.body_hex)
        except ValueError:
            from cqforensics.base.errors import UsageError

            raise UsageError(f"--body-hex: not hex: {args.body_hex!r}") from None
    progress = _shown(args)
    hits = find(
        args.paths,
        msg_ids=args.msg_id or (),
        body=body or None,
        message_ids=args.message_id or (),
        progress=progress,
        jobs=jobs(args),
        **read_options(args),
        **filters(args),
    )
    table = (
        None
        if args.jsonl
        else render.TextTable(
            ["vhost", "queue", "source", "fate", "msg_id", "file", "offset", "index"], sys.stdout, max_width=80
        )
    )
    n = 0
    try:
        for h in hits:
            n += 1
            with progress.suspended() if progress else contextlib.nullcontext():
                if table is None:
                    render.write_jsonl([{**h, "msg_id": h["msg_id"].hex() if h["msg_id"] is not None else None}])
                    sys.stdout.flush()
                    continue
                bytes_at = (h["store_file"], h["store_offset"]) if h["store_file"] else (h["file"], h["offset"])
                index = f"{h['file']}@{h['offset']}" if h["store_file"] and h["file"] != h["store_file"] else None
                queue = h["queue"] if h["priority"] is None else f"{h['queue']} [p{h['priority']}]"
                table.write([{**h, "queue": queue, "file": bytes_at[0], "offset": bytes_at[1], "index": index}])
    finally:
        if progress:
            progress.close()
    if table is not None and n:
        table.close()
    print(plural(n, "hit"), file=sys.stderr)
    return exitcodes.OK


def cmd_audit(args) -> int:
    """Orphaned messages and their bytes, the queues the orphans would have reached (the metadata's
    bindings), duplicates (by message id and by content) across queues,
    reference counts against a clean shutdown's recorded index (problems as fsck counts them),
    live vs garbage bytes per file and what a compaction would reclaim; every row names its
    node. --vhost/--queue narrow it."""

    from cli import render
    from cqforensics.base.errors import plural
    from cqforensics.commands.audit import audit

    progress = _shown(args, "json")
    try:
        a = audit(args.paths, progress=progress, jobs=jobs(args), **read_options(args), **filters(args))
    finally:
        if progress:
            progress.close()
    if args.json:
        print(render.document(a))
        return exitcodes.OK
    out = sys.stdout
    fleet = len(a["nodes"]) > 1
    where = ["node"] if fleet else []  # a fleet's rows name their node

    def table(rows, columns, **kw):
        render.text_table(rows, where + columns, out, **kw)

    narrowed = [f"{k[:-1]} {', '.join(map(repr, v))}" for k, v in a["filters"].items() if v]
    out.write(
        f"audit of {plural(len(a['nodes']), 'node')}"
        + (f", narrowed to {'; '.join(narrowed)}" if narrowed else "")
        + "\n"
    )
    if a["filters"]["queues"]:
        out.write(
            "  (with --queue: shared-store files are left out, and the store entries but for the orphans "
            "that would have reached those queues)\n"
        )
    for n in a["nodes"]:
        for u in n["not_read"]:
            out.write(f"  NOT READ on {n['node']}: {render.not_read_line(u)}\n")
    c = a["compaction"]
    what = "their .qs files" if a["filters"]["queues"] else "store files"
    out.write(
        f"\n{what}: {plural(c['store_bytes'], 'byte')}, {c['reclaimable_bytes']:,} reclaimable by compaction "
        f"({100 * c['reclaimable_ratio']:.0f}%)\n\n"
    )
    if a["orphans"]:
        out.write("orphaned / duplicate / corrupt shared-store entries:\n")
        table(a["orphans"], ["vhost", "file", "status", "entries", "bytes"], max_width=90)
        out.write("\n")
    if a["orphans_by_queue"]:
        out.write("orphaned entries by the queue their exchange and routing keys reach (- none, ? unknown):\n")
        rows = [{**g, "queue": g["queue"] or ("?" if g["queue"] is None else "-")} for g in a["orphans_by_queue"]]
        table(rows, ["vhost", "queue", "entries", "bytes"], max_width=90)
        out.write("\n")
    for key, label in (("duplicates_by_message_id", "message_id"), ("duplicates_by_content", "body_sha256")):
        groups = a[key]
        out.write(f"{key.replace('_', ' ')}: {plural(len(groups), 'group')}\n")
        rows = [{**g, "queues": ",".join(g["queues"])} for g in groups[:20]]
        if rows:
            table(rows, ["vhost", label, "copies", "kind", "queues"], max_width=60)
        out.write("\n")
    problems = a["refcount_problems"]
    out.write(
        f"reference count problems: {len(problems)} (as fsck counts them: a persistent message's body in no "
        "store file, msg-missing; a recorded count the indexes contradict, refcount-mismatch)\n"
    )
    if problems:
        table(problems[:20], ["vhost", "msg_id", "copies", "computed_refs", "recorded_refs", "status"])
        if len(problems) > 20:
            out.write(f"... and {len(problems) - 20:,} more (--json lists them all)\n")
    for t in a["transient_bodies_missing"]:
        out.write(
            f"  not a problem: {'node ' + t['node'] + ' ' if fleet else ''}vhost {t['vhost']!r}: "
            f"{plural(t['entries'], 'transient message')} whose body is in no transient-store file (the next "
            "boot drops transient messages whatever, and deletes that store)\n"
        )
    out.write("\nfiles (live vs garbage):\n")
    table(a["files"], ["vhost", "queue", "file", "kind", "size", "live_bytes", "garbage_bytes"], max_width=90)
    return exitcodes.OK


def _rewrite(args, command: str) -> int:
    from cli import render
    from cqforensics.write import salvage

    progress = _shown(args, "json")
    kw = {"broker_version": args.broker_version} if args.broker_version else {}
    if args.source_version:
        kw["source_version"] = args.source_version
    if getattr(args, "threshold", None) is not None:
        kw["threshold"] = args.threshold
    if getattr(args, "template", None):
        kw["template"] = args.template
    if getattr(args, "restore_orphans", None):
        kw["restore_orphans"] = args.restore_orphans
    result = salvage.rewrite(
        command,
        args.src,
        args.dst,
        dry_run=args.dry_run,
        progress=progress,
        file_size_limit=args.file_size_limit,
        force=args.force,
        **kw,
    )
    return _report(result, args.json, render.rewrite_text, progress)


def _report(result, as_json: bool, as_text, progress) -> int:
    """Print a writer's or verify's result (one JSON document or text); its exit code."""

    from cli import render

    if progress:
        progress.close()
    if as_json:
        print(render.document(result.to_dict()))
    else:
        as_text(result, sys.stdout)
    return result.exit_code


def cmd_compact(args) -> int:
    """Write a compacted copy of SRC (a node dir or mnesia base) to DST: shared stores holding
    only live entries, contiguous and rolled at the file size limit; .qs files holding only live
    entries. Everything else is copied unchanged and no clean-shutdown files are written, so the
    broker rebuilds its indexes at the next boot. SRC is never modified; DST must not exist (or
    be empty); the output is verified before it is renamed into place.

    Exit: 0 done, 4 SRC is damaged (use rebuild; nothing written) or the output is written but the
    --broker-version cannot boot it as it is (the report says why: use --template), 8 operational
    error, 16 usage (an output path the rule of every output refuses: docs/commands.md, docs/evidence.md)."""
    return _rewrite(args, "compact")


def cmd_rebuild(args) -> int:
    """Salvage SRC into a consistent store at DST: every message whose bytes are intact, including
    those the broker's own recovery would drop; readable but undeliverable data (transient,
    failed CRC, undecodable, unreferenced) goes to DST/lost+found/ with the reason; the report
    says what was salvaged, quarantined and lost, queue by queue.

    Exit: 0 nothing needed repair, 1 damage repaired (see the report), +4 the output is written
    but the --broker-version cannot boot it as it is (use --template), 8 operational, 16 usage."""
    return _rewrite(args, "rebuild")


def cmd_definitions(args) -> int:
    """Print, as JSON for `rabbitmqctl import_definitions`, SRC's vhosts, durable exchanges,
    classic queues (with the x-queue-version their written dirs need on 3.x) and bindings: import
    them into a fresh, stopped-after node of the target version, then pass that node dir to
    compact/rebuild --template (docs/commands.md: Moving to another release series).

    Exit: 0 done, 8 operational error, 16 usage."""
    import json

    from cqforensics.model.versions import model
    from cqforensics.write import retarget

    print(json.dumps(retarget.definitions(args.src, model(args.broker_version)), indent=1, ensure_ascii=False))
    return exitcodes.OK


def cmd_verify(args) -> int:
    """Check strict invariants: every live index entry resolves to a valid body, counts and
    references agree, no orphans or duplicates, headers and CRCs valid.

    Exit: 0 consistent, 4 violations found, 8 operational error, 16 usage."""
    from cli import render
    from cqforensics.write.verify import verify

    progress = _progress(sys.stderr.isatty() and not args.json)
    result = verify(
        args.paths,
        broker_version=args.broker_version,
        deep=args.deep,
        progress=progress,
        allow_garbage=args.allow_garbage,
        jobs=jobs(args),
    )
    return _report(result, args.json, render.verify_text, progress)


def cmd_report(args) -> int:
    """Write one self-contained HTML page (no network, no script) to look at: per node and vhost,
    a map of the shared-store files (live / orphan / garbage / hole byte ranges), the queues with
    what the next boot delivers and drops and why, the findings grouped by code with file and
    offset, and a fleet summary for a folder of many nodes. --html FILE: an output
    (``cqforensics.output.guard``: never inside an input or RabbitMQ data; an existing file only with
    --force and only if cqforensics wrote it).

    Exit: 0 written, 8 operational error, 16 usage."""
    from cqforensics.commands.report import render
    from cqforensics.output.guard import check_output, staged_file

    target = check_output(args.html, args.paths, force=args.force)
    progress = _shown(args)
    try:
        page = render(args.paths, progress=progress, jobs=jobs(args), **read_options(args), **filters(args))
    finally:
        if progress:
            progress.close()
    with staged_file(target, "w", replace=args.force, command="report", inputs=args.paths) as out:
        out.write(page)
    print(f"report -> {target}", file=sys.stderr)
    return exitcodes.OK


def cmd_republish(args) -> int:
    """Send recovered messages (from a node dir, an export, or a rebuild's lost+found) to a
    running broker with their exchange, routing keys, properties and typed headers (AMQP 1.0
    messages over AMQP 1.0), one confirmed publish at a time, recorded in a journal so that a
    rerun after an interruption neither loses nor duplicates a message. By default what the next
    boot would deliver; --only-dropped: what it would drop but is still readable."""
    from cqforensics.base.errors import plural, queue_ref
    from cqforensics.commands.republish import read_ids, republish
    from cqforensics.model.options import parse_as_of

    since = parse_as_of(args.since, "--since")
    until = parse_as_of(args.until, "--until")
    report = republish(
        args.paths,
        args.url,
        journal=args.journal,
        vhosts=args.vhosts,
        queues=args.queues,
        since=None if since is None else since // 1000,
        until=None if until is None else until // 1000,
        ids=read_ids(args.ids) if args.ids else None,
        queue_map=args.map,
        rate=args.rate,
        dry_run=args.dry_run,
        only_dropped=args.only_dropped,
        in_doubt=args.in_doubt,
        topology=args.topology,
        progress=(lambda line: print(line, file=sys.stderr)) if args.verbose or args.dry_run else None,
        **read_options(args),
    )
    if args.json:
        import json

        print(json.dumps(report.as_dict(), ensure_ascii=False, sort_keys=True))
    else:
        verb = "would send" if report.dry_run else "sent"
        n = report.planned - report.already if report.dry_run else report.sent
        print(
            f"{verb} {plural(n, 'publish')} ({plural(report.copies, 'queue copy')} planned in all); "
            f"{report.already:,} confirmed by an earlier run; {len(report.failed):,} failed; journal {report.journal}"
        )
        for q, k in sorted(report.by_queue.items()):
            print(f"  {q}: {k}")
        for f in report.failed:
            print(
                f"  FAILED {', '.join(queue_ref(f['vhost'], q) for q in f['queues'])} msg_id={f['msg_id']}: {f['why']}"
            )
        for k, v in sorted(report.skipped.items()):
            print(f"  not sent: {v} ({k})")
        for k, v in sorted(report.in_doubt.items()):
            print(f"  in doubt from the last run: {v} {k}")
    return exitcodes.ERRORS_LEFT if report.failed or report.skipped else exitcodes.OK


def build_parser() -> argparse.ArgumentParser:
    from cqforensics import __version__
    from cqforensics import compiled as core
    from cqforensics.base.schema import TABLES

    p = Parser(prog="cqforensics", description="Forensics for RabbitMQ classic-queue storage (3.10 - 4.3).")
    p.add_argument(
        "--version",
        action="version",
        version=f"cqforensics {__version__} (compiled core: {core.status()})",
        help="print the version and exit",
    )
    p.add_argument(
        "--traceback", action="store_true", help="on an unexpected error (a bug), print its traceback for a bug report"
    )
    p.add_argument(
        "-v", "--verbose", action="count", default=0, help="log what is done to stderr (-v: steps, -vv: details)"
    )
    p.add_argument(
        "--log-json",
        action="store_true",
        help="log to stderr as JSON lines (time, level, logger, message), at the -v level (warnings only without -v)",
    )
    sub = p.add_subparsers(
        dest="command",
        required=True,
        parser_class=Parser,
        metavar="COMMAND",
        help="what to do (cqforensics COMMAND --help for its arguments)",
    )

    f = sub.add_parser("fsck", help="check node dirs read-only; predict the next boot", description=cmd_fsck.__doc__)
    f.add_argument("paths", nargs="+", help="node dir, mnesia base, or a folder of node backups")
    out = f.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON document")
    out.add_argument("--jsonl", action="store_true", help="stream findings as JSON lines")
    f.add_argument("--deep", action="store_true", help="also decode every message the indexes hold")
    f.add_argument(
        "--assume-dirty",
        action="store_true",
        help="predict as if clean.dot/recovery.dets were removed (forcing the broker to verify)",
    )
    f.add_argument("--all-findings", action="store_true", help="list every finding (default: 5 per code)")
    f.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    f.add_argument("--progress", action="store_true", help="progress on stderr even with --json/--jsonl")
    add_jobs(f, " (several node dirs: a node a process; one node: its vhosts, and a big vhost's listing)")
    add_read_options(f)
    add_filters(f, "only this queue's verdicts and findings, and the store-wide findings (repeatable)")
    f.set_defaults(func=cmd_fsck)

    d = sub.add_parser("dump", help="list every entry of one file", description=cmd_dump.__doc__)
    d.add_argument("file", help="the file to list (.rdq, .qi, .qs, .idx, journal.jif, .ets, .dets, Mnesia logs)")
    d.add_argument("--deep", action="store_true", help="decode the stored messages")
    d.add_argument("--jsonl", action="store_true", help="one JSON object per entry")
    d.add_argument(
        "--segment-entry-count",
        type=_int_at_least(1),
        default=16384,
        metavar="N",
        help="CQv1 entries per segment (the vhost's .config; default 16384)",
    )
    d.set_defaults(func=cmd_dump)

    e = sub.add_parser("export", help="recover messages into JSON lines or Parquet", description=cmd_export.__doc__)
    e.add_argument("paths", nargs="+", help="node dir, mnesia base, or a folder of node backups")
    e.add_argument(
        "--format",
        required=True,
        choices=("jsonl", "parquet"),
        help="DIR/messages.jsonl (bodies base64) or DIR/messages.parquet",
    )
    e.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output dir (must not exist or be empty; --force replaces a previous output of cqforensics; "
        "never inside an input or RabbitMQ data)",
    )
    e.add_argument("--all", action="store_true", help="also acked/dropped messages still readable on disk")
    add_force(e, "DIR (replaced whole, atomically, once the export is complete)")
    add_quiet(e)
    add_read_options(e)
    add_filters(e, "only this queue's messages (repeatable; leaves out the store entries no queue holds)")
    add_jobs(e)
    e.set_defaults(func=cmd_export)

    fd = sub.add_parser(
        "find",
        help="find messages by msg_id, message id or body text; print where they are",
        description=cmd_find.__doc__,
    )
    fd.add_argument("paths", nargs="+", help="node dir, mnesia base, or a folder of node backups")
    fd.add_argument(
        "--msg-id", action="append", metavar="HEX", help="shared-store message id, hex (a prefix matches; repeatable)"
    )
    fd.add_argument(
        "--message-id", action="append", metavar="ID", help="the AMQP message_id property, exactly (repeatable)"
    )
    body = fd.add_mutually_exclusive_group()
    body.add_argument("--body", metavar="TEXT", help="bodies containing this text (UTF-8)")
    body.add_argument("--body-hex", metavar="HEX", help="bodies containing these bytes, given in hex")
    fd.add_argument("--jsonl", action="store_true", help="one JSON object per hit")
    add_quiet(fd)
    add_read_options(fd)
    add_filters(fd)
    add_jobs(fd)
    fd.set_defaults(func=cmd_find)

    a = sub.add_parser(
        "audit", help="orphans, duplicates, reference counts, reclaimable space", description=cmd_audit.__doc__
    )
    a.add_argument("paths", nargs="+", help="node dir, mnesia base, or a folder of node backups")
    a.add_argument("--json", action="store_true", help="print one JSON document")
    add_quiet(a)
    add_read_options(a)
    add_jobs(a)
    add_filters(a, "only this queue's messages, reference counts, .qs files and the orphans routed to it (repeatable)")
    a.set_defaults(func=cmd_audit)

    for name, func, what in (
        ("compact", cmd_compact, "write a compacted copy of a node dir"),
        ("rebuild", cmd_rebuild, "salvage a damaged node dir into a consistent copy"),
    ):
        w = sub.add_parser(name, help=what, description=func.__doc__)
        w.add_argument("src", help="node dir or mnesia base to read (never modified)")
        w.add_argument(
            "dst",
            help="output dir: must not exist or be empty (--force: a previous output of "
            "cqforensics); never inside SRC or RabbitMQ data",
        )
        w.add_argument("--dry-run", action="store_true", help="show the plan and the byte counts, write nothing")
        w.add_argument(
            "--broker-version",
            metavar="V",
            help="the version that will boot DST: its index versions, stored message shapes and atom "
            "encoding (default: the version that wrote SRC)",
        )
        w.add_argument(
            "--source-version",
            metavar="V",
            help="the version that wrote SRC, whose next boot decides what is kept (default: inferred)",
        )
        w.add_argument(
            "--file-size-limit",
            type=_int_at_least(1),
            default=16 << 20,
            metavar="BYTES",
            help="roll shared-store files at this size (msg_store_file_size_limit; default 16 MiB)",
        )
        w.add_argument("--json", action="store_true", help="print the report as one JSON document")
        w.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
        w.add_argument("--progress", action="store_true", help="progress on stderr even with --json")
        add_force(w, "DST (an existing dir is replaced whole, atomically)")
        w.add_argument(
            "--template",
            metavar="NODE",
            help="for a --broker-version of another release series: a node dir that version wrote, "
            "with SRC's queues declared (`cqforensics definitions`), whose metadata and feature "
            "flags DST takes instead of SRC's",
        )
        if name == "compact":
            w.add_argument(
                "--threshold",
                type=_percent,
                metavar="PCT",
                help="rewrite only the shared-store files whose garbage ratio is above PCT percent "
                "(0-100); copy the others whole, orphans and all (default: rewrite every file)",
            )
        else:
            w.add_argument(
                "--restore-orphans",
                nargs="+",
                metavar="QUEUE",
                help="write the orphaned shared-store messages whose exchange and routing keys reach "
                "QUEUE (the metadata's bindings; `audit` lists them) back into QUEUE, after its own "
                "messages; a queue whose index dir is gone gets one. Opt-in: each restored message "
                "is listed in the report and in lost+found's index",
            )
        w.set_defaults(func=func)

    df = sub.add_parser(
        "definitions",
        help="the definitions a node of another series imports before a move",
        description=cmd_definitions.__doc__,
    )
    df.add_argument("src", help="node dir or mnesia base (one node)")
    df.add_argument("--broker-version", metavar="V", required=True, help="the version of the node importing them")
    df.set_defaults(func=cmd_definitions)

    v = sub.add_parser("verify", help="check a node dir's strict invariants", description=cmd_verify.__doc__)
    v.add_argument("paths", nargs="+", help="node dir, mnesia base, or a folder of node dirs")
    v.add_argument("--deep", action="store_true", help="also decode every stored message and check its id")
    v.add_argument("--broker-version", metavar="V", help="the version that will boot it (default: inferred)")
    v.add_argument("--json", action="store_true", help="print one JSON document")
    v.add_argument(
        "--allow-garbage",
        action="store_true",
        help="accept orphaned and duplicate shared-store entries (what compact --threshold leaves in "
        "the files it keeps)",
    )
    add_jobs(v)
    v.set_defaults(func=cmd_verify)

    r = sub.add_parser(
        "read", help="print or save one table of every node dir under the paths", description=cmd_read.__doc__
    )
    r.add_argument("paths", nargs="+", help="node dir, mnesia base, or a folder of node backups")
    r.add_argument("--table", default="messages", choices=TABLES, help="which table (default: messages)")
    r.add_argument(
        "--format",
        default="table",
        choices=("table", "jsonl", "parquet"),
        help="aligned text, JSON lines or Parquet (Parquet needs --out; default: table)",
    )
    r.add_argument("--columns", metavar="A,B", help="comma-separated column list")
    r.add_argument(
        "--limit", type=_int_at_least(0), metavar="N", help="at most this many rows (every format; reading stops there)"
    )
    r.add_argument(
        "--out",
        metavar="FILE",
        help="write to this file instead of stdout (not an existing file unless --force; never inside an input)",
    )
    add_force(r, "FILE")
    add_quiet(r, "with --out: no progress on stderr (shown only on a terminal)")
    add_read_options(r)
    add_filters(
        r,
        "only this queue (repeatable; queue-level tables: messages, index, acks, queues, files and holes of .qs files)",
    )
    add_jobs(r)
    r.set_defaults(func=cmd_read)

    rpub = sub.add_parser(
        "republish", help="send recovered messages to a running broker (resumable)", description=cmd_republish.__doc__
    )
    rpub.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="node dir / mnesia base / backups folder, an export (DIR or messages.jsonl/.parquet), "
        "or a rebuild's lost+found",
    )
    rpub.add_argument(
        "url", metavar="amqp://USER:PASS@HOST:PORT/", help="the target broker (messages go to their own vhosts on it)"
    )
    rpub.add_argument(
        "--journal",
        metavar="FILE",
        help="resumable journal (default: cqforensics-republish-<hash>.journal in the current dir; "
        "never inside an input)",
    )
    rpub.add_argument(
        "--since",
        metavar="TIME",
        help="only messages whose timestamp property is at or after TIME (ISO 8601 or epoch ms)",
    )
    rpub.add_argument("--until", metavar="TIME", help="only messages whose timestamp property is before TIME")
    rpub.add_argument("--ids", metavar="FILE", help="only these messages: one msg_id (hex) or AMQP message_id a line")
    rpub.add_argument(
        "--map",
        action="append",
        metavar="OLD=NEW",
        help="send queue OLD's messages to queue NEW through the default exchange (repeatable)",
    )
    rpub.add_argument("--rate", type=float, metavar="N", help="at most N publishes per second")
    rpub.add_argument("--dry-run", action="store_true", help="print what would be sent; connect to nothing")
    rpub.add_argument(
        "--only-dropped",
        action="store_true",
        help="send what the next boot would drop (transient, expired, ...) instead of what it delivers",
    )
    rpub.add_argument(
        "--in-doubt",
        choices=("send", "skip"),
        help="the one publish an interrupted run left unconfirmed, when the queue depths cannot "
        "tell whether it arrived: send it again (may duplicate) or skip it (may lose it)",
    )
    rpub.add_argument(
        "--topology",
        action="append",
        metavar="NODE",
        help="node dir whose metadata tells where the exchanges route (for exports; repeatable)",
    )
    rpub.add_argument("--json", action="store_true", help="print the report as one JSON document")
    add_read_options(rpub)
    add_filters(rpub, "only this queue's messages (repeatable; the source's queue names)")
    rpub.set_defaults(func=cmd_republish)

    rp = sub.add_parser("report", help="write a self-contained HTML report to look at", description=cmd_report.__doc__)
    rp.add_argument("paths", nargs="+", help="node dir, mnesia base, or a folder of node backups")
    rp.add_argument(
        "--html",
        required=True,
        metavar="FILE",
        help="the HTML file to write (not an existing file unless --force; never inside an input)",
    )
    add_force(rp, "FILE")
    add_read_options(rp)
    rp.add_argument(
        "--vhost",
        action="append",
        metavar="NAME",
        dest="vhosts",
        help="only this vhost (repeatable; default: every vhost)",
    )
    add_jobs(rp)
    add_quiet(rp)
    rp.set_defaults(func=cmd_report)
    add_docgen_parsers(sub)  # last: completion and man page cover every command above
    return p


def add_docgen_parsers(sub) -> None:
    """``completion`` and ``manpage``: generated from the parser itself (``cli/docgen.py``)."""
    c = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script for SHELL, generated from the argparse definitions: "
        "source <(cqforensics completion bash), or save the zsh one as _cqforensics "
        "on $fpath.",
    )
    c.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete for")
    c.set_defaults(func=cmd_completion)
    m = sub.add_parser(
        "manpage",
        help="print the man page (roff)",
        description="Print the man page, generated from the argparse definitions: "
        "cqforensics manpage > cqforensics.1; man ./cqforensics.1",
    )
    m.set_defaults(func=cmd_manpage)


def cmd_completion(args) -> int:
    from cli import docgen

    sys.stdout.write(getattr(docgen, args.shell)(build_parser()))
    return exitcodes.OK


def cmd_manpage(args) -> int:
    from cli import docgen
    from cqforensics import __version__

    sys.stdout.write(docgen.manpage(build_parser(), __version__))
    return exitcodes.OK


class JsonLogFormatter(logging.Formatter):
    """One JSON object per log record: time (UTC, ISO 8601), level, logger, message."""

    def format(self, record: logging.LogRecord) -> str:
        import datetime as dt
        import json

        doc = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("command", "exit_code", "seconds"):
            if hasattr(record, key):
                doc[key] = getattr(record, key)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, sort_keys=True)


_handler: logging.Handler | None = None


def setup_logging(verbose: int, as_json: bool) -> None:
    """Log records of ``cqforensics.*`` to stderr: warnings by default, -v info, -vv debug; as
    JSON lines with --log-json. Replaces the handler an earlier call installed."""
    global _handler
    logger = logging.getLogger("cqforensics")
    if _handler is not None:
        logger.removeHandler(_handler)
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(
        JsonLogFormatter() if as_json else logging.Formatter("cqforensics: %(levelname)s: %(message)s")
    )
    logger.addHandler(_handler)
    logger.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO if verbose == 1 else logging.WARNING)


_PARSERS: dict[str, argparse.ArgumentParser] = {}


def _parser() -> argparse.ArgumentParser:
    """``build_parser()``, made once per process for each state of the compiled core (which its
    ``--version`` line names): ``main`` runs many times in one process (the fuzz campaign's
    forked runs, the in-process CLI of the tests), and a build costs about 10 ms (argparse
    formats each option as it is added). Parsing leaves a parser as it was."""
    from cqforensics import compiled as core

    key = core.status()
    parser = _PARSERS.get(key)
    if parser is None:
        parser = _PARSERS[key] = build_parser()
    return parser


def main(argv: list[str] | None = None) -> int:
    import time

    from cqforensics.base.errors import CQError

    args = None
    try:
        parser = _parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # usage errors (16) and --help (0)
            return e.code if isinstance(e.code, int) else exitcodes.USAGE
        setup_logging(args.verbose, args.log_json)
        started = time.monotonic()
        log.info("%s started", args.command, extra={"command": args.command})
        code = args.func(args)
        log.info(
            "%s finished: exit %d in %.2f s",
            args.command,
            code,
            time.monotonic() - started,
            extra={"command": args.command, "exit_code": code, "seconds": round(time.monotonic() - started, 3)},
        )
        return code
    except CQError as e:
        print(f"cqforensics: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        _interrupt_caught()
        print("cqforensics: interrupted", file=sys.stderr)
        return exitcodes.INTERRUPTED
    except BrokenPipeError:  # the reader went away (| head): not an error; nothing more can be written
        _silence_stdout()
        return exitcodes.OK
    except OSError as e:
        print(f"cqforensics: {e.filename if e.filename is not None else 'error'}: {e.strerror or e}", file=sys.stderr)
        return exitcodes.OPERATIONAL
    except Exception as e:  # a bug: one line (the traceback with --traceback), exit 8
        if args is not None and args.traceback:
            import traceback

            traceback.print_exc(file=sys.stderr)
        line = " ".join(str(e).split())
        print(
            f"cqforensics: internal error: {type(e).__name__}{': ' + line if line else ''} "
            f"(run with --traceback for a bug report)",
            file=sys.stderr,
        )
        return exitcodes.OPERATIONAL


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of a closed pipe raises nothing."""
    import os

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


_interrupted = False


def _on_interrupt(signum, frame):
    """SIGINT and SIGTERM: KeyboardInterrupt, so the writers remove their partial output on the
    way out (their cleanup holds further signals until it is done: ``outputs.signals_held``).

    numpy swallows an exception raised while it probes an operand's attributes, so one
    KeyboardInterrupt can be lost; until ``main`` has caught one, it is raised again every half
    second (SIGALRM)."""
    import signal

    global _interrupted
    if signum == signal.SIGALRM:
        if not _interrupted:
            return
    elif not _interrupted:
        _interrupted = True
        signal.setitimer(signal.ITIMER_REAL, 0.5, 0.5)
    raise KeyboardInterrupt


def _interrupt_caught() -> None:
    """The interrupt reached ``main``: stop raising it again."""
    global _interrupted
    if _interrupted:
        import signal

        signal.setitimer(signal.ITIMER_REAL, 0)
        _interrupted = False


class _NoPandas:
    """An import finder that refuses pandas: no command uses it, and pyarrow's probe for pandas
    objects imports it at the first conversion of Python values (a ``messages`` read's reference
    rows, ...): a second of each process's start-up on the project's VM, paid again by every
    worker of ``-j``. pyarrow then treats pandas as absent, which changes nothing it does here."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is not used by the cqforensics command line", name=name)
        return None


def run() -> None:
    """The console script: ``main`` with Ctrl-C (or SIGTERM) turned into one line and exit 32,
    wherever it arrives."""
    import gc
    import signal

    from cqforensics.base import heap

    if "pandas" not in sys.modules:
        sys.meta_path.insert(0, _NoPandas())

    def unraisable(u) -> None:
        # an interrupt raised where Python cannot raise it (a finally of the logging module, a
        # generator closed by the collector) is reported as "Exception ignored" with a traceback;
        # it is raised again (SIGALRM) until main catches it, so it is dropped, never shown
        if not (_interrupted and isinstance(u.exc_value, KeyboardInterrupt)):
            sys.__unraisablehook__(u)

    sys.unraisablehook = unraisable
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):
            signal.signal(sig, _on_interrupt)
        with heap.command():
            code = main()
        _interrupt_caught()  # one that numpy swallowed while the command finished anyway
    except KeyboardInterrupt:
        _interrupt_caught()
        print("cqforensics: interrupted", file=sys.stderr)
        code = exitcodes.INTERRUPTED
    # the command is done: what it made is left to the exit, whose last full collection would
    # otherwise traverse all of it (0.3-0.9 s after a node of 20,000 queues, for nothing: every
    # file the command wrote is closed, the streams are flushed by the exit itself)
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
