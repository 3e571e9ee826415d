"""Erlang External Term Format codec: every tag, byte-identical re-encoding of every stored
term in the samples, and bounded behaviour on hostile input."""

from __future__ import annotations

import struct
import zlib

import pytest

from cqforensics.codecs import etf
from cqforensics.codecs.etf import Atom, BitBinary, EtfError, ImproperList, Opaque
from support.terms import stored_terms


def test_every_sample_term_reencodes_byte_identically():
    terms = stored_terms()
    assert len(terms) > 500
    for path, offset, raw in terms:
        term, end = etf.decode(raw)
        assert etf.term_to_binary(term) == raw[:end], f"{path}@{offset}"


def test_atom_encodings_latin1_and_utf8():
    assert etf.binary_to_term(b"\x83d\x00\x03abc") == "abc"
    assert etf.binary_to_term(b"\x83s\x03abc") == "abc"
    assert etf.binary_to_term(b"\x83v\x00\x02\xc3\xa9") == "é"
    assert etf.binary_to_term(b"\x83w\x02\xc3\xa9") == "é"
    a = etf.binary_to_term(b"\x83d\x00\x03abc")
    assert isinstance(a, Atom) and a.utf8 is False
    assert etf.term_to_binary(a) == b"\x83d\x00\x03abc"
    assert etf.term_to_binary(Atom("abc"), utf8_atoms=True) == b"\x83w\x03abc"
    assert etf.term_to_binary(Atom("abc"), utf8_atoms=False) == b"\x83d\x00\x03abc"


@pytest.mark.parametrize(
    "term",
    [
        0,
        255,
        256,
        -1,
        2**31 - 1,
        -(2**31),
        2**31,
        -(2**64),
        2**2100,
        1.5,
        -0.0,
        b"",
        b"bin",
        (),
        (1, (2, 3)),
        tuple(range(300)),
        [],
        [1, 2, 3],
        [1000, 2],
        [Atom("a"), [b"x"]],
        {Atom("a"): 1, b"k": [1]},
        ImproperList([1, 2], Atom("tail")),
        BitBinary(b"\xff\x80", 3),
    ],
)
def test_roundtrip(term):
    raw = etf.term_to_binary(term)
    back, end = etf.decode(raw, exact=True)
    assert back == term and end == len(raw)
    assert etf.term_to_binary(back) == raw


def test_string_ext_and_legacy_float_and_compressed():
    assert etf.binary_to_term(b"\x83k\x00\x03abc") == [97, 98, 99]
    legacy = b"\x83c" + b"1.50000000000000000000e+00".ljust(31, b"\0")
    assert etf.binary_to_term(legacy) == 1.5
    inner = etf.term_to_binary((Atom("ok"), b"x" * 100))[1:]
    comp = b"\x83P" + struct.pack(">I", len(inner)) + zlib.compress(inner)
    assert etf.binary_to_term(comp) == (Atom("ok"), b"x" * 100)


def test_opaque_pids_refs_funs_kept_verbatim():
    node = b"d\x00\x0erabbit@nowhere"
    pid = b"X" + node + b"\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x03"
    ref = b"Z\x00\x02" + node + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x02\x00\x00\x00\x03"
    export = b"qd\x00\x05listsd\x00\x03mapa\x02"
    for raw in (pid, ref, export):
        term = etf.binary_to_term(b"\x83" + raw)
        assert isinstance(term, Opaque)
        assert etf.term_to_binary(term) == b"\x83" + raw


@pytest.mark.parametrize(
    "raw, what",
    [
        (b"\x83m\xff\xff\xff\xffabc", "binary"),  # claimed length beyond the buffer
        (b"\x83l\x7f\xff\xff\xffa\x01", "list length"),  # 2 billion elements claimed
        (b"\x83t\x7f\xff\xff\xff", "map arity"),
        (b"\x83i\x7f\xff\xff\xff", "tuple arity"),
        (b"\x83" + b"h\x01" * 5000 + b"a\x01", "nested"),
        (b"\x83P\xff\xff\xff\xff" + zlib.compress(b"\0" * 10), "compressed"),  # claims 4 GiB
        (b"\x83\xee", "tag"),
        (b"\x84a\x01", "external term"),
        (b"\x83", "truncated"),
    ],
)
def test_hostile_input_is_bounded(raw, what):
    with pytest.raises(EtfError) as e:
        etf.decode(raw)
    assert e.value.offset is not None
    assert what.split()[0] in str(e.value) or "term" in str(e.value) or "nested" in str(e.value)


def test_decompression_bomb_is_stopped_at_the_limit():
    inner = b"m" + struct.pack(">I", 50_000_000) + b"\0" * 50_000_000
    comp = b"\x83P" + struct.pack(">I", len(inner)) + zlib.compress(inner)
    with pytest.raises(EtfError, match="limit"):
        etf.decode(comp, max_decompressed=1_000_000)


def test_map_key_order_follows_erlang_term_order():
    m = etf.erlang_map([(b"bin", 1), (Atom("b"), 2), (Atom("a"), 3), (5, 4)])
    assert list(m) == [5, Atom("a"), Atom("b"), b"bin"]
