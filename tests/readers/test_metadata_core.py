"""The Khepri records carved by the compiled core (``compiled.decode_fields``, core/src/etf.rs
``Terms::fields``) against the reference (``codecs.etf.decode_fields_at``): on every candidate
record of every sample's Ra logs, and on seeded damage of those logs, the core gives the
reference's value (the fields ``queue_record`` reads decoded, None in the others' places) and
end, or leaves the record to the reference; it never decides one the reference rejects. And the
metadata read from every sample is the same with the core as without it. Without the core
these tests skip (CQF_NO_SKIP=1 in CI fails them)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cqforensics import compiled as core
from cqforensics.codecs import etf
from cqforensics.readers import metadata as m
from support import SAMPLES, datasets, manifest, skip_or_fail
from support.terms import sample_files, shape


@pytest.fixture(autouse=True)
def _need_core():
    if core.native() is None:
        skip_or_fail(f"the compiled core is not available: {core.status()}")


def _logs() -> list[bytes]:
    """The bytes of every Ra log file of the samples' Khepri stores (and their 3.x Ra logs)."""
    return [p.read_bytes() for p in sample_files("") if "/coordination/" in str(p) and p.suffix in (".wal", ".segment")]


def _compare(data: bytes, starts: list[int], limit: int = m.RECORD_LIMIT) -> int:
    """Core against reference on each start (a record within ``limit`` bytes of it); the
    number the core decided."""
    got = core.decode_fields(data, starts, m.QUEUE_FIELDS, limit)
    decided = 0
    for start, hit in zip(starts, got):
        try:
            want = etf.decode_fields_at(data, start, m.QUEUE_FIELDS, end=start + limit)
        except etf.EtfError:
            assert hit is None, (start, data[start : start + 64])
            continue
        if hit is not None:
            decided += 1
            assert (shape(hit[0]), hit[1]) == (shape(want[0]), want[1]), data[start : start + 64]
    return decided


def test_every_carved_record_of_the_samples_is_decoded_as_the_reference_does():
    decided = total = 0
    for data in _logs():
        starts = list(m._carved(data, m._CARVE[m.TABLE]))
        total += len(starts)
        decided += _compare(data, starts)
    assert total > 20 and decided == total  # plain records: none left to the reference


@pytest.mark.parametrize("seed", range(3))
def test_damaged_logs_get_the_reference_records_or_go_to_it(seed):
    """Seeded byte flips and tag swaps inside carved records, and records cut short by the
    bound: the core's value, when it gives one, is the reference's."""
    rng = random.Random(seed)
    for data in _logs():
        starts = list(m._carved(data, m._CARVE[m.TABLE]))
        if not starts:
            continue
        d = bytearray(data)
        for start in rng.sample(starts, min(20, len(starts))):
            for _ in range(rng.randint(1, 4)):
                at = start + rng.randrange(1, 400)
                if at < len(d):
                    d[at] = rng.choice([rng.randrange(256), 104, 105, 106, 108, 116, 110, 107, 88, 90, 119, 80])
        _compare(bytes(d), starts)
        _compare(data, starts, rng.randrange(20, 200))  # records cut short by their bound


def _records(meta: m.Metadata) -> dict:
    return {
        k: (q.vhost, q.name, q.durable, shape(q.arguments), shape(q.type), q.source, q.node)
        for k, q in meta.queues.items()
    }


@pytest.mark.parametrize("dataset", datasets())
def test_metadata_is_the_same_with_the_core_and_without(dataset, monkeypatch):
    node = SAMPLES / dataset / "mnesia" / Path(manifest(dataset)["node_dir"]).name
    with_core = m.read_metadata(node)
    monkeypatch.setenv("CQF_CORE", "0")
    reference = m.read_metadata(node)
    assert with_core == reference
    assert _records(with_core) == _records(reference)
