"""Checks of the vhost's shared stores: holes, torn writes, orphans and duplicates, fragmented
files, and recorded reference counts against what the queue indexes hold."""

from __future__ import annotations

import numpy as np

from cqforensics.codes import StoreStatus
from cqforensics.findings import Finding
from cqforensics.model.vhost import VhostScan
from cqforensics.readers import rdq as r_rdq


def store_checks(vs: VhostScan) -> list[Finding]:
    """Every shared-store finding of the vhost."""
    out = []
    for kind, st in vs.stores.items():
        for f in st.files:
            out += r_rdq.rejected_findings(f, kind)
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
