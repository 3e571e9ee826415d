"""How to read: the one ``Options`` type, built and validated in one place (``make_options``).

The Python API, the CLI, the commands, the writers and the Spark reader all build their
options here; nothing constructs ``Options`` directly. ``parse_as_of`` is the one parser of the
time TTLs are judged at (ISO 8601, epoch milliseconds or a datetime), and ``DECODED_COLUMNS``
the one list of the ``messages`` columns that need the stored term decoded.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from dataclasses import dataclass, field

from cqforensics.base.errors import UsageError
from cqforensics.model import versions

#: columns of the ``messages`` table that need the stored term decoded (the rest come from the
#: index); a projection without any of them skips decoding.
DECODED_COLUMNS = (
    "exchange",
    "routing_keys",
    "properties",
    "headers",
    "annotations",
    "body",
    "body_size",
    "term_format",
    "msg_id",
    "decode_error",
)

#: timestamps beyond 9999-12-31 cannot be shown by any front end
_MAX_MS = 253402300799999


@dataclass(frozen=True)
class Options:
    """How to read: which broker version to predict for, and the time TTLs are judged at."""

    broker_version: str | None = None  # None: inferred from the data
    as_of_ms: int | None = None  # None: now
    bodies: bool = True  # read message/store bodies
    decode: bool = True  # decode stored terms (messages table)
    batch_rows: int = 8192
    batch_bytes: int = 16 << 20
    assume_dirty: bool = False  # predict as if the clean-shutdown files were removed
    #: ``broker_version`` parsed once, by ``make_options`` (None: inferred from the data)
    broker_model: versions.BrokerModel | None = field(default=None, compare=False, repr=False)
    #: processes a read may use (``cqforensics.base.parallel``): its output is the same whatever it is
    jobs: int = field(default=1, compare=False)

    def now_ms(self) -> int:
        return self.as_of_ms if self.as_of_ms is not None else int(time.time() * 1000)


def parse_as_of(value, what: str = "as_of") -> int | None:
    """A time as epoch milliseconds: a timezone-aware datetime, epoch ms (int or digits), or an
    ISO 8601 string (UTC when it names no zone). ``what`` names the option in errors."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise UsageError(f"{what}: not a time: {value!r}")
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise UsageError(f"{what} must be timezone-aware (e.g. datetime.now(timezone.utc))")
        ms = int(value.timestamp() * 1000)
    elif isinstance(value, int):
        ms = value
    elif isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            ms = int(text)
        else:
            try:
                t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                raise UsageError(f"{what}: not ISO 8601 or epoch ms: {value!r}") from None
            ms = int((t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp() * 1000)
    else:
        raise UsageError(
            f"{what} must be a datetime, an ISO 8601 string or epoch milliseconds, not {type(value).__name__}"
        )
    if not 0 <= ms <= _MAX_MS:
        raise UsageError(f"{what}: {value!r} is outside 1970-01-01 .. 9999-12-31")
    return ms


def make_options(
    broker_version: str | None = None,
    as_of=None,
    bodies: bool = True,
    decode: bool = True,
    batch_rows: int = 8192,
    batch_bytes: int = 16 << 20,
    assume_dirty: bool = False,
    jobs: int = 1,
) -> Options:
    """Options from keyword arguments, validated. ``as_of`` (see ``parse_as_of``) is the time TTLs
    are judged at for ``survives_restart`` (default: now); ``assume_dirty`` predicts the boot as
    if the clean-shutdown files were removed (the broker then rebuilds and verifies); ``jobs``
    processes read at once (``cqforensics.base.parallel``; 1: this process only), the same output."""
    model = versions.model(broker_version) if broker_version is not None else None  # parsed once, here
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise UsageError(f"batch_rows must be a positive integer, not {batch_rows!r}")
    if isinstance(batch_bytes, bool) or not isinstance(batch_bytes, int) or batch_bytes < 1:
        raise UsageError(f"batch_bytes must be a positive integer, not {batch_bytes!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise UsageError(f"jobs must be a positive integer, not {jobs!r}")
    return Options(
        broker_version,
        parse_as_of(as_of),
        bool(bodies),
        bool(decode),
        batch_rows,
        batch_bytes,
        bool(assume_dirty),
        model,
        jobs,
    )


def narrowed(opts: Options, table: str, columns) -> Options:
    """``opts`` reading only what the projection ``columns`` of ``table`` needs (see ``needs``)."""
    changes = needs(table, columns)
    return dataclasses.replace(opts, **changes) if changes else opts


def needs(table: str, columns) -> dict:
    """The reading options a projection implies: ``bodies`` only when ``body`` is read, ``decode``
    only when a decoded column of ``messages`` is (the one place this rule is written)."""
    if columns is None:
        return {}
    cols = set(columns)
    out = {}
    if "body" not in cols:
        out["bodies"] = False
    if table == "messages" and not cols & set(DECODED_COLUMNS):
        out["decode"] = False
    return out
