"""Findings: what is wrong (or worth knowing), where, with a stable code.

Codes are public API: they are listed in README.md (tests/test_docs.py checks it) and never
change meaning. ``CODES`` maps each code to its default severity and a one-line meaning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

INFO, WARNING, ERROR = "info", "warning", "error"
SEVERITY_RANK = {INFO: 0, WARNING: 1, ERROR: 2}

CODES: dict[str, tuple[str, str]] = {
    "qi-bad-header": (ERROR, "a .qi segment has a missing or wrong header; the broker deletes it and its .qs"),
    "qi-bad-entry": (ERROR, "a .qi slot breaks the strict entry layout (status, reserved bits, location)"),
    "qs-bad-header": (ERROR, "a .qs segment has a missing or wrong header; its messages cannot be read"),
    "qs-entry-missing": (ERROR, "an index entry points into a .qs file or range that is not there"),
    "qs-entry-crc": (ERROR, "a .qs entry fails its size or CRC check; the broker drops it"),
    "qs-entry-undecodable": (ERROR, "a .qs entry passes its checks but its term does not decode"),
    "msg-missing": (ERROR, "an index entry refers to a shared-store message that is not there"),
    "msg-corrupt": (ERROR, "a stored message term does not decode"),
    "rdq-truncated": (WARNING, "a shared-store file ends inside an entry"),
    "rdq-garbage": (WARNING, "bytes in a shared-store file that are no valid entry (zeroed or damaged)"),
    "orphan-message": (INFO, "shared-store messages no queue index refers to (garbage until compaction)"),
    "duplicate-copy": (INFO, "the same message id stored more than once"),
    "refcount-mismatch": (WARNING, "recorded reference count differs from the references the indexes hold"),
    "transient-dropped": (INFO, "transient messages on disk that the next boot drops"),
    "expired": (INFO, "messages whose TTL has passed; the broker drops them on delivery"),
    "queue-dir-mismatch": (WARNING, "a dir name does not match the md5/base-36 of the name it holds"),
    "missing-queue-name": (WARNING, "a queue or vhost dir without a readable .queue_name/.vhost"),
    "unknown-queue": (WARNING, "a queue dir not in the durable-queue metadata: the broker deletes it at boot"),
    "unknown-file": (INFO, "a file the broker does not use in this place"),
    "v1-journal-torn": (WARNING, "a CQv1 journal ends in a partial or invalid record"),
    "v1-segment-truncated": (ERROR, "a CQv1 segment ends inside a record"),
    "v1-orphan-ack": (WARNING, "a CQv1 deliver/ack record for a message that was never published"),
    "unclean-shutdown": (INFO, "the node was not stopped cleanly: the next boot rebuilds its indexes"),
    "fragmented-file": (INFO, "a shared-store file is mostly garbage; compaction would reclaim it"),
    "boot-crash": (ERROR, "damage that makes the named broker version crash or hang at boot"),
}


@dataclass
class Finding:
    code: str
    message: str
    file: str | None = None
    offset: int | None = None
    severity: str | None = None
    node: str | None = None
    vhost: str | None = None
    queue: str | None = None
    priority: int | None = None
    details: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.code not in CODES:
            raise ValueError(f"unknown finding code {self.code!r}")
        if self.severity is None:
            self.severity = CODES[self.code][0]

    def to_dict(self) -> dict:
        return {"code": self.code, "severity": self.severity, "node": self.node, "vhost": self.vhost,
                "queue": self.queue, "priority": self.priority, "file": self.file, "offset": self.offset,
                "message": self.message, "details": self.details}

    def details_json(self) -> str:
        return json.dumps(self.details, sort_keys=True, default=str)
