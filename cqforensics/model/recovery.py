"""The one model of the broker's recovery: what the next boot of a given version does to every
entry. Tables, fsck, audit, export, rebuild, compact, verify and the Spark writer all ask here.

* ``mode``: clean (the boot trusts the shutdown state) or dirty (it rebuilds from the files);
* ``reachable`` and ``claims``: which shared-store entries the version's store scan reaches, and
  which copy of each id it uses;
* ``resolve``: where each held message's body is and its ``Fate`` (the decision table, in the
  broker's own order of checks);
* what a writer may do with each fate (``SALVAGEABLE``, ``QUARANTINED``, ``BY_DESIGN``,
  ``intrinsic_fate``), and the finding code that names each way a message is lost
  (``FINDING_OF_FATE``).

Version behaviour is asked of ``BrokerModel`` properties (``model.versions``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cqforensics.codes import Fate, Location, QsStatus, RecordKind
from cqforensics.model.versions import BrokerModel
from cqforensics.readers import qs as r_qs
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers import terms as r_terms

# -- the shared-store scan ---------------------------------------------------------------------------


def reachable(f: r_rdq.RdqFile, model: BrokerModel) -> np.ndarray:
    """Per entry of ``f``: whether the version's store scan reaches it. <= 3.13.0 walks the chain
    of sizes and stops at a zero size field or an entry that does not fit (rabbit_msg_file:scan);
    later versions resynchronise and reach every entry with a valid marker."""
    if not model.sequential_scan or not (f.holes or f.bad_markers):
        return np.ones(len(f), bool)
    out = np.zeros(len(f), bool)
    out[r_rdq.broker_chain(f)] = True
    return out


def claims(e_file: np.ndarray, e_offset: np.ndarray, reach: np.ndarray, group: np.ndarray, n_ids: int,
           model: BrokerModel) -> np.ndarray:
    """Per distinct id: the entry the next boot uses, -1 when its scan reaches none: the first
    reachable copy in walk order (file, offset); <= 3.12 folds each file's candidates in reverse
    (build_index_worker foldl), so there the last copy within the first file holding it wins."""
    n = len(e_file)
    cand = np.flatnonzero(reach)
    rank = np.full(n, np.iinfo(np.int64).max)
    if model.last_copy_wins:
        rank[cand[np.lexsort((-e_offset[cand], e_file[cand]))]] = np.arange(len(cand))
    else:
        rank[cand] = np.arange(len(cand))
    claim = np.full(n_ids, -1, np.int64)
    if len(cand):
        order = cand[np.argsort(rank[cand], kind="stable")]
        claim[group[order[::-1]]] = order[::-1]  # numpy keeps the last write: the best-ranked copy
    return claim


# -- clean or dirty ---------------------------------------------------------------------------------


def mode(vhost, assume_dirty: bool) -> str:
    """'clean' when the next boot trusts the shutdown state (no index or store checks at all),
    else 'dirty' (rebuild from the files). Clean needs the persistent store's clean.dot,
    file_summary.ets and msg_store_index.ets intact and recovery terms whose persistent_refs are
    exactly clean.dot's client_refs (MS build_index / recover_index_terms)."""
    st = vhost.stores.get("persistent")
    if assume_dirty or st is None or not st.clean_dot.exists():
        return "dirty"
    dot = r_terms.clean_dot(st.clean_dot)
    terms = r_terms.recovery_terms(vhost.recovery_dets)
    if not dot or not terms:
        return "dirty"
    for ets in (st.file_summary, st.msg_store_index):
        if not ets.exists() or not r_terms.read_ets(ets).complete:
            return "dirty"
    refs = sorted(t.get("persistent_ref") for t in terms.values() if isinstance(t.get("persistent_ref"), bytes))
    client = dot.get("client_refs")
    return "clean" if isinstance(client, list) and sorted(client) == refs else "dirty"


def recorded_ok(st, ids: np.ndarray) -> np.ndarray:
    """Clean recovery: whether msg_store_index.ets places each id on a valid entry holding it."""
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


def clean_crashes(vs) -> tuple[set[str], bool]:
    """Clean recovery trusts the shutdown state, so a damaged message is only found when it is
    read for delivery, and that read crashes: (queues that crash, whether the whole vhost does)."""
    if vs.recovery != "clean":
        return set(), False
    queues, vhost = set(), False
    for q in vs.all_queue_dirs:
        for qx in vs.index_of(q, restricted=False):
            res = resolve(vs, qx, propagate=False)
            crashed = res.fate == Fate.DELIVERY_CRASH
            if crashed.any():
                queues.add(q.label)
                shared = qx.rec.loc[qx.live] == Location.SHARED_STORE
                vhost |= bool((crashed & shared).any()) and vs.model.shared_read_crash_takes_vhost
    return queues, vhost


# -- the fate of every held message -------------------------------------------------------------------


@dataclass
class Resolved:
    """Where the body of each live entry of a chunk is, and what the next boot does with it
    (arrays aligned with ``IndexChunk.live``; a few bytes per message)."""

    body_files: list[Path]  # body_file indexes this list
    body_file: np.ndarray  # int32, -1: body not found
    body_start: np.ndarray  # int64: term offset in that file
    body_len: np.ndarray  # int64
    store_offset: np.ndarray  # int64: entry offset (rdq entry, .qs entry, v1 embedded term); -1 none
    qs_status: np.ndarray  # int8 QsStatus
    fate: np.ndarray  # int8 Fate (DELIVERED: the next boot delivers it)

    def fates(self) -> list[Fate]:
        return [Fate(c) for c in self.fate.tolist()]

    def reasons(self) -> list[str | None]:
        return [Fate(c).reason for c in self.fate.tolist()]

    def span(self, j: int) -> tuple[Path, int, int] | None:
        """(file, start, length) of the body of live entry ``j``, None when not found."""
        f = int(self.body_file[j])
        return None if f < 0 else (self.body_files[f], int(self.body_start[j]), int(self.body_len[j]))


_QS_FATE = {QsStatus.MISSING_FILE: Fate.QS_MISSING_FILE, QsStatus.BAD_HEADER: Fate.QS_BAD_HEADER,
            QsStatus.OUT_OF_RANGE: Fate.QS_OUT_OF_RANGE, QsStatus.BAD_SIZE: Fate.QS_BAD_SIZE,
            QsStatus.BAD_CRC: Fate.QS_BAD_CRC}
_QS_FATE_CODES = np.array([_QS_FATE.get(s, -1) for s in sorted(QsStatus, key=int)], np.int8)  # by QsStatus code


# plain ints for ``resolve``'s array expressions
_SHARED, _QSTORE, _EMBEDDED = int(Location.SHARED_STORE), int(Location.QUEUE_STORE), int(Location.EMBEDDED)
_ON_DISK_CODES = np.array([_SHARED, _QSTORE, _EMBEDDED])
_BAD = int(RecordKind.BAD)


def intrinsic_fate(persistent: int, loc: int) -> Fate | None:
    """What no boot delivers, whatever else is wrong with the queue: a transient message, one the
    index keeps in memory only, one with no valid location."""
    if persistent != 1:
        return Fate.TRANSIENT
    if loc == Location.MEMORY:
        return Fate.NOT_ON_DISK
    if loc not in (Location.SHARED_STORE, Location.QUEUE_STORE, Location.EMBEDDED):
        return Fate.BAD_LOCATION
    return None


def queue_fate(vs, qx) -> Fate | None:
    """What happens to the whole queue dir at the next boot, before any entry is looked at."""
    known = vs.queue_known(qx.qdir)
    if known is False:
        return Fate.QUEUE_DELETED
    if qx.version == 1 and not vs.model.reads_v1:
        return Fate.V1_UNSUPPORTED
    if vs.node.boot_hangs:
        return Fate.BOOT_HANG
    if qx.qdir.label in vs.crashing_queues:
        return Fate.QUEUE_CRASH
    return None


def resolve(vs, qx, propagate: bool = True) -> Resolved:
    """Locate every live entry's body (as the target version would) and decide its fate.
    ``propagate``: include the crash a damaged message causes on a clean start (off while
    computing those crashes). Vectorised: each rule below is one array expression over the
    chunk's live entries, applied in the broker's order of checks."""
    r, live = qx.rec, qx.live
    n = len(live)
    loc, persistent, files = r.loc[live], r.persistent[live], r.file[live]
    st_off, st_size = r.store_offset[live], r.store_size[live]
    clean = vs.recovery == "clean"
    out = Resolved([], np.full(n, -1, np.int32), np.zeros(n, np.int64), np.zeros(n, np.int64),
                   np.full(n, -1, np.int64), np.zeros(n, np.int8), np.zeros(n, np.int8))
    file_ix: dict[Path, int] = {}

    def path_ix(path: Path) -> int:
        f = file_ix.get(path)
        if f is None:
            f = file_ix[path] = len(out.body_files)
            out.body_files.append(path)
        return f

    def body(rows: np.ndarray, file_of_row: np.ndarray, start, length) -> None:
        out.body_file[rows], out.body_start[rows], out.body_len[rows] = file_of_row, start, length

    problem = np.full(n, -1, np.int8)  # the fate a body problem causes (-1: none)
    # shared store: the claimed copy (else any copy) of each id
    shared = loc == _SHARED
    for kind, flag in (("persistent", 1), ("transient", 0)):
        sel = np.flatnonzero(shared & (persistent == flag))
        st = vs.stores.get(kind) if len(sel) else None  # no walk of a store nothing here needs
        if st is None:
            if not clean:
                problem[sel] = Fate.BODY_MISSING
            continue
        cp, ap = st.locate(r.msg_id[live[sel]])
        e = np.where(cp >= 0, cp, ap)
        have = e >= 0
        if have.any():
            rows, e = sel[have], e[have]
            used = np.unique(st.e_file[e])
            file_map = np.full(len(st.files), -1, np.int32)
            file_map[used] = [path_ix(st.files[k].path) for k in used.tolist()]
            body(rows, file_map[st.e_file[e]], *r_rdq.term_span(st.e_offset[e], st.e_total[e]))
            out.store_offset[rows] = st.e_offset[e]
        if clean:
            if kind == "persistent":  # the trusted index must place the id on a valid entry holding it
                problem[sel[~recorded_ok(st, r.msg_id[live[sel]])]] = Fate.DELIVERY_CRASH
        else:
            problem[sel[cp < 0]] = np.where(ap[cp < 0] >= 0, Fate.BODY_UNREACHABLE, Fate.BODY_MISSING)
    # per-queue store
    sel = np.flatnonzero(loc == _QSTORE)
    if len(sel):
        qs_path = qx.qs_path
        qs = vs.qs_files.get(qs_path) if qs_path is not None else None
        status = np.full(len(sel), QsStatus.MISSING_FILE, np.int8) if qs is None else \
            vs.bodies.qs_entries(qs, st_off[sel], st_size[sel])
        out.qs_status[sel] = status
        out.store_offset[sel] = st_off[sel]
        if qs is not None:
            ok = (status != QsStatus.BAD_HEADER) & (status != QsStatus.OUT_OF_RANGE)
            rows = sel[ok]
            body(rows, path_ix(qs_path), *r_qs.term_span(st_off[rows], st_size[rows]))
        # a dirty start checks the entry and drops it; a clean start crashes reading it,
        # except where the version reads a missing segment as no messages
        bad = status != QsStatus.OK
        tolerated = (status == QsStatus.MISSING_FILE) & vs.model.missing_qs_reads_empty
        qs_fate = _QS_FATE_CODES[status]
        problem[sel[bad]] = np.where(clean & ~tolerated, Fate.DELIVERY_CRASH, qs_fate)[bad]
    # terms embedded in a v1 index
    sel = np.flatnonzero(loc == _EMBEDDED)
    if len(sel):
        file_map = np.array([path_ix(p) for p in qx.files], np.int32)
        body(sel, file_map[files[sel]], st_off[sel], st_size[sel])
        out.store_offset[sel] = st_off[sel]
    # the broker's order of checks (IDX2 recover_segment; QI1 recover_message; delivery)
    expiry = r.expiry[live]
    expired = (expiry > 0) & (expiry <= vs.options.now_ms() * 1000)
    qdrop = queue_fate(vs, qx)
    at_risk = None  # clean recovery: messages a crash on delivery takes down with it
    if qdrop is None and clean and propagate:
        crash_queues, crash_vhost = vs.clean_crashes
        at_risk = Fate.VHOST_CRASH if crash_vhost else (Fate.QUEUE_CRASH if qx.qdir.label in crash_queues else None)
    bad_segment = np.isin(files, list(qx.bad_segments)) if qx.version == 2 and not clean and qx.bad_segments \
        else np.zeros(n, bool)
    intrinsic = np.where(persistent != 1, Fate.TRANSIENT,
                         np.where(loc == Location.MEMORY, Fate.NOT_ON_DISK, Fate.BAD_LOCATION))
    out.fate[:] = np.select(
        [(r.kind[live] == _BAD) & (qdrop in (None, Fate.QUEUE_CRASH)),
         np.full(n, qdrop is not None),
         bad_segment,
         (persistent != 1) | ~np.isin(loc, _ON_DISK_CODES),
         clean & expired,  # the queue drops an expired head without reading its body
         problem >= 0,
         expired],
        [Fate.BAD_INDEX_ENTRY, qdrop or 0, Fate.SEGMENT_DELETED, intrinsic, Fate.EXPIRED, problem, Fate.EXPIRED],
        at_risk or Fate.DELIVERED)
    return out


# -- what writers and checks make of a fate ----------------------------------------------------------

#: the next boot drops these although the message's bytes are intact: rebuild keeps them
SALVAGEABLE = frozenset({Fate.DELIVERED, Fate.EXPIRED, Fate.BODY_UNREACHABLE, Fate.SEGMENT_DELETED,
                         Fate.BAD_INDEX_ENTRY, Fate.QUEUE_CRASH, Fate.BOOT_HANG, Fate.V1_UNSUPPORTED,
                         Fate.DELIVERY_CRASH, Fate.VHOST_CRASH})
#: readable but not deliverable, or not trustworthy: rebuild puts them in lost+found with the bytes
QUARANTINED = frozenset({Fate.TRANSIENT, Fate.QUEUE_DELETED, Fate.QS_BAD_CRC, Fate.QS_BAD_SIZE})
#: dropped by design, not by damage (compact drops them; they make no rebuild exit 1)
BY_DESIGN = frozenset({Fate.TRANSIENT, Fate.QUEUE_DELETED})
#: kept by compact as they are: the broker delivers them, or drops them itself by its own clock
KEPT_AS_IS = frozenset({Fate.DELIVERED, Fate.EXPIRED})

#: the finding code that names each way the next boot loses a message
FINDING_OF_FATE = {
    Fate.QUEUE_DELETED: "unknown-queue", Fate.V1_UNSUPPORTED: "boot-crash", Fate.SEGMENT_DELETED: "qi-bad-header",
    Fate.BAD_INDEX_ENTRY: "qi-bad-entry", Fate.TRANSIENT: "transient-dropped", Fate.NOT_ON_DISK: "qi-bad-entry",
    Fate.BAD_LOCATION: "qi-bad-entry", Fate.BODY_MISSING: "msg-missing", Fate.BODY_UNREACHABLE: "rdq-garbage",
    Fate.QS_MISSING_FILE: "qs-entry-missing", Fate.QS_BAD_HEADER: "qs-bad-header",
    Fate.QS_OUT_OF_RANGE: "qs-entry-missing", Fate.QS_BAD_SIZE: "qs-entry-crc", Fate.QS_BAD_CRC: "qs-entry-crc",
    Fate.QUEUE_CRASH: "boot-crash", Fate.BOOT_HANG: "boot-crash", Fate.DELIVERY_CRASH: "boot-crash",
    Fate.VHOST_CRASH: "boot-crash",
}
