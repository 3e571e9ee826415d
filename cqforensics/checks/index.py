"""Checks of the index chunks: their entries whose body is not where the index says (per-queue
store checks as QS2 check_msg_on_disk; shared-store lookups). A vhost read in id shares sees
each chunk once per share, with that share's live entries; some rules judge a chunk as a whole
(an unwritten ``.qs`` tail, an acked head), so ``ChunkCheck`` gathers what every pass saw and
decides when all are in."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from cqforensics.base.enums import Location, QsStatus
from cqforensics.base.errors import plural
from cqforensics.base.findings import Finding
from cqforensics.discovery.nodes import QueueDir
from cqforensics.model import recovery
from cqforensics.model.index import IndexChunk
from cqforensics.model.recovery import Resolved
from cqforensics.model.vhost import VhostScan
from cqforensics.readers import qs as r_qs

_GONE = (QsStatus.MISSING_FILE, QsStatus.OUT_OF_RANGE)


@dataclass
class _Chunk:
    """What the passes over one chunk saw; ``j``: an entry's position in the chunk's whole live
    list (SeqId order), so a share's entries fall in place among the others'."""

    qdir: QueueDir
    segment: int | None
    qs_path: Path | None
    bad_qs: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # (j, QsStatus, seq, offset, size)
    missing: list[tuple[int, int, bytes, Path, int]] = field(default_factory=list)  # (j, seq, id, index file, offset)
    # transient entries of a durable queue whose body is in the persistent store: (j, seq, id, index file, offset)
    misflagged: list[tuple[int, int, bytes, Path, int]] = field(default_factory=list)
    transient: int = 0  # transient shared-store entries whose body is in no file
    transient_ends: tuple[tuple[int, int], tuple[int, int]] | None = None  # (j, seq) of their first and last
    first_found: int | None = None  # j of the first persistent shared-store entry whose body was found


def reader_findings(vs: VhostScan, qx: IndexChunk) -> list[Finding]:
    """The readers' findings of a chunk as the next boot meets them: one finding per cause. A
    ``.qi`` segment whose header is bad is deleted whole by a dirty recovery, which never parses
    its slots (``recovery.unread_slots``): what its slots hold (records the strict parser
    rejects, numbers out of range, stray bytes; random bytes make all of them) is no cause of its
    own, so those findings are folded into the segment's ``qi-bad-header`` (counted in its
    details and message), and none of them says the queue crashes."""
    skip = recovery.unread_slots(vs, qx)
    if not skip:
        return qx.findings
    out, folded = [], {}
    for f in qx.findings:
        if f.file in skip and f.code != "qi-bad-header":
            folded.setdefault(f.file, {}).setdefault(f.code, 0)
            folded[f.file][f.code] += 1
        else:
            out.append(f)
    for i, f in enumerate(out):
        counts = folded.get(f.file) if f.code == "qi-bad-header" else None
        if counts:
            n = sum(counts.values())
            out[i] = replace(
                f,
                message=f"{f.message}; its slots are never parsed, so the {plural(n, 'problem')} "
                f"in them ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}) are "
                "part of this one",
                details={**f.details, "slot_findings": dict(sorted(counts.items()))},
            )
    return out


class ChunkCheck:
    """Where the bodies of a vhost's live index entries are not, chunk by chunk, fed pass by pass
    (``add``) and judged once every pass is in (``findings``)."""

    def __init__(self) -> None:
        self.chunks: dict[tuple[int, int], _Chunk] = {}
        self.first_segment: dict[Path, int | None] = {}  # queue dir -> its first .qi segment

    def add(self, vs: VhostScan, key: tuple[int, int], qx: IndexChunk, res: Resolved, at: np.ndarray) -> None:
        """The live entries of ``qx`` (one share's, or all) resolved as ``res``; ``key`` names the
        chunk the same in every pass, ``at`` is each entry's position in its whole live list."""
        r, live = qx.rec, qx.live
        status = res.qs_status
        shared = r.loc[live] == Location.SHARED_STORE
        persistent = r.persistent[live]
        fine = (status == QsStatus.NONE) | (status == QsStatus.OK)
        bad = np.flatnonzero(~fine)
        nowhere = shared & fine & (res.body_file < 0)
        missing = np.flatnonzero(nowhere & (persistent == 1))
        transient = np.flatnonzero(nowhere & (persistent == 0))
        found = np.flatnonzero(shared & (persistent == 1) & (res.body_file >= 0))
        head = len(found) and self.maybe_acked_head(vs, qx.qdir, qx.segment)
        misflagged = np.zeros(0, np.int64)
        if len(transient) and vs.queue_known(qx.qdir) and vs.stores.get("persistent") is not None:
            # a durable queue's message goes to the store of its persistence (rabbit_variable_queue
            # msg_store_client by IsPersistent), the same for every queue it reaches: a transient
            # entry whose id is in the persistent store, not the transient one, had its flag flipped
            cp, ap = vs.stores["persistent"].locate(r.msg_id[live[transient]])
            misflagged = transient[(cp >= 0) | (ap >= 0)]
        if not (len(bad) or len(missing) or len(transient) or head):
            return
        c = self.chunks.get(key)
        if c is None:
            c = self.chunks[key] = _Chunk(qx.qdir, qx.segment, qx.qs_path)
        i = live[bad]
        c.bad_qs += zip(
            at[bad].tolist(),
            status[bad].tolist(),
            r.seq[i].tolist(),
            r.store_offset[i].tolist(),
            r.store_size[i].tolist(),
        )
        i = live[missing]
        c.missing += zip(
            at[missing].tolist(),
            r.seq[i].tolist(),
            (m.tobytes() for m in r.msg_id[i]),
            (qx.files[f] for f in r.file[i].tolist()),
            r.offset[i].tolist(),
        )
        i = live[misflagged]
        c.misflagged += zip(
            at[misflagged].tolist(),
            r.seq[i].tolist(),
            (m.tobytes() for m in r.msg_id[i]),
            (qx.files[f] for f in r.file[i].tolist()),
            r.offset[i].tolist(),
        )
        if len(transient):
            c.transient += len(transient)
            ends = [(int(at[k]), int(r.seq[live[k]])) for k in (transient[0], transient[-1])]
            if c.transient_ends is not None:
                ends += c.transient_ends
            c.transient_ends = (min(ends), max(ends))
        if head:
            c.first_found = min(int(at[found[0]]), c.first_found if c.first_found is not None else 1 << 62)

    def state(self) -> tuple:
        """What was gathered, to be ``absorb``ed by the same check of another process."""
        return self.chunks, self.first_segment

    def absorb(self, state: tuple, queue_dirs: list[QueueDir]) -> None:
        """Gather what another instance gathered (``state``: its chunks, keyed by (queue dir
        position, chunk position), each in ``queue_dirs``), as if fed those chunks here."""
        chunks, first_segment = state
        self.first_segment.update(first_segment)
        for key, c in chunks.items():
            c.qdir = queue_dirs[key[0]]  # this process's own (another's came as a copy)
            mine = self.chunks.get(key)
            if mine is None:
                self.chunks[key] = c
                continue
            mine.bad_qs += c.bad_qs
            mine.missing += c.missing
            mine.transient += c.transient
            if c.transient_ends is not None:
                ends = list(c.transient_ends) + (list(mine.transient_ends) if mine.transient_ends is not None else [])
                mine.transient_ends = (min(ends), max(ends))
            if c.first_found is not None:
                mine.first_found = min(c.first_found, mine.first_found if mine.first_found is not None else 1 << 62)

    def findings(self, vs: VhostScan, store_intact: bool) -> list[Finding]:
        """Every chunk's findings, placed in its queue and priority level. ``store_intact``: the
        vhost's persistent store exists and shows no damage (no garbage, no torn entry)."""
        out = []
        for _, c in sorted(self.chunks.items(), key=lambda kv: kv[0]):
            acked = store_intact and self.maybe_acked_head(vs, c.qdir, c.segment)
            out += [f.scoped(queue=c.qdir.name, priority=c.qdir.priority) for f in _chunk_findings(vs, c, acked)]
        return out

    def maybe_acked_head(self, vs: VhostScan, qdir: QueueDir, segment: int | None) -> bool:
        """Whether persistent messages in no shared-store file may be the acked head of the queue
        (``_chunk_findings``) as far as the chunk's place tells: the recovery is dirty and the
        chunk is the queue's first."""
        if qdir.path not in self.first_segment:
            self.first_segment[qdir.path] = min((seg for seg, _ in qdir.qi), default=None)
        first = self.first_segment[qdir.path]
        return vs.recovery == "dirty" and (segment is None or first is None or first >= segment)


def _chunk_findings(vs: VhostScan, c: _Chunk, maybe_acked: bool) -> list[Finding]:
    """One chunk's findings from what every pass saw of it. Persistent messages in no
    shared-store file are an acked head, not damage, when they are the first persistent
    shared-store entries of the queue's first chunk, the recovery is dirty and the store shows no
    damage (``maybe_acked``: all but the first): a queue hands its acks to the store (which
    removes a message no queue holds any more, and whose GC may then drop its bytes at once:
    seen on 3.10.8, combining files) and writes them to its index on its own schedule, so a
    kill -9 can leave index entries for messages the store no longer has; a consumer acks in
    order."""
    out = []
    path = str(c.qs_path or c.qdir.path / f"{c.segment}.qs")
    reported = False
    unwritten = _unwritten_tail(vs, c)
    tail: list[int] = []  # seq ids of entries in the unwritten tail (one finding for them all)
    for _, code, seq, off, size in sorted(c.bad_qs):
        status = QsStatus(code)
        if unwritten:
            tail.append(seq)
        elif status in (QsStatus.MISSING_FILE, QsStatus.BAD_HEADER):
            if not reported:
                reported = True
                code, what = (
                    ("qs-entry-missing", "the index points into a .qs segment that is not there")
                    if status == QsStatus.MISSING_FILE
                    else ("qs-bad-header", "bad .qs header: none of its messages can be read")
                )
                out.append(
                    Finding(code, what, path, None if status == QsStatus.MISSING_FILE else 0, details={"seq_id": seq})
                )
        elif status == QsStatus.OUT_OF_RANGE:
            entry = r_qs.entry_span(off, size)[1]
            out.append(
                Finding(
                    "qs-entry-missing",
                    f"entry for seq id {seq} ({plural(entry, 'byte')}) lies beyond the end of the file",
                    path,
                    off,
                    details={"seq_id": seq, "size": size},
                )
            )
        else:
            out.append(
                Finding(
                    "qs-entry-crc",
                    f"entry for seq id {seq} fails its {'CRC' if status == QsStatus.BAD_CRC else 'size'} check",
                    path,
                    off,
                    details={"seq_id": seq, "size": size, "check": status.label},
                )
            )
    missing = sorted(c.missing)
    if missing and maybe_acked and (c.first_found is None or missing[-1][0] < c.first_found):
        seqs = [seq for _, seq, _, _, _ in missing]
        _, _, _, file0, offset0 = missing[0]
        out.append(
            Finding(
                "msg-missing",
                f"the {len(missing)} oldest messages of the queue (seq ids {seqs[0]} to "
                f"{seqs[-1]}) are in no shared-store file, and the store shows no damage: consumed, their "
                "acks reached the store (which removed them) but not the index before the broker was "
                "killed; the next boot drops them as this prediction does (or a store file holding only "
                "these was lost)",
                str(file0),
                offset0,
                severity="warning",
                details={"entries": len(missing), "first_seq_id": seqs[0], "last_seq_id": seqs[-1], "acked_head": True},
            )
        )
    else:
        for _, seq, mid, file, offset in missing:
            out.append(
                Finding(
                    "msg-missing",
                    f"message {mid.hex()} (seq id {seq}) is in no shared-store file",
                    str(file),
                    offset,
                    details={"msg_id": mid.hex(), "seq_id": seq},
                )
            )
    for _, seq, mid, file, offset in sorted(c.misflagged):
        out.append(
            Finding(
                "persistence-mismatch",
                f"the index marks message {mid.hex()} (seq id {seq}) transient, "
                "but its body is in the persistent shared store, where the broker writes only "
                "persistent messages (and not in the transient one): its persistent flag was flipped; "
                "the next boot drops it as transient",
                str(file),
                offset,
                details={"msg_id": mid.hex(), "seq_id": seq, "index": "transient", "store": "persistent"},
            )
        )
    st = vs.vhost.stores.get("transient")
    if c.transient and st is not None and st.clean_dot.exists():
        # after a clean stop (the store's clean.dot) its files hold every body its clients wrote;
        # after a kill the unflushed ones were never written. The broker drops transient messages
        # at boot whatever: their bodies are evidence only
        (_, first), (_, last) = c.transient_ends
        out.append(
            Finding(
                "msg-missing",
                f"{plural(c.transient, 'transient message')} the index refers to (seq ids "
                f"{first} to {last}) are in no transient-store file: a file of that "
                "store lost, truncated or swapped (the broker drops them at boot anyway)",
                str(st.path),
                severity="info",
                details={"entries": c.transient, "first_seq_id": first, "store": "transient"},
            )
        )
    if tail:
        qs = vs.qs_files.get(c.qs_path) if c.qs_path is not None else None
        where = (
            "the segment file was never created"
            if qs is None
            else "the segment file was created but never written"
            if not qs.size
            else f"the file ends at {qs.size}, where they begin"
            if _tail_start(c) >= qs.size
            else f"the file ends at {qs.size}, inside the first of them: the kill cut the write of it"
        )
        out.append(
            Finding(
                "qs-entry-missing",
                f"{plural(len(tail), 'index entry')} (seq ids {tail[0]} to {tail[-1]}) point past "
                f"what the .qs segment holds ({where}): the store's write buffer was not yet written out when "
                "the broker was killed (the index's was); messages never written, and never confirmed, "
                "that the next boot drops as this prediction does",
                path,
                None if qs is None else min(qs.size, _tail_start(c)),
                severity="warning",
                details={"entries": len(tail), "first_seq_id": tail[0], "last_seq_id": tail[-1], "unwritten": True},
            )
        )
    return out


def _tail_start(c: _Chunk) -> int:
    """Where the first entry that is not there starts."""
    return min(off for _, _, _, off, _ in c.bad_qs)


def _unwritten_tail(vs: VhostScan, c: _Chunk) -> bool:
    """Whether the chunk's ``.qs`` entries that are not there are a write not yet flushed when a
    dirty-stopped broker died, not damage. QS2 keeps each new entry in a write buffer (offsets
    given out in seq id order, ``get_write_offset``) and writes it, in one pwrite per run of
    entries and segments in ascending order (``flush_buffer``), when the buffer fills or the
    queue syncs; the index (IDX2) flushes its own buffer on its own schedule, so a kill -9 can
    leave index entries whose bytes were never written, at the end of the newest segment (or a
    newest segment file never created, or created empty: ``flush_buffer`` opens it, then writes
    its header, then the entries, and a kill between the open and the first write leaves 0
    bytes, which the next boot's check reads as a bad header and drops every entry of). It is
    that, and not a truncated or deleted file, when the recovery is dirty, every such entry
    starts at or after the end of the file (or the one the end cuts was cut by the kill:
    ``_cut_by_the_kill``), no other entry of the chunk fails its check, and no later segment of
    the queue has a ``.qs``."""
    if vs.recovery != "dirty" or c.segment is None:
        return False
    qs = vs.qs_files.get(c.qs_path) if c.qs_path is not None else None
    empty = qs is not None and qs.size == 0
    gone = [off for _, status, _, off, _ in c.bad_qs if status in _GONE or empty and status == QsStatus.BAD_HEADER]
    if not gone or len(gone) < len(c.bad_qs):
        return False
    if any(seg > c.segment for seg in c.qdir.qs):
        return False
    return qs is None or all(off >= qs.size for off in gone) or _cut_by_the_kill(c, qs)


def _cut_by_the_kill(c: _Chunk, qs) -> bool:
    """Whether the one entry the end of the ``.qs`` file cuts was cut by the kill, in the middle
    of the write of it (``readers.qs.cut_between_write_pieces``: the file ends where such a
    write stops), every later entry past it. The next boot reads the cut entry short and drops
    it (``check_msg_on_disk``), as the prediction does. Seen on real brokers killed while they
    requeued 20,000 messages under a running publisher: 4.3.6 in CI, the first entry reported
    past the end at 4,902,719, 193 bytes before a page boundary; 4.0.5, the file ending 89 bytes
    into an entry, right before its 1,500-byte body."""
    cut = [(off, n) for _, _, _, off, n in c.bad_qs if off < qs.size]
    return len(cut) == 1 and r_qs.cut_between_write_pieces(qs.path, *cut[0], qs.size)
