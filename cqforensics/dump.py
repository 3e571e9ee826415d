"""Per-entry listing of one file, like Kafka's DumpLogSegments: offset, size, id, status.

Works on a lone file (no node dir needed). ``deep`` decodes the stored messages. The file kind
comes from the extension, checked against the magic where the format has one.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from cqforensics import fastpath
from cqforensics.errors import UsageError
from cqforensics.grammar import qi as c_qi
from cqforensics.grammar import qs as c_qs
from cqforensics.readers import qi as r_qi
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers import terms as r_terms
from cqforensics.readers import v1 as r_v1
from cqforensics.readers.files import read_bytes

KINDS = {".rdq": "rdq", ".qi": "qi", ".qs": "qs", ".idx": "idx", ".jif": "jif", ".ets": "ets", ".dets": "dets",
         ".DCD": "disk_log", ".DCL": "disk_log", ".LOG": "disk_log"}


def kind_of(path: Path) -> str:
    kind = KINDS.get(path.suffix)
    if kind is None:
        raise UsageError(f"{path}: cannot dump this kind of file (known: {', '.join(sorted(KINDS))})")
    return kind


def _message(raw) -> dict:
    try:
        m = fastpath.decode(raw)
    except Exception as e:
        return {"decode_error": f"{type(e).__name__}: {e}"[:200]}
    body = m["body"]
    return {"term_format": m["term_format"], "exchange": m["exchange"], "routing_keys": m["routing_keys"],
            "message_id": m["properties"].get("message_id"), "headers": m["headers"], "body_size": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(), "body_preview": body[:64]}


def dump(path: Path | str, deep: bool = False, segment_entry_count: int = 16384) -> Iterator[dict]:
    """One dict per entry (and per hole), in file order."""
    path = Path(path)
    kind = kind_of(path)
    if kind == "rdq":
        yield from _rdq(path, deep)
    elif kind == "qi":
        yield from _qi(path, deep)
    elif kind == "qs":
        yield from _qs(path, deep)
    elif kind in ("idx", "jif"):
        yield from _v1(path, kind, deep, segment_entry_count)
    elif kind == "dets":
        for obj in r_terms.read_dets_objects(path):
            yield {"kind": "object", "term": repr(obj)}
    else:
        log = r_terms.read_disk_log(path)
        yield {"kind": "header", "closed_properly": log.closed}
        for off, item in zip(log.offsets, log.items):
            yield {"offset": off, "kind": "item", "term": repr(item)}
        if log.error:
            yield {"offset": log.error.offset, "kind": "error", "status": log.error.message}


def _rdq(path: Path, deep: bool) -> Iterator[dict]:
    data = read_bytes(path)
    f = r_rdq.walk(path, 0, data)
    rows = [(o, {"offset": o, "kind": "entry", "size": t, "msg_id": i.hex(), "status": "ok"})
            for o, t, i in zip(f.offsets.tolist(), f.totals.tolist(), (m.tobytes() for m in f.msg_ids))]
    rows += [(o, {"offset": o, "kind": "entry", "size": t, "msg_id": i.hex(), "status": "no write marker"})
             for o, t, i in f.bad_markers]
    rows += [(h.offset, {"offset": h.offset, "kind": "hole", "size": h.length, "status": h.kind}) for h in f.holes]
    seen: set = set()
    for _, row in sorted(rows, key=lambda r: (r[0], r[1]["kind"] != "hole")):
        if row["kind"] == "entry" and row["status"] == "ok":
            if row["msg_id"] in seen:
                row["status"] = "duplicate id in this file"
            seen.add(row["msg_id"])
            if deep:
                row.update(_message(data[row["offset"] + 24:row["offset"] + row["size"] - 1]))
        yield row


def _qi(path: Path, deep: bool) -> Iterator[dict]:
    try:
        number = int(path.stem)
    except ValueError:
        number = 0
    seg = r_qi.read_qi(path, number)
    yield {"offset": 0, "kind": "header", "status": "ok" if seg.header_ok else "bad header",
           "from_seq_id": seg.from_seq_id, "to_seq_id": seg.to_seq_id}
    qs = path.with_suffix(".qs")
    qs_data = read_bytes(qs) if deep and qs.exists() else None
    names = {r_qi.LIVE: "publish", r_qi.GHOST: "ghost (dropped by recovery)", r_qi.BAD: "bad"}
    for i in np.flatnonzero(seg.klass != r_qi.EMPTY):
        s = seg.slots[i]
        off = c_qi.HEADER_SIZE + c_qi.ENTRY_SIZE * int(i)
        loc = int(s["loc_kind"])
        row = {"offset": off, "kind": names[int(seg.klass[i])], "seq_id": seg.from_seq_id + int(i),
               "persistent": bool(s["flags"] & 1), "size": int(s["size"]),
               "location": {0: "memory", 1: "shared_store", 2: "queue_store"}.get(loc, f"invalid ({loc})"),
               "expiry_us": int(s["expiry"]) or None, "status": seg.bad_reason.get(int(i), "ok")}
        if loc == 1:
            row["msg_id"] = s["msg_id"].tobytes().hex()
        elif loc == 2:
            row["qs_offset"], row["qs_size"] = int(s["qs_offset"]), int(s["qs_size"])
            if qs_data is not None:
                start = row["qs_offset"] + c_qs.ENTRY_HEADER_SIZE
                row.update(_message(qs_data[start:start + row["qs_size"]]))
        yield row
    for f in seg.findings:
        yield {"offset": f.offset, "kind": "problem", "status": f"{f.code}: {f.message}"}


_NONZERO = re.compile(rb"[^\x00]")


def _qs(path: Path, deep: bool) -> Iterator[dict]:
    """Without the .qi, entries are found heuristically: an entry header whose term starts
    with 131 and whose CRC checks; zero runs are skipped (QS2 leaves zero-filled gaps for
    messages acked while buffered; rabbitmq-formats.md 3.2)."""
    data = read_bytes(path)
    ok = data[:4] == c_qs.MAGIC and len(data) >= 64 and data[4] == c_qs.VERSION
    yield {"offset": 0, "kind": "header", "status": "ok" if ok else "bad header"}
    o, gap = c_qs.HEADER_SIZE, None
    while o < len(data):
        if o + 9 <= len(data):
            size, flags, crc, reserved = c_qs.ENTRY_HEADER.unpack_from(data, o)
            term = data[o + 8:o + 8 + size]
            if 0 < size <= len(data) - o - 8 and flags in (0, 1) and reserved == 0 and term[:1] == b"\x83" \
                    and (not flags or zlib.crc32(term) & 0xFFFF == crc):
                if gap is not None:
                    yield _gap(data, gap, o)
                    gap = None
                row = {"offset": o, "kind": "entry", "size": size, "crc": "ok" if flags else "none", "status": "ok"}
                if deep:
                    row.update(_message(term))
                yield row
                o += 8 + size
                continue
        gap = o if gap is None else gap
        if data[o] == 0:
            m = _NONZERO.search(data, o)
            o = m.start() if m else len(data)
        else:
            o += 1
    if gap is not None:
        yield _gap(data, gap, len(data))


def _gap(data: bytes, start: int, end: int) -> dict:
    return {"offset": start, "kind": "gap", "size": end - start,
            "status": "zeroed" if not any(data[start:end]) else "unparsed bytes"}


def _v1(path: Path, kind: str, deep: bool, count: int) -> Iterator[dict]:
    data = read_bytes(path)
    out = r_v1.V1Index()
    if kind == "idx":
        r_v1.parse_segment(path, int(path.stem) if path.stem.isdigit() else 0, count, data, out)
    else:
        r_v1.parse_journal(path, count, data, out)
    for r in out.records:
        row = {"offset": r.offset, "kind": r.kind, "seq_id": r.seq_id}
        if r.kind == "publish":
            row.update(persistent=r.persistent, msg_id=r.msg_id.hex(), size=r.size, expiry_us=r.expiry or None,
                       embedded_size=r.embedded_size)
            if deep and r.embedded_size:
                row.update(_message(data[r.embedded_offset:r.embedded_offset + r.embedded_size]))
        yield row
    for f in out.findings:
        yield {"offset": f.offset, "kind": "problem", "status": f"{f.code}: {f.message}"}


__all__ = ["dump", "kind_of", "KINDS"]
