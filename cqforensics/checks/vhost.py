"""The checks fsck runs on one vhost, shared by ``cqforensics fsck`` and the ``findings`` table
(so Spark audits a fleet with exactly this code, one vhost per task).

Each check names where the problem is (file + offset) and carries a stable code
(``findings.CODES``). ``check_vhost`` runs them all in one pass over the vhost's indexes and
also returns the per-queue verdict: what the next boot delivers, drops, or crashes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cqforensics import fastpath
from cqforensics.findings import Finding
from cqforensics.codes import Fate, Location, QsStatus, StoreStatus
from cqforensics.model.index import IndexChunk
from cqforensics.model.vhost import VhostScan
from cqforensics.readers import qs as r_qs


@dataclass
class QueueVerdict:
    node: str
    vhost: str | None
    queue: str | None  # priority levels summed
    messages: int = 0  # held by the index (published, not acked)
    predicted_after_restart: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    crash: str | None = None  # "queue", "vhost" or "node": the next boot crashes or hangs instead
    recovery: str = "dirty"
    index_version: int | None = None
    dirs: int = 0

    @property
    def dropped(self) -> int:
        return self.messages - self.predicted_after_restart

    def to_dict(self) -> dict:
        return {"node": self.node, "vhost": self.vhost, "queue": self.queue, "messages": self.messages,
                "predicted_after_restart": self.predicted_after_restart, "dropped": self.dropped,
                "drop_reasons": dict(sorted(self.drops.items())), "crash": self.crash, "recovery": self.recovery,
                "index_version": self.index_version, "queue_dirs": self.dirs}


def check_vhost(vs: VhostScan, deep: bool = False) -> tuple[list[QueueVerdict], list[Finding]]:
    """Every check of one vhost, in one pass over its queue indexes."""
    node = vs.node.node.node
    vhost = vs.vhost.name if vs.vhost.name is not None else vs.vhost.label
    findings = [Finding(p.code, p.message, str(p.path), p.offset) for p in vs.vhost.problems]
    findings += [Finding("unknown-file", "a file the broker does not use here", str(p)) for p in vs.vhost.others]
    verdicts: dict[str | None, QueueVerdict] = {}
    crash_vhost = vs.clean_crashes[1]
    for q in vs.all_queue_dirs:
        v = verdicts.setdefault(q.label, QueueVerdict(node, vhost, q.label, recovery=vs.recovery))
        v.dirs += 1
        v.index_version = q.index_version or v.index_version
        known = vs.queue_known(q)
        per_dir: dict[str, int] = {}
        n_dir = 0
        for qx in vs.scan_queue(q):
            findings += chunk_findings(vs, qx)
            res = vs.resolve(qx)
            n_dir += len(qx.live)
            for code, count in zip(*np.unique(res.fate, return_counts=True)):
                name = Fate(code).reason
                if name is not None:
                    per_dir[name] = per_dir.get(name, 0) + int(count)
            if deep:
                findings += _decode_checks(vs, qx, res)
        v.messages += n_dir
        v.predicted_after_restart += n_dir - sum(per_dir.values())
        for k, c in per_dir.items():
            v.drops[k] = v.drops.get(k, 0) + c
        for p in q.others:
            findings.append(Finding("unknown-file", "a file the broker does not use in a queue dir", str(p),
                                    queue=q.name, priority=q.priority))
        if known is False:
            findings.append(Finding("unknown-queue", f"queue dir {q.dir_name} ({q.label}) is not a durable queue in "
                                    f"the metadata: the next boot deletes it and its {n_dir} messages", str(q.path),
                                    queue=q.name, priority=q.priority, details={"messages": n_dir}))
        if per_dir.get("transient"):
            findings.append(Finding("transient-dropped", f"{per_dir['transient']} transient messages on disk are "
                                    "dropped by the next boot", str(q.path), queue=q.name, priority=q.priority,
                                    details={"messages": per_dir["transient"]}))
        if per_dir.get("expired"):
            findings.append(Finding("expired", f"{per_dir['expired']} messages are past their TTL: the broker drops "
                                    "them when they reach the head of the queue", str(q.path), queue=q.name,
                                    priority=q.priority, details={"messages": per_dir["expired"]}))
    # boot crashes
    for label, causes in sorted(vs.crashing_queues.items(), key=lambda kv: str(kv[0])):
        if vs.node.boot_hangs and all(c.code.startswith("v1-") for c in causes):
            first = causes[0]
            findings.append(Finding("boot-crash", f"RabbitMQ {vs.model} hangs at boot: the store's startup walker "
                                    f"crashes on this CQv1 index damage ({first.message}); nothing is delivered",
                                    first.file, first.offset, queue=label, details={"causes": len(causes)}))
            continue
        first = causes[0]
        findings.append(Finding("boot-crash", f"RabbitMQ {vs.model} crashes queue {label} when it recovers it "
                                f"({len(causes)} index record(s) it has no clause for, first: {first.message})",
                                first.file, first.offset, queue=label, details={"causes": len(causes)}))
        verdicts[label].crash = "queue"
    crash_queues, _ = vs.clean_crashes
    for label in sorted(crash_queues, key=str):
        findings.append(Finding("boot-crash", f"clean shutdown state: RabbitMQ {vs.model} will trust it and crash "
                                f"{'the vhost' if crash_vhost else 'queue ' + str(label)} when it reads a damaged "
                                f"message of {label}; remove clean.dot and recovery.dets from a copy to get the "
                                "dirty recovery fsck predicts with --assume-dirty", None, queue=label))
        verdicts[label].crash = "vhost" if crash_vhost else "queue"
    if crash_vhost:
        for v in verdicts.values():
            v.crash = v.crash or "vhost"
    if vs.node.boot_hangs:
        for v in verdicts.values():
            v.crash = "node"
    findings += _store_checks(vs)
    if vs.recovery == "dirty":
        st = vs.vhost.stores.get("persistent")
        why = "no clean.dot" if st is None or not st.clean_dot.exists() else \
            "clean-shutdown files do not match the queues' recovery terms"
        findings.append(Finding("unclean-shutdown", f"{why}: the next boot rebuilds the indexes from the files "
                                "(dirty recovery)", str(vs.vhost.path)))
    for f in findings:
        f.node, f.vhost = node, vhost
    return list(verdicts.values()), findings

def chunk_findings(vs: VhostScan, qx: IndexChunk) -> list[Finding]:
    """A chunk's reader findings, plus its entries whose body is not where the index says
    (per-queue store checks as QS2 check_msg_on_disk; shared-store lookups)."""
    out = list(qx.findings)
    r = qx.rec
    res = vs.resolve(qx)
    path = str(qx.qs_path or qx.qdir.path / f"{qx.segment}.qs")
    reported = False
    for j, i in enumerate(qx.live.tolist()):
        status, seq = QsStatus(res.qs_status[j]), int(r.seq[i])
        if status not in (QsStatus.NONE, QsStatus.OK):
            off, size = int(r.store_offset[i]), int(r.store_size[i])
            if status in (QsStatus.MISSING_FILE, QsStatus.BAD_HEADER):
                if not reported:
                    reported = True
                    code, what = (("qs-entry-missing", "the index points into a .qs segment that is not there")
                                  if status == QsStatus.MISSING_FILE else
                                  ("qs-bad-header", "bad .qs header: none of its messages can be read"))
                    out.append(Finding(code, what, path, None if status == QsStatus.MISSING_FILE else 0,
                                       details={"seq_id": seq}))
            elif status == QsStatus.OUT_OF_RANGE:
                entry = r_qs.entry_span(off, size)[1]
                out.append(Finding("qs-entry-missing", f"entry for seq id {seq} ({entry} bytes) lies beyond the "
                                   "end of the file", path, off, details={"seq_id": seq, "size": size}))
            else:
                out.append(Finding("qs-entry-crc", f"entry for seq id {seq} fails its "
                                   f"{'CRC' if status == QsStatus.BAD_CRC else 'size'} check", path, off,
                                   details={"seq_id": seq, "size": size, "check": status.label}))
        elif r.loc[i] == Location.SHARED_STORE and r.persistent[i] == 1 and res.body_file[j] < 0:
            mid = r.msg_id[i].tobytes().hex()
            out.append(Finding("msg-missing", f"message {mid} (seq id {seq}) is in no shared-store file",
                               str(qx.files[int(r.file[i])]), int(r.offset[i]),
                               details={"msg_id": mid, "seq_id": seq}))
    for f in out:
        f.queue, f.priority = qx.qdir.name, qx.qdir.priority
    return out



def _store_checks(vs: VhostScan) -> list[Finding]:
    out = []
    for kind, st in vs.stores.items():
        for f in st.files:
            for h in f.holes:
                if h.kind == "truncated_tail":
                    out.append(Finding("rdq-truncated", f"file ends inside an entry ({h.length} bytes)", str(f.path),
                                       h.offset, details={"store": kind, "length": h.length}))
                elif h.kind == "garbage":
                    out.append(Finding("rdq-garbage", f"{h.length} bytes hold no valid entry", str(f.path), h.offset,
                                       details={"store": kind, "length": h.length}))
                elif h.kind == "zeroed" and vs.model.sequential_scan and kind == "persistent":
                    # <= 3.13.0 stops at a zero size field: everything after it in the file is lost
                    out.append(Finding("rdq-garbage", f"{h.length} zero bytes: RabbitMQ {vs.model}'s store scan stops "
                                       "here and loses every message after it in this file", str(f.path), h.offset,
                                       severity="warning", details={"store": kind, "length": h.length}))
        if kind != "persistent":
            continue
        status, _ = vs.store_status[kind]
        for fi, f in enumerate(st.files):
            sel = st.e_file == fi
            for code, label in ((StoreStatus.ORPHAN, "orphan-message"), (StoreStatus.DUPLICATE, "duplicate-copy")):
                hit = np.flatnonzero(sel & (status == code))
                if len(hit):
                    nbytes = int(st.e_total[hit].sum())
                    what = "no index refers to" if code == StoreStatus.ORPHAN else "are extra copies of"
                    out.append(Finding(label, f"{len(hit)} entries ({nbytes} bytes) {what} messages "
                                       f"{'(garbage until compaction)' if code == StoreStatus.ORPHAN else 'already stored'}",
                                       str(f.path), int(st.e_offset[hit[0]]),
                                       details={"entries": len(hit), "bytes": nbytes}))
            size = f.size
            live = int(st.e_total[sel & (status == StoreStatus.LIVE)].sum())
            if size > (1 << 20) and live * 2 < size:
                out.append(Finding("fragmented-file", f"{size - live} of {size} bytes are garbage "
                                   f"({100 * (size - live) // size}%): compaction would reclaim them", str(f.path),
                                   details={"size": size, "live_bytes": live}))
        for fi, o, t, i in st.bad:
            out.append(Finding("msg-corrupt", f"entry for {i.hex()} ({t} bytes) lacks its 255 write marker: a torn "
                               "write, skipped by every version", str(st.files[fi].path), o,
                               details={"msg_id": i.hex(), "total_size": t}))
        if st.recorded is not None:
            refs = vs.references[kind]
            bad = 0
            examples = []
            for raw, rec in st.recorded.items():
                g = refs.ids.lookup(np.frombuffer(raw, "V16"))[0] if len(raw) == 16 else -1
                computed = int(refs.count[g]) if g >= 0 else 0
                if rec[0] != computed:
                    bad += 1
                    if len(examples) < 5:
                        examples.append({"msg_id": raw.hex(), "recorded": rec[0], "computed": computed})
            if bad:
                out.append(Finding("refcount-mismatch", f"{bad} reference counts in msg_store_index.ets differ from "
                                   "what the queue indexes hold", str(st.store.msg_store_index),
                                   details={"ids": bad, "examples": examples}))
    return out


def _decode_checks(vs: VhostScan, qx, res) -> list[Finding]:
    """--deep: decode every stored message the index holds (the broker never does at boot)."""
    out = []
    r = qx.rec
    for j, i in enumerate(qx.live.tolist()):
        f = int(res.body_file[j])
        if f < 0:
            continue
        start = int(res.body_start[j])
        raw = vs.bodies.read(res.body_files[f], start, int(res.body_len[j]))
        try:
            msg = fastpath.decode(raw)
            bad = None
            if r.loc[i] == Location.SHARED_STORE and msg["msg_id"] is not None and msg["msg_id"] != r.msg_id[i].tobytes():
                bad = "the stored term's message id differs from the index's"
        except Exception as e:  # any failure to decode is the finding
            bad = f"{type(e).__name__}: {e}"
        if bad:
            qs = r.loc[i] == Location.QUEUE_STORE
            out.append(Finding("qs-entry-undecodable" if qs else "msg-corrupt", bad[:300], str(res.body_files[f]),
                               int(res.store_offset[j]), queue=qx.qdir.name, priority=qx.qdir.priority,
                               details={"seq_id": int(r.seq[i])}))
    return out


