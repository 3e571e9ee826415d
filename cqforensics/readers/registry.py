"""The one dispatch point from a file to its reader.

Every file kind the tool knows is one ``Reader`` line in ``READERS``: where the broker puts it
in a node dir (``where`` and its fixed ``names``, or ``<N><ext>`` when ``numbered``), the
extensions a lone file is recognised by (``dump``), and the reader's entry points. Discovery
(``layout``), the files table, ``dump`` and the writers ask ``kind_of`` / ``READERS`` instead of
matching names themselves, so a new format is one grammar module, one reader module and one
line here.

Places (``where``): ``store`` (``msg_store_persistent`` / ``msg_store_transient``), ``queue``
(a queue dir), ``vhost`` (a vhost dir), ``node`` (the node dir's Mnesia files), ``stream`` (a
stream dir ``<node dir>/stream/<name>/``, whose files osiris names with 20 digits); Ra's (quorum
queues, ``quorum/<node>/``): ``ra_system`` (the system dir: WAL, directory and meta tables),
``ra_server`` (a server's ``<UId>/`` dir: config, segments, compaction files) and ``ra_snapshot``
(a ``snapshots/``, ``checkpoints/`` or ``recovery_checkpoint/`` entry of a server).

``dump`` callables take ``(path, segment_entry_count)`` and yield ``(row, term)`` pairs in file
order: ``row`` is the listing dict, ``term`` is ``None`` or ``(source, start, length)`` locating
the stored message term (``source`` is the buffer the offsets are into, or a ``Path`` to read).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cqforensics.readers import osiris as r_osiris
from cqforensics.readers import qi as r_qi
from cqforensics.readers import qs as r_qs
from cqforensics.readers import ra_segment as r_ra_segment
from cqforensics.readers import ra_snapshot as r_ra_snapshot
from cqforensics.readers import ra_system as r_ra_system
from cqforensics.readers import ra_wal as r_ra_wal
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers import terms as r_terms
from cqforensics.readers import v1 as r_v1

PLACES = ("node", "vhost", "store", "queue", "stream", "ra_system", "ra_server", "ra_snapshot")
_DIGITS = {15: re.compile(r"[0-9]{1,15}"), 16: re.compile(r"[0-9]{1,16}")}  # ASCII digits only (Erlang's
# list_to_integer); at most 15 of them: every number a broker gives a classic-queue file is far below
# 10^15, and N * segment size then fits an int64 (a longer number is an unknown file, never a number that
# overflows the columns). Ra names its files with 16 digits (ra_lib zpad_filename; 8 before Ra 2.16).


@dataclass(frozen=True)
class Reader:
    kind: str
    where: str | None  # PLACES; None: never laid out in a node dir
    doc: str
    names: tuple[str, ...] = ()  # fixed names the broker gives the file at ``where``
    ext: str | None = None  # the ``<N><ext>`` extension when ``numbered``
    numbered: bool = False
    digits: int = 15  # the most digits of ``<N>`` (16: Ra's zero-padded names)
    suffixes: tuple[str, ...] = ()  # extensions a lone file is known by (besides ``ext``)
    read: Callable | None = None  # the reader's entry point
    dump: Callable | None = None  # (path, segment_entry_count) -> Iterator[(row, term)]
    term_span: Callable | None = None  # framing: entry -> (start, length) of its term
    width: int = 0  # a numbered name's digits are exactly this many (zero-padded; osiris: 20), else 1..15

    @property
    def lone_suffixes(self) -> tuple[str, ...]:
        return ((self.ext,) if self.ext else ()) + self.suffixes

    def matches(self, name: str) -> bool:
        """Whether ``name`` is what the broker calls a file of this kind at ``where``."""
        if name in self.names:
            return True
        if self.numbered and name.endswith(self.ext):
            digits = name[: -len(self.ext)]
            if self.width:
                return len(digits) == self.width and digits.isascii() and digits.isdigit()
            return bool(_DIGITS[self.digits].fullmatch(digits))
        return False


READERS: dict[str, Reader] = {
    r.kind: r
    for r in (
        Reader("vhost", "vhost", "vhost name", names=(".vhost",)),
        Reader("config", "vhost", "vhost config (CQv1 segment_entry_count)", names=(".config",)),
        Reader(
            "dets",
            "vhost",
            "DETS table (recovery terms)",
            names=("recovery.dets",),
            suffixes=(".dets",),
            read=r_terms.read_dets_objects,
            dump=r_terms.dump_dets,
        ),
        Reader(
            "rdq",
            "store",
            "shared message store file",
            ext=".rdq",
            numbered=True,
            read=r_rdq.walk,
            dump=r_rdq.dump_rows,
            term_span=r_rdq.term_span,
        ),
        Reader("rdt", "store", "interrupted store combine (<= 3.12)", ext=".rdt", numbered=True),
        Reader("dot", "store", "store clean-shutdown terms", names=("clean.dot",), read=r_terms.clean_dot),
        Reader(
            "ets",
            "store",
            "ets:tab2file dump",
            names=("file_summary.ets", "msg_store_index.ets"),
            suffixes=(".ets",),
            read=r_terms.read_ets,
            dump=r_terms.dump_disk_log,
        ),
        Reader("queue_name", "queue", "queue name", names=(".queue_name",)),
        Reader("qi", "queue", "CQv2 index segment", ext=".qi", numbered=True, read=r_qi.read_qi, dump=r_qi.dump_rows),
        Reader(
            "qs",
            "queue",
            "CQv2 per-queue store segment",
            ext=".qs",
            numbered=True,
            read=r_qs.open_qs,
            dump=r_qs.dump_rows,
            term_span=r_qs.term_span,
        ),
        Reader(
            "idx",
            "queue",
            "CQv1 index segment",
            ext=".idx",
            numbered=True,
            read=r_v1.parse_segment,
            dump=r_v1.dump_segment,
        ),
        Reader(
            "jif",
            "queue",
            "CQv1 index journal",
            names=("journal.jif",),
            suffixes=(".jif",),
            read=r_v1.parse_journal,
            dump=r_v1.dump_journal,
        ),
        Reader(
            "osiris_segment",
            "stream",
            "stream (osiris) segment: chunks of messages and tracking",
            ext=".segment",
            numbered=True,
            width=20,
            read=r_osiris.walk_segment,
            dump=r_osiris.dump_segment,
        ),
        Reader(
            "osiris_index",
            "stream",
            "stream (osiris) index: one record per chunk",
            ext=".index",
            numbered=True,
            width=20,
            read=r_osiris.read_index,
            dump=r_osiris.dump_index,
        ),
        Reader(
            "disk_log",
            "node",
            "Mnesia disk_log (table dump, table log, transaction log)",
            suffixes=(".DCD", ".DCL", ".LOG"),
            read=r_terms.read_disk_log,
            dump=r_terms.dump_disk_log,
        ),
        Reader(
            "ra_wal",
            "ra_system",
            "Ra write-ahead log (every quorum queue's recent log entries)",
            ext=".wal",
            numbered=True,
            digits=16,
            read=r_ra_wal.walk,
            dump=r_ra_wal.dump_rows,
        ),
        Reader(
            "ra_names",
            "ra_system",
            "Ra directory: server name -> UId (DETS)",
            names=("names.dets",),
            read=r_ra_system.read_names,
            dump=r_ra_system.dump_dets_records,
        ),
        Reader(
            "ra_meta",
            "ra_system",
            "Ra servers' current term, vote and last applied index (DETS)",
            names=("meta.dets",),
            read=r_ra_system.read_meta,
            dump=r_ra_system.dump_dets_records,
        ),
        Reader(
            "ra_writers",
            "ra_system",
            "Ra 3 WAL writers' last indexes",
            names=("writers.snapshot",),
            read=r_ra_system.read_writers,
            dump=r_ra_system.dump_term_file,
        ),
        Reader(
            "ra_marker",
            "ra_system",
            "Ra 2.16+ marker: WAL and segment names upgraded to 16 digits",
            names=("segment_name_upgrade_marker",),
        ),
        Reader(
            "ra_config",
            "ra_server",
            "Ra server config (the quorum queue's settings)",
            names=("config",),
            read=r_ra_system.read_config,
            dump=r_ra_system.dump_config,
        ),
        Reader(
            "ra_segment",
            "ra_server",
            "Ra log segment (entries flushed from the WAL)",
            ext=".segment",
            numbered=True,
            digits=16,
            read=r_ra_segment.read_segment,
            dump=r_ra_segment.dump_rows,
        ),
        Reader(
            "ra_compacting",
            "ra_server",
            "Ra 3 segment being compacted (a leftover: its compaction did not finish)",
            ext=".compacting",
            numbered=True,
            digits=16,
            read=r_ra_segment.read_segment,
            dump=r_ra_segment.dump_rows,
        ),
        Reader(
            "ra_compaction_group",
            "ra_server",
            "Ra 3 compaction in progress: the segments it merges",
            ext=".compaction_group",
            numbered=True,
            digits=16,
            read=r_ra_system.read_term_file,
            dump=r_ra_system.dump_term_file,
        ),
        Reader(
            "ra_snapshot",
            "ra_snapshot",
            "Ra snapshot (a machine state at an index; also checkpoints)",
            names=("snapshot.dat",),
            read=r_ra_snapshot.read_snapshot,
            dump=r_ra_snapshot.dump_rows,
        ),
        Reader(
            "ra_indexes",
            "ra_snapshot",
            "Ra 3 live indexes kept below a snapshot",
            names=("indexes",),
            read=r_ra_snapshot.read_indexes,
        ),
    )
}


_LOOKUP: tuple | None = None


def _lookup() -> tuple[dict, dict, dict]:
    """``READERS`` as lookups (made again when ``READERS`` is replaced or grows): (place, fixed
    name) -> kind, (place, extension) -> kind of the numbered files there, and place -> those
    kinds. A node dir of many queue dirs asks about every file it lists."""
    global _LOOKUP
    if _LOOKUP is None or _LOOKUP[0] is not READERS or _LOOKUP[1] != len(READERS):
        fixed = {(r.where, n): r.kind for r in READERS.values() for n in r.names}
        by_ext = {(r.where, r.ext): r.kind for r in READERS.values() if r.numbered}
        kinds = {w: [r.kind for r in READERS.values() if r.where == w and r.numbered] for w in PLACES}
        _LOOKUP = (READERS, len(READERS), fixed, by_ext, kinds)
    return _LOOKUP[2:]


def numbered_kinds(where: str) -> list[str]:
    """The kinds of numbered files the broker puts at ``where``, in registry order."""
    return _lookup()[2].get(where, [])


def _name(path: Path | str) -> str:
    return path if type(path) is str and "/" not in path else Path(path).name


def placed(name: str, where: str) -> tuple[str, int | None] | None:
    """(kind, N or None) of the file named ``name`` (a name, not a path) at ``where``, by its
    exact name: ``kind_of`` and ``numbered`` in one look."""
    fixed, by_ext, _ = _lookup()
    kind = fixed.get((where, name))
    if kind is not None:
        return kind, None
    dot = name.rfind(".")
    if dot > 0:
        kind = by_ext.get((where, name[dot:]))
        if kind is not None and READERS[kind].matches(name):  # its digits as the kind names them
            return kind, int(name[:dot])
    return None


def kind_of(path: Path | str, where: str | None = None) -> str | None:
    """The kind of the file at ``path``, or None.

    With ``where`` (one of PLACES): only what the broker puts there, by its exact name.
    Without: the exact name first, then the extension (a lone, possibly renamed file)."""
    name = _name(path)
    if where is not None:
        hit = placed(name, where)
        return hit[0] if hit is not None else None
    for r in READERS.values():
        if (where is None or r.where == where) and r.matches(name):
            return r.kind
    if where is None:
        suffix = Path(path).suffix
        for r in READERS.values():
            if suffix and suffix in r.lone_suffixes:
                return r.kind
    return None


def number_of(path: Path | str) -> int | None:
    """N of a numbered file ``<N><ext>`` of a known kind, else None."""
    name = Path(path).name
    for r in READERS.values():
        if r.numbered and r.matches(name):
            return int(name[: -len(r.ext)])
    return None


def numbered(path: Path | str, where: str | None = None) -> tuple[str, int] | None:
    """(kind, N) when ``path`` is a numbered file ``<N><ext>`` (at ``where``), else None."""
    if where is not None:
        hit = placed(_name(path), where)
        return hit if hit is not None and hit[1] is not None else None
    kind = kind_of(path, where)
    if kind is None or not READERS[kind].numbered:
        return None
    return kind, number_of(path)


def fixed_names(where: str) -> list[tuple[str, str]]:
    """(name, kind) of the fixed-name files the broker keeps at ``where``, in registry order."""
    return [(n, r.kind) for r in READERS.values() if r.where == where for n in r.names]


def other_kind(path: Path | str, where: str) -> str:
    """The kind a listing shows for a file discovery left aside at ``where`` (not a numbered
    data file): its fixed-name kind, else ``unknown``."""
    kind = kind_of(path, where)
    return kind if kind is not None and not READERS[kind].numbered else "unknown"


def file_name(kind: str, number: int | None = None) -> str:
    """The name the broker gives a file of ``kind`` (``<N><ext>`` for a numbered kind), for
    the writers."""
    r = READERS[kind]
    if r.numbered:
        if number is None:
            raise ValueError(f"{kind} files are numbered")
        return f"{number:0{r.width}d}{r.ext}"
    return r.names[0]


def dumpable() -> list[str]:
    """The extensions ``dump`` accepts, sorted."""
    return sorted({s for r in READERS.values() if r.dump is not None for s in r.lone_suffixes})


def reader(kind: str) -> Reader:
    return READERS[kind]


__all__ = [
    "PLACES",
    "READERS",
    "Reader",
    "dumpable",
    "file_name",
    "fixed_names",
    "kind_of",
    "number_of",
    "numbered",
    "numbered_kinds",
    "other_kind",
    "placed",
    "reader",
]
