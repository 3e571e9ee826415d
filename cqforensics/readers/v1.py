"""CQv1 queue index: ``<N>.idx`` segments and ``journal.jif``, merged per SeqId.

Records are decoded with the struct twins of ``grammar.idx`` / ``grammar.jif``. The merge
follows QI1 (rabbit_queue_index.erl, 3.10): the journal is applied on top of the segments, a
RelSeq goes ``published -> delivered -> acked (gone)``, and duplicates already in a segment
are ignored. Combinations the broker has no clause for (an ack without a publish, a record
after the ack, a truncated publish that leaves the segment misaligned) are findings marked
``crashes_queue``: they crash the queue's recovery (and so hang the boot) on versions that read v1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from cqforensics.base.errors import plural
from cqforensics.base.findings import Finding
from cqforensics.base.schema import TS, fits
from cqforensics.grammar import idx as c_idx
from cqforensics.grammar import jif as c_jif
from cqforensics.readers.files import map_file, read_bytes

_NONZERO = re.compile(rb"[^\x00]")
_ALL_ZERO_CHECK = 256 << 20  # a CQv1 segment is at most ~70 MB (16384 publishes of 4 kB)

_HEAD = c_idx.HEAD.unpack_from
_PUB = c_idx.PUB.unpack_from
_JHEAD = c_jif.HEAD.unpack_from
_JPUB = c_jif.PUB.unpack_from
_ZERO_JPUB = bytes(c_jif.PUB_HEAD_SIZE)


@dataclass
class Record:
    """One record as found in a file (the ``index`` table row)."""

    path: Path
    offset: int
    kind: str  # publish | deliver | ack
    seq_id: int
    persistent: bool | None = None
    msg_id: bytes | None = None
    expiry: int = 0
    size: int = 0
    embedded_offset: int = 0  # file offset of the embedded term (0: none)
    embedded_size: int = 0


@dataclass
class Entry:
    """The merged state of one SeqId."""

    seq_id: int
    pub: Record | None = None
    delivered: bool = False
    acked: bool = False
    ack_record: Record | None = None


@dataclass
class V1Index:
    records: list[Record] = field(default_factory=list)
    entries: dict[int, Entry] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)  # crashes_queue: boot-crash causes (3.10-4.2)

    def live(self) -> list[Entry]:
        """Published and not acked, in SeqId order."""
        return [e for _, e in sorted(self.entries.items()) if e.pub is not None and not e.acked]


def parse_segment(path: Path, number: int, count: int, data: bytes, out: V1Index) -> dict[int, list]:
    """Records of one segment; returns RelSeq -> [pub Record, delivered, acked] as
    load_segment(KeepAcked = true) sees them."""
    state: dict[int, list] = {}
    base = number * count
    end = len(data)
    if end and not data[0] and (end > _ALL_ZERO_CHECK or _NONZERO.search(data) is None):
        # (a huge file starting with NUL bytes is no segment either: not scanned for a non-zero byte)
        what = (
            "starts with NUL bytes (not scanned further: too large)"
            if end > _ALL_ZERO_CHECK
            else "holds only NUL bytes"
        )
        out.findings.append(Finding("unknown-file", f"segment {what}: the broker deletes it", str(path), 0))
        return state
    o = 0
    while o < end:
        if o + 2 > end:
            _crash(out, "v1-segment-truncated", path, o, "segment ends inside a record (1 byte left)")
            break
        (head,) = _HEAD(data, o)
        rel = head & 0x3FFF
        if rel >= count and head & 0xC000:
            # QI1 segment_new: a fixed array of segment_entry_count entries; array:set past it
            # fails (badarg), so the queue's recovery crashes on this record
            out.findings.append(
                Finding(
                    "v1-segment-truncated",
                    f"record for RelSeq {rel}, past the vhost's segment "
                    f"entry count {count} (its .config): the broker's segment array has {count} "
                    "entries, so loading this segment crashes the queue",
                    str(path),
                    o,
                    details={"seq_id": base + rel, "rel_seq": rel, "segment_entry_count": count},
                    crashes_queue=True,
                )
            )
        if head & 0x8000:  # publish
            if o + c_idx.PUB_HEAD_SIZE > end:
                _crash(out, "v1-segment-truncated", path, o, "segment ends inside a publish record")
                break
            _, msg_id, expiry, size, emb = _PUB(data, o)
            if o + c_idx.PUB_HEAD_SIZE + emb > end:
                _crash(
                    out,
                    "v1-segment-truncated",
                    path,
                    o,
                    f"segment ends inside the {emb}-byte message embedded in a publish record",
                )
                break
            rec = Record(
                path,
                o,
                "publish",
                base + rel,
                bool(head & 0x4000),
                msg_id,
                expiry,
                size,
                o + c_idx.PUB_HEAD_SIZE if emb else 0,
                emb,
            )
            if not fits(expiry, TS):
                out.findings.append(Finding.out_of_range("expiry", expiry, path, o))
            out.records.append(rec)
            if rel in state:  # QI1 parse_segment_entries: array:set keeps the later one, and counts both
                first = state[rel][0]
                out.findings.append(
                    Finding(
                        "index-duplicate-entry",
                        f"second publish record for RelSeq {rel} "
                        f"(seq id {base + rel}) in this segment (the first at offset "
                        f"{first.offset}): a copied record; the broker keeps this one and "
                        "miscounts the segment's unacked entries",
                        str(path),
                        o,
                        details={
                            "seq_id": base + rel,
                            "copy_of_offset": first.offset,
                            "same_message": first.msg_id == msg_id,
                        },
                    )
                )
            state[rel] = [rec, False, False]
            o += c_idx.PUB_HEAD_SIZE + emb
        elif head & 0x4000:  # deliver or ack
            st = state.get(rel)
            if st is None or st[2]:
                kind = "ack"
                _crash(
                    out,
                    "v1-orphan-ack",
                    path,
                    o,
                    f"deliver/ack record for RelSeq {rel} (seq id {base + rel}) with no live publish before it",
                    base + rel,
                )
            else:
                kind = "ack" if st[1] else "deliver"
                st[2 if st[1] else 1] = True
            out.records.append(Record(path, o, kind, base + rel))
            o += 2
        else:
            _crash(out, "v1-segment-truncated", path, o, f"invalid record prefix 00 (bytes {data[o : o + 2].hex()})")
            break
    return state


def parse_journal(path: Path, count: int, data: bytes, out: V1Index) -> dict[int, list]:
    """Journal records; returns SeqId -> [pub Record|None, delivered, acked] after the
    broker's add_to_journal rules (an entry published, delivered and acked in the journal
    is forgotten, as 'reset' does)."""
    state: dict[int, list] = {}
    end = len(data)
    o = 0
    while o < end:
        if o + 8 > end:
            out.findings.append(
                Finding("v1-journal-torn", f"journal ends inside a record ({plural(end - o, 'byte')})", str(path), o)
            )
            break
        (word,) = _JHEAD(data, o)
        prefix, seq = word >> 62, word & ((1 << 62) - 1)
        if prefix >= c_jif.DELIVER:
            kind = "deliver" if prefix == c_jif.DELIVER else "ack"
            out.records.append(Record(path, o, kind, seq))
            _journal_action(state, seq, kind, path, o, out)
            o += 8
            continue
        if data[o : o + c_jif.PUB_HEAD_SIZE] == _ZERO_JPUB:
            break  # preallocated/zeroed tail: the broker stops reading here too
        if o + c_jif.PUB_HEAD_SIZE > end:
            out.findings.append(Finding("v1-journal-torn", "journal ends inside a publish record", str(path), o))
            break
        _, msg_id, expiry, size, emb = _JPUB(data, o)
        if o + c_jif.PUB_HEAD_SIZE + emb > end:
            out.findings.append(
                Finding("v1-journal-torn", f"journal ends inside a {emb}-byte embedded message", str(path), o)
            )
            break
        rec = Record(
            path,
            o,
            "publish",
            seq,
            prefix == c_jif.PUB_PERSISTENT,
            msg_id,
            expiry,
            size,
            o + c_jif.PUB_HEAD_SIZE if emb else 0,
            emb,
        )
        if not fits(expiry, TS):
            out.findings.append(Finding.out_of_range("expiry", expiry, path, o))
        out.records.append(rec)
        _journal_action(state, seq, "publish", path, o, out, rec)
        o += c_jif.PUB_HEAD_SIZE + emb
    return state


def _journal_action(state, seq, kind, path, off, out: V1Index, rec: Record | None = None) -> None:
    """QI1 action_to_entry: the only transitions the broker accepts."""
    st = state.get(seq)
    if st is None:
        state[seq] = [rec, kind == "deliver", kind == "ack"]
        return
    pub, dl, ak = st
    if kind == "deliver" and not dl and not ak:
        st[1] = True
    elif kind == "ack" and dl and not ak:
        if pub is not None:
            del state[seq]  # 'reset': published, delivered and acked in the journal: forgotten
        else:
            st[2] = True
    else:
        _crash(
            out,
            "v1-journal-torn",
            path,
            off,
            f"journal {kind} for seq id {seq} after "
            f"{'publish' if pub else ''}{' deliver' if dl else ''}{' ack' if ak else ''}: no such transition",
            seq,
        )


def _crash(out: V1Index, code: str, path: Path, offset: int, message: str, seq_id: int | None = None) -> None:
    out.findings.append(
        Finding(
            code,
            message,
            str(path),
            offset,
            details={"seq_id": seq_id} if seq_id is not None else {},
            crashes_queue=True,
        )
    )


def read_v1_queue(idx_files: list[tuple[int, Path]], journal: Path | None, count: int) -> V1Index:
    """Merge a queue's v1 segments and journal into per-SeqId entries."""
    out = V1Index()
    segments: dict[int, dict[int, list]] = {}
    for number, path in idx_files:
        segments[number] = parse_segment(path, number, count, read_bytes(path), out)
    jstate = parse_journal(journal, count, read_bytes(journal), out) if journal is not None else {}
    for number, seg in segments.items():
        for rel, (pub, dl, ak) in seg.items():
            out.entries[number * count + rel] = Entry(number * count + rel, pub, dl, ak)
    for seq, (pub, dl, ak) in sorted(jstate.items()):
        e = out.entries.get(seq)
        seg = None if e is None else (e.pub, e.delivered, e.acked)
        if not _journal_minus_segment_ok((pub, dl, ak), seg):
            where = pub.offset if pub is not None else 0
            _crash(
                out,
                "v1-journal-torn",
                journal,
                where,
                f"journal state {_describe((pub, dl, ak))} for seq id "
                f"{seq} does not combine with segment state {_describe(seg)}",
                seq,
            )
        if e is None:
            if pub is None:  # ack/deliver for a segment that is gone: the broker forgets them
                continue
            out.entries[seq] = Entry(seq, pub, dl, ak)
            continue
        if pub is not None and e.pub is None:
            e.pub = pub
        e.delivered = e.delivered or dl
        e.acked = e.acked or ak
    return out


def _describe(state) -> str:
    if state is None:
        return "(none)"
    pub, dl, ak = state
    return (
        "{"
        + ", ".join(["pub" if pub is not None else "no_pub", "del" if dl else "no_del", "ack" if ak else "no_ack"])
        + "}"
    )


def _same_pub(a: Record, b: Record) -> bool:
    return (a.persistent, a.msg_id, a.expiry, a.size, a.embedded_size) == (
        b.persistent,
        b.msg_id,
        b.expiry,
        b.size,
        b.embedded_size,
    )


def _journal_minus_segment_ok(j, s) -> bool:
    """Whether QI1 journal_minus_segment1/2 has a clause for (journal, segment) states."""
    jp, jd, ja = j
    if s is None:
        return jp is not None or ja  # a lone deliver without publish has no clause
    sp, sd, sa = s
    if jp is not None:
        if not _same_pub(jp, sp):
            return False
        return (jd, ja) == (sd, sa) or (jd, ja, sd, sa) in {
            (True, False, False, False),
            (True, True, False, False),
            (True, True, True, False),
        }
    return (jd, ja, sd, sa) in {
        (True, False, False, False),
        (True, False, True, False),
        (False, True, True, False),
        (False, True, True, True),
        (True, True, False, False),
        (True, True, True, False),
        (True, True, True, True),
    }


def _dump_rows(path: Path, data: bytes, out: V1Index):
    for r in out.records:
        row = {"offset": r.offset, "kind": r.kind, "seq_id": r.seq_id}
        term = None
        if r.kind == "publish":
            row.update(
                persistent=r.persistent,
                msg_id=r.msg_id.hex(),
                size=r.size,
                expiry_us=r.expiry or None,
                embedded_size=r.embedded_size,
            )
            if r.embedded_size:
                term = (data, r.embedded_offset, r.embedded_size)
        yield row, term
    for f in out.findings:
        yield {"offset": f.offset, "kind": "problem", "status": f"{f.code}: {f.message}"}, None


def dump_segment(path: Path, segment_entry_count: int):
    """The per-record listing of one ``.idx`` segment (``dump``) as ``(row, term)`` pairs; the
    file is mapped, never read whole into memory."""
    data = map_file(path)
    out = V1Index()
    parse_segment(path, int(path.stem) if path.stem.isdigit() else 0, segment_entry_count, data, out)
    yield from _dump_rows(path, data, out)


def dump_journal(path: Path, segment_entry_count: int):
    """The per-record listing of a ``journal.jif`` (``dump``) as ``(row, term)`` pairs (mapped)."""
    data = map_file(path)
    out = V1Index()
    parse_journal(path, segment_entry_count, data, out)
    yield from _dump_rows(path, data, out)
