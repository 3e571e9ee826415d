"""Construct grammars vs their numpy/struct twins, on every record of every sample: the fast
path decodes exactly what the declared grammar does, and the grammar rebuilds the bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from construct import ConstructError

from cqforensics.grammar import disklog as c_disklog
from cqforensics.grammar import idx as c_idx
from cqforensics.grammar import jif as c_jif
from cqforensics.grammar import qi as c_qi
from cqforensics.grammar import qs as c_qs
from cqforensics.grammar import rdq as c_rdq
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers import v1 as r_v1
from support import SAMPLES


def files(pattern: str) -> list[Path]:
    return sorted(SAMPLES.glob(f"*/mnesia/*/msg_stores/vhosts/*/{pattern}"))


def test_sizes():
    assert c_qi.header.sizeof() == c_qi.HEADER_SIZE == c_qi.HEADER_DTYPE.itemsize == 64
    assert c_qi.location.sizeof() == 17
    assert c_qi.ENTRY_DTYPE.itemsize == c_qi.ENTRY_SIZE == 32
    assert c_qs.header.sizeof() == c_qs.HEADER_SIZE == 64
    assert c_qs.entry_header.sizeof() == c_qs.ENTRY_HEADER.size == c_qs.ENTRY_HEADER_SIZE == 8
    assert c_rdq.ENTRY_HEAD.size == c_rdq.ENTRY_HEADER_SIZE == 24
    assert c_idx.PUB.size == c_idx.PUB_HEAD_SIZE == 34
    assert c_jif.PUB.size == c_jif.PUB_HEAD_SIZE == 40


def test_qi_twin_equals_grammar_on_every_slot():
    checked = 0
    for path in files("queues/*/*.qi"):
        data = path.read_bytes()
        hdr = c_qi.header.parse(data[:64])
        twin = np.frombuffer(data, c_qi.HEADER_DTYPE, count=1)[0]
        assert (twin["magic"], twin["version"], twin["from_seq_id"], twin["to_seq_id"]) == (
            hdr.magic,
            hdr.version,
            hdr.from_seq_id,
            hdr.to_seq_id,
        )
        assert c_qi.header.build(hdr) == data[:64]
        n = (len(data) - 64) // 32
        slots = np.frombuffer(data, c_qi.ENTRY_DTYPE, count=n, offset=64)
        for i, s in enumerate(slots):
            raw = data[64 + 32 * i : 96 + 32 * i]
            if s["status"] == 0:
                continue
            e = c_qi.entry.parse(raw)
            assert (e.status, int(e.flags.persistent), e.size, e.expiry, e.location.kind) == (
                s["status"],
                s["flags"],
                s["size"],
                s["expiry"],
                s["loc_kind"],
            )
            if e.location.kind == 1:
                assert e.location.ref.msg_id == s["msg_id"].tobytes()
            elif e.location.kind == 2:
                assert (e.location.ref.offset, e.location.ref.size) == (s["qs_offset"], s["qs_size"])
            assert c_qi.entry.build(e) == raw
            checked += 1
    assert checked > 300


def test_qi_grammar_rejects_what_the_broker_rejects():
    good = bytes([1, 1, 0, 2]) + (100).to_bytes(8, "big") + (10).to_bytes(4, "big") + bytes(4) + bytes(12)
    c_qi.entry.parse(good)
    for pos, value in ((1, 3), (2, 1), (16, 9)):  # reserved flag bit, reserved byte, location padding
        bad = bytearray(good)
        bad[pos] = value
        with pytest.raises(ConstructError):
            c_qi.entry.parse(bytes(bad))


def test_qs_and_rdq_twins_equal_grammar():
    n = 0
    for path in files("msg_store_*/*.rdq"):
        data = path.read_bytes()
        f = r_rdq.walk(path, 0, data)
        for off, total, msg_id in zip(f.offsets.tolist(), f.totals.tolist(), (m.tobytes() for m in f.msg_ids)):
            e = c_rdq.entry.parse(data[off : off + total])
            size, twin_id = c_rdq.ENTRY_HEAD.unpack_from(data, off)
            assert (e.size, e.msg_id) == (size, twin_id) == (total - 9, msg_id)
            assert c_rdq.entry.build(e) == data[off : off + total]
            n += 1
    assert n > 200
    for path in files("queues/*/*.qs"):
        data = path.read_bytes()
        if not data:  # created, nothing written yet at a kill -9 (3.10.8-quorum-kill's cq.dead)
            continue
        assert c_qs.header.parse(data[:64]).magic == c_qs.MAGIC
        qi = path.with_suffix(".qi")
        if not qi.exists():
            continue
        q = qi.read_bytes()
        for s in np.frombuffer(q, c_qi.ENTRY_DTYPE, count=(len(q) - 64) // 32, offset=64):
            if s["status"] == 1 and s["loc_kind"] == 2:
                off = int(s["qs_offset"])
                h = c_qs.entry_header.parse(data[off : off + 8])
                assert (h.size, h.flags, h.crc, h.reserved) == c_qs.ENTRY_HEADER.unpack_from(data, off)
                assert h.size == s["qs_size"]


def test_v1_records_twin_equals_grammar():
    n = 0
    for path in files("queues/*/*.idx") + files("queues/*/journal.jif"):
        data = path.read_bytes()
        idx = r_v1.V1Index()
        if path.suffix == ".idx":
            r_v1.parse_segment(path, int(path.stem), 2048, data, idx)
            grammar = c_idx.record
        else:
            r_v1.parse_journal(path, 2048, data, idx)
            grammar = c_jif.record
        for rec in idx.records:
            g = grammar.parse(data[rec.offset :])
            if rec.kind == "publish":
                assert (g.pub.msg_id, g.pub.expiry, g.pub.size, g.pub.embedded_size) == (
                    rec.msg_id,
                    rec.expiry,
                    rec.size,
                    rec.embedded_size,
                )
                if rec.embedded_size:
                    assert g.pub.embedded == data[rec.embedded_offset : rec.embedded_offset + rec.embedded_size]
                if path.suffix == ".idx":
                    assert g.head.bit2 == rec.persistent
                else:
                    assert (g.head.prefix == c_jif.PUB_PERSISTENT) == rec.persistent
            n += 1
    assert n > 100


def test_disk_log_items_equal_grammar():
    for path in files("msg_store_persistent/*.ets"):
        data = path.read_bytes()
        assert c_disklog.header.parse(data[:8]).status == c_disklog.CLOSED
        o = 8
        while o < len(data):
            item = c_disklog.item.parse(data[o:])
            length, magic = c_disklog.ITEM_HEAD.unpack_from(data, o)
            assert (item.length, item.magic) == (length, magic)
            o += 8 + (16 if length >= c_disklog.MIN_MD5_TERM else 0) + length
        assert o == len(data)


def test_qi_classify_equals_a_slot_by_slot_reading():
    """readers.qi.classify works on 64-bit words of the slots; each slot's class read byte by
    byte from the rules in its docstring agrees. Crafted: sparse random slots, so that zero and
    non-zero runs in every field occur."""
    from cqforensics.base.enums import SlotClass
    from cqforensics.readers import qi as r_qi

    rng = np.random.default_rng(5)
    raw = (rng.integers(0, 256, 20000 * 32) * (rng.random(20000 * 32) < 0.03)).astype(np.uint8)
    raw[0::32] = rng.choice([0, 0, 1, 1, 2], 20000)  # status bytes mostly 0 or 1
    raw[1::32] &= rng.choice([0, 1, 0xFF], 20000).astype(np.uint8)  # flags: persistent or not
    slots = np.frombuffer(raw.tobytes(), c_qi.ENTRY_DTYPE)
    klass, malformed = r_qi.classify(slots)
    for i, b in enumerate(raw.reshape(-1, 32).tolist()):
        status, flags, reserved, kind = b[:4]
        persistent, odd = flags & 1, bool(flags & 0xFE or reserved)
        want_bad_loc = kind > 2 or (kind == 0 and any(b[4:20])) or (kind == 2 and any(b[16:20]))
        if status > 1 or (status == 1 and persistent and odd):
            want = SlotClass.BAD
        elif status == 1:
            want = SlotClass.LIVE
        else:
            want = SlotClass.GHOST if any(b[1:]) else SlotClass.EMPTY
        assert (klass[i], bool(malformed[i])) == (want, status == 1 and persistent and not odd and want_bad_loc), i
