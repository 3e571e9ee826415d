"""Stored terms of the samples, for codec tests: every message term, every store body."""

from __future__ import annotations

import functools
from pathlib import Path

import cqforensics
from cqforensics.codecs import etf
from cqforensics.readers import qs as r_qs
from support import SAMPLES, datasets


def stored_terms():
    """(path, offset, raw term bytes) of every message term in every sample: shared-store
    entries, .qs entries and v1 embedded messages (located through the index table)."""
    import cqforensics

    out = []
    for b in cqforensics.iter_batches(SAMPLES, "store", columns=["file", "offset", "body"]):
        out += zip(*(b.column(c).to_pylist() for c in ("file", "offset", "body")))
    cols = ["file", "kind", "location", "store_offset", "store_size"]
    for b in cqforensics.iter_batches(SAMPLES, "index", columns=cols):
        for f, kind, loc, off, size in zip(*(b.column(c).to_pylist() for c in cols)):
            if kind != "publish" or loc not in ("queue_store", "embedded"):
                continue
            if loc == "queue_store":
                f, off = f[:-3] + ".qs", off + 8
            with open(f, "rb") as fh:
                fh.seek(off)
                out.append((f, off, fh.read(size)))
    return out


def sample_files(suffix: str) -> list[Path]:
    return sorted(p for ds in datasets() for p in (SAMPLES / ds / "mnesia").rglob(f"*{suffix}") if p.is_file())


@functools.lru_cache(maxsize=1)
def stored_bodies() -> tuple[bytes, ...]:
    out = []
    for ds in datasets():
        t = cqforensics.read_table(SAMPLES / ds / "mnesia", "store", columns=["body"])
        out += [b for b in t.column("body").to_pylist() if b]
        for p in sample_files(".qs"):
            if ds in str(p):
                out += [bytes(term[0][term[1] : term[1] + term[2]]) for row, term in r_qs.dump_rows(p) if term]
    return tuple(out)


def shape(v):
    """A decoded term with every type spelled out (``==`` alone takes an Atom for its str, 1 for
    True, a tuple of an ImproperList for another): what a differential test of two decoders
    compares."""
    if isinstance(v, etf.Atom):
        return ("atom", str(v), v.utf8)
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [shape(x) for x in v])
    if isinstance(v, dict):
        return ("map", [(shape(k), shape(x)) for k, x in v.items()])
    if isinstance(v, etf.ImproperList):
        return ("improper", shape(v.items), shape(v.tail))
    return (type(v).__name__, v)
