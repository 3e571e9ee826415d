"""The compiled core (core/, Rust) against the Python reference it mirrors: equal results on
every sample, on damaged variants and on fuzzed bytes, function by function and table by
table. The core is built by ``pip install .``; without it these tests skip (CQF_NO_SKIP=1 in CI
makes that a failure)."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import cqforensics
from cqforensics import compiled as core
from cqforensics.readers import qs as r_qs
from cqforensics.readers import rdq as r_rdq
from cqforensics.readers.files import read_bytes
from cqforensics.tables import builders as tables
from support import ROOT, SAMPLES, dataset_params, skip_or_fail
from support.oracle import datasets
from support.terms import sample_files, stored_bodies


@pytest.fixture(autouse=True)
def _need_core():
    if core.native() is None:
        skip_or_fail(f"the compiled core is not available: {core.status()}")


def _same_walk(data: bytes, path: Path = Path("x.rdq"), referenced: r_rdq.Referenced | None = None):
    ref = r_rdq.walk(path, 0, data, reference=True, referenced=referenced)
    new = r_rdq.walk(path, 0, data, referenced=referenced)
    assert np.array_equal(ref.offsets, new.offsets)
    assert np.array_equal(ref.totals, new.totals)
    assert ref.msg_ids.tobytes() == new.msg_ids.tobytes()
    assert [(h.offset, h.length, h.kind) for h in ref.holes] == [(h.offset, h.length, h.kind) for h in new.holes]
    assert [(o, t, bytes(i)) for o, t, i in ref.bad_markers] == [(o, t, bytes(i)) for o, t, i in new.bad_markers]
    assert [(o, t, bytes(i), w, h) for o, t, i, w, h in ref.rejected] == [
        (o, t, bytes(i), w, h) for o, t, i, w, h in new.rejected
    ]
    return ref


def _some_ids(data: bytes, rng: random.Random) -> r_rdq.Referenced:
    """A random share of the ids a walk of ``data`` finds, plus ids of 16 bytes taken at random
    places of it (so candidates met inside damage are sometimes 'referenced' too)."""
    f = r_rdq.walk(Path("x.rdq"), 0, data)
    ids = [bytes(i) for i in f.msg_ids.tolist() if rng.random() < 0.7]
    ids += [data[k : k + 16] for k in (rng.randrange(max(1, len(data) - 16)) for _ in range(20)) if len(data) >= 16]
    return r_rdq.Referenced(np.frombuffer(b"".join(ids), "V16")) if ids else r_rdq.Referenced(np.zeros(0, "V16"))


def test_core_reports_its_state():
    assert core.status() == "on"
    assert core.native().ABI == core.ABI


@pytest.mark.slow
def test_rust_unit_tests():
    cargo = shutil.which("cargo")
    if cargo is None:
        skip_or_fail("cargo is not installed")
    # the test profile (core/Cargo.toml), not --release: building the tests is most of the time (its
    # dependencies are built from nothing: no other build uses that profile or pyo3 without extension-module)
    r = subprocess.run(
        [cargo, "test", "--lib", "--quiet", "--manifest-path", str(ROOT / "core" / "Cargo.toml")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def test_walk_equals_reference_on_every_sample_file():
    files = sample_files(".rdq")
    assert len(files) >= 10
    rng = random.Random(13)
    for p in files:
        _same_walk(read_bytes(p), p)
        _same_walk(read_bytes(p), p, _some_ids(read_bytes(p), rng))


def test_referenced_directory_places_every_prefix():
    """``Referenced.directory``, which the compiled walk narrows each lookup with: entry b is
    where the ids whose first two bytes are b or more start (crafted ids at both ends of the
    prefix range, repeated prefixes, and none), and it follows ``sorted`` when that is
    replaced (VhostScan.trusted sets it share by share)."""
    rng = random.Random(5)
    ids = [bytes([0, 0]) + rng.randbytes(14), bytes([0xFF, 0xFF]) + rng.randbytes(14)]
    ids += [bytes([7, 9]) + rng.randbytes(14) for _ in range(20)] + [rng.randbytes(16) for _ in range(3000)]
    ref = r_rdq.Referenced(np.frombuffer(b"".join(ids), "V16"))
    for refs in (ref, r_rdq.Referenced(np.zeros(0, "V16"))):
        prefixes = np.frombuffer(refs.sorted, ">u2")[::8].astype(np.int64)
        want = np.searchsorted(prefixes, np.arange((1 << 16) + 1))
        assert np.array_equal(np.frombuffer(refs.directory, np.uint32), want)
    ref.sorted = ref.sorted[16:]  # replaced: made again
    assert np.frombuffer(ref.directory, np.uint32)[1] == 0


def _mutations(data: bytes, rng: random.Random, n: int):
    """Damaged copies of real bytes: zeroed ranges, bit flips, truncations, garbage, splices."""
    for _ in range(n):
        b = bytearray(data)
        what = rng.randrange(6)
        if not b:
            yield bytes(rng.randbytes(rng.randrange(200)))
            continue
        at = rng.randrange(len(b))
        if what == 0:
            ln = rng.randrange(1, 70000)
            b[at : at + ln] = bytes(len(b[at : at + ln]))
        elif what == 1:
            for _ in range(rng.randrange(1, 40)):
                k = rng.randrange(len(b))
                b[k] ^= 1 << rng.randrange(8)
        elif what == 2:
            del b[at:]
        elif what == 3:
            b[at:at] = rng.randbytes(rng.randrange(1, 300))
        elif what == 4:
            b[at:at] = b[rng.randrange(len(b)) :][: rng.randrange(1, 5000)]  # a duplicated slice
        else:
            b[at : at + 8] = rng.choice([b"\xff" * 8, (2**40).to_bytes(8, "big"), (17).to_bytes(8, "big")])
        yield bytes(b)


@pytest.mark.slow
def test_walk_equals_reference_on_damaged_and_random_bytes():
    rng = random.Random(15)
    files = sample_files(".rdq")
    cases = 0
    for p in files:
        for data in _mutations(read_bytes(p), rng, 25):
            _same_walk(data)
            _same_walk(data, referenced=_some_ids(data, rng))
            cases += 1
    for n in range(300):  # random bytes rich in 0xff markers and small sizes
        data = bytes(
            rng.choice((0, 0, 0, 255, 16, 17, 131, 104, rng.randrange(256))) for _ in range(rng.randrange(2000))
        )
        _same_walk(data)
        _same_walk(data, referenced=_some_ids(data, rng))
        cases += 1
    assert cases > 500


def test_walk_skips_the_holes_of_a_sparse_file_like_the_reference(tmp_path):
    data = read_bytes(sample_files(".rdq")[0])
    p = tmp_path / "0.rdq"
    with open(p, "wb") as f:
        f.write(data)
        f.seek(r_rdq._SPARSE_MIN + (1 << 20))  # a hole, then the same entries again
        f.write(data)
    _same_walk(read_bytes(p), p)
    ref = r_rdq.walk(p, 0, reference=True)
    new = r_rdq.walk(p, 0)
    assert np.array_equal(ref.offsets, new.offsets) and len(new.offsets) >= 2


def test_check_qs_equals_reference():
    files = sample_files(".qs")
    assert files
    rng = random.Random(3)
    for p in files:
        for data in [read_bytes(p), *_mutations(read_bytes(p), rng, 10)]:
            true = [row["offset"] for row, _ in r_qs.dump_rows(p) if row["kind"] == "entry"]
            sizes = [int.from_bytes(data[o : o + 4], "big") if o + 4 <= len(data) else 0 for o in true]
            offs = true + [rng.randrange(-10, len(data) + 100) for _ in range(200)]
            sizes += [rng.randrange(-5, 5000) for _ in range(200)]
            assert np.array_equal(
                r_qs.check_entries(data, offs, sizes, reference=True), r_qs.check_entries(data, offs, sizes)
            )


def _qs_mutations(data: bytes, rng: random.Random, n: int):
    """``_mutations`` plus damage aimed at entry headers: wrong sizes, flags, CRCs, reserved
    bytes and a term tag moved (the bytes the scan's resynchronisation keys on)."""
    yield from _mutations(data, rng, n)
    entries = [o for kind, o, _, _ in r_qs.scan_entries(data, r_qs.first_entry_offset()) if kind == "entry"] or [64]
    for _ in range(n):
        b = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            o = rng.choice(entries) + rng.randrange(9)
            if o < len(b):
                b[o] = rng.choice((0, 1, 2, 131, 255, rng.randrange(256)))
        yield bytes(b)


def test_qs_garbage_runs_equal_reference():
    """Crafted and damaged bytes: the core's garbage runs of a .qs segment (findings
    qs-garbage / qs-trailing-garbage) equal the reference scan's, with and without a sparse
    file's holes, whatever the number of runs per call."""
    files = sample_files(".qs")
    assert files
    rng = random.Random(29)
    cases = runs = 0
    header = read_bytes(files[0])[:64]
    for p in files:
        for data in [read_bytes(p), *_qs_mutations(read_bytes(p), rng, 15)]:
            holes = None
            if rng.random() < 0.3 and len(data) > 200:  # crafted: pretend ranges are a sparse file's holes
                a = rng.randrange(64, len(data) - 100)
                holes = [(0, a), (a + rng.randrange(1, 90), len(data) + rng.randrange(0, 50))]
            ref = list(r_qs.garbage_in(data, 0, holes, reference=True))
            assert list(r_qs.garbage_in(data, 0, holes)) == ref
            assert list(r_qs.garbage_in(data, 0, holes, per_call=1)) == ref
            cases, runs = cases + 1, runs + len(ref)
    for _ in range(300):  # crafted: a valid header, then random bytes rich in the scan's key bytes
        data = header + bytes(
            rng.choice((0, 0, 0, 0, 1, 131, 131, 104, 255, rng.randrange(256))) for _ in range(rng.randrange(3000))
        )
        ref = list(r_qs.garbage_in(data, 0, None, reference=True))
        assert list(r_qs.garbage_in(data, 0, None, per_call=rng.choice((1, 2, 4096)))) == ref
        cases, runs = cases + 1, runs + len(ref)
    assert cases > 300 and runs > 100


def _same_chunk(path: Path) -> None:
    """The core's and the reference's reading of one .qi: segment facts, findings, records."""
    from dataclasses import fields

    from cqforensics.model import index as m_index

    number = int(path.stem) if path.stem.isdigit() else 0
    ref, new = (m_index._v2_chunk(None, number, path, reference=r) for r in (True, False))
    assert [(f.code, f.message, f.file, f.offset, f.severity, f.details) for f in new.findings] == [
        (f.code, f.message, f.file, f.offset, f.severity, f.details) for f in ref.findings
    ]
    for f in fields(m_index.Records):
        a, b = getattr(ref.rec, f.name), getattr(new.rec, f.name)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f.name
    for f in fields(m_index.AckRecords):
        assert getattr(ref.acks, f.name).tobytes() == getattr(new.acks, f.name).tobytes(), f.name
    assert np.array_equal(ref.live, new.live) and ref.errors == new.errors and ref.header == new.header
    assert ref.bad_segments == new.bad_segments


@pytest.mark.slow
def test_qi_decode_equals_reference(tmp_path):
    """Every sample .qi, damaged copies and crafted slots: the core's slot decode gives the
    reference's findings, records, acks and live entries, byte for byte."""
    files = sample_files(".qi")
    assert files
    rng = random.Random(31)
    cases = 0
    for p in files:
        _same_chunk(p)
        for k, data in enumerate(_mutations(read_bytes(p), rng, 6)):
            q = tmp_path / f"{p.stem}.qi"
            q.write_bytes(data)
            _same_chunk(q)
            cases += 1
    head = read_bytes(files[0])[:64]
    for k in range(200):  # crafted: slots of bytes the classification keys on, copies of each other
        slots = [
            bytes(rng.choice((0, 0, 0, 1, 2, 254, 255, rng.randrange(256))) for _ in range(32))
            for _ in range(rng.randrange(1, 40))
        ]
        slots += [rng.choice(slots) for _ in range(rng.randrange(4))]  # duplicate slots
        rng.shuffle(slots)
        q = tmp_path / "0.qi"
        q.write_bytes(head + b"".join(slots) + rng.randbytes(rng.choice((0, 0, 5))))
        _same_chunk(q)
        cases += 1
    assert cases > 300


def test_read_spans_equals_slicing(tmp_path):
    """Spans of files read into one binary column (the ``store`` table's terms) hold what
    slicing each file gives: in and out of order, far apart, repeated, overlapping, past the
    end of the file, from buffers and from open files, with null rows."""
    rng = random.Random(37)
    files = sample_files(".rdq")[:3]
    datas = [read_bytes(p) for p in files] + [rng.randbytes(5000)]
    paths = []
    for k, d in enumerate(datas):
        paths.append(tmp_path / f"{k}.bin")
        paths[-1].write_bytes(d)
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    try:
        for case in range(60):
            n = rng.randrange(0, 300)
            fi = np.array([rng.randrange(-1, len(datas)) for _ in range(n)], np.int32)
            starts = np.array(
                [
                    rng.randrange(0, len(datas[f]) + 50)
                    if rng.random() < 0.5
                    else (rng.randrange(0, 200) * 1000) % (len(datas[f]) + 1)
                    for f in fi.tolist()
                ],
                np.int64,
            )
            lengths = np.array(
                [rng.choice((0, 1, rng.randrange(1, 100), rng.randrange(1, 3 << 20))) for _ in range(n)], np.int64
            )
            if rng.random() < 0.5:  # runs of nearby spans, as a store's entries are
                order = np.lexsort((starts, fi))
                fi, starts, lengths = fi[order], starts[order], lengths[order]
            want = [
                None if f < 0 else datas[f][s : s + ln]
                for f, s, ln in zip(fi.tolist(), starts.tolist(), lengths.tolist())
            ]
            for sources in (datas, fds):
                got = core.read_spans(list(sources), fi, starts, lengths)
                assert got.to_pylist() == want
    finally:
        for fd in fds:
            os.close(fd)
    # a store's terms in file order (a read per run of up to 1024 pieces, the gaps between
    # them skipped), of the sample file with the most entries: every entry, every third, and
    # every other one with the last cut where the file ends
    path = max(sample_files(".rdq"), key=lambda p: p.stat().st_size)
    data = read_bytes(path)
    offsets, totals, *_ = core.walk_rdq(data)
    assert len(offsets) > 500
    # and 6000 short spans 25 bytes apart (made up): more pieces than one read takes
    small = tmp_path / "small.bin"
    small.write_bytes(rng.randbytes(6000 * 125))
    fds = [os.open(path, os.O_RDONLY), os.open(small, os.O_RDONLY)]
    cases = [(0, data, offsets[::step] + 24, totals[::step] - 25) for step in (1, 3, 2)]
    cases.append((1, small.read_bytes(), np.arange(6000, dtype=np.int64) * 125, np.full(6000, 100, np.int64)))
    try:
        for f, content, starts, lengths in cases:
            lengths[-1] += 10
            got = core.read_spans(fds, np.full(len(starts), f, np.int32), starts, lengths)
            assert got.to_pylist() == [content[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist())]
    finally:
        for fd in fds:
            os.close(fd)


# -- message decode --------------------------------------------------------------------------------


def _compare_decode(terms: list[bytes], index_ids: list, bodies: bool = True) -> int:
    """Core-decoded rows equal the reference's; returns how many rows the core decoded."""
    n = len(terms)
    has_id = np.array([i is not None for i in index_ids], np.uint8)
    status, cols = core.decode_messages(
        terms,
        np.arange(n, dtype=np.int32),
        np.zeros(n, np.int64),
        np.array([len(t) for t in terms], np.int64),
        b"".join(i or bytes(16) for i in index_ids),
        has_id,
        bodies,
    )
    ref = tables._arrays(tables.decode_reference(terms, index_ids, bodies))
    rows = pa.array(np.flatnonzero(status == 0))
    for k, col in cols.items():
        got, want = col.take(rows), ref[k].take(rows)
        if not got.equals(want):
            bad = next(j for j in range(len(got)) if got[j] != want[j])
            raise AssertionError(f"{k} of term {rows[bad]}: core {got[bad]!r:.300} != reference {want[bad]!r:.300}")
    return len(rows)


@pytest.mark.slow
def test_decode_equals_reference_on_every_stored_message():
    terms = list(stored_bodies())
    assert len(terms) > 5000
    rng = random.Random(1)
    ids = [None if rng.random() < 0.5 else (t[-40:-24] if rng.random() < 0.5 else rng.randbytes(16)) for t in terms]
    decoded = _compare_decode(terms, ids)
    assert decoded > 0.8 * len(terms), f"the core decoded only {decoded} of {len(terms)}"
    _compare_decode(terms[:500], [None] * 500, bodies=False)


def test_decode_equals_reference_on_damaged_terms():
    terms = stored_bodies()
    rng = random.Random(7)
    damaged = []
    for _ in range(6000):
        t = bytearray(rng.choice(terms))
        what = rng.randrange(4)
        if what == 0:
            for _ in range(rng.randrange(1, 4)):
                k = rng.randrange(len(t))
                t[k] ^= 1 << rng.randrange(8)
        elif what == 1:
            del t[rng.randrange(len(t)) :]
        elif what == 2:
            k = rng.randrange(len(t))
            t[k : k + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff\xff\xff"])
        else:
            k = rng.randrange(len(t))
            t[k] = rng.choice(b"abdFjlmntwvs\x83hT")
        damaged.append(bytes(t))
    _compare_decode(damaged, [None] * len(damaged))


def test_decode_equals_reference_on_count_lies():
    """Issue 33: every count and length field the compiled decode reads (annotation map arity,
    list counts, binary and table lengths) lying as large as it can: at each of the first 200
    and last 60 byte positions of one stored term of each layout and atom encoding, 1, 2 and 4
    bytes of 0xFF (and 0x7FFFFFFF) written over the term. The core falls back or decodes as the
    reference does, and the whole lot takes seconds (no count is trusted before it is checked)."""
    by_shape = {}
    for t in stored_bodies():
        by_shape.setdefault((t[:12], len(t) < 400), t)
    lied = []
    for t in by_shape.values():
        for k in sorted(set(range(min(200, len(t)))) | set(range(max(0, len(t) - 60), len(t)))):
            for lie in (b"\xff", b"\xff\xff", b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff"):
                lied.append(t[:k] + lie + t[k + len(lie) :])
    assert len(by_shape) >= 4 and len(lied) > 4000
    t0 = time.monotonic()
    _compare_decode(lied, [None] * len(lied))
    assert time.monotonic() - t0 < 60


def test_decode_equals_reference_on_crafted_annotations():
    """Crafted annotations on a real stored 3.13+ message (re-encoded by our ETF codec): the names
    the 0-9-1 view gives a meaning to, as atoms (UTF-8 and latin-1) and spelled as binaries,
    repeated, and x- binaries that become headers. The core decodes some, hands the others to
    the reference, and every row it decodes equals the reference's."""
    from cqforensics.codecs.etf import Atom, binary_to_term, term_to_binary

    base = next(binary_to_term(t) for t in stored_bodies() if t[3:6] == b"w\x02m")
    anns = dict(base[3])
    variants = [
        {},
        {Atom("ttl"): 5000},
        {Atom("ttl"): Atom("undefined")},
        {Atom("p"): 7},
        {Atom("p"): 1 << 40},
        {Atom("d"): Atom("false")},
        {Atom("ts"): 1_700_000_000_123},
        {Atom("deaths"): []},
        {b"id": b"x" * 16},
        {b"rk": [b"a"]},
        {b"x-death": b"1"},
        {b"x-n": 3},
        {b"x-b": Atom("true")},
        {b"timestamp_in_ms": 5},
        {b"other": b"text"},
        {Atom("other"): [b"a", b"b"]},
        {b"x": b"shadow"},
        {Atom("rk"): []},
        {Atom("x"): 5},
        {Atom("id"): Atom("undefined")},
    ]
    terms = []
    for extra in variants:
        for utf8 in (True, False):
            terms.append(term_to_binary((base[0], base[1], base[2], {**anns, **extra}), utf8_atoms=utf8))
    without = {k: v for k, v in anns.items() if k not in ("x", "rk")}
    terms.append(term_to_binary((base[0], base[1], base[2], without)))
    decoded = _compare_decode(terms, [None] * len(terms))
    assert 0.3 * len(terms) < decoded < len(terms), decoded


def test_decode_from_a_file_equals_decode_from_its_bytes(tmp_path):
    """A file's terms, read through a map of it (core/src/lib.rs ``FileMap``, its pages dropped
    every 256 rows) or unmapped: with bodies, runs of nearby terms read straight into the body
    column and each body moved down to its place (``Spans::read_run``), without them a window
    of nearby terms at a time (``Window``): rows in and out of file order, far apart, repeated,
    overlapping, cut by the file's end or past it, and a term longer than a window decode as
    from the file's bytes in memory. Crafted layout of real stored terms."""
    terms = list(stored_bodies()[:3000]) + [random.Random(3).randbytes(3 << 20)]
    rng = random.Random(11)
    data, spans = bytearray(), []
    for t in terms:
        data += bytes(rng.choice([0, 0, 0, 7, 5000, 70_000]))  # gaps: none, small, past WINDOW_GAP
        spans.append((len(data), len(t)))
        data += t
    order = list(range(len(spans)))
    for a in range(0, len(order), 50):  # runs in file order, some shuffled, some reversed
        run = order[a : a + 50]
        if rng.random() < 0.3:
            rng.shuffle(run)
        elif rng.random() < 0.2:
            run.reverse()
        order[a : a + 50] = run
    starts = [spans[k][0] for k in order] + [spans[5][0], spans[5][0] + 3, len(data) - 10, len(data) + 100]
    lens = [spans[k][1] for k in order] + [spans[5][1], spans[5][1], 500, 50]
    n = len(starts)
    path = tmp_path / "terms"
    path.write_bytes(bytes(data))
    fd = os.open(path, os.O_RDONLY)
    try:
        for bodies in (True, False):
            want = core.decode_messages(
                [bytes(data)],
                np.zeros(n, np.int32),
                np.array(starts, np.int64),
                np.array(lens, np.int64),
                bytes(16 * n),
                np.zeros(n, np.uint8),
                bodies,
            )
            assert (want[0] == 0).sum() > 2500
            for mapped in (True, False):
                got = core.decode_messages(
                    [fd],
                    np.zeros(n, np.int32),
                    np.array(starts, np.int64),
                    np.array(lens, np.int64),
                    bytes(16 * n),
                    np.zeros(n, np.uint8),
                    bodies,
                    map_files=mapped,
                )
                assert np.array_equal(got[0], want[0])
                for k in want[1]:
                    assert got[1][k].equals(want[1][k]), (k, mapped)
    finally:
        os.close(fd)


def test_rows_far_apart_are_read_a_term_at_a_time():
    """core.scattered (crafted spans): a decode without bodies maps a file unless its rows lie
    further apart than SCATTERED on average (both ways decode alike: the test above)."""
    gap = core.SCATTERED
    i32, i64 = (lambda *v: np.array(v, np.int32)), (lambda *v: np.array(v, np.int64))
    assert not core.scattered(i32(0, 0, 0), i64(0, 100, 200), i64(100, 100, 100))  # back to back
    assert not core.scattered(i32(-1, -1), i64(0, 0), i64(0, 0))  # no term at all
    # two files, each dense, far apart from each other: dense
    assert not core.scattered(i32(0, 1, 0, 1), i64(0, 10**9, 500, 10**9 + 500), i64(500, 500, 500, 500))
    assert core.scattered(i32(0, 0, 0), i64(0, 2 * gap, 4 * gap), i64(100, 100, 100))  # 2 gaps apart
    assert not core.scattered(i32(0, 0, 0, -1), i64(0, gap // 2, gap, 0), i64(100, 100, 100, 0))
    # terms longer than the bytes between them: mapped, whatever the gaps
    assert not core.scattered(i32(0, 0), i64(0, 6 * gap), i64(4 * gap, 4 * gap))
    assert core.scattered(i32(0, 0), i64(0, 6 * gap), i64(gap, gap))


def test_float_headers_render_as_python_repr():
    # crafted: a 0-9-1 property list whose headers hold doubles and floats of every magnitude
    import struct

    from cqforensics.codecs import amqp091

    rng = random.Random(5)
    values = [
        0.0,
        -0.0,
        1.5,
        1e16,
        1e-5,
        1e-4,
        123456789.123,
        float("inf"),
        float("nan"),
        5e-324,
        1.7976931348623157e308,
    ]
    values += [struct.unpack(">d", rng.randbytes(8))[0] for _ in range(300)]
    for v in values:
        for kind, fmt in ((b"d", ">d"), (b"f", ">f")):
            try:
                raw = struct.pack(fmt, v)
            except OverflowError:
                continue
            table = b"\x01k" + kind + raw
            props = b"\x20\x00" + len(table).to_bytes(4, "big") + table  # headers flag only
            term = _amqpl_term(props)
            status, cols = core.decode_messages(
                [term],
                np.zeros(1, np.int32),
                np.zeros(1, np.int64),
                np.array([len(term)], np.int64),
                bytes(16),
                np.zeros(1, np.uint8),
                True,
            )
            assert status[0] == 0
            assert cols["headers"][0].as_py() == amqp091.properties_json(props)[1], v


def _amqpl_term(props: bytes) -> bytes:
    """crafted: the 4.x mc_amqpl layout around ``props`` with a one-byte body and no annotations"""

    def atom(n):
        return b"w" + bytes([len(n)]) + n

    return (
        b"\x83h\x04"
        + atom(b"mc")
        + atom(b"mc_amqpl")
        + b"h\x06"
        + atom(b"content")
        + b"a<"
        + atom(b"none")
        + b"m"
        + len(props).to_bytes(4, "big")
        + props
        + atom(b"rabbit_framing_amqp_0_9_1")
        + b"l\x00\x00\x00\x01m\x00\x00\x00\x01xj"
        + b"t\x00\x00\x00\x00"
    )


# -- whole tables ----------------------------------------------------------------------------------


# -- disk_log items (ets dumps) --------------------------------------------------------------------


def _same_items(data: bytes, path: Path = Path("x.ets")) -> bool:
    """The compiled walk of a disk_log's items (``readers.terms.disk_log_walk``, in runs of a few
    items to cross the resumption points too) and the reference give the same items, rows,
    terms and stop; and where the walk says ets:file2tab loads every object it found
    (``loads_whole``, the fast path of an undamaged dump), ``file2tab_load`` (storecrash's model
    of OTP's file2tab) loads exactly those. Returns whether it did."""
    from cqforensics.readers import terms

    ref = terms.disk_log_walk_reference(data, path)
    for run in (terms.WALK_ITEMS, 3):
        old, terms.WALK_ITEMS = terms.WALK_ITEMS, run
        try:
            new = terms.disk_log_walk(data, path)
        finally:
            terms.WALK_ITEMS = old
        assert (new.n, new.n_rows, new.md5_items) == (ref.n, ref.n_rows, ref.md5_items)
        assert new.offsets == ref.offsets
        assert new.rows.tobytes() == ref.rows.tobytes() and np.array_equal(new.row_items, ref.row_items)
        assert repr(new.terms) == repr(ref.terms)
        assert (repr(new.error), getattr(new.error, "offset", None)) == (
            repr(ref.error),
            getattr(ref.error, "offset", None),
        )
    status = bytes(data[4:8]) if data[:4] == b"\x01\x02\x03\x04" else None
    if not terms.loads_whole(status, ref):
        return False
    last = ref.n - 1
    walked = [ref.term(k) for k in range(1, ref.n) if not (k == last and terms._file2tab_end(ref.terms.get(k)))]
    assert repr(terms.file2tab_load(bytes(data))) == repr(walked)
    return True


def _ets_files() -> list[Path]:
    return sorted(p for ds in datasets() for p in (SAMPLES / ds / "mnesia").rglob("*.ets") if p.is_file())


def test_disk_log_items_equal_reference_on_every_sample_dump():
    files = _ets_files()
    assert len(files) >= 10
    for p in files:
        assert _same_items(read_bytes(p), p), p  # every sample's dump is whole: the fast path


def test_disk_log_items_equal_reference_on_damaged_dumps():
    """Damaged copies of every sample's dumps (zeroed ranges, bit flips, cuts, junk, duplicated
    slices), crafted records in every integer encoding and beyond 64 bits, items long enough
    to carry an md5 (right and wrong), and random bytes."""
    from cqforensics.codecs import etf

    rng = random.Random(32)
    whole = []
    for p in _ets_files():
        for data in _mutations(read_bytes(p), rng, 12):
            whole.append(_same_items(data))
    assert any(whole) and not all(whole)  # both the fast path and file2tab_load's are met
    head = b"\x01\x02\x03\x04\x63\x58\x4d\x0b"

    def item(term: bytes, md5: bytes | None = None) -> bytes:
        import hashlib

        size = len(term).to_bytes(4, "big")
        return (
            size
            + b"bWLA"
            + ((md5 if md5 is not None else hashlib.md5(size).digest()) if len(term) >= 65528 else b"")
            + term
        )

    ints = [0, 1, 255, 256, -1, -(1 << 31), (1 << 31) - 1, 1 << 40, (1 << 63) - 1, -(1 << 63), 1 << 63, 1 << 64, 2.5]
    for k in range(200):
        vals = [rng.choice(ints) for _ in range(4)]
        key = rng.choice([rng.randbytes(16), rng.randbytes(15), "id", 7])
        tag = rng.choice([etf.Atom("msg_location"), etf.Atom("msg_location", False), etf.Atom("file_summary")])
        term = etf.term_to_binary((tag, key, *vals), utf8_atoms=rng.random() < 0.5)
        data = head + item(etf.term_to_binary([etf.Atom("info")])) + item(term)
        data += item(etf.term_to_binary([etf.Atom("$end_of_table"), [(etf.Atom("count"), 1)]]))
        _same_items(data)
        _same_items(data + bytes(rng.randrange(9)))
    big = etf.term_to_binary([(etf.Atom("msg_location"), bytes(16), 1, 2, 3, 4)] * 3000)
    assert len(big) >= 65528
    for md5 in (None, bytes(16)):
        _same_items(head + item(etf.term_to_binary([])) + item(big, md5) + item(etf.term_to_binary(1)))
    for _ in range(200):
        _same_items(
            head
            + bytes(
                rng.choice((0, 0, 98, 87, 76, 65, 131, 104, 6, 119, rng.randrange(256)))
                for _ in range(rng.randrange(400))
            )
        )


def test_store_index_dumps_of_the_fuzz_corpus_read_as_reference(tmp_path):
    """Every ets dump of the kept fuzz cases (fuzz/regressions.json) and of a campaign's damaged
    clean stops: the compiled walk equals the reference."""

    from fuzz import campaign

    cases = {(e["dataset"], e["seed"], e["mutation"]) for e in campaign.regressions()}
    cases |= {
        (ds, seed, m)
        for seed in range(4)
        for ds in ("4.3.6-clean", "3.10.8-clean")
        for m in ("bitflip", "truncate", "zero", "junk", "swap")
    }
    # most dumps of a case are the sample's own, untouched by its mutation (436 dumps, 56 distinct):
    # each distinct content is compared once, under the first path it was met at
    seen = set()
    for ds, seed, mutation in sorted(cases):
        inp = campaign.prepare(seed, tmp_path / f"{ds}-{seed}-{mutation}", ds, mutation)
        for p in sorted(Path(inp["base"]).rglob("*.ets")):
            if p.is_file():
                data = read_bytes(p)
                if data not in seen:
                    seen.add(data)
                    _same_items(data, p)
    assert len(seen) >= 40


def _tables_equal(path: Path) -> None:
    # one reference time for both reads: a quorum queue's dead letters replayed at the boot carry the
    # boot's clock in x-death (and TTLs are judged by it), so two reads a millisecond apart differ
    as_of = 1_800_000_000_000
    for table in cqforensics.TABLES:
        os.environ["CQF_CORE"] = "0"
        try:
            ref = cqforensics.read_table(path, table, as_of=as_of)
        finally:
            os.environ.pop("CQF_CORE")
        new = cqforensics.read_table(path, table, as_of=as_of)
        assert ref.equals(new), f"{path}: table {table} differs with the core"


@pytest.mark.parametrize("ds", dataset_params())
def test_every_table_equals_reference(ds):
    _tables_equal(SAMPLES / ds / "mnesia")


@pytest.mark.slow
def test_every_table_equals_reference_on_damaged_copies(tmp_path):

    from fuzz import campaign

    done = 0
    for seed in range(3):  # every mutation on each of the three datasets once (282 s with 6 seeds in CI)
        ds = ("4.3.6-kill", "3.10.8-kill", "4.0.5-clean")[seed % 3]
        sample = campaign.tree_digest(bytes(SAMPLES / ds / "mnesia"))
        for mutation in sorted(campaign.MUTATIONS):
            if mutation == "fifo":
                continue
            inp = campaign.prepare(seed, tmp_path / f"{seed}-{mutation}", ds, mutation)
            # a mutation with nothing to act on here (an osiris one on a node without streams, zeros
            # over zeros: 20 of the 57) leaves the sample as it was: test_every_table_equals_reference
            if campaign.tree_digest(bytes(inp["base"])) == sample:
                continue
            _tables_equal(Path(inp["base"]))
            done += 1
    assert done >= 30


@pytest.mark.slow
def test_every_table_equals_reference_on_the_fuzz_corpus(tmp_path):
    """The kept fuzz cases (fuzz/regressions.json), each input rebuilt as the campaign made it."""

    from fuzz import campaign

    cases = {(e["dataset"], e["seed"], e["mutation"]) for e in campaign.regressions()}
    assert len(cases) >= 10
    from cqforensics.discovery.nodes import find_node_dirs

    compared = 0
    for ds, seed, mutation in sorted(cases):
        inp = campaign.prepare(seed, tmp_path / f"{ds}-{seed}-{mutation}", ds, mutation)
        if not find_node_dirs(Path(inp["base"])):
            continue  # the mutation left no node dir (one renamed): no table to compare
        _tables_equal(Path(inp["base"]))
        compared += 1
    assert compared >= len(cases) - 2


def test_buffer_arguments_are_read_as_they_are_and_type_checked():
    """The core reads array arguments through the buffer protocol: numpy arrays and memoryviews of
    the item type go in without a copy and give the same answer; a buffer of another item type
    (bytes, int32) is refused, never reinterpreted, and so is a non-contiguous one."""
    data = read_bytes(sample_files(".qs")[0])
    offsets, sizes = np.array([0, 8, 1 << 40], np.int64), np.array([4, 1 << 30, 4], np.int64)
    want = core.native().check_qs(data, offsets, sizes)
    assert want == core.check_qs(data, offsets, sizes).tobytes()
    assert core.native().check_qs(memoryview(data), memoryview(offsets), memoryview(sizes)) == want
    for bad in (offsets.tobytes(), offsets.astype(np.int32), np.repeat(offsets, 2)[::2]):
        with pytest.raises((BufferError, ValueError)):
            core.native().check_qs(data, bad, sizes)
