"""Checks of the vhost's shared stores: holes, torn writes, orphans and duplicates, fragmented
files, and recorded reference counts and places against what the queue indexes and the files
hold; for a vhost read in id shares, gathered share by share (``StoreCheck``)."""

from __future__ import annotations

import heapq

import numpy as np

from cqforensics.base.enums import Fate, StoreStatus
from cqforensics.base.errors import CQError, plural
from cqforensics.base.findings import Finding
from cqforensics.model import recovery
from cqforensics.model.vhost import VhostScan
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers import terms as r_terms


class StoreCheck:
    """The shared-store findings of a vhost, fed pass by pass (``add``: a scan of one id share,
    or of the whole vhost) and completed once every pass is in (``findings``): findings about a
    file come from the first pass, those about one entry or one recorded message from the pass
    of its id's share, and the counts per file and per store are summed over the passes."""

    def __init__(self) -> None:
        self.out: list[Finding] = []  # findings whole when made
        self.tallies: dict[str, _StoreTally] = {}

    def add(self, vs: VhostScan, first: bool) -> None:
        for kind, st in vs.stores.items():
            t = self.tallies.get(kind)
            if t is None:
                t = self.tallies[kind] = _StoreTally(kind, st.store, st.files)
            t.term_files = vs.term_files
            if vs.share is not None:
                t.walked = vs.spill("walks")[kind]
            if first:
                self.out += _file_findings(vs, kind, st, t.reported)
            t.unreached += np.bincount(st.e_file[~st.reach], minlength=len(st.files))
            t.torn |= bool(st.bad)
            t.add_recorded(st)
            if kind != "persistent":
                continue
            t.add_status(st, vs.store_status[kind][0])
            self.out += _torn_findings(vs, st, vs.references[kind])
            if st.recorded is not None:
                t.add_refcounts(st, vs.references[kind])

    def intact(self) -> bool:
        """The persistent store exists and shows no damage: no garbage, no torn entry."""
        t = self.tallies.get("persistent")
        return (
            t is not None
            and not t.torn
            and not any(h.kind in ("garbage", "truncated_tail") for f in t.files for h in f.holes)
        )

    def findings(self, vs: VhostScan) -> list[Finding]:
        out = list(self.out)
        for kind, t in self.tallies.items():
            out += _interrupted_combines(vs, t)
            out += t.recorded_findings()
            if kind == "persistent":
                out += t.status_findings()
                if t.refcount_bad:
                    out.append(
                        Finding(
                            "refcount-mismatch",
                            f"{t.refcount_bad} reference counts in msg_store_index.ets "
                            "differ from what the queue indexes hold",
                            str(t.store.msg_store_index),
                            details={"ids": t.refcount_bad, "examples": [e for _, e in t.refcount_examples]},
                        )
                    )
        return out


def _torn_findings(vs: VhostScan, st, refs) -> list[Finding]:
    """``msg-corrupt`` for each entry without its 255 write marker (every version's scan skips
    it). A loss only when an index refers to the id and the recovery model finds no copy the
    next boot reads (``model.recovery.shared_copies``): a kill during a <= 3.12 combine or a 4.x
    in-place compaction leaves a torn copy in the destination while the source entry survives,
    and a torn write nothing refers to loses nothing."""
    if not st.bad:
        return []
    ids = np.frombuffer(b"".join(i for *_, i in st.bad), st.e_id.dtype)
    claim, first, problem = recovery.shared_copies(st, "persistent", ids, recovery.reads_clean(vs))
    referenced = refs.ids.lookup(ids) >= 0
    out = []
    for k, (fi, o, tot, i) in enumerate(st.bad):
        text = f"entry for {i.hex()} ({plural(tot, 'byte')}) lacks its 255 write marker: a torn write, skipped by every version"
        details = {"msg_id": i.hex(), "total_size": tot}
        copy = int(claim[k]) if claim[k] >= 0 else int(first[k])
        where = ""
        if copy >= 0:
            details |= {"copy_file": str(st.path(copy)), "copy_offset": int(st.e_offset[copy])}
            where = f"its intact copy in {st.path(copy).name} at offset {int(st.e_offset[copy])}"
        severity = "warning"
        if problem[k] < 0 and copy >= 0:
            text += f"; the next boot uses {where} (a move or combine cut short)"
        elif not referenced[k]:
            text += "; no queue index refers to it: nothing is lost"
        else:
            severity = "error"
            text += f"; the next boot loses the message ({Fate(int(problem[k])).label})" + (
                f"; {where} survives (rebuild recovers it)" if copy >= 0 else ": no intact copy is left"
            )
        out.append(Finding("msg-corrupt", text, str(st.files[fi].path), o, severity=severity, details=details))
    return out


def _file_findings(vs: VhostScan, kind: str, st, reported: list[tuple[int, int, int]]) -> list[Finding]:
    """A store's files: candidates the walk did not take, holes, torn tails; fills ``reported``
    with the (file number, start, end) of the holes reported."""
    out = []
    for f in st.files:
        out += r_rdq.rejected_findings(f, kind)
        for h in f.holes:
            if h.kind != "zeroed" or (vs.model.sequential_scan and kind == "persistent"):
                reported.append((f.number, h.offset, h.offset + h.length))
            if h.kind == "truncated_tail":
                out.append(
                    Finding(
                        "rdq-truncated",
                        f"file ends inside an entry ({plural(h.length, 'byte')})",
                        str(f.path),
                        h.offset,
                        details={"store": kind, "length": h.length},
                    )
                )
            elif h.kind == "garbage":
                out.append(
                    Finding(
                        "rdq-garbage",
                        f"{plural(h.length, 'byte')} hold no valid entry",
                        str(f.path),
                        h.offset,
                        details={"store": kind, "length": h.length},
                    )
                )
            elif h.kind == "zeroed" and vs.model.sequential_scan and kind == "persistent":
                # <= 3.13.0 stops at a zero size field: everything after it in the file is lost
                out.append(
                    Finding(
                        "rdq-garbage",
                        f"{h.length} zero bytes: RabbitMQ {vs.model}'s store scan stops "
                        "here and loses every message after it in this file",
                        str(f.path),
                        h.offset,
                        severity="warning",
                        details={"store": kind, "length": h.length},
                    )
                )
    return out


MAX_RECORDED = 64  # rdq-garbage findings per store from msg_store_index.ets records
MAX_EXAMPLES = 5  # refcount-mismatch examples


class _StoreTally:
    """What the passes saw of one store: sums per file, and the few records findings name."""

    def __init__(self, kind: str, store, files: list) -> None:
        self.kind, self.store, self.files = kind, store, files
        self.walked = None  # a read in shares: the store's one walk (``model.store.WalkedStore``)
        self.term_files = None  # the read's (``readers.terms.TermFiles``)
        self.reported: list[tuple[int, int, int]] = []  # (file number, start, end) of holes reported
        n = len(files)
        self.unreached = np.zeros(n, np.int64)  # entries the version's scan does not reach, per file
        self.torn = False
        # per file, for each of ORPHAN and DUPLICATE: entries, bytes, offset of the first
        self.counts = {
            code: (np.zeros(n, np.int64), np.zeros(n, np.int64), np.full(n, np.iinfo(np.int64).max))
            for code in (StoreStatus.ORPHAN, StoreStatus.DUPLICATE)
        }
        self.live_bytes = np.zeros(n, np.int64)
        self.candidates: list[tuple] = []  # the first recorded messages the files do not hold (recorded_mismatches)
        self.elsewhere: dict[int, int] = {}  # file number -> records placed in a file the store has no trace of
        self.past: dict[int, int] = {}  # file number -> records placed past the end of the file
        self.refcount_bad = 0
        self.refcount_examples: list[tuple] = []  # (sort key, example): the first ids by key

    def add_status(self, st, status: np.ndarray) -> None:
        n = len(self.files)
        for code, (count, nbytes, first) in self.counts.items():
            hit = status == code
            count += np.bincount(st.e_file[hit], minlength=n)
            nbytes += np.bincount(st.e_file[hit], weights=st.e_total[hit], minlength=n).astype(np.int64)
            np.minimum.at(first, st.e_file[hit], st.e_offset[hit])
        live = status == StoreStatus.LIVE
        self.live_bytes += np.bincount(st.e_file[live], weights=st.e_total[live], minlength=n).astype(np.int64)

    def status_findings(self) -> list[Finding]:
        """Orphans and duplicates per file, and files mostly garbage."""
        out = []
        for fi, f in enumerate(self.files):
            for code, label in ((StoreStatus.ORPHAN, "orphan-message"), (StoreStatus.DUPLICATE, "duplicate-copy")):
                count, nbytes, first = (int(a[fi]) for a in self.counts[code])
                if count:
                    what = (
                        "messages no index refers to (garbage until compaction)"
                        if code == StoreStatus.ORPHAN
                        else "extra copies of messages already stored"
                    )
                    out.append(
                        Finding(
                            label,
                            f"{plural(count, 'entry')} ({plural(nbytes, 'byte')}): {what}",
                            str(f.path),
                            first,
                            details={"entries": count, "bytes": nbytes},
                        )
                    )
            size, live = f.size, int(self.live_bytes[fi])
            if size > (1 << 20) and live * 2 < size:
                out.append(
                    Finding(
                        "fragmented-file",
                        f"{size - live} of {plural(size, 'byte')} are garbage "
                        f"({100 * (size - live) // size}%): compaction would reclaim them",
                        str(f.path),
                        details={"size": size, "live_bytes": live},
                    )
                )
        return out

    def add_refcounts(self, st, refs) -> None:
        """Recorded reference counts (msg_store_index.ets) against what the indexes hold."""
        rec = st.recorded
        g = refs.ids.lookup(rec.ids.ids)
        computed = np.where(g >= 0, refs.count[np.maximum(g, 0)], 0) if len(refs.count) else np.zeros(len(g), int)
        bad = np.flatnonzero(rec.ref_count != computed)
        self.refcount_bad += len(bad)
        found = [
            (_key(rec.ids.ids[j].tobytes()), rec.ids.ids[j].tobytes(), int(rec.ref_count[j]), int(computed[j]))
            for j in bad[:MAX_EXAMPLES].tolist()
        ]  # ids sorted bytewise: the smallest keys first
        for raw, r in rec.others.items():
            k = refs.ids.lookup(np.frombuffer(raw, "V16"))[0] if _is_id(raw) else -1
            n = int(refs.count[k]) if k >= 0 else 0
            if r[0] != n:
                self.refcount_bad += 1
                found.append((_key(raw), raw, r[0], n))
        for key, raw, recorded, n in found:
            if len(self.refcount_examples) < MAX_EXAMPLES or key < self.refcount_examples[-1][0]:
                ex = {"msg_id": raw.hex() if isinstance(raw, bytes) else repr(raw), "recorded": recorded, "computed": n}
                self.refcount_examples = sorted(self.refcount_examples + [(key, ex)], key=lambda kv: kv[0])[
                    :MAX_EXAMPLES
                ]

    def add_recorded(self, st) -> None:
        cands, elsewhere, past = recorded_mismatches(st, self.reported)
        self.candidates = heapq.nsmallest(MAX_RECORDED, self.candidates + cands)
        for mine, got in ((self.elsewhere, elsewhere), (self.past, past)):
            for n, c in got.items():
                mine[n] = mine.get(n, 0) + c

    def recorded_findings(self) -> list[Finding]:
        """``rdq-garbage`` where a clean stop's ``msg_store_index.ets`` records a message the file
        does not hold (``recorded_mismatches``), and ``term-file-damaged`` when it places messages
        where the store has no files or bytes. A read in shares saw the entries of the record's
        share only: what lies where another share's entry lies is looked up in the walk."""
        cands = self.candidates
        found = (
            _entries_at(self.walked, [(fi, off) for fi, off, _, _, got in cands if got is None])
            if self.walked is not None
            else set()
        )
        out = []
        for fi, offset, raw, total, got in cands:
            if got is None and (fi, offset) in found:
                got = "another id"  # another share's entry: another id
            f = self.files[fi]
            there = "no entry" if got is None else f"an entry of {got}"
            out.append(
                Finding(
                    "rdq-garbage",
                    f"the clean stop's msg_store_index.ets records message {raw.hex()} here "
                    f"({plural(total, 'byte')}), the file holds {there}: the entry was damaged or overwritten"
                    f"{' (the broker deletes the transient store at boot)' if self.kind == 'transient' else ''}",
                    str(f.path),
                    offset,
                    severity="info" if self.kind == "transient" else None,
                    details={"store": self.kind, "msg_id": raw.hex(), "total_size": total},
                )
            )
        if not (self.elsewhere or self.past):
            return out
        by_number = {f.number: f for f in self.files if f.path.suffix == ".rdq"}
        sizes = _summary_sizes(self.store.file_summary, self.term_files)
        # files neither on disk nor in file_summary.ets, or past the end of a file of the size it records
        gone = sorted(
            [n for n in self.elsewhere if sizes is not None and n not in sizes]
            + [n for n in self.past if sizes is not None and sizes.get(n) == by_number[n].size]
        )
        if gone:  # another store's dump, or a stale one
            n = sum(self.elsewhere.get(g, 0) + self.past.get(g, 0) for g in gone)
            out.append(
                Finding(
                    "term-file-damaged",
                    f"the clean stop's msg_store_index.ets places {plural(n, 'message')} where "
                    f"this store has no entries (files neither on disk nor in file_summary.ets, or past "
                    f"the end of a file of the size file_summary.ets records: "
                    f"{', '.join(f'{g}.rdq' for g in gone[:5])}{', ...' if len(gone) > 5 else ''}): "
                    "another store's dump, or a stale one, which the next clean start trusts"
                    f"{' (the broker deletes the transient store at boot)' if self.kind == 'transient' else ''}",
                    str(self.store.msg_store_index),
                    severity="info" if self.kind == "transient" else "warning",
                    details={"store": self.kind, "files": gone[:64], "messages": n},
                )
            )
        return out


def recorded_mismatches(st, reported: list[tuple[int, int, int]]) -> tuple[list[tuple], dict, dict]:
    """Where a clean stop's ``msg_store_index.ets`` records a message (its
    ``#msg_location{msg_id, ref_count, file, offset, total_size}``, which the next clean start
    reads there without a scan; so on every clean sample, both stores) but the file holds no
    entry of that id and size: zeroed, or its head changed, which the file's own framing need not
    show (zeros are a normal hole); not where a hole is reported already (``reported``). Returns
    the first ``MAX_RECORDED`` of them by place, ``(file position, offset, id, total, what the
    file holds there: None (no entry of the scan's), "another id" or "another size")``, and per
    file number the records placed in no file of the store, or past its end. The records held
    as columns are checked as arrays, any other (a damaged dump) one by one."""
    rec = st.recorded
    if not st.clean or not rec:
        return [], {}, {}
    rdq = [f.path.suffix == ".rdq" for f in st.files]  # not an appended .rdt
    by_number = {f.number: fi for fi, f in enumerate(st.files) if rdq[fi]}
    numbers = np.array(sorted(by_number), np.int64)
    positions = np.array([by_number[n] for n in numbers.tolist()], np.int64)
    sizes = np.array([st.files[fi].size for fi in positions.tolist()], np.int64)
    elsewhere: dict[int, int] = {}
    past: dict[int, int] = {}
    # the columns: where each record's file is among the store's
    f, o, t = rec.file, rec.offset, rec.total
    i = np.minimum(np.searchsorted(numbers, f), max(0, len(numbers) - 1))
    known = (numbers[i] == f) if len(numbers) else np.zeros(len(f), bool)
    for n, c in zip(*np.unique(f[~known], return_counts=True)):
        elsewhere[int(n)] = int(c)
    # offset + total > size, in Python where a damaged dump's values could overflow 64 bits
    size = sizes[i] if len(sizes) else np.zeros(len(f), np.int64)
    huge = (o >= 1 << 61) | (o <= -(1 << 61)) | (t >= 1 << 61) | (t <= -(1 << 61))
    beyond = known & ~huge & (np.where(huge, 0, o) + np.where(huge, 0, t) > size)
    for k in np.flatnonzero(known & huge).tolist():
        beyond[k] = int(o[k]) + int(t[k]) > int(size[k])
    for n, c in zip(*np.unique(f[beyond], return_counts=True)):
        past[int(n)] = int(c)
    check = np.flatnonzero(known & ~beyond)
    held = np.zeros(0, np.int64)
    e_rdq = np.array(rdq, bool)[st.e_file] if len(st.e_file) else np.zeros(0, bool)
    e_numbers = np.array([g.number for g in st.files] or [0], np.int64)[st.e_file[e_rdq]] if len(st.e_file) else held
    held = e_numbers * (1 << 40) + st.e_offset[e_rdq] if len(st.e_file) else held
    order = np.argsort(held)
    held = held[order]
    e_of = np.flatnonzero(e_rdq)[order] if len(st.e_file) else held
    place = f[check] * (1 << 40) + o[check]
    j = np.minimum(np.searchsorted(held, place), max(0, len(held) - 1))
    at = ((held[j] == place) & (o[check] >= 0) & (o[check] < 1 << 40)) if len(held) else np.zeros(len(check), bool)
    e = e_of[j] if len(held) else j
    same_id = at & (
        (st.e_id[e].view(">u8").reshape(-1, 2) == rec.ids.ids[check].view(">u8").reshape(-1, 2)).all(axis=1)
        if len(held)
        else at
    )
    same = same_id & (st.e_total[e] == t[check] if len(held) else at)
    miss = np.flatnonzero(~same)
    hidden = np.zeros(len(miss), bool)
    for number, a, b in reported:  # a hole reported already says it
        hidden |= (f[check[miss]] == number) & (o[check[miss]] >= a) & (o[check[miss]] < b)
    miss = miss[~hidden]
    rows = check[miss]
    fi = positions[i[rows]]
    ids = rec.ids.ids[rows]
    halves = ids.view(">u8").reshape(-1, 2)
    first = np.lexsort((t[rows], halves[:, 1], halves[:, 0], o[rows], fi))[:MAX_RECORDED]
    out = [
        (
            int(fi[k]),
            int(o[rows[k]]),
            ids[k].tobytes(),
            int(t[rows[k]]),
            None if not at[miss[k]] else "another id" if not same_id[miss[k]] else "another size",
        )
        for k in first.tolist()
    ]
    # the other records, one by one
    keys = (
        {
            (int(n), int(x)): (st.e_id[k].tobytes(), int(st.e_total[k]))
            for n, x, k in zip(e_numbers.tolist(), st.e_offset[e_rdq].tolist(), np.flatnonzero(e_rdq).tolist())
        }
        if rec.others
        else {}
    )
    for msg_id, r in rec.others.items():
        _, number, offset, total = r
        if not (isinstance(number, int) and isinstance(offset, int) and isinstance(total, int)):
            continue  # not a #msg_location{}: the dump's own finding (terms.ets_findings)
        pos = by_number.get(number)
        if pos is None:
            elsewhere[number] = elsewhere.get(number, 0) + 1
            continue
        if offset + total > st.files[pos].size:
            past[number] = past.get(number, 0) + 1
            continue
        got = keys.get((number, offset))
        if (
            got == (msg_id, total)
            or not isinstance(msg_id, bytes)
            or any(n == number and a <= offset < b for n, a, b in reported)
        ):
            continue
        out.append(
            (pos, offset, msg_id, total, None if got is None else "another id" if got[0] != msg_id else "another size")
        )
    return heapq.nsmallest(MAX_RECORDED, out), elsewhere, past


def _entries_at(walked, places: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """Which of ``places`` (file position, offset) hold an entry of the store's walk (any share)."""
    if not places:
        return set()
    want = np.array([fi * (1 << 40) + off for fi, off in places], np.int64)
    out = set()
    for k in range(walked.entries.parts):
        rec = walked.entries.load(k)
        keys = rec["file"].astype(np.int64) * (1 << 40) + rec["offset"]
        out.update((int(x) >> 40, int(x) & ((1 << 40) - 1)) for x in keys[np.isin(keys, want)].tolist())
    return out


def _is_id(key) -> bool:
    return isinstance(key, bytes) and len(key) == 16


def _key(key) -> tuple:
    """Records in id order (a read in shares meets them a share, an id range, at a time), any
    other key after them."""
    return (0, key, "") if isinstance(key, bytes) else (1, b"", repr(key))


def _summary_sizes(path, files: r_terms.TermFiles) -> dict[int, int] | None:
    """File number -> file size, as a clean stop's file_summary.ets records them (None: none to
    go by)."""
    try:
        return {n: size for n, (_, size) in files.file_summary(path).items()}
    except (CQError, OSError):  # missing or unreadable: its own findings
        return None


def _interrupted_combines(vs: VhostScan, t: _StoreTally) -> list[Finding]:
    """``N.rdt`` files: the tail of a <= 3.12 combine's destination file, left by a kill during
    the store's GC (rabbit_msg_store:recover_crashed_compactions)."""
    out = []
    store = t.store
    rdq = {num for num, _ in store.rdq}
    for num, p in store.rdt:
        pos = next((fi for fi, f in enumerate(t.files) if f.path == p), None)
        lost = int(t.unreached[pos]) if pos is not None else 0
        if not vs.model.appends_rdt:
            what = f"RabbitMQ {vs.model} ignores it: messages only it holds are not recovered"
            severity = "info"
        elif lost:
            # killed after the combine extended N.rdq to its final size: the scan stops at the zeros,
            # or at the message it was copying back when killed
            what = (
                f"the next boot appends it to {num}.rdq, but its scan stops inside {num}.rdq (at zeros or a "
                f"message cut short the combine left) and never reaches the {plural(lost, 'entry')} appended: messages "
                "only they hold are lost (rebuild recovers them)"
            )
            severity = "error"
        elif num in rdq:
            what = f"the next boot appends it to {num}.rdq and recovers the store dirty"
            severity = "info"
        else:
            what = f"there is no {num}.rdq to append it to: RabbitMQ {vs.model}'s message store fails at boot"
            severity = "error"
        out.append(
            Finding(
                "combine-interrupted",
                f"{p.name}: a file combine was cut short; {what}",
                str(p),
                severity=severity,
                details={"store": store.kind, "file": num},
            )
        )
    return out
