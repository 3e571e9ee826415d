"""The small files of a Ra system dir (``quorum/<node>/``) and its servers' dirs: ``names.dets``
(ra_directory), ``meta.dets`` (ra_log_meta), ``writers.snapshot`` (Ra 3's WAL), each server's
``config`` and Ra 3's ``<N>.compaction_group`` (spec: docs/formats/quorum.md). Each reader
returns what it could read and a note for what it could not; none raises on damaged bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cqforensics.base.errors import CQError, FormatError
from cqforensics.codecs import etf, textfiles
from cqforensics.readers import terms as r_terms
from cqforensics.readers.files import read_optional


@dataclass(frozen=True)
class MetaRecord:
    """One ``meta.dets`` object: ``{UId, CurrentTerm, VotedFor, LastApplied}`` (ra_log_meta;
    a field never stored is the atom ``undefined``: None here)."""

    uid: bytes
    current_term: int | None
    voted_for: object
    last_applied: int | None
    offset: int | None = None


@dataclass
class Table:
    """Records of a DETS table and why some could not be read (``error``: the table as a whole)."""

    records: list = field(default_factory=list)
    error: str | None = None
    other: int = 0  # objects of another shape than the table's records


def _int_or_none(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _dets_table(path: Path, record) -> Table:
    """A DETS table's objects as records: ``record(object, offset)`` makes one, or None for an
    object of another shape (counted in ``other``); a table that cannot be read is its error."""
    out = Table()
    try:
        objects = r_terms.read_dets_objects_at(path)
    except CQError as e:
        out.error = getattr(e, "message", str(e))
        return out
    for off, o in objects:
        r = record(o, off)
        if r is None:
            out.other += 1
        else:
            out.records.append(r)
    return out


def read_meta(path: Path) -> Table:
    """``meta.dets``: one MetaRecord per server (the last one stored wins, as the set holds one)."""
    return _dets_table(
        path,
        lambda o, off: (
            MetaRecord(o[0], _int_or_none(o[1]), o[2] if o[2] != "undefined" else None, _int_or_none(o[3]), off)
            if isinstance(o, tuple) and len(o) == 4 and isinstance(o[0], bytes)
            else None
        ),
    )


@dataclass(frozen=True)
class NameRecord:
    """One ``names.dets`` object: ``{ServerName, UId}`` (ra_directory register_name/6)."""

    name: str
    uid: bytes
    offset: int | None = None


def read_names(path: Path) -> Table:
    """``names.dets``: one NameRecord per registered server."""
    return _dets_table(
        path,
        lambda o, off: (
            NameRecord(str(o[0]), o[1], off)
            if isinstance(o, tuple) and len(o) == 2 and isinstance(o[0], str) and isinstance(o[1], bytes)
            else None
        ),
    )


CONFIG_LIMIT = 1 << 20  # a server's config is a few KB


@dataclass
class ServerConfig:
    """``<UId>/config``: the map ra_log write_config/2 printed (``~p.``)."""

    path: Path
    terms: dict | None = None
    error: str | None = None
    error_offset: int | None = None

    def get(self, *keys, default=None):
        v = self.terms
        for k in keys:
            if not isinstance(v, dict) or k not in v:
                return default
            v = v[k]
        return v

    @property
    def uid(self) -> bytes | None:
        v = self.get("log_init_args", "uid") or self.get("uid")
        return v if isinstance(v, bytes) else None

    @property
    def cluster_name(self) -> str | None:
        v = self.get("cluster_name")
        return str(v) if isinstance(v, str) else None

    @property
    def machine_config(self) -> dict:
        """rabbit_fifo's config (``machine => {module, rabbit_fifo, Config}``)."""
        m = self.get("machine")
        if isinstance(m, tuple) and len(m) == 3 and isinstance(m[2], dict):
            return m[2]
        return {}

    @property
    def machine_module(self) -> str | None:
        m = self.get("machine")
        return str(m[1]) if isinstance(m, tuple) and len(m) == 3 and isinstance(m[1], str) else None

    @property
    def queue_resource(self) -> tuple[bytes, bytes] | None:
        """(vhost, queue name) of ``queue_resource => {resource, VHost, queue, Name}``."""
        r = self.machine_config.get("queue_resource")
        if isinstance(r, tuple) and len(r) == 4 and isinstance(r[1], bytes) and isinstance(r[3], bytes):
            return r[1], r[3]
        return None


def read_config(path: Path) -> ServerConfig:
    cfg = ServerConfig(Path(path))
    try:
        raw = read_optional(path, CONFIG_LIMIT)
    except FormatError as e:  # not a regular file: never read
        cfg.error = e.message
        return cfg
    if raw is None:
        cfg.error = "missing"
        return cfg
    try:
        terms = textfiles.consult(raw)
    except FormatError as e:
        cfg.error, cfg.error_offset = f"unreadable terms: {e.message}", e.offset
        return cfg
    if len(terms) != 1 or not isinstance(terms[0], dict):
        cfg.error, cfg.error_offset = "not one map term", 0
        return cfg
    cfg.terms = terms[0]
    return cfg


def read_term_file(path: Path, limit: int = 64 << 20):
    """A file holding one ``term_to_binary`` term (``writers.snapshot``, ``.compaction_group``):
    (term, None) or (None, why)."""
    try:
        raw = read_optional(path, limit)
    except FormatError as e:
        return None, e.message
    if raw is None:
        return None, "missing"
    try:
        return etf.decode(raw, exact=True)[0], None
    except FormatError as e:
        return None, e.message


def read_writers(path: Path) -> tuple[dict[bytes, int], str | None]:
    """``writers.snapshot`` (Ra 3): UId -> the last index the WAL accepted from it. A file that
    does not decode is ignored by the WAL (recover_writers/1 logs a warning): ({}, why)."""
    term, why = read_term_file(path)
    if why is not None:
        return {}, why
    if not isinstance(term, dict):
        return {}, "not a map"
    out = {}
    for k, v in term.items():
        if isinstance(k, bytes) and isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], int):
            out[k] = v[1]
    return out, None


def dump_dets_records(path: Path, segment_entry_count: int | None = None):
    return r_terms.dump_dets(path, segment_entry_count)


def dump_config(path: Path, segment_entry_count: int | None = None):
    cfg = read_config(path)
    if cfg.terms is None:
        yield {"offset": cfg.error_offset or 0, "kind": "problem", "status": cfg.error}, None
        return
    for k, v in cfg.terms.items():
        yield {"offset": 0, "kind": "setting", "id": str(k), "term": etf.format_term(v)}, None


def dump_term_file(path: Path, segment_entry_count: int | None = None):
    term, why = read_term_file(path)
    if why is not None:
        yield {"offset": 0, "kind": "problem", "status": why}, None
    else:
        yield {"offset": 0, "kind": "term", "term": etf.format_term(term)}, None


__all__ = [
    "MetaRecord",
    "NameRecord",
    "ServerConfig",
    "Table",
    "dump_config",
    "dump_dets_records",
    "dump_term_file",
    "read_config",
    "read_meta",
    "read_names",
    "read_term_file",
    "read_writers",
]
