"""Provenance: what produced a report, an export or a lost+found, from what. Recorded in
``fsck --json`` (``provenance``), every export (Parquet key-value metadata
``cqforensics.provenance``; beside a JSONL export, ``messages.jsonl.provenance.json``) and
``lost+found/provenance.json``; its JSON Schema is ``cqforensics/json_schemas/provenance.json``.

``tool``/``version``: cqforensics and its version; ``core``: the compiled core's status (on, off,
or why not built); ``command``; ``broker_version``: the version whose next boot was predicted
or written for; ``as_of``: the time TTLs were judged at (ISO 8601, UTC); ``created``: when;
``inputs``: every regular file under the input paths (symlinks not followed), sorted by path,
with its size and SHA-256 (null when it cannot be read); a sparse file's holes, as the file
system reports them (SEEK_HOLE), are not read: it has ``holes`` (``[offset, length]`` ranges of
zeros) and ``data_sha256`` (of the bytes outside them) instead of ``sha256``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cqforensics import compiled as core
from cqforensics.base import heap, parallel
from cqforensics.base.errors import display
from cqforensics.discovery.nodes import Listing
from cqforensics.readers.files import fd_extents

METADATA_KEY = b"cqforensics.provenance"
_CHUNK = 1 << 20
#: how an input is opened to be hashed: never through a symlink, never blocking on a FIFO
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def now_ms() -> int:
    return int(time.time() * 1000)


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat().replace("+00:00", "Z")


def _regular_files(root: str, out: set[str], listing: Listing | None = None) -> None:
    """Every regular file under the dir ``root`` (symlinks neither followed nor listed), into
    ``out``; what cannot be listed is left out. ``listing``: the dirs this command's discovery
    listed, not listed again."""
    stack = [root]
    known = listing.dirs if listing is not None else {}
    while stack:
        where = stack.pop()
        entries = known.get(where)
        try:
            if entries is None:
                with os.scandir(where) as it:
                    entries = list(it)
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    out.add(e.path)
            except OSError:
                continue


def _entry(path: str, read: dict[str, tuple[int, bytes]] | None = None) -> dict | None:
    """``{path, size, sha256}`` of a regular file (None when it is none by now). A file the
    file system reports holes in (SEEK_HOLE) is not read there: ``sha256`` is null and
    ``holes`` lists its zeroed ranges ``[offset, length]``, ``data_sha256`` the SHA-256 of the
    bytes outside them, in file order (the file is that data with zeros in the holes).
    ``read``: files this command's discovery read whole (``Listing.files``), not read again."""
    known = read.get(path) if read else None
    if known is not None:
        return {"path": display(path), "size": known[0], "sha256": hashlib.sha256(known[1]).hexdigest()}
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        try:
            st = os.lstat(path)
        except OSError:
            return None
        return {"path": display(path), "size": st.st_size, "sha256": None} if stat.S_ISREG(st.st_mode) else None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        out = {"path": display(path), "size": st.st_size, "sha256": None}
        try:
            extents = fd_extents(fd, st.st_size)
            if extents is None:  # the file system cannot tell: all of it is data
                extents = [(0, st.st_size)]
            h = hashlib.sha256()
            for start, end in extents:
                pos = start
                while pos < end:
                    chunk = os.pread(fd, min(_CHUNK, end - pos), pos)
                    if not chunk:
                        break
                    h.update(chunk)
                    pos += len(chunk)
                if pos < end:  # the file shrank while it was read: what it holds is not what it held
                    return out
        except OSError:
            return out
        if extents == [(0, st.st_size)] or not st.st_size:  # no hole
            out["sha256"] = h.hexdigest()
        else:
            holes, pos = [], 0
            for start, end in extents + [(st.st_size, st.st_size)]:
                if start > pos:
                    holes.append([pos, start - pos])
                pos = end
            out["holes"], out["data_sha256"] = holes, h.hexdigest()
        return out
    finally:
        os.close(fd)


def inputs_manifest(paths, jobs: int = 1, listing: Listing | None = None) -> list[dict]:
    """``{path, size, sha256}`` of every regular file under ``paths`` (a file path is itself);
    a sparse file's holes are listed, not read (``_entry``). ``jobs``: processes hashing files
    at once (``cqforensics.base.parallel``), the same manifest. ``listing``: what this
    command's discovery listed and read (``discovery.nodes.Listing``): those dirs are not
    listed again nor those files read again, their entries are what the command checked. Made
    with the cyclic collector paused (``heap.building``: an entry a file, all kept)."""
    with heap.building():
        return _manifest(paths, jobs, listing)


def hashing(paths, jobs: int = 1, listing: Listing | None = None) -> Callable[[], list[dict]]:
    """The inputs manifest of ``paths``, hashed from now on beside the caller's work: call the
    result for it (``inputs_manifest``'s, the same list). With ``jobs`` > 1 and inputs of
    ``PARALLEL_BYTES`` or more, ``jobs - 1`` processes (one at least) hash them while the command
    reads (fsck's serial part, its node facts and store index, then runs beside them), and the
    caller hashes what they have not started when it calls the result; with
    smaller inputs the files walked now are hashed when it is called, in this process (the tree
    walked once); with ``jobs`` 1, all of it when it is called."""
    if jobs > 1:
        files = _files(paths, listing)
        read = listing.files if listing is not None else None
        sizes = _sizes(files, read)
        if len(files) < 2 or sum(sizes) < PARALLEL_BYTES:  # small: hashed here, from the walk just made

            def here() -> list[dict]:
                with heap.building():
                    return [e for e in (_entry(f, read) for f in files) if e is not None]

            return here
        workers = max(1, jobs - 1)
        # many groups, claimed one at a time (``_Claims``) by the workers from now on and by this
        # process once it asks for the manifest: the hashing ends when the command's own work
        # does, the caller's core joining in, where a group a worker left it as the critical path
        groups = _groups(files, sizes, min(_Claims.MOST, CLAIMED_GROUPS * jobs))
        claims = _Claims(len(groups))

        def hash_group(g: int) -> list[dict | None]:
            return [_entry(f, read) for f in groups[g]]

        entries = parallel.started(range(workers), lambda _worker: [claims.each(hash_group)], workers)

        def taken() -> list[dict]:
            with heap.building():
                done = dict(claims.each(hash_group))
                claims.close()
                for part in entries:
                    done.update(part)
                return [e for g in range(len(groups)) for e in done[g] if e is not None]

        return taken
    return lambda: inputs_manifest(paths, jobs, listing)


def _files(paths, listing: Listing | None = None) -> list[str]:
    """Every regular file under ``paths`` (a file path is itself), sorted."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: set[str] = set()
    for p in paths:
        p = os.path.abspath(p)
        if os.path.isfile(p) and not os.path.islink(p):
            files.add(p)
        elif os.path.isdir(p):
            _regular_files(p, files, listing)
    return sorted(files)


def _manifest(paths, jobs: int, listing: Listing | None = None) -> list[dict]:
    files = _files(paths, listing)
    read = listing.files if listing is not None else None
    if jobs > 1 and len(files) > 1:
        sizes = _sizes(files, read)
        if sum(sizes) >= PARALLEL_BYTES:
            groups = _groups(files, sizes, jobs * 4)
            entries = parallel.ordered(groups, lambda group: [[_entry(f, read) for f in group]], jobs)
            return [e for group in entries for e in group if e is not None]
    return [e for e in (_entry(f, read) for f in files) if e is not None]


#: the bytes (each file counted 4 KiB more, for its open, stat and close) below which the files
#: are hashed in this process whatever ``jobs``: forking and sending the entries back cost more
#: than hashing them. Measured: 20,000 queue dirs of small files (about 80 MB counted so) took
#: fsck 0.5-0.7 s more with ``-j 2`` than with ``-j 1``; SHA-256 reads about 1 GB a second.
PARALLEL_BYTES = 256 << 20


def _sizes(files: list[str], read: dict[str, tuple[int, bytes]] | None = None) -> list[int]:
    """Each file's size plus 4 KiB (see ``PARALLEL_BYTES``); ``read``: the files discovery read
    whole (``Listing.files``), whose size it saw: not asked again (20,000 ``.queue_name``s)."""
    sizes = []
    for f in files:
        known = read.get(f) if read else None
        if known is not None:
            sizes.append(known[0] + 4096)
            continue
        try:
            sizes.append(os.lstat(f).st_size + 4096)
        except OSError:
            sizes.append(4096)
    return sizes


#: groups of input files a process of ``hashing`` claims at a time, per process of ``-j``
CLAIMED_GROUPS = 8


class _Claims:
    """The numbers 0 .. n-1 of a map's groups, each taken once by whichever process asks first
    (``hashing``'s workers, then its caller): a pipe filled with one byte a group before the
    workers fork, its writing end closed, so a read takes the next number (a pipe's read of one
    byte is atomic) and an empty pipe reads as its end, never blocking."""

    MOST = 255  # one byte a group

    def __init__(self, n: int):
        self._read: int | None = None
        if not 0 < n <= self.MOST:
            raise ValueError(f"{n} groups: 1 to {self.MOST}")
        self._read, write = os.pipe()
        try:
            os.write(write, bytes(range(n)))  # far below a pipe's capacity: never blocks
        finally:
            os.close(write)

    def each(self, work: Callable[[int], object]) -> list[tuple[int, object]]:
        """``(g, work(g))`` for every group this process claims, until none is left."""
        out = []
        while self._read is not None and (token := os.read(self._read, 1)):
            out.append((token[0], work(token[0])))
        return out

    def close(self) -> None:
        if self._read is not None:
            os.close(self._read)
            self._read = None

    __del__ = close


def _groups(files: list[str], sizes: list[int], n: int) -> list[list[str]]:
    """``files`` in at most ``n`` consecutive groups of about equal bytes (``sizes``)."""
    target = max(1, -(-sum(sizes) // n))
    out, cur, size = [], [], 0
    for f, w in zip(files, sizes):
        if cur and size + w > target:
            out.append(cur)
            cur, size = [], 0
        cur.append(f)
        size += w
    if cur:
        out.append(cur)
    return out


def record(
    command: str,
    paths,
    broker_version: str | None,
    as_of_ms: int | None,
    jobs: int = 1,
    listing: Listing | None = None,
    inputs: Callable[[], list[dict]] | None = None,
) -> dict:
    """The provenance record (module doc); ``listing``: what the command's discovery listed
    and read (``inputs_manifest``); ``inputs``: the manifest being made already (``hashing``)."""
    # the package's version: its __init__ is always loaded before any submodule (importing the
    # package root here would be an upward import, through cqforensics.read.api)
    version = sys.modules["cqforensics"].__version__
    return {
        "tool": "cqforensics",
        "version": version,
        "core": core.status(),
        "command": command,
        "created": iso(now_ms()),
        "broker_version": broker_version or None,
        "as_of": iso(as_of_ms),
        "inputs": inputs() if inputs is not None else inputs_manifest(paths, jobs, listing),
    }


def to_json(p: dict) -> str:
    return json.dumps(p, ensure_ascii=False, sort_keys=True, indent=1) + "\n"
