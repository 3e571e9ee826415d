"""Find node dirs under any path and map their vhost and queue dirs to names.

Accepted inputs: a node dir (``.../mnesia/rabbit@host``, the dir holding ``msg_stores/vhosts``),
a mnesia base holding several nodes, or any folder of backups holding such dirs at any depth.
Names come from ``.vhost`` and ``.queue_name`` and are checked against the md5/base-36 dir
names; a queue dir without a usable ``.queue_name`` is named from the durable-queue metadata
when its hash matches (see ``NodeDir.resolve_names``).

Layout per VH/IDX2 (rabbitmq-formats.md section 1). Nothing here reads more than the small
text files; the data files are only listed, classified by the reader registry
(``cqforensics.readers.registry.kind_of``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from cqforensics import textfiles
from cqforensics.errors import FormatError, OperationalError, display
from cqforensics.grammar.idx import LEGACY_SEGMENT_ENTRY_COUNT
from cqforensics.readers import files as r_files
from cqforensics.readers import registry

STORES = ("persistent", "transient")


@dataclass
class FileProblem:
    """Something wrong with a small text file or a dir name (becomes a finding)."""

    code: str
    path: Path
    message: str
    offset: int | None = None


@dataclass
class StoreDir:
    """One shared message store (``msg_store_persistent`` or ``msg_store_transient``)."""

    kind: str
    path: Path
    rdq: list[tuple[int, Path]] = field(default_factory=list)  # numerically sorted
    rdt: list[tuple[int, Path]] = field(default_factory=list)  # <= 3.12 interrupted combines
    others: list[Path] = field(default_factory=list)
    numbered: dict[str, list[tuple[int, Path]]] = field(default_factory=dict)  # every <N>.<ext> file, by kind

    @property
    def clean_dot(self) -> Path:
        return self.path / "clean.dot"

    @property
    def file_summary(self) -> Path:
        return self.path / "file_summary.ets"

    @property
    def msg_store_index(self) -> Path:
        return self.path / "msg_store_index.ets"


@dataclass
class QueueDir:
    path: Path
    dir_name: str
    name: str | None = None  # without the priority suffix
    name_raw: bytes | None = None  # as stored (priority suffix included)
    priority: int | None = None
    name_source: str | None = None  # ".queue_name", "metadata" or None
    index_hint: str | None = None  # "v2" when .queue_name says so
    qi: list[tuple[int, Path]] = field(default_factory=list)
    qs: dict[int, Path] = field(default_factory=dict)
    idx: list[tuple[int, Path]] = field(default_factory=list)
    journal: Path | None = None
    others: list[Path] = field(default_factory=list)
    numbered: dict[str, list[tuple[int, Path]]] = field(default_factory=dict)  # every <N>.<ext> file, by kind

    @property
    def index_version(self) -> int | None:
        """2 when the dir holds .qi segments (a half-converted dir holds both), 1 for .idx or a
        journal only, None for an empty dir."""
        if self.qi:
            return 2
        if self.idx or self.journal is not None:
            return 1
        return 2 if self.index_hint == "v2" else None

    @property
    def label(self) -> str:
        return self.name if self.name is not None else f"?{display(self.dir_name)}"


@dataclass
class VhostDir:
    path: Path
    dir_name: str
    name: str | None = None
    name_raw: bytes | None = None  # the vhost's name: its .vhost when that names this dir, else the metadata's
    stored_name: bytes | None = None  # what its .vhost holds (read_name_file: None when absent or too long)
    segment_entry_count: int = LEGACY_SEGMENT_ENTRY_COUNT  # CQv1 only (VH read_config)
    stores: dict[str, StoreDir] = field(default_factory=dict)
    queues: list[QueueDir] = field(default_factory=list)
    problems: list[FileProblem] = field(default_factory=list)
    others: list[Path] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.name if self.name is not None else f"?{display(self.dir_name)}"

    @property
    def recovery_dets(self) -> Path:
        return self.path / "recovery.dets"


@dataclass(frozen=True)
class StorageKind:
    """A kind of queue storage a RabbitMQ node dir can hold, and whether cqforensics reads it.

    Every front end says which queues of a kind it does not read exist (fsck's exit code says
    its check is incomplete): nothing about them is a silent all-clear. A reader of a new kind
    flips its ``read`` to True (``STORAGE_KINDS``) once its queues are in the tables."""

    name: str  # "classic", "quorum", "stream"
    queue_type: str  # the type field of the queue's #amqqueue{} record in the metadata store
    noun: str  # one queue of the kind, in text ("quorum queue")
    read: bool  # whether cqforensics reads its messages
    #: the kind's per-queue data dirs under the node dir (a glob): a classic queue's index dir; a
    #: quorum queue member's Ra server dir (ra_env:server_data_dir of the quorum_queues Ra system);
    #: a stream's osiris dir. Ra's system files beside the server dirs (WAL, DETS tables) hold no
    #: queue by themselves: a node that never had a quorum queue has them too.
    data: str

    @property
    def root(self) -> str:
        """The dir under the node dir that holds the kind's data."""
        return self.data.split("/*", 1)[0]

    def data_dirs(self, node_path: Path) -> list[Path]:
        """The kind's per-queue data dirs on this node (never following a symlink)."""
        try:
            return sorted(p for p in node_path.glob(self.data) if p.is_dir() and not p.is_symlink())
        except OSError:
            return []


#: the kinds of queue storage (rabbit_queue_type: classic, quorum, stream); ``read`` says which
#: cqforensics reads. The quorum and stream readers set theirs to True.
STORAGE_KINDS: dict[str, StorageKind] = {k.name: k for k in (
    StorageKind("classic", "rabbit_classic_queue", "classic queue", True, "msg_stores/vhosts/*/queues/*"),
    StorageKind("quorum", "rabbit_quorum_queue", "quorum queue", False, "quorum/*/*"),
    StorageKind("stream", "rabbit_stream_queue", "stream", False, "stream/*"),
)}


def storage_kind(queue_type: str | None) -> StorageKind | None:
    """The kind of a queue whose metadata record has ``queue_type`` (None: a record older than
    queue types, a classic queue); None for a type no kind names (a plugin's)."""
    if queue_type is None:
        return STORAGE_KINDS["classic"]
    return next((k for k in STORAGE_KINDS.values() if k.queue_type == str(queue_type)), None)


@dataclass
class NodeDir:
    path: Path
    node: str  # label: the dir name (rabbit@host), or a relative path when names repeat
    vhosts: list[VhostDir] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name

    def unread_storage(self) -> dict[str, list[Path]]:
        """Kind name -> the data dirs of each kind cqforensics does not read (``STORAGE_KINDS``)
        that this node holds; kinds without any are left out."""
        out = {}
        for kind in STORAGE_KINDS.values():
            if not kind.read:
                dirs = kind.data_dirs(self.path)
                if dirs:
                    out[kind.name] = dirs
        return out


#: the most bytes a name file (``.vhost``, ``.queue_name``) may hold: the broker writes a name
#: (plus two labels for a queue), and no vhost or queue name comes near this; a longer file is
#: damage, read only this far and named by nothing
NAME_FILE_LIMIT = 1 << 20


def read_name_file(path: Path, problems: list[FileProblem], what: str) -> bytes | None:
    """The bytes of a name file (``what``: ``.vhost`` or ``.queue_name``), the one reading of it
    every layer uses; None when absent, not a regular file, or longer than ``NAME_FILE_LIMIT``
    (then a ``missing-queue-name`` problem: what it holds is no name, the start of it is not one
    either)."""
    raw = _read_small(path, problems, NAME_FILE_LIMIT + 1)
    if raw is not None and len(raw) > NAME_FILE_LIMIT:
        problems.append(FileProblem("missing-queue-name", path, f"{what} holds more than {NAME_FILE_LIMIT} bytes: "
                                    "longer than any name the broker writes there (damaged); no name is read from it",
                                    NAME_FILE_LIMIT))
        return None
    return raw


def _read_small(path: Path, problems: list[FileProblem], limit: int = 1 << 20) -> bytes | None:
    """The first ``limit`` bytes of a small text file; None when absent or not a regular file
    (a FIFO would block ``open()`` forever: it becomes a ``not-regular-file`` problem, unread)."""
    try:
        return r_files.read_optional(path, limit)
    except r_files.NotRegularFile as e:
        _not_regular(problems, path, e.message)
        return None


def _not_regular(problems: list[FileProblem], path: Path, message: str) -> None:
    if not any(p.code == "not-regular-file" and p.path == path for p in problems):  # once per file
        problems.append(FileProblem("not-regular-file", path, message))


def _listdir(path: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise OperationalError(f"{display(path)}: cannot list: {e.strerror}") from e


def _is_dir(e: os.DirEntry) -> bool:
    try:
        return e.is_dir()
    except OSError:  # a symlink loop, a dir we may not stat
        return False


def _special(entries, problems: list[FileProblem]) -> list[os.DirEntry]:
    """``entries`` without those that are neither a dir nor a regular file (FIFOs, sockets,
    devices, dangling or looping symlinks), each reported as a ``not-regular-file`` problem:
    nothing ever opens them."""
    keep = []
    for e in entries:
        try:
            what = None if _is_dir(e) else r_files.file_type(e.path)
        except OSError as err:
            what = f"unreadable ({err.strerror})"
        if what is None:
            keep.append(e)
        else:
            _not_regular(problems, Path(e.path), f"{what}, not a regular file: never read")
    return keep


def _numbered(entries, where: str) -> dict[str, list[tuple[int, Path]]]:
    """The numbered data files (``<N>.<ext>``) the registry places at ``where``, per kind."""
    out: dict[str, list[tuple[int, Path]]] = {r.kind: [] for r in registry.READERS.values()
                                              if r.where == where and r.numbered}
    for e in entries:
        hit = registry.numbered(e.name, where)
        if hit is not None and r_files.is_regular(e.path):
            out[hit[0]].append((hit[1], Path(e.path)))
    for v in out.values():
        v.sort()
    return out


def read_queue_dir(path: Path, vhost_raw: bytes | None, problems: list[FileProblem]) -> QueueDir:
    q = QueueDir(path=path, dir_name=path.name)
    entries = _special(_listdir(path), problems)
    q.numbered = files = _numbered(entries, "queue")
    q.qi, q.idx = files["qi"], files["idx"]
    q.qs = dict(files["qs"])
    known = {p for v in files.values() for _, p in v}
    for e in entries:
        p = Path(e.path)
        kind = registry.kind_of(e.name, "queue")
        if kind == "jif":
            q.journal = p
        elif kind != "queue_name" and p not in known:
            q.others.append(p)
    raw = read_name_file(path / ".queue_name", problems, ".queue_name")
    if raw is None and not any(p.path == path / ".queue_name" for p in problems):
        problems.append(FileProblem("missing-queue-name", path / ".queue_name", "queue dir has no .queue_name"))
        return q
    if raw is None:
        return q
    try:
        qn = textfiles.parse_queue_name(raw, vhost_raw)
    except FormatError as e:
        problems.append(FileProblem("missing-queue-name", path / ".queue_name",
                                    f"unreadable .queue_name: {e.message}", e.offset))
        return q
    q.index_hint = qn.index
    if vhost_raw is not None and qn.vhost != vhost_raw:
        problems.append(FileProblem("queue-dir-mismatch", path / ".queue_name",
                                    f".queue_name names vhost {qn.vhost!r}, the dir is in {vhost_raw!r}"))
    expected = textfiles.queue_dir_name(vhost_raw if vhost_raw is not None else qn.vhost, qn.name)
    if expected != path.name:
        problems.append(FileProblem("queue-dir-mismatch", path,
                                    f".queue_name says {qn.name!r}, whose dir would be {expected}"))
        return q
    q.name_raw, q.priority = qn.name, qn.priority
    q.name = qn.base.decode("utf-8", "replace")
    q.name_source = ".queue_name"
    return q


def read_vhost_dir(path: Path) -> VhostDir:
    v = VhostDir(path=path, dir_name=path.name)
    raw = read_name_file(path / ".vhost", v.problems, ".vhost")
    v.stored_name = raw
    if raw is None and v.problems:
        pass
    elif raw is None:
        v.problems.append(FileProblem("missing-queue-name", path / ".vhost", "vhost dir has no .vhost"))
    elif textfiles.vhost_dir_name(raw) != path.name:
        v.problems.append(FileProblem("queue-dir-mismatch", path / ".vhost",
                                      f".vhost says {raw[:200]!r}{'...' if len(raw) > 200 else ''} ({len(raw)} "
                                      f"bytes), whose dir would be {textfiles.vhost_dir_name(raw)}"))
    else:
        v.name_raw, v.name = raw, raw.decode("utf-8", "replace")
    cfg = _read_small(path / ".config", v.problems)
    if cfg is not None:
        hit = textfiles.text_damage(cfg, ".config")
        if hit is not None:
            v.problems.append(FileProblem("term-file-damaged", path / ".config", f".config: {hit[0]}", hit[1]))
        try:
            count = textfiles.segment_entry_count(cfg)
        except FormatError:  # the damage is the finding above
            count = None
        if count is not None:
            v.segment_entry_count = count
    for e in _special(_listdir(path), v.problems):
        p = Path(e.path)
        if e.name.startswith("msg_store_") and _is_dir(e) and e.name[10:] in STORES:
            kind = e.name[10:]
            store = StoreDir(kind=kind, path=p)
            entries = _special(_listdir(p), v.problems)
            store.numbered = files = _numbered(entries, "store")
            store.rdq, store.rdt = files["rdq"], files["rdt"]
            numbered = {q for v in files.values() for _, q in v}
            store.others = [Path(x.path) for x in entries if Path(x.path) not in numbered]
            v.stores[kind] = store
        elif e.name == "queues" and _is_dir(e):
            for qe in _special(_listdir(p), v.problems):
                if _is_dir(qe):
                    v.queues.append(read_queue_dir(Path(qe.path), v.name_raw, v.problems))
                else:
                    v.others.append(Path(qe.path))
        elif registry.kind_of(e.name, "vhost") is None:
            v.others.append(p)
    return v


def read_node_dir(path: Path, label: str | None = None) -> NodeDir:
    node = NodeDir(path=path, node=label or path.name)
    for e in _listdir(path / "msg_stores" / "vhosts"):
        if _is_dir(e):
            node.vhosts.append(read_vhost_dir(Path(e.path)))
    return node


def is_node_dir(path: Path) -> bool:
    return (path / "msg_stores" / "vhosts").is_dir()


def find_node_dirs(root: Path, max_depth: int = 8) -> list[Path]:
    """Node dirs at or below ``root`` (not descending into a node dir), in sorted order."""
    if is_node_dir(root):
        return [root]
    found = []

    def unreadable(e: OSError):  # a dir we cannot list may hold a node dir: never skipped silently
        raise OperationalError(f"{display(e.filename or root)}: cannot list: {e.strerror or e}") from e

    for dirpath, dirnames, _ in os.walk(root, onerror=unreadable):
        dirnames.sort()
        depth = len(Path(dirpath).relative_to(root).parts)
        keep = []
        for d in dirnames:
            p = Path(dirpath) / d
            if is_node_dir(p):
                found.append(p)
            elif depth < max_depth and d != "msg_stores":
                keep.append(d)
        dirnames[:] = keep
    return found


def tree_bytes(path: Path) -> int:
    """The bytes of the regular files under ``path`` (what a command reading it will go through;
    for progress), never following links, skipping what cannot be listed."""
    total, stack = 0, [path]
    while stack:
        for e in _listdir(stack.pop()):
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(Path(e.path))
                elif e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return total


def discover(paths) -> list[NodeDir]:
    """Every node dir under ``paths`` (a path or a list), labelled uniquely, in input order."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    roots = []
    for p in paths:
        p = Path(p).absolute()
        try:
            p.stat()
        except FileNotFoundError as e:
            raise OperationalError(f"{display(p)}: no such file or directory") from e
        except OSError as e:  # a symlink loop (ELOOP), a dir we may not enter
            raise OperationalError(f"{display(p)}: cannot read: {e.strerror or e}") from e
        if not p.is_dir():
            raise OperationalError(f"{p}: not a directory (give a node dir, a mnesia base or a folder of backups)")
        found = find_node_dirs(p)
        if not found:
            raise OperationalError(f"{p}: no RabbitMQ node directory (one holding msg_stores/vhosts) found")
        roots += [(p, f) for f in found]
    seen: dict[Path, None] = {}
    unique = [(r, f) for r, f in roots if not (f in seen or seen.setdefault(f, None))]
    names = [f.name for _, f in unique]
    dup = {n for n in names if names.count(n) > 1}
    common = Path(os.path.commonpath([str(f) for _, f in unique])) if len(unique) > 1 else None
    nodes = []
    for _, f in unique:
        label = f.name
        if f.name in dup and common is not None:
            label = f.relative_to(common).as_posix()
        nodes.append(read_node_dir(f, label))
    return nodes
