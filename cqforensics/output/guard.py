"""Evidence is never written to: the one rule for every output of every command, of the library
and of the Spark writer, and the one staging and commit path they write through (docs/evidence.md).

**The rule.** A writer deletes, replaces or writes into nothing it did not write itself, with or
without ``--force`` (Spark: ``overwrite`` or ``append``). ``check_output`` refuses an output path
(a ``UsageError``, exit 16, before anything is read or written) that is

1. an input of the job, inside one, or containing one (symlinks resolved on both sides);
2. inside RabbitMQ data: under a node dir or any dir a broker makes in one (``broker_marks``).
   A new entry *beside* a node dir (in a mnesia base or a folder of backups) is fine;
3. a symbolic link, whatever it points to;
4. an existing file, or a non-empty dir, unless it is a previous output of cqforensics, unchanged
   since it was written (``not_own``), and the caller asked to replace it (``force``). It is then
   replaced only at commit, once every read of the job is done: the new output is built under a
   partial name (``Staging`` for a dir, ``staged_file`` for a file), and the old one is checked
   again, swapped out in one rename and removed. A failure before the commit leaves it as it was.

**How an output is known to be cqforensics's own.** Every output carries a manifest that the
commit writes: a dir holds ``.cqforensics-output.json`` at its root, a file has one beside it,
``.<name>.cqforensics-output.json``. It lists every entry the tool wrote (path, type, size,
sha256, a link's target) with the command, the tool's version and the time. An existing output
is the tool's own only when its tree is exactly what its manifest lists, byte for byte: a file
added, removed or changed (a broker booted on it, someone edited it, a marker copied into another
dir) makes it foreign, and foreign is never replaced. A dir that looks like broker data is held
to that and more: a manifest that lists a clean-shutdown file (``recovery.dets``, ``clean.dot``,
``*.ets`` in a message store), which only a broker writes and no writer of cqforensics ever
does, is taken for forged. The manifest is a statement, not a signature: someone who hashes a
broker's tree into a manifest on purpose can make it pass (such a person can also delete it).

Below the commands and the writers (``export``, ``report``, ``republish``, ``write``, the CLI and
the Spark writer all call it); above discovery (``layout``) and ``provenance``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import json
import logging
import os
import shutil
import stat
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from cqforensics.base.errors import OperationalError, UsageError, display
from cqforensics.discovery import nodes as layout
from cqforensics.output import provenance

log = logging.getLogger(__name__)

#: the manifest at the root of every output dir (beside a file output: ``.<name>`` + this)
MANIFEST = ".cqforensics-output.json"
FORMAT = "cqforensics-output/1"
#: a file or dir being written is named ``.<target name>.cqf-partial-<pid>`` beside its target
PARTIAL = ".cqf-partial-"
_CHUNK = 1 << 20


# -- what a broker made ----------------------------------------------------------------------------

#: entries whose presence in a dir says a broker made it: a node dir (its message stores, its Mnesia
#: schema) or a dir inside one (a vhost dir, a queue dir, a message store)
_NODE_ENTRIES = ("msg_stores", "schema.DAT")
_INNER_ENTRIES = (".vhost", ".queue_name", "msg_store_persistent", "msg_store_transient")
#: dirs a broker makes, by their own name
_INNER_NAMES = ("msg_stores", "msg_store_persistent", "msg_store_transient")
#: a node dir's other stores (Ra's quorum queues, osiris streams, Khepri): a mark with a node name
_NODE_STORES = ("quorum", "stream", "coordination")


def broker_marks(d: Path) -> list[str]:
    """What in the existing dir ``d`` says that a RabbitMQ broker made it (empty: nothing): a node
    dir (``msg_stores/``, a Mnesia ``schema.DAT``, or a ``name@host`` dir holding ``quorum/``,
    ``stream/`` or ``coordination/``), or a dir a broker makes inside one (a message store, a
    vhost dir with its ``.vhost``, a queue dir with its ``.queue_name``)."""
    marks = []
    if d.name in _INNER_NAMES:
        marks.append(f"it is a broker's {d.name} dir")
    for name in _NODE_ENTRIES + _INNER_ENTRIES:
        try:
            os.lstat(d / name)
        except OSError:
            continue
        marks.append(f"{name}{'/' if (d / name).is_dir() else ''}")
    if "@" in d.name:
        marks += [f"{n}/" for n in _NODE_STORES if (d / n).is_dir()]
    return marks


def _looks_like_broker_data(d: Path) -> list[str]:
    """``broker_marks`` of ``d``, and the node dirs among its children (and a ``mnesia/``'s):
    what a refusal names so that the user sees why the dir is evidence."""
    marks = broker_marks(d)
    for parent in (d, d / "mnesia"):
        try:
            children = sorted(os.scandir(parent), key=lambda e: e.name)[:1000]
        except OSError:
            continue
        marks += [
            f"{Path(c.path).relative_to(d).as_posix()}/ (a node dir)"
            for c in children
            if c.is_dir(follow_symlinks=False) and layout.is_node_dir(Path(c.path))
        ]
    return marks


def _broker_only(rel: str) -> bool:
    """A clean-shutdown file of a message store: only a broker's clean stop writes it, never a
    writer of cqforensics (which writes no clean-shutdown files, so the next boot rebuilds)."""
    parts = rel.split("/")
    if "msg_stores" not in parts:
        return False
    name = parts[-1]
    return name in ("recovery.dets", "clean.dot") or name.endswith(".ets")


# -- manifests ---------------------------------------------------------------------------------------


def sidecar(target: Path) -> Path:
    """The manifest of a file output: ``.<name>.cqforensics-output.json`` beside it."""
    return target.parent / f".{target.name}{MANIFEST}"


def _sha256(path) -> str | None:
    h = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        while chunk := os.read(fd, _CHUNK):
            h.update(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return h.hexdigest()


def _entry(path: Path | str, rel: str, hashed: bool = True) -> dict:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return {"path": rel, "type": "link", "target": os.fsdecode(os.readlink(path))}
    if stat.S_ISDIR(st.st_mode):
        return {"path": rel, "type": "dir"}
    if stat.S_ISREG(st.st_mode):
        e = {"path": rel, "type": "file", "size": st.st_size}
        if hashed:
            e["sha256"] = _sha256(path)
        return e
    return {"path": rel, "type": "other"}  # a FIFO or socket: nothing a writer makes


def _tree(root: Path, hashed: bool) -> dict[str, dict]:
    """Every entry below ``root`` but its manifest, by relative path (links not followed). The
    relative paths are made as text (``os.walk``'s dirs all start with ``root``'s text): a Path
    and its ``relative_to`` for each entry cost more than its ``lstat`` (a written node of 20,000
    queue dirs has 40,000 entries)."""
    out = {}
    top = os.fspath(root)
    for dirpath, dirnames, filenames in os.walk(top):
        prefix = dirpath[len(top) :].lstrip(os.sep).replace(os.sep, "/")
        prefix = prefix + "/" if prefix else ""
        for name in dirnames + filenames:
            rel = prefix + name
            if rel == MANIFEST:
                continue
            out[rel] = _entry(os.path.join(dirpath, name), rel, hashed)
    return out


def write_manifest(
    target: Path, command: str, *, content: Path | None = None, broker_version=None, inputs: Iterable = ()
) -> Path:
    """Write the manifest of the output ``target``: for a dir, ``target/MANIFEST`` listing the
    tree; for a file (``content``: the file as written, under its partial name), the sidecar's
    partial file, to be renamed to ``sidecar(final name)`` by the caller. Returns its path."""
    if content is None:
        entries, where = list(_tree(target, True).values()), target / MANIFEST
    else:
        entries, where = [_entry(content, target.name)], partial_name(sidecar(target))
    doc = {
        "format": FORMAT,
        "tool": "cqforensics",
        "version": sys.modules["cqforensics"].__version__,
        "command": command,
        "created": provenance.iso(provenance.now_ms()),
        "broker_version": broker_version or None,
        "inputs": [display(Path(p).absolute()) for p in inputs],
        "entries": sorted(entries, key=lambda e: e["path"]),
    }
    with open(where, "w", encoding="ascii") as fh:  # ASCII: undecodable names as \\udcXX escapes
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    return where


def manifest_of(path: Path) -> dict | None:
    """The manifest of the output at ``path`` (a dir's, or a file's sidecar), or None when there
    is none or it is not one of cqforensics (unreadable, not JSON, another format)."""
    where = path / MANIFEST if path.is_dir() and not path.is_symlink() else sidecar(path)
    try:
        if not stat.S_ISREG(os.lstat(where).st_mode) or os.lstat(where).st_size > (256 << 20):
            return None
        doc = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != FORMAT
        or not isinstance(doc.get("entries"), list)
        or not all(isinstance(e, dict) and isinstance(e.get("path"), str) for e in doc["entries"])
    ):
        return None
    return doc


def _differences(path: Path, doc: dict, deep: bool) -> list[str]:
    """How the tree at ``path`` differs from its manifest (at most a few; empty: not at all).
    ``deep``: file contents compared by sha256 as well (else names, types, sizes and links)."""
    listed = {e["path"]: e for e in doc["entries"]}
    if path.is_dir():
        found = _tree(path, False)
    else:
        try:
            found = {path.name: _entry(path, path.name, False)}
        except OSError:
            found = {}
    out = [f"{p} added" for p in sorted(set(found) - set(listed))][:3]
    out += [f"{p} missing" for p in sorted(set(listed) - set(found))][:3]
    for rel in sorted(set(found) & set(listed)):
        a, b = found[rel], listed[rel]
        if a["type"] != b.get("type") or a.get("size") != b.get("size") or a.get("target") != b.get("target"):
            out.append(f"{rel} changed")
        elif deep and a["type"] == "file" and _sha256(path / rel if path.is_dir() else path) != b.get("sha256"):
            out.append(f"{rel} changed")
        if len(out) >= 6:
            break
    return out


def not_own(path: Path, deep: bool = True) -> str | None:
    """None when the existing ``path`` is an output of cqforensics unchanged since its manifest
    was written; else why it is not (the reason a refusal gives). ``deep``: contents compared
    too (sha256), not only names, types and sizes."""
    if path.is_symlink():
        return "it is a symbolic link"
    doc = manifest_of(path)
    if doc is None:
        marks = _looks_like_broker_data(path) if path.is_dir() else []
        return f"it is not an output of cqforensics (no {MANIFEST if path.is_dir() else sidecar(path).name})" + (
            f"; it looks like RabbitMQ data ({', '.join(marks)})" if marks else ""
        )
    forged = [e["path"] for e in doc["entries"] if _broker_only(e["path"])]
    if forged:
        return (
            f"its manifest lists {forged[0]}, a clean-shutdown file only a broker writes (no writer of "
            "cqforensics does): a broker has run on it, or the manifest is not cqforensics's"
        )
    if not path.is_dir() and [e["path"] for e in doc["entries"]] != [path.name]:
        return f"its manifest {sidecar(path).name} describes another file"
    diff = _differences(path, doc, deep)
    if diff:
        return (
            f"it has changed since cqforensics {doc.get('command', '?')} wrote it ({', '.join(diff)}): "
            "what is in it now was not written by cqforensics"
        )
    return None


# -- the rule ----------------------------------------------------------------------------------------


_NEVER = "never replaced, whatever --force or a Spark save mode says"


def _inside(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def _real(p) -> Path:
    """``p`` absolute with its symlinks resolved (as far as it exists): a link into an input is
    inside that input."""
    return Path(os.path.realpath(Path(p).absolute()))


def check_output(
    out,
    inputs,
    *,
    directory: bool = False,
    force: bool = False,
    continued: Callable[[Path], str | None] | None = None,
    deep: bool = True,
) -> Path:
    """The rule (module doc) for the output path ``out`` of a job reading ``inputs``: returns it
    absolute, or raises UsageError naming it and why. ``directory``: the output is a dir (else a
    file); ``force``: an existing output may be replaced, if it is cqforensics's own (``not_own``,
    ``deep`` as there); ``continued``: for a file continued across runs (republish's journal), a
    function telling why an existing file is not such a file of cqforensics (None: it is, and is
    appended to, whatever ``force`` says)."""
    out = Path(out).absolute()
    real = _real(out)
    for p in [inputs] if isinstance(inputs, (str, os.PathLike)) else inputs:
        rp = _real(p)
        if _inside(real, rp) or _inside(rp, real):
            raise UsageError(
                f"{display(out)}: the output may not be inside an input or contain one "
                f"({display(Path(p).absolute())}): evidence is never written to"
            )
    for a in real.parents:
        marks = broker_marks(a)
        if marks:
            raise UsageError(
                f"{display(out)}: the output may not be inside RabbitMQ data ({display(a)} holds "
                f"{', '.join(marks)}): evidence is never written to; write it elsewhere"
            )
    if out.is_symlink():
        raise UsageError(
            f"{display(out)}: is a symbolic link (to {display(os.readlink(out))}): outputs are never "
            "written through a link, with or without --force"
        )
    if directory:
        if out.exists() and not out.is_dir():
            raise UsageError(f"{display(out)}: exists and is not a directory")
        if out.is_dir() and any(out.iterdir()):
            if not force:
                raise UsageError(
                    f"{display(out)}: exists and is not empty (writers never write into existing "
                    "data; --force replaces a previous output of cqforensics, nothing else)"
                )
            why = not_own(out, deep)
            if why:
                raise UsageError(f"{display(out)}: {_NEVER}: {why}")
        return out
    if out.is_dir():
        raise UsageError(f"{display(out)}: is a directory (the output is a file)")
    if out.exists():
        if continued is not None:
            why = continued(out)
            if why:
                raise UsageError(f"{display(out)}: not written to: {why}")
            return out
        if not force:
            raise UsageError(
                f"{display(out)}: exists (not overwritten without --force; --force replaces a "
                "previous output of cqforensics, nothing else)"
            )
        why = not_own(out, deep)
        if why:
            raise UsageError(f"{display(out)}: {_NEVER}: {why}")
    elif (
        continued is None
        and (sidecar(out).exists() or sidecar(out).is_symlink())
        and (sidecar(out).is_symlink() or manifest_of(out) is None)
    ):
        raise UsageError(f"{display(sidecar(out))}: exists and is not a manifest of cqforensics (not replaced)")
    return out


# -- partial outputs ---------------------------------------------------------------------------------


def process_gone(pid: int) -> bool:
    """Whether no process ``pid`` exists (a partial output of such a run is stale)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def partial_name(target: Path, pid: int | None = None) -> Path:
    return target.parent / f".{target.name}{PARTIAL}{os.getpid() if pid is None else pid}"


def partials(target: Path) -> list[tuple[Path, int]]:
    """Partial outputs of ``target`` (files or dirs named by ``partial_name``) with their pid."""
    prefix = f".{target.name}{PARTIAL}"
    out = []
    try:
        names = os.listdir(target.parent)
    except OSError:
        return out
    for name in names:
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            out.append((target.parent / name, int(name[len(prefix) :])))
    return sorted(out)


def remove_stale_partials(target: Path) -> list[Path]:
    """Remove the partial outputs of ``target`` (and of its manifest) left by runs whose process
    is gone (a kill -9); returns them. Partial outputs of live processes are left alone."""
    removed = []
    for p, pid in partials(target) + partials(sidecar(target)):
        if pid == os.getpid() or not process_gone(pid):
            continue
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise OperationalError(
                f"{p}: a partial output of an interrupted run (pid {pid}) cannot be removed: "
                f"{e.strerror}; remove it by hand (rm -r '{p}')"
            ) from e
        log.warning("removed %s, the partial output of an interrupted run (pid %d)", display(p), pid)
        removed.append(p)
    return removed


@contextlib.contextmanager
def signals_held():
    """Hold SIGINT, SIGTERM and SIGALRM (delivered when the block ends) while a partial output
    is removed or committed, so a second Ctrl-C cannot leave it half done."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGALRM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _renameat2(a: Path, b: Path, flags: int) -> bool:
    """renameat2(a, b, flags); False where the kernel or filesystem does not support it."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not on this filesystem or kernel
        return False
    raise OSError(err, os.strerror(err), str(b))


def _rename_new(a: Path, b: Path) -> None:
    """Rename ``a`` to ``b``, which must not exist: never over something that appeared meanwhile
    (renameat2 RENAME_NOREPLACE; else a check just before the rename)."""
    if _renameat2(a, b, 1):
        return
    if b.exists() or b.is_symlink():
        raise FileExistsError(17, "File exists", str(b))
    os.rename(a, b)


@contextlib.contextmanager
def staged_file(target: Path, mode: str = "wb", *, replace: bool = False, command: str = "write", inputs=()):
    """Open a partial file for ``target`` (``partial_name``) and yield it; when the block ends
    normally the file is flushed and fsynced, ``target`` is checked again (it may exist only when
    ``replace`` and only as cqforensics's own output) and the file and its manifest (``sidecar``)
    are renamed into place. On any exception (Ctrl-C included) the partial files are removed.
    Stale partial files of killed runs are removed first."""
    remove_stale_partials(target)
    tmp = partial_name(target)
    try:
        fh = open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"}))
    except OSError as e:
        raise OperationalError(f"{tmp}: cannot create: {e.strerror}") from e
    man = None
    done = False
    try:
        with fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        man = write_manifest(target, command, content=tmp, inputs=inputs)
        with signals_held():
            if target.exists() or target.is_symlink():  # at commit: still an output it may replace?
                if not replace:
                    raise UsageError(f"{display(target)}: appeared while the output was written; not overwritten")
                why = not_own(target)
                if why:
                    raise UsageError(f"{display(target)}: not replaced: {why}")
                os.replace(tmp, target)
            else:
                try:
                    _rename_new(tmp, target)  # a half-written output never has the final name
                except FileExistsError:
                    raise UsageError(
                        f"{display(target)}: appeared while the output was written; not overwritten"
                    ) from None
            done = True
            os.replace(man, sidecar(target))
    finally:
        if not done:
            with signals_held():
                for p in (tmp, man):
                    if p is not None:
                        with contextlib.suppress(OSError):
                            p.unlink()


# -- output dirs ---------------------------------------------------------------------------------------


def sync_tree(root: Path) -> None:
    """Make everything written under ``root`` durable, files and dir entries: one ``syncfs`` of
    its file system where there is one (Linux), else an fsync of every file and dir. The
    writers do not fsync file by file: a node of 20,000 queue dirs is 40,000 files and dirs,
    each fsync a journal commit of its own."""
    if _syncfs(root):
        return
    for dirpath, _, names in os.walk(root, topdown=False):
        for name in names:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _syncfs(root: Path) -> bool:
    """syncfs(2) of the file system holding ``root``; False where there is none."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        return False
    fd = os.open(root, os.O_RDONLY)
    try:
        if syncfs(fd) == 0:
            return True
        err = ctypes.get_errno()
    finally:
        os.close(fd)
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP
        return False
    raise OperationalError(f"{display(root)}: cannot make the output durable: {os.strerror(err)}")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Staging:
    """Never in place, never half done: ``with Staging(dst, inputs, command=...) as st: write under
    st.path; st.commit()``. Every dir output (compact, rebuild, export, the Spark writer) is built
    in ``.<DST name>.cqf-partial-<pid>`` beside DST, so the final rename is atomic (same
    filesystem) and a kill leaves either no DST (or the empty dir it was) or the complete one.
    Leaving the block without ``commit`` (an error) removes the staging dir; a kill leaves it,
    named partial, and the next run for the same DST removes it.

    ``replace``: DST may be a previous output of cqforensics (``check_output`` with ``force``),
    which ``commit`` checks again and swaps out atomically (renameat2 RENAME_EXCHANGE, so DST is
    at every moment the old tree or the new one), then removes. ``commit`` writes the output's
    manifest first."""

    def __init__(
        self,
        dst: Path,
        inputs,
        dry_run: bool = False,
        replace: bool = False,
        *,
        command: str = "write",
        broker_version: str | None = None,
    ):
        self.inputs = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
        self.dst = check_output(dst, self.inputs, directory=True, force=replace, deep=False)
        self.dry_run = dry_run
        self.replace = replace
        self.command = command
        self.broker_version = broker_version
        self.path = partial_name(self.dst)
        self.removed_stale: list[Path] = []
        self.committed = False

    def __enter__(self) -> Staging:
        if self.dry_run:
            return self
        if not self.dst.parent.is_dir():
            raise UsageError(f"{self.dst.parent}: the output's parent dir does not exist")
        self.removed_stale = remove_stale_partials(self.dst)
        if self.path.exists():
            shutil.rmtree(self.path)
        try:
            self.path.mkdir()
        except OSError as e:
            raise OperationalError(f"{self.path}: cannot create: {e.strerror}") from e
        return self

    def commit(self) -> None:
        if self.dry_run:
            return
        write_manifest(self.path, self.command, broker_version=self.broker_version, inputs=self.inputs)
        sync_tree(self.path)  # files and dirs: the writers do not fsync file by file
        dst = self.dst
        # every read is done: DST is checked again, to the byte, before it is replaced
        check_output(dst, self.inputs, directory=True, force=self.replace)
        with signals_held():  # Ctrl-C now lands after the rename(s), never between them
            if dst.is_dir() and any(dst.iterdir()):
                self._swap()
                return
            try:
                os.rename(self.path, dst)  # replaces an empty dir atomically
            except OSError as e:
                raise OperationalError(f"{dst}: cannot rename the finished output into place: {e.strerror}") from e
            self.committed = True
        _fsync_dir(dst.parent)

    def _swap(self) -> None:
        """Make the staging dir the new DST in one step; the old tree takes the staging dir's
        name (so a kill before it is removed leaves it as a stale partial) and is removed."""
        dst = self.dst
        try:
            exchanged = _renameat2(self.path, dst, 2)  # RENAME_EXCHANGE
        except OSError as e:
            raise OperationalError(f"{dst}: cannot swap in the new output: {e.strerror}") from e
        if exchanged:
            _fsync_dir(dst.parent)
            self.committed = True
            shutil.rmtree(self.path)  # the old DST now
            return
        # no renameat2 here: two renames; between them the old tree waits beside DST
        old = partial_name(dst.parent / f"{dst.name}.cqf-old")
        os.rename(dst, old)
        os.rename(self.path, dst)
        _fsync_dir(dst.parent)
        self.committed = True
        shutil.rmtree(old)

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed and not self.dry_run:
            with signals_held():  # a second Ctrl-C does not cut the removal short
                shutil.rmtree(self.path, ignore_errors=True)


__all__ = [
    "MANIFEST",
    "PARTIAL",
    "Staging",
    "broker_marks",
    "check_output",
    "manifest_of",
    "not_own",
    "partial_name",
    "partials",
    "process_gone",
    "remove_stale_partials",
    "sidecar",
    "signals_held",
    "staged_file",
    "sync_tree",
    "write_manifest",
]
