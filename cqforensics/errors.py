"""Error types. Damage in a file is a ``FormatError`` (readers turn it into a finding);
only operational trouble (unreadable input, bad usage) is raised to the user."""

from __future__ import annotations

import os

from cqforensics import exitcodes


def display(value) -> str | None:
    """The one text form of a path or name (``str``, ``bytes`` or ``os.PathLike``; None stays None).

    Names on disk are bytes; Python holds undecodable ones as lone surrogates (``\\udcff``), which
    no Arrow string, UTF-8 file or strict stdout accepts. Each undecodable byte is shown as a
    backslash escape (``b"q\\xff"`` -> ``q\\xff``), deterministically; valid UTF-8 is unchanged.
    Every place that turns a path or name into text (tables, findings, reports, errors) uses this."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
    else:
        if not isinstance(value, str):
            value = os.fspath(value)
            if isinstance(value, bytes):
                return display(value)
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            pass
        try:
            raw = value.encode("utf-8", "surrogateescape")  # a name os.fsdecode made
        except UnicodeEncodeError:
            raw = value.encode("utf-8", "surrogatepass")  # other lone surrogates: their bytes, escaped
    return raw.decode("utf-8", "backslashreplace")


def display_all(value):
    """``value`` (a JSON-like tree: dicts, lists, tuples, strings) with every string passed through
    ``display``; dict keys too."""
    if isinstance(value, str):
        return display(value)
    if isinstance(value, dict):
        return {display_all(k): display_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(display_all(v) for v in value)
    return value


class CQError(Exception):
    """Base of every error cqforensics raises on purpose. ``exit_code`` follows e2fsck."""

    exit_code = exitcodes.OPERATIONAL

    def __str__(self) -> str:  # a message naming an undecodable path prints as text (``display``)
        return display(super().__str__())


class FormatError(CQError):
    """Bytes that do not follow their format, at ``path`` + ``offset``."""

    def __init__(self, message: str, path: str | None = None, offset: int | None = None):
        self.message = message
        self.path = path
        self.offset = offset
        super().__init__(str(self))

    def __str__(self) -> str:
        where = display(self.path) or "<bytes>"
        if self.offset is not None:
            where += f"@{self.offset:#x}"
        return f"{where}: {self.message}"


class OperationalError(CQError):
    """The tool cannot do its job (missing or unreadable input, a bug): exit 8."""


class UsageError(CQError):
    """Bad options or arguments: exit 16."""

    exit_code = exitcodes.USAGE
