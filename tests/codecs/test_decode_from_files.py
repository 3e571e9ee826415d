"""The compiled decode reading terms from open files (``pread`` into the body column, the path a
``messages`` read takes) gives exactly what it gives from the same bytes in memory, including
spans cut short or lying past the end of the file; and a walk's holes, kept as arrays by the
core, read like the reference's list of ``Hole``."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from cqforensics import compiled as core
from cqforensics.readers import rdq as r_rdq
from support import skip_or_fail
from support.terms import stored_bodies


@pytest.fixture(autouse=True)
def _need_core():
    if core.native() is None:
        skip_or_fail(f"the compiled core is not available: {core.status()}")


def _decode(sources, file_ix, starts, lengths, bodies):
    n = len(file_ix)
    return core.decode_messages(
        sources,
        np.array(file_ix, np.int32),
        np.array(starts, np.int64),
        np.array(lengths, np.int64),
        bytes(16 * n),
        np.zeros(n, np.uint8),
        bodies,
    )


def _equal(a, b) -> None:
    (status_a, cols_a), (status_b, cols_b) = a, b
    assert np.array_equal(status_a, status_b)
    for k in cols_a:
        assert cols_a[k].equals(cols_b[k]), k


@pytest.mark.parametrize("bodies", [True, False])
def test_decode_from_a_file_equals_decode_from_its_bytes(tmp_path, bodies):
    rng = random.Random(11)
    terms = list(stored_bodies())[:3000]
    blob = bytearray()
    starts, lengths = [], []
    for t in terms:
        blob += rng.randbytes(rng.randrange(0, 40))  # crafted: junk between the stored terms
        starts.append(len(blob))
        lengths.append(len(t))
        blob += t
    # crafted spans: cut by the end of the file, past its end, empty, a length no file has (an
    # index may claim one: no room is made for it), and rows with no term
    starts += [len(blob) - 10, len(blob) + 5, 0, 7, 0, -3]
    lengths += [500, 100, 0, 1 << 40, 50, 20]
    file_ix = [0] * len(starts)
    file_ix[-2] = -1
    path = tmp_path / "terms.rdq"
    path.write_bytes(bytes(blob))
    order = rng.sample(range(len(starts)), len(starts))  # rows in any order, as a queue reads them
    starts, lengths, file_ix = ([v[k] for k in order] for v in (starts, lengths, file_ix))
    with open(path, "rb") as f:
        from_file = _decode([f.fileno()], file_ix, starts, lengths, bodies)
    from_bytes = _decode([bytes(blob)], file_ix, starts, lengths, bodies)
    _equal(from_file, from_bytes)
    assert np.count_nonzero(from_file[0] == 0) > 0.8 * len(terms)
    body = from_file[1]["body"]
    if bodies:  # the data buffer is cut to the bodies (the core's has room for whole terms)
        assert body.buffers()[2].size == np.frombuffer(body.buffers()[1], np.int32)[-1] > 0
    else:
        assert body.null_count == len(body)


def test_holes_from_the_core_read_like_a_list_of_holes():
    # crafted: entries with a zero run and a garbage run between them
    def entry(i: int) -> bytes:
        term = b"\x83h\x02w\x01xm" + (3).to_bytes(4, "big") + b"abc"
        return (16 + len(term)).to_bytes(8, "big") + bytes([i]) * 16 + term + b"\xff"

    data = entry(1) + bytes(100) + entry(2) + b"\x07" * 50 + entry(3)
    new = r_rdq.walk(Path("x.rdq"), 0, data)
    ref = r_rdq.walk(Path("x.rdq"), 0, data, reference=True)
    assert isinstance(new.holes, r_rdq.Holes)
    assert new.holes == ref.holes and ref.holes == new.holes and len(new.holes) == 2
    assert [h.kind for h in new.holes] == ["zeroed", "garbage"]
    assert new.holes[-1] == ref.holes[-1] and new.holes[:1] == ref.holes[:1]
    assert new.holes[0].offset == len(entry(1)) and new.holes[0].length == 100
    with pytest.raises(IndexError):
        new.holes[2]
