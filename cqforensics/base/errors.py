"""Error types. Damage in a file is a ``FormatError`` (readers turn it into a finding);
only operational trouble (unreadable input, bad usage) is raised to the user."""

from __future__ import annotations

import os

from cqforensics.base import exitcodes


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


#: nouns whose plural is not noun + "s"
_PLURALS = {
    "entry": "entries",
    "body": "bodies",
    "copy": "copies",
    "index": "indexes",
    "hit": "hits",
    "byte": "bytes",
    "is": "are",
    "was": "were",
    "has": "have",
}


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``n`` and ``noun``, the noun in the plural unless ``n`` is 1 (``1 queue``, ``2 queues``,
    ``1,024 entries``): the one way every text output counts. ``many``: an irregular plural.
    Only the last word of ``noun`` is inflected (``1 transient message``)."""
    if n == 1:
        return f"1 {noun}"
    head, _, last = noun.rpartition(" ")
    if many is None:
        many = _PLURALS.get(last) or (
            last[:-1] + "ies"
            if last.endswith("y") and last[-2:-1] not in "aeiou"
            else last + ("es" if last.endswith(("s", "x", "sh", "ch")) else "s")
        )
        many = f"{head} {many}" if head else many
    return f"{n:,} {many}" if isinstance(n, int) or hasattr(n, "__index__") else f"{n} {many}"


def queue_ref(vhost, queue) -> str:
    """A queue named with its vhost, as RabbitMQ names it (``'orders' in vhost '/'``): never
    ``vhost/queue``, which reads ``//orders`` for the default vhost and is ambiguous when a
    name holds a slash. Bytes and undecodable names go through ``display``."""
    return f"{display(queue)!r} in vhost {display(vhost)!r}"


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
