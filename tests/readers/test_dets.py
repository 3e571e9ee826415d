"""DETS v9 structure checks (``cqforensics.readers.dets``): no finding on any real table, a
finding at (or next to) every flipped bit of a structural word except the flips OTP does not
notice, bounded work on hostile files, and ``erlang:phash2`` as OTP computes it.

Real tables: every ``*.dets`` and ``schema.DAT`` of the sample datasets (sample_data, unpacked by
conftest; the node-dir archives of ../shared/samples-extra read in place). Tables written by the
local OTP (``escript``) and every modified file are crafted; their docstrings say so.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import struct
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from cqforensics.codecs import etf
from cqforensics.readers import dets, terms
from cqforensics.readers.files import map_file
from support import ROOT, SAMPLES

EXTRA = next(
    (p for p in (Path("/work/shared/samples-extra"), ROOT.parent / "shared" / "samples-extra") if p.is_dir()), None
)


def _is_dets(name: str) -> bool:
    return name.endswith(".dets") or name.rsplit("/", 1)[-1] == "schema.DAT"


def _real_tables() -> dict[str, bytes]:
    """Every DETS table of the samples, once per content: {a name: its bytes}."""
    out: dict[str, bytes] = {}
    seen: set[str] = set()

    def add(name: str, data: bytes) -> None:
        digest = hashlib.sha256(data).hexdigest()
        if digest not in seen:
            seen.add(digest)
            out[name] = data

    for p in sorted(SAMPLES.rglob("*")):
        if p.is_file() and _is_dets(p.name):
            add(p.relative_to(SAMPLES).as_posix(), p.read_bytes())
    for tarball in sorted(list(SAMPLES.glob("*/*.tar.gz")) + (list(EXTRA.glob("*/*.tar.gz")) if EXTRA else [])):
        with tarfile.open(tarball) as tf:
            for m in tf.getmembers():
                if m.isfile() and _is_dets(m.name):
                    add(f"{tarball.name}:{m.name}", tf.extractfile(m).read())
    return out


REAL = _real_tables()
P = Path  # a table's path only names it in findings

# closed-properly tables the flip tests use (sizes: 10 KB with 18 objects, 6 KB with one, 5 KB empty,
# 31 KB with a 16 KB collection)
RECOVERY = "3.10.8-clean/mnesia/rabbit@localhost/msg_stores/vhosts/628WB79CIFDYO9LJI6DKMI09L/recovery.dets"
RA_META = "4.3.6-clean/mnesia/rabbit@localhost/coordination/rabbit@localhost/meta.dets"
MQTT_EMPTY = "3.10.8-proto-clean/mnesia/rabbit@localhost/mqtt_retained_00005bda5d799133752c89cc144756b96df0.dets"
MQTT_BIG = "4.3.6-proto-clean/mnesia/rabbit@localhost/mqtt_retained_00006666cd76f96956469e7be39d750cc7d9.dets"


def _sample(rel: str) -> bytes:
    path = SAMPLES / rel
    if not path.exists():
        pytest.skip(f"sample {rel} is not here")
    return path.read_bytes()


def _findings(data: bytes, name: str = "t.dets"):
    """Both functions' findings: structure_findings' own, and dets_findings' (the file's ends,
    then structure_findings' for what they leave, then the objects' shape). dets_findings is
    handed the structure findings of these very bytes instead of walking the table a second
    time (structure_findings is a pure function of the path and the bytes, and a finding is
    immutable): the flip tests below call this thousands of times, and the walk is most of it."""
    path = P(name)
    structure = dets.structure_findings(path, data)
    walk = dets.structure_findings
    dets.structure_findings = lambda p, d: structure if p == path and d is data else walk(p, d)
    try:
        return structure + terms.dets_findings(path, data)
    finally:
        dets.structure_findings = walk


def _flip(data: bytes, word: int, bit: int) -> bytes:
    """Crafted: ``data`` with bit ``bit`` (0 = least significant) of the big-endian word at ``word`` flipped."""
    b = bytearray(data)
    b[word + 3 - bit // 8] ^= 1 << (bit % 8)
    return bytes(b)


def _near(findings, word: int, slack: int = 8) -> bool:
    for f in findings:
        offsets = [f.offset] + [o for o in f.details.get("offsets", []) if isinstance(o, int)]
        if any(o is not None and abs(o - word) <= slack for o in offsets):
            return True
        if word < dets.HEADSZ and f.offset is not None and f.offset < dets.HEADSZ:
            return True  # a header word: the header finding (dets_findings names the cookie's offset)
    return False


# -- 1. no false positives ----------------------------------------------------------------------


def test_the_samples_hold_dets_tables():
    assert len(REAL) >= 40
    closed = [n for n, d in REAL.items() if struct.unpack_from(">I", d, 8)[0] == 1]
    assert len(closed) >= 30 and len(REAL) - len(closed) >= 3  # both kinds are covered


@pytest.mark.parametrize("name", sorted(REAL))
def test_no_finding_on_a_real_table(name):
    data = REAL[name]
    assert dets.structure_findings(P(name), data) == []
    check = dets._Check(P(name), data)
    check.run()
    h = dets.Header.parse(data[: dets.HEADSZ])
    if h.closed == 1:  # the whole structure was walked: every object reached through its slot
        assert check.complete and not check.lost
        assert (check.found_objects, check.found_keys) == (h.no_objects, h.no_keys)


def test_a_mapped_file_reads_the_same_and_can_be_closed(tmp_path):
    path = tmp_path / "recovery.dets"
    path.write_bytes(_sample(RECOVERY))
    data = map_file(path)
    assert dets.structure_findings(path, data) == []
    flipped = tmp_path / "flipped.dets"
    flipped.write_bytes(_flip(path.read_bytes(), 1336, 12))
    mapped = map_file(flipped)
    assert dets.structure_findings(flipped, mapped)
    data.close()
    mapped.close()  # no view into the map outlives the call


# -- 2. every flipped bit of a structural word --------------------------------------------------


def _structural_words(data: bytes, sample: int = 12) -> list[tuple[str, int]]:
    """(what, offset) of a table's structural words: every header word, every pointer in use, the
    block header of every object block, and a deterministic sample of the words OTP writes as
    zero (unused part and segment pointers, empty slots)."""
    rnd = random.Random(7)
    h = dets.Header.parse(data[: dets.HEADSZ])
    words = [("header", o) for o in range(0, dets.HEADSZ, 4)]
    nsegs = (h.next - 1) // 256 + 1
    nparts = (nsegs - 1) // 512 + 1
    words += [("part pointer", 312 + 4 * i) for i in range(nparts)]
    words += [("unused part pointer", 312 + 4 * i) for i in rnd.sample(range(nparts, 256), min(sample, 256 - nparts))]
    segs, unused = [], []
    for i in range(nparts):
        p = struct.unpack_from(">I", data, 312 + 4 * i)[0]
        for k in range(512):
            if i * 512 + k < nsegs:
                words.append(("segment pointer", p + 4 * k))
                segs.append(struct.unpack_from(">I", data, p + 4 * k)[0])
            else:
                unused.append(p + 4 * k)
    words += [("unused segment pointer", o) for o in rnd.sample(unused, min(sample, len(unused)))]
    empty = []
    for s in segs:
        for k in range(256):
            ptr = struct.unpack_from(">I", data, s + 8 * k + 4)[0]
            if ptr:
                words += [
                    ("slot size", s + 8 * k),
                    ("slot pointer", s + 8 * k + 4),
                    ("block size", ptr),
                    ("block status", ptr + 4),
                ]
            else:
                empty += [s + 8 * k, s + 8 * k + 4]
    words += [("empty slot", o) for o in rnd.sample(empty, min(sample, len(empty)))]
    return words


#: the words a table holds one of per object (its slot and its block): a table of 18 objects has 18
#: of each, read by the same code; every bit of a few of them, a sample of the bits of the others
PER_OBJECT = ("slot size", "slot pointer", "block size", "block status")


def _flips_per_word(words: list[tuple[str, int]], whole: int = 3, bits: int = 4) -> list[tuple[str, int, list[int]]]:
    """(what, offset, the bits to flip) of each word: all 32 bits of every word but the per-object
    ones; of each per-object kind, all 32 bits of its first, its last and one seeded pick between
    (so every bit position of each kind is flipped), and a seeded ``bits`` of the 32 of the others.
    RECOVERY (18 objects): 3,344 flips instead of 5,024, every kind of word and bit position kept."""
    rnd = random.Random(11)
    full: set[int] = set()
    for kind in PER_OBJECT:
        at = [o for what, o in words if what == kind]
        full |= set(at if len(at) <= whole else [at[0], at[-1], *rnd.sample(at[1:-1], whole - 2)])
    return [
        (what, o, list(range(32)) if what not in PER_OBJECT or o in full else sorted(rnd.sample(range(32), bits)))
        for what, o in words
    ]


# Flips OTP does not notice, or repairs (each checked against OTP in test_otp_agrees_on_what_it_ignores):
#  * bit 0 of the closed-properly flag (8): 1 -> 0 makes the table "not properly closed"; OTP repairs it at
#    open (a full scan: nothing is lost), exactly as after a crash, so an unclosed table gets no finding.
EXCEPTIONS = {(8, 0)}


@pytest.mark.slow
@pytest.mark.parametrize("rel", [RECOVERY, RA_META, MQTT_EMPTY, MQTT_BIG])
def test_every_flipped_structural_bit_is_found_near_its_word(rel):
    """Crafted: one flipped bit at a time in each structural word of a real closed table (every
    bit, but in the words a table has one of per object: ``_flips_per_word``)."""
    data = _sample(rel)
    missed = []
    for what, word, bits in _flips_per_word(_structural_words(data)):
        for bit in bits:
            if (word, bit) in EXCEPTIONS:
                continue
            found = _findings(_flip(data, word, bit))
            if not _near(found, word):
                missed.append((what, word, bit, [(f.offset, f.message[:80]) for f in found][:2]))
    assert not missed, missed[:10]


@pytest.mark.slow
@pytest.mark.parametrize("rel", [RECOVERY, MQTT_EMPTY])
def test_every_flipped_bit_of_the_free_lists_is_found(rel):
    """Crafted: a flipped bit in the free lists (and the size word after them) never goes unseen.
    The lists are blocks of one shape (``<<Size, ?FREE, Pos, Addr...>>``, one per buddy size
    class: 21 in RECOVERY): every bit of every word of the first, the last and one seeded block
    between, of the end block and of the size word; a seeded 4 of the 32 bits of each word of the
    other blocks (800 flips instead of 2,816 in RECOVERY)."""
    data = _sample(rel)
    fl = struct.unpack_from(">I", data, 0)[0]
    blocks, o = [], fl  # the words of each free-list block, the end block last
    while o < len(data) - 4:
        size, _, pos = struct.unpack_from(">III", data, o)
        blocks.append(range(o, o + size, 4))
        o += size
        if pos == dets.ENDFREE:
            break
    assert blocks and o == len(data) - 4, "the sample's free lists are well formed, the size word last"
    rnd = random.Random(5)
    whole = {0, len(blocks) - 2, len(blocks) - 1}
    if len(blocks) > 3:
        whole.add(rnd.randrange(1, len(blocks) - 2))
    flips = [(w, range(32) if k in whole else rnd.sample(range(32), 4)) for k, b in enumerate(blocks) for w in b]
    flips.append((len(data) - 4, range(32)))
    missed = [(w, bit) for w, bits in flips for bit in bits if not _findings(_flip(data, w, bit))]
    assert not missed, missed[:10]


def test_the_exceptions_are_silent():
    """Crafted: the closed flag's bit 0 (OTP repairs) gives no finding."""
    assert _findings(_flip(_sample(RECOVERY), 8, 0)) == []


@pytest.mark.parametrize(
    "rel, offsets",
    [
        (RECOVERY, [1388, 2566]),  # unused segment pointers 13 and 307 of part 0
        (RA_META, [110, 678, 4428, 5356]),  # a collection counter, part pointer 91, empty slots 130 and 246
        (MQTT_EMPTY, [789]),  # part pointer 119
    ],
)
def test_the_fuzzing_campaign_flips_are_found(rel, offsets):
    """Crafted: the flips the fuzzing campaign found silent, every bit of each byte."""
    data = _sample(rel)
    for off in offsets:
        for bit in range(8):
            b = bytearray(data)
            b[off] ^= 1 << bit
            found = dets.structure_findings(P(rel), bytes(b))
            assert _near(found, off & ~3), (off, bit, [(f.offset, f.message) for f in found])


def test_findings_say_what_and_where():
    """Crafted: one flip per kind of word; each finding names the offset and says what OTP does."""
    data = _sample(RECOVERY)
    by_word = {
        1336: "segment 0",  # segment 0's pointer (points into object data)
        3452: "slot 8",  # slot 8's pointer (now names another slot's block)
        3384: "slot 0",  # empty slot 0's size word
        24: "next",  # a header field: the MD5 names it
        200: "reserved",
    }
    for word, what in by_word.items():
        found = dets.structure_findings(P("t"), _flip(data, word, 10 if word == 1336 else 3))
        assert found and what in found[0].message, (word, [f.message for f in found])
        assert found[0].code == "term-file-damaged" and found[0].file == "t"
    reserved = dets.structure_findings(P("t"), _flip(data, 200, 3))
    assert reserved[0].severity == "info"  # OTP never reads those bytes
    slot = dets.structure_findings(P("t"), _flip(data, 3452, 10))
    assert slot[0].offset == 3452 and slot[0].severity == "warning"


def test_an_unclosed_table_gets_only_the_checks_otp_makes_before_repairing():
    """Crafted: with the closed flag 0 a broken slot pointer says nothing (OTP repairs the table at open),
    a header that does not match its MD5 still does (OTP refuses it before looking at the flag)."""
    data = _flip(_sample(RECOVERY), 8, 0)
    assert dets.structure_findings(P("t"), _flip(data, 3452, 10)) == []
    found = dets.structure_findings(P("t"), _flip(data, 24, 3))
    assert [f.offset for f in found] == [27] and "not_a_dets_file" in found[0].message


# -- the hash ----------------------------------------------------------------------------------

# term_to_binary(T) and erlang:phash2(T) on OTP 25 (erts 13.1.5)
PHASH2 = [
    ("8364000161", 97),
    ("83640000", 0),
    ("8364000568656C6C6F", 7258927),
    ("83640001E4", 228),
    ("837709C3A5C3A4C3B6E282AC", 121916108),
    ("837705F09F988061", 16420961),
    ("836100", 88723725),
    ("836101", 2614250),
    ("8362FFFFFFFF", 44071773),
    ("8361FF", 44734653),
    ("836200000100", 37021655),
    ("836207FFFFFF", 112602999),
    ("836208000000", 12354923),
    ("8362F8000000", 69672967),
    ("8362F7FFFFFF", 76739502),
    ("836E0800FFFFFFFFFFFFFF07", 27520264),
    ("836E08000000000000000008", 26969617),
    ("836E08010000000000000008", 35173814),
    ("836E08010100000000000008", 36462311),
    ("836E0800FFFFFFFFFFFFFFFF", 53435350),
    ("836E0900000000000000000001", 103122609),
    ("836E0901000000000000000001", 13457787),
    ("836E1A000000000000000000000000000000000000000000000000000001", 23185601),
    ("836E11010000000000000000000000000000000004", 15724855),
    ("83460000000000000000", 20875736),
    ("83468000000000000000", 20875736),
    ("83463FF8000000000000", 10380315),
    ("8346D4CDB7B95D11BDAB", 130435098),
    ("834601A56E1FC2F8F359", 15324994),
    ("836D00000000", 13708901),
    ("836D0000000101", 76691218),
    ("836D0000000B0102030405060708090A0B", 21612627),
    ("836D0000000C0102030405060708090A0B0C", 103762329),
    ("834D000000010100", 77524856),
    ("834D0000000103A0", 133543196),
    ("834D0000000305010218", 6593870),
    ("836A", 113427502),
    ("836C000000016A6A", 96416884),
    ("836B000161", 49011133),
    ("836B0003616263", 117343302),
    ("836B000461626364", 7922743),
    ("836B00056162636465", 71169904),
    ("836C0000000162000001006A", 73608398),
    ("836C000000036101620000010061036A", 124300072),
    ("836C000000016400016164000162", 74710280),
    ("836C00000002610161026103", 8851781),
    ("836C00000002616161626D00000000", 99986928),
    ("836C000000026B0001016B000202036A", 38766275),
    ("836800", 87486268),
    ("83680164000161", 35332806),
    ("8368026400016164000162", 101277806),
    ("83680368006A6D00000000", 98165365),
    ("83680261016802610268016103", 96079695),
    ("836B002871756575655F6469725F6E616D655F3253565A3937504A5143424946494E4343314B494F374C3544", 43817951),
    ("836C000000046D00000001786400017946400800000000000068016400017A6A", 46119049),
    ("836B00010A", 114132244),
    ("836A", 113427502),
    ("836E0900F1D0BD6DB96D484C01", 115385472),
    ("8362FA09727A", 68251391),
    ("837704CEAEC981", 891665),
]


@pytest.mark.parametrize("hexterm, expected", PHASH2)
def test_phash2_matches_otp(hexterm, expected):
    term, _ = etf.decode(bytes.fromhex(hexterm))
    assert dets.phash2(term) == expected


def test_phash2_gives_up_on_what_it_does_not_cover():
    pid = etf.decode(bytes.fromhex("8358770d6e6f6e6f6465406e6f686f7374000000000000000000000000"))[0]
    assert dets.phash2(pid) is None and dets.phash2((1, pid)) is None and dets.phash2({1: 2}) is None


ERL_TERMS = r"""
-module(cqf_phash2).
-export([main/0]).
main() ->
    rand:seed(exsss, {4, 5, 6}),
    Ts = [rnd(4) || _ <- lists:seq(1, 300)] ++ [list_to_atom(lists:duplicate(255, $q)), 1 bsl 300, -0.0],
    [io:format("~s ~b~n", [binary:encode_hex(term_to_binary(T)), erlang:phash2(T)]) || T <- Ts],
    ok.
rnd(0) -> leaf();
rnd(D) ->
    case rand:uniform(6) of
        1 -> list_to_tuple([rnd(D - 1) || _ <- lists:seq(1, rand:uniform(4) - 1)]);
        2 -> [rnd(D - 1) || _ <- lists:seq(1, rand:uniform(5) - 1)];
        3 -> [rand:uniform(256) - 1 || _ <- lists:seq(1, rand:uniform(20))];
        4 -> [rnd(D - 1) | rnd(D - 1)];
        _ -> leaf()
    end.
leaf() ->
    case rand:uniform(8) of
        1 -> list_to_atom([rand:uniform(1000) || _ <- lists:seq(1, rand:uniform(12))]);
        2 -> rand:uniform(1 bsl 80) - (1 bsl 79);
        3 -> rand:uniform(1 bsl 30) - (1 bsl 29);
        4 -> rand:uniform() * 1.0e9 - 5.0e8;
        5 -> list_to_binary([rand:uniform(256) - 1 || _ <- lists:seq(1, rand:uniform(40) - 1)]);
        6 -> <<(rand:uniform(1 bsl 20)):21>>;
        7 -> [];
        _ -> list_to_atom([$a + rand:uniform(25) || _ <- lists:seq(1, rand:uniform(30))])
    end.
"""


def _erl() -> None:
    if not (shutil.which("erl") and shutil.which("erlc") and shutil.which("escript")):
        pytest.skip("no Erlang/OTP here (erl, erlc, escript)")


def test_phash2_matches_the_local_otp_on_random_terms(tmp_path):
    _erl()
    (tmp_path / "cqf_phash2.erl").write_text(ERL_TERMS)
    subprocess.run(["erlc", "cqf_phash2.erl"], cwd=tmp_path, check=True, capture_output=True, timeout=60)
    out = subprocess.run(
        ["erl", "-noshell", "-pa", str(tmp_path), "-eval", "cqf_phash2:main(), halt()."],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    pairs = [line.split() for line in out.splitlines() if line.strip()]
    assert len(pairs) == 303
    wrong = [(h, v) for h, v in pairs if dets.phash2(etf.decode(bytes.fromhex(h))[0]) != int(v)]
    assert not wrong, wrong[:5]


# -- tables the local OTP writes, and what OTP itself does with a flipped bit --------------------

GEN = r"""#!/usr/bin/env escript
main([Dir]) ->
    F = fun(N) -> filename:join(Dir, N) end,
    {ok, a} = dets:open_file(a, [{file, F("grown_set.dets")}]),
    ok = dets:insert(a, [{I, lists:duplicate(I rem 50, $x)} || I <- lists:seq(1, 3000)]),
    [ok = dets:delete(a, I) || I <- lists:seq(1, 3000, 7)],
    ok = dets:close(a),
    {ok, a2} = dets:open_file(a2, [{file, F("grown_set.dets")}]),
    ok = dets:insert(a2, [{{k, I}, <<I:64>>} || I <- lists:seq(1, 500)]),
    ok = dets:close(a2),
    {ok, b} = dets:open_file(b, [{file, F("bag.dets")}, {type, bag}, {keypos, 2}]),
    ok = dets:insert(b, [{r, I rem 40, I, <<"v", I:16>>} || I <- lists:seq(1, 900)]),
    ok = dets:delete_object(b, {r, 3, 3, <<"v", 3:16>>}),
    ok = dets:close(b),
    {ok, c} = dets:open_file(c, [{file, F("dupbag.dets")}, {type, duplicate_bag}]),
    ok = dets:insert(c, [{atom_key, I} || I <- lists:seq(1, 30)] ++ [{atom_key, 1}, {"str", 2.5}, {<<"bin">>, []}]),
    ok = dets:close(c),
    {ok, d} = dets:open_file(d, [{file, F("minslots.dets")}, {min_no_slots, 5000}]),
    ok = dets:insert(d, [{K, x} || K <- [a, 'b c', -1, 1 bsl 70, 3.5, <<>>, [], {}, {1, [2]}, "text", <<1:3>>]]),
    ok = dets:close(d),
    {ok, e} = dets:open_file(e, [{file, F("repaired.dets")}]),
    ok = dets:insert(e, [{I, I * I} || I <- lists:seq(1, 700)]),
    ok = dets:close(e),
    {ok, Fd} = file:open(F("repaired.dets"), [read, write, binary, raw]),
    ok = file:pwrite(Fd, 8, <<0:32>>),
    ok = file:close(Fd),
    {ok, e2} = dets:open_file(e2, [{file, F("repaired.dets")}]),
    ok = dets:close(e2),
    {ok, g} = dets:open_file(g, [{file, F("emptied.dets")}]),
    ok = dets:insert(g, [{I, I} || I <- lists:seq(1, 100)]),
    ok = dets:delete_all_objects(g),
    ok = dets:close(g),
    {ok, h} = dets:open_file(h, [{file, F("twoparts.dets")}, {min_no_slots, 140000}]),
    ok = dets:insert(h, [{I} || I <- lists:seq(1, 2000)]),
    ok = dets:close(h).
"""

LOOKUP = r"""#!/usr/bin/env escript
%% open each file, look every object of the original up: all_found | {missing, N} | {error, _}
main([Orig | Files]) ->
    {ok, o} = dets:open_file(o, [{file, Orig}, {access, read}]),
    Kp = dets:info(o, keypos),
    Objs = dets:foldl(fun(O, A) -> [O | A] end, [], o),
    ok = dets:close(o),
    lists:foreach(fun(F) ->
        R = case catch dets:open_file(t, [{file, F}, {keypos, Kp}]) of
                {ok, t} ->
                    Bad = [O || O <- Objs, not lists:member(O, case dets:lookup(t, element(Kp, O)) of
                                                                   L when is_list(L) -> L; _ -> [] end)],
                    _ = dets:close(t),
                    case Bad of [] -> all_found; _ -> {missing, length(Bad)} end;
                Err -> {error, element(1, element(2, Err))}
            end,
        io:format("~s ~0p~n", [filename:basename(F), R])
    end, Files).
"""


@pytest.fixture(scope="module")
def otp_tables(tmp_path_factory) -> Path:
    _erl()
    out = tmp_path_factory.mktemp("otp-tables")
    (out / "gen.escript").write_text(GEN)
    subprocess.run(["escript", str(out / "gen.escript"), str(out)], check=True, capture_output=True, timeout=120)
    return out


GENERATED = [
    "grown_set.dets",
    "bag.dets",
    "dupbag.dets",
    "minslots.dets",
    "repaired.dets",
    "emptied.dets",
    "twoparts.dets",
]


@pytest.mark.parametrize("name", GENERATED)
def test_no_finding_on_tables_otp_writes(otp_tables, name):
    """Crafted by the local OTP: a grown set with deletes reopened and written again, a bag and a
    duplicate_bag (keypos 2), odd keys (bignum, float, bitstring, tuple) with min_no_slots 5000, a
    repaired table, an emptied one, one with two segment-array parts."""
    path = otp_tables / name
    data = path.read_bytes()
    assert dets.structure_findings(path, data) == []
    check = dets._Check(path, data)
    check.run()
    h = dets.Header.parse(data[: dets.HEADSZ])
    assert check.complete and (check.found_objects, check.found_keys) == (h.no_objects, h.no_keys)


@pytest.mark.parametrize("name", ["bag.dets", "dupbag.dets", "grown_set.dets"])
def test_marker_scan_counts_bag_objects(otp_tables, name):
    """Crafted by the local OTP: a bag's and a duplicate_bag's blocks group their objects by key
    (<<KeySize, Objects>>): the marker scan finds every object the header counts, so the count
    check says nothing; one object's size word broken, it counts one less."""
    path = otp_tables / name
    data = path.read_bytes()
    (recorded,) = struct.unpack_from(">I", data, 32)
    found = list(terms._dets_objects(data))
    assert len(found) == recorded and terms.dets_findings(path) == []
    at = found[len(found) // 2][0]
    broken = bytearray(data)
    broken[at : at + 4] = bytes(4)
    assert len(list(terms._dets_objects(bytes(broken)))) < recorded


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, words",
    [
        ("grown_set.dets", None),  # five segments, two grown after creation, a reopened table (base word 0)
        ("bag.dets", None),
        ("twoparts.dets", None),  # two parts, 1024 segments
    ],
)
def test_flips_in_tables_otp_writes(otp_tables, name, words):
    """Crafted: the flip test on OTP-written shapes the samples lack (a sample of their words and bits:
    each flip re-reads thousands of objects)."""
    data = (otp_tables / name).read_bytes()
    rnd = random.Random(3)
    all_words = _structural_words(data, sample=8)
    picked = [w for w in all_words if w[0] == "part pointer"] + rnd.sample(all_words, 50)
    missed = []
    for what, word in picked:
        for bit in rnd.sample(range(32), 4):
            if (word, bit) in EXCEPTIONS:
                continue
            found = _findings(_flip(data, word, bit), name)
            if not _near(found, word):
                missed.append((what, word, bit, [(f.offset, f.message[:80]) for f in found][:2]))
    assert not missed, missed[:10]


def test_otp_agrees_on_what_it_ignores(tmp_path):
    """Crafted: flipped copies of a real recovery.dets opened by the local OTP. The flips reported as
    info (reserved header bytes, unused part and segment pointers) and the closed flag's bit 0 lose
    no object; a flipped slot pointer loses one; a flipped empty-slot pointer or header field makes
    the table unusable (checked on lookup of the stored keys or at open)."""
    _erl()
    data = _sample(RECOVERY)
    (tmp_path / "lookup.escript").write_text(LOOKUP)
    orig = tmp_path / "orig.dets"
    orig.write_bytes(data)
    cases = {
        "closed": (8, 0),
        "reserved": (200, 3),
        "unused_part": (788, 2),
        "unused_segment": (1388, 4),
        "slot_pointer": (3452, 10),
        "header_next": (24, 3),
        "segment_pointer": (1336, 4),
    }
    files = []
    for name, (word, bit) in cases.items():
        (tmp_path / name).write_bytes(_flip(data, word, bit))
        files.append(str(tmp_path / name))
    out = subprocess.run(
        ["escript", str(tmp_path / "lookup.escript"), str(orig), *files],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    otp = dict(line.split(" ", 1) for line in out.splitlines() if line.split(" ", 1)[0] in cases)
    assert 'closed" not properly closed, repairing' in out  # OTP repairs the table whose flag lost bit 0
    assert otp == {
        "closed": "all_found",
        "reserved": "all_found",
        "unused_part": "all_found",
        "unused_segment": "all_found",
        "slot_pointer": "{missing,1}",
        "header_next": "{error,not_a_dets_file}",
        "segment_pointer": "{missing,18}",
    }, otp
    severities = {
        name: {f.severity for f in dets.structure_findings(P(name), (tmp_path / name).read_bytes())} for name in cases
    }
    assert severities == {
        "closed": set(),
        "reserved": {"info"},
        "unused_part": {"info"},
        "unused_segment": {"info"},
        "slot_pointer": {"warning"},
        "header_next": {"warning"},
        "segment_pointer": {"warning"},
    }


# -- 3. hostile files ---------------------------------------------------------------------------


def _timed(data, path: Path | None = None, limit: float = 20.0):
    t = time.monotonic()
    found = dets.structure_findings(path or P("hostile.dets"), data)
    assert time.monotonic() - t < limit
    return found


def _with_md5(head: bytearray) -> bytearray:
    """A header whose MD5 matches its fields (so the walk trusts them)."""
    head[dets.MD5_AT : dets.MD5_AT + 16] = hashlib.md5(bytes(head[12 : dets.MD5_AT])).digest()
    return head


def test_garbage_after_a_valid_header():
    """Crafted: a real header, then random bytes (10 seeds)."""
    head = _sample(RECOVERY)[: dets.HEADEND]
    for seed in range(10):
        rnd = random.Random(seed)
        data = head + bytes(rnd.getrandbits(8) for _ in range(rnd.choice([100, 3000, 20000])))
        found = _timed(data)
        assert found, seed


def test_pointers_into_the_header_and_pointer_cycles():
    """Crafted: a part pointer into the header or at the part array itself; every part pointer naming
    part 0; segment 0 pointing at its own part (its slots are the part's words); a slot pointing at its own
    segment or into the header; every slot pointing at slot 8's block."""
    data = _sample(RECOVERY)
    seg = struct.unpack_from(">I", data, 1336)[0]
    cases = {
        "part into header": {312: 16},
        "part at itself": {312: 312},
        "segment at its part": {1336: 1336},
        "every part pointer at part 0": {312 + 4 * i: 1336 for i in range(256)},
        "a part pointer at the segment": {316: seg},
        "slot at its segment": {seg + 8 * 8 + 4: seg},
        "slot at the header": {seg + 8 * 8 + 4: 0x20},
    }
    for name, words in cases.items():
        b = bytearray(data)
        for off, value in words.items():
            struct.pack_into(">I", b, off, value)
        found = _timed(bytes(b))
        assert found, name
    b = bytearray(data)
    first = struct.unpack_from(">II", data, seg + 8 * 8)
    for k in range(256):
        struct.pack_into(">II", b, seg + 8 * k, *first)
    found = _timed(bytes(b))
    assert any("the block of slot 8 (its keys hash there)" in f.message for f in found)
    assert sum(1 for f in found if f.details.get("check") == "slot") == dets.MAX_REPORTED + 1  # + "N more"


def _sparse(path: Path, head: bytes, size: int) -> Path:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def test_a_64mb_sparse_file_with_a_valid_header(tmp_path):
    """Crafted: a real table's first 5432 bytes (header, part, segment) in a 64 MB sparse file."""
    head = _sample(RECOVERY)[:5432]
    path = _sparse(tmp_path / "sparse.dets", head, 64 << 20)
    found = _timed(map_file(path), path)
    assert found


def test_a_header_that_claims_every_slot(tmp_path):
    """Crafted: 2^25 slots (256 parts, 131072 segments) with a matching MD5, part pointers spread over a
    64 MB sparse file of zeros and garbage: bounded time and findings."""
    head = bytearray(_sample(RECOVERY)[: dets.BASE])
    struct.pack_into(">IIIII", head, 20, 1 << 25, 1 << 25, 1, 0, 0)  # m, next, keypos, objects, keys
    struct.pack_into(">III", head, 40, 256, 1 << 25, 1)
    struct.pack_into(">I", head, 52, 0)
    head[56:168] = bytes(112)
    _with_md5(head)
    for i in range(256):
        struct.pack_into(">I", head, 312 + 4 * i, dets.BASE + 2048 * i)
    struct.pack_into(">I", head, 0, 60 << 20)
    path = _sparse(tmp_path / "big.dets", bytes(head) + os.urandom(4096), 64 << 20)
    found = _timed(map_file(path), path, limit=60.0)
    assert found and len(found) <= 6 * (dets.MAX_REPORTED + 1)


def test_a_1gb_sparse_file(tmp_path):
    """Crafted: a real header and part array in a 1 GB sparse file, the free-list pointer near its end."""
    head = bytearray(_sample(RECOVERY)[:5432])
    struct.pack_into(">I", head, 0, (1 << 30) - 64)
    path = _sparse(tmp_path / "huge.dets", bytes(head), 1 << 30)
    found = _timed(map_file(path), path, limit=60.0)
    assert found


def test_a_1gb_table_whose_free_lists_were_moved_to_its_end(tmp_path):
    """Crafted: a real table's data, then a 1 GB sparse hole, then its free lists and size word (the
    header's free-list pointer and the size word updated). The hole lies in free buddy blocks, so this
    is a valid table OTP opens as it is (a table closed after its last objects were deleted looks the
    same): the whole walk, marker scan and buddy check run over 1 GB, in bounded time, and say nothing."""
    data = _sample(RECOVERY)
    fl = struct.unpack_from(">I", data, 0)[0]
    base = struct.unpack_from(">I", data, dets.FL_BASE_AT)[0]
    lists = data[fl:-4]
    size = 1 << 30
    path = tmp_path / "moved.dets"
    with open(path, "wb") as f:
        f.write(struct.pack(">I", size - 4 - len(lists)) + data[4:fl])
        f.seek(size - 4 - len(lists))
        f.write(lists + struct.pack(">I", size - base))
    found = _timed(map_file(path), path, limit=60.0)
    assert found == [], [f.message for f in found]
    assert terms.dets_findings(path) == []


@pytest.mark.slow
def test_segments_full_of_slots_naming_one_block():
    """Crafted: 2^18 slots in 1024 segments, every one naming the same object block, under a header
    whose MD5 matches: the slot walk stops at its bound and the findings are capped."""
    src = _sample(RECOVERY)
    head = bytearray(src[: dets.BASE])
    struct.pack_into(">IIIII", head, 20, 1 << 18, 1 << 18, 1, 0, 0)
    struct.pack_into(">IIII", head, 40, 256, 1 << 25, 1, 0)
    head[56:168] = bytes(112)
    head[dets.FL_BASE_AT : dets.HEADSZ] = bytes(4)
    head[dets.HEADEND : dets.BASE] = bytes(1024)
    struct.pack_into(">II", head, dets.HEADEND, 1336, 3384)
    _with_md5(head)
    parts = b"".join(struct.pack(">I", 5432 + 2048 * j) for j in range(1024)) + bytes(0)
    block_at = 5432 + 2048 * 1024
    body = bytearray(bytes(head) + parts + struct.pack(">II", 214, block_at) * (256 * 1024) + src[5432 : 5432 + 256])
    struct.pack_into(">I", body, 0, len(body))
    body += struct.pack(">III", 12, dets.FREE, dets.ENDFREE)
    body += struct.pack(">I", len(body) + 4)
    found = _timed(bytes(body), limit=60.0)
    assert 1 <= len(found) <= dets.MAX_REPORTED + 1 and found[-1].details["more"] > dets.MAX_SLOTS


def test_short_and_foreign_files():
    """Crafted: files too short for a header, and files that are no DETS table (left to dets_findings)."""
    data = _sample(RECOVERY)
    assert dets.structure_findings(P("t"), b"") == []
    assert dets.structure_findings(P("t"), b"\0" * 100) == []
    assert [f.details["check"] for f in dets.structure_findings(P("t"), data[:100])] == ["truncated"]
    assert [f.details["check"] for f in dets.structure_findings(P("t"), data[:2000])] == ["truncated"]
    found = dets.structure_findings(P("t"), data[:6000])  # cut inside the objects: the slots say so
    assert found
