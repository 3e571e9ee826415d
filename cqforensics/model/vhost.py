"""Node and vhost scans: queue indexes joined to the shared stores the way the broker's recovery
joins them.

Memory is bounded by construction: the vhost-wide state is a compact index of each shared store
(numpy arrays, about 100 bytes per stored message, no Python objects per message) and the
references the queue indexes hold into it; a vhost with more stored messages than
``model.store.ENTRIES_PER_SHARE`` is read in message-id shares (``VhostScan.share``), each pass
holding only its share's entries and references (walked once, sorted out by share into temporary
files: ``VhostScan.spill``). Queue indexes are streamed one segment at a time (a CQv1 queue at a
time); bytes are read through ``Bodies``, only a couple of files mapped at once.

``NodeScan`` -> ``VhostScan`` (lazy) -> ``StoreIndex`` per shared store, ``IndexChunk`` per
``.qi`` segment (or per CQv1 queue), ``Resolved`` per chunk (``model.recovery``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np

from cqforensics.base import parallel
from cqforensics.base.enums import Location, StoreStatus
from cqforensics.base.errors import CQError, display, plural
from cqforensics.base.findings import Finding
from cqforensics.codecs import textfiles
from cqforensics.discovery.nodes import (
    STORAGE_KINDS,
    NodeDir,
    QueueDir,
    StorageKind,
    VhostDir,
    read_name_file,
    storage_kind,
    tree_bytes,
)
from cqforensics.model import quorum as m_quorum
from cqforensics.model import recovery, versions
from cqforensics.model.bodies import Bodies
from cqforensics.model.index import ID, IndexChunk, Records, iter_chunks
from cqforensics.model.options import Options, make_options
from cqforensics.model.recovery import Resolved
from cqforensics.model.store import (
    REFERENCE,
    IdSet,
    Recorded,
    References,
    Share,
    Spill,
    StoreIndex,
    StoreRecord,
    id_share,
    scan_store,
    shares_for,
    walk_store,
)
from cqforensics.readers import qs as r_qs
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers import terms as r_terms
from cqforensics.readers.files import read_head, read_optional
from cqforensics.readers.metadata import Metadata, QueueRecord, read_metadata
from cqforensics.readers.qs import QsFile, open_qs

#: a vhost whose index and store files hold fewer bytes has its indexes read by one process
#: whatever ``jobs`` says
PARALLEL_INDEX_BYTES = 64 << 20


def _size(p: Path) -> int:
    try:
        return os.stat(p).st_size
    except OSError:
        return 0


def share_of(ids: np.ndarray, by_id: np.ndarray, seq: np.ndarray, parts: int) -> np.ndarray:
    """The share of each index row: by its message id where ``by_id`` (every row the shared store
    resolves), else by its seq id."""
    return np.where(by_id, id_share(ids, parts), seq % parts)


#: a live index entry spilled for a read in shares: its record, and its chunk's position in
#: ``LiveSpill.chunks``
LIVE = np.dtype(Records.row_dtype().descr + [("chunk", np.int32)])


@dataclass
class LiveSpill:
    """Every live index entry of a vhost, sorted out by share, so that each pass of a read in
    shares takes its own from a file instead of decoding every index again."""

    chunks: list[IndexChunk]  # each chunk with live entries, without its records
    rows: Spill  # LIVE records, chunk after chunk in listing order, each chunk's in SeqId order

    #: consecutive chunks of a queue dir are handed out joined, up to about a segment's worth of
    #: entries: a pass has a few hundred of each segment's, and resolving them costs mostly per
    #: chunk, not per entry (joins of 65,536 cost the same time and 10 MB more at 10x the bench)
    JOIN_ROWS = 1 << 14

    def share(self, k: int) -> Iterator[IndexChunk]:
        """Share ``k``'s live entries as chunks in listing order, each chunk's ``rec`` holding
        only those (``live`` is all of them)."""
        group: list[tuple[IndexChunk, np.ndarray]] = []  # (chunk, its records) to hand out joined
        for rows in self._per_chunk(k):
            chunk = self.chunks[int(rows["chunk"][0])]
            if group and (chunk.qdir is not group[0][0].qdir or sum(len(r) for _, r in group) >= self.JOIN_ROWS):
                yield _joined(group)
                group = []
            group.append((chunk, rows))
        if group:
            yield _joined(group)

    def _per_chunk(self, k: int) -> Iterator[np.ndarray]:
        """Share ``k``'s records, chunk by chunk (read a block at a time)."""
        pending: list[np.ndarray] = []  # the records of one chunk, read so far
        for block in self.rows.blocks(k):
            c = block["chunk"]
            for part in np.split(block, np.flatnonzero(c[1:] != c[:-1]) + 1):
                if pending and pending[0]["chunk"][0] != part["chunk"][0]:
                    yield np.concatenate(pending)
                    pending = []
                pending.append(part)
        if pending:
            yield np.concatenate(pending)


def _joined(group: list[tuple[IndexChunk, np.ndarray]]) -> IndexChunk:
    """Chunks of one queue dir (records given apart) as one chunk of those records, all live:
    their files listed one after another, each with its segment (``IndexChunk.qs_of``)."""
    if len(group) == 1:
        chunk, rows = group[0]
        return replace(chunk, rec=Records.from_rows(rows), live=np.arange(len(rows)))
    files: list[Path] = []
    bad: set[int] = set()
    parts = []
    for chunk, rows in group:
        rows = rows.copy()
        rows["file"] += len(files)
        bad |= {f + len(files) for f in chunk.bad_segments}
        files += chunk.files
        parts.append(rows)
    rows = np.concatenate(parts)
    first = group[0][0]
    return IndexChunk(
        first.qdir,
        first.version,
        files,
        Records.from_rows(rows),
        np.arange(len(rows)),
        bad_segments=bad,
        segments=[c.segment for c, _ in group for _ in c.files],
    )


class VhostScan:
    """One vhost of one node, analysed lazily."""

    #: facts about the whole vhost, whatever ``only`` and ``share`` say
    VHOST_WIDE = (
        "all_queue_dirs",
        "qs_files",
        "recovery",
        "crashing_queues",
        "clean_crashes",
        "shares",
        "spills",
        "_lost_on_read",
        "_queue_starts",
        "_clean_restarts",
        "_store_crash",
        "_double_acked",
        "_double_ackers",
        "start_crash",
        "term_files",
        "qs_entries_checked",
        "live_ttl",
    )
    #: facts about the vhost's ids of one share (all of them, unshared): store indexes, references
    PER_SHARE = ("stores", "index_pass", "store_status")

    def __init__(
        self,
        node: NodeScan,
        vhost: VhostDir,
        only: dict[str, set[int] | None] | None = None,
        facts: dict | None = None,
        share: Share | None = None,
    ):
        """``only`` restricts the queue-level tables to some queue dirs (by dir name), and
        optionally to some of their segments; store-wide facts still cover the whole vhost.
        ``share``: restricts the scan to the message ids of one share (``model.store.Share``):
        its store indexes and references hold only those, and ``chunks`` only their entries.
        ``facts``: what ``vhost_facts()`` of an earlier scan of the same vhost, node scan and
        unchanged files returned, so they are not computed again."""
        self.node = node
        self.vhost = vhost
        self.only = only
        self.share = share
        #: the stream dirs (by name) this scan lists; None: every stream of the vhost when the scan
        #: lists every queue (``only`` is None), else none
        self.stream_dirs: set[str] | None = None
        self.bodies = Bodies()  # the one accessor of stored bytes
        #: quorum queues read (by name; None: all). A scan restricted to queue dirs (``only``) reads none
        #: unless the driver names them here
        self.quorum_names: frozenset[str] | None = None
        #: quorum queue members (Ra server uids) of planned units (None: by vhost, see quorum_queues)
        self.quorum_uids: frozenset[str] | None = None
        #: rebuild: a renamed queue dir counts as its queue's own dir (it is written back there)
        self.keep_renamed = False
        facts = facts or {}
        keep = self.VHOST_WIDE + (self.PER_SHARE if facts.get("share") == share else ())
        self.__dict__.update({k: v for k, v in facts.items() if k in keep})

    def vhost_facts(self) -> dict:
        """The facts computed so far that do not depend on ``only`` (those of one share tagged
        with it)."""
        out = {k: self.__dict__[k] for k in self.VHOST_WIDE + self.PER_SHARE if k in self.__dict__}
        out["share"] = self.share
        return out

    @cached_property
    def shares(self) -> int:
        """How many id shares a read of this vhost takes (``model.store.shares_for``)."""
        return shares_for(self.vhost.stores.values())

    def share_scan(self, k: int, parts: int | None = None) -> VhostScan:
        """A scan of this vhost restricted to share ``k`` of ``parts`` (default ``shares``), with
        this scan's ``only`` and every vhost-wide fact computed so far; the caller closes it."""
        parts = parts or self.shares
        self.spills  # one dict, shared with every share's scan: the indexes and stores are walked once
        self.term_files  # likewise: each term file is decoded once
        sub = VhostScan(self.node, self.vhost, self.only, self.vhost_facts(), Share(k, parts))
        sub.keep_renamed = self.keep_renamed
        sub.quorum_names, sub.quorum_uids = self.quorum_names, self.quorum_uids
        return sub

    def each_share(self) -> Iterator[VhostScan]:
        """This scan (unshared, or its own share) and a scan of every other share of its
        vhost: a fact about every id is gathered share by share. The others are closed."""
        if self.share is None:
            yield self
            return
        for k in range(self.share.parts):
            if k == self.share.k:
                yield self
                continue
            sub = self.share_scan(k, self.share.parts)
            try:
                yield sub
            finally:
                sub.close()

    def share_mask(self, ids: np.ndarray, by_id: np.ndarray, seq: np.ndarray) -> np.ndarray | None:
        """Which rows are this scan's share (None: all, unshared): a row whose ``by_id`` is set
        goes by its id (every row the shared store resolves does), any other by its seq id."""
        if self.share is None:
            return None
        return share_of(ids, by_id, seq, self.share.parts) == self.share.k

    def chunk_rows(self, qx: IndexChunk) -> np.ndarray | None:
        """``share_mask`` of every record of a chunk (shared-store records go by their id)."""
        r = qx.rec
        return self.share_mask(r.msg_id, r.loc == Location.SHARED_STORE, r.seq)

    @property
    def model(self) -> versions.BrokerModel:
        return self.node.model

    @property
    def options(self) -> Options:
        return self.node.options

    def close(self) -> None:
        """Close the files the scan holds open and let go of everything it computed (store
        indexes, references, spills, kept index chunks), so that their memory is returned now:
        the node's scan and its vhost scans refer to each other, so without this it would wait
        for the cyclic garbage collector (seen: +30 MB a read of the bench store, to 400 MB).
        Take what is wanted later first (``vhost_facts``); a closed scan asked again computes
        afresh."""
        self.bodies.close()
        self.kept_chunks.clear()
        for k in self.VHOST_WIDE + self.PER_SHARE + ("kept_chunks",):
            self.__dict__.pop(k, None)

    #: bytes of index chunks ``index_pass`` keeps for the listing that follows it, when the read
    #: asks for that (``lists_every_index``: the findings and queues reads go over every index
    #: twice, first for the references the store walk trusts, then entry by entry); what does
    #: not fit is read again
    KEEP_BYTES = 32 << 20
    #: set by ``lists_every_index``
    keeps_index = False

    def lists_every_index(self) -> None:
        """This read lists every index after the vhost-wide facts: let ``index_pass`` keep what
        it reads for it (a read that lists nothing would only hold the memory)."""
        self.keeps_index = True

    @cached_property
    def kept_chunks(self) -> dict[str, dict]:
        """Queue dir name -> segment number (None: a v1 queue) -> a chunk read by ``index_pass``
        and not yet handed out again (``model.index.iter_chunks`` hands each out once). A queue's
        dict is made when its chunks are first asked for, so a listing begun before the pass ran
        takes what the pass keeps."""
        return {}

    @cached_property
    def all_queue_dirs(self) -> list[QueueDir]:
        """Queue dirs in listing order: name, then priority high to low."""
        return sorted(
            self.vhost.queues,
            key=lambda q: (
                q.name is None,
                q.name or q.dir_name,
                -(q.priority if q.priority is not None else -1),
                q.dir_name,
            ),
        )

    @property
    def streams(self) -> list[StreamEntry]:
        """The streams this scan lists (``stream_dirs``); never with a share (the stream rows
        come with the whole vhost, once)."""
        if self.share is not None:
            return []
        if self.stream_dirs is None and self.only is not None:
            return []
        home = self.vhost.dir_name
        return [
            e
            for e in self.node.streams
            if self.node.stream_home(e) == home and (self.stream_dirs is None or e.path.name in self.stream_dirs)
        ]

    @cached_property
    def queue_dirs(self) -> list[QueueDir]:
        """The queue dirs this scan lists (all, or those ``only`` names)."""
        if self.only is None:
            return self.all_queue_dirs
        return [q for q in self.all_queue_dirs if q.dir_name in self.only]

    def chunks(self, whole: bool = False) -> Iterator[IndexChunk]:
        """The listed queues' indexes, chunk by chunk, in listing order (read afresh on each call);
        ``whole``: every live entry, whatever the scan's share."""
        for q in self.queue_dirs:
            yield from self.index_of(q, in_share=not whole)

    def live_chunks(self, whole: bool = False) -> Iterator[IndexChunk]:
        """The live entries of the scan's share (all, unshared), chunk by chunk in listing order,
        for what needs nothing else (``messages``, ``queues``, the clean-start facts): a chunk's
        ``rec`` may then hold only those (``live`` all of them), chunks without any may be left
        out, and consecutive chunks may come joined (``LiveSpill.share``). A scan of one share of
        a vhost takes them from the spill made by the vhost's one pass over every index
        (``spill("live")``), instead of reading and decoding every index again for each share.
        ``whole``: every queue dir's, whatever ``only`` says."""
        if self.share is not None and (whole or self.only is None):
            chunks = self.spill("live").share(self.share.k)
            yield from self._ticked(chunks) if self.node.progress is not None else chunks
        elif whole:
            for q in self.all_queue_dirs:
                yield from self.index_of(q, restricted=False)
        else:
            yield from self.chunks()

    def index_of(self, q: QueueDir, restricted: bool = True, in_share: bool | None = None) -> Iterator[IndexChunk]:
        """One queue dir's index, chunk by chunk; ``restricted``: only the segments ``only`` lists,
        and (unless ``in_share`` says otherwise) only the live entries of the scan's share."""
        segments = self.only.get(q.dir_name) if restricted and self.only else None
        chunks = iter_chunks(q, self.vhost, segments, self.kept_chunks.setdefault(q.dir_name, {}))
        in_share = restricted if in_share is None else in_share
        chunks = self._in_share(chunks) if in_share and self.share is not None else chunks
        return self._ticked(chunks) if self.node.progress is not None else chunks

    def _ticked(self, chunks: Iterator[IndexChunk]) -> Iterator[IndexChunk]:
        """``chunks``, telling ``NodeScan.progress`` the bytes of each one's index files once it
        is done with (a pass of a read in shares counts its part)."""
        parts = self.share.parts if self.share is not None else 1
        for qx in chunks:
            yield qx
            self.node.progress(sum(_size(f) for f in qx.files) / parts)

    def _in_share(self, chunks: Iterator[IndexChunk]) -> Iterator[IndexChunk]:
        for qx in chunks:
            rows = self.chunk_rows(qx)
            qx.live = qx.live[rows[qx.live]]
            yield qx

    def scan_queue(self, q: QueueDir) -> Iterator[IndexChunk]:
        return self.index_of(q)

    @cached_property
    def stores(self) -> dict[str, StoreIndex]:
        if self.share is not None:  # from the one walk of each store, sorted out by share
            walks = self.spill("walks")
            return {
                kind: scan_store(st, self.model, share=self.share, walked=walks[kind], record=self.store_record(kind))
                for kind, st in sorted(self.vhost.stores.items())
            }
        refs = self.references  # the walk trusts the ids the indexes reference (readers.rdq)
        return {
            kind: scan_store(st, self.model, refs.get(kind), record=self.store_record(kind), jobs=self.options.jobs)
            for kind, st in sorted(self.vhost.stores.items())
        }

    @cached_property
    def term_files(self) -> r_terms.TermFiles:
        """The vhost's term files, each decoded once for the whole read (every share's scan).
        A vhost read in shares sorts its stores' message-index records out by share as they are
        decoded (``TermFiles.spills``), so no pass holds them all."""
        files = r_terms.TermFiles()
        parts = self.share.parts if self.share is not None else self.shares
        if parts > 1:
            for st in self.vhost.stores.values():
                spill = files.spills[st.msg_store_index] = Spill(r_terms.LOCATION, parts)
                files.sinks[st.msg_store_index] = lambda rows, _, spill=spill: spill.add(
                    rows, id_share(np.ascontiguousarray(rows["id"]), parts)
                )
        return files

    def recorded_ids(self, kind: str) -> np.ndarray | None:
        """Every 16-byte id store ``kind``'s ``msg_store_index.ets`` records (every share's: a
        walk trusts them), without building its records."""
        st = self.vhost.stores[kind]
        if not st.msg_store_index.exists():
            return None
        dump = self.term_files.ets(st.msg_store_index)
        if dump.items.rows is None:  # sorted out by share: a share's rows at a time, only the ids kept
            spill = self.term_files.spills[st.msg_store_index]
            return np.concatenate([np.ascontiguousarray(spill.load(k)["id"]) for k in range(spill.parts)])
        return self.store_record(kind).pinned

    def store_record(self, kind: str) -> StoreRecord:
        """The clean-shutdown record of store ``kind`` (``model.store.StoreRecord``): its
        ``msg_store_index.ets`` decoded once per read (``term_files``), the records of this
        scan's share."""
        st = self.vhost.stores[kind]
        if not st.msg_store_index.exists():
            return StoreRecord()
        dump = self.term_files.ets(st.msg_store_index)
        clean = dump.complete and st.clean_dot.exists() and st.file_summary.exists()
        if dump.items.rows is None:  # undamaged, sorted out by share as it was decoded
            spill = self.term_files.spills[st.msg_store_index]
            rows = (
                spill.load(self.share.k)
                if self.share is not None
                else np.concatenate([spill.load(k) for k in range(spill.parts)])
            )
            recorded = Recorded.build(rows)
            return StoreRecord(recorded, recorded, clean, lambda: self.recorded_ids(kind))
        locs = dump.locations()
        recorded = Recorded.build(locs.rows, locs.others, locs.row_positions, self.share)
        loaded = recorded
        if dump.loaded is not r_terms.WHOLE:  # file2tab loads other records than the strict walk's (file2tab_load)
            got = dump.locations(loaded=True)
            loaded = None if got is None else Recorded.build(got.rows, got.others, got.row_positions, self.share)
        pinned = np.ascontiguousarray(locs.rows["id"])
        extra = [k for _, k, _ in locs.others if isinstance(k, bytes) and len(k) == 16]
        if extra:
            pinned = np.concatenate([pinned, np.frombuffer(b"".join(extra), ID)])
        return StoreRecord(recorded, loaded, clean, pinned)

    @cached_property
    def spills(self) -> dict:
        """(what, parts) -> a vhost-wide spill (``spill``), kept for every share's scan."""
        return {}

    def spill(self, what: str) -> dict | LiveSpill:
        """For a read in shares, made once per vhost: ``refs``, per store the references the
        indexes hold (``REFERENCE`` records, from one pass over every index), sorted out by share;
        ``live``, every live index entry (``LiveSpill``), sorted out by share in the same pass;
        ``walks``, per store its one walk (``model.store.walk_store``), trusting every id the
        indexes reference (built a share at a time: a share is a range of the walk's order)."""
        parts = self.share.parts if self.share is not None else self.shares
        key = (what, parts)
        if key in self.spills:
            return self.spills[key]
        if what in ("refs", "live"):  # one pass over the indexes makes both when both are wanted
            self._spill_indexes(parts, refs=("refs", parts) not in self.spills, live=what == "live")
            return self.spills[key]
        out = {
            kind: walk_store(st, self.model, self.trusted(kind), parts, self.recorded_ids(kind), self.options.jobs)
            for kind, st in sorted(self.vhost.stores.items())
        }
        self.spills[key] = out
        return out

    def _spill_indexes(self, parts: int, refs: bool, live: bool) -> None:
        """The pass over every index that makes the ``refs`` spill (and finds the crashing
        queues), the ``live`` one (``LiveSpill``), or both."""
        out = {kind: Spill(REFERENCE, parts) for kind in ("persistent", "transient")} if refs else {}
        crashes: dict[str, list[Finding]] = {}
        held = LiveSpill([], Spill(LIVE, parts)) if live else None
        for qi, q in enumerate(self.all_queue_dirs):
            for qx in iter_chunks(q, self.vhost):
                r, live_rows = qx.rec, qx.live
                if held is not None and len(live_rows):
                    rows = np.empty(len(live_rows), LIVE)
                    r.put_rows(rows, live_rows)
                    rows["chunk"] = len(held.chunks)
                    held.chunks.append(
                        IndexChunk(q, qx.version, qx.files, segment=qx.segment, bad_segments=qx.bad_segments)
                    )
                    held.rows.add(
                        rows, share_of(rows["msg_id"], rows["loc"] == Location.SHARED_STORE, rows["seq"], parts)
                    )
                if not refs:
                    continue
                causes = recovery.crash_causes(self, qx)
                if causes:
                    crashes.setdefault(q.label, []).extend(causes)
                for kind, flag in (("persistent", 1), ("transient", 0)):
                    sel = live_rows[(r.loc[live_rows] == Location.SHARED_STORE) & (r.persistent[live_rows] == flag)]
                    rec = np.empty(len(sel), REFERENCE)
                    rec["id"], rec["queue"] = r.msg_id[sel], qi
                    out[kind].add(rec, id_share(rec["id"], parts))
        if refs:
            self.spills[("refs", parts)] = out
            self.spills["crashes"] = crashes  # the same pass finds them, for every share's scan
        if held is not None:
            self.spills[("live", parts)] = held

    def trusted(self, kind: str) -> r_rdq.Referenced:
        """Every id the indexes reference into a store, from the spill, sorted a share at a time
        (16 bytes per id, for the time of the walk)."""
        refs = self.spill("refs")[kind]
        out = r_rdq.Referenced(np.zeros(0, ID))
        out.sorted = b"".join(r_rdq.Referenced(refs.load(k)["id"]).sorted for k in range(refs.parts))
        return out

    @cached_property
    def qs_files(self) -> dict[Path, QsFile | None]:
        return {p: open_qs(p) for q in self.vhost.queues for p in q.qs.values()}

    @cached_property
    def index_pass(self) -> tuple[dict[str, References], dict[str, list[Finding]]]:
        """One pass over every index of the vhost: the references each store gets (persistent
        loc-1 entries reference msg_store_persistent, transient ones msg_store_transient), and
        per queue name the entries that crash its recovery. A scan of one share: its references
        only, from the vhost's spill."""
        if self.share is not None:
            spilled = self.spill("refs")
            out = {}
            nq = max(1, len(self.all_queue_dirs))
            for kind, spill in spilled.items():
                rec = spill.load(self.share.k)
                idset, group, _ = IdSet.build(np.ascontiguousarray(rec["id"]))
                out[kind] = References(
                    idset, np.bincount(group, minlength=len(idset)), group, np.ascontiguousarray(rec["queue"]), nq
                )
            return out, self.crashing_queues
        ids = {"persistent": [], "transient": []}
        queue = {"persistent": [], "transient": []}
        crashes: dict[str, list[Finding]] = {}
        jobs = self.options.jobs
        if jobs > 1 and self.listing_bytes(every=True) >= PARALLEL_INDEX_BYTES:  # ranges of it, by ``jobs`` processes
            ranges = self.ranges(jobs * 4, every=True)
            parts = parallel.ordered(ranges, lambda only: [self._index_refs(only, 0)], jobs)
        else:
            parts = [self._index_refs(None, self.KEEP_BYTES if self.keeps_index else 0)]
        qs_checked, ttl = True, False
        for part_ids, part_queue, part_crashes, (part_qs_checked, part_ttl) in parts:
            qs_checked, ttl = qs_checked and part_qs_checked, ttl or part_ttl
            for kind in ids:
                ids[kind] += part_ids[kind]
                queue[kind] += part_queue[kind]
            for label, causes in part_crashes.items():
                crashes.setdefault(label, []).extend(causes)
        out = {}
        nq = max(1, len(self.all_queue_dirs))
        for kind in ids:
            all_ids = np.concatenate(ids[kind]) if ids[kind] else np.zeros(0, ID)
            qpos = np.concatenate(queue[kind]) if queue[kind] else np.zeros(0, np.int64)
            idset, group, _ = IdSet.build(all_ids)
            out[kind] = References(idset, np.bincount(group, minlength=len(idset)), group, qpos, nq)
        self.__dict__.setdefault("crashing_queues", crashes)
        if self.recovery == "clean":
            if self.keeps_index:  # checked only then (``_index_refs``)
                self.__dict__.setdefault("qs_entries_checked", qs_checked)
            self.__dict__.setdefault("live_ttl", ttl)
        return out, crashes

    def _index_refs(self, only: dict | None, room: int) -> tuple[dict, dict, dict, tuple[bool, bool]]:
        """``index_pass``'s gathering over the queue dirs (and segments) ``only`` names (None:
        every one): per store the referenced ids and the positions of their queues, the
        findings that crash a queue, and two facts a clean start's checks would otherwise read
        every index again for: whether every live ``.qs`` entry checks (``recovery.
        qs_entries_check``, for the crash check; asked only of a vhost that recovers clean, in a
        read that lists every index after this pass (``lists_every_index``: it judges every
        queue's fate), so that a read needing no fate, ``refcounts`` or ``store``, does not pay
        for it) and whether any live entry has an expiry (``recovery.store_crash``: an expired
        message the recorded index lacks); ``room``: bytes of chunks to keep for a listing to
        come."""
        ids = {"persistent": [], "transient": []}
        queue = {"persistent": [], "transient": []}
        crashes: dict[str, list[Finding]] = {}
        qs_checked = self.keeps_index and self.recovery == "clean"  # stays True while every entry checks
        ttl = False
        for qi, q in enumerate(self.all_queue_dirs):
            if only is not None and q.dir_name not in only:
                continue
            segments = only.get(q.dir_name) if only is not None else None
            chunks = iter_chunks(q, self.vhost, segments, self.kept_chunks.setdefault(q.dir_name, {}))
            for qx in chunks:
                if qx.nbytes <= room:
                    room -= qx.nbytes
                    self.kept_chunks.setdefault(q.dir_name, {})[qx.segment] = qx
                r, live = qx.rec, qx.live
                for kind, flag in (("persistent", 1), ("transient", 0)):
                    sel = live[(r.loc[live] == Location.SHARED_STORE) & (r.persistent[live] == flag)]
                    if len(sel):
                        ids[kind].append(r.msg_id[sel])
                        queue[kind].append(np.full(len(sel), qi, np.int64))
                causes = recovery.crash_causes(self, qx)
                if causes:
                    crashes.setdefault(q.label, []).extend(causes)
                qs_checked = qs_checked and recovery.qs_entries_check(self, qx)
                ttl = ttl or bool((r.expiry[live] > 0).any())
        return ids, queue, crashes, (qs_checked, ttl)

    def store_entries(self) -> int:
        """Entries the vhost's stores hold (every share's): counted from the one walk's spill for
        a vhost read in shares, never by indexing its whole store."""
        if self.share is None and self.shares > 1:
            return sum(len(w.entries) for w in self.spill("walks").values())
        return sum(len(st.e_id) for st in self.stores.values())

    @property
    def references(self) -> dict[str, References]:
        return self.index_pass[0]

    @cached_property
    def crashing_queues(self) -> dict[str, list[Finding]]:
        """Queue name -> index damage that crashes the queue at recovery (v2: a live slot the
        strict parser rejects; v1: records the merge has no clause for). ``index_pass`` finds
        them too; a scan that needs no references (a boot-hang check) collects only these."""
        if "crashes" in self.__dict__.get("spills", {}):
            return self.spills["crashes"]
        crashes: dict[str, list[Finding]] = {}
        for q in self.all_queue_dirs:
            for qx in self.index_of(q, restricted=False):
                causes = recovery.crash_causes(self, qx)
                if causes:
                    crashes.setdefault(q.label, []).extend(causes)
        return crashes

    @cached_property
    def recovery_state(self) -> tuple[str, str, Path]:
        """``(mode, why, file)``: how the next boot recovers this vhost and why
        (model.recovery.clean_state)."""
        return recovery.clean_state(self.vhost, self.options.assume_dirty, self.model, self.term_files)

    @property
    def recovery(self) -> str:
        """'clean' or 'dirty': how the next boot recovers this vhost (model.recovery.mode)."""
        return self.recovery_state[0]

    @cached_property
    def start_crash(self) -> str | None:
        """ "every" or "first": the vhost's message store crashes in its init at every start, or
        at the first (model.recovery.start_crash); None when it starts."""
        return recovery.start_crash(self)

    @property
    def store_crash(self) -> recovery.StoreCrash | None:
        """What can crash the vhost's store while a clean start serves it (model.recovery.store_crash)."""
        return recovery.store_crash(self)

    @cached_property
    def store_status(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per store entry: ``StoreStatus`` (live, orphan, duplicate) and the references of live copies.

        ``duplicate`` only ever labels a second (third, ...) copy of an id stored more than once:
        live = the copy the target version's recovery uses for a referenced id, or, when its
        store scan reaches no copy of it (behind damage: the messages say ``body_unreachable``),
        the first copy, the one the index refers to; orphan = the first copy of an id nothing
        references; duplicate = any other copy."""
        out = {}
        for kind, st in self.stores.items():
            refs = self.references[kind]
            n = len(st.e_id)
            at = np.arange(n)
            r = refs.ids.lookup(st.distinct.ids)  # per distinct id: position among the references
            count = np.where(r >= 0, refs.count[np.maximum(r, 0)], 0) if len(refs.count) else np.zeros(len(r), int)
            e_count = count[st.e_group] if n else np.zeros(0, int)
            first = st.first[st.e_group] == at if n else np.zeros(0, bool)
            claim = st.claim[st.e_group] if n else np.zeros(0, np.int64)
            status = np.full(n, StoreStatus.DUPLICATE, np.int8)
            status[(e_count == 0) & first] = StoreStatus.ORPHAN
            live = (e_count > 0) & ((claim == at) | ((claim < 0) & first))
            status[live] = StoreStatus.LIVE
            out[kind] = (status, np.where(live, e_count, 0).astype(np.int32))
        return out

    def orphan_destinations(self, kind: str = "persistent") -> dict[int, tuple[bytes, ...] | None]:
        """Per orphaned entry of the store (``store_status`` orphan; its position in the store's
        entry arrays): the queues of this vhost its exchange and routing keys reach under the
        metadata's durable bindings (``model.routing``), sorted; None where that cannot be told
        (undecodable term, unknown exchange or exchange type). The column a ``store`` table can
        carry, and what ``queue-index-missing`` counts for a lost queue."""
        cache = self.__dict__.setdefault("_orphan_destinations", {})
        if kind in cache:
            return cache[kind]
        from cqforensics.message import fast as fastpath
        from cqforensics.model.routing import Router, route_message

        out: dict[int, tuple[bytes, ...] | None] = {}
        st = self.stores.get(kind)
        vhost = self.vhost.name_raw
        if st is not None and len(st.e_id) and vhost is not None:
            router = Router(self.node.metadata)
            status, _ = self.store_status[kind]
            for e in np.flatnonzero(status == StoreStatus.ORPHAN).tolist():
                try:
                    msg = fastpath.decode(self.bodies.read(*st.term_span(e)))
                    dest = route_message(router, vhost, msg)
                except Exception:  # damaged term: its routing cannot be told
                    dest = None
                out[e] = tuple(sorted(dest)) if dest is not None else None
        cache[kind] = out
        return out

    @cached_property
    def clean_crashes(self) -> tuple[set[str], bool]:
        """Clean start: (queues a damaged message crashes on delivery, whether the vhost crashes);
        gathered share by share in a shared scan."""
        queues, vhost = set(), False
        for sub in self.each_share():
            q, v = recovery.clean_crashes(sub)
            queues, vhost = queues | q, vhost or v
        return queues, vhost

    def resolve(self, qx: IndexChunk) -> Resolved:
        """Locate every live entry's body (as the target version would) and decide its fate."""
        return recovery.resolve(self, qx)

    # -- reading a vhost in several processes (``cqforensics.base.parallel``) ------------------------

    def listing_bytes(self, every: bool = False) -> int:
        """The bytes a read of the listed queue dirs (``every``: of all of them) goes through:
        their index and queue-store files, and the vhost's shared stores (what decides whether
        to split a read)."""
        total = sum(_size(p) for st in self.vhost.stores.values() for _, p in st.rdq)
        for q in self.all_queue_dirs if every else self.queue_dirs:
            if q.qi or q.qs or q.idx or q.journal:  # most dirs of a node of many queues hold none
                total += (
                    sum(_size(p) for _, p in q.qi)
                    + sum(_size(p) for p in q.qs.values())
                    + sum(_size(p) for _, p in q.idx)
                    + (_size(q.journal) if q.journal else 0)
                )
        return total

    def prepare(self) -> None:
        """Make the vhost-wide facts resolving an index chunk needs (the store indexes, the
        references, the recovery mode, the crashing queues, ...) by resolving the scan's first
        chunk with live entries: before scans of ranges of the listing are forked, each of
        which would make them again."""
        for qx in self.live_chunks():
            if len(qx.live):
                self.resolve(qx)
                return

    def ranges(self, n: int, every: bool = False) -> list[dict]:
        """The scan's listing (its queue dirs, a v2 queue's segments; ``every``: every queue
        dir's, whatever ``only`` says) cut into at most ``n`` consecutive ranges of about equal
        bytes, each an ``only`` restriction of a scan."""
        units = []  # (queue dir name, segment or None, bytes)
        for q in self.all_queue_dirs if every else self.queue_dirs:
            allowed = self.only.get(q.dir_name) if self.only and not every else None
            if q.qi:
                for number, p in q.qi:
                    if allowed is None or number in allowed:
                        qs = q.qs.get(number)
                        units.append((q.dir_name, number, _size(p) + (_size(qs) if qs else 0) + 1))
            else:
                units.append((q.dir_name, None, sum(_size(p) for _, p in q.idx) + 1))
        target = max(1, -(-sum(w for _, _, w in units) // max(1, n)))
        out: list[dict] = []
        cur: dict = {}
        size = 0
        for name, seg, w in units:
            if cur and size + w > target and len(out) < n - 1:
                out.append(cur)
                cur, size = {}, 0
            if seg is None:
                cur[name] = None
            else:
                cur.setdefault(name, set()).add(seg)
            size += w
        if cur or not out:
            out.append(cur)
        return out

    @property
    def lost_queues(self) -> list[LostQueue]:
        """Durable classic queues of the metadata, homed on this node, whose index dir (a level
        dir, for a priority queue) is missing or unreadable under this vhost dir; the first
        vhost of the node (``NodeScan.vhosts[0]``) also carries those of vhosts with no dir."""
        lost = self.node.lost_queues
        out = list(lost.get(self.vhost.dir_name, []))
        vhosts = self.node.vhosts
        if vhosts and vhosts[0].vhost.path == self.vhost.path:
            out += lost.get(None, [])
        return out

    @property
    def quorum_queues(self) -> list[m_quorum.QuorumQueue]:
        """The node's quorum queues of this vhost (by the vhost their config names); the node's
        first vhost also gets those of no vhost dir here (a vhost deleted, or a config unread),
        so every quorum queue is listed once. A scan of planned units (``quorum_uids``) reads
        the members its units name; a scan restricted to classic queue dirs (``only``) reads
        none unless the driver names queues (``quorum_names``); an id share other than the
        first reads none (quorum rows come once, with share 0)."""
        if self.share is not None and self.share.k != 0:
            return []
        if self.quorum_uids is not None:
            return [q for q in self.node.quorum if q.log.uid in self.quorum_uids]
        if self.only is not None and self.quorum_names is None:
            return []
        names = {v.vhost.name for v in self.node.vhosts}
        first = bool(self.node.vhosts) and self.vhost.dir_name == self.node.vhosts[0].vhost.dir_name
        return [q for q in self.node.quorum if q.vhost == self.vhost.name or (first and q.vhost not in names)]

    def queue_known(self, qdir: QueueDir) -> bool | None:
        """Whether the dir is an index dir of a durable queue of the metadata, by its dir name
        (the broker keeps only those dirs, whatever their ``.queue_name`` says: a renamed dir is
        deleted); None when the metadata is unreadable."""
        dirs = self.node.durable_dirs
        if dirs is None:
            return None
        if self.keep_renamed and self.node.renamed_dir(self.vhost, qdir) is not None:
            return True
        return qdir.dir_name in dirs.get(self.vhost.dir_name, ())


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


class NodeScan:
    """One node dir: its metadata, the version model, and a VhostScan per vhost."""

    #: called with the bytes of the index files of each index chunk a listing is done with
    #: (``VhostScan.index_of``, ``live_chunks``): a long command's progress (``driver.Progress``)
    progress = None
    #: the dir name of the vhost whose check also makes the node-level findings (None: the
    #: node's first vhost); a read restricted to some vhosts names the first it reads
    node_level_vhost: str | None = None

    def carries_node_findings(self, vs: VhostScan) -> bool:
        """Whether the check of ``vs`` makes the findings about the node as a whole (its own
        files, the storage not read): those of one vhost per node, whatever the read leaves out
        (a vhost or queue restriction makes scans of its own; a read in shares, one per share)."""
        if not self.vhosts or (vs.share is not None and vs.share.k != 0):
            return False
        return vs.vhost.dir_name == (self.node_level_vhost or self.vhosts[0].vhost.dir_name)

    def __init__(self, node: NodeDir, options: Options | None = None):
        self.node = node
        self.options = options or make_options()

    @cached_property
    def metadata(self) -> Metadata:
        return read_metadata(self.node.path)

    @cached_property
    def version_range(self) -> versions.VersionRange:
        """The versions that may have written the data, and why (model.versions.Evidence)."""
        return infer_range(self)

    @cached_property
    def inferred(self) -> tuple[versions.BrokerModel, str]:
        r = self.version_range
        return r.model, f"written by {r.label}: {r.why}"

    @cached_property
    def model(self) -> versions.BrokerModel:
        if self.options.broker_model is not None:  # parsed once, by make_options
            return self.options.broker_model
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

    @cached_property
    def quorum_refusal(self) -> tuple[str, Path, int | None] | None:
        """(why, file, offset) of a quorum WAL the version's Ra refuses (``model.quorum.refusal``):
        the Ra system of quorum queues does not start, nor does the node (the checks' finding:
        ``quorum-wal-refused``)."""
        return next((r for r in map(m_quorum.refusal, self.quorum_systems) if r is not None), None)

    @property
    def boot_hangs(self) -> bool:
        """Whether the next boot never completes: it hangs (``hang_causes``) or the node exits
        (``quorum_refusal``)."""
        return bool(self.hang_causes) or self.quorum_refusal is not None

    @cached_property
    def quorum_systems(self) -> list[m_quorum.System]:
        """The node's Ra systems of quorum queues (``quorum/<node>/``: normally one), their WAL
        files walked and recovered as the next boot of ``model`` does; none while the quorum
        kind is not read (``layout.STORAGE_KINDS``)."""
        if not STORAGE_KINDS["quorum"].read:
            return []
        return [m_quorum.read_system(ra, self.model, self.wal_walks) for ra in self.node.quorum]

    @cached_property
    def coordination_systems(self) -> list[m_quorum.System]:
        """The node's coordination Ra system (``coordination/<node>/``: Khepri and the stream
        coordinator) read as ``quorum_systems`` are, for the checks of its log's own integrity
        (its machines are not replayed)."""
        return [m_quorum.read_system(ra, self.model, self.wal_walks) for ra in self.node.coordination]

    @cached_property
    def wal_walks(self) -> dict:
        """The node's Ra WAL files walked, each once (``model.quorum.wal_walk``): the version
        inference and the systems' recovery read the same files."""
        return {}

    @cached_property
    def quorum(self) -> list[m_quorum.QuorumQueue]:
        """Every quorum queue member of the node (``quorum/<node>/``), replayed, with what the
        next boot of ``model`` does (``model.quorum.node_quorum``)."""
        meta = self.metadata
        known = None if meta.kind is None else set(meta.queues)
        self._quorum_bodies = Bodies()
        return m_quorum.node_quorum(self.quorum_systems, self.model, self.options.now_ms(), self._quorum_bodies, known)

    @cached_property
    def boot_dead_letters(self) -> dict[tuple[str, str], list[tuple]]:
        """(vhost, queue) -> the messages quorum queues dead-letter at most once at the next boot
        (``QuorumQueue.boot_dead_letters``), routed through the metadata's durable bindings from
        the queue's dead-letter exchange: [(source QuorumQueue, reason, Msg, term, exchange, rk)].
        A message whose route cannot be told is left out (the finding says so)."""
        from cqforensics.message import reference as m_message
        from cqforensics.model.routing import Router

        out: dict[tuple[str, str], list[tuple]] = {}
        qs = [q for q in self.quorum if q.boot_dead_letters]
        if not qs or self.metadata.kind is None:
            return out
        router = Router(self.metadata)
        for q in qs:
            target = q.replay.fifo.cfg.dlx_target if q.replay.fifo is not None else None
            if target is None or q.log.resource is None:
                continue
            vhost = q.log.resource[0]
            exchange, rk = target
            for reason, m in q.boot_dead_letters:
                term = m_quorum.message_term(q.replay, m.index, self._quorum_bodies)
                if term is None:
                    continue
                try:
                    fields = m_message.normalise_checked(term)
                except CQError:
                    continue
                keys = [rk] if rk is not None else [k.encode() for k in fields["routing_keys"] if k is not None]
                queues = router.route(
                    vhost, exchange, keys, json.loads(fields["headers"]) if fields["headers"] else None
                )
                for name in sorted(queues or ()):
                    out.setdefault((vhost.decode("utf-8", "replace"), name.decode("utf-8", "replace")), []).append(
                        (q, reason, m, fields, exchange, rk)
                    )
        return out

    @cached_property
    def streams(self) -> list[StreamEntry]:
        """The node's streams (``<node dir>/stream/<name>/``), read, each with its owner and its
        next boot's fate (``stream_entries``); none while the stream kind is not read
        (``layout.STORAGE_KINDS``: a kind not read is named, never half read)."""
        return stream_entries(self) if STORAGE_KINDS["stream"].read else []

    def stream_home(self, e: StreamEntry) -> str | None:
        """The vhost dir name whose tables list stream ``e`` (``stream_home``)."""
        return stream_home(e.vhost, [v.vhost for v in self.vhosts])

    @cached_property
    def vhosts(self) -> list[VhostScan]:
        self.renamed = {}
        for v in self.node.vhosts:
            for d, own in name_from_metadata(v, self.metadata).items():
                self.renamed[(v.dir_name, d)] = own
        return [VhostScan(self, v) for v in sorted(self.node.vhosts, key=lambda v: (v.name is None, v.label))]

    @cached_property
    def durable_dirs(self) -> dict[str, set[str]] | None:
        """Vhost dir name -> the index dir names of its durable queues (every level of a
        priority queue): the dirs the next boot keeps (IDX2 start/2 deletes the others); None
        when the metadata is unreadable."""
        meta = self.metadata
        if meta.kind is None:
            return None
        out: dict[str, set[str]] = {}
        for vhost, name in meta.queues:
            out.setdefault(textfiles.vhost_dir_name(vhost), set()).update(
                d for d, _, _ in queue_dirs_of(meta, vhost, name)
            )
        return out

    def renamed_dir(self, vhost: VhostDir, qdir: QueueDir) -> tuple[str, bytes, int | None] | None:
        """A queue dir renamed away from its queue's own dir (see ``name_from_metadata``): (its
        queue's dir name, stored name, priority level); None for any other dir."""
        self.vhosts  # names (and finds renamed dirs) once
        return self.renamed.get((vhost.dir_name, qdir.dir_name))

    @cached_property
    def quorum_names(self) -> set[tuple[str, str]]:
        """(vhost, queue) of every quorum queue member's Ra server dir, by the queue resource its
        ``config`` names (read alone: no log is replayed). A member whose config is unreadable
        names nothing (its queue still shows, under its data dir's name, when read)."""
        from cqforensics.readers.ra_system import read_config

        out = set()
        for ra in self.node.quorum:
            for srv in ra.servers:
                if srv.config is None:
                    continue
                try:
                    res = read_config(srv.config).queue_resource
                except (CQError, OSError):
                    continue
                if res is not None:
                    out.add(tuple(x.decode("utf-8", "replace") for x in res))
        return out

    @cached_property
    def unread_storage(self) -> list[UnreadStorage]:
        """The kinds of queue storage cqforensics does not read (``layout.STORAGE_KINDS``) that
        this node holds data dirs of, each with the queues of that kind the metadata declares
        (the metadata is read only when there are such dirs)."""
        out = []
        for name, here in self.node.unread_storage().items():
            kind = STORAGE_KINDS[name]
            queues = [rec for rec in self.metadata.queues.values() if storage_kind(rec.type) is kind]
            root = self.node.path / kind.root
            out.append(
                UnreadStorage(
                    kind, sorted((display(q.vhost), display(q.name)) for q in queues), here, tree_bytes(root), root
                )
            )
        return out

    @cached_property
    def lost_queues(self) -> dict[str | None, list[LostQueue]]:
        """Vhost dir name -> the durable classic queues of that vhost whose index dir is missing
        or unreadable (None: those whose vhost has no dir at all). See ``lost_queues``."""
        out: dict[str | None, list[LostQueue]] = {}
        present = {v.dir_name for v in self.node.vhosts}
        for lq in lost_queues(self.node, self.metadata):
            key = lq.vhost_dir if lq.vhost_dir in present else None
            out.setdefault(key, []).append(lq)
        return out


def name_from_metadata(v: VhostDir, meta: Metadata) -> dict[str, tuple[str, bytes, int | None]]:
    """Name the vhost and queue dirs that lack a usable .vhost/.queue_name, by matching their
    dir names against the md5/base-36 names of the vhosts (the metadata's vhost list, and the
    vhosts of its durable queues) and durable queues the metadata lists.

    A queue dir whose ``.queue_name`` is whole but names a durable queue of another dir (a dir
    renamed, or two dirs swapped) keeps its dir name: the broker deletes it at boot, its queue
    boots empty. It is named from its ``.queue_name`` (``name_source`` "renamed") when that
    queue has no dir of its own here; returns those dirs: dir name -> (the queue's own dir
    name, stored name, priority level), what ``rebuild`` writes them back as."""
    if v.name is None:
        for vhost in sorted(set(meta.vhosts) | {vh for vh, _ in meta.queues}):
            if textfiles.vhost_dir_name(vhost) == v.dir_name:
                v.name_raw, v.name = vhost, vhost.decode("utf-8", "replace")
                break
    if v.name_raw is None or all(q.name is not None for q in v.queues):
        return {}
    dirs: dict[str, tuple[bytes, int | None]] = {}
    for (vhost, name), rec in meta.queues.items():
        if vhost == v.name_raw:
            for dir_name, _, prio in queue_dirs_of(meta, vhost, name):
                dirs[dir_name] = (name, prio)
    for q in v.queues:
        hit = dirs.get(q.dir_name) if q.name is None else None
        if hit is not None:
            name, prio = hit
            q.name, q.priority, q.name_source = name.decode("utf-8", "replace"), prio, "metadata"
            q.name_raw = name if prio is None else textfiles.priority_queue_name(name, prio)
    renamed = {}
    present = {q.dir_name for q in v.queues}
    for q in v.queues:
        if q.name is not None:
            continue
        try:
            raw = read_name_file(q.path / ".queue_name", [], ".queue_name")
            qn = textfiles.parse_queue_name(raw, v.name_raw) if raw is not None else None
        except CQError:  # unreadable, not a regular file, or damaged: nothing to go by
            continue
        if qn is None or qn.vhost != v.name_raw or meta.knows(qn.vhost, qn.base) is not True:
            continue
        own = textfiles.queue_dir_name(qn.vhost, qn.name)
        if own in present or own not in dirs or any(own == t for t, _, _ in renamed.values()):
            continue
        q.name, q.name_raw, q.priority = qn.base.decode("utf-8", "replace"), qn.name, qn.priority
        q.name_source, q.index_hint = "renamed", qn.index
        renamed[q.dir_name] = (own, qn.name, qn.priority)
    return renamed


@dataclass
class UnreadStorage:
    """Queues of a kind of storage cqforensics does not read, on one node: named by the metadata
    (every queue of the kind it declares: a cluster's metadata declares those of every node), and
    the kind's data dirs this node holds."""

    kind: StorageKind
    queues: list[tuple[str, str]]  # (vhost, name), display form, sorted
    dirs: list[Path]  # the kind's per-queue data dirs here (Ra server dirs, stream dirs)
    bytes: int  # under ``root`` (a Ra system's WAL holds its queues' newest entries), when it holds data dirs
    root: Path  # where the kind's data lies (quorum/, stream/)

    @property
    def nouns(self) -> str:
        return plural(len(self.queues), self.kind.noun) if self.queues else f"no {self.kind.noun} declared"

    def describe(self, limit: int = 8) -> str:
        """One sentence: which queues exist, where their data is, and that none of it is read."""
        names = ", ".join(f"{q!r} (vhost {v!r})" for v, q in self.queues[:limit])
        more = f" and {len(self.queues) - limit} more" if len(self.queues) > limit else ""
        what = (
            f"{plural(len(self.queues), self.kind.noun)} not read: {names}{more} (declared in the metadata"
            if self.queues
            else f"{self.kind.noun} data not read (the metadata declares no {self.kind.noun}"
        )
        data = (
            f"{plural(len(self.dirs), 'data dir')} here, {self.bytes:,} bytes under {display(self.root.name)}/"
            if self.dirs
            else f"no data dir here under {display(self.root.name)}/"
        )
        return (
            f"{what}; {data}): cqforensics does not read {self.kind.noun}s yet, so their messages are in no "
            "count, table or verdict here"
        )

    def to_dict(self) -> dict:
        return {
            "kind": self.kind.name,
            "queues": [{"vhost": v, "queue": q} for v, q in self.queues],
            "data_dirs": len(self.dirs),
            "bytes": self.bytes,
            "path": display(self.root),
        }


@dataclass
class LostQueue:
    """A durable classic queue whose index dir(s) the node does not have (or cannot read): the
    next boot starts it empty, and whatever its index held is gone; only its messages in the
    vhost's shared store may be left, as orphans."""

    record: QueueRecord
    vhost_dir: str  # the dir its vhost has (or would have)
    dirs: list[tuple[str, int | None, str]] = field(default_factory=list)  # (dir name, priority level, why)
    levels: int = 1  # index dirs the queue has in all (a priority queue: one per level)

    @property
    def vhost(self) -> bytes:
        return self.record.vhost

    @property
    def name(self) -> bytes:
        return self.record.name

    @property
    def label(self) -> str:
        return self.record.name.decode("utf-8", "replace")


def queue_dirs_of(meta: Metadata, vhost: bytes, name: bytes) -> list[tuple[str, bytes, int | None]]:
    """The index dirs a durable queue has: (dir name, stored name, priority level); one per
    level 0..x-max-priority for a priority queue (rabbit_priority_queue), else one."""
    known = meta.queue_dirs.get((vhost, name))
    if known is not None:
        return known
    levels = meta.arguments(vhost, name).get("x-max-priority")
    if isinstance(levels, int) and 0 < levels < 256:
        out = [
            (
                textfiles.queue_dir_name(vhost, textfiles.priority_queue_name(name, p)),
                textfiles.priority_queue_name(name, p),
                p,
            )
            for p in range(levels + 1)
        ]
    else:
        out = [(textfiles.queue_dir_name(vhost, name), name, None)]
    meta.queue_dirs[(vhost, name)] = out
    return out


def home_nodes(node: NodeDir, meta: Metadata) -> set[str]:
    """The names this node dir had: its own dir name, and the home node (pid) of every durable
    queue that has an index dir here (a backup may have renamed the dir)."""
    here = {(v.dir_name, q.dir_name) for v in node.vhosts for q in v.queues}
    names = {node.path.name}
    for (vhost, name), rec in meta.queues.items():
        if rec.node is not None and rec.node not in names:
            vdir = textfiles.vhost_dir_name(vhost)
            if any((vdir, d) in here for d, _, _ in queue_dirs_of(meta, vhost, name)):
                names.add(rec.node)
    return names


def lost_queues(node: NodeDir, meta: Metadata) -> list[LostQueue]:
    """Durable classic queues homed on this node (their pid names it, or no node) whose index
    dir, or a level dir of a priority queue, is not a readable dir under their vhost's dir.
    A queue homed on another node of a cluster has no dir here and is not listed; nor is
    anything when the metadata is unreadable."""
    if meta.kind is None or not meta.queues:
        return []
    vhost_dirs = {v.dir_name: v for v in node.vhosts}
    have_dirs = {v.dir_name: {q.dir_name for q in v.queues} for v in node.vhosts}
    homes = home_nodes(node, meta)
    out = []
    for (vhost, name), rec in sorted(meta.queues.items()):
        if not rec.classic or (rec.node is not None and rec.node not in homes):
            continue
        vdir = textfiles.vhost_dir_name(vhost)
        v = vhost_dirs.get(vdir)
        have = have_dirs.get(vdir, ())
        dirs = queue_dirs_of(meta, vhost, name)
        lq = LostQueue(rec, vdir, levels=len(dirs))
        for dir_name, _, prio in dirs:
            if dir_name in have:
                continue
            if v is None:
                why = "its vhost has no dir"
            else:
                path = v.path / "queues" / dir_name
                why = "not a directory" if os.path.lexists(path) else "missing"
            lq.dirs.append((dir_name, prio, why))
        if lq.dirs:
            out.append(lq)
    return out


_TERM_HEAD = 24  # bytes of a stored term enough to see its record tag and atom encoding


def infer_version(ns: NodeScan) -> tuple[versions.BrokerModel, str]:
    """The version to predict for (the newest the data allows) and why."""
    return ns.inferred


def infer_range(ns: NodeScan) -> versions.VersionRange:
    return collect_evidence(ns).range()


def feature_flags(node_dir: Path) -> tuple[str, ...]:
    """The enabled feature flags the broker lists beside its node dir (``<node>-feature_flags``,
    an Erlang list of atoms); () when the file is absent or unreadable."""
    import re

    try:
        raw = read_optional(node_dir.parent / f"{node_dir.name}-feature_flags", 65536)
    except CQError:  # unreadable, or not a regular file (a FIFO would block forever)
        return ()
    if raw is None:
        return ()
    text = raw.decode("utf-8", "replace").strip()
    if not (text.startswith("[") and text.rstrip(". \n").endswith("]")):
        return ()
    return tuple(a or b for a, b in re.findall(r"'([^']+)'|([a-z][A-Za-z0-9_@.]*)", text))


def collect_evidence(ns: NodeScan) -> versions.Evidence:
    """Collect version evidence cheaply: enabled feature flags, metadata kind, recovery terms,
    clean.dot, and the first bytes of a few stored terms."""
    ev = versions.Evidence(
        khepri=ns.metadata.kind == "khepri",
        mnesia=ns.metadata.kind == "mnesia",
        feature_flags=feature_flags(ns.node.path),
    )
    scans = {vs.vhost.path: vs for vs in ns.vhosts}  # their term files, decoded once per read
    for v in ns.node.vhosts:
        files = scans[v.path].term_files if v.path in scans else r_terms.TermFiles()
        for terms in files.recovery_terms(v.recovery_dets).values():
            ev.redeliver_seq_id |= "redeliver_seq_id" in terms
            ev.next_deliver_seq_id |= "next_deliver_seq_id" in terms
        for st in v.stores.values():
            dot = files.clean_dot(st.clean_dot)
            ev.index_module |= bool(dot and "index_module" in dot)
            ev.clean_dot_without_index_module |= bool(dot is not None and "index_module" not in dot)
        seen = 0
        for q in v.queues:
            ev.v1_files |= bool(q.idx or q.journal)
            for p in list(q.qs.values())[:1]:
                head = read_head(p, r_qs.first_term_start() + _TERM_HEAD)
                if len(head) == r_qs.first_term_start() + _TERM_HEAD:
                    versions.term_evidence(head[-_TERM_HEAD:], ev)
                    seen += 1
            if seen >= 3:
                break
        st = v.stores.get("persistent")
        if st is not None:
            for _, p in st.rdq[:1]:
                start, _ = r_rdq.term_span(0, 0)
                head = read_head(p, start + _TERM_HEAD)
                if len(head) == start + _TERM_HEAD:
                    versions.term_evidence(head[-_TERM_HEAD:], ev)
    root = Path(ns.node.path) / "stream"
    if root.is_dir():
        from cqforensics.readers import osiris as r_osiris

        for d in sorted(p for p in root.iterdir() if p.is_dir())[:3]:
            for raw in r_osiris.head_records(d):
                versions.stream_record_evidence(raw, ev)
    for ra in ns.node.quorum:
        ev.ra_writers_snapshot |= ra.writers is not None
        for _, p in ra.wal[-1:]:
            ev.ra_wal_digits = len(p.stem)
        ev.fifo_machine_version = m_quorum.newest_machine_version(ra, ns.wal_walks) or ev.fifo_machine_version
    return ev


def passes(vs: VhostScan) -> Iterator[VhostScan]:
    """The scans a read or check of a whole vhost is made of: ``vs`` itself when it is read
    whole, else one per id share in share order (``vs`` for its own share, when it is a scan of
    one). Each is made from the one before, so the vhost-wide facts one computes (crashes,
    recovery starts, the spilled walks) serve the next, and closed once the next is made; they
    end up in ``vs``."""
    parts = vs.share.parts if vs.share is not None else vs.shares
    if vs.share is None and parts == 1:
        yield vs
        return
    prev = vs
    try:
        for k in range(parts):
            sub = vs if vs.share is not None and vs.share.k == k else prev.share_scan(k, parts)
            if prev is not vs:
                prev.close()
            prev = sub
            yield sub
        vs.__dict__.update({key: val for key, val in prev.__dict__.items() if key in VhostScan.VHOST_WIDE})
    finally:
        if prev is not vs:
            prev.close()


# -- streams ------------------------------------------------------------------------------------------


@dataclass
class StreamEntry:
    """One stream directory of a node: the queue it belongs to (from the durable metadata when a
    stream queue's derived name matches the directory; else unknown), its scan and its fate."""

    path: Path
    vhost: str | None
    name: str | None
    name_source: str  # "metadata" or "dir" (no durable stream queue derives this dir's name)
    scan: object  # readers.osiris.StreamScan
    fate: object  # model.recovery.StreamFate

    @property
    def label(self) -> str:
        return self.name if self.name is not None else self.path.name


_B64URI = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-=")


def base64uri(text: str) -> str:
    """osiris_util:to_base64uri/1: every grapheme outside the base64uri alphabet becomes ``_``
    (RabbitMQ names a stream's directory ``to_base64uri(VHost ++ "_" ++ Name ++ "_" ++ Nanos)``,
    rabbit_stream_queue:stream_name/1)."""
    return "".join(c if c in _B64URI else "_" for c in text)


def stream_owners(node_path: Path, metadata: Metadata) -> list[tuple[Path, str | None, str | None, str]]:
    """Every stream dir under ``<node dir>/stream/`` in name order, with the vhost and name of
    the durable stream queue it belongs to and where they come from (``metadata``; ``dir``
    with None, None when no stream queue derives this dir's name)."""
    import re as _re

    root = Path(node_path) / "stream"
    if not root.is_dir():
        return []
    owners = []
    for (vh, nm), q in metadata.queues.items():
        if q.type == "rabbit_stream_queue":
            v, n = vh.decode("utf-8", "replace"), nm.decode("utf-8", "replace")
            owners.append((base64uri(f"{v}_{n}_"), v, n))
    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        hits = [
            (v, n)
            for prefix, v, n in owners
            if d.name.startswith(prefix) and _re.fullmatch(r"[0-9]+", d.name[len(prefix) :])
        ]
        out.append((d, hits[0][0], hits[0][1], "metadata") if len(hits) == 1 else (d, None, None, "dir"))
    return out


def stream_home(vhost: str | None, vhosts: list[VhostDir]) -> str | None:
    """The vhost dir name whose tables list a stream of vhost ``vhost`` (None: owner unknown):
    its owner's, else the default vhost's, else the first vhost's in listing order. The
    embedded reader lists a vhost's streams after its classic queues; a Spark plan puts the
    stream's unit there too (``spark_datasource.plan``)."""
    by_name = {v.name: v.dir_name for v in vhosts}
    if vhost is not None and vhost in by_name:
        return by_name[vhost]
    if "/" in by_name:
        return by_name["/"]
    first = sorted(vhosts, key=lambda v: (v.name is None, v.label))
    return first[0].dir_name if first else None


def stream_entries(node_scan) -> list[StreamEntry]:
    """Every stream dir under ``<node dir>/stream/``, read, with its owner and next-boot fate."""
    from cqforensics.model.recovery import stream_fate
    from cqforensics.readers import osiris as r_osiris

    out = []
    for d, vhost, name, source in stream_owners(node_scan.node.path, node_scan.metadata):
        scan = r_osiris.read_stream(d)
        out.append(StreamEntry(d, vhost, name, source, scan, stream_fate(scan, node_scan.model)))
    return out
