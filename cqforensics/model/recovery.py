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

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cqforensics.base.enums import Fate, Location, QsStatus, RecordKind, StoreStatus
from cqforensics.model.versions import BrokerModel
from cqforensics.readers import qs as r_qs
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers import terms as r_terms
from cqforensics.readers.terms import RAISES

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


def appended_reach(rdq: r_rdq.RdqFile, rdt: r_rdq.RdqFile, model: BrokerModel) -> np.ndarray:
    """Per entry of ``rdt``, the ``N.rdt`` of an interrupted combine that the next boot appends
    to ``N.rdq`` (``model.appends_rdt``; those versions scan sequentially): whether the scan of
    the joined file reaches it. It does when the scan of ``N.rdq`` ends exactly at its end (the
    combine was cut before it truncated the file, or just after); not when it stops earlier
    (the file already extended with zeros to its final size, or damaged). A last entry cut short
    would continue into the appended bytes: counted as not reached."""
    if rdq.holes or rdq.bad_markers:
        end = r_rdq.broker_scan(rdq)[1]
    else:  # entries tile the file: the scan reaches its end
        end = rdq.size
    return reachable(rdt, model) if end == rdq.size else np.zeros(len(rdt), bool)


def claims(
    e_file: np.ndarray, e_offset: np.ndarray, reach: np.ndarray, group: np.ndarray, n_ids: int, model: BrokerModel
) -> np.ndarray:
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


def mode(vhost, assume_dirty: bool, model: BrokerModel | None = None) -> str:
    """'clean' when the next boot trusts the shutdown state (no index or store checks at all),
    else 'dirty' (rebuild from the files); ``clean_state`` says why."""
    return clean_state(vhost, assume_dirty, model)[0]


def clean_state(
    vhost, assume_dirty: bool, model: BrokerModel | None = None, files: r_terms.TermFiles | None = None
) -> tuple[str, str, Path]:
    """``(mode, why, file)``: 'clean' or 'dirty' (see ``mode``), the reason, and the file it
    rests on. Clean needs the persistent store's clean.dot, file_summary.ets and
    msg_store_index.ets intact and recovery terms whose persistent_refs are exactly clean.dot's
    client_refs (MS build_index / recover_index_and_client_refs). A dump ets:file2tab raises on
    (``RAISES``) crashes the store's init: file_summary.ets at every start, clean or not (it is
    read first), msg_store_index.ets at a clean start's first one only (clean.dot is consumed
    before it): ``start_crash``. ``files``: the read's term files (``readers.terms.TermFiles``:
    each decoded once; what file2tab loads of a dump is ``readers.terms.file2tab_load``'s)."""
    files = files if files is not None else r_terms.TermFiles()
    st = vhost.stores.get("persistent")
    if st is not None and st.file_summary.exists() and files.ets(st.file_summary).load_outcome() is RAISES:
        return (
            "dirty",
            (
                f"{st.file_summary.name} makes ets:file2tab raise: the message store's init crashes at "
                "every start of the vhost, which stays down"
            ),
            st.file_summary,
        )
    if assume_dirty:
        return "dirty", "--assume-dirty", vhost.path
    if st is None or not st.clean_dot.exists():
        return "dirty", "no clean.dot", vhost.path
    if st.rdt and (model is None or model.appends_rdt):  # only <= 3.12 writes them
        return (
            "dirty",
            (f"{st.rdt[0][1].name} (an interrupted file combine): the store trusts neither file_summary nor its index"),
            st.rdt[0][1],
        )
    dot = files.clean_dot(st.clean_dot)
    if not dot:
        return "dirty", "clean.dot is unreadable", st.clean_dot
    terms = files.recovery_terms(vhost.recovery_dets)
    if not terms:
        return "dirty", "recovery.dets records no queue's recovery terms", vhost.recovery_dets
    raises = None
    for ets in (st.file_summary, st.msg_store_index):  # ets:file2tab must load them (not verify them)
        outcome = files.ets(ets).load_outcome() if ets.exists() else None
        if outcome is None:
            return "dirty", f"{ets.name} is missing or ets:file2tab cannot load it", ets
        if outcome is RAISES:
            raises = ets
            continue
        if model is not None and not model.store_index_loaded_unverified and not files.ets(ets).complete:
            return "dirty", f"{ets.name} fails ets:file2tab's verification", ets
    refs = sorted(t.get("persistent_ref") for t in terms.values() if isinstance(t.get("persistent_ref"), bytes))
    client = dot.get("client_refs")
    if isinstance(client, list) and sorted(client) == refs:
        if raises is not None:
            return (
                "dirty",
                (
                    f"{raises.name} makes ets:file2tab raise: the vhost's first start fails (its message "
                    "store's init crashes, clean.dot already consumed); restarted, it recovers dirty"
                ),
                raises,
            )
        return "clean", "clean shutdown", st.clean_dot
    n = len(client) if isinstance(client, list) else "no"
    return (
        "dirty",
        (f"clean.dot's client_refs ({n}) are not the persistent_refs of the queues' recovery terms ({len(refs)})"),
        st.clean_dot,
    )


def start_crash(vs) -> str | None:
    """The vhost's message store crashes in its init (``clean_state``): "every" start (the vhost
    stays down: nothing of it is served) or the "first" (a restart, ``rabbitmqctl
    restart_vhost`` or the next boot, recovers it dirty); None when it starts."""
    path = vs.recovery_state[2]
    if (
        path.name in ("file_summary.ets", "msg_store_index.ets")
        and path.is_file()
        and vs.term_files.ets(path).load_outcome() is RAISES
    ):
        return "every" if path.name == "file_summary.ets" else "first"
    return None


# -- what a clean start reads of its recorded state ------------------------------------------------------


def recorded_index(st):
    """The shared store's message index a clean start trusts: ``msg_store_index.ets`` as
    ``ets:file2tab`` loads it (``readers.terms.file2tab_load``; ``model.store.Recorded``, the
    records of the scan's share, made from ``EtsDump.locations(loaded=True)``); None without
    one, or when file2tab fails or raises on it."""
    return None if st is None else st.loaded


def recorded_summary(st) -> dict[int, tuple[int, int]] | None:
    """The store's file_summary.ets as a clean start loads it (``file2tab_objects``): file
    number -> (valid_total_size, file_size) (#file_summary{file, valid_total_size, left, right,
    file_size, locked, readers}, v3.10.0 - v4.3.x); None without one."""
    if st is None:
        return None
    cache = st.__dict__.setdefault("_broker_recorded", {})
    if "summary" not in cache:
        path = st.store.file_summary
        objs = r_terms.file2tab_objects(path) if path.exists() else None
        cache["summary"] = (
            None
            if objs is None or objs is RAISES
            else {
                o[1]: (o[2], o[5])
                for o in objs
                if isinstance(o, tuple)
                and len(o) == 8
                and o[0] == "file_summary"
                and isinstance(o[1], int)
                and isinstance(o[2], int)
                and isinstance(o[5], int)
            }
        )
    return cache["summary"]


def current_file(st) -> int | None:
    """The file a clean start makes the store's current one: the last of file_summary.ets
    (an ordered_set folded by build_index(true, ...), v3.10.0 - v4.3.x)."""
    summary = recorded_summary(st)
    return max(summary) if summary else None


def recorded_at(st, ids: np.ndarray) -> np.ndarray:
    """Clean recovery: per id, what msg_store_index.ets records of it: an (n, 4) int64 array of
    (count, file, offset, total size), -1 where it records no such id (or no integer from 0 to
    2^62)."""
    out = np.full((len(ids), 4), -1, np.int64)
    recorded = recorded_index(st)
    if recorded is None or not len(ids):
        return out
    pos = recorded.lookup(ids)
    hit = pos >= 0
    for j, col in enumerate((recorded.ref_count, recorded.file, recorded.offset, recorded.total)):
        v = col[pos[hit]]
        out[hit, j] = np.where((v >= 0) & (v < 1 << 62), v, -1)
    for k, rec in _other_hits(recorded, ids, pos):
        out[k] = [v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 62 else -1 for v in rec]
    return out


def recorded_files(st, ids: np.ndarray) -> np.ndarray:
    """Clean recovery: the file number msg_store_index.ets records for each id (-1: none)."""
    return recorded_at(st, ids)[:, 1]


def recorded_has(st, ids: np.ndarray) -> np.ndarray:
    """Clean recovery: whether the trusted index records each id at all (wherever it says).
    rabbit_msg_store read/contains: index_lookup_positive_ref_count (a count of 0 is not found)."""
    recorded = recorded_index(st)
    if recorded is None:
        return np.zeros(len(ids), bool)
    pos = recorded.lookup(ids)
    out = pos >= 0
    out[out] = recorded.ref_count[pos[out]] > 0
    for k, rec in _other_hits(recorded, ids, pos):
        out[k] = isinstance(rec[0], int) and rec[0] > 0
    return out


def _other_hits(recorded, ids: np.ndarray, pos: np.ndarray):
    """(row, record) of the ids only a damaged dump's other records hold."""
    others = recorded.other_ids()
    if not others:
        return
    keys = np.frombuffer(b"".join(others), ids.dtype)
    for k in np.flatnonzero((pos < 0) & np.isin(ids, keys)).tolist():
        yield k, others[ids[k].tobytes()]


_PLACE = 1 << 40  # (file number, offset) as one sortable integer: offsets below 2^40, numbers below 2^23


def recorded_ok(st, ids: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
    """Clean recovery: whether msg_store_index.ets places each id on a valid entry holding it.
    ``groups``: the ids' positions among the store's distinct ids (``distinct.lookup``), when
    looked up already."""
    recorded = recorded_index(st)
    if recorded is None:
        return np.zeros(len(ids), bool)
    g = st.distinct.lookup(ids) if groups is None else groups
    ok = _recorded_ok_groups(st)
    out = np.where(g >= 0, ok[np.maximum(g, 0)], False) if len(ok) else np.zeros(len(ids), bool)
    if recorded.others:
        for k, rec in _other_hits(recorded, ids, recorded.lookup(ids)):
            out[k] = _other_ok(st, ids[k].tobytes(), rec)
    return out


def _store_places(st) -> tuple[np.ndarray, np.ndarray]:
    """Every entry of the store as (file number, offset) in one sorted integer, and the entries
    in that order (made once per store index)."""
    cache = st.__dict__.setdefault("_recorded_places", {})
    if "places" not in cache:
        numbers = np.array([f.number for f in st.files] or [0], np.int64)
        keys = numbers[st.e_file] * _PLACE + st.e_offset if len(st.e_file) else np.zeros(0, np.int64)
        order = np.argsort(keys)
        cache["places"] = keys[order], order
    return cache["places"]


def _recorded_ok_groups(st) -> np.ndarray:
    """Per distinct id of the store: whether the trusted index records it (a count above 0) on a
    valid entry holding it, the id and total size there (every record checked at once, once per
    store index)."""
    cache = st.__dict__.setdefault("_recorded_places", {})
    if "ok" in cache:
        return cache["ok"]
    recorded = recorded_index(st)
    out = np.zeros(len(st.distinct), bool)
    keys, order = _store_places(st)
    if recorded is not None and len(keys) and len(recorded.ids):
        f, o = recorded.file, recorded.offset
        valid = (recorded.ref_count > 0) & (f >= 0) & (f < 1 << 23) & (o >= 0) & (o < _PLACE)
        place = np.where(valid, f * _PLACE + o, -1)
        by_place = np.argsort(place)  # searched in order: consecutive searches share the cache
        j = np.empty(len(place), np.int64)
        j[by_place] = np.minimum(np.searchsorted(keys, place[by_place]), len(keys) - 1)
        e = order[j]
        match = valid & (keys[j] == place) & (st.e_total[e] == recorded.total)
        match &= (st.e_id[e].view(">u8").reshape(-1, 2) == recorded.ids.ids.view(">u8").reshape(-1, 2)).all(axis=1)
        out[st.e_group[e[match]]] = True
    cache["ok"] = out
    return out


def _other_ok(st, raw: bytes, rec: tuple) -> bool:
    """``recorded_ok`` of one record a damaged dump holds apart (``Recorded.others``)."""
    if not (isinstance(rec[0], int) and rec[0] > 0 and isinstance(rec[1], int) and isinstance(rec[2], int)):
        return False
    if not (0 <= rec[1] < 1 << 23 and 0 <= rec[2] < _PLACE):
        return False
    keys, order = _store_places(st)
    i = int(np.searchsorted(keys, rec[1] * _PLACE + rec[2]))
    return (
        i < len(keys)
        and int(keys[i]) == rec[1] * _PLACE + rec[2]
        and st.e_id[order[i]].tobytes() == raw
        and int(st.e_total[order[i]]) == rec[3]
    )


@dataclass(frozen=True)
class QueueStart:
    """How a clean start recovers one v2 queue dir: from its recovery terms, without reading
    its index (rabbit_variable_queue:init/9 and IDX2 bounds). The queue expects ``count``
    (persistent_count) messages between ``low`` (the first segment of the terms'
    v2_index_state, times the segment size) and ``end`` (next_seq_id) and reads only those.
    ``found``: the live persistent entries the index holds there. ``kind``: ``terms`` (they
    agree: the queue delivers what it finds there, nothing outside), ``restart`` (they disagree: the q_tail/delta invariant fails, the queue process crashes at
    init and its supervisor restarts it without terms, recovering its index from the files as
    a dirty start would, against the shared store's recorded index)."""

    kind: str
    low: int
    end: int
    count: int
    found: int
    outside: int  # live entries outside [low, end)


def queue_starts(vs) -> dict[str, QueueStart]:
    """Clean start: per v2 queue dir (by dir name) with recovery terms, how it starts."""
    if vs.recovery != "clean" or not vs.model.queue_starts_from_terms:
        return {}
    cache = vs.__dict__.setdefault("_queue_starts", {})
    if "all" in cache:
        return cache["all"]
    from cqforensics.model.versions import CONSTANTS

    seg = CONSTANTS["classic_queue_index_v2_segment_entry_count"][0]
    terms = vs.term_files.recovery_terms(vs.vhost.recovery_dets)
    out = {}
    for q in vs.all_queue_dirs:
        t = terms.get(q.dir_name)
        state = t.get("v2_index_state") if t else None
        count, end = (t.get("persistent_count"), t.get("next_seq_id")) if t else (None, None)
        if not (
            isinstance(state, tuple)
            and len(state) == 2
            and isinstance(state[1], dict)
            and isinstance(count, int)
            and isinstance(end, int)
        ):
            continue
        segs = [k for k in state[1] if isinstance(k, int)]
        first = next(iter(vs.index_of(q, restricted=False)), None)  # chunks are read a segment at a time
        if first is not None and first.version != 2:
            continue
        # the node's segment size (a setting): the SeqId range its segment headers cover
        h = first.header if first is not None else None
        size = h.to_seq_id - h.from_seq_id if h is not None and h.ok and h.to_seq_id > h.from_seq_id else seg
        # IDX2 bounds: the first recorded segment; none recorded: next_seq_id (the hint) or 0
        low = min(segs) * size if segs else (end if vs.model.empty_index_bounds_at_next_seq_id else 0)
        found = outside = 0
        for qx in vs.index_of(q, restricted=False):
            r, live = qx.rec, qx.live
            seq = r.seq[live]
            inside = (seq >= low) & (seq < end)
            found += int((inside & (r.persistent[live] == 1)).sum())
            outside += int((~inside).sum())
        kind = "terms" if found == count else "restart"
        out[q.dir_name] = QueueStart(kind, low, end, count, found, outside)
    cache["all"] = out
    return out


def clean_crashes(vs) -> tuple[set[str], bool]:
    """Clean recovery trusts the shutdown state, so a damaged message is only found when it is
    read for delivery, and that read crashes: (queues that crash, whether the whole vhost does).
    The read runs in the queue process, which crashes alone, except up to 3.12 for the store's
    current file (``store_serves_current_file_reads``): the store process reads it and crashes,
    taking the vhost with it (rabbit_vhost_sup, one_for_all, intensity 0); the reading queue,
    waiting on it, crashes too and leaves no recovery terms, so the restart recovers dirty."""
    if vs.recovery != "clean" or not _may_crash(vs):
        return set(), False
    queues, vhost = set(), False
    st = vs.stores.get("persistent")
    current = current_file(st) if vs.model.store_serves_current_file_reads else None
    for qx in vs.live_chunks(whole=True):
        res = resolve(vs, qx, propagate=False)
        crashed = res.fate == Fate.DELIVERY_CRASH
        once = res.crash_once if res.crash_once is not None else np.zeros(len(crashed), bool)
        if crashed.any() or (once & np.isin(res.fate, _QS_FATE_CODES[_QS_FATE_CODES >= 0])).any():
            queues.add(qx.qdir.label)
            at = np.flatnonzero(
                crashed & (qx.rec.loc[qx.live] == Location.SHARED_STORE) & (qx.rec.persistent[qx.live] == 1)
            )
            if current is not None and len(at):
                vhost |= bool((recorded_files(st, qx.rec.msg_id[qx.live[at]]) == current).any())
    return queues, vhost


def _refs_placed(vs) -> bool:
    """Whether the trusted index places every persistent shared-store message the scan's
    indexes hold right (``recorded_ok``): then none of them is missing from it or crashes its
    read (no ``DELIVERY_CRASH``, ``NOT_IN_STORE_INDEX``, nor a failed read of an expired one)."""
    if "_refs_placed" not in vs.__dict__:
        st, refs = vs.stores.get("persistent"), vs.references.get("persistent")
        vs.__dict__["_refs_placed"] = (
            st is None or refs is None or not len(refs.ids) or bool(recorded_ok(st, refs.ids.ids).all())
        )
    return vs.__dict__["_refs_placed"]


def _may_crash(vs) -> bool:
    """Clean start: whether any held message could crash its read (``clean_crashes``), False
    when none can: every persistent shared-store reference is placed right by the trusted
    index (``recorded_ok``: no ``DELIVERY_CRASH``) and every ``.qs`` entry checks (no
    ``crash_once``). The common case, proved without resolving every entry."""
    if not _refs_placed(vs):
        return True
    checked = vs.__dict__.get("qs_entries_checked")  # found by the index pass of an unshared scan
    if checked is not None:
        return not checked
    return not all(qs_entries_check(vs, qx) for qx in vs.live_chunks(whole=True))


def qs_entries_check(vs, qx) -> bool:
    """Whether every live ``.qs`` entry of index chunk ``qx`` checks (no ``crash_once`` on a
    clean start's read of it). The index pass asks it of each chunk it reads when the vhost
    recovers clean and a listing of every index follows (``VhostScan._index_refs``), so that
    ``_may_crash`` reads no index again."""
    r, live = qx.rec, qx.live
    in_qs = live[r.loc[live] == _QSTORE]
    files = r.file[in_qs]
    for f in np.unique(files).tolist():
        sel = in_qs[files == f]
        qs_path = qx.qs_of(f)
        qs = vs.qs_files.get(qs_path) if qs_path is not None else None
        if qs is None or (vs.bodies.qs_entries(qs, r.store_offset[sel], r.store_size[sel]) != QsStatus.OK).any():
            return False
    return True


def lost_on_read(vs) -> dict[str, tuple[int, int]]:
    """Clean start: queues whose read fails again after every restart (the recorded index
    places a message on bytes that do not hold it, a missing file among them, and still says it
    has it; the restarted queue asks the store, which answers it has it): label -> (priority
    level, -1 for none; seq id) of the first such message in delivery order (the highest level
    first, then by seq id). From there the queue is lost (``DELIVERY_CRASH``, the rest
    ``QUEUE_CRASH``; its supervisor gives up after ``CONSTANTS["queue_restarts"]``); what comes
    before is delivered, up to 3.12 exactly (``read_before_loss``). Gathered share by share in a
    scan of one id share."""
    if "_lost_on_read" not in vs.__dict__:
        lost: dict[str, tuple[int, int]] = {}
        for sub in vs.each_share() if vs.recovery == "clean" else ():
            # a DELIVERY_CRASH is a persistent reference the trusted index does not place right
            # (shared_copies): none in a share where it places every one (the common case)
            if _refs_placed(sub):
                continue
            for qx in sub.live_chunks(whole=True):
                bad = resolve(sub, qx, propagate=False).fate == Fate.DELIVERY_CRASH
                if bad.any():
                    level = qx.qdir.priority if qx.qdir.priority is not None else -1
                    at = (level, int(qx.rec.seq[qx.live[bad]].min()))
                    was = lost.get(qx.qdir.label)
                    if was is None or (-at[0], at[1]) < (-was[0], was[1]):
                        lost[qx.qdir.label] = at
        vs.__dict__["_lost_on_read"] = lost
    return vs.__dict__["_lost_on_read"]


def read_before_loss(vs, qx) -> np.ndarray | None:
    """Per live entry of a chunk of a queue ``lost_on_read``: whether it comes before the first
    message whose read fails for good (None for other queues). Up to 3.12 the queue reads each
    shared-store body as it delivers it, so it delivers exactly those; from 3.13 it reads
    them in batches (``store_reads_in_batches``), and a failing batch takes its earlier messages
    with it: at most those."""
    at = lost_on_read(vs).get(qx.qdir.label) if vs.recovery == "clean" else None
    if at is None:
        return None
    level = qx.qdir.priority if qx.qdir.priority is not None else -1
    if level != at[0]:
        return np.full(len(qx.live), level > at[0])
    return qx.rec.seq[qx.live] < at[1]


def clean_restarts(vs) -> dict[str, list[str]]:
    """Clean start: queues that crash once and are restarted by their supervisor, which then
    recovers their index from the files (dirty, against the store's recorded index): label ->
    why ("init": recovery terms that disagree with the index; "read": a message the recorded
    index does not hold, read for delivery: the consumer gets 541 INTERNAL_ERROR). Gathered
    share by share in a scan of one id share (a queue's first reason in share order)."""
    if vs.recovery != "clean" or vs.clean_crashes[1]:  # a vhost crash restarts everything dirty
        return {}
    if "_clean_restarts" in vs.__dict__:
        return vs.__dict__["_clean_restarts"]
    starts = queue_starts(vs)
    inits = {
        q.dir_name
        for q in vs.all_queue_dirs
        if starts.get(q.dir_name) is not None and starts[q.dir_name].kind == "restart"
    }
    why: dict[str, str] = {}  # dir name -> its first reason found
    for sub in vs.each_share():
        if _refs_placed(sub):  # no message of this share is missing from the trusted index
            continue
        for qx in sub.live_chunks(whole=True):
            name = qx.qdir.dir_name
            if name in inits or name in why:
                continue
            fate = resolve(sub, qx, propagate=False).fate
            if (fate == Fate.NOT_IN_STORE_INDEX).any():
                why[name] = "read"
                continue
            # an expired message is read only to be dead-lettered: the read may crash the queue
            expired = qx.live[fate == Fate.EXPIRED]
            shared = expired[(qx.rec.loc[expired] == Location.SHARED_STORE) & (qx.rec.persistent[expired] == 1)]
            if len(shared) and not recorded_has(sub.stores.get("persistent"), qx.rec.msg_id[shared]).all():
                why[name] = "expiry"
    out: dict[str, list[str]] = {}
    for q in vs.all_queue_dirs:
        reason = "init" if q.dir_name in inits else why.get(q.dir_name)
        if reason is not None:
            out.setdefault(q.label, []).append(reason)
    vs.__dict__["_clean_restarts"] = out
    return out


# -- the message store crashing under a running vhost ----------------------------------------------


def versions_constant(name: str):
    """A setting every version shares (``versions.CONSTANTS``)."""
    from cqforensics.model.versions import CONSTANTS

    return CONSTANTS[name][0]


@dataclass(frozen=True)
class StoreCrash:
    """What can crash a vhost's persistent message store while a clean start serves it, and what
    follows (docs/store-crash.md). In every version the store traps exits, so its terminate/2
    writes its state as a clean stop would (file_summary.ets, msg_store_index.ets from its
    in-memory index, clean.dot naming every client ref it knows: rabbit_msg_store terminate);
    rabbit_vhost_sup (one_for_all, intensity 0) stops every process of the vhost, and the queues
    write their recovery terms (rabbit_variable_queue:terminate) unless they crashed themselves;
    rabbit_vhost_sup_wrapper restarts the vhost (``CONSTANTS["vhost_restarts"]``). The restart
    recovers the store clean when clean.dot's client refs are exactly the ones of the queues'
    recovery terms (rabbit_msg_store recover_index_and_client_refs): no queue crashed before (a
    restarted queue takes a new ref, and the store keeps the old one), none died with the store.
    Else dirty: the files scanned, every queue's index checked against them, so no recorded
    state is trusted any more and nothing crashes the store again.

    ``triggers``: (kind, queue labels or store files) of each way it can crash: ``remove`` (a
    queue drops expired messages the recorded index lacks without reading them: remove_message
    has no clause for ``{false, not_found}``), ``read`` (up to 3.12 a read of the current file
    the store serves fails: ``store_serves_current_file_reads``), ``gc`` (the garbage collector
    meets a file its recorded state does not describe: ``store_gc``), ``double-ack`` (a message
    several queues hold, one of which can crash and be restarted, then deliver again what it had
    delivered and acked: its second ack takes the message's count to 0 under another holder)."""

    triggers: tuple[tuple[str, tuple[str, ...]], ...]
    certain: bool  # the crash happens whatever the timing (a ``read``, once that queue is read)
    restart: str  # "dirty", or "either" (clean or dirty, depending on timing)
    may_stay_down: bool  # more crashes than the vhost's supervisor restarts: the vhost may stay down
    #: a crash while the vhost's queues are still starting (``remove``, at boot) on Khepri
    #: metadata: a queue may be left recorded as stopped (404 "process is stopped by supervisor")
    #: until the vhost is restarted (seen on 4.3.6, not on 3.10.8 or 4.0.5 with Mnesia)
    queues_may_stop: bool = False

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.triggers)


def dead_letters(vs, qdir) -> bool | None:
    """Whether the queue dead-letters its expired messages (then it reads them first): True when
    its arguments name an x-dead-letter-exchange, else None (a policy may still name one; the
    metadata's policies are not read)."""
    meta = vs.node.metadata
    name = qdir.name_raw.split(b"\x00")[0] if qdir.name_raw is not None else None
    vhost = vs.vhost.name_raw
    if name is None or vhost is None or meta.kind is None:
        return None
    return True if meta.arguments(vhost, name).get("x-dead-letter-exchange") is not None else None


def restarting_queues(vs) -> set[str]:
    """Clean start: the queues that crash while serving and are restarted by their supervisor
    (a read of a damaged message, recovery terms that disagree with the index): each comes back
    with a new client ref, and delivers again what it had delivered since its last index flush."""
    if vs.recovery != "clean":
        return set()
    return set(vs.clean_crashes[0]) | set(clean_restarts(vs))


def double_ackers(vs) -> set[str]:
    """The restarting queues (``restarting_queues``) that hold a message another queue holds
    too: their second ack of it can take its count to 0 (``double_acked``)."""
    double_acked(vs)
    return vs.__dict__["_double_ackers"]


def double_acked(vs) -> dict[str, set[bytes]]:
    """Clean start: per queue, the ids of shared-store messages it holds that may be gone when it
    reads them: another holder of the same stored message can crash, be restarted, and ack it a
    second time (its first ack reached the store, its index did not record it), taking the
    count to 0 (seen on 3.10.8 and 4.0.5, tests/real_brokers/test_recovery_state_brokers.py). Gathered share
    by share (every holder of an id is in that id's share)."""
    if "_double_acked" in vs.__dict__:
        return vs.__dict__["_double_acked"]
    out: dict[str, set[bytes]] = {}
    ackers: set[str] = set()
    restarting = restarting_queues(vs)
    if restarting:
        for sub in vs.each_share():
            ids, labels, names = [], [], {}
            for qx in sub.live_chunks(whole=True):
                r, live = qx.rec, qx.live
                sel = live[(r.loc[live] == _SHARED) & (r.persistent[live] == 1)]
                if len(sel):
                    ids.append(r.msg_id[sel])
                    labels.append(np.full(len(sel), names.setdefault(qx.qdir.label, len(names)), np.int32))
            if not ids:
                continue
            ids_all, lab = np.concatenate(ids), np.concatenate(labels)
            by_name = {v: k for k, v in names.items()}
            halves = np.frombuffer(ids_all.tobytes(), ">u8").reshape(-1, 2)
            order = np.lexsort((lab, halves[:, 1], halves[:, 0]))
            halves, lab, ids_all = halves[order], lab[order], ids_all[order]
            new = np.r_[True, (halves[1:] != halves[:-1]).any(axis=1)]
            starts = np.flatnonzero(new)
            ends = np.r_[starts[1:], len(lab)]
            many = np.flatnonzero((ends - starts > 1) & (lab[starts] != lab[ends - 1]))
            for a, b in zip(starts[many].tolist(), ends[many].tolist()):
                holders = {by_name[int(x)] for x in lab[a:b]}
                again = holders & restarting
                ackers |= again
                for q in holders:
                    if again - {q}:
                        out.setdefault(q, set()).add(ids_all[a].tobytes())
    vs.__dict__["_double_acked"], vs.__dict__["_double_ackers"] = out, ackers
    return out


def _gc_sums(vs, st) -> tuple[dict[int, int], dict[int, int], set[int]]:
    """Per store file of this scan's share, for ``_gc_hazards``: the bytes of the live entries the
    index places right there with a count above 0 (their reads succeed: they get acked), the
    bytes of the entries the GC's scan reaches that the index places right there with a count
    above 0 (what it finds valid), and the files whose scan meets an entry the index places
    elsewhere in the same file."""
    if recorded_index(st) is None or not len(st.e_id):
        return {}, {}, set()
    rec = recorded_at(st, st.e_id)
    numbers = np.array([f.number for f in st.files], np.int64)[st.e_file]
    here = rec[:, 1] == numbers
    exact = here & (rec[:, 2] == st.e_offset) & (rec[:, 3] == st.e_total) & (rec[:, 0] > 0)
    live = vs.store_status["persistent"][0] == StoreStatus.LIVE

    def per_file(sel):
        files, sums = np.unique(numbers[sel], return_inverse=True)
        return dict(zip(files.tolist(), np.bincount(sums, weights=st.e_total[sel]).astype(np.int64).tolist()))

    misplaced = here & st.reach & ~((rec[:, 2] == st.e_offset) & (rec[:, 3] == st.e_total))
    return per_file(exact & live), per_file(exact & st.reach), set(numbers[misplaced].tolist())


def _gc_hazards(
    model,
    summary: dict[int, tuple[int, int]] | None,
    on_disk: set[int],
    sums: tuple[dict[int, int], dict[int, int], set[int]],
) -> set[int]:
    """Clean start: the store files whose garbage collection can crash the store (``store_gc``),
    from file_summary.ets as loaded and ``_gc_sums`` over the whole vhost. ``combine`` (up to
    3.12): once the store holds more than 2 files' worth (taken as 3 files or more), two
    neighbouring non-current files whose valid data fits in one file are merged, and
    load_and_vacuum_message_file must find each one's file_summary valid_total_size among the
    entries its scan reaches that the index places there (a missing file is opened and fails):
    a file is at risk when it is not so, and what can never be acked of it (its valid size less
    the live entries whose reads succeed) leaves room for a neighbour within the file size limit
    (a setting: estimated as the median size of the older files, as a file rolls over once it
    reaches it, and at most the default). ``compact``
    (3.13+): a file at most half valid once its readable messages are acked is compacted in
    place, and scan_and_vacuum_message_file has no clause for an entry the index places in that
    file at another offset or size."""
    if not summary:
        return set()
    removable, matching, misplaced = sums
    current = max(summary)
    older = sorted(n for n in summary if n != current)
    stuck = {n: max(0, summary[n][0] - removable.get(n, 0)) for n in older}
    if model.store_gc == "compact":
        return {n for n in older if n in misplaced and stuck[n] * 2 < summary[n][1]}
    if len(summary) < 3:
        return set()
    limit = min(float(np.median([summary[n][1] for n in older])), versions_constant("msg_store_file_size_limit"))
    out = set()
    for pos, n in enumerate(older):
        if n in on_disk and matching.get(n, 0) == summary[n][0]:
            continue
        if any(stuck[n] + max(1, stuck[m]) <= limit for m in older[max(0, pos - 1) : pos] + older[pos + 1 : pos + 2]):
            out.add(n)
    return out


def store_crash(vs) -> StoreCrash | None:
    """Clean start: what can crash the vhost's persistent store while it serves (``StoreCrash``),
    None when nothing can. Gathered share by share in a scan of one id share."""
    if "_store_crash" in vs.__dict__:
        return vs.__dict__["_store_crash"]
    out = None
    if vs.recovery == "clean":
        removes, sums, summary, on_disk = set(), ({}, {}, set()), None, set()
        for sub in vs.each_share():
            st = sub.stores.get("persistent")
            if st is None:
                continue
            summary, on_disk = recorded_summary(st), {f.number for f in st.files}
            part = _gc_sums(sub, st)
            for total, got in zip(sums[:2], part[:2]):
                for n, b in got.items():
                    total[n] = total.get(n, 0) + b
            sums[2].update(part[2])
            now = sub.options.now_ms() * 1000
            # no live entry has an expiry (the index pass of an unshared scan saw them all): none
            # can expire, and no index is read again for it
            for qx in sub.live_chunks(whole=True) if sub.__dict__.get("live_ttl") is not False else ():
                r, live = qx.rec, qx.live
                expiry = r.expiry[live]
                if qx.qdir.label in removes or not ((expiry > 0) & (expiry <= now)).any() or dead_letters(sub, qx.qdir):
                    continue
                fate = resolve(sub, qx, propagate=False).fate
                sel = live[(fate == Fate.EXPIRED) & (r.loc[live] == _SHARED) & (r.persistent[live] == 1)]
                if len(sel) and not recorded_has(st, r.msg_id[sel]).all():
                    removes.add(qx.qdir.label)
        files = {f"{n}.rdq" for n in _gc_hazards(vs.model, summary, on_disk, sums)}
        doubles = double_ackers(vs)
        triggers = []
        crash_queues, crash_vhost = vs.clean_crashes
        if crash_vhost:
            triggers.append(("read", tuple(sorted(crash_queues, key=str))))
        if removes:
            triggers.append(("remove", tuple(sorted(removes, key=str))))
        if files:
            triggers.append(("gc", tuple(sorted(files, key=lambda f: int(f.split(".")[0])))))
        if doubles:
            triggers.append(("double-ack", tuple(sorted(doubles, key=str))))
        if triggers:
            kinds = {k for k, _ in triggers}
            out = StoreCrash(
                tuple(triggers),
                certain="read" in kinds,
                restart="either" if kinds & {"remove", "gc"} else "dirty",
                may_stay_down="gc" in kinds or len(removes) > versions_constant("vhost_restarts")[0],
                queues_may_stop="remove" in kinds and vs.node.metadata.kind == "khepri",
            )
    vs.__dict__["_store_crash"] = out
    return out


def delivery_bounds(vs, qx, res: Resolved) -> tuple[np.ndarray, np.ndarray]:
    """Per live entry of a chunk (aligned with ``res``): whether the next boot delivers it
    whatever the timing (at least), and whether it may (at most). Exact (both ``fate ==
    DELIVERED``) unless the store can crash under the running vhost (``store_crash``): then a
    message counts at least when both the clean and the dirty recovery deliver it, at most when
    either does (what a queue delivers before the crash, and after a restart that recovers
    dirty); none at least when the vhost may stay down, or a queue may be left stopped. A
    message another holder may ack twice (``double_acked``) is not counted at least."""
    now = res.fate == Fate.DELIVERED
    lo, hi = now.copy(), now.copy()
    before = read_before_loss(vs, qx)
    if before is not None and vs.model.store_reads_in_batches:
        hi |= before & (res.fate == Fate.QUEUE_CRASH)
    crash = store_crash(vs)
    if crash is not None:
        other = "clean" if not reads_clean(vs) else "dirty"
        alt = resolve(vs, qx, regime=other).fate == Fate.DELIVERED
        lo &= alt
        hi |= alt
        if crash.may_stay_down or crash.queues_may_stop:
            lo[:] = False
    acked = double_acked(vs).get(qx.qdir.label) if vs.recovery == "clean" else None
    if acked and lo.any():
        r, live = qx.rec, qx.live
        shared = (r.loc[live] == _SHARED) & (r.persistent[live] == 1)
        at = np.flatnonzero(lo & shared)
        raw = r.msg_id[live[at]]
        lo[at[[raw[k].tobytes() in acked for k in range(len(at))]]] = False
    return lo, hi


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
    #: clean start: reading this entry crashes its queue once (541); the restarted queue recovers
    #: its index dirty and drops the entry with ``fate`` (None: no such entry)
    crash_once: np.ndarray | None = None

    def fates(self) -> list[Fate]:
        return [Fate(c) for c in self.fate.tolist()]

    def reasons(self) -> list[str | None]:
        return [Fate(c).reason for c in self.fate.tolist()]

    def span(self, j: int) -> tuple[Path, int, int] | None:
        """(file, start, length) of the body of live entry ``j``, None when not found."""
        f = int(self.body_file[j])
        return None if f < 0 else (self.body_files[f], int(self.body_start[j]), int(self.body_len[j]))


_QS_FATE = {
    QsStatus.MISSING_FILE: Fate.QS_MISSING_FILE,
    QsStatus.BAD_HEADER: Fate.QS_BAD_HEADER,
    QsStatus.OUT_OF_RANGE: Fate.QS_OUT_OF_RANGE,
    QsStatus.BAD_SIZE: Fate.QS_BAD_SIZE,
    QsStatus.BAD_CRC: Fate.QS_BAD_CRC,
}
_QS_FATE_CODES = np.array([_QS_FATE.get(s, -1) for s in sorted(QsStatus, key=int)], np.int8)  # by QsStatus code


def qs_fate(status) -> Fate | None:
    """What the check of a message's ``.qs`` entry alone makes of it (None: the entry is fine, or
    the message has none): writers quarantine a message whose entry contradicts its index, even
    where a queue-level fate (a crash) comes first in the boot's order."""
    return _QS_FATE.get(QsStatus(int(status))) if int(status) else None


# plain ints for ``resolve``'s array expressions
_SHARED, _QSTORE, _EMBEDDED = int(Location.SHARED_STORE), int(Location.QUEUE_STORE), int(Location.EMBEDDED)
_ON_DISK = np.zeros(256, bool)  # by Location code + 1 (an int8 code, -1..126)
_ON_DISK[[_SHARED + 1, _QSTORE + 1, _EMBEDDED + 1]] = True
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


def checks_headers(vs) -> bool:
    """Whether the next boot reads every ``.qi`` segment's header before its slots: a dirty
    recovery does, and deletes a segment whose header is not valid with its ``.qs``, never
    parsing a slot of it (rabbit_classic_queue_index_v2:recover_segments/5, v3.10.0 - v4.3.x:
    "File was either empty or the header was invalid"). A clean start takes its segments from
    the recovery terms and reads the slots when it delivers them."""
    return vs.recovery == "dirty"


def unread_slots(vs, qx) -> set[str]:
    """The files of ``qx`` whose slots the next boot never parses (``checks_headers``): its
    ``.qi`` segments with a bad header. Damage in their slots is no cause of its own: the one
    cause is the header, and it costs the segment (``Fate.SEGMENT_DELETED``), not the queue."""
    if not qx.bad_segments or qx.version != 2 or not checks_headers(vs):
        return set()
    return {str(qx.files[i]) for i in qx.bad_segments}


def crash_causes(vs, qx) -> list:
    """The reader findings of ``qx`` that crash its queue's recovery (``crashes_queue``), but for
    those in slots the next boot never parses (``unread_slots``)."""
    causes = [f for f in qx.findings if f.crashes_queue]
    skip = unread_slots(vs, qx) if causes else set()
    return [f for f in causes if f.file not in skip] if skip else causes


def queue_fate(vs, qx) -> Fate | None:
    """What happens to the whole queue dir at the next boot, before any entry is looked at."""
    known = vs.queue_known(qx.qdir)
    if known is False:
        return Fate.QUEUE_DELETED
    if qx.version == 1 and not vs.model.reads_v1:
        return Fate.V1_UNSUPPORTED
    if vs.node.boot_hangs:
        return Fate.BOOT_HANG
    if vs.start_crash == "every":
        return Fate.VHOST_CRASH
    if qx.qdir.label in vs.crashing_queues:
        return Fate.QUEUE_CRASH
    return None


def reads_clean(vs, propagate: bool = True, regime: str | None = None) -> bool:
    """Whether the next boot reads the vhost's shared stores as a clean start does (trusting
    msg_store_index.ets) rather than by a scan. ``propagate``: a clean start whose damaged
    message crashes the whole vhost counts as the dirty recovery its restart does. ``regime``
    ("clean" or "dirty"): a clean start's vhost as it serves before its store crashes, or
    after a restart that recovers it dirty (``delivery_bounds``)."""
    clean = vs.recovery == "clean"
    if regime is not None:
        return clean and regime == "clean"
    if clean and propagate and vs.clean_crashes[1]:
        # up to 3.12 the failed read stops the vhost; its supervisor restarts it, and as the first
        # start consumed the clean-shutdown files, the restart recovers the whole vhost dirty
        clean = False
    return clean


def shared_copies(st, kind: str, ids: np.ndarray, clean: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For message ids whose bodies are in shared store ``st`` (of ``kind``): the entry the next
    boot's scan claims and the first entry holding each (-1: none), and the fate a problem with
    the body causes (-1: none). A dirty start scans the store: no copy its scan reaches loses the
    message (unreachable when the bytes are there). A clean start (``reads_clean``) trusts
    msg_store_index.ets, which must place each persistent id on a valid entry holding it."""
    g = st.distinct.lookup(ids)
    cp, ap = st.locate_groups(g)
    problem = np.full(len(ids), -1, np.int8)
    if not clean:
        miss = cp < 0
        problem[miss] = np.where(ap[miss] >= 0, Fate.BODY_UNREACHABLE, Fate.BODY_MISSING)
    elif kind == "persistent":
        bad = ~recorded_ok(st, ids, g)
        # an id it does not record at all: the read crashes the queue (541), and its restart
        # (a dirty index recovery asking the store, rabbit_msg_store:contains) drops it;
        # a restart after an init crash drops it without reading it
        if bad.any():
            problem[bad] = np.where(recorded_has(st, ids[bad]), Fate.DELIVERY_CRASH, Fate.NOT_IN_STORE_INDEX)
    return cp, ap, problem


def resolve(vs, qx, propagate: bool = True, regime: str | None = None) -> Resolved:
    """Locate every live entry's body (as the target version would) and decide its fate.
    ``propagate``: include the crash a damaged message causes on a clean start (off while
    computing those crashes). ``regime``: see ``reads_clean``. Vectorised: each rule below is
    one array expression over the chunk's live entries, applied in the broker's order of checks."""
    r, live = qx.rec, qx.live
    n = len(live)
    loc, persistent, files = r.loc[live], r.persistent[live], r.file[live]
    st_off, st_size = r.store_offset[live], r.store_size[live]
    clean = reads_clean(vs, propagate, regime)
    # a clean start reads the queue as its recovery terms say, unless they disagree with its
    # index: then the queue crashes at init and restarts recovering its index from the files
    start = queue_starts(vs).get(qx.qdir.dir_name) if clean else None
    trusted = clean and (start is None or start.kind != "restart")
    out = Resolved(
        [],
        np.full(n, -1, np.int32),
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        np.full(n, -1, np.int64),
        np.zeros(n, np.int8),
        np.zeros(n, np.int8),
    )
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
        cp, ap, problem[sel] = shared_copies(st, kind, r.msg_id[live[sel]], clean)
        e = np.where(cp >= 0, cp, ap)
        have = e >= 0
        if have.any():
            rows, e = sel[have], e[have]
            used = np.unique(st.e_file[e])
            file_map = np.full(len(st.files), -1, np.int32)
            file_map[used] = [path_ix(st.files[k].path) for k in used.tolist()]
            body(rows, file_map[st.e_file[e]], *r_rdq.term_span(st.e_offset[e], st.e_total[e]))
            out.store_offset[rows] = st.e_offset[e]
    # per-queue store: each segment's own .qs (a chunk is one segment, or several joined)
    in_qs = np.flatnonzero(loc == _QSTORE)
    if len(in_qs) and trusted:
        out.crash_once = np.zeros(n, bool)
    for f in np.unique(files[in_qs]).tolist():
        sel = in_qs[files[in_qs] == f]
        qs_path = qx.qs_of(f)
        qs = vs.qs_files.get(qs_path) if qs_path is not None else None
        status = (
            np.full(len(sel), QsStatus.MISSING_FILE, np.int8)
            if qs is None
            else vs.bodies.qs_entries(qs, st_off[sel], st_size[sel])
        )
        out.qs_status[sel] = status
        out.store_offset[sel] = st_off[sel]
        if qs is not None:
            ok = (status != QsStatus.BAD_HEADER) & (status != QsStatus.OUT_OF_RANGE)
            rows = sel[ok]
            body(rows, path_ix(qs_path), *r_qs.term_span(st_off[rows], st_size[rows]))
        # a dirty start checks the entry and drops it; a clean start crashes the queue reading it
        # (except where the version reads a missing segment as no messages), and the restarted
        # queue, its terms consumed, recovers its index dirty and drops it (3.10.8: a missing .qs,
        # tests/real_brokers/test_recovery_state_brokers.py qs_missing)
        bad = status != QsStatus.OK
        tolerated = (status == QsStatus.MISSING_FILE) & vs.model.missing_qs_reads_empty
        problem[sel[bad]] = _QS_FATE_CODES[status][bad]
        if trusted:
            out.crash_once[sel[bad & ~tolerated]] = True
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
        crash_vhost = crash_vhost and regime is None  # the clean regime: before the vhost's crash
        # a queue whose read fails again after every restart (the recorded index still places
        # the message on bytes that do not hold it) is lost from there on
        lost = lost_on_read(vs) if crash_queues else {}
        at_risk = Fate.VHOST_CRASH if crash_vhost else (Fate.QUEUE_CRASH if qx.qdir.label in lost else None)
        before = read_before_loss(vs, qx) if at_risk == Fate.QUEUE_CRASH else None
        if before is not None and not vs.model.store_reads_in_batches:
            at_risk = np.where(before, Fate.DELIVERED, Fate.QUEUE_CRASH).astype(np.int8)
    bad_segment = (
        np.isin(files, list(qx.bad_segments))
        if qx.version == 2 and not trusted and qx.bad_segments
        else np.zeros(n, bool)
    )
    outside = np.zeros(n, bool)  # seq ids the recovery terms do not cover: never read
    if start is not None and start.kind != "restart":
        seq = r.seq[live]
        outside = (seq < start.low) | (seq >= start.end)
    intrinsic = np.where(
        persistent != 1, Fate.TRANSIENT, np.where(loc == Location.MEMORY, Fate.NOT_ON_DISK, Fate.BAD_LOCATION)
    )
    out.fate[:] = first_of(
        [
            (r.kind[live] == _BAD) & (qdrop in (None, Fate.QUEUE_CRASH)) & ~bad_segment,  # header first
            np.full(n, qdrop is not None),
            bad_segment,
            (persistent != 1) | ~_ON_DISK[loc + 1],
            outside,
            trusted & expired,  # the queue drops an expired head without reading its body
            problem >= 0,
            expired,
        ],
        [
            Fate.BAD_INDEX_ENTRY,
            qdrop or 0,
            Fate.SEGMENT_DELETED,
            intrinsic,
            Fate.NOT_IN_RECOVERY_TERMS,
            Fate.EXPIRED,
            problem,
            Fate.EXPIRED,
        ],
        Fate.DELIVERED if at_risk is None else at_risk,
        n,
    )
    return out


def first_of(conditions: list, choices: list, default: int, n: int) -> np.ndarray:
    """``np.select``: per row, the choice of the first condition that holds (int8). The rules
    are applied last to first, each only where it holds anywhere: in most chunks no rule holds
    at all, and the select costs as much as one comparison."""
    out = np.array(default, np.int8) if isinstance(default, np.ndarray) else np.full(n, default, np.int8)
    for cond, choice in zip(reversed(conditions), reversed(choices)):
        if cond.any():
            out[cond] = choice[cond] if isinstance(choice, np.ndarray) else choice
    return out


# -- what writers and checks make of a fate ----------------------------------------------------------

#: the next boot drops these although the message's bytes are intact: rebuild keeps them
SALVAGEABLE = frozenset(
    {
        Fate.DELIVERED,
        Fate.EXPIRED,
        Fate.BODY_UNREACHABLE,
        Fate.SEGMENT_DELETED,
        Fate.BAD_INDEX_ENTRY,
        Fate.QUEUE_CRASH,
        Fate.BOOT_HANG,
        Fate.V1_UNSUPPORTED,
        Fate.DELIVERY_CRASH,
        Fate.VHOST_CRASH,
        Fate.NOT_IN_RECOVERY_TERMS,
        Fate.NOT_IN_STORE_INDEX,
        Fate.DELIVERY_LIMIT,
        Fate.DEAD_LETTERED,
        Fate.LOG_LOST,
        Fate.QUEUE_UNAVAILABLE,
        # a stream's records: its dir is carried over by the writers as it is
        Fate.STREAM_CHUNK_CUT,
        Fate.STREAM_NOT_STARTED,
        Fate.STREAM_UNREACHED,
        Fate.STREAM_COMPRESSED_SKIPPED,
        Fate.STREAM_READ_FAILS,
    }
)
#: readable but not deliverable, or not trustworthy: rebuild puts them in lost+found with the bytes
QUARANTINED = frozenset({Fate.TRANSIENT, Fate.QUEUE_DELETED, Fate.QS_BAD_CRC, Fate.QS_BAD_SIZE})
#: dropped by design, not by damage (compact drops them; they make no rebuild exit 1)
BY_DESIGN = frozenset({Fate.TRANSIENT, Fate.QUEUE_DELETED})
#: kept by compact as they are: the broker delivers them, or drops them itself by its own clock
KEPT_AS_IS = frozenset({Fate.DELIVERED, Fate.EXPIRED})

#: the finding code that names each way the next boot loses a message
FINDING_OF_FATE = {
    Fate.QUEUE_DELETED: "unknown-queue",
    Fate.V1_UNSUPPORTED: "boot-crash",
    Fate.SEGMENT_DELETED: "qi-bad-header",
    Fate.BAD_INDEX_ENTRY: "qi-bad-entry",
    Fate.TRANSIENT: "transient-dropped",
    Fate.NOT_ON_DISK: "qi-bad-entry",
    Fate.BAD_LOCATION: "qi-bad-entry",
    Fate.BODY_MISSING: "msg-missing",
    Fate.BODY_UNREACHABLE: "rdq-garbage",
    Fate.QS_MISSING_FILE: "qs-entry-missing",
    Fate.QS_BAD_HEADER: "qs-bad-header",
    Fate.QS_OUT_OF_RANGE: "qs-entry-missing",
    Fate.QS_BAD_SIZE: "qs-entry-crc",
    Fate.QS_BAD_CRC: "qs-entry-crc",
    Fate.QUEUE_CRASH: "boot-crash",
    Fate.BOOT_HANG: "boot-crash",
    Fate.DELIVERY_CRASH: "boot-crash",
    Fate.VHOST_CRASH: "boot-crash",
    Fate.NOT_IN_RECOVERY_TERMS: "recovery-terms-mismatch",
    Fate.NOT_IN_STORE_INDEX: "store-index-mismatch",
    Fate.STREAM_CHUNK_CUT: "stream-boot-loss",
    Fate.STREAM_NOT_STARTED: "stream-boot-loss",
    Fate.STREAM_UNREACHED: "osiris-chunk-id-gap",
    Fate.STREAM_COMPRESSED_SKIPPED: "stream-not-served",
    Fate.STREAM_READ_FAILS: "stream-not-served",
    Fate.DELIVERY_LIMIT: "quorum-delivery-limit",
    Fate.DEAD_LETTERED: "quorum-dead-letter-pending",
    Fate.LOG_LOST: "quorum-wal-entries-lost",
    Fate.QUEUE_UNAVAILABLE: "quorum-queue-unavailable",
}


# -- streams (osiris): the writer's next boot and what each reader serves ----------------------------
#
# docs/formats/streams.md sections 6 and 7. A stream's fate is per chunk, not per message: the
# boot (osiris_log:init/2 -> maybe_fix_corrupted_files/1, first_and_last_seginfos/1) keeps or cuts
# chunks; a reader then follows chunk ids from the first chunk. What an AMQP 0-9-1 consumer is
# served is the broker's read loop replayed (``amqp091_read``): which chunks it validates, where
# it skips or fails, and which deliveries the failing read takes with it, per version.

#: The AMQP 0-9-1 consumer the prediction is for: ``x-stream-offset: first``, this prefetch
#: (basic.qos), every delivery acked as it comes (what the ground truth's consumer does). The
#: broker reads a stream for such a consumer in credit-sized steps; where a read fails, every
#: delivery of that step is lost with the channel, so the prefetch matters once there is damage.
AMQP091_PREFETCH = 100


@dataclass
class Amqp091Read:
    """What an AMQP 0-9-1 consumer from ``first`` is served (``AMQP091_PREFETCH``)."""

    offsets: list  # the offsets delivered, in order
    skipped: set  # offsets of compressed sub-batches the consumer's reads skip (4.0+)
    fails_at: int | None = None  # chunk id whose read ends the consumer's channel
    why: str | None = None  # why it fails there
    lost: list = None  # offsets read in the failing step: never delivered (the channel closed first)


@dataclass
class StreamFate:
    """What the next boot of ``model`` keeps of a stream, and what its consumers are served."""

    outcome: str  # "ok", "empty" (restarts empty at offset 0), "fails" (the stream does not start)
    why: str
    kept: set  # (file, pos) of the chunks the boot keeps
    served: list  # chunks a reader from `first` reads, in order (the stream protocol sends the user chunks)
    amqp091: Amqp091Read
    cut: list = None  # chunks on disk the boot cuts off (file, pos, chunk id)
    unreached: list = None  # kept chunks a reader from `first` never reaches (after a gap in chunk ids)
    views: dict = None  # offset -> the record as an AMQP 0-9-1 consumer receives it (``amqp091_views``)

    @property
    def served_amqp091(self) -> set:
        return set(self.amqp091.offsets)

    def record_fates(self, records) -> tuple[dict, dict]:
        """The fate of each record (``readers.osiris.Record``) of the stream: ((file, chunk
        pos) -> ``Fate`` of its records at the next boot, absent when kept and served from
        ``first`` over the stream protocol; offset -> ``Fate`` for an AMQP 0-9-1 consumer,
        absent when it is served)."""
        by_chunk: dict = {}
        if self.outcome == "fails":
            for r in records:
                by_chunk[(r.chunk.file, r.chunk.pos)] = Fate.STREAM_NOT_STARTED
        for f, pos, _ in self.cut or []:
            by_chunk[(f, pos)] = Fate.STREAM_CHUNK_CUT
        for f, pos, _ in self.unreached or []:
            by_chunk[(f, pos)] = Fate.STREAM_UNREACHED
        served = set(self.amqp091.offsets)
        amqp: dict = {}
        for r in records:
            if r.offset in served:
                continue
            own = by_chunk.get((r.chunk.file, r.chunk.pos))
            amqp[r.offset] = (
                own
                if own is not None
                else (Fate.STREAM_COMPRESSED_SKIPPED if r.offset in self.amqp091.skipped else Fate.STREAM_READ_FAILS)
            )
        return by_chunk, amqp


def _no_read() -> Amqp091Read:
    return Amqp091Read([], set(), lost=[])


def stream_fate(scan, model: BrokerModel, prefetch: int = AMQP091_PREFETCH) -> StreamFate:
    """The fate of every chunk of a ``readers.osiris.StreamScan`` at the next boot of ``model``,
    and what a consumer from offset ``first`` is served over the stream protocol and AMQP 0-9-1."""
    from cqforensics.grammar import osiris as g

    pairs = [(stem, seg, idx) for stem, seg, idx in scan.pairs]
    indexed = [(stem, seg, idx) for stem, seg, idx in pairs if idx is not None]
    every = [(c.file, c.pos, c.chunk_id) for c in scan.chunks]
    if not indexed:
        return StreamFate(
            "empty",
            "no index file: osiris_log:init/2 opens a new segment 0 (truncating it) and the stream restarts empty",
            set(),
            [],
            _no_read(),
            cut=every,
            unreached=[],
        )
    # maybe_fix_corrupted_files: only the last pair is checked
    while indexed:
        stem, seg_path, idx_path = indexed[-1]
        seg = scan.segments.get(stem)
        if seg_path is None:
            if model.stream_missing_last_segment == "fails":
                return StreamFate(
                    "fails",
                    f"{stem}.segment is missing: osiris 1.3.1 throws missing_file and the stream does not start",
                    set(),
                    [],
                    _no_read(),
                    cut=[],
                    unreached=[],
                )
            if len(indexed) == 1:  # file_size_or_zero: an empty segment
                return StreamFate(
                    "empty",
                    f"the only segment {stem}.segment is missing: the stream restarts empty",
                    set(),
                    [],
                    _no_read(),
                    cut=every,
                    unreached=[],
                )
            indexed = indexed[:-1]  # its index is deleted
            continue
        if len(indexed) > 1 and seg.size <= g.CHUNK_HEADER_SIZE:
            indexed = indexed[:-1]  # an empty last segment: deleted with its index
            continue
        break
    stem, seg_path, idx_path = indexed[-1]
    seg, idx = scan.segments[stem], scan.indexes[stem]
    # truncate_invalid_idx_records: from the end, the last record naming a valid chunk
    valid_at = {c.pos for c in seg.chunks if c.valid}
    last_pos, left = None, 0
    for k in range(len(idx.records) - 1, -1, -1):
        r = idx.records[k]
        if not any(r.tobytes()):
            continue
        pos = int(r["file_pos"])
        if pos < seg.size and pos in valid_at:
            last_pos, left = pos, k + 1
            break
    if len(indexed) == 1 and left <= 1:
        # the only index keeps at most one record: maybe_fix_corrupted_files([IdxFile]) rewrites
        # it to its header (file_size =< IDX_HEADER_SIZE + INDEX_RECORD_SIZE_B), and an index
        # without records is no index: init/2 opens a new segment 0 (read from the source, 1.3.1
        # to 1.13.1; not booted)
        return StreamFate(
            "empty",
            f"the only index {stem}.index keeps at most one valid record: the boot rewrites "
            "it to its header and the stream restarts empty",
            set(),
            [],
            _no_read(),
            cut=every,
            unreached=[],
        )
    kept, cut = set(), []
    kept_stems = {s for s, _, _ in indexed}
    for s, _, _ in pairs:
        sg = scan.segments.get(s)
        if sg is None:
            continue
        for c in sg.chunks:
            if s not in kept_stems or (s == stem and (last_pos is None or c.pos > last_pos)):
                cut.append((c.file, c.pos, c.chunk_id))  # past the last valid indexed chunk, or never read
            else:
                kept.add((c.file, c.pos))
    # a reader from `first`: the first kept chunk, then chunk after chunk by id
    served, unreached, expected = [], [], None
    for c in (c for s, _, _ in indexed for c in scan.segments.get(s, _EMPTY).chunks if (c.file, c.pos) in kept):
        if unreached or (expected is not None and c.chunk_id != expected):
            unreached.append((c.file, c.pos, c.chunk_id))
            continue
        served.append(c)
        expected = c.chunk_id + c.num_records
    why = "kept" if not cut else f"the boot cuts {len(cut)} chunk(s) after the last valid indexed chunk"
    views = amqp091_views(scan.records, model)
    return StreamFate(
        "ok", why, kept, served, amqp091_read(served, scan.records, model, prefetch, views), cut, unreached, views
    )


def amqp091_views(records, model: BrokerModel) -> dict:
    """offset -> the record as an AMQP 0-9-1 consumer of ``model`` receives it
    (``message.decode_amqp10_entry``), or the ``FormatError`` saying why the version cannot
    convert it (then its read fails the consumer's channel). Records without bytes are left out."""
    from cqforensics.base.errors import FormatError
    from cqforensics.message.reference import decode_amqp10_entry

    out: dict = {}
    for r in records:
        if r.body is None:
            continue
        try:
            out[r.offset] = decode_amqp10_entry(r.body, model)
        except FormatError as e:
            out[r.offset] = e
    return out


def _entries(records, views: dict) -> dict:
    """(file, chunk pos) -> the chunk's entries in order: [compression or None for a simple
    entry, [offsets], every record converts for AMQP 0-9-1 (``views``), entry position]."""
    out: dict = {}
    for r in records:
        entries = out.setdefault((r.chunk.file, r.chunk.pos), [])
        if not entries or not r.sub_batch or entries[-1][3] != r.entry_pos:
            entries.append([r.compression if r.sub_batch else None, [], True, r.entry_pos])
        e = entries[-1]
        e[1].append(r.offset)
        if e[2] and e[0] in (None, "none") and not isinstance(views.get(r.offset), dict):
            e[2] = False
    return out


def amqp091_read(
    chunks: list, records: list, model: BrokerModel, prefetch: int = AMQP091_PREFETCH, views: dict | None = None
) -> Amqp091Read:
    """Replay the broker's reads of a stream for an AMQP 0-9-1 consumer from ``first``
    (``AMQP091_PREFETCH``) over ``chunks`` (what a reader from first reads, in order).

    The broker reads in steps (RSQ ``stream_entries``): the first with the whole prefetch as
    credit, then, as each delivery is acked, a step with credit 1 whenever the credit is back
    above 0. A step that fails exits the consumer's channel before it delivers: its reads are
    lost with it, the earlier steps were delivered.

    * ``model.stream_amqp091_reader == "parsed_chunks"`` (3.x, ``osiris_log:read_chunk_parsed``):
      a step reads whole chunks until its credit is spent; every record of a chunk is converted
      (``binary_to_msg/2``), so a compressed sub-batch (returned as ``{batch, ..}``) or a record
      that is no AMQP 1.0 message fails the step.
    * ``"chunk_iterator"`` (4.x, ``osiris_log:chunk_iterator/2`` + ``iterator_next/1``): a step
      reads entry by entry; compressed sub-batches are skipped, an uncompressed one is delivered
      up to the credit and the rest buffered for the next steps.
    * CRC (``model.stream_amqp091_crc``): ``every_chunk`` (osiris <= 1.6: every chunk read,
      tracking chunks too), ``user_chunks`` (1.7 - 1.8.3 ``read_chunk_parsed``: the chunks it
      hands over), ``one_entry_chunks`` (1.8.5 - 1.8.8 ``iter_read_ahead/7``: a chunk of one entry
      opened with a credit other than 1), ``none`` (1.10+). A bad CRC fails the step.
    """
    from cqforensics.grammar import osiris as g

    parsed = model.stream_amqp091_reader == "parsed_chunks"
    crc = model.stream_amqp091_crc
    entries = _entries(records, amqp091_views(records, model) if views is None else views)
    delivered: list = []
    skipped: set = set()
    queue = list(chunks)
    k = 0  # next chunk to open
    current: list = []  # entries left in the open chunk (iterator)
    buffer: list = []  # offsets of an uncompressed sub-batch beyond the credit (iterator)
    credit = prefetch

    def checks_crc(c, credit_now) -> bool:
        if crc == "every_chunk":
            return True
        if c.chunk_type != g.CHNK_USER:
            return False
        if crc == "user_chunks":
            return True
        return crc == "one_entry_chunks" and c.num_entries == 1 and credit_now != 1

    while True:
        step: list = []
        end = False
        if buffer:
            take = min(credit, len(buffer))
            step += buffer[:take]
            buffer = buffer[take:]
            credit -= take
        while credit >= 1 and not end:
            if not current:  # open the next chunk the reader hands over
                while True:
                    if k >= len(queue):
                        end = True
                        break
                    c = queue[k]
                    k += 1
                    if checks_crc(c, credit) and not c.crc_ok:
                        return Amqp091Read(
                            delivered,
                            skipped,
                            c.chunk_id,
                            f"chunk {c.chunk_id} fails its CRC-32: the read exits crc_validation_failure",
                            step,
                        )
                    if c.chunk_type == g.CHNK_USER:
                        current = [list(e) for e in entries.get((c.file, c.pos), [])]
                        chunk = c
                        break
                if end:
                    break
                if parsed:  # the whole chunk is converted at once
                    for comp, offs, ok, _ in current:
                        if (comp not in (None, "none")) or not ok:
                            why = (
                                f"{comp} sub-batch"
                                if comp not in (None, "none")
                                else f"record {offs[0]} is no AMQP 1.0 message"
                            )
                            return Amqp091Read(
                                delivered,
                                skipped,
                                chunk.chunk_id,
                                f"chunk {chunk.chunk_id}: {why} cannot be converted for AMQP 0-9-1",
                                step,
                            )
                    offs = [o for _, os_, _, _ in current for o in os_]
                    step += offs
                    credit -= len(offs)
                    current = []
                    continue
                if not current:
                    continue
            comp, offs, ok, _ = current.pop(0)
            if comp not in (None, "none"):
                skipped.update(offs)
                continue
            if not ok:
                return Amqp091Read(delivered, skipped, chunk.chunk_id, f"record {offs[0]} is no AMQP 1.0 message", step)
            take = min(credit, len(offs))
            step += offs[:take]
            buffer = offs[take:]
            credit -= take
        delivered += step
        if end and not buffer:
            return Amqp091Read(delivered, skipped, lost=[])
        credit = 1  # the next ack gives one credit back: the next step


class _NoChunks:
    chunks: list = []


_EMPTY = _NoChunks()


# -- Ra (quorum queues): what the next boot recovers of each server's log ---------------------------------
#
# Sources: WAL = ra_log_wal.erl, SEG = ra_log_segment.erl, RSNAP = ra_snapshot.erl, LOG = ra_log.erl
# at the Ra version each broker ships (BrokerModel.ra_version; docs/formats/quorum.md sections 3-5).

#: what a damage does to the node or a queue at the next boot
RA_OK, RA_NODE_REFUSES, RA_QUEUE_CRASH, RA_QUEUE_UNAVAILABLE = "ok", "node_refuses_start", "queue_crash", "unavailable"


@dataclass
class WalRecovery:
    """What Ra's WAL recovery does with one ``.wal`` (WAL recover_records/5): the records it
    recovers (``kept``: rows of the scan), where it stops and why, and whether the WAL
    process then refuses to start (taking the Ra system and the node down)."""

    path: Path
    kept: list[int]
    skipped: list[int]  # rows Ra 2.16+ skips as damage or leftovers (unknown writer reference, unregistered UId)
    stop_offset: int | None
    stop: str  # eof / zeroed / torn / bad_checksum_forgiven / bad_checksum / unknown_reference / bad_header
    outcome: str = RA_OK
    detail: str = ""
    below_snapshot: list[int] = field(default_factory=list)  # rows Ra 2.16+ skips as already snapshotted (normal)


def wal_recovery(
    scan, model: BrokerModel, registered: set[bytes] | None = None, snapshot_index: dict[bytes, int] | None = None
) -> WalRecovery:
    """Apply the version's WAL recovery rules to a scanned WAL (``readers.ra_wal.walk``):

    * no header: the WAL process exits (``unknown_wal_file_format``; an empty or short file has
      no clause in open_at_first_record/1): the node does not start;
    * an all-zero record or a torn record ends the file silently;
    * a bad checksum ends the file when fewer than 13 bytes, or 13 zero bytes, follow the record
      (is_last_record/2), else ``wal_checksum_validation_failure``: the node does not start;
    * a writer reference no earlier record named: Ra < 2.16 crashes (a badmatch in
      recover_records/5: the node does not start), Ra 2.16+ skips it;
    * Ra 2.16+ skip the records of a UId ``names.dets`` does not register (``registered``),
      without checking them, and those at or below the server's snapshot index."""
    from cqforensics.readers import ra_wal as r_wal

    ra = model.ra_version
    if not scan.header_ok:
        return WalRecovery(scan.path, [], [], 0, "bad_header", RA_NODE_REFUSES, scan.end.detail)
    kept, skipped, below = [], [], []
    modern = ra >= (2, 16, 0)
    for i in range(len(scan)):
        off = int(scan.offset[i])
        if not scan.known[i]:
            if not modern:
                return WalRecovery(
                    scan.path,
                    kept,
                    skipped,
                    off,
                    "unknown_reference",
                    RA_NODE_REFUSES,
                    f"writer reference {int(scan.ref[i])} was never named in this file",
                )
            skipped.append(i)
            continue
        uid = scan.uid(i)
        if modern and registered is not None and uid not in registered:
            skipped.append(i)
            continue
        if scan.checksum[i] == r_wal.CHECK_BAD:
            if scan.bad_is_last(i):
                return WalRecovery(
                    scan.path,
                    kept,
                    skipped,
                    off,
                    "bad_checksum_forgiven",
                    RA_OK,
                    "the last record fails its checksum: dropped",
                )
            return WalRecovery(
                scan.path, kept, skipped, off, "bad_checksum", RA_NODE_REFUSES, "wal_checksum_validation_failure"
            )
        if modern and snapshot_index is not None and int(scan.index[i]) <= snapshot_index.get(uid, -1):
            below.append(i)
            continue
        kept.append(i)
    end = scan.end
    return WalRecovery(
        scan.path, kept, skipped, end.offset if end.kind != "eof" else None, end.kind, below_snapshot=below
    )


def ra_segment_usable(seg, model: BrokerModel) -> tuple[bool, str]:
    """Whether a server can open the segment at boot (SEG open/2 from recover_range/3): a header
    it refuses (missing, wrong magic, version above 2, version 0) and, before Ra 3, a file
    ending inside its index (no clause for the partial record) crash the server."""
    from cqforensics.readers import ra_segment as r_seg

    if seg.header != r_seg.HEADER_OK:
        return False, f"segment header {seg.header}"
    if seg.torn_index and model.ra_version < (3, 0, 0):
        return False, "the file ends inside an index record (parse_index_data has no clause for it)"
    return True, ""


def choose_snapshot(snapshots) -> tuple[object, list]:
    """RSNAP find_snapshots/1: of a server's snapshot dirs (``readers.ra_snapshot.Snapshot``
    with their dir), the newest by name that validates; every other one is deleted at boot.
    Returns (chosen or None, the ones deleted)."""
    ordered = sorted(snapshots, key=lambda s: s.path.parent.name, reverse=True)
    chosen = next((s for s in ordered if s.ok), None)
    return chosen, [s for s in ordered if s is not chosen]
