"""CQv2 ``.qi`` segments, decoded vectorised with the numpy twin of ``grammar.qi.entry``.

Slot classes (IDX2 recover_segment clauses, 3.10 -> 4.3):

* ``live``: status 1 (a transient one with odd flag bits still matches the transient clause;
  a persistent one with a malformed location matches the catch-all clause and is dropped:
  ``malformed`` marks those);
* ``bad``: a status other than 0/1, or a persistent slot with reserved bits set: no clause
  matches, the queue crashes at recovery;
* ``ghost``: status 0 with other bytes left: an entry dirty recovery dropped (it only zeroes
  the status byte);
* ``empty``: all 32 bytes zero (never written, or acked: write_ack zeroes the slot).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from construct import ConstructError

from cqforensics import compiled as core
from cqforensics.base.enums import SlotClass
from cqforensics.base.errors import FormatError, plural
from cqforensics.base.findings import Finding
from cqforensics.base.schema import TS, TS_MAX_US, fit_array
from cqforensics.grammar import qi as c_qi
from cqforensics.readers.files import map_file, read_bytes

EMPTY, LIVE, GHOST, BAD = SlotClass.EMPTY, SlotClass.LIVE, SlotClass.GHOST, SlotClass.BAD


@dataclass
class QiSegment:
    path: Path
    number: int  # from the file name
    size: int
    header_ok: bool
    from_seq_id: int
    to_seq_id: int
    slots: np.ndarray  # ENTRY_DTYPE, one per complete slot present in the file
    klass: np.ndarray  # uint8 slot class (EMPTY/LIVE/GHOST/BAD)
    malformed: np.ndarray  # bool: live persistent slot whose location the broker rejects (dropped)
    bad_reason: dict[int, str] = field(default_factory=dict)  # slot -> why the strict parser fails
    tail_bytes: int = 0  # bytes of a partial last slot
    findings: list[Finding] = field(default_factory=list)
    expiry: np.ndarray | None = None  # int64 per slot, epoch µs; 0 where none or out of range (a finding)
    records: dict | None = None  # SlotFacts.records

    @property
    def seq_ids(self) -> np.ndarray:
        return self.from_seq_id + np.arange(len(self.slots), dtype=np.int64)

    def offsets(self) -> np.ndarray:
        return c_qi.HEADER_SIZE + c_qi.ENTRY_SIZE * np.arange(len(self.slots), dtype=np.int64)


def strict_parse_error(raw: bytes) -> str | None:
    """Why the broker's strict parser rejects a 32-byte slot (the construct grammar's message)."""
    try:
        c_qi.entry.parse(raw)
    except ConstructError as e:
        return str(e).replace("\n", " ")
    return None


_RAW = np.dtype(f"V{c_qi.ENTRY_SIZE}")
_WORDS = np.dtype("<u8")  # a slot as 4 little-endian words: byte 0 is the low byte of word 0


def take(slots: np.ndarray, rows) -> np.ndarray:
    """``slots[rows]`` through a raw view (numpy takes from a structured array field by field,
    about 15x slower)."""
    return np.ascontiguousarray(slots).view(_RAW)[rows].view(c_qi.ENTRY_DTYPE)


def classify(slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(slot class, malformed-location mask)."""
    status = slots["status"]
    w = np.ascontiguousarray(slots).view(_WORDS).reshape(-1, c_qi.ENTRY_SIZE // 8)
    anything = ((w[:, 0] >> np.uint64(8)) | w[:, 1] | w[:, 2] | w[:, 3]) != 0  # bytes 1..31
    kind = slots["loc_kind"]
    msg_id_zero = ((w[:, 0] >> np.uint64(32)) | w[:, 1] | (w[:, 2] & np.uint64(0xFFFFFFFF))) == 0  # bytes 4..19
    persistent = (slots["flags"] & 1) == 1
    reserved = ((slots["flags"] & 0xFE) != 0) | (slots["reserved"] != 0)
    malformed = (
        (status == 1)
        & persistent
        & ~reserved
        & ((kind > 2) | ((kind == 0) & ~msg_id_zero) | ((kind == 2) & (slots["loc_pad"] != 0)))
    )
    out = np.full(len(slots), EMPTY, np.uint8)
    out[(status == 0) & anything] = GHOST
    out[status == 1] = LIVE
    out[(status == 1) & persistent & reserved] = BAD
    out[status > 1] = BAD
    return out, malformed


def odd_transient(slots: np.ndarray) -> np.ndarray:
    """Live transient slots holding bytes IDX2 build_entry never writes: reserved flag bits or
    byte set, a location kind past 2, a memory location with an id, a ``.qs`` location whose
    padding is not zeros. A dirty start drops a transient entry reading only its status and flag
    (recover_segment: ``<<1:8, _:7, 0:1, _/bits>>``), so they change nothing at boot; they are
    a flipped byte of the file all the same (persistent slots with these are ``BAD`` or
    malformed: ``classify``)."""
    if not len(slots):
        return np.zeros(0, np.int64)
    w = np.ascontiguousarray(slots).view(_WORDS).reshape(-1, c_qi.ENTRY_SIZE // 8)
    msg_id_zero = ((w[:, 0] >> np.uint64(32)) | w[:, 1] | (w[:, 2] & np.uint64(0xFFFFFFFF))) == 0
    kind = slots["loc_kind"]
    odd = (
        ((slots["flags"] & 0xFE) != 0)
        | (slots["reserved"] != 0)
        | (kind > 2)
        | ((kind == 0) & ~msg_id_zero)
        | ((kind == 2) & (slots["loc_pad"] != 0))
    )
    return np.flatnonzero((slots["status"] == 1) & ((slots["flags"] & 1) == 0) & odd)


@dataclass
class SlotFacts:
    """What the reader makes of a segment's slots (slot positions, in slot order)."""

    klass: np.ndarray  # uint8 SlotClass per slot
    malformed: np.ndarray  # bool per slot
    expiry: np.ndarray  # int64 per slot, epoch µs; 0 where none or out of range
    bad_expiry: np.ndarray  # used slots whose expiry does not fit a timestamp (a finding each)
    stray: np.ndarray  # status-0 slots with bytes but no location
    qs_range: np.ndarray  # used .qs slots whose offset is >= 2^63
    rejected: np.ndarray  # bad or malformed slots
    duplicates: list  # duplicate_slots
    records: dict | None = None  # the core's records of the used slots (model.index._v2_chunk)


#: the largest expiry a timestamp column holds (schema.fit_array's bound for a uint64 field)
_EXPIRY_MAX = min(TS_MAX_US, (1 << 63) - 1)


def slot_facts(slots: np.ndarray, reference: bool = False) -> SlotFacts:
    """The slots' classes, expiries and the slots with findings: by the compiled core (with
    the used slots' records) unless ``reference``, else vectorised here."""
    native = None if reference else core.native()
    if native is not None:
        d = native.qi_slots(np.ascontiguousarray(slots).view(np.uint8), _EXPIRY_MAX)
        ints = {k: np.frombuffer(d[k], np.int64) for k in ("expiry", "bad_expiry", "stray", "qs_range", "rejected")}
        return SlotFacts(
            np.frombuffer(d["klass"], np.uint8),
            np.frombuffer(d["malformed"], np.bool_),
            ints["expiry"],
            ints["bad_expiry"],
            ints["stray"],
            ints["qs_range"],
            ints["rejected"],
            d["duplicates"],
            d,
        )
    klass, malformed = classify(slots)
    expiry, bad_expiry = fit_array(slots["expiry"], TS, none=0)
    used = klass != EMPTY
    stray = (klass == GHOST) & (slots["loc_kind"] != 1) & (slots["loc_kind"] != 2)
    qs_range = (slots["qs_offset"] >= 1 << 63) & (slots["loc_kind"] == 2) & used
    return SlotFacts(
        klass,
        malformed,
        expiry,
        np.flatnonzero(bad_expiry & used),
        np.flatnonzero(stray),
        np.flatnonzero(qs_range),
        np.flatnonzero((klass == BAD) | malformed),
        duplicate_slots(slots, klass),
    )


def read_qi(
    path: Path,
    number: int,
    segment_entry_count: int = c_qi.DEFAULT_SEGMENT_ENTRY_COUNT,
    data: bytes | None = None,
    reference: bool = False,
) -> QiSegment:
    """Decode one segment file. Never raises on damaged content. The slots are judged by the
    compiled core when it is built, else (or with ``reference=True``) by ``slot_facts``'s numpy
    reference."""
    data = read_bytes(path) if data is None else data
    findings: list[Finding] = []
    header_ok = len(data) >= c_qi.HEADER_SIZE and data[:4] == c_qi.MAGIC and data[4] == c_qi.VERSION
    from_seq = number * segment_entry_count
    to_seq = from_seq + segment_entry_count
    if header_ok:
        hdr = np.frombuffer(data, c_qi.HEADER_DTYPE, count=1)[0]
        h_from, h_to = int(hdr["from_seq_id"]), int(hdr["to_seq_id"])
        count = h_to - h_from
        # The header is informational for the broker, but it records the segment size the
        # writer used (classic_queue_index_v2_segment_entry_count), which we need.
        if 0 < count <= 1 << 20 and h_from == number * count:
            from_seq, to_seq = h_from, h_to
        elif 0 < count <= 1 << 20 and h_from % count == 0:
            # a valid header of segment h_from / count: the file was swapped with (or renamed from)
            # that segment; the broker goes by the file name, so its slots get this number's seq ids
            from_seq, to_seq = number * count, (number + 1) * count
            findings.append(
                Finding(
                    "segment-misplaced",
                    f"segment {number} holds the header of segment "
                    f"{h_from // count} (seq ids {h_from}..{h_to}): swapped or renamed; the broker "
                    f"reads its entries as seq ids {from_seq}..{to_seq}",
                    str(path),
                    5,
                    details={"from_seq_id": h_from, "to_seq_id": h_to, "holds_segment": h_from // count},
                )
            )
        else:
            findings.append(
                Finding(
                    "qi-bad-header",
                    f"header says seq ids {h_from}..{h_to}, inconsistent with "
                    f"segment number {number}; assuming {segment_entry_count}-entry segments",
                    str(path),
                    5,
                    severity="warning",
                    details={"from_seq_id": h_from, "to_seq_id": h_to},
                )
            )
        reserved = bytes(data[c_qi.RESERVED_AT : c_qi.HEADER_SIZE])
        if any(reserved):  # IDX2 writes <<0:344>> and never reads it: a changed byte, no effect at boot
            at = c_qi.RESERVED_AT + next(i for i, b in enumerate(reserved) if b)
            findings.append(
                Finding(
                    "qi-bad-header",
                    f"the header's reserved bytes are not zeros (byte {at} is "
                    f"{data[at]:#04x}): the broker writes zeros there and never reads them, so a byte "
                    "of this file was flipped or overwritten, with no effect at boot",
                    str(path),
                    at,
                    severity="info",
                )
            )
    else:
        got = data[:5]
        findings.append(
            Finding(
                "qi-bad-header",
                f"bad segment header ({plural(len(data), 'byte')}, starts {got.hex()}): "
                "the broker deletes this segment and its .qs on a dirty start",
                str(path),
                0,
            )
        )
    body_len = max(0, len(data) - c_qi.HEADER_SIZE)  # never sliced: ``data`` may be a map of a huge file
    n = body_len // c_qi.ENTRY_SIZE
    max_slots = to_seq - from_seq
    tail = body_len - n * c_qi.ENTRY_SIZE
    if n > max_slots:
        findings.append(
            Finding(
                "unknown-file",
                f"{plural(body_len - max_slots * c_qi.ENTRY_SIZE, 'byte')} beyond the "
                f"segment's {plural(max_slots, 'slot')}",
                str(path),
                c_qi.HEADER_SIZE + max_slots * c_qi.ENTRY_SIZE,
            )
        )
        n, tail = max_slots, 0
    slots = (
        np.frombuffer(data, _RAW, count=n, offset=c_qi.HEADER_SIZE).copy().view(c_qi.ENTRY_DTYPE)
        if n
        else np.zeros(0, c_qi.ENTRY_DTYPE)
    )
    facts = slot_facts(slots, reference)
    seg = QiSegment(
        path,
        number,
        len(data),
        header_ok,
        from_seq,
        to_seq,
        slots,
        facts.klass,
        facts.malformed,
        tail_bytes=tail,
        findings=findings,
        expiry=facts.expiry,
        records=facts.records,
    )
    for i in facts.bad_expiry.tolist():
        findings.append(
            Finding.out_of_range("expiry", int(slots["expiry"][i]), path, c_qi.HEADER_SIZE + c_qi.ENTRY_SIZE * i)
        )
    # an acked slot is zeroed whole; one a dirty recovery dropped keeps its location (1 or 2): a
    # status-0 slot with bytes but no location is neither (never seen in a broker's files)
    for i in facts.stray.tolist():
        findings.append(
            Finding(
                "qi-bad-entry",
                f"slot {i} is empty (status 0) but holds stray bytes and no "
                "location: neither an acked slot (all zeros) nor one a recovery dropped; a flipped "
                "or overwritten byte (the broker reads it as acked)",
                str(path),
                c_qi.HEADER_SIZE + c_qi.ENTRY_SIZE * i,
                severity="warning",
                details={"seq_id": from_seq + i},
            )
        )
    for i in odd_transient(slots).tolist():
        findings.append(
            Finding(
                "qi-bad-entry",
                f"transient slot {i} holds bytes the broker never writes there (reserved "
                "bits, a location kind or padding): a flipped byte; the next boot drops the entry as "
                "transient without reading them",
                str(path),
                c_qi.HEADER_SIZE + c_qi.ENTRY_SIZE * i,
                severity="info",
                details={"seq_id": from_seq + i},
            )
        )
    for i in facts.qs_range.tolist():
        findings.append(
            Finding.out_of_range("qs_offset", int(slots["qs_offset"][i]), path, c_qi.HEADER_SIZE + c_qi.ENTRY_SIZE * i)
        )
    klass = facts.klass
    for i in facts.rejected.tolist():
        off = c_qi.HEADER_SIZE + c_qi.ENTRY_SIZE * int(i)
        why = strict_parse_error(data[off : off + c_qi.ENTRY_SIZE]) or f"status byte {int(slots['status'][i])}"
        seg.bad_reason[int(i)] = why
        crash = klass[i] == BAD
        findings.append(
            Finding(
                "qi-bad-entry",
                f"slot {int(i)} (seq id {from_seq + int(i)}): {why}" + ("" if crash else "; recovery drops it"),
                str(path),
                off,
                severity="error" if crash else "warning",
                details={
                    "seq_id": from_seq + int(i),
                    "status": int(slots["status"][i]),
                    "flags": int(slots["flags"][i]),
                    "crashes_queue": bool(crash),
                },
                crashes_queue=bool(crash),
            )
        )
    findings += duplicate_findings(seg, path, facts.duplicates)
    if tail:
        off = c_qi.HEADER_SIZE + n * c_qi.ENTRY_SIZE
        status = data[off]
        # file:read returns the short slot: only <<0, _>> and a transient <<1, _:7, 0:1, _>> match a clause
        crash = status > 1 or (status == 1 and (tail < 2 or data[off + 1] & 1))
        findings.append(
            Finding(
                "qi-bad-entry" if status else "unknown-file",
                f"segment ends inside slot {n} ({tail} of 32 bytes, status byte {status})",
                str(path),
                off,
                severity="error" if crash else "info",
                details={"seq_id": from_seq + n, "tail_bytes": tail, "status": status, "crashes_queue": bool(crash)},
                crashes_queue=bool(crash),
            )
        )
    return seg


def duplicate_slots(slots: np.ndarray, klass: np.ndarray) -> list[tuple[int, int, int]]:
    """``(slot, first slot, location kind)`` of every used slot of a segment that names the same
    shared-store message id (kind 1) or the same ``.qs`` entry (kind 2) as an earlier one: the
    message id copies first, then the ``.qs`` ones, each in slot order."""
    out: list[tuple[int, int, int]] = []
    used = np.flatnonzero(klass != EMPTY)
    if len(used) < 2:
        return out
    s = take(slots, used)
    for loc, key in ((1, s["msg_id"]), (2, s["qs_offset"])):
        sel = np.flatnonzero(s["loc_kind"] == loc)
        if len(sel) < 2:
            continue
        keys = key[sel]
        # distinct first 8 bytes mean distinct keys: the usual case, without sorting 16-byte keys
        prefix = np.sort(keys.view(np.uint64)[::2] if loc == 1 else keys)
        if not (prefix[1:] == prefix[:-1]).any():
            continue
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        for k in np.flatnonzero(first[inverse.ravel()] != np.arange(len(sel))).tolist():
            out.append((int(used[sel[k]]), int(used[sel[first[inverse.ravel()[k]]]]), loc))
    return out


def duplicate_findings(seg: QiSegment, path: Path, duplicates) -> list[Finding]:
    """``index-duplicate-entry``: used slots of one segment that name the same shared-store
    message id or the same ``.qs`` entry (a slot copied over another: each publish has its own
    message id and its own ``.qs`` entry). Reported at every later copy, naming the first."""
    out = []
    for i, j, loc in duplicates:
        slot = seg.slots[i]
        what, value = (
            ("message id", slot["msg_id"].tobytes().hex()) if loc == 1 else (".qs entry", int(slot["qs_offset"]))
        )
        out.append(
            Finding(
                "index-duplicate-entry",
                f"slot {i} (seq id {seg.from_seq_id + i}) holds the same "
                f"{what} as slot {j} (seq id {seg.from_seq_id + j}): a copy of it",
                str(path),
                c_qi.HEADER_SIZE + c_qi.ENTRY_SIZE * i,
                details={
                    "seq_id": seg.from_seq_id + i,
                    "copy_of_seq_id": seg.from_seq_id + j,
                    "copy_of_offset": c_qi.HEADER_SIZE + c_qi.ENTRY_SIZE * j,
                    "msg_id" if loc == 1 else "qs_offset": value,
                },
            )
        )
    return out


_LOCATIONS = {0: "memory", 1: "shared_store", 2: "queue_store"}
_CLASS_NAMES = {LIVE: "publish", GHOST: "ghost (dropped by recovery)", BAD: "bad"}


def dump_rows(path: Path, segment_entry_count: int | None = None):
    """The per-slot listing of one segment (``dump``) as ``(row, term)`` pairs; a message kept
    in the queue store is located in the sibling ``.qs`` (``term`` = (qs path, start, length))."""
    from cqforensics.readers import qs as r_qs

    try:
        number = int(path.stem)
    except ValueError:
        number = 0
    seg = read_qi(path, number, data=map_file(path))  # mapped: never the whole file in memory
    yield (
        {
            "offset": 0,
            "kind": "header",
            "status": "ok" if seg.header_ok else "bad header",
            "from_seq_id": seg.from_seq_id,
            "to_seq_id": seg.to_seq_id,
        },
        None,
    )
    qs = path.with_suffix(".qs")
    qs_data = None  # the sibling .qs, mapped when a slot first points into it
    qs_exists = qs.exists()
    offsets = seg.offsets()
    for i in np.flatnonzero(seg.klass != EMPTY):
        s = seg.slots[i]
        loc = int(s["loc_kind"])
        row = {
            "offset": int(offsets[i]),
            "kind": _CLASS_NAMES[int(seg.klass[i])],
            "seq_id": seg.from_seq_id + int(i),
            "persistent": bool(s["flags"] & 1),
            "size": int(s["size"]),
            "location": _LOCATIONS.get(loc, f"invalid ({loc})"),
            "expiry_us": int(s["expiry"]) or None,
            "status": seg.bad_reason.get(int(i), "ok"),
        }
        term = None
        if loc == 1:
            row["msg_id"] = s["msg_id"].tobytes().hex()
        elif loc == 2:
            row["qs_offset"], row["qs_size"] = int(s["qs_offset"]), int(s["qs_size"])
            if qs_exists and qs_data is None:
                try:
                    qs_data = map_file(qs)
                except FormatError:  # not a regular file: never read
                    qs_exists = False
            if qs_exists:
                term = (qs_data, *r_qs.term_span(row["qs_offset"], row["qs_size"]))
        yield row, term
    for f in seg.findings:
        yield {"offset": f.offset, "kind": "problem", "status": f"{f.code}: {f.message}"}, None
