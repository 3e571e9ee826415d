#!/usr/bin/env python3
"""Fuzzing campaign: seeded, structure-aware mutations of copies of the real sample node dirs,
then every entry point on each mutated copy, each in a child process with a wall-time and a
memory limit.

    python3 fuzz/campaign.py --runs 3000 --seed S [--jobs 2] [--out summary.json] [--streams]
    python3 fuzz/campaign.py --replay SEED [--mutation M] [--dataset D] [--command C]

A *seed* picks a dataset and a mutation (``plan``); the mutation is applied to a private copy
of the dataset's mnesia base, with its own ``random.Random`` derived from (seed, dataset,
mutation), so ``--replay SEED --mutation M`` rebuilds exactly the same input. Every command of
``COMMANDS`` then runs on it (one *run* each): the nine tables through ``cqforensics.read_table``
and the CLI's ``fsck``, ``fsck --deep --json``, ``fsck --json``, ``dump`` and ``dump --deep`` (of the
mutated file), ``export``, ``audit``, ``rebuild``, ``compact`` and ``verify`` through
``cli.main.main``. Each run is a forked child with ``RLIMIT_AS`` set and a wall-time limit; its
peak RSS comes from ``os.wait4``. A run fails when:

- ``traceback``: a Python traceback (API: an exception that is no ``cqforensics.base.errors.CQError``;
  CLI: an "internal error" line, which is how the CLI reports a bug),
- ``hang``: it ran past the wall-time limit (killed),
- ``memory``: its peak RSS passed the bound, or it died of the address-space limit,
- ``modified-input``: the input tree (names, types, bytes) changed,
- ``exit-code``: an exit code outside the documented set (0, 1, 2, 4, 6, 8, 16),
- ``writer-refused``: ``rebuild``/``compact`` built output that failed its own verification (a
  writer must write what it keeps in a form it verifies),
- ``writer-not-refused``: a writer run aimed at evidence (``AIMED``: its own input, a path inside
  it, another node's data dir, a file another broker wrote; ``--force`` given) was not refused
  with exit 16 (the rule of every output, ``cqforensics.output.guard``). Its target's tree must not
  change either (``modified-input``: the digest covers the mutated copy, which these runs aim at).

Besides, for each input whose mutation changed a data file's bytes, the summary says whether
``fsck --json`` named that file in a finding, or (a file of a queue dir) that queue (``reported``),
and lists the others as ``silent``
for triage (a mutation that left the file's bytes as they were is no damage and is not counted;
one that changed only message bodies in place, framing and decoded structure intact, is listed
as ``undetectable`` (``payload``): no checksum covers them, see ``_payload_only``; so is one that left
what the file says unchanged: a text term file with the same terms, a Mnesia log with the same
items but for its header's time stamp, see ``_same_content``; two vhosts' MQTT retained
stores swapped, whose records do not name their vhost; and changed bytes each of a class no
check can see a change in, ``UNDETECTABLE``: the bit-flip table of docs/hostile.md). A silent
input none of these explains is an unexplained silence.

The JSON summary lists the runs, seeds, figures (peak RSS, slowest run) and the failures by
class, each with a reproducer. Failing inputs are kept in ``fuzz/regressions.json``
(``tests/checks/test_fuzz.py`` replays them)."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import resource
import shutil
import signal
import stat
import struct
import sys
import tempfile
import time
import traceback
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import cqforensics  # noqa: E402  (imported before forking: children start warm)
from cli.main import main as cli_main  # noqa: E402
from cqforensics.base.errors import CQError  # noqa: E402
from cqforensics.codecs import (  # noqa: E402
    amqp091,
    etf,
    textfiles,  # noqa: E402
)
from cqforensics.grammar import osiris as g_osiris  # noqa: E402
from cqforensics.grammar import qi as c_qi  # noqa: E402
from cqforensics.grammar import rdq as c_rdq  # noqa: E402
from cqforensics.readers import osiris as r_osiris  # noqa: E402
from cqforensics.readers import rdq as r_rdq  # noqa: E402

SAMPLES = ROOT / "sample_data"
#: every real-broker sample: the small ones written here, the imported versions (committed as
#: their node-dir archives, 21 MB each, unpacked on first use) and the MQTT/STOMP ones
DATASETS = (
    "3.10.8-clean",
    "3.10.8-kill",
    "3.10.8-segments",
    "4.0.5-clean",
    "4.0.5-kill",
    "4.3.6-clean",
    "4.3.6-kill",
    "4.3.6-rolled",
    "3.12.14-clean",
    "3.13.7-clean",
    "4.1.8-clean",
    "4.2.2-clean",
    "3.10.8-proto-clean",
    "3.10.8-proto-kill",
    "4.0.5-proto-clean",
    "4.0.5-proto-kill",
    "4.3.6-proto-clean",
    "4.3.6-proto-kill",
    "3.10.8-quorum-clean",
    "3.10.8-quorum-kill",
    "4.0.5-quorum-clean",
    "4.0.5-quorum-kill",
    "4.3.6-quorum-clean",
    "4.3.6-quorum-kill",
)
#: samples holding streams (osiris segments and indexes): the osiris mutations are made on these
STREAM_DATASETS = (
    "3.10.8-streams-clean",
    "3.10.8-streams-kill",
    "4.0.5-streams-clean",
    "4.0.5-streams-kill",
    "4.3.6-streams-clean",
    "4.3.6-streams-kill",
)
DATASETS = DATASETS + STREAM_DATASETS
TABLES = (
    "messages",
    "index",
    "acks",
    "store",
    "refcounts",
    "holes",
    "files",
    "queues",
    "findings",
    "stream_tracking",
    "raft_log",
)
EXIT_CODES = frozenset({0, 1, 2, 4, 6, 8, 16})  # 2: fsck incomplete (storage not read), with 4: 6
WALL_LIMIT = 60.0  # seconds per run
AS_LIMIT = 1536 << 20  # address space a run may add to the process it forks from (its RLIMIT_AS, bytes)
RSS_BOUND = 1536 << 20  # peak RSS a run may reach (bytes)
DATA_SUFFIXES = (
    b".qi",
    b".qs",
    b".rdq",
    b".idx",
    b".jif",
    b".ets",
    b".dets",
    b".DCD",
    b".DCL",
    b".LOG",
    b".queue_name",
    b".vhost",
    b".config",
    b".dot",
    b".index",
    # Ra (quorum queues): WAL, segments, snapshots (and Ra 3's indexes), each server's config;
    # .segment: Ra's and osiris'
    b".wal",
    b".segment",
    b"snapshot.dat",
    b"/indexes",
    b"/config",
    b"writers.snapshot",
)


# -- inputs ------------------------------------------------------------------------------------------


def _files(base: bytes) -> list[bytes]:
    """Regular files below ``base`` (bytes paths, sorted: the order a seed's choices index)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for n in sorted(filenames):
            p = os.path.join(dirpath, n)
            if stat.S_ISREG(os.lstat(p).st_mode):
                out.append(p)
    return out


def _data_files(base: bytes, suffixes=DATA_SUFFIXES) -> list[bytes]:
    return [p for p in _files(base) if p.endswith(suffixes)]


def tree_digest(base: bytes) -> str:
    """sha256 over every name, type and content below ``base`` (never opens a special file)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for n in sorted(dirnames + filenames):
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            h.update(os.path.relpath(p, base) + b"\0" + str(stat.S_IFMT(st.st_mode)).encode())
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    h.update(hashlib.sha256(f.read()).digest())
            elif stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(p))
    return h.hexdigest()


def _read(p: bytes) -> bytes:
    with open(p, "rb") as f:
        return f.read()


def _write(p: bytes, data: bytes) -> None:
    with open(p, "wb") as f:
        f.write(data)


# -- mutations: each takes (rng, node dir as bytes) and returns (what it did, the file it targeted) ---


def m_bitflip(rng, node):
    p = rng.choice(_data_files(node))
    data = bytearray(_read(p))
    if not data:
        return "empty file, nothing flipped", p
    flips = [rng.randrange(len(data) * 8) for _ in range(rng.randint(1, 8))]
    for b in flips:
        data[b // 8] ^= 1 << (b % 8)
    _write(p, bytes(data))
    return f"{len(flips)} bit(s) flipped at bytes {sorted({b // 8 for b in flips})}", p


def m_truncate(rng, node):
    p = rng.choice(_data_files(node))
    n = os.path.getsize(p)
    at = rng.randrange(n + 1) if n else 0
    os.truncate(p, at)
    return f"truncated {n} -> {at}", p


def m_zero(rng, node):
    p = rng.choice(_data_files(node))
    data = bytearray(_read(p))
    if not data:
        return "empty file", p
    a = rng.randrange(len(data))
    n = min(len(data) - a, rng.choice((1, 8, 9, 24, 32, 64, 4096, 1 << 20)))
    data[a : a + n] = bytes(n)
    _write(p, bytes(data))
    return f"zeroed {n} bytes at {a}", p


def m_junk(rng, node):
    p = rng.choice(_data_files(node))
    n = rng.choice((1, 7, 33, 1000, 70000))
    junk = bytes(rng.randrange(256) for _ in range(min(n, 4096))) * (n // 4096 + 1)
    with open(p, "ab") as f:
        f.write(junk[:n])
    return f"{n} junk bytes appended", p


def m_delete(rng, node):
    p = rng.choice(_files(node))
    os.unlink(p)
    return "deleted", p


def m_ra_entry(rng, node):
    """A Ra log entry's payload changed in place (structure-aware: the framing stays valid, so the
    WAL record's or segment entry's checksum is what must catch it): bits flipped inside one
    record of a quorum WAL or one entry of a segment (a node without quorum queue entries: its
    ``coordination/`` Ra system's, Khepri's and the stream coordinator's)."""
    from cqforensics.readers import ra_segment, ra_wal

    files = _data_files(node, (b".wal", b".segment"))
    rng.shuffle(files)
    files.sort(key=lambda p: b"/quorum/" not in p)  # quorum files first, in a seeded order
    for p in files:
        path = Path(os.fsdecode(p))
        if p.endswith(b".wal"):
            scan = ra_wal.walk(path)
            spans = [(int(scan.data_offset[i]), int(scan.length[i])) for i in range(len(scan))]
        else:
            seg = ra_segment.read_segment(path)
            spans = [(int(seg.offset[i]), int(seg.length[i])) for i in range(len(seg))]
        spans = [s for s in spans if s[1] > 0]
        if not spans:
            continue
        start, length = rng.choice(spans)
        data = bytearray(_read(p))
        pos = start + rng.randrange(length)
        data[pos] ^= 1 << rng.randrange(8)
        _write(p, bytes(data))
        return f"a bit flipped in the entry at {start} (byte {pos})", p
    return "no Ra log entry", None


def m_swap(rng, node):
    by_kind: dict[bytes, list[bytes]] = {}
    for p in _data_files(node):
        by_kind.setdefault(os.path.splitext(p)[1] or os.path.basename(p), []).append(p)
    kinds = sorted(k for k, v in by_kind.items() if len({_read(p) for p in v}) > 1)
    if not kinds:
        return "no two different files of one kind", None
    files = by_kind[rng.choice(kinds)]
    while True:  # two files that differ (swapping equal ones changes nothing)
        a, b = rng.sample(files, 2)
        da, db = _read(a), _read(b)
        if da != db:
            break
    _write(a, db)
    _write(b, da)
    return f"swapped with {os.fsdecode(os.path.relpath(b, node))!r}", a


def m_dup_record(rng, node):
    """A .qi slot copied over another slot, or a CQv1 .idx/journal record over another of its size."""
    qis = [p for p in _data_files(node, (b".qi",)) if os.path.getsize(p) >= c_qi.HEADER_SIZE + 2 * c_qi.ENTRY_SIZE]
    v1 = [p for p in _data_files(node, (b".idx", b".jif")) if os.path.getsize(p) >= 4]
    if qis and (not v1 or rng.random() < 0.7):
        p = rng.choice(qis)
        data = bytearray(_read(p))
        n = (len(data) - c_qi.HEADER_SIZE) // c_qi.ENTRY_SIZE
        used = [i for i in range(n) if data[c_qi.HEADER_SIZE + i * c_qi.ENTRY_SIZE] != 0] or list(range(n))
        src, dst = rng.choice(used), rng.randrange(n)
        e = c_qi.ENTRY_SIZE
        data[c_qi.HEADER_SIZE + dst * e : c_qi.HEADER_SIZE + (dst + 1) * e] = data[
            c_qi.HEADER_SIZE + src * e : c_qi.HEADER_SIZE + (src + 1) * e
        ]
        _write(p, bytes(data))
        return f"slot {src} copied over slot {dst}", p
    if not v1:
        return "no index file", None
    p = rng.choice(v1)
    data = bytearray(_read(p))
    size = rng.choice((2, 34))  # a deliver/ack record, or a publish head (CQv1 record sizes)
    a, b = rng.randrange(max(1, len(data) - size)), rng.randrange(max(1, len(data) - size))
    data[b : b + size] = data[a : a + size]
    _write(p, bytes(data))
    return f"{size} bytes at {a} copied over {b}", p


def _deep(tag: bytes, n: int) -> bytes:
    if tag == b"l":  # [[[...]]] n deep
        return b"\x83" + b"l\x00\x00\x00\x01" * n + b"j" + b"j" * n
    return b"\x83" + b"h\x01" * n + b"j"  # {{{...}}}


_ZEROS_Z: dict[int, bytes] = {}


def _zeros_z(n: int) -> bytes:
    """zlib of ``n`` zero bytes (cached: compressing 200 MB takes a while)."""
    if n not in _ZEROS_Z:
        c = zlib.compressobj(9)
        chunk = bytes(1 << 20)
        _ZEROS_Z[n] = b"".join([c.compress(chunk) for _ in range(n >> 20)] + [c.flush()])
    return _ZEROS_Z[n]


def _zbinary(n: int) -> bytes:
    """A compressed term (tag 80) holding a binary of ``n`` zero bytes, valid (cached)."""
    key = -n
    if key not in _ZEROS_Z:
        c = zlib.compressobj(9)
        chunk = bytes(1 << 20)
        parts = [c.compress(b"m" + struct.pack(">I", n))] + [c.compress(chunk) for _ in range(n >> 20)]
        _ZEROS_Z[key] = (
            b"P" + struct.pack(">I", n + 5) + b"".join(parts + [c.compress(bytes(n % (1 << 20))), c.flush()])
        )
    return _ZEROS_Z[key]


def _nested_z(inner: bytes, depth: int) -> bytes:
    """``inner`` (a term without version byte) in ``depth`` layers of a 2-tuple {inner, compressed}."""
    t = inner
    for _ in range(depth):
        body = b"h\x02" + inner + t
        t = b"P" + struct.pack(">I", len(body)) + zlib.compress(body)
    return t


def _hostile_term(rng, original: bytes) -> tuple[str, bytes]:
    """A hostile Erlang term (name, bytes), chosen by ``rng``; built only once chosen."""
    big = rng.randrange(1 << 16, 1 << 17)
    terms = {
        "deep-list": lambda: _deep(b"l", rng.choice((300, 5000, 100000))),
        "deep-tuple": lambda: _deep(b"h", rng.choice((300, 5000, 100000))),
        "huge-bignum": lambda: b"\x83o" + struct.pack(">I", big) + b"\x00" + bytes([0xFF]) * big,
        "binary-length-lies": lambda: b"\x83m" + struct.pack(">I", 0xFFFFFFF0) + b"abc",
        "list-length-lies": lambda: b"\x83l" + struct.pack(">I", 0x7FFFFFFF) + b"a\x01j",
        "zlib-bomb": lambda: b"\x83P" + struct.pack(">I", 0xFFFFFFFF) + _zeros_z(64 << 20),
        "zlib-bomb-exact": lambda: b"\x83P" + struct.pack(">I", 200 << 20) + _zeros_z(200 << 20),
        # several valid compressed binaries, each under any per-term limit: 1 MB inflating to 1 GB
        "zlib-several": lambda: b"\x83h\x05" + _zbinary(200 << 20) * 5,
        "zlib-nested": lambda: b"\x83" + _nested_z(_zbinary(60 << 20), 3),
        "many-map-keys": lambda: etf.term_to_binary({i: i for i in range(rng.choice((1000, 200000)))}),
        "long-atom": lambda: b"\x83v" + struct.pack(">H", 65535) + b"\xff" * 65535,
        "bad-utf8-atom": lambda: b"\x83w\x04\xff\xfe\xfd\xfc",
        "float-nan": lambda: b"\x83F" + struct.pack(">d", float("nan")),
        "empty": lambda: b"\x83",
        "no-version": lambda: b"j",
    }
    try:
        term, _ = etf.decode(original)
    except Exception:
        term = None
    if term is not None:
        terms["odd-leaf"] = lambda: etf.term_to_binary(_mutate_leaf(rng, term))
        terms["odd-leaf-2"] = lambda: etf.term_to_binary(_mutate_leaf(rng, _mutate_leaf(rng, term)))
    name = rng.choice(sorted(terms))
    return name, terms[name]()


_ODD = (
    lambda r: 1 << r.choice((63, 64, 200, 2000)),
    lambda r: -1,
    lambda r: [],
    lambda r: (),
    lambda r: {},
    lambda r: etf.Atom("undefined"),
    lambda r: b"\xff" * r.choice((0, 1, 300)),
    lambda r: [b"a", [b"b"]],
    lambda r: 1.5e308,
    lambda r: etf.ImproperList([1], b"t"),
    lambda r: etf.Atom("\u00ff" * 255),
    lambda r: [[[[]]]],
    lambda r: (etf.Atom("basic_message"),),
)


def _mutate_leaf(rng, term):
    """``term`` with one randomly chosen subterm replaced by an odd value."""
    paths = []

    def walk(t, path, depth):
        paths.append(path)
        if depth > 12:
            return
        if isinstance(t, (tuple, list)):
            for i, x in enumerate(t):
                walk(x, path + (i,), depth + 1)

    walk(term, (), 0)
    target = rng.choice(paths[1:] or paths)
    new = rng.choice(_ODD)(rng)

    def put(t, path):
        if not path:
            return new
        i = path[0]
        items = list(t)
        items[i] = put(items[i], path[1:])
        return tuple(items) if isinstance(t, tuple) else items

    return put(term, target)


def m_hostile_term(rng, node):
    """A stored message replaced by a hostile Erlang term, framed correctly (size, id, marker)."""
    rdqs = [p for p in _data_files(node, (b".rdq",)) if os.path.getsize(p) > 0]
    if not rdqs:
        return "no .rdq", None
    p = rng.choice(rdqs)
    data = _read(p)
    f = r_rdq.walk(Path(os.fsdecode(p)), 0, data)
    if not len(f):
        return "no entry", p
    i = rng.randrange(len(f))
    off, total = int(f.offsets[i]), int(f.totals[i])
    start, length = r_rdq.term_span(off, total)
    name, term = _hostile_term(rng, data[start : start + length])
    msg_id = data[off + 8 : off + 24]
    entry = struct.pack(">Q", len(term) + c_rdq.MSG_ID_SIZE) + msg_id + term + bytes((c_rdq.WRITE_OK_MARKER,))
    _write(p, data[:off] + entry + data[off + total :])
    return f"entry {i} at {off} replaced by a {name} term of {len(term)} bytes", p


# -- a stored message replaced, framed as its store frames it -------------------------------------------


def stored_messages(node) -> list[dict]:
    """The messages the indexes of ``node`` (bytes or str) hold: one dict per live index entry with
    a stored body (location, the index file and offset, the store file and offset, the term's
    format), from the ``messages`` table."""
    t = cqforensics.read_table(
        os.fsdecode(node),
        "messages",
        columns=["location", "file", "offset", "store_file", "store_offset", "term_format", "decode_error", "queue"],
    )
    return [
        r
        for r in t.to_pylist()
        if r["store_file"] is not None
        and r["store_offset"] is not None
        and r["location"] in ("shared_store", "queue_store", "embedded")
        and r["term_format"]
        and not r["decode_error"]
    ]


def stored_term(row: dict) -> bytes:
    """The stored term bytes of a ``stored_messages`` row."""
    data = _read(os.fsencode(row["store_file"]))
    o = row["store_offset"]
    if row["location"] == "shared_store":
        (size,) = struct.unpack_from(">Q", data, o)
        return data[o + 24 : o + 8 + size]
    if row["location"] == "queue_store":
        (size,) = struct.unpack_from(">I", data, o)
        return data[o + 8 : o + 8 + size]
    head = 40 if row["file"].endswith(".jif") else 34  # the record's head before its embedded term
    (size,) = struct.unpack_from(">I", data, o - 4)
    assert o - head == row["offset"]
    return data[o : o + size]


def put_term(row: dict, term: bytes) -> str:
    """``row``'s stored message replaced by ``term``, framed as its store frames an entry, so that
    only the term is what changed: a shared-store entry rewritten in place (size, id, term, 255;
    the file's later entries move), a ``.qs`` entry appended to its segment (size, CRC) and its
    ``.qi`` slot pointed at it, a CQv1 publish record's embedded term and size rewritten (the
    segment's later records move). Returns the file that holds the term now."""
    store = os.fsencode(row["store_file"])
    data = _read(store)
    o = row["store_offset"]
    if row["location"] == "shared_store":
        (size,) = struct.unpack_from(">Q", data, o)
        msg_id = data[o + 8 : o + 24]
        entry = struct.pack(">Q", len(term) + c_rdq.MSG_ID_SIZE) + msg_id + term + bytes((c_rdq.WRITE_OK_MARKER,))
        _write(store, data[:o] + entry + data[o + 8 + size + 1 :])
    elif row["location"] == "queue_store":
        at = len(data)
        _write(store, data + struct.pack(">IBHB", len(term), 1, zlib.crc32(term) & 0xFFFF, 0) + term)
        qi = os.fsencode(row["file"])
        slot = bytearray(_read(qi))
        struct.pack_into(">QI", slot, row["offset"] + 4, at, len(term))
        _write(qi, bytes(slot))
    else:
        (size,) = struct.unpack_from(">I", data, o - 4)
        _write(store, data[: o - 4] + struct.pack(">I", len(term)) + term + data[o + size :])
    return row["store_file"]


def m_fifo(rng, node):
    if not hasattr(os, "mkfifo"):
        return "no FIFOs here", None
    p = rng.choice(_files(node))
    os.unlink(p)
    os.mkfifo(p)
    return "replaced by a FIFO", p


def m_odd_name(rng, node):
    what = rng.choice(("rename-file", "rename-dir", "stray", "long", "numbered"))
    if what == "rename-dir":
        dirs = sorted(d for d, _, _ in os.walk(node) if d != node)
        d = rng.choice(dirs)
        os.rename(d, d + b"\xff\xfe")
        return "dir renamed with \\xff\\xfe", d + b"\xff\xfe"
    if what == "rename-file":
        p = rng.choice(_files(node))
        stem, ext = os.path.splitext(p)
        q = stem + rng.choice((b"\xff", b"\xc3", b" ", b"\n", b"-1", b"\x00"[:0] + b"..")) + ext
        os.rename(p, q)
        return f"renamed to {os.path.basename(q)!r}", q
    d = os.path.dirname(rng.choice(_files(node)))
    if what == "long":
        q = os.path.join(d, b"9" * 250 + b".rdq")
    elif what == "numbered":
        q = os.path.join(
            d,
            rng.choice(
                (b"99999999999999999999999.qi", b"-3.rdq", b"0x10.idx", b"\xd9\xa3.qs", b"00000.qi", b"1e5.rdq")
            ),
        )
    else:
        q = os.path.join(d, b"stray\xff" + rng.choice(DATA_SUFFIXES))
    _write(q, b"junk" * rng.choice((0, 1, 100)))
    return f"stray file {os.path.basename(q)!r}", q


def _props_bin(raw: bytes, **changes) -> bytes:
    """An encoded AMQP 0-9-1 property list with ``changes`` made (a timestamp no column holds)."""
    props, headers = amqp091.decode_properties(raw)
    return amqp091.encode_properties({**props, **changes}, headers)


#: values a ``messages`` row shows as null: past their column's range, or of another kind than
#: the broker writes there (issue 33); each (name, the changed term) is made from a real term
def _odd_values(term) -> list[tuple[str, object]]:
    A = etf.Atom
    out = []
    if term[0] == "mc":
        anns = dict(term[3])
        for name, k, v in (
            ("ts-2^70", "ts", 1 << 70),
            ("priority-2^40", "p", 1 << 40),
            ("id-integer", "id", 12345),
            ("rk-atom", "rk", A("odd")),
            ("x-integer", "x", 7),
            ("d-integer", "d", 5),
            ("ttl-binary", "ttl", b"60000"),
        ):
            out.append((name, (term[0], term[1], term[2], {**anns, A(k): v})))
        content = term[2]
        if term[1] == "mc_amqpl" and isinstance(content[3], bytes):
            c = list(content)
            c[3] = _props_bin(content[3], timestamp=(1 << 64) - 1)
            out.append(("props-timestamp-2^64-1", (term[0], term[1], tuple(c), anns)))
    elif term[0] == "basic_message":
        t = list(term)
        out.append(("rk-atom", tuple(t[:2] + [A("odd")] + t[3:])))
        out.append(("id-integer", tuple(t[:4] + [12345] + t[5:])))
        out.append(("exchange-integer", tuple(t[:1] + [(t[1][0], t[1][1], t[1][2], 7)] + t[2:])))
        content = list(term[3])
        if isinstance(content[3], bytes):
            c = list(content)
            c[3] = _props_bin(content[3], timestamp=(1 << 64) - 1)
            out.append(("props-timestamp-2^64-1", tuple(t[:3] + [tuple(c)] + t[4:])))
            props, headers = amqp091.decode_properties(content[3])
            p_basic = [A("P_basic")] + [A("undefined")] * 14
            p_basic[1] = 42  # content_type: an integer, not a binary
            p_basic[5] = 1 << 40  # priority: past an octet and the column
            for name, rec in (
                ("p_basic-odd", tuple(p_basic)),
                ("p_basic-short", tuple(p_basic[:6])),
                ("p_basic-headers", tuple(p_basic[:3] + [[(b"h", A("longstr"), 5)]] + p_basic[4:])),
            ):
                c = list(content)
                c[2], c[3] = rec, A("none")
                out.append((name, tuple(t[:3] + [tuple(c)] + t[4:])))
    return out


def m_odd_value(rng, node):
    """A stored message (in a .rdq, a .qs or embedded in a CQv1 index) re-encoded with a value a
    row shows as null: a timestamp or priority past its column, or a field of another kind."""
    rows = stored_messages(node)
    rng.shuffle(rows)
    for row in rows:
        term = etf.binary_to_term(stored_term(row))
        odd = _odd_values(term)
        if odd:
            name, new = rng.choice(odd)
            target = put_term(row, etf.term_to_binary(new))
            return f"{row['location']} message at {row['store_offset']} given {name}", os.fsencode(target)
    return "no stored message", None


def _hostile_amqp10(rng) -> tuple[str, bytes]:
    """An AMQP 1.0 application-properties section holding one hostile value (name, bytes)."""

    def section(value: bytes) -> bytes:  # described 0x74: a map32 of the key "k" and the value
        items = b"\xa1\x01k" + value
        return b"\x00\x53\x74\xd1" + struct.pack(">II", len(items) + 4, 2) + items

    cases = {
        "array-2^32-1": lambda: b"\xf0" + struct.pack(">II", 5, 0xFFFFFFFF) + b"\x40",
        "array-2^32-1-ints": lambda: b"\xf0" + struct.pack(">II", 9, 0xFFFFFFFF) + b"\x71\x00\x00\x00\x01",
        "list-2^32-1": lambda: b"\xd0" + struct.pack(">II", 5, 0xFFFFFFFF) + b"\x40",
        "map-2^32-1": lambda: b"\xd1" + struct.pack(">II", 5, 0xFFFFFFFF) + b"\x40",
        "nested-described": lambda: b"\x00\x53\x01" * 100000 + b"\x40",
        "lone-surrogate": lambda: b"\xa1\x03\xed\xa0\x80",
    }
    name = rng.choice(sorted(cases))
    return name, section(cases[name]())


def m_amqp10(rng, node):
    """A 4.x AMQP 1.0 message (``#mc{mc_amqp}``, in a .rdq or a .qs) given an application-properties
    section holding a hostile value, the rest of the message intact."""
    rows = [r for r in stored_messages(node) if r["term_format"] == "mc_amqp"]
    if not rows:
        return "no AMQP 1.0 message", None
    row = rng.choice(rows)
    term = etf.binary_to_term(stored_term(row))
    from cqforensics.codecs import amqp10

    bare = term[2][2]
    secs = amqp10.sections(bare)
    name, extra = _hostile_amqp10(rng)
    before = [bare[a:b] for code, _, a, b in secs if code == amqp10.PROPERTIES]
    after = [bare[a:b] for code, _, a, b in secs if code not in (amqp10.PROPERTIES, amqp10.APPLICATION_PROPERTIES)]
    new_bare = b"".join(before) + extra + b"".join(after)
    v1 = list(term[2])
    v1[2] = new_bare
    target = put_term(row, etf.term_to_binary((term[0], term[1], tuple(v1), term[3])))
    return f"{row['location']} AMQP 1.0 message at {row['store_offset']} given a {name} value", os.fsencode(target)


def m_long_name(rng, node):
    """A ``.vhost`` or ``.queue_name`` holding its name followed by a long run of one byte (the
    name of no vhost or queue: 300 bytes to 2 MB)."""
    names = [p for p in _files(node) if p.endswith((b"/.vhost", b"/.queue_name"))]
    p = rng.choice(names)
    n = rng.choice((300, 70000, (1 << 20) + 1, 2 << 20))
    raw = _read(p)
    tail = b"V" * n
    if p.endswith(b".queue_name"):  # VHOST: v\nQUEUE: name\n[INDEX: v2\n]
        q = raw.index(b"\nQUEUE: ") + 8
        end = raw.index(b"\n", q)
        new = raw[:end] + tail + raw[end:]
    else:
        new = raw + tail
    _write(p, new)
    return f"name followed by {n} bytes", p


#: kinds of file whose single-bit flips issue 33 asked about (and every other data file)
BITFLIP_KINDS = (b".qi", b".idx", b"file_summary.ets", b".config", b".rdq", b"journal.jif")


def m_bitflip1(rng, node):
    """One bit flipped in a file of the kinds issue 33 names (Khepri's files included: the Ra
    WAL, its meta and names tables, a server's config)."""
    files = [p for p in _files(node) if p.endswith(BITFLIP_KINDS) or b"/coordination/" in p]
    p = rng.choice([f for f in files if os.path.getsize(f)])
    data = bytearray(_read(p))
    b = rng.randrange(len(data) * 8)
    data[b // 8] ^= 1 << (b % 8)
    _write(p, bytes(data))
    return f"bit {b % 8} of byte {b // 8} flipped", p


# -- osiris (stream) files: structure-aware mutations of segments and indexes ----------------------

#: chunk header fields (offset, size) in the 48-byte header (grammar.osiris.chunk_header)
_CHUNK_FIELDS = {
    "magic_version": (0, 1),
    "chunk_type": (1, 1),
    "num_entries": (2, 2),
    "num_records": (4, 4),
    "timestamp": (8, 8),
    "epoch": (16, 8),
    "chunk_id": (24, 8),
    "crc": (32, 4),
    "data_size": (36, 4),
    "trailer_size": (40, 4),
    "bloom_size": (44, 1),
}
_INDEX_FIELDS = {"chunk_id": (0, 8), "timestamp": (8, 8), "epoch": (16, 8), "file_pos": (24, 4), "chunk_type": (28, 1)}


def _osiris(node, suffix: bytes) -> list[bytes]:
    return [p for p in _files(node) if p.endswith(suffix) and b"/stream/" in p]


def _odd_int(rng, old: int, size: int) -> int:
    """An odd value for a ``size``-byte field holding ``old``, never ``old`` itself (a mutation
    that leaves the bytes as they were is no damage)."""
    top = (1 << (8 * size)) - 1
    picks = [
        v
        for v in (
            0,
            1,
            top,
            top >> 1,
            (old + 1) & top,
            (old - 1) & top,
            old ^ (1 << rng.randrange(8 * size)),
            rng.randrange(top + 1),
        )
        if v != old
    ]
    return rng.choice(picks)


def _walked(p: bytes, data: bytes):
    return r_osiris.walk_segment(Path(os.fsdecode(p)), None, data)[0]


def _fix_crc(data: bytearray, c) -> None:
    """Recompute a chunk's CRC over its (mutated) data: the damage then passes the CRC check and
    reaches the readers of what the data holds."""
    data[c.pos + 32 : c.pos + 36] = struct.pack(">I", zlib.crc32(bytes(data[c.data_pos : c.data_pos + c.data_size])))


def m_osiris_chunk(rng, node):
    """One field of a chunk header set to an odd value (a size, an id, the type, the magic)."""
    segs = _osiris(node, b".segment")
    if not segs:
        return "no stream", None
    p = rng.choice(segs)
    data = bytearray(_read(p))
    seg = _walked(p, bytes(data))
    if not seg.chunks:
        return "no chunk", p
    c = rng.choice(seg.chunks)
    name = rng.choice(sorted(_CHUNK_FIELDS))
    off, size = _CHUNK_FIELDS[name]
    old = int.from_bytes(data[c.pos + off : c.pos + off + size], "big")
    new = _odd_int(rng, old, size)
    data[c.pos + off : c.pos + off + size] = new.to_bytes(size, "big")
    _write(p, bytes(data))
    return f"chunk {c.chunk_id} at {c.pos}: {name} {old} -> {new}", p


def m_osiris_entry(rng, node):
    """An entry header inside a user chunk's data (a simple entry's length; a sub-batch's
    compression, record count, lengths) set to an odd value, the chunk's CRC recomputed."""
    segs = _osiris(node, b".segment")
    if not segs:
        return "no stream", None
    p = rng.choice(segs)
    data = bytearray(_read(p))
    chunks = [c for c in _walked(p, bytes(data)).chunks if c.chunk_type == g_osiris.CHNK_USER and c.complete]
    if not chunks:
        return "no user chunk", p
    c = rng.choice(chunks)
    heads, q, end = [], c.data_pos, c.data_pos + c.data_size
    while q + 4 <= end and len(heads) < 1000:
        if data[q] & 0x80 and q + g_osiris.SUB_BATCH_HEAD_SIZE <= end:
            heads.append(("sub_batch", q))
            q += g_osiris.SUB_BATCH_HEAD_SIZE + int.from_bytes(data[q + 7 : q + 11], "big")
        else:
            heads.append(("simple", q))
            q += 4 + (int.from_bytes(data[q : q + 4], "big") & 0x7FFFFFFF)
    kind, q = rng.choice(heads or [("simple", c.data_pos)])
    if kind == "simple":
        field, off, size = "length", 0, 4
    else:
        field, off, size = rng.choice(
            (("compression byte", 0, 1), ("records", 1, 2), ("uncompressed length", 3, 4), ("length", 7, 4))
        )
    old = int.from_bytes(data[q + off : q + off + size], "big")
    new = _odd_int(rng, old, size)
    data[q + off : q + off + size] = new.to_bytes(size, "big")
    _fix_crc(data, c)
    _write(p, bytes(data))
    return f"chunk {c.chunk_id}: {kind} entry at {q}: {field} {old} -> {new} (CRC recomputed)", p


def m_osiris_tracking(rng, node):
    """Bytes of a chunk's tracking data (a trailer, or a tracking chunk's body with its CRC
    recomputed) set to odd values: a reference length, a block type, a value."""
    segs = _osiris(node, b".segment")
    if not segs:
        return "no stream", None
    p = rng.choice(segs)
    data = bytearray(_read(p))
    chunks = [c for c in _walked(p, bytes(data)).chunks if c.complete and (c.trailer_size or c.chunk_type != 0)]
    if not chunks:
        return "no tracking data", p
    c = rng.choice(chunks)
    if c.chunk_type != g_osiris.CHNK_USER:
        a, n = c.data_pos + 4, c.data_size - 4  # the body of its one simple entry
    else:
        a, n = c.data_pos + c.data_size, c.trailer_size
    if n <= 0:
        return "empty tracking data", p
    at = a + rng.choice((0, 1, rng.randrange(n)))
    old = data[at]
    data[at] = _odd_int(rng, old, 1)
    if c.chunk_type != g_osiris.CHNK_USER:
        _fix_crc(data, c)
    _write(p, bytes(data))
    return f"chunk {c.chunk_id}: tracking byte at {at} {old} -> {data[at]}", p


def m_osiris_index(rng, node):
    """An index file out of step: a record's field set to an odd value, a record zeroed,
    duplicated or moved, or the file cut inside a record."""
    idxs = [p for p in _osiris(node, b".index") if os.path.getsize(p) > g_osiris.IDX_HEADER_SIZE]
    if not idxs:
        return "no stream index", None
    p = rng.choice(idxs)
    data = bytearray(_read(p))
    size = g_osiris.INDEX_RECORD_SIZE
    n = (len(data) - g_osiris.IDX_HEADER_SIZE) // size
    if n == 0:
        return "no record", p
    k = rng.randrange(n)
    at = g_osiris.IDX_HEADER_SIZE + k * size
    what = rng.choice(("field", "zero", "duplicate", "move", "cut"))
    if what == "field":
        name = rng.choice(sorted(_INDEX_FIELDS))
        off, w = _INDEX_FIELDS[name]
        old = int.from_bytes(data[at + off : at + off + w], "big")
        data[at + off : at + off + w] = _odd_int(rng, old, w).to_bytes(w, "big")
        desc = f"record {k}: {name} {old} -> {int.from_bytes(data[at + off : at + off + w], 'big')}"
    elif what == "zero":
        data[at : at + size] = bytes(size)
        desc = f"record {k} zeroed"
    elif what == "duplicate":
        j = rng.randrange(n)
        data[g_osiris.IDX_HEADER_SIZE + j * size : g_osiris.IDX_HEADER_SIZE + (j + 1) * size] = data[at : at + size]
        desc = f"record {k} copied over record {j}"
    elif what == "move":
        rec = bytes(data[at : at + size])
        del data[at : at + size]
        data += rec
        desc = f"record {k} moved to the end"
    else:
        cut = at + rng.randrange(1, size)
        del data[cut:]
        desc = f"cut at {cut}, inside record {k}"
    _write(p, bytes(data))
    return desc, p


def m_osiris_files(rng, node):
    """A stream dir's files out of step: an index or segment deleted, emptied to its header, a
    pair renamed or copied under another chunk id, two segments swapped."""
    segs = _osiris(node, b".segment")
    if not segs:
        return "no stream", None
    p = rng.choice(segs)
    idx = p[: -len(b".segment")] + b".index"
    d = os.path.dirname(p)
    what = rng.choice(
        ("delete-index", "delete-segment", "header-only-segment", "header-only-index", "rename", "copy", "swap")
    )
    if what == "delete-index" and os.path.exists(idx):
        os.unlink(idx)
        return "index deleted", idx
    if what == "delete-segment":
        os.unlink(p)
        return "segment deleted", p
    if what == "header-only-segment":
        _write(p, _read(p)[: g_osiris.LOG_HEADER_SIZE])
        return "segment cut to its header", p
    if what == "header-only-index" and os.path.exists(idx):
        _write(idx, _read(idx)[: g_osiris.IDX_HEADER_SIZE])
        return "index cut to its header", idx
    number = rng.choice((0, 1, 7, 10**19, rng.randrange(1, 10**6)))
    new = os.path.join(d, os.fsencode(g_osiris.file_name(number, "segment")))
    if what in ("rename", "copy") and not os.path.exists(new):
        op = os.rename if what == "rename" else shutil.copyfile
        op(p, new)
        if os.path.exists(idx):
            op(idx, new[: -len(b".segment")] + b".index")
        return f"pair {'renamed' if what == 'rename' else 'copied'} to {os.path.basename(new)!r}", new
    others = [q for q in segs if q != p and os.path.dirname(q) == d]
    if not others:
        os.unlink(p)
        return "segment deleted (no other to swap with)", p
    q = rng.choice(others)
    a, b = _read(p), _read(q)
    _write(p, b)
    _write(q, a)
    return f"swapped with {os.path.basename(q)!r}", p


MUTATIONS = {
    "bitflip": m_bitflip,
    "truncate": m_truncate,
    "zero": m_zero,
    "junk": m_junk,
    "delete": m_delete,
    "swap": m_swap,
    "dup_record": m_dup_record,
    "hostile_term": m_hostile_term,
    "fifo": m_fifo,
    "odd_name": m_odd_name,
    "odd_value": m_odd_value,
    "amqp10": m_amqp10,
    "long_name": m_long_name,
    "bitflip1": m_bitflip1,
    "osiris_chunk": m_osiris_chunk,
    "osiris_entry": m_osiris_entry,
    "osiris_tracking": m_osiris_tracking,
    "osiris_index": m_osiris_index,
    "osiris_files": m_osiris_files,
    "ra_entry": m_ra_entry,
}


def _unpacked(dataset: str) -> None:
    """Unpack the archived datasets (``tests/support/oracle.extract_archives``) unless already done."""
    ds = SAMPLES / dataset
    if (ds / "mnesia").is_dir() or not any(ds.glob("*.tar.gz")):
        return
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from support.oracle import extract_archives
    finally:
        sys.path.remove(str(ROOT / "tests"))
    extract_archives()


def plan(
    seed: int,
    dataset: str | None = None,
    mutation: str | None = None,
    datasets: tuple[str, ...] | None = None,
    mutations: tuple[str, ...] | None = None,
) -> tuple[str, str]:
    """The dataset and mutation of ``seed`` (among ``datasets`` and ``mutations``, default all);
    an osiris mutation drawn for a sample without streams is made on a streams sample instead."""
    rng = random.Random(seed)
    d = rng.choice(datasets or DATASETS)
    m = rng.choice(sorted(mutations or MUTATIONS))
    if (mutation or m).startswith("osiris_") and d not in STREAM_DATASETS and dataset is None:
        d = rng.choice(STREAM_DATASETS)
    return dataset or d, mutation or m


def prepare(
    seed: int,
    work: Path,
    dataset: str | None = None,
    mutation: str | None = None,
    datasets: tuple[str, ...] | None = None,
    mutations: tuple[str, ...] | None = None,
) -> dict:
    """The mutated copy of ``seed``'s dataset under ``work``: {dataset, mutation, what, base, target}."""
    dataset, mutation = plan(seed, dataset, mutation, datasets, mutations)
    base = work / "mnesia"
    _unpacked(dataset)
    shutil.copytree(SAMPLES / dataset / "mnesia", base, symlinks=True)
    node = os.fsencode(next(p for p in sorted(base.iterdir()) if (p / "msg_stores").is_dir()))
    rng = random.Random(f"{seed}:{dataset}:{mutation}")
    what, target = MUTATIONS[mutation](rng, node)
    return {
        "dataset": dataset,
        "mutation": mutation,
        "what": what,
        "base": base,
        "target": os.fsdecode(target) if target is not None else None,
        "changed": _changed(target, base, SAMPLES / dataset / "mnesia"),
    }


def _changed(target, base: Path, original: Path) -> bool | None:
    """Whether the mutation left the target file's bytes different from the sample's (a slot
    copied over an equal one, zeros over zeros or a swap of equal files change nothing: no
    damage, so no finding is owed); None when there is no single target file to compare."""
    if target is None or not os.path.isfile(target):
        return None
    try:
        was = (original / os.path.relpath(os.fsdecode(target), base)).read_bytes()
    except OSError:
        return None
    with open(target, "rb") as f:
        return f.read() != was


# -- commands -------------------------------------------------------------------------------------------

#: writer runs aimed at evidence, each with --force: the mutated copy is the job's input or, for
#: the runs reading the pristine sample instead, another node's data dir that is no input. Every
#: one must be refused (exit 16) and leave the copy as it was.
AIMED = (
    "aimed:compact-onto-input",
    "aimed:export-inside-input",
    "aimed:rebuild-onto-other-node",
    "aimed:read-over-other-node-file",
)
COMMANDS = tuple(
    [f"table:{t}" for t in TABLES]
    + [
        "fsck",
        "fsck --deep --json",
        "fsck --json",
        "dump",
        "dump --deep",
        "export",
        "audit",
        "rebuild",
        "compact",
        "verify",
    ]
    + list(AIMED)
)


def argv_of(command: str, inp: dict, out: Path) -> list[str] | None:
    base = str(inp["base"])
    if command.startswith("dump"):
        target = inp["target"]
        if target is None:
            return None
        return ["dump"] + command.split()[1:] + [target]
    if command == "export":
        return ["export", base, "--all", "--format", "jsonl", "--out", str(out / "export")]
    if command in ("rebuild", "compact"):
        return [command, base, str(out / command)]
    pristine = str(SAMPLES / inp["dataset"] / "mnesia")
    if command == "aimed:compact-onto-input":
        return ["compact", "-q", "--force", base, base]
    if command == "aimed:export-inside-input":
        return ["export", base, "--format", "jsonl", "--force", "--out", os.path.join(base, "export")]
    if command == "aimed:rebuild-onto-other-node":
        return ["rebuild", "-q", "--force", pristine, base]
    if command == "aimed:read-over-other-node-file":
        files = _files(os.fsencode(base))
        return ["read", pristine, "--format", "jsonl", "--force", "--out", os.fsdecode(files[0])] if files else None
    if command == "audit":
        return ["audit", "--json", base]
    return command.split() + [base]


def _address_space() -> int:
    """This process's mapped address space (bytes; 0 where /proc does not say)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _child(command: str, argv, base: str, out_path: str, err_path: str, as_limit: int) -> None:
    """In the forked child: limits, redirections, the command; never returns. The address-space
    limit counts from what the child inherited: a parent that has read a store before (a test
    process) holds a gigabyte of reserved allocator space, which an absolute limit would leave
    no room above."""
    code = 70
    try:
        os.setpgid(0, 0)
        limit = _address_space() + as_limit
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        nul = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nul, 0)
        out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), encoding="utf-8", errors="strict")
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), encoding="utf-8", errors="backslashreplace")
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if command.startswith("table:"):
            try:
                cqforensics.read_table(base, command[6:])
                code = 0
            except CQError as e:
                print(f"{type(e).__name__}: {e}", file=sys.stderr)
                code = e.exit_code
        else:
            try:
                code = cli_main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 16
    except BaseException:
        traceback.print_exc()
        code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) and 0 <= code < 256 else 70)


def run_one(
    command: str, inp: dict, out: Path, wall: float = WALL_LIMIT, as_limit: int = AS_LIMIT, rss_bound: int = RSS_BOUND
) -> dict:
    """One command on the prepared input in a forked child: {command, rc, wall, rss, failure, excerpt}."""
    argv = argv_of(command, inp, out)
    res = {"command": command, "rc": None, "wall": 0.0, "rss_mb": 0.0, "failure": None, "excerpt": ""}
    if argv is None:
        res["skipped"] = True
        return res
    so, se = str(out / f"{command.replace(' ', '_')}.out"), str(out / f"{command.replace(' ', '_')}.err")
    before = tree_digest(os.fsencode(inp["base"]))
    sys.stdout.flush()
    sys.stderr.flush()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(command, argv, str(inp["base"]), so, se, as_limit)
    hung = False
    while True:
        wpid, status, ru = os.wait4(pid, os.WNOHANG)
        if wpid:
            break
        if time.monotonic() - t0 > wall:
            hung = True
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                os.kill(pid, signal.SIGKILL)
            _, status, ru = os.wait4(pid, 0)
            break
        time.sleep(0.01)
    res["wall"] = round(time.monotonic() - t0, 3)
    res["rss_mb"] = round(ru.ru_maxrss / 1024, 1)
    rc = os.waitstatus_to_exitcode(status)
    res["rc"] = rc
    try:
        with open(se, "rb") as f:
            err = f.read().decode("utf-8", "backslashreplace")
    except OSError:
        err = ""
    res["excerpt"] = err[-1500:]
    after = tree_digest(os.fsencode(inp["base"]))
    cli = not command.startswith("table:")
    if hung:
        res["failure"] = "hang"
    elif ru.ru_maxrss * 1024 > rss_bound or "MemoryError" in err:
        res["failure"] = "memory"
    elif rc == 70 or "Traceback" in err or (cli and "internal error" in err):
        res["failure"] = "traceback"
    elif before != after:
        res["failure"] = "modified-input"
    elif rc not in EXIT_CODES:
        res["failure"] = "exit-code"
    elif command in ("rebuild", "compact") and "failed verification" in err:
        res["failure"] = "writer-refused"
    elif command in AIMED and rc != 16:
        res["failure"] = "writer-not-refused"
    return res


def run_seed(
    seed: int,
    work: Path,
    commands=COMMANDS,
    dataset: str | None = None,
    mutation: str | None = None,
    wall: float = WALL_LIMIT,
    as_limit: int = AS_LIMIT,
    rss_bound: int = RSS_BOUND,
    datasets: tuple[str, ...] | None = None,
    mutations: tuple[str, ...] | None = None,
) -> dict:
    """Prepare ``seed``'s input and run every command on it: {seed, dataset, mutation, what, runs}."""
    d = Path(tempfile.mkdtemp(prefix=f"seed{seed}-", dir=work))
    try:
        inp = prepare(seed, d, dataset, mutation, datasets, mutations)
        out = d / "out"
        out.mkdir()
        runs = [run_one(c, inp, out, wall, as_limit, rss_bound) for c in commands]
        reported = _reported(inp, out, runs)
        return {
            "seed": seed,
            "dataset": inp["dataset"],
            "mutation": inp["mutation"],
            "what": inp["what"],
            "target": inp["target"],
            "runs": runs,
            "reported": reported,
            "undetectable": undetectable(inp) if reported is False else None,
        }
    finally:
        shutil.rmtree(d, ignore_errors=True)


#: mutations that change the bytes of one data file: fsck should name that file (a hostile term is
#: only decoded by ``--deep``, whose findings the decode tests pin, so it is not counted here)
DAMAGING = frozenset(
    {
        "bitflip",
        "truncate",
        "zero",
        "junk",
        "swap",
        "dup_record",
        "odd_value",
        "amqp10",
        "long_name",
        "bitflip1",
        "osiris_chunk",
        "osiris_entry",
        "osiris_tracking",
        "osiris_index",
        "ra_entry",
    }
)


def _reported(inp: dict, out: Path, runs: list[dict]) -> bool | None:
    """Whether ``fsck --json`` or ``fsck --deep --json`` named the mutated file (or one inside a
    mutated dir) in a finding;
    None when not applicable (no such run, a mutation that changes no file's bytes, no target).
    Not every mutation is damage (a flipped bit in a padding byte, zeros over zeros), so a False
    is for triage (``silent`` in the summary), not a failure."""
    if inp["mutation"] not in DAMAGING or not inp["target"] or inp.get("changed") is False:
        return None
    findings = []
    for command in ("fsck --json", "fsck --deep --json"):  # --deep decodes what the index refers to
        run = next((x for x in runs if x["command"] == command and x["rc"] in (0, 4)), None)
        if run is None:
            continue
        try:
            report = json.loads((out / f"{command.replace(' ', '_')}.out").read_bytes().decode("utf-8", "replace"))
        except (OSError, ValueError):
            continue
        findings += report.get("findings", [])
    if not findings and not any(x["command"].startswith("fsck") and x["rc"] in (0, 4) for x in runs):
        return None
    target = os.path.realpath(inp["target"])
    files = {os.path.realpath(f["file"]) for f in findings if f.get("file")}
    if any(f == target or target.startswith(f + os.sep) for f in files):
        return True
    # a file of a queue dir: a finding about that queue counts (a damaged .qi shows in its .qs, or
    # in recovery.dets' terms for the queue)
    qdir = os.path.dirname(target)
    if os.path.basename(os.path.dirname(qdir)) != "queues":
        return False
    if any(os.path.dirname(f) == qdir for f in files):
        return True
    try:
        name = textfiles.parse_queue_name((Path(qdir) / ".queue_name").read_bytes()).base.decode("utf-8", "replace")
    except (OSError, CQError):
        return False
    return any(f.get("queue") is not None and f["queue"].split("[p")[0] == name for f in findings)


def undetectable(inp: dict) -> str | None:
    """Why no check can see what the mutation changed, when it is one of the changes documented
    as undetectable (docs/hostile.md, the bit-flip table; docs/findings.md "What damage does"), else None
    (then the silence is unexplained). The classes: stored message bodies changed in place
    (``_payload_only``), a file that still says what it said (``_same_content``), two vhosts'
    retained stores swapped, and changed bytes each of a kind nothing cross-checks
    (``_byte_classes``)."""
    target = inp.get("target")
    if not target or not os.path.isfile(target):
        return None
    original = SAMPLES / inp["dataset"] / "mnesia" / os.path.relpath(target, inp["base"])
    if _same_content(original, Path(target)):
        return "same-content"
    if _payload_only(inp):
        return "retained-swap" if inp.get("mutation") == "swap" else "payload"
    if _same_delivery(inp):
        return "delivered-same"
    try:
        was, now = original.read_bytes(), Path(target).read_bytes()
    except OSError:
        return None
    if len(was) != len(now):
        return None
    changed = [i for i in range(len(was)) if was[i] != now[i]] if len(was) < (64 << 20) else None
    if not changed:
        return None
    classes = _byte_classes(inp["dataset"], original, was, now, changed)
    if classes and all(c in UNDETECTABLE for c in classes):
        return "+".join(sorted(set(classes)))
    return None


#: byte classes no check can see a change in, and why (docs/hostile.md has the same table)
UNDETECTABLE = {
    "qi.expiry": "a live .qi slot's expiry: an absolute time; nothing records the publish time or TTL it came from "
    "(a time already past is found: the message is expired)",
    "qi.dead": "a .qi slot the broker treats as acked (status 0 with a location: dropped by an earlier recovery) or "
    "a transient slot's message fields: the next boot reads neither",
    "qi.amqp10-size": "the size field of an AMQP 1.0 message's slot (the broker's mc:size of its sections, not "
    "recomputed here)",
    "v1.expiry": "a CQv1 publish record's expiry (as a .qi slot's)",
    "v1.dead": "a CQv1 record of an entry acked since (its publish, deliver and ack records): never used again",
    "v1.seq": "a CQv1 record's RelSeq (journal: seq id) changed to another free one below the segment entry count: "
    "the message moves within its queue; a CQv1 index has no checksum",
    "rdq.dead": "an entry no index refers to (an orphan, or a second copy): nothing reads it, its id included",
    "ets.info-run": "the id, owner pid or memory words of a dump's table info: the run's own values",
    "config.count": "a vhost .config's segment entry count changed to another valid count that no CQv1 record "
    "contradicts",
    "wal.trunc": "a Ra WAL record's truncate bit: not covered by its checksum, and as plausible either way",
    "term.value": "a value inside a DETS table, a Ra server config or a WAL writers snapshot that keeps its writer's "
    "shape (a term, a timeout, a name): as plausible as the original",
    "osiris.tracking": "a stream tracking byte no other block repeats: a consumer offset or timestamp value, a "
    "writer's last sequence block with no later snapshot comparing it, a snapshot the blocks before it were "
    "deleted from (docs/streams.md)",
}


def _live_rows(dataset: str) -> dict:
    """(index file relative to the mnesia base, offset) -> the ``messages`` row of each live
    entry of the sample, cached per dataset."""
    hit = _LIVE.get(dataset)
    if hit is None:
        base = SAMPLES / dataset / "mnesia"
        t = cqforensics.read_table(base, "messages", columns=["file", "offset", "term_format", "persistent"])
        hit = _LIVE[dataset] = {(os.path.relpath(r["file"], base), r["offset"]): r for r in t.to_pylist()}
    return hit


_LIVE: dict = {}


def _byte_classes(dataset: str, original: Path, was: bytes, now: bytes, changed: list[int]) -> list[str] | None:
    """The class of each changed byte of a file (``UNDETECTABLE`` keys, or a name of a class
    some check sees: anything else), None when the kind of file has no classes here."""
    name = original.name
    rel = os.path.relpath(original, SAMPLES / dataset / "mnesia")
    live = _live_rows(dataset)
    if name.endswith(".qi"):
        out = []
        for off in changed:
            if off < c_qi.HEADER_SIZE:
                out.append("qi.header")
                continue
            slot = (off - c_qi.HEADER_SIZE) // c_qi.ENTRY_SIZE
            at = c_qi.HEADER_SIZE + slot * c_qi.ENTRY_SIZE
            r = off - at
            s = was[at : at + c_qi.ENTRY_SIZE]
            status, flags, kind = s[0], s[1], s[3]
            row = live.get((rel, at))
            if status == 0 and kind in (1, 2) and r > 3:
                out.append("qi.dead")  # a ghost (a location, status 0): dropped by an earlier recovery
            elif status == 1 and flags == 0 and r >= 4 and not (kind == 2 and 16 <= r < 20):
                out.append("qi.dead")  # transient: dropped reading its status and flag only
            elif status == 1 and row is not None and r >= 24:
                out.append("qi.expiry")
            elif status == 1 and row is not None and 20 <= r < 24 and (row["term_format"] or "").startswith("mc_amqp"):
                out.append("qi.amqp10-size")
            else:
                out.append("qi.slot")
        return out
    if name.endswith(".idx") or name == "journal.jif":
        return _v1_classes(name, rel, was, now, changed, live)
    if name.endswith(".rdq"):
        return _rdq_classes(dataset, original, was, changed)
    if name.endswith(".ets"):
        from cqforensics.readers import terms as r_terms

        log = r_terms.read_disk_log(original)
        if len(log.offsets) < 2:
            return None
        info_start, info_end = log.offsets[0] + 8, log.offsets[1]
        run_words = [i for k in (b"\x5a\x00", b"\x58", b"memory") for i in _spans(was[info_start:info_end], k)]
        return [
            "ets.info-run"
            if info_start <= off < info_end and any(a <= off - info_start < b for a, b in run_words)
            else "ets"
            for off in changed
        ]
    if name == ".config":
        try:
            count = textfiles.segment_entry_count(now)
        except CQError:
            return ["config"]
        return ["config.count" if count is not None else "config"] * len(changed)
    if name.endswith(".wal"):
        return [
            "wal.trunc" if _wal_record_start(was, off) and now[off] ^ was[off] == 0x80 else "wal" for off in changed
        ]
    if name.endswith(".dets") or name == "config" or name == "writers.snapshot":
        return ["term.value" if _same_shape(original, Path(original), was, now) else "term"] * len(changed)
    if name.endswith(".segment"):
        return _segment_classes(original, now, changed)
    return None


def _tracking_blocks(data: bytes, start: int, end: int, snapshot: bool):
    """(start, reference end, value start, end, kind, reference) of each tracking block in
    ``data[start:end]`` (the grammar of readers/osiris parse_tracking)."""
    p = start
    while p + 2 <= end:
        typ, n = data[p], data[p + 1]
        kind = g_osiris.TRACKING_TYPES.get(typ)
        q = p + 2 + n
        v = q + (8 if snapshot and kind == "sequence" else 0)
        if kind is None or v + 8 > end:
            return
        yield p, q, v, v + 8, kind, bytes(data[p + 2 : q])
        p = v + 8


def _segment_classes(original: Path, now: bytes, changed: list[int]) -> list[str]:
    """The class of each changed byte of a stream segment: ``osiris.tracking`` for tracking bytes
    no other block repeats (docs/streams.md: a consumer offset or timestamp value; a writer's
    sequence, reference or snapshot chunk id with no later block of that writer and no later
    snapshot that compares it; a snapshot the blocks before it cannot be compared with, as
    the first of a stream whose earlier segments retention deleted), ``osiris`` otherwise (chunk
    headers and data are CRC-checked and framed; tracking bytes another block repeats are
    compared: readers/osiris compare_tracking)."""
    scan = r_osiris.read_stream(original.parent)
    chunks = scan.chunks
    order = {(c.file, c.pos): k for k, c in enumerate(chunks)}
    was = original.read_bytes()
    snapshots = [k for k, c in enumerate(chunks) if c.chunk_type == g_osiris.CHNK_TRK_SNAPSHOT]
    # a snapshot is compared with the blocks before it once the state is known: from chunk 0, or
    # after an earlier snapshot
    checked = {k for k in snapshots if chunks[0].chunk_id == 0 or any(j < k for j in snapshots)}
    out = []
    for off in changed:
        c = next((c for c in chunks if c.file == str(original) and c.pos <= off < c.end), None)
        if c is None:
            out.append("osiris")
            continue
        k = order[(c.file, c.pos)]
        if c.chunk_type == g_osiris.CHNK_USER:
            start, end = c.data_pos + c.data_size, c.end
        else:
            start, end = c.data_pos + 4, c.data_pos + c.data_size  # the body of its one simple entry
        snap = c.chunk_type == g_osiris.CHNK_TRK_SNAPSHOT
        block = next((b for b in _tracking_blocks(was, start, end, snap) if b[0] <= off < b[3]), None)
        if block is None or off == block[0] + 1:  # outside tracking data, or a block's length
            out.append("osiris")
            continue
        b0, ref_end, v0, b_end, kind, ref = block
        if off == b0:  # its type: another kind of block for the same reference
            new_kind = g_osiris.TRACKING_TYPES.get(now[off])
            later_snapshot = any(j > k or j == k and snap for j in checked)
            out.append("osiris.tracking" if new_kind and not later_snapshot and not snap else "osiris")
            continue
        if kind != "sequence":
            # a consumer offset: only a lacking reference is compared (an offset at or above the
            # stream's first, at a snapshot that compares the state); a timestamp: nothing
            value = int.from_bytes(was[v0:b_end], "big")
            compared = any(j > k or j == k and snap for j in checked) and value >= (scan.first_offset or 0)
            out.append("osiris" if kind == "offset" and off < ref_end and compared else "osiris.tracking")
            continue
        if snap and k in checked:
            out.append("osiris")  # compared whole with the state before it
            continue
        mine = [(order[(t.file, t.pos)], t) for t in scan.tracking if t.kind == "sequence" and t.reference == ref]
        prev = [t for j, t in mine if j < k]
        nxt = [t for j, t in mine if j > k]
        # the first snapshot after this block that compares the state, and whether this block is
        # then the writer's last (what the snapshot's copy is compared with)
        s_next = min((j for j in checked if j > k), default=None)
        s_copy = next((t for j, t in mine if j == s_next), None)
        last_before = (
            s_copy is not None
            and s_copy.chunk_id < chunks[s_next].chunk_id  # not the write that rolled the segment
            and not any(j < s_next for j, _ in mine if j > k)
        )
        if off < ref_end:  # the reference: the block moves to another writer
            out.append("osiris" if s_next is not None else "osiris.tracking")
        elif off < v0:  # a snapshot's chunk id for the writer
            new_chunk = int.from_bytes(now[ref_end:v0], "big")
            out.append("osiris" if new_chunk > c.chunk_id or last_before else "osiris.tracking")
        else:  # the value
            new = int.from_bytes(now[v0:b_end], "big")
            loose = lambda t: snap or t.source == "snapshot"  # noqa: E731 - a snapshot's copy may repeat a value
            seen = (prev and (new < prev[-1].value or new == prev[-1].value and not loose(prev[-1]))) or (
                nxt and (new > nxt[0].value or new == nxt[0].value and not loose(nxt[0]))
            )
            out.append("osiris" if seen or last_before else "osiris.tracking")
    return out


def _spans(data: bytes, key: bytes):
    """(start, end) ranges of the run's own words in a table-info item: a reference (``Z``) or a
    pid (``X``) term, and the ``memory`` count (the small integer after the atom)."""
    i = data.find(key)
    while i >= 0:
        yield i, i + (40 if key != b"memory" else 16)
        i = data.find(key, i + 1)


def _wal_record_start(data: bytes, off: int) -> bool:
    """Whether ``off`` is the first byte of a Ra WAL record (its truncate bit is that byte's top bit)."""
    o = 5
    while o + 27 <= len(data):
        if o == off:
            return True
        h = int.from_bytes(data[o : o + 3], "big")
        if h == 0 and not any(data[o : o + 32]):
            return False
        p = o + 3
        if not h >> 22 & 1:
            p += 2 + int.from_bytes(data[p : p + 2], "big")
        if p + 24 > len(data):
            return False
        (length,) = struct.unpack_from(">I", data, p + 4)
        o = p + 24 + length
        if o > off:
            return False
    return False


def _shape(t):
    """A decoded term's shape: its kinds and sizes, not its values (binaries and atoms by kind)."""
    if isinstance(t, tuple):
        return ("t", tuple(_shape(x) for x in t))
    if isinstance(t, list):
        return ("l", len(t))
    if isinstance(t, dict):
        return ("m", tuple(sorted(str(k) for k in t)))
    return type(t).__name__


def _same_shape(original: Path, _target: Path, was: bytes, now: bytes) -> bool:
    """Whether a term file (a DETS table's objects, a Ra config, a writers snapshot) holds terms
    of the same shapes as before, only values changed."""
    from cqforensics.readers import terms as r_terms

    try:
        if original.name.endswith(".dets"):
            a, b = r_terms.read_dets_objects(original, was), r_terms.read_dets_objects(original, now)
        elif original.name == "config":
            a, b = textfiles.consult(was), textfiles.consult(now)
        else:
            a, b = [etf.decode(was)[0]], [etf.decode(now)[0]]
    except (CQError, ValueError, IndexError):
        return False
    return len(a) == len(b) and [_shape(x) for x in a] == [_shape(x) for x in b]


def _v1_classes(name: str, rel: str, was: bytes, now: bytes, changed: list[int], live: dict) -> list[str]:
    """Classes of the changed bytes of a CQv1 segment or journal: by record (its head, fields,
    embedded term) and whether its entry is live (a publish the ``messages`` table lists)."""
    jif = name == "journal.jif"
    head = 8 if jif else 2
    seq_mask = (1 << 62) - 1 if jif else 0x3FFF
    records = []  # (start, end, kind, live, seq)
    o = 0
    while o + head <= len(was):
        h = int.from_bytes(was[o : o + head], "big")
        pub = (h >> 62) <= 1 if jif else bool(h & 0x8000)
        if jif and h == 0 and not any(was[o : o + 40]):
            break
        if not pub:
            records.append((o, o + head, "ack", False, h & seq_mask))
            o += head
            continue
        if o + head + 32 > len(was):
            break
        (emb,) = struct.unpack_from(">I", was, o + head + 28)
        records.append((o, o + head + 32 + emb, "pub", (rel, o) in live, h & seq_mask))
        o += head + 32 + emb
    used = {seq for *_, seq in records}
    out = []
    for off in changed:
        rec = next((r for r in records if r[0] <= off < r[1]), None)
        if rec is None:
            out.append("v1")
            continue
        start, _, kind, is_live, seq = rec
        r = off - start
        if kind == "pub" and not is_live and r >= head:
            out.append("v1.dead")
        elif kind == "pub" and head + 16 <= r < head + 24:
            out.append("v1.expiry")
        elif r < head and not (now[off] ^ was[off]) & ~(0x3F if r == 0 else 0xFF):
            # only the RelSeq (seq id) bits changed: to a free one below the segment entry count
            # (2048 on every sample; at or past it is found)
            new_seq = int.from_bytes(now[start : start + head], "big") & seq_mask
            out.append("v1.seq" if new_seq not in used and (jif or new_seq < 2048) else "v1")
        else:
            out.append("v1")
    return out


def _rdq_classes(dataset: str, original: Path, was: bytes, changed: list[int]) -> list[str]:
    """``rdq.dead`` for bytes of an entry the ``store`` table of the sample does not call live."""
    key = ("rdq", dataset)
    entries = _LIVE.get(key)
    if entries is None:
        base = SAMPLES / dataset / "mnesia"
        t = cqforensics.read_table(base, "store", columns=["file", "offset", "total_size", "status"])
        entries = _LIVE[key] = [(r["file"], r["offset"], r["total_size"], r["status"]) for r in t.to_pylist()]
    mine = [(o, o + n, st) for f, o, n, st in entries if f == str(original)]
    out = []
    for off in changed:
        e = next((x for x in mine if x[0] <= off < x[1]), None)
        out.append("rdq.dead" if e is not None and e[2] != "live" and off >= e[0] + 8 else "rdq")
    return out


def _payload_only(inp: dict) -> bool:
    """Whether the mutation changed only values inside stored messages, where no tool can tell
    without another copy: a CQv1 index file whose ``dump`` rows (bodies not decoded) are those of
    the sample's file (a CQv1 index has no checksum; a second copy shows as
    ``message-copies-differ``), or a shared-store ``.rdq`` whose ``dump --deep`` rows are the
    sample's but for the messages' values (the same entries, ids and sizes, each decoding, with
    nothing a row would mark, to a message of the same format and body size; its body bytes,
    header values, message id property, exchange or routing keys may differ: ``rabbit_msg_file``
    frames an entry with no checksum, and the broker delivers the changed message as stored)."""
    target = inp.get("target")
    if not target or not os.path.isfile(target):
        return False
    if _same_content(SAMPLES / inp["dataset"] / "mnesia" / os.path.relpath(target, inp["base"]), Path(target)):
        return True
    if (
        inp.get("mutation") == "swap"
        and Path(target).name.startswith("mqtt_retained_")
        and "'mqtt_retained_" in inp.get("what", "")
    ):
        return True  # two vhosts' MQTT retained stores swapped: no record names its vhost (only the file name)
    v1 = target.endswith(".idx") or target.endswith("journal.jif")
    if not (v1 or target.endswith(".rdq")):
        return False
    from cqforensics.commands.dump import dump

    original = SAMPLES / inp["dataset"] / "mnesia" / os.path.relpath(target, inp["base"])

    def rows(path):
        if v1:
            return list(dump(path))
        return [{k: v for k, v in row.items() if k not in _VALUES} for row in dump(path, deep=True)]

    try:
        return original.read_bytes() != Path(target).read_bytes() and rows(original) == rows(target)
    except CQError:
        return False


#: the ``messages`` columns that say where a message is stored, not what is delivered
_PLACES = frozenset({"file", "offset", "store_file", "store_offset"})


def _same_delivery(inp: dict) -> bool:
    """Whether a changed message file (``.qs``, ``.qi``, ``.rdq``) leaves every message the node
    delivers as it was: the ``messages`` rows of the mutated copy are the sample's but for where
    a message is stored (the rows are what the broker hands a consumer: mc_amqpl:protocol_state
    builds an AMQP 0-9-1 message's timestamp, priority, expiration and delivery mode from its
    annotations, so a stored properties field it overrides is read by nothing)."""
    target = inp.get("target") or ""
    if not target.endswith((".qs", ".qi", ".rdq")):
        return False

    def rows(base):
        t = cqforensics.read_table(base, "messages")
        return sorted(
            json.dumps({k: v for k, v in r.items() if k not in _PLACES}, sort_keys=True, default=str)
            for r in t.to_pylist()
        )

    try:
        return rows(SAMPLES / inp["dataset"] / "mnesia") == rows(inp["base"])
    except CQError:
        return False


#: what a ``dump --deep`` row shows of a stored message's values (a change to them is no change to
#: the store's structure; ``decode_error`` is kept: a value a row marks is found by ``--deep``)
_VALUES = frozenset({"body_sha256", "body_preview", "exchange", "routing_keys", "message_id", "headers"})


def _same_content(original: Path, target: Path) -> bool:
    """Whether a changed file still says what it said, as its readers (ours, and the broker's)
    read it: a text term file (``file:consult``) with the same terms (a trailing newline cut, a
    space added), or a Mnesia log (disk_log) with the same items but for its header's time stamp
    (two empty logs of one node swapped)."""
    from cqforensics.readers import terms as r_terms

    try:
        if target.suffix in (".DCL", ".DCD", ".LOG"):
            a, b = r_terms.read_disk_log(original), r_terms.read_disk_log(target)
            if a.error or b.error or a.closed != b.closed:
                return False

            def items(log):
                return [i[:5] if isinstance(i, tuple) and i and i[0] == "log_header" else i for i in log.items]

            return items(a) == items(b)
        if target.name.endswith(".config") or target.name in ("clean.dot", "nodes_running_at_shutdown"):
            return textfiles.consult(original.read_bytes()) == textfiles.consult(target.read_bytes())
    except (CQError, OSError, ValueError, RecursionError):
        return False
    return False


def _reproducer(r: dict, run: dict) -> str:
    return (
        f"python3 fuzz/campaign.py --replay {r['seed']} --dataset {r['dataset']} --mutation {r['mutation']} "
        f"--command '{run['command']}'"
    )


def _operational(results: list[dict]) -> dict[str, int]:
    """Exit-8 runs that are no failure (an operational error naming its path), counted by the
    command and the message's gist (paths cut), to see what the tool refuses and why."""
    import re

    out: dict[str, int] = {}
    for r in results:
        for x in r["runs"]:
            if x["rc"] == 8 and not x.get("failure"):
                line = (x["excerpt"].strip().splitlines() or [""])[-1]
                gist = re.sub(r"/\S*", "PATH", line)[:120]
                key = f"{x['command']}: {gist}"
                out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def summarize(results: list[dict], elapsed: float) -> dict:
    runs = [x for r in results for x in r["runs"] if not x.get("skipped")]
    failures: dict[str, list[dict]] = {}
    for r in results:
        for x in r["runs"]:
            if x.get("failure"):
                failures.setdefault(x["failure"], []).append(
                    {
                        "seed": r["seed"],
                        "dataset": r["dataset"],
                        "mutation": r["mutation"],
                        "what": r["what"],
                        "command": x["command"],
                        "rc": x["rc"],
                        "reproducer": _reproducer(r, x),
                        "stderr": x["excerpt"][-600:],
                    }
                )
    return {
        "seeds": sorted(r["seed"] for r in results),
        "inputs": len(results),
        "runs": len(runs),
        "failures": sum(len(v) for v in failures.values()),
        "by_class": {k: len(v) for k, v in sorted(failures.items())},
        "tracebacks": len(failures.get("traceback", [])),
        "hangs": len(failures.get("hang", [])),
        "modified_inputs": len(failures.get("modified-input", [])),
        "max_rss_mb": max((x["rss_mb"] for x in runs), default=0.0),
        "max_wall_s": max((x["wall"] for x in runs), default=0.0),
        "mutations": {m: sum(1 for r in results if r["mutation"] == m) for m in sorted(MUTATIONS)},
        "exit_codes": {str(c): sum(1 for x in runs if x["rc"] == c) for c in sorted({x["rc"] for x in runs})},
        "operational_errors": _operational(results),
        "silent": [
            {
                "seed": r["seed"],
                "dataset": r["dataset"],
                "mutation": r["mutation"],
                "what": r["what"],
                "target": r["target"],
            }
            for r in results
            if r.get("reported") is False and not r.get("undetectable")
        ],
        # silent, but a change documented as undetectable (``undetectable``: message bodies changed in
        # place, a file that says what it said, bytes of a kind nothing cross-checks), with the class
        "undetectable": [
            {
                "seed": r["seed"],
                "dataset": r["dataset"],
                "what": r["what"],
                "target": r["target"],
                "why": r["undetectable"],
            }
            for r in results
            if r.get("reported") is False and r.get("undetectable")
        ],
        "reported": sum(1 for r in results if r.get("reported")),
        "elapsed_s": round(elapsed, 1),
        "failed": failures,
    }


def _worker(args):
    seed, work, commands, wall, as_limit, rss_bound, datasets, mutations = args
    return run_seed(
        seed,
        Path(work),
        commands,
        wall=wall,
        as_limit=as_limit,
        rss_bound=rss_bound,
        datasets=datasets,
        mutations=mutations,
    )


def campaign(
    seeds,
    *,
    jobs: int = 2,
    commands=COMMANDS,
    wall: float = WALL_LIMIT,
    as_limit: int = AS_LIMIT,
    rss_bound: int = RSS_BOUND,
    budget: float | None = None,
    work: Path | None = None,
    progress=None,
    datasets: tuple[str, ...] | None = None,
    mutations: tuple[str, ...] | None = None,
) -> dict:
    """Runs ``seeds`` (``jobs`` seeds at a time) and returns the summary. ``budget``: stop starting
    new seeds after that many seconds."""
    import multiprocessing as mp

    t0 = time.monotonic()
    own = work is None
    work = Path(tempfile.mkdtemp(prefix="cqf-fuzz-")) if own else work
    results = []
    try:
        tasks = [(s, str(work), tuple(commands), wall, as_limit, rss_bound, datasets, mutations) for s in seeds]
        ctx = mp.get_context("fork")
        with ctx.Pool(max(1, jobs), maxtasksperchild=20) as pool:
            pending = []
            it = iter(tasks)
            while True:
                while len(pending) < jobs * 2 and (budget is None or time.monotonic() - t0 < budget):
                    t = next(it, None)
                    if t is None:
                        break
                    pending.append(pool.apply_async(_worker, (t,)))
                if not pending:
                    break
                r = pending.pop(0).get()
                results.append(r)
                if progress:
                    progress(r)
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    return summarize(results, time.monotonic() - t0)


REGRESSIONS = Path(__file__).resolve().parent / "regressions.json"


def regressions() -> list[dict]:
    return json.loads(REGRESSIONS.read_text()) if REGRESSIONS.exists() else []


def replay(entry: dict, work: Path) -> dict:
    """One regression case ({dataset, seed, mutation, command? or commands?}) run again."""
    cmds = (entry["command"],) if entry.get("command") else tuple(entry.get("commands") or COMMANDS)
    return run_seed(entry["seed"], work, cmds, dataset=entry["dataset"], mutation=entry["mutation"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=500, help="at least this many runs (one command on one input)")
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--jobs", type=int, default=2, help="inputs fuzzed at once")
    ap.add_argument("--wall", type=float, default=WALL_LIMIT, help="seconds a run may take")
    ap.add_argument("--rss-mb", type=int, default=RSS_BOUND >> 20, help="peak RSS bound of a run (MB)")
    ap.add_argument(
        "--as-mb",
        type=int,
        default=AS_LIMIT >> 20,
        help="address space a run may add to the process it forks from (MB)",
    )
    ap.add_argument("--budget", type=float, help="stop starting inputs after this many seconds")
    ap.add_argument("--out", help="write the JSON summary here (default: stdout)")
    ap.add_argument("--replay", type=int, metavar="SEED", help="run one seed again")
    ap.add_argument("--dataset", choices=DATASETS)
    ap.add_argument("--mutation", choices=sorted(MUTATIONS))
    ap.add_argument("--command", choices=COMMANDS)
    ap.add_argument("--keep", action="store_true", help="with --replay: keep the mutated copy and outputs")
    ap.add_argument("--streams", action="store_true", help="draw only the samples holding streams (osiris files)")
    ap.add_argument("--mutations", help="comma-separated: draw only these mutations (e.g. the osiris_* ones)")
    a = ap.parse_args(argv)
    if a.replay is not None:
        work = Path(tempfile.mkdtemp(prefix="cqf-fuzz-replay-"))
        cmds = (a.command,) if a.command else COMMANDS
        if a.keep:
            inp = prepare(a.replay, work, a.dataset, a.mutation)
            (work / "out").mkdir()
            r = {
                "seed": a.replay,
                **{k: inp[k] for k in ("dataset", "mutation", "what", "target")},
                "runs": [run_one(c, inp, work / "out", a.wall, a.as_mb << 20, a.rss_mb << 20) for c in cmds],
            }
            print(f"kept in {work}", file=sys.stderr)
        else:
            r = run_seed(a.replay, work, cmds, a.dataset, a.mutation, a.wall, a.as_mb << 20, a.rss_mb << 20)
            shutil.rmtree(work, ignore_errors=True)
        print(json.dumps(r, indent=1, default=str))
        return 1 if any(x.get("failure") for x in r["runs"]) else 0
    per_seed = len(COMMANDS)
    seeds = range(a.seed, a.seed + max(1, -(-a.runs // per_seed)))

    def progress(r):
        bad = [x["command"] for x in r["runs"] if x.get("failure")]
        print(
            f"seed {r['seed']} {r['dataset']} {r['mutation']}: {r['what'][:70]}" + (f"  FAIL {bad}" if bad else ""),
            file=sys.stderr,
            flush=True,
        )

    s = campaign(
        seeds,
        jobs=a.jobs,
        wall=a.wall,
        as_limit=a.as_mb << 20,
        rss_bound=a.rss_mb << 20,
        budget=a.budget,
        progress=progress,
        datasets=STREAM_DATASETS if a.streams else None,
        mutations=tuple(a.mutations.split(",")) if a.mutations else None,
    )
    text = json.dumps(s, indent=1, default=str)
    if a.out:
        Path(a.out).write_text(text + "\n")
    else:
        print(text)
    print(
        f"{s['runs']} runs on {s['inputs']} inputs: {s['failures']} failures {s['by_class']}, "
        f"max RSS {s['max_rss_mb']} MB, slowest {s['max_wall_s']} s",
        file=sys.stderr,
    )
    return 1 if s["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
