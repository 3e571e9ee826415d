"""Analysis of one node: queue indexes joined to the shared stores the way the broker's recovery
joins them.

Memory is flat by construction, like the broker's own design: the only vhost-wide state is a
compact index of each shared store (numpy arrays, about 70 bytes per stored message, no Python
objects per message); queue indexes are streamed one segment at a time (a CQv1 queue at a time);
message bodies are read through memory maps, only a couple of files mapped at once.

``NodeScan`` -> ``VhostScan`` (lazy) -> ``StoreIndex`` per shared store, ``IndexChunk`` per
``.qi`` segment (or per CQv1 queue), ``Resolved`` per chunk.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from cqforensics import versions
from cqforensics.findings import Finding
from cqforensics.grammar import qi as c_qi
from cqforensics.layout import NodeDir, QueueDir, StoreDir, VhostDir
from cqforensics.readers import qi as r_qi
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers import terms as r_terms
from cqforensics.readers.files import map_file
from cqforensics.readers.metadata import Metadata, read_metadata
from cqforensics.readers.qs import OK as QS_OK
from cqforensics.readers.qs import QsFile, open_qs
from cqforensics.readers.v1 import read_v1_queue

# record kinds (index table)
PUBLISH, DELIVER, ACK, GHOST, BAD = 0, 1, 2, 3, 4
KIND_NAMES = ("publish", "deliver", "ack", "ghost", "bad")
# locations
MEMORY, SHARED, QSTORE, EMBEDDED, NOLOC = 0, 1, 2, 3, -1
LOC_NAMES = ("memory", "shared_store", "queue_store", "embedded")
ID = np.dtype("V16")
ZERO_ID = np.zeros(1, ID)[0]

EVIDENCE = ("v1_ack", "v1_journal_ack", "v2_zeroed_slot", "v2_dropped_by_recovery")
V1_ACK, V1_JOURNAL_ACK, V2_ZEROED, V2_DROPPED = range(4)

FATES = (None, "queue_deleted", "v1_unsupported", "segment_deleted", "bad_index_entry", "transient",
         "not_on_disk", "bad_location", "body_missing", "body_unreachable", "qs_missing_file", "qs_bad_header",
         "qs_out_of_range", "qs_bad_size", "qs_bad_crc", "expired", "queue_crash", "boot_hang", "delivery_crash", "vhost_crash")
FATE_CODE = {f: i for i, f in enumerate(FATES)}
QS_STATUS = (None, "ok", "missing_file", "bad_header", "out_of_range", "bad_size", "bad_crc")
QS_CODE = {s: i for i, s in enumerate(QS_STATUS)}


@dataclass
class Options:
    """How to read: which broker version to predict for, and the time TTLs are judged at."""

    broker_version: str | None = None  # None: inferred from the data
    as_of_ms: int | None = None  # None: now
    bodies: bool = True  # read message/store bodies
    decode: bool = True  # decode stored terms (messages table)
    batch_rows: int = 8192
    batch_bytes: int = 16 << 20
    assume_dirty: bool = False  # predict as if the clean-shutdown files were removed

    def now_ms(self) -> int:
        return self.as_of_ms if self.as_of_ms is not None else int(time.time() * 1000)


def _cols(n: int) -> dict:
    return {
        "file": np.zeros(n, np.int32), "offset": np.zeros(n, np.int64), "kind": np.zeros(n, np.uint8),
        "seq": np.zeros(n, np.int64), "persistent": np.full(n, -1, np.int8), "loc": np.full(n, NOLOC, np.int8),
        "msg_id": np.zeros(n, ID), "store_offset": np.zeros(n, np.int64), "store_size": np.zeros(n, np.int64),
        "size": np.zeros(n, np.int64), "expiry": np.zeros(n, np.int64), "status": np.full(n, -1, np.int32),
        "delivered": np.full(n, -1, np.int8),
    }


def _acks(n: int) -> dict:
    return {"file": np.zeros(n, np.int32), "offset": np.zeros(n, np.int64), "seq": np.zeros(n, np.int64),
            "evidence": np.zeros(n, np.int8), "msg_id": np.zeros(n, ID), "has_id": np.zeros(n, bool)}


# -- queue indexes, one chunk at a time --------------------------------------------------------------


@dataclass
class IndexChunk:
    """Index records of one ``.qi`` segment, or of a whole CQv1 queue (its journal must be
    merged with all its segments).

    ``rec`` holds one entry per record (the ``index`` table); ``live`` are the positions in
    ``rec`` of the messages held (published, not acked), in SeqId order; ``errors`` maps a
    record position to why the broker's strict parser rejects it."""

    qdir: QueueDir
    version: int | None
    files: list[Path] = field(default_factory=list)
    rec: dict = field(default_factory=lambda: _cols(0))
    live: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    errors: dict[int, str] = field(default_factory=dict)
    acks: dict = field(default_factory=lambda: _acks(0))
    bad_segments: set[int] = field(default_factory=set)  # positions in files of .qi with bad headers
    segment: int | None = None  # v2: the segment number (names the companion .qs)
    header: tuple | None = None  # v2: (header_ok, from_seq_id, to_seq_id, records, live)
    findings: list[Finding] = field(default_factory=list)
    crashes: list[Finding] = field(default_factory=list)


def _v2_chunk(qdir: QueueDir, number: int, path: Path) -> IndexChunk:
    qx = IndexChunk(qdir, 2, [path], segment=number)
    seg = r_qi.read_qi(path, number)
    qx.findings += seg.findings
    if not seg.header_ok:
        qx.bad_segments.add(0)
    sl, kl = seg.slots, seg.klass
    used = np.flatnonzero(kl != r_qi.EMPTY)
    c = _cols(len(used))
    s = sl[used]
    c["offset"] = c_qi.HEADER_SIZE + c_qi.ENTRY_SIZE * used.astype(np.int64)
    c["kind"] = np.where(kl[used] == r_qi.GHOST, GHOST, np.where(kl[used] == r_qi.BAD, BAD, PUBLISH)).astype(np.uint8)
    c["seq"] = seg.from_seq_id + used
    c["persistent"] = (s["flags"] & 1).astype(np.int8)
    c["loc"] = np.where((s["loc_kind"] <= 2) & ~seg.malformed[used], s["loc_kind"], NOLOC).astype(np.int8)
    c["msg_id"] = np.where(s["loc_kind"] == 1, s["msg_id"], ZERO_ID)
    is_qs = s["loc_kind"] == 2
    c["store_offset"] = np.where(is_qs, s["qs_offset"], 0).astype(np.int64)
    c["store_size"] = np.where(is_qs, s["qs_size"], 0).astype(np.int64)
    c["size"] = s["size"].astype(np.int64)
    c["expiry"] = s["expiry"].astype(np.int64)
    c["status"] = s["status"].astype(np.int32)
    qx.rec = c
    for slot, why in seg.bad_reason.items():
        qx.errors[int(np.searchsorted(used, slot))] = why
    qx.live = np.flatnonzero(s["status"] == 1)  # slot order is SeqId order
    empty = np.flatnonzero(kl == r_qi.EMPTY)
    ghosts = np.flatnonzero(kl[used] == r_qi.GHOST)
    a = qx.acks = _acks(len(empty) + len(ghosts))
    a["offset"][:len(empty)] = c_qi.HEADER_SIZE + c_qi.ENTRY_SIZE * empty
    a["seq"][:len(empty)] = seg.from_seq_id + empty
    a["evidence"][:len(empty)] = V2_ZEROED
    g = slice(len(empty), None)
    a["offset"][g], a["seq"][g], a["evidence"][g] = c["offset"][ghosts], c["seq"][ghosts], V2_DROPPED
    a["msg_id"][g] = s["msg_id"][ghosts]
    a["has_id"][g] = s["loc_kind"][ghosts] == 1
    qx.header = (seg.header_ok, seg.from_seq_id, seg.to_seq_id, len(used), len(qx.live))
    return qx


def _v1_chunk(qdir: QueueDir, count: int) -> IndexChunk:
    qx = IndexChunk(qdir, 1)
    v1 = read_v1_queue(qdir.idx, qdir.journal, count)
    qx.findings += v1.findings
    qx.crashes += v1.crashes
    fpos: dict[Path, int] = {}
    for p in [p for _, p in qdir.idx] + ([qdir.journal] if qdir.journal is not None else []):
        fpos[p] = len(qx.files)
        qx.files.append(p)
    c = _cols(len(v1.records))
    pos_of, acks = {}, []
    for i, r in enumerate(v1.records):
        pos_of[id(r)] = i
        c["file"][i] = fpos[r.path]
        c["offset"][i] = r.offset
        c["kind"][i] = {"publish": PUBLISH, "deliver": DELIVER, "ack": ACK}[r.kind]
        c["seq"][i] = r.seq_id
        if r.kind == "publish":
            c["persistent"][i] = int(r.persistent)
            c["msg_id"][i] = np.frombuffer(r.msg_id, ID)[0]
            c["size"][i], c["expiry"][i] = r.size, r.expiry
            if r.embedded_size:
                c["loc"][i], c["store_offset"][i], c["store_size"][i] = EMBEDDED, r.embedded_offset, r.embedded_size
            else:
                c["loc"][i] = SHARED
        elif r.kind == "ack":
            acks.append((fpos[r.path], r.offset, r.seq_id, V1_JOURNAL_ACK if r.path == qdir.journal else V1_ACK))
    live = v1.live()
    qx.live = np.array([pos_of[id(e.pub)] for e in live], np.int64)
    for e in live:
        c["delivered"][pos_of[id(e.pub)]] = int(e.delivered)
    pubs = {e.seq_id: e.pub.msg_id for e in v1.entries.values() if e.pub is not None}
    a = qx.acks = _acks(len(acks))
    for k, (fi, off, seq, ev) in enumerate(acks):
        a["file"][k], a["offset"][k], a["seq"][k], a["evidence"][k] = fi, off, seq, ev
        if seq in pubs:
            a["msg_id"][k], a["has_id"][k] = np.frombuffer(pubs[seq], ID)[0], True
    qx.rec = c
    return qx


def iter_chunks(qdir: QueueDir, vhost: VhostDir, segments=None) -> Iterator[IndexChunk]:
    """A queue dir's index, a segment at a time (v1: the whole queue at once); ``segments``
    restricts a v2 queue to those segment numbers."""
    if qdir.qi:
        for number, path in qdir.qi:
            if segments is None or number in segments:
                yield _v2_chunk(qdir, number, path)
    elif qdir.idx or qdir.journal is not None:
        yield _v1_chunk(qdir, vhost.segment_entry_count)


# -- shared stores -------------------------------------------------------------------------------


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

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For ids: (claimed entry, first entry); -1 where none."""
        g = self.distinct.lookup(ids)
        found = g >= 0
        gg = np.maximum(g, 0)
        if not len(self.claim):
            return np.full(len(ids), -1, np.int64), np.full(len(ids), -1, np.int64)
        return np.where(found, self.claim[gg], -1), np.where(found, self.first[gg], -1)


def scan_store(store: StoreDir, model: versions.BrokerModel) -> StoreIndex:
    files = [r_rdq.walk(p, num) for num, p in store.rdq]
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
        if model.sequential_scan and (f.holes or f.bad_markers):
            reached = np.zeros(k, bool)
            reached[r_rdq.broker_chain(f)] = True
            reach[pos:pos + k] = reached
        bad += [(fi, o, t, i) for o, t, i in f.bad_markers]
        f.offsets, f.totals, f.msg_ids = f.offsets[:0], f.totals[:0], f.msg_ids[:0]  # now in the arrays
        pos += k
    distinct, group, first = IdSet.build(e_id)
    copies = np.bincount(group, minlength=len(distinct))
    # the copy recovery claims: walk order (file, offset) among the reachable entries; the
    # <= 3.12 rebuild folds each file's candidates in reverse, so there the last copy in a file wins
    cand = np.flatnonzero(reach)
    rank = np.full(n, np.iinfo(np.int64).max)
    if model.last_copy_wins:
        rank[cand[np.lexsort((-e_offset[cand], e_file[cand]))]] = np.arange(len(cand))
    else:
        rank[cand] = np.arange(len(cand))
    claim = np.full(len(distinct), -1, np.int64)
    if len(cand):
        order = cand[np.argsort(rank[cand], kind="stable")]
        claim[group[order[::-1]]] = order[::-1]  # the last write wins: the best-ranked copy
    recorded, clean = None, False
    if store.msg_store_index.exists():
        table = r_terms.read_ets(store.msg_store_index)
        recorded = {}
        for obj in table.objects:
            if isinstance(obj, tuple) and len(obj) == 6 and obj[0] == "msg_location":
                recorded[obj[1]] = (obj[2], obj[3], obj[4], obj[5])
        clean = table.complete and store.clean_dot.exists() and store.file_summary.exists()
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


# -- resolution ------------------------------------------------------------------------------------


@dataclass
class Resolved:
    """Where the body of each live entry of a chunk is, and what the next boot does with it
    (arrays aligned with ``IndexChunk.live``; a few bytes per message)."""

    body_files: list[Path]  # body_file indexes this list
    body_file: np.ndarray  # int32, -1: body not found
    body_start: np.ndarray  # int64: term offset in that file
    body_len: np.ndarray  # int64
    store_offset: np.ndarray  # int64: entry offset (rdq entry, .qs entry, v1 embedded term); -1 none
    qs_status: np.ndarray  # int8 code into QS_STATUS
    fate: np.ndarray  # int8 code into FATES (0: the next boot delivers it)

    def fates(self) -> list:
        return [FATES[c] for c in self.fate.tolist()]


class VhostScan:
    """One vhost of one node, analysed lazily."""

    MAX_MAPS = 2

    #: facts about the whole vhost, whatever ``only`` lists (store indexes, the index pass, ...)
    VHOST_WIDE = ("all_queue_dirs", "stores", "qs_files", "index_pass", "recovery", "store_status",
                  "clean_crashes")

    def __init__(self, node: "NodeScan", vhost: VhostDir, only: dict[str, set[int] | None] | None = None,
                 facts: dict | None = None):
        """``only`` restricts the queue-level tables to some queue dirs (by dir name), and
        optionally to some of their segments; store-wide facts still cover the whole vhost.
        ``facts``: what ``vhost_facts()`` of an earlier scan of the same vhost, node scan and
        unchanged files returned, so they are not computed again."""
        self.node = node
        self.vhost = vhost
        self.only = only
        self._maps: dict[Path, object] = {}
        self.__dict__.update({k: v for k, v in (facts or {}).items() if k in self.VHOST_WIDE})

    def vhost_facts(self) -> dict:
        """The vhost-wide facts computed so far (they do not depend on ``only``)."""
        return {k: self.__dict__[k] for k in self.VHOST_WIDE if k in self.__dict__}

    @property
    def model(self) -> versions.BrokerModel:
        return self.node.model

    @property
    def options(self) -> Options:
        return self.node.options

    def data(self, path: Path):
        """A memory map of ``path``. Only the most recently used files stay mapped, so the pages
        read stop counting as resident memory once a file is done with."""
        m = self._maps.pop(path, None)
        if m is None:
            m = map_file(path)
            while len(self._maps) >= self.MAX_MAPS:
                old = self._maps.pop(next(iter(self._maps)))
                if hasattr(old, "close"):
                    old.close()
        self._maps[path] = m  # most recent last
        return m

    def close(self) -> None:
        for m in self._maps.values():
            if hasattr(m, "close"):
                m.close()
        self._maps.clear()

    @cached_property
    def all_queue_dirs(self) -> list[QueueDir]:
        """Queue dirs in listing order: name, then priority high to low."""
        return sorted(self.vhost.queues, key=lambda q: (q.name is None, q.name or q.dir_name,
                                                        -(q.priority if q.priority is not None else -1),
                                                        q.dir_name))

    @cached_property
    def queue_dirs(self) -> list[QueueDir]:
        """The queue dirs this scan lists (all, or those ``only`` names)."""
        if self.only is None:
            return self.all_queue_dirs
        return [q for q in self.all_queue_dirs if q.dir_name in self.only]

    def chunks(self) -> Iterator[IndexChunk]:
        """The listed queues' indexes, chunk by chunk, in listing order (read afresh on each call)."""
        for q in self.queue_dirs:
            yield from self.scan_queue(q)

    def scan_queue(self, q: QueueDir) -> Iterator[IndexChunk]:
        return iter_chunks(q, self.vhost, self.only.get(q.dir_name) if self.only else None)

    @cached_property
    def stores(self) -> dict[str, StoreIndex]:
        return {kind: scan_store(st, self.model) for kind, st in sorted(self.vhost.stores.items())}

    @cached_property
    def qs_files(self) -> dict[Path, QsFile | None]:
        return {p: open_qs(p) for q in self.vhost.queues for p in q.qs.values()}

    @cached_property
    def index_pass(self) -> tuple[dict[str, References], dict[str, list[Finding]]]:
        """One pass over every index of the vhost: the references each store gets (persistent
        loc-1 entries reference msg_store_persistent, transient ones msg_store_transient), and
        per queue name the entries that crash its recovery."""
        ids = {"persistent": [], "transient": []}
        queue = {"persistent": [], "transient": []}
        crashes: dict[str, list[Finding]] = {}
        for qi, q in enumerate(self.all_queue_dirs):
            for qx in iter_chunks(q, self.vhost):
                r, live = qx.rec, qx.live
                for kind, flag in (("persistent", 1), ("transient", 0)):
                    sel = live[(r["loc"][live] == SHARED) & (r["persistent"][live] == flag)]
                    if len(sel):
                        ids[kind].append(r["msg_id"][sel])
                        queue[kind].append(np.full(len(sel), qi, np.int64))
                causes = [f for f in qx.findings if f.details.get("crashes_queue")] + qx.crashes
                if causes:
                    crashes.setdefault(q.label, []).extend(causes)
        out = {}
        nq = max(1, len(self.all_queue_dirs))
        for kind in ids:
            all_ids = np.concatenate(ids[kind]) if ids[kind] else np.zeros(0, ID)
            qpos = np.concatenate(queue[kind]) if queue[kind] else np.zeros(0, np.int64)
            idset, group, _ = IdSet.build(all_ids)
            out[kind] = References(idset, np.bincount(group, minlength=len(idset)), group, qpos, nq)
        return out, crashes

    @property
    def references(self) -> dict[str, References]:
        return self.index_pass[0]

    @property
    def crashing_queues(self) -> dict[str, list[Finding]]:
        """Queue name -> index damage that crashes the queue at recovery (v2: a live slot the
        strict parser rejects; v1: records the merge has no clause for)."""
        return self.index_pass[1]

    @cached_property
    def recovery(self) -> str:
        """'clean' when the next boot trusts the shutdown state (no index or store checks at
        all), else 'dirty' (rebuild from the files). Clean needs the persistent store's
        clean.dot, file_summary.ets and msg_store_index.ets intact and recovery terms whose
        persistent_refs are exactly clean.dot's client_refs (MS build_index / recover_index_terms)."""
        st = self.vhost.stores.get("persistent")
        if self.options.assume_dirty or st is None or not st.clean_dot.exists():
            return "dirty"
        dot = r_terms.clean_dot(st.clean_dot)
        terms = r_terms.recovery_terms(self.vhost.recovery_dets)
        if not dot or not terms:
            return "dirty"
        for ets in (st.file_summary, st.msg_store_index):
            if not ets.exists() or not r_terms.read_ets(ets).complete:
                return "dirty"
        refs = sorted(t.get("persistent_ref") for t in terms.values() if isinstance(t.get("persistent_ref"), bytes))
        client = dot.get("client_refs")
        return "clean" if isinstance(client, list) and sorted(client) == refs else "dirty"

    def recorded_ok(self, ids: np.ndarray) -> np.ndarray:
        """Clean recovery: whether msg_store_index.ets places each id on a valid entry holding it."""
        st = self.stores.get("persistent")
        out = np.zeros(len(ids), bool)
        if st is None or st.recorded is None:
            return out
        numbers = np.array([f.number for f in st.files] or [0], np.int64)
        keys = numbers[st.e_file] * (1 << 40) + st.e_offset if len(st.e_file) else np.zeros(0, np.int64)
        order = np.argsort(keys)
        keys = keys[order]
        for k, raw in enumerate(ids.tobytes()[i:i + 16] for i in range(0, 16 * len(ids), 16)):
            rec = st.recorded.get(raw)
            if rec is None or not isinstance(rec[1], int) or not isinstance(rec[2], int):
                continue
            j = np.searchsorted(keys, rec[1] * (1 << 40) + rec[2])
            out[k] = j < len(keys) and keys[j] == rec[1] * (1 << 40) + rec[2] and \
                st.e_id[order[j]].tobytes() == raw and int(st.e_total[order[j]]) == rec[3]
        return out

    @cached_property
    def store_status(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per store entry: status (0 live, 1 orphan, 2 duplicate) and the references of live copies.

        live = the copy the target version's recovery uses for a referenced id; orphan = the
        first copy of an id nothing references; duplicate = any other copy."""
        out = {}
        for kind, st in self.stores.items():
            refs = self.references[kind]
            n = len(st.e_id)
            at = np.arange(n)
            r = refs.ids.lookup(st.distinct.ids)  # per distinct id: position among the references
            count = np.where(r >= 0, refs.count[np.maximum(r, 0)], 0) if len(refs.count) else np.zeros(len(r), int)
            e_count = count[st.e_group] if n else np.zeros(0, int)
            status = np.full(n, 2, np.int8)
            status[(e_count == 0) & (st.first[st.e_group] == at)] = 1
            live = (e_count > 0) & (st.claim[st.e_group] == at)
            status[live] = 0
            out[kind] = (status, np.where(live, e_count, 0).astype(np.int32))
        return out

    @cached_property
    def clean_crashes(self) -> tuple[set[str], bool]:
        """Clean recovery trusts the shutdown state, so a damaged message is only found when it
        is read for delivery, and that read crashes: (queues that crash, whether the whole vhost
        does). Up to 3.12 a bad shared-store read crashes the vhost's message store, taking
        every queue of the vhost down (seen on 3.10.8); later versions crash the reading queue."""
        if self.recovery != "clean":
            return set(), False
        queues, vhost = set(), False
        for q in self.all_queue_dirs:
            for qx in iter_chunks(q, self.vhost):
                res = self._resolve(qx, propagate=False)
                crashed = res.fate == FATE_CODE["delivery_crash"]
                if crashed.any():
                    queues.add(q.label)
                    shared = qx.rec["loc"][qx.live] == SHARED
                    vhost |= bool((crashed & shared).any()) and self.model.version < (3, 13, 0)
        return queues, vhost

    def resolve(self, qx: IndexChunk) -> Resolved:
        """Locate every live entry's body (as the target version would) and decide its fate."""
        return self._resolve(qx, propagate=True)

    def _resolve(self, qx: IndexChunk, propagate: bool) -> Resolved:
        r, live = qx.rec, qx.live
        n = len(live)
        loc = r["loc"][live].tolist()
        persistent = r["persistent"][live].tolist()
        files = r["file"][live].tolist()
        st_off = r["store_offset"][live].tolist()
        st_size = r["store_size"][live].tolist()
        kinds = r["kind"][live].tolist()
        claim_pos, any_pos = {}, {}
        shared = r["loc"][live] == SHARED
        for kind, flag in (("persistent", 1), ("transient", 0)):
            sel = np.flatnonzero(shared & (r["persistent"][live] == flag))
            st = self.stores.get(kind) if len(sel) else None  # no walk of a store nothing here needs
            if st is None:
                continue
            cp, ap = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
            cp[sel], ap[sel] = st.locate(r["msg_id"][live[sel]])
            claim_pos[kind], any_pos[kind] = cp.tolist(), ap.tolist()
        expiry = r["expiry"][live]
        expired = ((expiry > 0) & (expiry <= self.options.now_ms() * 1000)).tolist()
        known = self.queue_known(qx.qdir)
        clean = self.recovery == "clean"
        qdrop = "queue_deleted" if known is False else (
            "v1_unsupported" if qx.version == 1 and not self.model.reads_v1 else None)
        if qdrop is None and self.node.boot_hangs:
            qdrop = "boot_hang"
        elif qdrop is None and qx.qdir.label in self.crashing_queues:
            qdrop = "queue_crash"
        at_risk = None  # clean recovery: messages a crash on delivery takes down with it
        if qdrop is None and clean and propagate:
            crash_queues, crash_vhost = self.clean_crashes
            at_risk = "vhost_crash" if crash_vhost else ("queue_crash" if qx.qdir.label in crash_queues else None)
        recorded = None
        if clean and "persistent" in claim_pos:
            sel = np.flatnonzero(shared & (r["persistent"][live] == 1))
            recorded = np.ones(n, bool)
            recorded[sel] = self.recorded_ok(r["msg_id"][live[sel]])
            recorded = recorded.tolist()
        out = Resolved([], np.full(n, -1, np.int32), np.zeros(n, np.int64), np.zeros(n, np.int64),
                       np.full(n, -1, np.int64), np.zeros(n, np.int8), np.zeros(n, np.int8))
        file_ix: dict[Path, int] = {}

        def body(j, path, start, length):
            f = file_ix.get(path)
            if f is None:
                f = file_ix[path] = len(out.body_files)
                out.body_files.append(path)
            out.body_file[j], out.body_start[j], out.body_len[j] = f, start, length

        qs_path = qx.qdir.qs.get(qx.segment) if qx.segment is not None else None
        qs = self.qs_files.get(qs_path) if qs_path is not None else None
        for j in range(n):
            lc, body_problem = loc[j], None
            if lc == SHARED:
                kind = "persistent" if persistent[j] == 1 else "transient"
                st = self.stores.get(kind) if kind in claim_pos else None
                cp = claim_pos[kind][j] if st is not None else -1
                ap = any_pos[kind][j] if st is not None else -1
                e = cp if cp >= 0 else ap
                if e >= 0:
                    o, t = int(st.e_offset[e]), int(st.e_total[e])
                    body(j, st.files[st.e_file[e]].path, o + 24, t - 25)
                    out.store_offset[j] = o
                if clean:
                    if recorded is not None and not recorded[j]:
                        body_problem = "delivery_crash"  # the trusted index points at nothing valid
                elif cp < 0:
                    body_problem = "body_unreachable" if ap >= 0 else "body_missing"
            elif lc == QSTORE:
                status = "missing_file" if qs is None else qs.check(self.data(qs_path), st_off[j], st_size[j])[0]
                out.qs_status[j] = QS_CODE[status]
                out.store_offset[j] = st_off[j]
                if qs is not None and status not in ("bad_header", "out_of_range"):
                    body(j, qs_path, st_off[j] + 8, st_size[j])
                if status != QS_OK:
                    # a dirty start checks the entry and drops it; a clean start crashes reading it,
                    # except that 4.x reads a missing segment as no messages
                    tolerated = status == "missing_file" and self.model.version >= (4, 0, 0)
                    body_problem = "delivery_crash" if clean and not tolerated else f"qs_{status}"
            elif lc == EMBEDDED:
                body(j, qx.files[files[j]], st_off[j], st_size[j])
                out.store_offset[j] = st_off[j]
            # the broker's order of checks (IDX2 recover_segment; QI1 recover_message; delivery)
            if kinds[j] == BAD and qdrop in (None, "queue_crash"):
                fate = "bad_index_entry"
            elif qdrop is not None:
                fate = qdrop
            elif qx.version == 2 and files[j] in qx.bad_segments and not clean:
                fate = "segment_deleted"  # a clean start does not read segment headers
            elif persistent[j] != 1:
                fate = "transient"
            elif lc == MEMORY:
                fate = "not_on_disk"
            elif lc not in (SHARED, QSTORE, EMBEDDED):
                fate = "bad_location"
            elif clean and expired[j]:
                fate = "expired"  # the queue drops an expired head without reading its body
            elif body_problem is not None:
                fate = body_problem
            elif expired[j]:
                fate = "expired"
            else:
                fate = at_risk
            out.fate[j] = FATE_CODE[fate]
        return out

    def queue_known(self, qdir: QueueDir) -> bool | None:
        if qdir.name_raw is None or self.vhost.name_raw is None:
            return None
        name = qdir.name_raw[:-2] if qdir.priority is not None else qdir.name_raw
        return self.node.metadata.knows(self.vhost.name_raw, name)


class NodeScan:
    """One node dir: its metadata, the version model, and a VhostScan per vhost."""

    def __init__(self, node: NodeDir, options: Options | None = None):
        self.node = node
        self.options = options or Options()

    @cached_property
    def metadata(self) -> Metadata:
        return read_metadata(self.node.path)

    @cached_property
    def inferred(self) -> tuple[versions.BrokerModel, str]:
        return infer_version(self)

    @cached_property
    def model(self) -> versions.BrokerModel:
        if self.options.broker_version:
            return versions.model(self.options.broker_version)
        return self.inferred[0]

    @cached_property
    def hang_causes(self) -> list[Finding]:
        """CQv1 index damage that hangs the boot: up to 3.13 the shared store's startup walker
        parses every v1 segment and journal on a dirty start, and a record it has no clause
        for crashes the vhost's message store (seen on 3.10.8: the boot never completes)."""
        if not (self.model.reads_v1 and not self.model.converts_v1):
            return []
        out = []
        for vs in self.vhosts:
            if vs.recovery == "dirty":
                for causes in vs.crashing_queues.values():
                    out += [f for f in causes if f.code.startswith("v1-")]
        return out

    @property
    def boot_hangs(self) -> bool:
        return bool(self.hang_causes)

    @cached_property
    def vhosts(self) -> list[VhostScan]:
        for v in self.node.vhosts:
            name_from_metadata(v, self.metadata)
        return [VhostScan(self, v) for v in sorted(self.node.vhosts, key=lambda v: (v.name is None, v.label))]


def name_from_metadata(v: VhostDir, meta: Metadata) -> None:
    """Name the vhost and queue dirs that lack a usable .vhost/.queue_name, by matching their
    dir names against the md5/base-36 names of the durable queues the metadata lists."""
    from cqforensics import textfiles

    if v.name is None:
        for vhost, _ in meta.queues:
            if textfiles.vhost_dir_name(vhost) == v.dir_name:
                v.name_raw, v.name = vhost, vhost.decode("utf-8", "replace")
                break
    if v.name_raw is None or all(q.name is not None for q in v.queues):
        return
    dirs: dict[str, tuple[bytes, int | None]] = {}
    for (vhost, name), rec in meta.queues.items():
        if vhost != v.name_raw:
            continue
        dirs[textfiles.queue_dir_name(vhost, name)] = (name, None)
        levels = meta.arguments(vhost, name).get("x-max-priority")
        if isinstance(levels, int) and 0 < levels < 256:
            for p in range(levels + 1):
                dirs[textfiles.queue_dir_name(vhost, textfiles.priority_queue_name(name, p))] = (name, p)
    for q in v.queues:
        hit = dirs.get(q.dir_name) if q.name is None else None
        if hit is not None:
            name, prio = hit
            q.name, q.priority, q.name_source = name.decode("utf-8", "replace"), prio, "metadata"
            q.name_raw = name if prio is None else textfiles.priority_queue_name(name, prio)


def infer_version(ns: NodeScan) -> tuple[versions.BrokerModel, str]:
    """Collect version evidence cheaply: metadata kind, recovery terms, clean.dot, and the
    first bytes of a few stored terms."""
    ev = versions.Evidence(khepri=ns.metadata.kind == "khepri")
    for v in ns.node.vhosts:
        for terms in r_terms.recovery_terms(v.recovery_dets).values():
            ev.redeliver_seq_id |= "redeliver_seq_id" in terms
            ev.next_deliver_seq_id |= "next_deliver_seq_id" in terms
        for st in v.stores.values():
            dot = r_terms.clean_dot(st.clean_dot)
            ev.index_module |= bool(dot and "index_module" in dot)
        seen = 0
        for q in v.queues:
            ev.v1_files |= bool(q.idx or q.journal)
            for p in list(q.qs.values())[:1]:
                with open(p, "rb") as f:
                    head = f.read(64 + 8 + 24)
                if len(head) == 96:
                    versions.term_evidence(head[72:96], ev)
                    seen += 1
            if seen >= 3:
                break
        st = v.stores.get("persistent")
        if st is not None:
            for _, p in st.rdq[:1]:
                with open(p, "rb") as f:
                    head = f.read(48)
                if len(head) == 48:
                    versions.term_evidence(head[24:48], ev)
    return ev.infer()
