"""Find node dirs under any path and map their vhost and queue dirs to names.

Accepted inputs: a node dir (``.../mnesia/rabbit@host``, the dir holding ``msg_stores/vhosts``),
a mnesia base holding several nodes, or any folder of backups holding such dirs at any depth.
Names come from ``.vhost`` and ``.queue_name`` and are checked against the md5/base-36 dir
names; a queue dir without a usable ``.queue_name`` is named from the durable-queue metadata
when its hash matches (see ``NodeDir.resolve_names``).

Layout per VH/IDX2 (docs/formats/classic.md §1). Nothing here reads more than the small
text files; the data files are only listed, classified by the reader registry
(``cqforensics.readers.registry.kind_of``).
"""

from __future__ import annotations

import operator
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from cqforensics.base import heap
from cqforensics.base.errors import FormatError, OperationalError, display
from cqforensics.codecs import textfiles
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


class Problems(list):
    """A vhost dir's problems, in the order found, remembering the paths already reported as
    not regular files (each is reported once, however often it is met: a check against the
    whole list each time would cost per problem as many steps as there are problems)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.not_regular: set[Path] = {p.path for p in self if p.code == "not-regular-file"}


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
    stub: bytes | None = field(default=None, repr=False)  # the .queue_name's bytes, as read (up to 1 MiB)
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
    problems: list[FileProblem] = field(default_factory=lambda: Problems())
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
#: cqforensics reads: classic queues; quorum queues (their Ra logs, docs/quorum.md) and streams
#: (osiris, docs/streams.md) in every front end (tables, fsck, report, export, audit, republish,
#: Spark; compact and rebuild carry quorum/ and stream/ over as they are).
STORAGE_KINDS: dict[str, StorageKind] = {
    k.name: k
    for k in (
        StorageKind("classic", "rabbit_classic_queue", "classic queue", True, "msg_stores/vhosts/*/queues/*"),
        StorageKind("quorum", "rabbit_quorum_queue", "quorum queue", True, "quorum/*/*"),
        StorageKind("stream", "rabbit_stream_queue", "stream", True, "stream/*"),
    )
}


def storage_kind(queue_type: str | None) -> StorageKind | None:
    """The kind of a queue whose metadata record has ``queue_type`` (None: a record older than
    queue types, a classic queue); None for a type no kind names (a plugin's)."""
    if queue_type is None:
        return STORAGE_KINDS["classic"]
    return next((k for k in STORAGE_KINDS.values() if k.queue_type == str(queue_type)), None)


@dataclass
class RaSnapshotDir:
    """One entry of a server's ``snapshots/``, ``checkpoints/`` or ``recovery_checkpoint/``:
    ``<Term>_<Index>/`` holding ``snapshot.dat`` (and Ra 3's ``indexes``)."""

    kind: str  # snapshot / checkpoint / recovery_checkpoint
    path: Path
    snapshot: Path | None = None
    indexes: Path | None = None
    others: list[Path] = field(default_factory=list)


@dataclass
class RaServerDir:
    """A Ra server's data dir ``<system>/<UId>/`` (one per quorum queue member on this node)."""

    path: Path
    uid: str
    config: Path | None = None
    segments: list[tuple[int, Path]] = field(default_factory=list)  # numerically sorted
    snapshots: list[RaSnapshotDir] = field(default_factory=list)  # snapshots, checkpoints, recovery checkpoints
    compaction: list[Path] = field(default_factory=list)  # Ra 3 leftovers: .compaction_group, .compacting, .link
    others: list[Path] = field(default_factory=list)


@dataclass
class RaSystemDir:
    """A Ra system's dir: ``quorum/<node>/`` (quorum queues; ``coordination/<node>/`` holds
    Khepri and the stream coordinator and is not read as a queue store)."""

    path: Path
    wal: list[tuple[int, Path]] = field(default_factory=list)  # numerically sorted (recovery order)
    names: Path | None = None
    meta: Path | None = None
    writers: Path | None = None
    servers: list[RaServerDir] = field(default_factory=list)
    others: list[Path] = field(default_factory=list)
    problems: list[FileProblem] = field(default_factory=list)


class Listing:
    """What one discovery listed and read whole, for a later walk of the same tree in the same
    command (the inputs manifest, ``output.provenance``), which then neither lists those dirs
    nor opens those files again: at 20,000 queue dirs, each one's listing and ``.queue_name``
    were otherwise asked of the kernel twice (about 9 system calls and 30 µs a dir).

    ``dirs``: a dir's path as text -> its entries as listed (``os.DirEntry``: what each is, as
    the listing told, no stat); ``files``: a file's path as text -> ``(size, bytes)`` of a
    regular file read whole whose blocks cover its size (so no hole the manifest would list)."""

    __slots__ = ("dirs", "files")

    def __init__(self):
        self.dirs: dict[str, list[os.DirEntry]] = {}
        self.files: dict[str, tuple[int, bytes]] = {}

    def __reduce__(self):
        """Pickled empty (a ``DirEntry`` cannot be pickled, and a listing is only what this
        process saw): a NodeDir sent to another process lists again what it walks."""
        return (Listing, ())


@dataclass
class NodeDir:
    path: Path
    node: str  # label: the dir name (rabbit@host), or a relative path when names repeat
    vhosts: list[VhostDir] = field(default_factory=list)
    quorum: list[RaSystemDir] = field(default_factory=list)  # quorum/<node>/ (normally one)
    #: coordination/<node>/: Khepri (the metadata store, 4.2+ by default) and the stream coordinator
    coordination: list[RaSystemDir] = field(default_factory=list)
    #: what its discovery listed and read (shared by the nodes of one ``discover``)
    listing: Listing | None = field(default=None, repr=False, compare=False)

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


def read_name_file(
    path: Path, problems: list[FileProblem], what: str, listed: bool = False, where: str | None = None
) -> bytes | None:
    """The bytes of a name file (``what``: ``.vhost`` or ``.queue_name``), the one reading of it
    every layer uses; None when absent, not a regular file, or longer than ``NAME_FILE_LIMIT``
    (then a ``missing-queue-name`` problem: what it holds is no name, the start of it is not one
    either). ``listed``: a listing just showed it as a regular file, not a symlink; ``where``:
    ``path`` as text, when the caller has it (a path's text is made anew for each new Path)."""
    raw = _read_small(path, problems, NAME_FILE_LIMIT + 1, listed=listed, where=where)
    if raw is not None and len(raw) > NAME_FILE_LIMIT:
        problems.append(
            FileProblem(
                "missing-queue-name",
                path,
                f"{what} holds more than {NAME_FILE_LIMIT} bytes: "
                "longer than any name the broker writes there (damaged); no name is read from it",
                NAME_FILE_LIMIT,
            )
        )
        return None
    return raw


def _plain_file(e: os.DirEntry) -> bool:
    """A regular file that is no symlink, as the listing tells."""
    try:
        return e.is_file(follow_symlinks=False)
    except OSError:
        return False


def _read_small(
    path: Path, problems: list[FileProblem], limit: int = 1 << 20, listed: bool = False, where: str | None = None
) -> bytes | None:
    """The first ``limit`` bytes of a small text file; None when absent or not a regular file
    (a FIFO would block ``open()`` forever: it becomes a ``not-regular-file`` problem, unread).
    ``listed``: a listing just showed it as a regular file, not a symlink; ``where``: ``path``
    as text."""
    try:
        return r_files.read_optional(path if where is None else where, limit, listed=listed)
    except r_files.NotRegularFile as e:
        _not_regular(problems, path, e.message)
        return None


def _not_regular_paths(problems: list[FileProblem]) -> set[Path]:
    return (
        problems.not_regular
        if isinstance(problems, Problems)
        else {p.path for p in problems if p.code == "not-regular-file"}
    )


def _not_regular(problems: list[FileProblem], path: Path, message: str) -> None:
    seen = _not_regular_paths(problems)
    if path not in seen:  # once per file
        seen.add(path)
        problems.append(FileProblem("not-regular-file", path, message))


def _listdir(path: Path | str) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise OperationalError(f"{display(path)}: cannot list: {e.strerror}") from e
    if len(entries) > 1:  # most queue dirs hold one file: nothing to sort
        entries.sort(key=_NAME)
    return entries


_NAME = operator.attrgetter("name")


def _is_dir(e: os.DirEntry) -> bool:
    try:
        return e.is_dir()
    except OSError:  # a symlink loop, a dir we may not stat
        return False


_CHILD = getattr(Path, "_make_child_relpath", None)


def _child(parent: Path, name: str) -> Path:
    """``parent / name`` for a name just listed in ``parent`` (one component): pathlib's own
    shortcut for the children it lists, where there is one (parsing a whole path again costs
    more than the rest of what a queue dir's listing does)."""
    return _CHILD(parent, name) if _CHILD is not None else parent / name


def _is_file(e: os.DirEntry) -> bool:
    """A regular file (symlinks followed), as the listing tells."""
    try:
        return e.is_file()
    except OSError:
        return False


def _special(entries, problems: list[FileProblem], where: str | None = None) -> list[os.DirEntry]:
    """``entries`` without those that are neither a dir nor a regular file (FIFOs, sockets,
    devices, dangling or looping symlinks), each reported as a ``not-regular-file`` problem:
    nothing ever opens them. ``where`` (a registry place): a dir named like a file the broker
    keeps there is one too (its file lost, and something else in its place)."""
    keep = []
    for e in entries:
        try:
            if e.is_file():  # told by the listing itself (a stat only for a symlink)
                keep.append(e)
                continue
            if e.is_dir():
                if where is not None and registry.placed(e.name, where) is not None:
                    _not_regular(problems, Path(e.path), "a directory, not a regular file: never read")
                else:
                    keep.append(e)
                continue
        except OSError:
            pass
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
    out: dict[str, list[tuple[int, Path]]] = {kind: [] for kind in registry.numbered_kinds(where)}
    for e in entries:
        hit = registry.numbered(e.name, where)
        if hit is not None and _is_file(e):
            out[hit[0]].append((hit[1], Path(e.path)))
    for v in out.values():
        v.sort()
    return out


def read_queue_dir(
    path: Path,
    vhost_raw: bytes | None,
    problems: list[FileProblem],
    where: str | None = None,
    listing: Listing | None = None,
    name: str | None = None,
) -> QueueDir:
    """A queue dir, listed, and its ``.queue_name`` read and checked against the dir's name.
    ``where``: ``path`` as text, and ``name`` the dir's name, when the caller has them (the
    listing's entry): a node may hold tens of thousands of queue dirs, and each step here is
    paid once per dir. ``listing``: where to keep the dir's entries and its ``.queue_name``'s
    bytes for the inputs manifest."""
    if where is None:
        where = os.fspath(path)
    if name is None:
        name = os.path.basename(where)
    entries = _listdir(where)
    if listing is not None:
        listing.dirs[where] = entries
    if len(entries) == 1 and entries[0].name == ".queue_name" and vhost_raw is not None:
        q = _named_queue_dir(path, name, entries[0], vhost_raw, listing)
        if q is not None:
            return q
    return _read_queue_dir(path, vhost_raw, problems, where, entries)


#: how a ``.queue_name`` the listing showed as a regular file is opened (``readers.files``'s
#: flags for a listed file: no link followed, never blocking)
_LISTED_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
#: the most bytes of a ``.queue_name`` read by the short way (``_named_queue_dir``): one read
_ONE_READ = 1 << 16


def _named_queue_dir(path: Path, dir_name: str, e: os.DirEntry, vhost_raw: bytes, listing: Listing | None):
    """The queue dir of most nodes, by the short way: it holds only its ``.queue_name``, a
    regular file read in one ``read``, well formed, naming this vhost and this dir. None for
    anything else, which ``_read_queue_dir`` reads again and says what is wrong (the same
    QueueDir either way: this path only leaves out steps that find nothing here)."""
    try:
        if not e.is_file(follow_symlinks=False):
            return None
        fd = os.open(e.path, _LISTED_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size >= _ONE_READ:
            return None
        raw = os.read(fd, _ONE_READ)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) != st.st_size:  # changing under us: the long way says what it holds
        return None
    try:
        qn = textfiles.parse_queue_name(raw, vhost_raw)
    except FormatError:
        return None
    if qn.vhost != vhost_raw or textfiles.queue_dir_name(vhost_raw, qn.name) != dir_name:
        return None
    if listing is not None and st.st_blocks * 512 >= st.st_size:
        listing.files[e.path] = (st.st_size, raw)
    files = {kind: [] for kind in registry.numbered_kinds("queue")}
    priority = qn.priority
    return QueueDir(
        path=path,
        dir_name=dir_name,
        name=(qn.name[:-2] if priority is not None else qn.name).decode("utf-8", "replace"),
        name_raw=qn.name,
        priority=priority,
        name_source=".queue_name",
        index_hint=qn.index,
        stub=raw,
        qi=files["qi"],
        idx=files["idx"],
        numbered=files,
    )


def _read_queue_dir(
    path: Path, vhost_raw: bytes | None, problems: list[FileProblem], where: str, entries: list[os.DirEntry]
) -> QueueDir:
    """``read_queue_dir`` of any queue dir (``entries``: its listing): every file placed, every
    problem said."""
    q = QueueDir(path=path, dir_name=os.path.basename(where))
    q.numbered = files = {kind: [] for kind in registry.numbered_kinds("queue")}
    listed = None  # the .queue_name the listing shows
    for e in _special(entries, problems, "queue"):
        if e.name == ".queue_name":  # the one file of most queue dirs (an empty queue's)
            listed = e
            continue
        hit = registry.placed(e.name, "queue")
        kind = hit[0] if hit is not None else None
        if kind == "queue_name":
            listed = e
        elif kind == "jif":
            q.journal = _child(path, e.name)
        elif hit is not None and hit[1] is not None and _is_file(e):
            files[kind].append((hit[1], _child(path, e.name)))
        else:
            q.others.append(_child(path, e.name))
    for v in files.values():
        v.sort()
    q.qi, q.idx = files["qi"], files["idx"]
    q.qs = dict(files["qs"])
    stub = _child(path, ".queue_name")
    # the listing tells whether there is one to read: a regular file (not a link) is opened
    # without a stat first (its open and fstat still check it), an absent one is not asked for
    before = len(problems)
    raw = (
        None
        if listed is None and stub not in _not_regular_paths(problems)
        else read_name_file(
            stub,
            problems,
            ".queue_name",
            listed=listed is not None and _plain_file(listed),
            where=listed.path if listed is not None else None,
        )
    )
    if raw is None and len(problems) == before and stub not in _not_regular_paths(problems):
        problems.append(FileProblem("missing-queue-name", stub, "queue dir has no .queue_name"))
        return q
    if raw is None:
        return q
    q.stub = raw
    try:
        qn = textfiles.parse_queue_name(raw, vhost_raw)
    except FormatError as e:
        problems.append(FileProblem("missing-queue-name", stub, f"unreadable .queue_name: {e.message}", e.offset))
        return q
    q.index_hint = qn.index
    if vhost_raw is not None and qn.vhost != vhost_raw:
        problems.append(
            FileProblem(
                "queue-dir-mismatch", stub, f".queue_name names vhost {qn.vhost!r}, the dir is in {vhost_raw!r}"
            )
        )
    expected = textfiles.queue_dir_name(vhost_raw if vhost_raw is not None else qn.vhost, qn.name)
    if expected != q.dir_name:
        problems.append(
            FileProblem("queue-dir-mismatch", path, f".queue_name says {qn.name!r}, whose dir would be {expected}")
        )
        return q
    q.name_raw, q.priority = qn.name, qn.priority
    q.name = qn.base.decode("utf-8", "replace")
    q.name_source = ".queue_name"
    return q


def read_vhost_dir(path: Path, listing: Listing | None = None) -> VhostDir:
    v = VhostDir(path=path, dir_name=path.name)
    raw = read_name_file(path / ".vhost", v.problems, ".vhost")
    v.stored_name = raw
    if raw is None and v.problems:
        pass
    elif raw is None:
        v.problems.append(FileProblem("missing-queue-name", path / ".vhost", "vhost dir has no .vhost"))
    elif textfiles.vhost_dir_name(raw) != path.name:
        v.problems.append(
            FileProblem(
                "queue-dir-mismatch",
                path / ".vhost",
                f".vhost says {raw[:200]!r}{'...' if len(raw) > 200 else ''} ({len(raw)} "
                f"bytes), whose dir would be {textfiles.vhost_dir_name(raw)}",
            )
        )
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
    for e in _special(_listdir(path), v.problems, "vhost"):
        p = Path(e.path)
        if e.name.startswith("msg_store_") and _is_dir(e) and e.name[10:] in STORES:
            kind = e.name[10:]
            store = StoreDir(kind=kind, path=p)
            entries = _special(_listdir(p), v.problems, "store")
            store.numbered = files = _numbered(entries, "store")
            store.rdq, store.rdt = files["rdq"], files["rdt"]
            numbered = {q for v in files.values() for _, q in v}
            store.others = [Path(x.path) for x in entries if Path(x.path) not in numbered]
            v.stores[kind] = store
        elif e.name == "queues" and _is_dir(e):
            listed = _listdir(e.path)
            if listing is not None:
                listing.dirs[e.path] = listed
            for qe in _special(listed, v.problems):
                if _is_dir(qe):
                    v.queues.append(
                        read_queue_dir(_child(p, qe.name), v.name_raw, v.problems, qe.path, listing, qe.name)
                    )
                else:
                    v.others.append(Path(qe.path))
        elif registry.kind_of(e.name, "vhost") is None:
            v.others.append(p)
    return v


SNAPSHOT_DIRS = {"snapshots": "snapshot", "checkpoints": "checkpoint", "recovery_checkpoint": "recovery_checkpoint"}


def read_ra_server_dir(path: Path, problems: list[FileProblem]) -> RaServerDir:
    srv = RaServerDir(path=path, uid=path.name)
    entries = _special(_listdir(path), problems, "ra_server")
    files = _numbered(entries, "ra_server")
    srv.segments = files["ra_segment"]
    numbered = {p for k, v in files.items() if k != "ra_segment" for _, p in v}
    srv.compaction = sorted(numbered)
    for e in entries:
        p = Path(e.path)
        kind = registry.kind_of(e.name, "ra_server")
        if kind == "ra_config":
            srv.config = p
        elif e.name in SNAPSHOT_DIRS and _is_dir(e):
            for se in _special(_listdir(p), problems):
                sp = Path(se.path)
                if not _is_dir(se):
                    srv.others.append(sp)
                    continue
                snap = RaSnapshotDir(SNAPSHOT_DIRS[e.name], sp)
                for f in _special(_listdir(sp), problems, "ra_snapshot"):
                    fk = registry.kind_of(f.name, "ra_snapshot")
                    if fk == "ra_snapshot":
                        snap.snapshot = Path(f.path)
                    elif fk == "ra_indexes":
                        snap.indexes = Path(f.path)
                    else:
                        snap.others.append(Path(f.path))
                srv.snapshots.append(snap)
        elif e.name.endswith(".link"):
            srv.compaction.append(p)
        elif p not in numbered and p not in {q for _, q in srv.segments}:
            srv.others.append(p)
    return srv


def read_ra_system_dir(path: Path) -> RaSystemDir:
    """The files of ``quorum/<node>/`` (or ``coordination/<node>/``), listed and classified (nothing is read)."""
    ra = RaSystemDir(path=path)
    entries = _special(_listdir(path), ra.problems, "ra_system")
    files = _numbered(entries, "ra_system")
    ra.wal = files["ra_wal"]
    known = {p for _, p in ra.wal}
    for e in entries:
        p = Path(e.path)
        kind = registry.kind_of(e.name, "ra_system")
        if kind == "ra_names":
            ra.names = p
        elif kind == "ra_meta":
            ra.meta = p
        elif kind == "ra_writers":
            ra.writers = p
        elif kind == "ra_marker" or p in known:
            continue
        elif _is_dir(e):
            ra.servers.append(read_ra_server_dir(p, ra.problems))
        else:
            ra.others.append(p)
    return ra


def list_node_dir(path: Path) -> NodeDir:
    """A node dir's vhost and queue dirs by their dir names only, nothing read: what a writer
    asks of the dirs it has just written."""
    node = NodeDir(path=path, node=path.name)
    for e in _listdir(path / "msg_stores" / "vhosts"):
        if _is_dir(e):
            v = VhostDir(path=Path(e.path), dir_name=e.name)
            queues = _child(v.path, "queues")
            v.queues = [QueueDir(path=_child(queues, q.name), dir_name=q.name) for q in _listdir(queues) if _is_dir(q)]
            node.vhosts.append(v)
    return node


def read_node_dir(path: Path, label: str | None = None, listing: Listing | None = None) -> NodeDir:
    """A node dir, listed (``listing``: where to keep what was listed, for the inputs manifest)."""
    node = NodeDir(path=path, node=label or path.name, listing=listing)
    for e in _listdir(path / "msg_stores" / "vhosts"):
        if _is_dir(e):
            node.vhosts.append(read_vhost_dir(Path(e.path), listing))
    for e in _listdir(path / "quorum"):
        if _is_dir(e):
            node.quorum.append(read_ra_system_dir(Path(e.path)))
    for e in _listdir(path / "coordination"):
        if _is_dir(e):
            node.coordination.append(read_ra_system_dir(Path(e.path)))
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
    """Every node dir under ``paths`` (a path or a list), labelled uniquely, in input order.
    Listed with the cyclic collector paused (``heap.building``: a node of many queue dirs is
    hundreds of thousands of objects, all kept)."""
    with heap.building():
        return _discover(paths)


def _discover(paths) -> list[NodeDir]:
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
    nodes, listing = [], Listing()
    for _, f in unique:
        label = f.name
        if f.name in dup and common is not None:
            label = f.relative_to(common).as_posix()
        nodes.append(read_node_dir(f, label, listing))
    return nodes
