"""Checks of the vhost's shared stores: holes, torn writes, orphans and duplicates, fragmented
files, and recorded reference counts against what the queue indexes hold."""

from __future__ import annotations

import numpy as np

from cqforensics.codes import StoreStatus
from cqforensics.errors import CQError
from cqforensics.findings import Finding
from cqforensics.model.vhost import VhostScan
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers import terms as r_terms


def store_checks(vs: VhostScan) -> list[Finding]:
    """Every shared-store finding of the vhost."""
    out = []
    for kind, st in vs.stores.items():
        out += _interrupted_combines(vs, st)
        reported: list[tuple[int, int, int]] = []  # (file number, start, end) of the holes reported below
        for f in st.files:
            out += r_rdq.rejected_findings(f, kind)
            for h in f.holes:
                if h.kind != "zeroed" or (vs.model.sequential_scan and kind == "persistent"):
                    reported.append((f.number, h.offset, h.offset + h.length))
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
        out += recorded_location_findings(st, kind, reported)
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


def recorded_location_findings(st, kind: str, reported: list[tuple[int, int, int]]) -> list[Finding]:
    """``rdq-garbage`` where a clean stop's ``msg_store_index.ets`` records a message (its
    ``#msg_location{msg_id, ref_count, file, offset, total_size}``, which the next clean start
    reads there without a scan; so on every clean sample, both stores) but the file holds no entry
    of that id and size: zeroed, or its head changed, which the file's own framing need not show
    (zeros are a normal hole). Not where a hole is reported already (``reported``). Info in the
    transient store (every boot deletes it), else warning."""
    if not st.clean or not st.recorded:
        return []
    by_number = {f.number: f for f in st.files if f.path.suffix == ".rdq"}  # not an appended .rdt
    rdq = [f.path.suffix == ".rdq" for f in st.files]
    held = {(int(st.files[int(fi)].number), int(o)): (i.tobytes(), int(t))
            for fi, o, t, i in zip(st.e_file.tolist(), st.e_offset.tolist(), st.e_total.tolist(), st.e_id)
            if rdq[fi]}
    out = []
    elsewhere: dict[int, int] = {}  # file number -> records placed in a file the store has no trace of
    past: dict[int, int] = {}  # file number -> records placed past the end of the file
    for msg_id, rec in st.recorded.items():
        _, number, offset, total = rec
        if not (isinstance(number, int) and isinstance(offset, int) and isinstance(total, int)):
            continue  # not a #msg_location{}: the dump's own finding (terms.ets_findings)
        f = by_number.get(number)
        if f is None:
            elsewhere[number] = elsewhere.get(number, 0) + 1
            continue
        if offset + total > f.size:
            past[number] = past.get(number, 0) + 1
            continue
        if held.get((number, offset)) == (msg_id, total):
            continue  # no such file, or the file is shorter: the layout's and file_summary.ets' findings
        if any(n == number and a <= offset < b for n, a, b in reported):
            continue
        got = held.get((number, offset))
        there = "no entry" if got is None else f"an entry of {'another id' if got[0] != msg_id else 'another size'}"
        out.append(Finding("rdq-garbage", f"the clean stop's msg_store_index.ets records message {msg_id.hex()} here "
                           f"({total} bytes), the file holds {there}: the entry was damaged or overwritten"
                           f"{' (the broker deletes the transient store at boot)' if kind == 'transient' else ''}",
                           str(f.path), offset, severity="info" if kind == "transient" else None,
                           details={"store": kind, "msg_id": msg_id.hex(), "total_size": total}))
        if len(out) >= 64:
            break
    sizes = _summary_sizes(st.store.file_summary)
    # files neither on disk nor in file_summary.ets, or past the end of a file of the size it records
    gone = sorted([n for n in elsewhere if sizes is not None and n not in sizes] +
                  [n for n in past if sizes is not None and sizes.get(n) == by_number[n].size])
    if gone:  # another store's dump, or a stale one
        n = sum(elsewhere.get(g, 0) + past.get(g, 0) for g in gone)
        out.append(Finding("term-file-damaged", f"the clean stop's msg_store_index.ets places {n} messages where this "
                           f"store has no entries (files neither on disk nor in file_summary.ets, or past the end of "
                           f"a file of the size file_summary.ets records: "
                           f"{', '.join(f'{g}.rdq' for g in gone[:5])}{', ...' if len(gone) > 5 else ''}): another "
                           "store's dump, or a stale one, which the next clean start trusts"
                           f"{' (the broker deletes the transient store at boot)' if kind == 'transient' else ''}",
                           str(st.store.msg_store_index), severity="info" if kind == "transient" else "warning",
                           details={"store": kind, "files": gone[:64], "messages": n}))
    return out


def _summary_sizes(path) -> dict[int, int] | None:
    """File number -> file size, as a clean stop's file_summary.ets records them (None: none to
    go by)."""
    try:
        return {n: size for n, (_, size) in r_terms.file_summary_records(path).items()}
    except (CQError, OSError):  # missing or unreadable: its own findings
        return None


def _interrupted_combines(vs: VhostScan, st) -> list[Finding]:
    """``N.rdt`` files: the tail of a <= 3.12 combine's destination file, left by a kill during
    the store's GC (rabbit_msg_store:recover_crashed_compactions)."""
    out = []
    store = st.store
    rdq = {num for num, _ in store.rdq}
    for num, p in store.rdt:
        pos = next((fi for fi, f in enumerate(st.files) if f.path == p), None)
        lost = int((~st.reach[st.e_file == pos]).sum()) if pos is not None else 0
        if not vs.model.appends_rdt:
            what = f"RabbitMQ {vs.model} ignores it: messages only it holds are not recovered"
            severity = "info"
        elif lost:
            # killed after the combine extended N.rdq to its final size: the scan stops at the zeros
            what = (f"the next boot appends it to {num}.rdq, but its scan stops inside {num}.rdq (zeros the "
                    f"combine left) and never reaches the {lost} entries appended: messages only they hold are "
                    "lost (rebuild recovers them)")
            severity = "error"
        elif num in rdq:
            what = f"the next boot appends it to {num}.rdq and recovers the store dirty"
            severity = "info"
        else:
            what = f"there is no {num}.rdq to append it to: RabbitMQ {vs.model}'s message store fails at boot"
            severity = "error"
        out.append(Finding("combine-interrupted", f"{p.name}: a file combine was cut short; {what}", str(p),
                           severity=severity, details={"store": store.kind, "file": num}))
    return out
