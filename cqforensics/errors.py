"""Error types. Damage in a file is a ``FormatError`` (readers turn it into a finding);
only operational trouble (unreadable input, bad usage) is raised to the user."""

from __future__ import annotations


class CQError(Exception):
    """Base of every error cqforensics raises on purpose. ``exit_code`` follows e2fsck."""

    exit_code = 8


class FormatError(CQError):
    """Bytes that do not follow their format, at ``path`` + ``offset``."""

    def __init__(self, message: str, path: str | None = None, offset: int | None = None):
        self.message = message
        self.path = path
        self.offset = offset
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.path or "<bytes>"
        if self.offset is not None:
            where += f"@{self.offset:#x}"
        return f"{where}: {self.message}"


class OperationalError(CQError):
    """The tool cannot do its job (missing or unreadable input, a bug): exit 8."""


class UsageError(CQError):
    """Bad options or arguments: exit 16."""

    exit_code = 16
