"""The shared stores of a vhost: every entry of every ``.rdq`` file as numpy arrays (about 70
bytes per stored message, no Python object per message), the distinct message ids with their
copies, and the references the queue indexes hold into each store.

Which copy of an id the next boot uses, and which entries its store scan reaches at all, is
decided by ``model.recovery`` (``reachable`` and ``claims``), not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from cqforensics.layout import StoreDir
from cqforensics.model import recovery
from cqforensics.model.index import ID
from cqforensics.model.versions import BrokerModel
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers import registry
from cqforensics.readers import terms as r_terms

def _split(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    def build(cls, ids: np.ndarray, order_key: np.ndarray | None = None) -> tuple["IdSet", np.ndarray, np.ndarray]:
        """(set, group of each input, first input of each group in ``order_key`` order)."""
        n = len(ids)
        hi, lo = _split(ids)
        if order_key is None:  # random guids: the high halves are almost always distinct already
            order = np.argsort(hi, kind="stable")
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
        qhi, qlo = _split(ids)
        i = np.minimum(np.searchsorted(self.hi, qhi), len(self.hi) - 1)
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
    recorded: dict[bytes, tuple] | None  # msg_store_index.ets: id -> (refcount, file, offset, total)
    clean: bool  # clean.dot + index files present (the broker skips the scan on a clean start)

    def path(self, e: int) -> Path:
        """The file holding entry ``e``."""
        return self.files[int(self.e_file[e])].path

    def term_span(self, e: int) -> tuple[Path, int, int]:
        """(file, start, length) of the stored term of entry ``e``."""
        return (self.path(e), *r_rdq.term_span(int(self.e_offset[e]), int(self.e_total[e])))

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For ids: (claimed entry, first entry); -1 where none."""
        g = self.distinct.lookup(ids)
        found = g >= 0
        gg = np.maximum(g, 0)
        if not len(self.claim):
            return np.full(len(ids), -1, np.int64), np.full(len(ids), -1, np.int64)
        return np.where(found, self.claim[gg], -1), np.where(found, self.first[gg], -1)


def scan_store(store: StoreDir, model: BrokerModel, refs: "References | None" = None) -> StoreIndex:
    """Walk every file of the store. The walk trusts (readers.rdq, "which candidates become
    entries") the ids ``refs`` holds (the queue indexes' references into this store) and those
    msg_store_index.ets records after a clean stop; the rest must earn their place."""
    walk = registry.reader("rdq").read
    recorded, clean = None, False
    if store.msg_store_index.exists():
        table = r_terms.read_ets(store.msg_store_index)
        recorded = {}
        for obj in table.objects:
            if isinstance(obj, tuple) and len(obj) == 6 and obj[0] == "msg_location":
                recorded[obj[1]] = (obj[2], obj[3], obj[4], obj[5])
        clean = table.complete and store.clean_dot.exists() and store.file_summary.exists()
    trusted = [refs.ids.ids] if refs is not None and len(refs.ids) else []
    pinned = [k for k in (recorded or ()) if isinstance(k, bytes) and len(k) == 16]
    if pinned:
        trusted.append(np.frombuffer(b"".join(pinned), ID))
    referenced = r_rdq.Referenced(np.concatenate(trusted)) if trusted else None
    files = [walk(p, num, referenced=referenced) for num, p in store.rdq]
    n = sum(len(f) for f in files)
    e_file = np.zeros(n, np.int32)
    e_offset = np.zeros(n, np.int64)
    e_total = np.zeros(n, np.int64)
    e_id = np.zeros(n, ID)
    reach = np.ones(n, bool)
    bad = []
    pos = 0
    for fi, f in enumerate(files):
        k = len(f)
        e_file[pos:pos + k] = fi
        e_offset[pos:pos + k] = f.offsets
        e_total[pos:pos + k] = f.totals
        e_id[pos:pos + k] = f.msg_ids
        reach[pos:pos + k] = recovery.reachable(f, model)
        bad += [(fi, o, t, i) for o, t, i in f.bad_markers]
        f.offsets, f.totals, f.msg_ids = f.offsets[:0], f.totals[:0], f.msg_ids[:0]  # now in the arrays
        pos += k
    distinct, group, first = IdSet.build(e_id)
    copies = np.bincount(group, minlength=len(distinct))
    claim = recovery.claims(e_file, e_offset, reach, group, len(distinct), model)
    return StoreIndex(store, files, e_file, e_offset, e_total, e_id, reach, group, distinct, copies, first, claim,
                      bad, recorded, clean)


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
        return pairs if not len(self.count) or self.count.max() <= 1 else np.unique(pairs)

