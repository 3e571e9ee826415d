"""Node and vhost scans: queue indexes joined to the shared stores the way the broker's recovery
joins them.

Memory is flat by construction, like the broker's own design: the only vhost-wide state is a
compact index of each shared store (numpy arrays, about 70 bytes per stored message, no Python
objects per message); queue indexes are streamed one segment at a time (a CQv1 queue at a time);
bytes are read through ``Bodies``, only a couple of files mapped at once.

``NodeScan`` -> ``VhostScan`` (lazy) -> ``StoreIndex`` per shared store, ``IndexChunk`` per
``.qi`` segment (or per CQv1 queue), ``Resolved`` per chunk (``model.recovery``).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property
from pathlib import Path

import numpy as np

from cqforensics.codes import Location, StoreStatus
from cqforensics.errors import CQError
from cqforensics.findings import Finding
from cqforensics.layout import NodeDir, QueueDir, VhostDir
from cqforensics.model import recovery, versions
from cqforensics.model.bodies import Bodies
from cqforensics.model.index import ID, IndexChunk, iter_chunks
from cqforensics.model.options import Options, make_options
from cqforensics.model.recovery import Resolved
from cqforensics.model.store import IdSet, References, StoreIndex, scan_store
from cqforensics.readers import terms as r_terms
from cqforensics.readers.metadata import Metadata, read_metadata
from cqforensics.readers import qs as r_qs
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers.files import read_head, read_optional
from cqforensics.readers.qs import QsFile, open_qs


class VhostScan:
    """One vhost of one node, analysed lazily."""

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
        self.bodies = Bodies()  # the one accessor of stored bytes
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

    def close(self) -> None:
        self.bodies.close()

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
            yield from self.index_of(q)

    def index_of(self, q: QueueDir, restricted: bool = True) -> Iterator[IndexChunk]:
        """One queue dir's index, chunk by chunk; ``restricted``: only the segments ``only`` lists."""
        segments = self.only.get(q.dir_name) if restricted and self.only else None
        return iter_chunks(q, self.vhost, segments)

    def scan_queue(self, q: QueueDir) -> Iterator[IndexChunk]:
        return self.index_of(q)

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
            for qx in self.index_of(q, restricted=False):
                r, live = qx.rec, qx.live
                for kind, flag in (("persistent", 1), ("transient", 0)):
                    sel = live[(r.loc[live] == Location.SHARED_STORE) & (r.persistent[live] == flag)]
                    if len(sel):
                        ids[kind].append(r.msg_id[sel])
                        queue[kind].append(np.full(len(sel), qi, np.int64))
                causes = [f for f in qx.findings if f.crashes_queue]
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
        """'clean' or 'dirty': how the next boot recovers this vhost (model.recovery.mode)."""
        return recovery.mode(self.vhost, self.options.assume_dirty)

    @cached_property
    def store_status(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per store entry: ``StoreStatus`` (live, orphan, duplicate) and the references of live copies.

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
            status = np.full(n, StoreStatus.DUPLICATE, np.int8)
            status[(e_count == 0) & (st.first[st.e_group] == at)] = StoreStatus.ORPHAN
            live = (e_count > 0) & (st.claim[st.e_group] == at)
            status[live] = StoreStatus.LIVE
            out[kind] = (status, np.where(live, e_count, 0).astype(np.int32))
        return out

    @cached_property
    def clean_crashes(self) -> tuple[set[str], bool]:
        """Clean start: (queues a damaged message crashes on delivery, whether the vhost crashes)."""
        return recovery.clean_crashes(self)

    def resolve(self, qx: IndexChunk) -> Resolved:
        """Locate every live entry's body (as the target version would) and decide its fate."""
        return recovery.resolve(self, qx)

    def queue_known(self, qdir: QueueDir) -> bool | None:
        if qdir.name_raw is None or self.vhost.name_raw is None:
            return None
        name = qdir.name_raw[:-2] if qdir.priority is not None else qdir.name_raw
        return self.node.metadata.knows(self.vhost.name_raw, name)


class NodeScan:
    """One node dir: its metadata, the version model, and a VhostScan per vhost."""

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
    ev = versions.Evidence(khepri=ns.metadata.kind == "khepri", mnesia=ns.metadata.kind == "mnesia",
                           feature_flags=feature_flags(ns.node.path))
    for v in ns.node.vhosts:
        for terms in r_terms.recovery_terms(v.recovery_dets).values():
            ev.redeliver_seq_id |= "redeliver_seq_id" in terms
            ev.next_deliver_seq_id |= "next_deliver_seq_id" in terms
        for st in v.stores.values():
            dot = r_terms.clean_dot(st.clean_dot)
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
    return ev