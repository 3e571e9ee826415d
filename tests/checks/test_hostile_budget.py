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
from pathlib import Path

import pytest

import cqforensics
from cqforensics.base.errors import FormatError
from cqforensics.codecs import etf
from cqforensics.grammar import rdq as c_rdq
from cqforensics.readers import rdq as r_rdq
from support import copy_node

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
    msg_id = data[off + 8 : off + 24]
    entry = struct.pack(">Q", len(term) + c_rdq.MSG_ID_SIZE) + msg_id + term + bytes((c_rdq.WRITE_OK_MARKER,))
    rdq.write_bytes(data[:off] + entry + data[off + total :])
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
    rows = [
        r
        for r in cqforensics.read_table(node, "messages", columns=["msg_id", "decode_error"]).to_pylist()
        if r["msg_id"] == msg_id
    ]
    findings = [f for f in cqforensics.read_table(node, "findings").to_pylist()]
    from cqforensics.commands.fsck import run

    deep = [f for f in run([node], deep=True).findings if f.code == "msg-corrupt" and f.offset == off]
    assert time.monotonic() - t0 < 60
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024 < 300 * MIB
    assert rows and all(r["decode_error"] and len(r["decode_error"]) < 1100 for r in rows)
    assert deep and all(len(f.message) < 1100 for f in deep)
    assert all(len(f["message"]) < 1100 for f in findings)


# -- every count and length field, in every decoder ------------------------------------------------
#
# Issue 33: an AMQP 1.0 array claiming 2^32-1 elements took every entry point to gigabytes. A
# count or length read from the bytes is checked against the bytes left before anything is
# built, in every decoder; this tries every field the way the case did: each byte
# position of real broker bytes overwritten with the largest counts (1, 2 and 4 bytes of 0xFF,
# 0x7FFFFFFF), each decode in a child process with an address-space limit, each bounded in time.


def _real_inputs() -> dict[str, list[tuple[str, bytes]]]:
    """Per decoder, real bytes to lie in (small ones: every byte position is tried)."""
    from cqforensics.codecs import etf
    from cqforensics.message import reference as message
    from cqforensics.readers import qs as r_qs
    from support import SAMPLES

    def files(pattern: str, limit: int) -> list[Path]:
        return sorted(SAMPLES.glob(pattern), key=lambda p: (p.stat().st_size, str(p)))[:limit]

    terms: dict[str, bytes] = {}
    for ds in ("3.10.8-clean", "4.3.6-clean", "4.3.6-proto-clean", "3.13.7-clean", "4.0.5-kill"):
        for p in SAMPLES.glob(f"{ds}/mnesia/*/msg_stores/vhosts/*/queues/*/*.qs"):
            for _, t in r_qs.dump_rows(p):
                if t is not None:
                    raw = bytes(t[0][t[1] : t[1] + t[2]])
                    try:
                        fmt = message.decode_stored(raw)["term_format"]
                    except Exception:
                        continue
                    if len(raw) < 1500 and (fmt not in terms or len(raw) < len(terms[fmt])):
                        terms[fmt] = raw
    bare = []
    for raw in terms.values():
        t = etf.binary_to_term(raw)
        if t[1] == "mc_amqp" and t[2][0] == "v1":
            bare.append(("bare", bytes(t[2][2])))
    # crafted (labelled): an application-properties map of AMQP 1.0 arrays of each element kind
    # (an empty array of nulls first), a list, a map and described values
    crafted = bytes.fromhex(
        "005374c1620ca1017af0000000050000000040a10161e0050340404040a10162f000000011000000037100"
        "0000010000000200000003a10163d000000009000000025207a1017aa10164f00000000800000003560100"
        "01a10165f0000000080000000340404040"
    )
    bare.append(("crafted", crafted))
    props = []
    for raw in terms.values():
        t = etf.binary_to_term(raw)
        content = t[3] if t[0] == "basic_message" else t[2]
        if isinstance(content, tuple) and len(content) == 6 and isinstance(content[3], bytes):
            props.append(("props", content[3]))
    return {
        "etf": [(k, v) for k, v in terms.items()],
        "amqp10": bare,
        "amqp091": props,
        "text": [
            (p.name, p.read_bytes())
            for p in files("*/mnesia/*/msg_stores/vhosts/*/.config", 1)
            + files("*/mnesia/*/cluster_nodes.config", 1)
            + files("*/mnesia/*/msg_stores/vhosts/*/*/clean.dot", 1)
        ],
        "disk_log": [
            (p.name, p.read_bytes())
            for p in files("3.10.8-clean/mnesia/*/*.DCL", 1)
            + files("*/mnesia/*/msg_stores/vhosts/*/*/file_summary.ets", 1)
        ],
        "dets": [(p.name, p.read_bytes()) for p in files("*/mnesia/*/msg_stores/vhosts/*/recovery.dets", 1)],
        "wal": [(p.name, p.read_bytes()[:600]) for p in files("4.3.6-clean/mnesia/*/coordination/*/*.wal", 1)],
    }


def _decoders() -> dict:
    from cqforensics.codecs import amqp091, amqp10, textfiles
    from cqforensics.message import fast as fastpath
    from cqforensics.readers import terms as r_terms

    def dets(data):
        r_terms.dets_findings(Path("x.dets"), data)
        r_terms.read_dets_objects(Path("x.dets"), data)

    return {
        "etf": fastpath.decode,
        "amqp10": amqp10.sections,
        "amqp091": amqp091.properties_json,
        "text": textfiles.consult,
        "disk_log": lambda d: r_terms.read_disk_log(Path("x.LOG"), d),
        "dets": dets,
        "wal": lambda d: r_terms.wal_findings(Path("x.wal"), d),
    }


def _lies(data: bytes, positions):
    for k in positions:
        for lie in (b"\xff", b"\xff\xff", b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff"):
            yield k, data[:k] + lie + data[k + len(lie) :]


def _every_lie(kind: str, inputs, conn) -> None:
    """In the child: every lie of every input through the decoder; sends (decodes, slowest
    seconds, what was slowest) and never raises."""
    decode = _decoders()[kind]
    n, slowest, what = 0, 0.0, ""
    for name, data in inputs:
        step = max(1, len(data) // 1200)  # every position of a small input; spread over a large one
        for k, lie in _lies(data, range(0, len(data), step)):
            t0 = time.monotonic()
            try:
                decode(lie)
            except FormatError:
                pass
            dt = time.monotonic() - t0
            n += 1
            if dt > slowest:
                slowest, what = dt, f"{name}@{k}"
    conn.send((n, slowest, what))


@pytest.mark.parametrize("kind", ["etf", "amqp10", "amqp091", "text", "disk_log", "dets", "wal"])
def test_every_count_field_is_checked_against_the_bytes_left(kind):
    import multiprocessing as mp

    inputs = _real_inputs()[kind]
    assert inputs, kind
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()

    def run():
        limit = _vm_size() + (600 << 20)  # 600 MB more than the process it forked from
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            _every_lie(kind, inputs, child)
        except BaseException as e:  # MemoryError, or any exception a lie raised: the failure
            child.send(f"{type(e).__name__}: {str(e)[:300]}")

    p = ctx.Process(target=run)
    p.start()
    p.join(240)
    if p.is_alive():
        p.kill()
        pytest.fail(f"{kind}: the lies took more than 240 s")
    assert parent.poll(), f"{kind}: the child died (exit {p.exitcode})"
    got = parent.recv()
    assert not isinstance(got, str), got
    n, slowest, what = got
    assert n > 100 and slowest < 2.0, (n, slowest, what)


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize:"))
