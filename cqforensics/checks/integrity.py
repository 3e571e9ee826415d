"""Silent damage: copies and swaps the broker reads without a complaint, and torn or extra
items in the files it keeps beside the queues (issue 12).

* ``QueueIntegrity`` (fed the chunks of one queue dir as ``check_vhost`` scans them): the same
  shared-store message id at two seq ids of one queue (a ``.qi`` slot or CQv1 record copied over
  another, across segments; copies inside one segment are the readers' own findings), CQv1
  ``.idx`` segments swapped (each holds the unacked count a clean stop recorded for the other;
  a swapped ``.qi`` names its own segment in its header: the reader's finding), and junk after
  the last entry of a ``.qs`` (past every entry the ``.qi`` refers to). After a dirty stop
  nothing records which seq ids a CQv1 segment held: a swap is not detectable then.
* ``vhost_file_findings``: ``recovery.dets``, the stores' ``.ets`` dumps and ``clean.dot`` files.
* ``node_findings``: the node-level files (Mnesia ``.DCD``/``.DCL``/``.LOG``/``.DAT``, Khepri's
  Ra WAL and DETS tables under ``coordination/``, other ``.dets`` tables), and every FIFO,
  socket or device named like one (``not-regular-file``; never opened), and the node's text
  files (``cluster_nodes.config``, ``nodes_running_at_shutdown``, ...: ``readers.terms.text_findings``).

The byte-level rules are the readers' (``readers.terms``, ``readers.qs.scan_entries``); this
module only decides which files to ask about and places the findings.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np

from cqforensics.base.enums import Location, RecordKind
from cqforensics.base.errors import CQError, plural
from cqforensics.base.findings import Finding
from cqforensics.codecs.textfiles import TEXT_SHAPES
from cqforensics.model.index import IndexChunk
from cqforensics.model.store import id_halves
from cqforensics.model.vhost import NodeScan, VhostScan
from cqforensics.readers import files as r_files
from cqforensics.readers import qs as r_qs
from cqforensics.readers import registry
from cqforensics.readers import terms as r_terms

#: node-level files the broker (or OTP) keeps in the node dir, by name or extension
NODE_FILES = (
    "cluster_nodes.config",
    "nodes_running_at_shutdown",
    "node-type.txt",
    "rabbit_serial",
    "schema_version",
    "schema.DAT",
    "LATEST.LOG",
    "PREVIOUS.LOG",
    "DECISION_TAB.LOG",
)
NODE_SUFFIXES = (".DCD", ".DCL", ".LOG", ".DAT", ".dets", ".config", ".BUP", ".TMP")
#: dirs of the node dir whose every file belongs to the broker (Khepri/Ra, quorum queues)
NODE_DIRS = ("coordination", "quorum")
MAX_WALK = 10_000  # files looked at per node-level dir (a hostile tree cannot make this unbounded)


class QueueIntegrity:
    """The integrity checks of one queue dir, fed its index chunks one at a time (each with its
    whole live list). In a pass of a read in id shares it looks for copies of the share's ids
    only; the checks of a chunk's files run in the ``first`` pass."""

    def __init__(self, vs: VhostScan, first: bool = True):
        self.vs = vs
        self.first = first
        self.files: list[Path] = []  # every index file seen; ``parts`` name them by position here
        self.parts: list[tuple[np.ndarray, ...]] = []  # (msg id, seq id, file, offset, version) per chunk
        self.out: list[Finding] = []

    def add(self, qx: IndexChunk) -> None:
        r = qx.rec
        kind = r.kind
        held = (r.loc == Location.SHARED_STORE) & ((kind == RecordKind.PUBLISH) | (kind == RecordKind.GHOST))
        if self.vs.share is not None:
            held &= self.vs.share.holds(r.msg_id)  # copies share their id, so their share
        sel = np.flatnonzero(held)
        if len(sel):
            base = len(self.files)
            self.files += qx.files
            self.parts.append(
                (
                    r.msg_id[sel],
                    r.seq[sel],
                    r.file[sel].astype(np.int64) + base,
                    r.offset[sel],
                    np.full(len(sel), qx.version or 0, np.int8),
                )
            )
        if not self.first:
            return
        if qx.version == 1:
            self.out += v1_swapped(self.vs, qx) or []
        elif qx.segment is not None:
            self.out += qs_trailing(qx)

    def findings(self) -> list[Finding]:
        return self.out + self._duplicates()

    def state(self) -> tuple:
        """What was gathered, to be ``absorb``ed by the same check of another process."""
        return self.files, self.parts, self.out

    def absorb(self, state: tuple) -> None:
        """Gather what another instance gathered next (``state``), as if fed its chunks here."""
        files, parts, out = state
        base = len(self.files)
        self.files += files
        self.parts += [(ids, seq, fpos + base, offset, version) for ids, seq, fpos, offset, version in parts]
        self.out += out

    def _duplicates(self) -> list[Finding]:
        """The same message id at two seq ids of the queue, in two files (v2) or anywhere (v1)."""
        if not self.parts:
            return []
        ids, seq, fpos, offset, version = (np.concatenate(c) for c in zip(*self.parts))
        order = np.argsort(seq, kind="stable")
        ids, seq, fpos, offset, version = ids[order], seq[order], fpos[order], offset[order], version[order]
        first_of = _first_of(ids)
        if first_of is None:
            return []
        out = []
        for k in np.flatnonzero(first_of != np.arange(len(ids))).tolist():
            j = int(first_of[k])
            if seq[k] == seq[j]:
                continue  # a CQv1 journal publish of a seq id its segment also holds: the same publish
            path, path_j = self.files[int(fpos[k])], self.files[int(fpos[j])]
            if version[k] == 2 and path == path_j:
                continue  # inside one .qi: the reader's own finding
            out.append(
                Finding(
                    "index-duplicate-entry",
                    f"seq id {int(seq[k])} refers to the same shared-store "
                    f"message as seq id {int(seq[j])} ({os.fsdecode(path_j.name)} at {int(offset[j])}): "
                    "a copied slot or record; the broker delivers the message twice",
                    str(path),
                    int(offset[k]),
                    details={
                        "seq_id": int(seq[k]),
                        "copy_of_seq_id": int(seq[j]),
                        "copy_of_file": str(path_j),
                        "copy_of_offset": int(offset[j]),
                        "msg_id": ids[k].tobytes().hex(),
                    },
                )
            )
        return out


def _first_of(ids: np.ndarray) -> np.ndarray | None:
    """The position of the first occurrence of each id (V16), or None when every id is distinct:
    the common case, told by a sort of the ids' high halves (``np.unique`` of the ids themselves
    sorts 16-byte values byte by byte, 10x slower on 200 k)."""
    hi = np.sort(id_halves(ids)[0])
    if not (hi[1:] == hi[:-1]).any():
        return None
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    return first[inverse.ravel()]


class CopyCheck:
    """Copies of one message that differ. A message routed to several CQv1 queues and small
    enough to be embedded is stored in each queue's index, every copy the same
    ``term_to_binary`` of the same ``#basic_message`` under the same message id (QI1 publish):
    copies whose bytes differ mean at least one was damaged, where nothing else could tell (a
    CQv1 index has no checksum). Not for ``.qs`` entries: a 4.x message container is annotated
    per queue (delivery count, dead-lettering), so its copies legitimately differ; they carry a
    CRC instead. Fed every chunk of the vhost; keeps 24 bytes per embedded copy (an 8-byte id
    prefix, a CRC-32 and where it is); in a pass of a read in id shares, of the share's ids only."""

    def __init__(self, vs: VhostScan):
        self.vs = vs
        self.files: list[Path] = []
        self.parts: list[tuple[np.ndarray, ...]] = []

    def add(self, qx: IndexChunk) -> None:
        r = qx.rec
        embedded = (r.loc == Location.EMBEDDED) & (r.kind == RecordKind.PUBLISH) & (r.store_size > 0)
        if self.vs.share is not None:
            embedded &= self.vs.share.holds(r.msg_id)  # copies share their id, so their share
        sel = np.flatnonzero(embedded)
        if not len(sel):
            return
        paths = [qx.files[int(f)] for f in r.file[sel].tolist()]
        crc = np.array(
            [
                zlib.crc32(b)
                for b in self.vs.bodies.read_many(paths, r.store_offset[sel].tolist(), r.store_size[sel].tolist())
            ],
            np.uint32,
        )
        index = {p: k for k, p in enumerate(dict.fromkeys(paths), start=len(self.files))}
        self.files += list(index)
        prefix = np.ascontiguousarray(r.msg_id[sel]).view(np.uint8).reshape(-1, 16)[:, :8].copy().view(np.uint64)
        self.parts.append(
            (
                prefix.ravel(),
                crc,
                np.array([index[p] for p in paths], np.int32),
                r.store_offset[sel].astype(np.int64),
                r.offset[sel].astype(np.int64),
            )
        )

    def state(self) -> tuple:
        """What was gathered, to be ``absorb``ed by the same check of another process."""
        return self.files, self.parts

    def absorb(self, state: tuple) -> None:
        """Gather what another instance gathered next (``state``), as if fed its chunks here."""
        files, parts = state
        base = len(self.files)
        self.files += files
        self.parts += [(ids, crc, fpos + base, store_offset, offset) for ids, crc, fpos, store_offset, offset in parts]

    def findings(self) -> list[Finding]:
        if not self.parts:
            return []
        ids, crc, fpos, store_offset, offset = (np.concatenate(c) for c in zip(*self.parts))
        order = np.lexsort((crc, ids))
        ids, crc = ids[order], crc[order]
        same_id = ids[1:] == ids[:-1]
        differs = np.flatnonzero(same_id & (crc[1:] != crc[:-1]))
        out, seen = [], set()
        for k in differs.tolist():
            if int(ids[k]) in seen:
                continue
            seen.add(int(ids[k]))
            a, b = order[k], order[k + 1]
            pa_, pb = self.files[int(fpos[a])], self.files[int(fpos[b])]
            out.append(
                Finding(
                    "message-copies-differ",
                    f"two embedded copies of one message (the same id, routed "
                    f"to two queues) differ: this one and the copy in {os.fsdecode(pb)} at "
                    f"{int(store_offset[b])}; at least one is damaged (a CQv1 index has no checksum)",
                    str(pa_),
                    int(store_offset[a]),
                    details={
                        "other_file": str(pb),
                        "other_offset": int(store_offset[b]),
                        "index_offset": int(offset[a]),
                    },
                )
            )
        return out


def qs_trailing(qx: IndexChunk) -> list[Finding]:
    """Bytes of the chunk's ``.qs`` that are neither entries nor zeros (QS2 leaves zero-filled
    gaps only): ``qs-trailing-garbage`` after the last entry its ``.qi`` refers to (live or
    dropped), ``qs-garbage`` between entries, where no live entry lies (a damaged live entry is
    ``qs-entry-crc``'s)."""
    path = qx.qs_path
    if path is None:
        return []
    r = qx.rec
    sel = r.loc == Location.QUEUE_STORE
    try:
        size = r_files.file_size(path)
    except CQError:
        return []
    starts, lengths = r_qs.entry_span(r.store_offset[sel], r.store_size[sel])
    ends = starts + lengths
    inside = ends <= size  # a slot pointing past the end is qs-entry-missing's
    last = max(r_qs.first_entry_offset(), int(ends[inside].max()) if inside.any() else 0)
    live = np.zeros(len(r.loc), bool)
    live[qx.live] = True
    lsel = live[sel]
    l_starts, l_ends = starts[lsel], ends[lsel]
    out = []
    for off, length in r_qs.garbage_runs(path, 0):
        if off >= last and ((starts == off) & ~inside).any():
            break  # the start of an entry the end of the file cuts: qs-entry-missing says so
        if off >= last:
            out.append(
                Finding(
                    "qs-trailing-garbage",
                    f"{plural(length, 'byte')} after the last entry the index refers to are "
                    "no entry (junk appended, or a torn write)",
                    str(path),
                    off,
                    details={"length": length},
                )
            )
            break
        if ((l_starts < off + length) & (l_ends > off)).any():
            continue
        out.append(
            Finding(
                "qs-garbage",
                f"{plural(length, 'byte')} between entries are neither an entry nor zeros: an entry "
                "no live index entry refers to was damaged (the broker never reads it)",
                str(path),
                off,
                details={"length": length},
            )
        )
        if len(out) >= 16:
            break
    return out


def _recovery_terms(vs: VhostScan) -> dict:
    """The vhost's recovery terms (read once per scan)."""
    cached = vs.__dict__.get("_integrity_recovery_terms")
    if cached is None:
        try:
            cached = vs.term_files.recovery_terms(vs.vhost.recovery_dets)
        except CQError:
            cached = {}
        vs.__dict__["_integrity_recovery_terms"] = cached
    return cached


def v1_swapped(vs: VhostScan, qx: IndexChunk) -> list[Finding] | None:
    """``segment-misplaced`` for CQv1 ``.idx`` segments from the broker's own record: a clean
    stop stores each segment's unacked count in the recovery terms (``{segments, [{Seg, N}]}``,
    QI1 terminate). Two segments each holding the count recorded for the other were swapped (or
    renamed into each other's place). None when no counts are recorded (a dirty stop)."""
    terms = _recovery_terms(vs).get(qx.qdir.dir_name)
    recorded = terms.get("segments") if isinstance(terms, dict) else None
    if not isinstance(recorded, list):
        return None
    rec_counts = {
        s: n
        for s, n in (x for x in recorded if isinstance(x, tuple) and len(x) == 2)
        if isinstance(s, int) and isinstance(n, int)
    }
    r = qx.rec
    held: dict[int, tuple[int, Path]] = {}
    for fpos, (number, path) in enumerate(qx.qdir.idx):
        sel = r.file == fpos
        held[number] = (
            int(((r.kind == RecordKind.PUBLISH) & sel).sum() - ((r.kind == RecordKind.ACK) & sel).sum()),
            path,
        )
    out = []
    for number, (count, path) in sorted(held.items()):
        want = rec_counts.get(number)
        if want is None or want == count:
            continue
        partners = [m for m, (c, _) in held.items() if m != number and rec_counts.get(m) == count and c == want]
        if partners:
            out.append(
                Finding(
                    "segment-misplaced",
                    f"segment {number} holds {count} unacked entries, the count "
                    f"the clean shutdown recorded for segment {partners[0]} (and {partners[0]} holds the "
                    f"{want} recorded for {number}): the segment files were swapped; the broker reads "
                    "their records under each other's seq ids",
                    str(path),
                    0,
                    details={
                        "segment": number,
                        "holds": count,
                        "recorded": want,
                        "swapped_with": partners[0],
                        "evidence": "recovery terms",
                    },
                )
            )
        else:  # another queue's segment, or records lost or added: the terms no longer describe it
            out.append(
                Finding(
                    "recovery-terms-mismatch",
                    f"segment {number} holds {count} unacked entries, the clean "
                    f"shutdown recorded {want}: the segment was replaced (another queue's?) or records "
                    "were lost or added since; a clean start trusts the recorded count (CQv1 keeps a "
                    "segment file until its count reaches 0)",
                    str(path),
                    0,
                    severity="warning",
                    details={"segment": number, "holds": count, "recorded": want, "evidence": "recovery terms"},
                )
            )
    return out


def vhost_file_findings(vs: VhostScan) -> list[Finding]:
    """``term-file-damaged`` for the vhost's ``recovery.dets`` and its stores' ``.ets`` dumps."""
    out = []
    if r_files.is_regular(vs.vhost.recovery_dets):
        out += _safe(r_terms.dets_findings, vs.vhost.recovery_dets)
        out += recovery_terms_findings(vs)
    for kind, st in vs.vhost.stores.items():
        for p in (st.file_summary, st.msg_store_index):
            if r_files.is_regular(p):
                out += _safe(lambda p: r_terms.ets_findings(p, vs.term_files.ets(p)), p)
        if r_files.is_regular(st.file_summary) and st.clean_dot.exists():
            out += _safe(lambda p: file_summary_findings(p, st.rdq, kind, vs.term_files), st.file_summary)
        out += _safe(lambda p: r_terms.text_findings(p, f"clean.dot:{kind}"), st.clean_dot)
    return out


def segment_count_findings(vs: VhostScan, index_findings: list[Finding]) -> list[Finding]:
    """``term-file-damaged`` at the vhost's ``.config`` when a CQv1 record of the vhost holds a
    RelSeq past the segment entry count it records (``v1-segment-truncated`` with a
    ``segment_entry_count``, from the index findings of the vhost's queues): the count, or the
    record, is damaged (the broker wrote every record below the count it had)."""
    over = [f for f in index_findings if f.code == "v1-segment-truncated" and "segment_entry_count" in f.details]
    if not over:
        return []
    top = max(over, key=lambda f: f.details["rel_seq"])
    return [
        Finding(
            "term-file-damaged",
            f"its segment entry count {top.details['segment_entry_count']} is below the "
            f"RelSeq {top.details['rel_seq']} of a CQv1 record ({top.file}@{top.offset}) and "
            f"{len(over) - 1} more: this count, or those records, were damaged (the broker wrote each record "
            "below the count it had); loading the segments crashes their queues",
            str(vs.vhost.path / ".config"),
            None,
            details={
                "segment_entry_count": top.details["segment_entry_count"],
                "rel_seq": top.details["rel_seq"],
                "records": len(over),
            },
        )
    ]


def recovery_terms_findings(vs: VhostScan) -> list[Finding]:
    """``term-file-damaged`` for a clean stop's ``recovery.dets`` without the terms of some queue
    dirs of the vhost: at a clean stop every queue's index stores its terms there (rabbit_queue_index
    / rabbit_classic_queue_index_v2 terminate; one per queue dir on every clean sample), so a
    missing one means a stale, replaced or damaged table (those queues recover dirty)."""
    st = vs.vhost.stores.get("persistent")
    if st is None or not st.clean_dot.exists():
        return []  # a dirty stop: terms are written at a clean one only
    terms = _recovery_terms(vs)
    missing = sorted(q.dir_name for q in vs.vhost.queues if q.dir_name not in terms)
    if not missing:
        return []
    return [
        Finding(
            "term-file-damaged",
            f"after a clean stop it holds no recovery terms for {len(missing)} of the "
            f"vhost's {plural(len(vs.vhost.queues), 'queue dir')} ({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''})"
            ": every queue stores them at a clean stop, so the table is stale, replaced or damaged (those "
            "queues recover dirty)",
            str(vs.vhost.recovery_dets),
            details={"queue_dirs": missing[:64]},
        )
    ]


def file_summary_findings(
    path: Path, rdq: list[tuple[int, Path]], kind: str = "persistent", files: r_terms.TermFiles | None = None
) -> list[Finding]:
    """``term-file-damaged`` for a clean stop's ``file_summary.ets`` that does not describe its
    store's files: a clean stop dumps one ``#file_summary{file, valid_total_size, ..., file_size}``
    per ``.rdq`` file, whose file_size is that file's size (so on every sample); another set of
    files or sizes is a stale, swapped or damaged dump, which the next clean start trusts. Either
    side may be the damaged one, so each ``.rdq`` of another size than recorded is named too
    (``rdq-garbage`` where the two part: info in the transient store, which every boot deletes)."""
    files = files if files is not None else r_terms.TermFiles()
    out = _file_summary_shape(path, files)
    recorded = files.file_summary(path)
    actual = {}
    for number, p in rdq:
        try:
            actual[number] = r_files.file_size(p)
        except CQError:
            continue
    wrong = sorted(
        n
        for n in set(recorded) | set(actual)
        if n not in recorded
        or n not in actual
        or recorded[n][1] != actual[n]
        or not isinstance(recorded[n][0], int)
        or recorded[n][0] > recorded[n][1]
    )
    if not wrong:
        return out
    shown = ", ".join(
        f"{n}.rdq: {recorded[n][1] if n in recorded else 'not recorded'} vs {actual[n] if n in actual else 'no file'}"
        for n in wrong[:5]
    )
    out.append(
        Finding(
            "term-file-damaged",
            f"file_summary.ets does not describe this store's files after a clean "
            f"stop (recorded size vs file: {shown}{', ...' if len(wrong) > 5 else ''}): a stale, swapped or "
            "damaged dump, which the next clean start trusts",
            str(path),
            details={"files": wrong[:64]},
        )
    )
    paths = dict(rdq)
    for n in wrong[:64]:
        size = recorded[n][1] if n in recorded else None
        if n not in actual or not isinstance(size, int) or size == actual[n]:
            continue
        out.append(
            Finding(
                "rdq-garbage",
                f"{plural(actual[n], 'byte')}, where the clean stop's file_summary.ets records {size}: "
                "this file was truncated, extended, swapped or replaced since (or the dump is damaged)",
                str(paths[n]),
                min(size, actual[n]),
                severity="info" if kind == "transient" else None,
                details={"store": kind, "recorded_size": size, "size": actual[n]},
            )
        )
    return out


def _file_summary_shape(path: Path, files: r_terms.TermFiles) -> list[Finding]:
    """``term-file-damaged`` for a ``#file_summary{file, valid_total_size, left, right, file_size,
    locked, readers}`` of a clean stop's dump that is not what MS terminate leaves: ``locked``
    false, ``readers`` 0 (3.x) or undefined (4.x), ``left``/``right`` the numbers of the files
    beside it or undefined (3.13+ keeps no links), and ``valid_total_size`` the bytes of the
    entries ``msg_store_index.ets`` (dumped with it) places in that file with a reference
    (every clean sample, 3.10.8 to 4.3.6). The dump has no checksum: these are how a flipped bit
    in it shows; either dump may be the damaged one."""
    try:
        log = r_terms.read_disk_log(path)
    except CQError:
        return []
    records = []  # (item offset, record)
    for off, item in zip(log.offsets[1:], log.items[1:]):
        for o in item if isinstance(item, list) else [item]:
            if isinstance(o, tuple) and len(o) == 8 and o[0] == "file_summary" and isinstance(o[1], int):
                records.append((off, o))
    numbers = sorted(o[1] for _, o in records)
    place: dict[int, int] = {}  # a file number's first position in ``numbers`` (not a search per record)
    for k, number in enumerate(numbers):
        place.setdefault(number, k)
    index = path.parent / "msg_store_index.ets"
    live = _referenced_bytes(index, files) if index.exists() else None
    out = []
    for off, (_, number, valid, left, right, _size, locked, readers) in records:
        k = place[number]
        problems = []
        if locked != "false":
            problems.append(f"locked is {str(locked)[:20]}, not false")
        if readers not in (0, "undefined"):
            problems.append(f"readers is {str(readers)[:20]}, not 0 or undefined")
        if left != "undefined" and left != (numbers[k - 1] if k else None):
            problems.append(f"left is {str(left)[:20]}, not the file before it or undefined")
        if right != "undefined" and right != (numbers[k + 1] if k + 1 < len(numbers) else None):
            problems.append(f"right is {str(right)[:20]}, not the file after it or undefined")
        if live is not None and isinstance(valid, int) and valid != live.get(number, 0):
            problems.append(
                f"valid_total_size is {valid}, where msg_store_index.ets places {live.get(number, 0)} "
                "bytes of referenced entries in the file"
            )
        if problems:
            out.append(
                Finding(
                    "term-file-damaged",
                    f"the record of {number}.rdq is not what a clean stop dumps: "
                    f"{'; '.join(problems)} (a flipped bit in this dump or in msg_store_index.ets; the "
                    "next clean start trusts both)",
                    str(path),
                    off,
                    details={"file": number},
                )
            )
    return out


def _referenced_bytes(index: Path, files: r_terms.TermFiles) -> dict[int, int] | None:
    """File number -> the total size of the ``#msg_location{}`` records of a complete
    ``msg_store_index.ets`` (strict walk) with a count above 0 placed in it (None: the dump is
    not complete). Summed over the columns (a read in shares: each share's records in turn), the
    rare record that is no ``LOCATION`` row one by one."""
    dump = files.ets(index)
    if not dump.complete:
        return None
    if dump.items.rows is None:  # sorted out by share as it was decoded (readers.terms.TermFiles.sinks)
        spill = files.spills[index]
        runs, others = (spill.load(k) for k in range(spill.parts)), []
    else:
        locs = dump.locations()
        runs, others = [locs.rows], locs.others
    live: dict[int, int] = {}
    for rows in runs:
        sel = rows["ref_count"] > 0
        f, t = rows["file"][sel], rows["total"][sel]
        if not len(f):
            continue
        order = np.argsort(f, kind="stable")
        f, t = f[order], t[order]
        starts = np.flatnonzero(np.r_[True, f[1:] != f[:-1]])
        for n, b in zip(f[starts].tolist(), np.add.reduceat(t, starts).tolist()):
            live[n] = live.get(n, 0) + b
    for _, _, (count, number, _, total) in others:
        if isinstance(count, int) and count > 0 and isinstance(number, int) and isinstance(total, int):
            live[number] = live.get(number, 0) + total
    return live


def _safe(check, path: Path) -> list[Finding]:
    try:
        return check(path)
    except CQError:  # unreadable, or swapped for a FIFO since listed: never read
        return []


def _node_file(name: str) -> bool:
    return name in NODE_FILES or name.endswith(NODE_SUFFIXES) or registry.kind_of(name, "node") is not None


def node_findings(ns: NodeScan) -> list[Finding]:
    """The node-level files: ``not-regular-file`` for a FIFO, socket, device or dangling link
    named like one (the node dir's own files, ``<node>-feature_flags`` beside it, and everything
    under ``coordination/`` and ``quorum/``), and ``term-file-damaged`` for a damaged Mnesia log
    or table, Khepri WAL or DETS table."""
    node = ns.node.path
    out: list[Finding] = []
    candidates: list[Path] = [node.parent / f"{node.name}-feature_flags"]
    try:
        with os.scandir(node) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        entries = []
    for e in entries:
        if e.name in NODE_DIRS:
            candidates += _walk(Path(e.path))
        elif e.name != "msg_stores" and _node_file(e.name):
            candidates.append(Path(e.path))
    for p in candidates:
        out += [
            Finding(f.code, f.message, f.file, f.offset, f.severity, details={**f.details, "place": "node"})
            for f in _node_file_findings(node, p)
        ]
    for d in NODE_DIRS:
        for system in sorted((node / d).glob("*/names.dets")) if (node / d).is_dir() else ():
            # quorum/: an unregistered server dir is quorum-queue-unavailable (checks.quorum), with its fate
            out += ra_directory_findings(system.parent, unregistered=d != "quorum")
    return out


def ra_directory_findings(system: Path, unregistered: bool = True) -> list[Finding]:
    """``term-file-damaged`` for a Ra system dir (``coordination/<node>``: Khepri;
    ``quorum/<node>``: quorum queues) whose directory table ``names.dets`` (``{ServerName, UId}``
    per server, ra_directory) and server data dirs (``<UId>/`` holding ``config``) disagree:
    Ra finds a server's data by the UId its name is registered under, so an unregistered data
    dir is not the one it restarts (for Khepri: the metadata), and a registered UId without a
    dir has no data. A ``names.dets`` Ra left open (kill -9) is still read: OTP repairs it."""
    names = system / "names.dets"
    try:
        objects = r_terms.read_dets_objects(names)
    except CQError:
        return []
    registered = {o[1] for o in objects if isinstance(o, tuple) and len(o) == 2 and isinstance(o[1], bytes)}
    try:
        dirs = {
            os.fsencode(e.name)
            for e in os.scandir(system)
            if e.is_dir(follow_symlinks=False) and os.path.exists(os.path.join(e.path, "config"))
        }
    except OSError:
        return []
    out = []
    for uid in sorted(dirs - registered) if unregistered else ():
        out.append(
            Finding(
                "term-file-damaged",
                f"Ra server data dir {uid.decode('utf-8', 'replace')} is not "
                "registered in names.dets: Ra finds a server's data by the UId its name is registered "
                "under, so this data is not what it restarts (a damaged or replaced names.dets)",
                str(names),
                details={"unregistered_dir": uid.decode("utf-8", "replace")},
            )
        )
    for uid in sorted(registered - dirs):
        out.append(
            Finding(
                "term-file-damaged",
                f"names.dets registers UId {uid.decode('utf-8', 'replace')}, which "
                "has no data dir here: that server starts with no data (its dir lost, or the UId "
                "damaged)",
                str(names),
                details={"registered_uid": uid.decode("utf-8", "replace")},
            )
        )
    for wal in sorted(system.glob("*.wal")):
        try:
            introduced = r_terms.wal_uids(wal)
        except CQError:
            continue
        for off, uid in introduced:
            if uid not in registered:  # ra_log_wal recover_records skips the records of an unregistered UId
                out.append(
                    Finding(
                        "term-file-damaged",
                        f"a WAL record introduces writer UId "
                        f"{uid.decode('utf-8', 'replace')!r}, which names.dets does not register: Ra skips "
                        "its records (a deleted server's, or the UId damaged: the checksum does not cover "
                        "it)",
                        str(wal),
                        off,
                        # Khepri's system holds one server, never deleted: its records are the metadata
                        severity="warning" if system.parent.name == "coordination" else "info",
                        details={"unregistered_uid": uid.decode("utf-8", "replace")},
                    )
                )
    return out + ra_meta_findings(system / "meta.dets", registered & dirs, registered | dirs)


def ra_meta_findings(meta: Path, servers: set[bytes], known: set[bytes]) -> list[Finding]:
    """``term-file-damaged`` for a Ra system's ``meta.dets`` (ra_log_meta: ``{UId, CurrentTerm,
    VotedFor, LastApplied}`` per server, stored with a sync at every term change, so every server
    that has run holds one) that lacks the record of a registered server with a data dir (Ra
    restarts it at term 0, with no vote and nothing applied), or holds one for a server this
    system does not know (another system's table in its place; info: a deleted server's record
    may be left behind)."""
    try:
        objects = r_terms.read_dets_objects_at(meta)
    except CQError:  # absent, unreadable or not a regular file: never read
        return []
    records = {}
    for off, o in objects:
        if isinstance(o, tuple) and len(o) == 4 and isinstance(o[0], bytes):
            records.setdefault(o[0], off)
    out = []
    for uid in sorted(servers - records.keys()):
        text = uid.decode("utf-8", "replace")
        out.append(
            Finding(
                "term-file-damaged",
                f"meta.dets holds no record of Ra server {text} (registered in "
                "names.dets, with its data dir): Ra restarts it at term 0, with no vote and nothing "
                "applied (the table replaced, or its record lost)",
                str(meta),
                details={"missing_uid": text},
            )
        )
    for uid in sorted(records.keys() - known):
        text = uid.decode("utf-8", "replace")
        out.append(
            Finding(
                "term-file-damaged",
                f"meta.dets holds the record of Ra server {text}, which this system "
                "neither registers nor has a data dir of: another system's table in its place, or a "
                "deleted server's record left behind",
                str(meta),
                records[uid],
                severity="info",
                details={"unknown_uid": text},
            )
        )
    return out


def _node_file_findings(node: Path, p: Path) -> list[Finding]:
    """One node-level file: what it is if not a regular file, else its damage (by kind)."""
    out: list[Finding] = []
    try:
        what = r_files.file_type(p)
    except FileNotFoundError:
        return out
    except OSError as err:
        what = f"unreadable ({err.strerror})"
    if what is not None:  # a directory too: only those named like a broker file are asked about
        out.append(Finding("not-regular-file", f"{what}, not a regular file: never read", str(p)))
        return out
    name = p.name
    in_coord = bool(set(NODE_DIRS) & set(p.relative_to(node).parts)) if p.is_relative_to(node) else False
    if p.parent == node and name in TEXT_SHAPES:
        out += _safe(lambda p: r_terms.text_findings(p, name, node.name), p)
    elif name.endswith((".DCD", ".DCL", ".LOG")):
        out += _safe(r_terms.disk_log_findings, p)
    elif (name.endswith((".dets", ".DAT")) and p.parent == node) or (in_coord and name.endswith(".dets")):
        out += _safe(r_terms.dets_findings, p)
    elif in_coord and name.endswith(".wal") and "quorum" not in p.relative_to(node).parts:
        out += _safe(r_terms.wal_findings, p)  # quorum/: checks.quorum (what the quorum system's recovery does)
    elif in_coord and name == "config" and p.parent.parent.parent.name in NODE_DIRS:  # <system>/<UId>/config
        out += _safe(r_terms.ra_config_findings, p)
    elif in_coord and name == "writers.snapshot":
        out += _safe(r_terms.writers_snapshot_findings, p)
    return out


def _walk(root: Path) -> list[Path]:
    """Every non-dir entry below ``root`` (symlinks not followed into), at most MAX_WALK."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for n in sorted(filenames):
            out.append(Path(dirpath) / n)
            if len(out) >= MAX_WALK:
                return out
        # a dir entry that is a symlink to nowhere is listed among dirnames by some systems, and a
        # dir named like a broker file stands where that file was: both kept (and not entered)
        for d in list(dirnames):
            p = Path(dirpath) / d
            if (p.is_symlink() and not p.exists()) or registry.kind_of(d) is not None:
                out.append(p)
                dirnames.remove(d)
    return out


__all__ = [
    "CopyCheck",
    "QueueIntegrity",
    "file_summary_findings",
    "node_findings",
    "ra_directory_findings",
    "ra_meta_findings",
    "qs_trailing",
    "segment_count_findings",
    "v1_swapped",
    "vhost_file_findings",
]
