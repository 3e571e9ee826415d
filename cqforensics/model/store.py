"""The shared stores of a vhost: every entry of every ``.rdq`` file as numpy arrays (about 100
bytes per stored message, no Python object per message), the distinct message ids with their
copies, and the references the queue indexes hold into each store; for a big vhost, only those
of one message-id ``Share`` at a time.

Which copy of an id the next boot uses, and which entries its store scan reaches at all, is
decided by ``model.recovery`` (``reachable`` and ``claims``), not here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from cqforensics.base import parallel
from cqforensics.discovery.nodes import StoreDir
from cqforensics.model import recovery
from cqforensics.model.index import ID
from cqforensics.model.versions import BrokerModel
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers import registry

#: stored entries a vhost's state may hold per pass: a vhost with more is read in id shares
ENTRIES_PER_SHARE = 250_000


def id_share(ids: np.ndarray, parts: int) -> np.ndarray:
    """The share (0 .. parts-1) of each 16-byte id: the range of its first 8 bytes, read as a
    big-endian number, cut in ``parts`` equal ranges. Message ids are random guids, so shares are
    even; and as a share is a range of the bytewise order, sorted per-share id lists laid end to
    end are sorted (the walk's trusted ids are built that way, a share at a time)."""
    if parts == 1:
        return np.zeros(len(ids), np.int64)
    top = np.ascontiguousarray(ids).view(">u4").reshape(-1, 4)[:, 0].astype(np.uint64)  # the first 4 bytes decide it
    return (top * np.uint64(parts) >> np.uint64(32)).astype(np.int64)


@dataclass(frozen=True)
class Share:
    """Share ``k`` of ``parts``: the message ids (and the rows about them) a pass of a vhost read
    covers; the shares of a vhost are disjoint and together cover every id (``id_share``)."""

    k: int
    parts: int

    def holds(self, ids: np.ndarray) -> np.ndarray:
        return id_share(ids, self.parts) == self.k

    def holds_key(self, key) -> bool:
        """Whether a record keyed ``key`` is the share's: a 16-byte id by its share, anything
        else (a damaged key) in share 0."""
        if isinstance(key, bytes) and len(key) == 16:
            return (int.from_bytes(key[:4], "big") * self.parts) >> 32 == self.k
        return self.k == 0


def estimate_entries(store: StoreDir) -> int:
    """About how many entries the store's ``.rdq`` files hold: their bytes over the mean entry
    size of up to three of them (first, middle, last), walked without trust."""
    rdq = store.rdq
    if not rdq:
        return 0
    total = sum(_size(p) for _, p in rdq)
    walk = registry.reader("rdq").read
    n = size = 0
    for num, p in {rdq[0], rdq[len(rdq) // 2], rdq[-1]}:
        f = walk(p, num)
        n, size = n + len(f), size + int(f.totals.sum())
    return total * n // size if size else 0


def shares_for(stores) -> int:
    """How many id shares a read of a vhost with these shared stores takes, so that a pass
    holds the entries of about ``ENTRIES_PER_SHARE`` stored messages at most (1: read whole)."""
    biggest = max((estimate_entries(st) for st in stores), default=0)
    return max(1, -(-biggest // ENTRIES_PER_SHARE))


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` by a sort: numpy 2.4 finds the distinct values of a plain array
    through a hash table, 15x slower on 400 k integers."""
    v = np.sort(values)
    return v[np.concatenate(([True], v[1:] != v[:-1]))] if len(v) else v


def _search(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``np.searchsorted(keys, queries)``, the queries searched in sorted order: consecutive
    searches then walk the same parts of ``keys`` (random ids searched in random order miss the
    cache at every step: 2x slower, 4096 ids into 200 k measured)."""
    if len(queries) < 256:
        return np.searchsorted(keys, queries)
    order = np.argsort(queries)
    out = np.empty(len(queries), np.int64)
    out[order] = np.searchsorted(keys, queries[order])
    return out


def id_halves(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """16-byte ids as two native uint64 keys (numeric sorts and searches are fast)."""
    halves = ids.view(">u8").reshape(-1, 2)
    return halves[:, 0].astype(np.uint64), halves[:, 1].astype(np.uint64)


@dataclass
class IdSet:
    """Distinct ids, sorted, with fast lookups (searches on the high 64 bits, verified on the low)."""

    ids: np.ndarray  # V16, sorted
    hi: np.ndarray
    lo: np.ndarray

    @classmethod
    def build(cls, ids: np.ndarray, order_key: np.ndarray | None = None) -> tuple[IdSet, np.ndarray, np.ndarray]:
        """(set, group of each input, first input of each group in ``order_key`` order)."""
        n = len(ids)
        hi, lo = id_halves(ids)
        if order_key is None:  # random guids: the high halves are almost always distinct already
            order = np.argsort(hi)  # not stable (5x faster): ties go to the lexsort below
            sh = hi[order]
            if not n or not (sh[1:] == sh[:-1]).any():
                group = np.empty(n, np.int64)
                group[order] = np.arange(n)
                return cls(ids[order], sh, lo[order]), group, order
        key = np.arange(n) if order_key is None else order_key
        order = np.lexsort((key, lo, hi))
        new = np.ones(n, bool)
        if n:
            new[1:] = (hi[order][1:] != hi[order][:-1]) | (lo[order][1:] != lo[order][:-1])
        group = np.empty(n, np.int64)
        group[order] = np.cumsum(new) - 1
        firsts = order[new]
        return cls(ids[firsts], hi[firsts], lo[firsts]), group, firsts

    def __len__(self) -> int:
        return len(self.ids)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Position of each id in the set, -1 when absent."""
        out = np.full(len(ids), -1, np.int64)
        if not len(ids) or not len(self.ids):
            return out
        qhi, qlo = id_halves(ids)
        i = np.minimum(_search(self.hi, qhi), len(self.hi) - 1)
        exact = (self.hi[i] == qhi) & (self.lo[i] == qlo)
        out[exact] = i[exact]
        for k in np.flatnonzero(~exact & (self.hi[i] == qhi)):  # high halves collide: rare
            j = int(i[k])
            while j < len(self.hi) and self.hi[j] == qhi[k]:
                if self.lo[j] == qlo[k]:
                    out[k] = j
                    break
                j += 1
        return out


@dataclass
class Recorded:
    """What a clean stop recorded of one store's messages (``msg_store_index.ets``'s
    ``#msg_location{msg_id, ref_count, file, offset, total_size}`` records), keyed by id: the
    last record of an id wins, as ``ets:file2tab``'s inserts into the set table do. Records of
    16-byte ids with integer fields are columns (``ids`` sorted, the fields aligned with it);
    any other (a damaged dump: another key, a field that is no integer of 64 bits) is in
    ``others``, key -> (ref_count, file, offset, total)."""

    ids: IdSet
    ref_count: np.ndarray  # int64
    file: np.ndarray
    offset: np.ndarray
    total: np.ndarray
    others: dict

    @classmethod
    def build(
        cls,
        rows: np.ndarray,
        others: list[tuple[int, object, tuple]] = (),
        positions: np.ndarray | None = None,
        share: Share | None = None,
    ) -> Recorded:
        """From ``LOCATION`` rows in file order, and the other records with their positions among
        all (``readers.terms.RecordedLocations``); ``share``: only the records of its ids."""
        if share is not None and share.parts > 1:
            keep = share.holds(np.ascontiguousarray(rows["id"]))
            rows, positions = rows[keep], positions[keep] if positions is not None else None
            others = [o for o in others if _hashable(o[1]) and share.holds_key(o[1])]
        if others:  # a damaged dump: every record in order, the last of each key kept
            merged: dict = {}
            pos = positions.tolist() if positions is not None else list(range(len(rows)))
            events = sorted([(p, j) for j, p in enumerate(pos)] + [(p, -1 - i) for i, (p, _, _) in enumerate(others)])
            for _, j in events:
                if j >= 0:
                    merged[rows[j]["id"].tobytes()] = ("row", j)
                else:
                    _, key, rec = others[-1 - j]
                    if _hashable(key):
                        merged[key] = ("other", rec)
            take = [v[1] for v in merged.values() if v[0] == "row"]
            rows = rows[np.array(sorted(take), np.int64)] if take else rows[:0]
            others = {k: v[1] for k, v in merged.items() if v[0] == "other"}
        else:
            others = {}
        ids = np.ascontiguousarray(rows["id"][::-1])  # the last record of an id first
        idset, _, firsts = IdSet.build(ids)
        firsts = len(rows) - 1 - firsts
        return cls(
            idset, *(np.ascontiguousarray(rows[c][firsts]) for c in ("ref_count", "file", "offset", "total")), others
        )

    def __len__(self) -> int:
        return len(self.ids) + len(self.others)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Position of each 16-byte id among the columns, -1 when they hold none (``others`` may)."""
        return self.ids.lookup(ids)

    def other_ids(self) -> dict[bytes, tuple]:
        """The records in ``others`` keyed by a 16-byte id."""
        return {k: v for k, v in self.others.items() if isinstance(k, bytes) and len(k) == 16}

    def items(self):
        """(key, (ref_count, file, offset, total)) of every record (Python objects: for tests
        and the rare caller that needs them all)."""
        for j, raw in enumerate(self.ids.ids.tobytes()[i : i + 16] for i in range(0, 16 * len(self.ids), 16)):
            yield raw, (int(self.ref_count[j]), int(self.file[j]), int(self.offset[j]), int(self.total[j]))
        yield from self.others.items()


def _hashable(key) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


@dataclass
class StoreIndex:
    """One shared store: every entry of every file (numpy arrays, ~70 bytes each), and per
    distinct message id its copies, the first copy, and the copy the target version's
    recovery claims."""

    store: StoreDir
    files: list[r_rdq.RdqFile]  # paths, holes and torn entries (entry lists are dropped)
    e_file: np.ndarray  # int32 file position
    e_offset: np.ndarray
    e_total: np.ndarray
    e_id: np.ndarray  # V16
    reach: np.ndarray  # bool: found by the target version's scanner
    e_group: np.ndarray  # entry -> position in ``distinct``
    distinct: IdSet
    copies: np.ndarray  # per distinct id
    first: np.ndarray  # per distinct id: first entry in file order
    claim: np.ndarray  # per distinct id: the entry recovery uses, -1 when the scanner reaches none
    bad: list[tuple[int, int, int, bytes]]  # (file pos, offset, total, id): entries without a 255 marker
    recorded: Recorded | None  # msg_store_index.ets as read (up to any damage); None: no such file
    clean: bool  # clean.dot + index files present (the broker skips the scan on a clean start)
    share: Share | None = None  # the ids it holds the entries of (None: all)
    #: msg_store_index.ets as ets:file2tab loads it for a clean start (None: it cannot)
    loaded: Recorded | None = None

    def path(self, e: int) -> Path:
        """The file holding entry ``e``."""
        return self.files[int(self.e_file[e])].path

    def term_span(self, e: int) -> tuple[Path, int, int]:
        """(file, start, length) of the stored term of entry ``e``."""
        return (self.path(e), *r_rdq.term_span(int(self.e_offset[e]), int(self.e_total[e])))

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For ids: (claimed entry, first entry); -1 where none."""
        return self.locate_groups(self.distinct.lookup(ids))

    def locate_groups(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``locate`` of ids already looked up among the distinct ones (``distinct.lookup``)."""
        found = g >= 0
        gg = np.maximum(g, 0)
        if not len(self.claim):
            return np.full(len(g), -1, np.int64), np.full(len(g), -1, np.int64)
        return np.where(found, self.claim[gg], -1), np.where(found, self.first[gg], -1)


class Spill:
    """Records sorted out by share into one unlinked temporary file per share, so that a read in
    shares walks the indexes and the store once, and a pass loads only its share's records (in
    the order they were added). Written unbuffered and read by ``pread``: processes forked from
    the one that wrote it (``cqforensics.base.parallel``) share its files, and a shared file offset
    (or a buffer copied at the fork) would mix their reads."""

    def __init__(self, dtype: np.dtype, parts: int):
        import tempfile

        self.dtype, self.parts = np.dtype(dtype), parts
        self.files = [tempfile.TemporaryFile(prefix="cqf-share-", buffering=0) for _ in range(parts)]
        self.sizes = [0] * parts  # bytes written to each

    def add(self, records: np.ndarray, shares: np.ndarray) -> None:
        if not len(records):
            return
        order = np.argsort(shares, kind="stable")
        bounds = np.searchsorted(shares[order], np.arange(self.parts + 1))
        for k in range(self.parts):
            if bounds[k + 1] > bounds[k]:
                data = memoryview(records[order[bounds[k] : bounds[k + 1]]].tobytes())
                while data:
                    n = os.pwrite(self.files[k].fileno(), data, self.sizes[k])
                    self.sizes[k] += n
                    data = data[n:]

    def __len__(self) -> int:
        """Records in every share."""
        return sum(self.sizes) // self.dtype.itemsize

    def _read(self, k: int, start: int, n: int) -> bytes:
        parts, fd = [], self.files[k].fileno()
        while n > 0:
            chunk = os.pread(fd, n, start)
            if not chunk:
                break
            parts.append(chunk)
            start += len(chunk)
            n -= len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def load(self, k: int) -> np.ndarray:
        return np.frombuffer(self._read(k, 0, self.sizes[k]), self.dtype)

    def blocks(self, k: int, nbytes: int = 1 << 20) -> Iterator[np.ndarray]:
        """Share ``k``'s records in order, about ``nbytes`` at a time (``load`` without holding
        them all)."""
        step = max(1, nbytes // self.dtype.itemsize) * self.dtype.itemsize
        for start in range(0, self.sizes[k], step):
            yield np.frombuffer(self._read(k, start, min(step, self.sizes[k] - start)), self.dtype)


ENTRY = np.dtype([("file", np.int32), ("offset", np.int64), ("total", np.int64), ("id", ID), ("reach", bool)])
REFERENCE = np.dtype([("id", ID), ("queue", np.int64)])


@dataclass
class WalkedStore:
    """A store walked once for a read in shares: its files (holes, torn entries; entry lists
    dropped) and its entries spilled by share."""

    files: list[r_rdq.RdqFile]
    entries: Spill
    bad: list[list[tuple[int, int, int, bytes]]]  # per share: (file pos, offset, total, id) of torn entries


#: a store with fewer bytes is walked by one process whatever ``jobs`` says
PARALLEL_WALK_BYTES = 64 << 20


def walk_files(store: StoreDir, model: BrokerModel, referenced: r_rdq.Referenced | None, jobs: int = 1):
    """``(position, RdqFile, reached by the version's scan)`` of every file the next boot scans,
    in its order: each ``N.rdq``, followed (``model.appends_rdt``) by the ``N.rdt`` of an
    interrupted combine, which that boot appends to it (rabbit_msg_store:recover_crashed_compactions).
    ``jobs`` > 1: the files are walked by that many processes (``cqforensics.base.parallel``), in
    the same order, when the store is big enough to gain from it."""
    walk = registry.reader("rdq").read
    rdt = dict(store.rdt) if model.appends_rdt else {}
    files = []  # (number, path, appended to the file before it)
    for num, p in store.rdq:
        files.append((num, p, False))
        if num in rdt:
            files.append((num, rdt[num], True))
    if jobs > 1 and sum(_size(p) for _, p, _ in files) >= PARALLEL_WALK_BYTES:
        walked = parallel.ordered(files, lambda f: [walk(f[1], f[0], referenced=referenced)], jobs)
    else:
        walked = (walk(p, num, referenced=referenced) for num, p, _ in files)
    prev = None
    for fi, ((_, _, appended), f) in enumerate(zip(files, walked)):
        yield fi, f, recovery.appended_reach(prev, f, model) if appended else recovery.reachable(f, model)
        prev = f


def walk_positions(files: list[r_rdq.RdqFile]) -> tuple[np.ndarray, np.ndarray]:
    """Per file position: the position of the file recovery sees its entries in (an appended
    ``.rdt``: its ``.rdq``), and the offset its bytes start at there."""
    joined = np.arange(len(files), dtype=np.int32)
    base = np.zeros(len(files), np.int64)
    for fi, f in enumerate(files):
        if f.path.suffix == ".rdt" and fi:
            joined[fi], base[fi] = fi - 1, files[fi - 1].size
    return joined, base


def walk_store(
    store: StoreDir,
    model: BrokerModel,
    referenced: r_rdq.Referenced | None,
    parts: int,
    pinned: np.ndarray | None = None,
    jobs: int = 1,
) -> WalkedStore:
    """Walk every file of the store once (trusting ``referenced`` and ``pinned``, see
    ``scan_store``) and sort its entries out by share (``jobs``: see ``walk_files``)."""
    referenced = _pinned(referenced, pinned)
    out = WalkedStore([], Spill(ENTRY, parts), [[] for _ in range(parts)])
    for fi, f, reach in walk_files(store, model, referenced, jobs):
        rec = np.empty(len(f), ENTRY)
        rec["file"], rec["offset"], rec["total"], rec["id"] = fi, f.offsets, f.totals, f.msg_ids
        rec["reach"] = reach
        out.entries.add(rec, id_share(f.msg_ids, parts))
        for o, t, i in f.bad_markers:
            out.bad[next(k for k in range(parts) if Share(k, parts).holds_key(i))].append((fi, o, t, i))
        f.offsets, f.totals, f.msg_ids = np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, ID)
        out.files.append(f)
    return out


@dataclass
class StoreRecord:
    """What a clean stop recorded of one store (``msg_store_index.ets``), for one scan: the
    records of its share's ids as read (``recorded``: up to any damage) and as ets:file2tab
    loads them for a clean start (``loaded``; the same object when the dump is undamaged),
    whether the stop left a complete record (``clean``), and every 16-byte id recorded
    (``pinned``: a walk trusts them). ``exists`` False: no such file (a killed store)."""

    recorded: Recorded | None = None
    loaded: Recorded | None = None
    clean: bool = False
    pinned_ids: object = None  # an array, or what makes it when first asked (``pinned``)

    @property
    def pinned(self) -> np.ndarray | None:
        if callable(self.pinned_ids):
            self.pinned_ids = self.pinned_ids()
        return self.pinned_ids


def _pinned(referenced: r_rdq.Referenced | None, pinned: np.ndarray | None) -> r_rdq.Referenced | None:
    """The ids a walk trusts: ``referenced`` and ``pinned``, the ids msg_store_index.ets records
    (None: none)."""
    if pinned is not None and len(pinned):
        if referenced is None or not len(referenced):
            referenced = r_rdq.Referenced(pinned)
        else:  # only the ids not referenced already (after a clean stop, nearly none): no sort of them all
            have = np.frombuffer(referenced.sorted, ID)
            (hi, lo), (phi, plo) = id_halves(have), id_halves(np.ascontiguousarray(pinned))
            i = np.minimum(_search(hi, phi), len(hi) - 1)
            extra = pinned[~((hi[i] == phi) & (lo[i] == plo))]  # a high half shared: added, then deduplicated
            if len(extra):
                referenced = r_rdq.Referenced(np.concatenate([have, extra]))
    return referenced if referenced is not None and len(referenced) else None


def scan_store(
    store: StoreDir,
    model: BrokerModel,
    refs: References | None = None,
    share: Share | None = None,
    referenced: r_rdq.Referenced | None = None,
    walked: WalkedStore | None = None,
    record: StoreRecord | None = None,
    jobs: int = 1,
) -> StoreIndex:
    """Walk every file of the store. The walk trusts (readers.rdq, "which candidates become
    entries") the ids the queue indexes reference into this store (``referenced``, else those
    of ``refs``) and those msg_store_index.ets records after a clean stop; the rest must earn
    their place. ``share``: keep only the entries (and records) of the share's ids, from the
    store ``walked`` once for every share (``walk_store``), else from a walk of its own; either
    walk trusts every referenced id, so a share's entries are exactly those of the whole walk.
    ``record``: the store's clean-shutdown record (``StoreRecord``, of the share's ids)."""
    record = record or StoreRecord()
    recorded, clean = record.recorded, record.clean
    if walked is not None and share is not None:
        files, bad = walked.files, walked.bad[share.k]
        rec = walked.entries.load(share.k)
        e_file, e_offset, e_total, e_id, reach = (np.ascontiguousarray(rec[c]) for c in ENTRY.names)
        del rec
    else:
        if referenced is None and refs is not None and len(refs.ids):
            referenced = r_rdq.Referenced(refs.ids.ids)
        referenced = _pinned(referenced, record.pinned)
        files, parts, bad = [], [], []
        for fi, f, reach in walk_files(store, model, referenced, jobs):
            keep = share.holds(f.msg_ids) if share is not None else slice(None)
            parts.append(
                (
                    np.full(len(f.offsets[keep]), fi, np.int32),
                    f.offsets[keep],
                    f.totals[keep],
                    f.msg_ids[keep],
                    reach[keep],
                )
            )
            bad += [(fi, o, t, i) for o, t, i in f.bad_markers if share is None or share.holds_key(i)]
            # now in the arrays (fresh empties: a view would keep the walk's whole buffers alive)
            f.offsets, f.totals, f.msg_ids = np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, ID)
            files.append(f)
        e_file, e_offset, e_total, e_id, reach = (
            np.concatenate(c) if c else np.zeros(0, t)
            for c, t in zip(zip(*parts) if parts else ((),) * 5, (np.int32, np.int64, np.int64, ID, bool))
        )
        del parts
    distinct, group, first = IdSet.build(e_id)
    copies = np.bincount(group, minlength=len(distinct))
    joined, base = walk_positions(files)  # an appended .rdt's entries follow its .rdq's, in that file
    claim = recovery.claims(joined[e_file], e_offset + base[e_file], reach, group, len(distinct), model)
    return StoreIndex(
        store,
        files,
        e_file,
        e_offset,
        e_total,
        e_id,
        reach,
        group,
        distinct,
        copies,
        first,
        claim,
        bad,
        recorded,
        clean,
        share,
        record.loaded,
    )


@dataclass
class References:
    """The startup walker's references into one store (live index entries whose body is in the
    shared store), per distinct id, with the queues holding them."""

    ids: IdSet
    count: np.ndarray  # references per id
    group: np.ndarray  # per reference: its id's position in ``ids``
    queue: np.ndarray  # per reference: the queue's position in VhostScan.all_queue_dirs
    n_queues: int

    @cached_property
    def pairs(self) -> np.ndarray:
        """Distinct (id position * n_queues + queue position), for the queue lists."""
        pairs = self.group * self.n_queues + self.queue
        return pairs if not len(self.count) or self.count.max() <= 1 else distinct(pairs)
