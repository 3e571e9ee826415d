"""Per-entry listing of one file, like Kafka's DumpLogSegments: offset, size, id, status.

Works on a lone file (no node dir needed). ``deep`` decodes the stored messages. The file kind
comes from the reader registry (``cqforensics.readers.registry``: the name, else the
extension), checked against the magic where the format has one. The rows are the reader's
view: each kind's reader lists its entries (``Reader.dump``) and locates each stored message
with its own framing (``term_span``); this module only decodes those terms.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from cqforensics.base.errors import OperationalError, UsageError
from cqforensics.message import fast as fastpath
from cqforensics.message import reference as message
from cqforensics.model import quorum as m_quorum
from cqforensics.readers import registry
from cqforensics.readers.files import file_type, read_bytes


def kind_of(path: Path) -> str:
    """The registry kind of a file ``dump`` can list (UsageError otherwise)."""
    kind = registry.kind_of(path)
    if kind is None or registry.READERS[kind].dump is None:
        raise UsageError(f"{path}: cannot dump this kind of file (known: {', '.join(registry.dumpable())})")
    return kind


def _message(raw) -> dict:
    try:
        m = fastpath.decode(raw)
    except Exception as e:
        return {"decode_error": f"{type(e).__name__}: {e}"[:200]}
    body = m["body"]
    return {
        "term_format": m["term_format"],
        "exchange": m["exchange"],
        "routing_keys": m["routing_keys"],
        "message_id": m["properties"].get("message_id"),
        "headers": m["headers"],
        "body_size": len(body),
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "body_preview": body[:64],
    }


def _ra_entry(raw) -> dict:
    """A Ra log entry (WAL record, segment entry): its command, and the message an enqueue carries."""
    try:
        entry = m_quorum.decode_log_entry(raw)
    except Exception as e:
        return {"decode_error": f"{type(e).__name__}: {e}"[:200]}
    out = {"entry": entry.kind}
    cmd = entry.command
    if cmd is not None:
        out["command"] = cmd.name
        if cmd.msg is not None:
            try:
                m = message.normalise_checked(cmd.msg)
            except Exception as e:
                out["decode_error"] = f"{type(e).__name__}: {e}"[:200]
                return out
            body = m["body"]
            out.update(
                {
                    "term_format": m["term_format"],
                    "exchange": m["exchange"],
                    "routing_keys": m["routing_keys"],
                    "message_id": m["properties"].get("message_id"),
                    "headers": m["headers"],
                    "body_size": len(body),
                    "body_sha256": hashlib.sha256(body).hexdigest(),
                    "body_preview": body[:64],
                }
            )
    elif entry.machine_version is not None:
        out["machine_version"] = entry.machine_version
    return out


#: kinds whose located terms are Ra log entries (a rabbit_fifo command), not stored messages
RA_LOG_KINDS = ("ra_wal", "ra_segment", "ra_compacting")


def dump(path: Path | str, deep: bool = False, segment_entry_count: int = 16384) -> Iterator[dict]:
    """One dict per entry (and per hole), in file order."""
    path = Path(path)
    reader = registry.READERS[kind_of(path)]
    try:
        what = file_type(path)
    except OSError as e:
        raise OperationalError(f"{path}: cannot read: {e.strerror}") from e
    if what is not None:  # a FIFO would block the read forever
        raise OperationalError(f"{path}: {what}, not a regular file: not read")
    sources: dict[Path, bytes] = {}
    for row, term in reader.dump(path, segment_entry_count):
        if deep and term is not None:
            source, start, length = term
            if isinstance(source, Path):  # a sibling file (a .qi's .qs), read once
                if source not in sources:
                    sources[source] = read_bytes(source)
                source = sources[source]
            raw = source[start : start + length]
            row.update(_ra_entry(raw) if reader.kind in RA_LOG_KINDS else _message(raw))
        yield row


__all__ = ["dump", "kind_of"]
