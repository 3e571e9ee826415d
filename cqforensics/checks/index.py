"""Checks of one index chunk: the readers' findings on it, and its entries whose body is not
where the index says (per-queue store checks as QS2 check_msg_on_disk; shared-store lookups)."""

from __future__ import annotations

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
    return [f.scoped(queue=qx.qdir.name, priority=qx.qdir.priority) for f in out]
