"""``cqforensics`` command line. Each subcommand: arguments -> one library call -> render ->
exit code (e2fsck style: 0 clean, 1 fixed, 4 errors left, 8 operational error, 16 usage,
32 interrupted). No traceback reaches the user: operational failures print one line naming
the file."""

from __future__ import annotations

import argparse
import sys

from cli import exitcodes


class Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors exit 16, not argparse's 2
        self.print_usage(sys.stderr)
        self.exit(exitcodes.USAGE, f"{self.prog}: error: {message}\n")


def add_read_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker-version", metavar="V",
                   help="the RabbitMQ version whose next boot to predict (3.10 .. 4.3; default: inferred)")
    p.add_argument("--as-of", metavar="TIME",
                   help="judge message TTLs at this time (ISO 8601 or epoch ms; default: now)")


def read_options(args) -> dict:
    import datetime as dt

    out = {}
    if getattr(args, "broker_version", None):
        out["broker_version"] = args.broker_version
    as_of = getattr(args, "as_of", None)
    if as_of:
        from cqforensics.errors import UsageError

        if as_of.isdigit():
            out["as_of"] = int(as_of)
        else:
            try:
                t = dt.datetime.fromisoformat(as_of.replace("Z", "+00:00"))
            except ValueError:
                raise UsageError(f"--as-of: not ISO 8601 or epoch ms: {as_of!r}") from None
            out["as_of"] = t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
    return out


def cmd_read(args) -> int:
    """Print or save one table (see README: Tables)."""
    import cqforensics
    from cli import render

    columns = args.columns.split(",") if args.columns else None
    opts = read_options(args)
    if args.format == "parquet":
        import pyarrow.parquet as pq

        if not args.out:
            from cqforensics.errors import UsageError

            raise UsageError("--format parquet needs --out FILE")
        table = cqforensics.read_table(args.paths, args.table, columns=columns, **opts)
        pq.write_table(table, args.out)
        print(f"{table.num_rows} rows -> {args.out}", file=sys.stderr)
        return exitcodes.OK
    out = open(args.out, "w") if args.out else sys.stdout
    try:
        n = 0
        rows_for_text = []
        for batch in cqforensics.iter_batches(args.paths, args.table, columns=columns, **opts):
            rows = batch.to_pylist()
            if args.limit is not None:
                rows = rows[:max(0, args.limit - n)]
            n += len(rows)
            if args.format == "jsonl":
                render.write_jsonl(rows, out)
            else:
                rows_for_text += rows
            if args.limit is not None and n >= args.limit:
                break
        if args.format == "table":
            cols = columns or [c for c in cqforensics.schema(args.table).names if c not in ("body",)]
            render.text_table(rows_for_text, cols, out)
    finally:
        if out is not sys.stdout:
            out.close()
    return exitcodes.OK


def build_parser() -> argparse.ArgumentParser:
    from cqforensics.schema import TABLES

    p = Parser(prog="cqforensics", description="Forensics for RabbitMQ classic-queue storage (3.10 - 4.3).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    r = sub.add_parser("read", help="print or save one table of every node dir under the paths",
                       description=cmd_read.__doc__)
    r.add_argument("paths", nargs="+", help="node dir, mnesia base, or a folder of node backups")
    r.add_argument("--table", default="messages", choices=TABLES)
    r.add_argument("--format", default="table", choices=("table", "jsonl", "parquet"))
    r.add_argument("--columns", help="comma-separated column list")
    r.add_argument("--limit", type=int, help="at most this many rows")
    r.add_argument("--out", help="write to this file instead of stdout")
    add_read_options(r)
    r.set_defaults(func=cmd_read)
    return p


def main(argv: list[str] | None = None) -> int:
    from cqforensics.errors import CQError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CQError as e:
        print(f"cqforensics: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("cqforensics: interrupted", file=sys.stderr)
        return exitcodes.INTERRUPTED
    except BrokenPipeError:
        return exitcodes.OK
    except OSError as e:
        print(f"cqforensics: {e.filename or ''}: {e.strerror}", file=sys.stderr)
        return exitcodes.OPERATIONAL


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
