"""Analysis of one node: per vhost, every queue index is read, every shared-store file
walked, and the two are joined the way the broker's recovery joins them.

Memory stays proportional to the number of index entries (a few dozen bytes each, in numpy
arrays); message bodies are only touched when a table asks for them, through memory maps.

``NodeScan`` -> ``VhostScan`` (lazy: nothing is read until a table needs it) ->
``QueueIndex`` per queue dir and ``StoreScan`` per shared store.
"""

from __future__ import annotations

import time
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
LOC_NAMES = {MEMORY: "memory", SHARED: "shared_store", QSTORE: "queue_store", EMBEDDED: "embedded"}
ID = np.dtype("V16")
ZERO_ID = np.zeros(1, ID)[0]


@dataclass
class Options:
    """How to read: which broker version to predict for, and the time TTLs are judged at."""

    broker_version: str | None = None  # None: inferred from the data
    as_of_ms: int | None = None  # None: now
    bodies: bool = True  # read message/store bodies
    decode: bool = True  # decode stored terms (messages table)
    batch_rows: int = 8192
    batch_bytes: int = 64 << 20

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


def _concat(parts: list[dict]) -> dict:
    if not parts:
        return _cols(0)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


@dataclass
class Ack:
    file: int
    offset: int
    seq: int
    evidence: str
    msg_id: bytes | None = None


@dataclass
class QueueIndex:
    """Everything one queue dir's index says, as arrays.

    ``rec`` holds one entry per index record (the ``index`` table); ``live`` are the
    positions in ``rec`` of the messages the index holds (published, not acked), in SeqId
    order; ``errors`` maps a record position to why the strict parser rejects it."""

    qdir: QueueDir
    version: int | None
    files: list[Path] = field(default_factory=list)
    rec: dict = field(default_factory=lambda: _cols(0))
    live: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    errors: dict[int, str] = field(default_factory=dict)
    acks: list[Ack] = field(default_factory=list)
    bad_segments: set[int] = field(default_factory=set)  # file positions of .qi files with bad headers
    segment_info: dict[int, tuple] = field(default_factory=dict)  # file pos -> (header_ok, from, to, entries, live)
    findings: list[Finding] = field(default_factory=list)
    crashes: list[Finding] = field(default_factory=list)


def read_queue_index(qdir: QueueDir, vhost: VhostDir) -> QueueIndex:
    if qdir.qi:
        return _read_v2(qdir)
    if qdir.idx or qdir.journal is not None:
        return _read_v1(qdir, vhost.segment_entry_count)
    return QueueIndex(qdir, qdir.index_version)


def _read_v2(qdir: QueueDir) -> QueueIndex:
    qx = QueueIndex(qdir, 2)
    parts, live_parts, base = [], [], 0
    for number, path in qdir.qi:
        fi = len(qx.files)
        qx.files.append(path)
        seg = r_qi.read_qi(path, number)
        qx.findings += seg.findings
        if not seg.header_ok:
            qx.bad_segments.add(fi)
        sl, kl = seg.slots, seg.klass
        used = np.flatnonzero(kl != r_qi.EMPTY)
        c = _cols(len(used))
        s = sl[used]
        c["file"][:] = fi
        c["offset"] = c_qi.HEADER_SIZE + c_qi.ENTRY_SIZE * used.astype(np.int64)
        c["kind"] = np.where(kl[used] == r_qi.GHOST, GHOST, np.where(kl[used] == r_qi.BAD, BAD, PUBLISH))
        c["seq"] = seg.from_seq_id + used
        c["persistent"] = (s["flags"] & 1).astype(np.int8)
        c["loc"] = np.where(s["loc_kind"] <= 2, s["loc_kind"], NOLOC).astype(np.int8)
        c["msg_id"] = np.where(s["loc_kind"] == 1, s["msg_id"], ZERO_ID)
        is_qs = s["loc_kind"] == 2
        c["store_offset"] = np.where(is_qs, s["qs_offset"], 0).astype(np.int64)
        c["store_size"] = np.where(is_qs, s["qs_size"], 0).astype(np.int64)
        c["size"] = s["size"].astype(np.int64)
        c["expiry"] = s["expiry"].astype(np.int64)
        c["status"] = s["status"].astype(np.int32)
        for slot, why in seg.bad_reason.items():
            qx.errors[base + int(np.searchsorted(used, slot))] = why
        is_live = (s["status"] == 1)
        live_parts.append(base + np.flatnonzero(is_live))
        for slot in np.flatnonzero(kl == r_qi.EMPTY):
            qx.acks.append(Ack(fi, c_qi.HEADER_SIZE + c_qi.ENTRY_SIZE * int(slot), seg.from_seq_id + int(slot),
                               "v2_zeroed_slot"))
        for j in np.flatnonzero(kl[used] == r_qi.GHOST):
            mid = s["msg_id"][j].tobytes() if s["loc_kind"][j] == 1 else None
            qx.acks.append(Ack(fi, int(c["offset"][j]), int(c["seq"][j]), "v2_dropped_by_recovery", mid))
        qx.segment_info[fi] = (seg.header_ok, seg.from_seq_id, seg.to_seq_id, len(used), int(is_live.sum()))
        parts.append(c)
        base += len(used)
    qx.rec = _concat(parts)
    qx.live = np.concatenate(live_parts) if live_parts else np.zeros(0, np.int64)
    qx.live = qx.live[np.argsort(qx.rec["seq"][qx.live], kind="stable")]
    return qx


def _read_v1(qdir: QueueDir, count: int) -> QueueIndex:
    qx = QueueIndex(qdir, 1)
    v1 = read_v1_queue(qdir.idx, qdir.journal, count)
    qx.findings += v1.findings
    qx.crashes += v1.crashes
    fpos: dict[Path, int] = {}
    for _, p in qdir.idx:
        fpos[p] = len(qx.files)
        qx.files.append(p)
    if qdir.journal is not None:
        fpos[qdir.journal] = len(qx.files)
        qx.files.append(qdir.journal)
    c = _cols(len(v1.records))
    pos_of = {}
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
            qx.acks.append(Ack(fpos[r.path], r.offset, r.seq_id,
                               "v1_journal_ack" if r.path == qdir.journal else "v1_ack"))
    live = v1.live()
    qx.live = np.array([pos_of[id(e.pub)] for e in live], np.int64)
    for e in live:
        c["delivered"][pos_of[id(e.pub)]] = int(e.delivered)
    pubs = {e.seq_id: e.pub.msg_id for e in v1.entries.values() if e.pub is not None}
    for a in qx.acks:
        a.msg_id = pubs.get(a.seq)
    qx.rec = c
    return qx


@dataclass
class StoreScan:
    """One shared store: every entry of every file, and which copy the broker would use."""

    store: StoreDir
    files: list[r_rdq.RdqFile]
    e_file: np.ndarray  # int32 file position
    e_offset: np.ndarray
    e_total: np.ndarray
    e_id: np.ndarray  # V16
    reach: np.ndarray  # bool: found by the target version's scanner
    bad: list[tuple[int, int, int, bytes]]  # (file pos, offset, total, id): entries without a 255 marker
    recorded: dict[bytes, tuple] | None  # msg_store_index.ets: id -> (refcount, file, offset, total)
    clean: bool  # clean.dot + index files present (the broker skips the scan on a clean start)

    def broker_copies(self, last_copy_wins: bool) -> tuple[np.ndarray, np.ndarray]:
        """(sorted unique ids, entry position of the copy the broker claims for each)."""
        cand = np.flatnonzero(self.reach)
        if not len(cand):
            return np.zeros(0, ID), np.zeros(0, np.int64)
        # order by id, then file ascending, then offset (descending when the last copy in a file wins)
        off = -self.e_offset[cand] if last_copy_wins else self.e_offset[cand]
        order = np.lexsort((off, self.e_file[cand], self.e_id[cand]))
        ids = self.e_id[cand][order]
        first = np.ones(len(ids), bool)
        first[1:] = ids[1:] != ids[:-1]
        return ids[first], cand[order][first]


def scan_store(store: StoreDir, model: versions.BrokerModel) -> StoreScan:
    files = [r_rdq.walk(p, n) for n, p in store.rdq]
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
        if k:
            e_id[pos:pos + k] = np.frombuffer(b"".join(f.msg_ids), ID)
        if model.sequential_scan and (f.holes or f.bad_markers):
            reached = np.zeros(k, bool)
            reached[r_rdq.broker_chain(f)] = True
            reach[pos:pos + k] = reached
        bad += [(fi, o, t, i) for o, t, i in f.bad_markers]
        pos += k
    recorded, clean = None, False
    if store.msg_store_index.exists():
        table = r_terms.read_ets(store.msg_store_index)
        recorded = {}
        for obj in table.objects:
            if isinstance(obj, tuple) and len(obj) == 6 and obj[0] == "msg_location":
                recorded[obj[1]] = (obj[2], obj[3], obj[4], obj[5])
        clean = table.complete and store.clean_dot.exists() and store.file_summary.exists()
    return StoreScan(store, files, e_file, e_offset, e_total, e_id, reach, bad, recorded, clean)


class VhostScan:
    """One vhost of one node, analysed lazily."""

    def __init__(self, node: "NodeScan", vhost: VhostDir):
        self.node = node
        self.vhost = vhost
        self._maps: dict[Path, object] = {}

    @property
    def model(self) -> versions.BrokerModel:
        return self.node.model

    @property
    def options(self) -> Options:
        return self.node.options

    def data(self, path: Path):
        """A memory map of ``path``, kept for the life of this scan."""
        m = self._maps.get(path)
        if m is None:
            m = self._maps[path] = map_file(path)
        return m

    def close(self) -> None:
        for m in self._maps.values():
            if hasattr(m, "close"):
                m.close()
        self._maps.clear()

    @cached_property
    def queues(self) -> list[QueueIndex]:
        """Queue indexes ordered as deliveries are listed: name, priority high to low."""
        qs = [read_queue_index(q, self.vhost) for q in self.vhost.queues]
        return sorted(qs, key=lambda q: (q.qdir.name is None, q.qdir.name or q.qdir.dir_name,
                                         -(q.qdir.priority if q.qdir.priority is not None else -1),
                                         q.qdir.dir_name))

    @cached_property
    def stores(self) -> dict[str, StoreScan]:
        return {kind: scan_store(st, self.model) for kind, st in sorted(self.vhost.stores.items())}

    @cached_property
    def qs_files(self) -> dict[Path, QsFile | None]:
        out = {}
        for q in self.vhost.queues:
            for p in q.qs.values():
                out[p] = open_qs(p)
        return out

    def qs_for(self, qx: QueueIndex, rec_pos: int) -> QsFile | None:
        """The .qs file a v2 record points into (same segment number as its .qi)."""
        number = int(qx.qdir.qi[int(qx.rec["file"][rec_pos])][0])
        path = qx.qdir.qs.get(number)
        return None if path is None else self.qs_files.get(path)

    # -- references and resolution -------------------------------------------------------

    @cached_property
    def references(self) -> dict[str, tuple[np.ndarray, np.ndarray, list]]:
        """Per store: (sorted unique referenced ids, reference counts, queue labels per id).

        A reference is what the broker's startup walker yields: a live, persistent index
        entry whose body is in the shared store (v2 loc 1; v1 non-embedded). Transient loc-1
        entries reference the transient store."""
        ids = {"persistent": [], "transient": []}
        labels = {"persistent": [], "transient": []}
        for qx in self.queues:
            r = qx.rec
            lv = qx.live[r["loc"][qx.live] == SHARED]
            for kind, flag in (("persistent", 1), ("transient", 0)):
                sel = lv[r["persistent"][lv] == flag]
                ids[kind].append(r["msg_id"][sel])
                labels[kind] += [qx.qdir.label] * len(sel)
        out = {}
        for kind in ids:
            allids = np.concatenate(ids[kind]) if ids[kind] else np.zeros(0, ID)
            if not len(allids):
                out[kind] = (np.zeros(0, ID), np.zeros(0, np.int64), [])
                continue
            order = np.argsort(allids, kind="stable")
            sids = allids[order]
            uniq, starts, counts = np.unique(sids, return_index=True, return_counts=True)
            labs = [labels[kind][i] for i in order]
            queues = [sorted(set(labs[s:s + c])) for s, c in zip(starts, counts)]
            out[kind] = (uniq, counts, queues)
        return out

    @cached_property
    def claims(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per store: (sorted unique ids, entry position of the broker's copy)."""
        return {k: s.broker_copies(self.model.last_copy_wins) for k, s in self.stores.items()}

    def shared_copy(self, store: str, msg_id) -> int | None:
        """Entry position (in StoreScan arrays) of the copy the broker uses for ``msg_id``."""
        ids, pos = self.claims.get(store, (np.zeros(0, ID), None))
        i = np.searchsorted(ids, msg_id)
        if i < len(ids) and ids[i] == msg_id:
            return int(pos[i])
        return None

    def any_copy(self, store: str, msg_id) -> int | None:
        """Any valid entry for ``msg_id`` (including ones the target version cannot reach)."""
        st = self.stores.get(store)
        if st is None:
            return None
        hit = np.flatnonzero(st.e_id == msg_id)
        return int(hit[0]) if len(hit) else None

    # -- predictions ------------------------------------------------------------------------

    def queue_known(self, qdir: QueueDir) -> bool | None:
        if qdir.name_raw is None or self.vhost.name_raw is None:
            return None
        name = qdir.name_raw[:-2] if qdir.priority is not None else qdir.name_raw
        return self.node.metadata.knows(self.vhost.name_raw, name)

    def fate(self, qx: QueueIndex, i: int, qs_status: str | None) -> str | None:
        """Why the next boot of the target version drops live record ``i`` (None: delivered).

        ``qs_status`` is the per-queue store check result for loc-2 entries."""
        r = qx.rec
        if self.queue_known(qx.qdir) is False:
            return "queue_deleted"
        if qx.version == 1 and not self.model.reads_v1:
            return "v1_unsupported"
        if int(r["file"][i]) in qx.bad_segments:
            return "segment_deleted"
        if r["kind"][i] == BAD:
            return "bad_index_entry"
        if r["persistent"][i] != 1:
            return "transient"
        loc = r["loc"][i]
        if loc == MEMORY:
            return "not_on_disk"
        if loc == SHARED:
            if self.shared_copy("persistent", r["msg_id"][i]) is None:
                return "body_unreachable" if self.any_copy("persistent", r["msg_id"][i]) is not None \
                    else "body_missing"
        elif loc == QSTORE:
            if qs_status != QS_OK:
                return f"qs_{qs_status}"
        elif loc != EMBEDDED:
            return "bad_location"
        exp = int(r["expiry"][i])
        if exp and exp // 1000 <= self.options.now_ms():
            return "expired"
        return None


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
    def vhosts(self) -> list[VhostScan]:
        return [VhostScan(self, v) for v in sorted(self.node.vhosts, key=lambda v: (v.name is None, v.label))]


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
                data = map_file(p)
                if len(data) > 64 + 8 + 24:
                    versions.term_evidence(data[72:72 + 24], ev)
                    seen += 1
            if seen >= 3:
                break
        st = v.stores.get("persistent")
        if st is not None:
            for _, p in st.rdq[:1]:
                data = map_file(p)
                if len(data) > 48:
                    versions.term_evidence(data[24:48], ev)
    return ev.infer()
