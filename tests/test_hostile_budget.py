"""Issue 12, decompression amplification: compressed Erlang terms (tag 80) share one budget per
decode, so a small entry holding several compressed binaries (each under the limit alone)
cannot inflate to gigabytes; past the budget the term is damage (a FormatError, then a finding
or a row's decode_error), and no error message embeds the repr of a huge binary.

Every term here is crafted (none comes from a broker): the byte layouts are ETF's own."""

from __future__ import annotations

import resource
import struct
import time
import zlib

import pytest

import cqforensics
from conftest import copy_node
from cqforensics import etf
from cqforensics.errors import FormatError
from cqforensics.grammar import rdq as c_rdq
from cqforensics.readers import rdq as r_rdq

MIB = 1 << 20
_CACHE: dict[int, bytes] = {}


def crafted_compressed_binary(n: int) -> bytes:
    """Crafted: tag 80 (compressed) around a binary of ``n`` zero bytes, streamed (never held)."""
    if n not in _CACHE:
        c = zlib.compressobj(9)
        parts = [c.compress(b"m" + struct.pack(">I", n))]
        chunk = bytes(MIB)
        for _ in range(n // MIB):
            parts.append(c.compress(chunk))
        parts.append(c.compress(bytes(n % MIB)))
        parts.append(c.flush())
        _CACHE[n] = b"P" + struct.pack(">I", n + 5) + b"".join(parts)
    return _CACHE[n]


def crafted_tuple(*elements: bytes) -> bytes:
    return b"\x83h" + bytes([len(elements)]) + b"".join(elements)


def test_crafted_several_compressed_binaries_share_one_budget():
    # five binaries of 20 MiB: each far under the limit alone, 100 MiB together
    one = crafted_compressed_binary(20 * MIB)
    raw = crafted_tuple(*[one] * 5)
    assert len(raw) < 200_000
    term, _ = etf.decode(crafted_tuple(one, one))  # 40 MiB: within the budget
    assert [len(x) for x in term] == [20 * MIB] * 2
    del term
    t0 = time.monotonic()
    with pytest.raises(FormatError) as e:
        etf.decode(raw)
    assert time.monotonic() - t0 < 5
    assert "limit" in str(e.value) and e.value.offset is not None and len(str(e.value)) < 300


def test_crafted_nested_compressed_terms_share_the_budget():
    inner = b"\x83" + crafted_compressed_binary(40 * MIB)  # a term holding a compressed 40 MiB binary
    body = inner[1:]
    outer = b"P" + struct.pack(">I", len(body)) + zlib.compress(body)
    with pytest.raises(FormatError, match="limit"):
        etf.decode(crafted_tuple(outer, crafted_compressed_binary(40 * MIB)))


def test_crafted_claim_is_charged_before_inflating():
    # claims 4 GiB: refused without inflating a byte
    raw = b"\x83P" + struct.pack(">I", 0xFFFFFFFF) + zlib.compress(b"m\x00\x00\x00\x01a")
    with pytest.raises(FormatError, match="limit"):
        etf.decode(raw)


def test_decode_budget_spans_several_decodes_and_decode_at_shares_per_buffer():
    one = b"\x83" + crafted_compressed_binary(40 * MIB)
    etf.decode(one)
    etf.decode(one)  # separate decodes: a budget each
    with etf.decode_budget(64 * MIB):
        etf.decode(one)
        with pytest.raises(FormatError, match="limit"):
            etf.decode(one)
    # the parts of one buffer read one after another (as the fast path reads annotations)
    buf = crafted_tuple(crafted_compressed_binary(40 * MIB), crafted_compressed_binary(40 * MIB))
    _, p = etf.decode_at(buf, 3)
    with pytest.raises(FormatError, match="limit"):
        etf.decode_at(buf, p)
    other = bytes(bytearray(buf))  # another buffer (an equal copy): its own budget
    assert len(etf.decode_at(other, 3)[0]) == 40 * MIB


def test_truncated_compressed_stream_and_trailing_bytes_are_errors():
    good = crafted_compressed_binary(1000)
    with pytest.raises(FormatError):
        etf.decode(b"\x83" + good[:-3])
    term, end = etf.decode(b"\x83" + good + b"rest")
    assert len(term) == 1000 and end == 1 + len(good)


def _replace_first_entry(rdq, term: bytes) -> tuple[int, bytes]:
    data = rdq.read_bytes()
    f = r_rdq.walk(rdq, 0, data)
    off, total = int(f.offsets[0]), int(f.totals[0])
    msg_id = data[off + 8:off + 24]
    entry = struct.pack(">Q", len(term) + c_rdq.MSG_ID_SIZE) + msg_id + term + bytes((c_rdq.WRITE_OK_MARKER,))
    rdq.write_bytes(data[:off] + entry + data[off + total:])
    return off, msg_id


def test_crafted_rdq_entry_of_compressed_binaries_is_a_decode_error_not_gigabytes(tmp_path):
    """A stored message replaced by a crafted 1 MB term of five compressed 200 MiB binaries (the
    issue's case: each under the old per-term limit): every decoding read reports it as damage,
    quickly, and the process does not grow by hundreds of MB."""
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    rdq = max(node.glob("msg_stores/vhosts/*/msg_store_persistent/*.rdq"), key=lambda p: p.stat().st_size)
    term = crafted_tuple(*[crafted_compressed_binary(200 * MIB)] * 5)
    assert len(term) < 2 * MIB
    off, msg_id = _replace_first_entry(rdq, term)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    rows = [r for r in cqforensics.read_table(node, "messages", columns=["msg_id", "decode_error"]).to_pylist()
            if r["msg_id"] == msg_id]
    findings = [f for f in cqforensics.read_table(node, "findings").to_pylist()]
    from cqforensics.fsck import run

    deep = [f for f in run([node], deep=True).findings if f.code == "msg-corrupt" and f.offset == off]
    assert time.monotonic() - t0 < 60
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024 < 300 * MIB
    assert rows and all(r["decode_error"] and len(r["decode_error"]) < 1100 for r in rows)
    assert deep and all(len(f.message) < 1100 for f in deep)
    assert all(len(f["message"]) < 1100 for f in findings)
