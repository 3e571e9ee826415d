"""The compiled term decoder (core/src/etf.rs, ``compiled.decode_term``) against the reference
(``codecs.etf.decode``): on every Ra log entry of every quorum sample (WAL records and segment
entries), every stored message term, every disk_log item (``decode_term_at``), and seeded damage of them, it gives the reference's value,
of the reference's types (atoms with their encoding, pids and references as ``Opaque``,
``ImproperList``), or leaves the term to the reference (None); never another value. The core is
built by ``pip install .``; without it these tests skip (CQF_NO_SKIP=1 in CI fails them)."""

from __future__ import annotations

import random

import pytest

from cqforensics import compiled as core
from cqforensics.codecs import etf
from cqforensics.grammar import disklog as c_disklog
from cqforensics.readers import ra_segment as r_seg
from cqforensics.readers import ra_wal as r_wal
from cqforensics.readers import terms as r_terms
from support import skip_or_fail
from support.terms import sample_files, stored_bodies
from support.terms import shape as _shape


@pytest.fixture(autouse=True)
def _need_core():
    if core.native() is None:
        skip_or_fail(f"the compiled core is not available: {core.status()}")


def _ra_entries() -> list[bytes]:
    out = []
    for p in sample_files(".wal"):
        scan, data = r_wal.walk(p), p.read_bytes()
        out += [bytes(r_wal.record_data(data, scan, i)) for i in range(len(scan))]
    for p in sample_files(".segment"):
        if "/quorum/" not in str(p):
            continue
        seg, data = r_seg.read_segment(p), p.read_bytes()
        out += [bytes(r_seg.entry_data(data, seg, i)) for i in range(len(seg))]
    return out


def _agrees(b: bytes) -> bool:
    """Whether the core gives the reference's value for ``b`` (True) or leaves it (False)."""
    got = core.decode_term(b)
    if got is None:
        return False
    want, _ = etf.decode(b)  # the core decided a term the reference must decode too
    assert _shape(got) == _shape(want), b[:64]
    return True


def test_every_ra_log_entry_of_the_samples_is_decoded_as_the_reference_does():
    entries = _ra_entries()
    assert len(entries) > 5000
    decided = sum(_agrees(b) for b in entries)
    assert decided == len(entries)  # plain terms, pids and references: none left to the reference


def test_stored_message_terms_are_decoded_as_the_reference_does_or_left_to_it():
    bodies = [b for b in stored_bodies() if b[:1] == bytes([etf.VERSION])]
    assert sum(_agrees(b) for b in bodies) > len(bodies) // 2


@pytest.mark.parametrize("seed", range(4))
def test_damaged_terms_get_the_reference_value_or_go_to_it(seed):
    """Seeded byte flips, cuts and junk in Ra entries and message terms: the core's value, when
    it gives one, is the reference's, and it never gives one where the reference raises."""
    rng = random.Random(seed)
    pool = _ra_entries()[::7] + [b for b in stored_bodies() if b[:1] == bytes([etf.VERSION])][::5]
    for b in rng.sample(pool, min(400, len(pool))):
        d = bytearray(b)
        how = rng.randrange(3)
        if how == 0:
            for _ in range(rng.randint(1, 3)):
                d[rng.randrange(1, len(d))] = rng.randrange(256)
        elif how == 1:
            del d[rng.randrange(1, len(d)) :]
        else:
            d[rng.randrange(1, len(d))] = rng.choice([104, 105, 108, 116, 110, 107, 88, 90])  # a tag
        d = bytes(d)
        got = core.decode_term(d)
        try:
            want = etf.decode(d)[0]
        except etf.EtfError:
            assert got is None, d[:64]
            continue
        if got is not None:
            assert _shape(got) == _shape(want), d[:64]


@pytest.mark.parametrize(
    "term",
    [
        bytes([131, 108, 0, 0, 0, 1, 97, 5, 106]),  # [5]
        bytes([131, 108, 0, 0, 0, 1, 97, 5, 107, 0, 0]),  # [5 | ""]: proper (the tail is [])
        bytes([131, 108, 0, 0, 0, 1, 97, 5, 108, 0, 0, 0, 0, 106]),  # [5 | []] written as a list
        bytes([131, 108, 0, 0, 0, 1, 97, 5, 97, 7]),  # [5 | 7]: improper
        bytes([131, 108, 0, 0, 0, 1, 97, 5, 107, 0, 1, 9]),  # [5 | [9]] (a string tail): improper
    ],
)
def test_list_tails_are_decided_as_the_reference_decides_them(term):
    """Crafted: a list's tail that decodes to the empty list, whatever its tag, makes a proper list
    (the reference's ``tail == []``); any other tail an ``ImproperList``."""
    assert _agrees(term)


def test_a_run_of_terms_is_decoded_as_each_term_is_alone():
    """``decode_terms`` (one call for many terms, each atom made once per run: the replay's
    batches) gives for each buffer what ``decode_term`` gives it alone, value and type: on every
    Ra log entry of the samples, seeded damage of them, and buffers that are no term at all
    (empty, one byte, another version byte), which give None."""
    rng = random.Random(7)
    entries = _ra_entries()
    damaged = []
    for b in rng.sample(entries, 300):
        d = bytearray(b)
        d[rng.randrange(1, len(d))] = rng.randrange(256)
        damaged.append(bytes(d))
    crafted = [b"", bytes([131]), bytes([130, 97, 1]), bytes([131, 80, 0, 0, 0, 1, 120])]
    crafted += [bytes([131, tag, 2]) + b"ok" for tag in (115, 119)] * 2  # one name, Latin-1 then UTF-8
    run = entries + damaged + crafted
    rng.shuffle(run)
    got = core.decode_terms(run)
    assert len(got) == len(run)
    for b, g in zip(run, got):
        alone = core.decode_term(b)
        assert (g is None) == (alone is None), b[:64]
        if g is not None:
            assert _shape(g) == _shape(alone), b[:64]
    assert sum(g is not None for g in got) >= len(entries)  # every sample entry is decided in a run too


def _disk_log_items() -> list[tuple[bytes, int, int]]:
    """(the file's bytes, where the item's term starts, where the item ends) of every item of
    every disk_log of the samples (Mnesia's .LOG, .DCD and .DCL files, the stores' .ets dumps)
    and every object of their DETS tables."""
    out = []
    for suffix in (".LOG", ".DCD", ".DCL", ".ets"):
        for p in sample_files(suffix):
            data = p.read_bytes()
            for o in r_terms.read_disk_log(p, data).offsets:
                length, _ = c_disklog.ITEM_HEAD.unpack_from(data, o)
                start = o + 8 + (16 if length >= c_disklog.MIN_MD5_TERM else 0)
                out.append((data, start, start + length))
    for p in sample_files(".dets"):  # <<ObjSize:32, Term>> objects, ObjSize counting itself
        data = p.read_bytes()
        for o, _ in r_terms._dets_objects(data):
            out.append((data, o + 4, o + int.from_bytes(data[o : o + 4], "big")))
    return out


def test_every_disk_log_item_and_dets_object_is_decoded_in_place_as_the_reference_does():
    """``decode_term_at`` (a term inside a file's bytes, read by ``readers.terms`` for the items
    of Mnesia's logs and the store dumps, and DETS objects) gives the reference's value and end
    on every item of the samples; an item cut one byte short, or with a byte changed, gets the
    reference's value and end or is left to it, never another."""
    items = _disk_log_items()
    assert len(items) > 1000
    rng = random.Random(3)
    for data, start, end in items:
        got = core.decode_term_at(data, start, end)
        want, used = etf.decode(data, offset=start)
        assert got is not None and (_shape(got[0]), got[1]) == (_shape(want), used) == (_shape(want), end)
        assert core.decode_term_at(data, start, end - 1) is None  # the term runs past the cut
        d = bytearray(data)
        d[rng.randrange(start + 1, end)] = rng.randrange(256)
        got = core.decode_term_at(bytes(d), start, end)
        if got is None:
            continue
        want, used = etf.decode(bytes(d), offset=start)  # the core decided: the reference decodes it too
        assert (_shape(got[0]), got[1]) == (_shape(want), used)
