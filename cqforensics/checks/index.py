"""Checks of one index chunk: the readers' findings on it, and its entries whose body is not
where the index says (per-queue store checks as QS2 check_msg_on_disk; shared-store lookups)."""

from __future__ import annotations

import numpy as np

from cqforensics.codes import Location, QsStatus
from cqforensics.findings import Finding
from cqforensics.model.index import IndexChunk
from cqforensics.model.vhost import VhostScan
from cqforensics.readers import qs as r_qs


def chunk_findings(vs: VhostScan, qx: IndexChunk) -> list[Finding]:
    """A chunk's reader findings, plus its entries whose body is not where the index says,
    each placed in the chunk's queue and priority level."""
    out = list(qx.findings)
    r = qx.rec
    res = vs.resolve(qx)
    path = str(qx.qs_path or qx.qdir.path / f"{qx.segment}.qs")
    reported = False
    unwritten = _unwritten_tail(vs, qx, res)
    tail: list[int] = []  # seq ids of entries in the unwritten tail (one finding for them all)
    transient: list[int] = []  # seq ids of transient shared-store entries whose body is in no file
    missing: list[tuple[int, int]] = []  # (live position, record) of persistent messages in no store file
    for j, i in enumerate(qx.live.tolist()):
        status, seq = QsStatus(res.qs_status[j]), int(r.seq[i])
        if status not in (QsStatus.NONE, QsStatus.OK):
            off, size = int(r.store_offset[i]), int(r.store_size[i])
            if status in (QsStatus.MISSING_FILE, QsStatus.OUT_OF_RANGE) and unwritten:
                tail.append(seq)
            elif status in (QsStatus.MISSING_FILE, QsStatus.BAD_HEADER):
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
            missing.append((j, i))
        elif r.loc[i] == Location.SHARED_STORE and r.persistent[i] == 0 and res.body_file[j] < 0:
            transient.append(seq)
    if missing and _acked_head(vs, qx, [j for j, _ in missing]):
        seqs = [int(r.seq[i]) for _, i in missing]
        i0 = missing[0][1]
        out.append(Finding("msg-missing", f"the {len(missing)} oldest messages of the queue (seq ids {seqs[0]} to "
                           f"{seqs[-1]}) are in no shared-store file, and the store shows no damage: consumed, their "
                           "acks reached the store (which removed them) but not the index before the broker was "
                           "killed; the next boot drops them as this prediction does (or a store file holding only "
                           "these was lost)", str(qx.files[int(r.file[i0])]), int(r.offset[i0]), severity="warning",
                           details={"entries": len(missing), "first_seq_id": seqs[0], "last_seq_id": seqs[-1],
                                    "acked_head": True}))
    else:
        for _, i in missing:
            mid, seq = r.msg_id[i].tobytes().hex(), int(r.seq[i])
            out.append(Finding("msg-missing", f"message {mid} (seq id {seq}) is in no shared-store file",
                               str(qx.files[int(r.file[i])]), int(r.offset[i]),
                               details={"msg_id": mid, "seq_id": seq}))
    st = vs.vhost.stores.get("transient")
    if transient and st is not None and st.clean_dot.exists():
        # after a clean stop (the store's clean.dot) its files hold every body its clients wrote;
        # after a kill the unflushed ones were never written. The broker drops transient messages
        # at boot whatever: their bodies are evidence only
        out.append(Finding("msg-missing", f"{len(transient)} transient messages the index refers to (seq ids "
                           f"{transient[0]} to {transient[-1]}) are in no transient-store file: a file of that "
                           "store lost, truncated or swapped (the broker drops them at boot anyway)",
                           str(st.path), severity="info",
                           details={"entries": len(transient), "first_seq_id": transient[0], "store": "transient"}))
    if tail:
        qs = vs.qs_files.get(qx.qs_path) if qx.qs_path is not None else None
        where = "the segment file was never created" if qs is None else f"the file ends at {qs.size}, where they begin"
        out.append(Finding("qs-entry-missing", f"{len(tail)} index entries (seq ids {tail[0]} to {tail[-1]}) point past "
                           f"what the .qs segment holds ({where}): the store's write buffer was not flushed yet when "
                           "the broker was killed (the index's was); messages never written, and never confirmed, "
                           "that the next boot drops as this prediction does", path,
                           None if qs is None else qs.size, severity="warning",
                           details={"entries": len(tail), "first_seq_id": tail[0], "last_seq_id": tail[-1],
                                    "unwritten": True}))
    return [f.scoped(queue=qx.qdir.name, priority=qx.qdir.priority) for f in out]


def _acked_head(vs: VhostScan, qx: IndexChunk, missing: list[int]) -> bool:
    """Whether persistent messages in no shared-store file (positions in ``qx.live``) are the
    queue's oldest, consumed and acked just before a kill, not lost to damage. A queue hands its
    acks to the store (which removes a message no queue holds any more, and whose GC may then
    drop its bytes at once: seen on 3.10.8, combining files) and writes them to its index on its
    own schedule, so a kill -9 can leave index entries for messages the store no longer has. It
    is that when the recovery is dirty, the missing messages are the first live entries of the
    queue's first index chunk (a consumer acks in order), and no store file shows damage (no
    garbage, no torn entry) that could have taken them."""
    r = qx.rec
    live = qx.live
    stored = np.flatnonzero((r.loc[live] == Location.SHARED_STORE) & (r.persistent[live] == 1))
    if vs.recovery != "dirty" or missing != stored[:len(missing)].tolist():
        return False
    if qx.segment is not None and any(seg < qx.segment for seg, _ in qx.qdir.qi):
        return False
    st = vs.stores.get("persistent")
    return st is not None and not st.bad and not any(
        h.kind in ("garbage", "truncated_tail") for f in st.files for h in f.holes)


def _unwritten_tail(vs: VhostScan, qx: IndexChunk, res) -> bool:
    """Whether the chunk's ``.qs`` entries that are not there are a write not yet flushed when a
    dirty-stopped broker died, not damage. QS2 keeps each new entry in a write buffer (offsets
    given out in seq id order, ``get_write_offset``) and writes it, in one pwrite per run of
    entries and segments in ascending order (``flush_buffer``), when the buffer fills or the
    queue syncs; the index (IDX2) flushes its own buffer on its own schedule, so a kill -9 can
    leave index entries whose bytes were never written, at the end of the newest segment (or a
    newest segment file never created). It is that, and not a truncated or deleted file, when
    the recovery is dirty, every such entry starts at or after the end of the file (none is cut
    by it), and no later segment of the queue has a ``.qs``."""
    if vs.recovery != "dirty" or qx.segment is None:
        return False
    status = res.qs_status
    gone = (status == QsStatus.MISSING_FILE) | (status == QsStatus.OUT_OF_RANGE)
    if not gone.any() or ((status != QsStatus.OK) & (status != QsStatus.NONE) & ~gone).any():
        return False
    if any(seg > qx.segment for seg in qx.qdir.qs):
        return False
    qs = vs.qs_files.get(qx.qs_path) if qx.qs_path is not None else None
    if qs is None:
        return True
    offsets = res.store_offset[gone]
    return bool((offsets >= qs.size).all())
