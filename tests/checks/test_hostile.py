"""Hostile input: no crash, no hang, bounded memory, no silent damage.

Each test crafts damaged input from a private copy of a real sample (sample_data is never
modified); the crafted bytes are the only hand-made part and are labelled as such. The command
line runs through ``cli.main.main`` so a traceback or a hang fails the test."""

from __future__ import annotations

import glob
import os
import struct
import time
from pathlib import Path

import pytest

import cqforensics
from cli.main import main
from cqforensics.grammar import idx as c_idx
from cqforensics.grammar import jif as c_jif
from cqforensics.grammar import qi as c_qi
from cqforensics.readers import qi as r_qi
from cqforensics.readers import v1 as r_v1
from support import copy_node

COMMANDS = ("fsck", "audit", "read", "export")


def run_cli(args, capsys) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out, err
    return rc, out, err


def every_command(
    node: Path,
    tmp_path: Path,
    capsys,
    tables=("messages", "index", "acks", "queues", "files", "store", "holes", "findings"),
) -> dict:
    """Runs every read-only command and every table on ``node``'s mnesia base: no traceback, no
    operational error (exit 8); returns the exit codes."""
    base = str(node.parent)
    rcs = {
        "fsck": run_cli(["fsck", "--json", "--deep", base], capsys)[0],
        "audit": run_cli(["audit", "--json", base], capsys)[0],
        "export": run_cli(["export", base, "--all", "--format", "jsonl", "--out", str(tmp_path / "x-jsonl")], capsys)[
            0
        ],
        "export-parquet": run_cli(["export", base, "--format", "parquet", "--out", str(tmp_path / "x-pq")], capsys)[0],
    }
    for t in tables:
        rcs[t] = run_cli(
            ["read", base, "--table", t, "--format", "jsonl", "--out", str(tmp_path / f"{t}.jsonl")], capsys
        )[0]
    assert all(rc in (0, 1, 4) for rc in rcs.values()), rcs
    return rcs


def findings(node: Path, code: str) -> list[tuple[str, int | None]]:
    return [
        (Path(f["file"]).name, f["offset"])
        for f in cqforensics.read_table(node, "findings").to_pylist()
        if f["code"] == code
    ]


# -- 1. out-of-range numbers --------------------------------------------------------------------------

BIG = (1 << 64) - 1  # crafted: an expiry no int64 column holds


def _first_publish_v2(node: Path) -> tuple[Path, int]:
    for p in sorted(node.glob("msg_stores/vhosts/*/queues/*/*.qi")):
        seg = r_qi.read_qi(p, int(p.stem))
        used = [i for i, k in enumerate(seg.slots["status"].tolist()) if k == 1]
        if used:
            return p, int(seg.offsets()[used[0]])
    raise AssertionError("no live .qi slot")


def _first_publish_v1(node: Path, name: str) -> tuple[Path, int]:
    for p in sorted(node.glob(f"msg_stores/vhosts/*/queues/*/{name}")):
        if name == "journal.jif":
            recs = r_v1.read_v1_queue([], p, 16384).records
        else:
            recs = r_v1.read_v1_queue([(int(p.stem), p)], None, 16384).records
        pubs = [r for r in recs if r.kind == "publish"]
        if pubs:
            return p, pubs[0].offset
    raise AssertionError(f"no {name} publish record")


def _poke(path: Path, at: int, raw: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(raw)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, value", [("qi", BIG), ("qi", 1 << 63), ("qi", 253402300800 * 10**6), ("idx", BIG), ("jif", 1 << 63)]
)
def test_expiry_out_of_range_is_null_and_a_finding(kind, value, tmp_path, capsys):
    if kind == "qi":
        node = copy_node("4.3.6-kill", tmp_path / "mnesia")
        path, off = _first_publish_v2(node)
        at = off + c_qi.ENTRY_DTYPE.fields["expiry"][1]
    else:
        node = copy_node("3.10.8-kill", tmp_path / "mnesia")
        name = "journal.jif" if kind == "jif" else "*.idx"
        path, off = _first_publish_v1(node, name)
        at = off + (c_jif.PUB.size - 16 if kind == "jif" else c_idx.PUB.size - 16)  # the expiry field
    _poke(path, at, struct.pack(">Q", value))  # crafted: the out-of-range expiry
    assert (path.name, off) in findings(node, "value-out-of-range")
    rows = [
        r for r in cqforensics.read_table(node, "index").to_pylist() if r["file"] == str(path) and r["offset"] == off
    ]
    assert rows and rows[0]["expiry"] is None  # null, never wrapped or clamped
    every_command(node, tmp_path, capsys)
    dst = tmp_path / "compacted"
    rc, _, _ = run_cli(["compact", str(node.parent), str(dst)], capsys)
    assert rc in (0, 1, 4)


@pytest.mark.parametrize("value", [1 << 63, BIG])
def test_qs_offset_out_of_range_is_null_a_finding_and_a_missing_entry(value, tmp_path, capsys):
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    for path in sorted(node.glob("msg_stores/vhosts/*/queues/*/*.qi")):
        seg = r_qi.read_qi(path, int(path.stem))
        qs = [
            i
            for i, (st, loc) in enumerate(zip(seg.slots["status"].tolist(), seg.slots["loc_kind"].tolist()))
            if st == 1 and loc == 2
        ]
        if qs:
            off = int(seg.offsets()[qs[0]])
            break
    _poke(path, off + c_qi.ENTRY_DTYPE.fields["qs_offset"][1], struct.pack(">Q", value))  # crafted
    assert (path.name, off) in findings(node, "value-out-of-range")
    index = [
        r for r in cqforensics.read_table(node, "index").to_pylist() if r["file"] == str(path) and r["offset"] == off
    ]
    assert index and index[0]["store_offset"] is None  # null, never wrapped negative
    msgs = [
        r for r in cqforensics.read_table(node, "messages").to_pylist() if r["file"] == str(path) and r["offset"] == off
    ]
    assert msgs and msgs[0]["store_offset"] is None and msgs[0]["drop_reason"] is not None
    every_command(node, tmp_path, capsys)


def test_timestamp_property_beyond_int64_is_null(tmp_path, capsys):
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    rows = [
        r
        for r in cqforensics.read_table(node, "messages").to_pylist()
        if r["properties"] and r["properties"]["timestamp"] is not None and r["location"] == "shared_store"
    ]
    r = rows[0]
    ms = int(r["properties"]["timestamp"].timestamp() * 1000)
    path = Path(r["store_file"])
    data = path.read_bytes()
    old = b"\x83" + struct.pack(">q", ms)  # the AMQP 1.0 creation-time (timestamp type 0x83)
    at = data.find(old, r["store_offset"])
    assert at > 0
    _poke(path, at + 1, struct.pack(">q", (1 << 63) - 1))  # crafted: ms that no µs column holds
    after = [
        x
        for x in cqforensics.read_table(node, "messages").to_pylist()
        if x["store_file"] == r["store_file"] and x["store_offset"] == r["store_offset"]
    ]
    assert after[0]["properties"]["timestamp"] is None
    assert "out of range" in after[0]["decode_error"] and after[0]["offset"] is not None
    every_command(node, tmp_path, capsys)


# -- 4. special files -----------------------------------------------------------------------------

FIFO_TARGETS = {
    "jif": "msg_stores/vhosts/*/queues/*/journal.jif",
    "vhost": "msg_stores/vhosts/*/.vhost",
    "config": "msg_stores/vhosts/*/.config",
    "queue_name": "msg_stores/vhosts/*/queues/*/.queue_name",
    "dot": "msg_stores/vhosts/*/msg_store_persistent/clean.dot",
    "dets": "msg_stores/vhosts/*/recovery.dets",
    "ets": "msg_stores/vhosts/*/msg_store_persistent/*.ets",
    "rdq": "msg_stores/vhosts/*/msg_store_persistent/0.rdq",
    "qi": "msg_stores/vhosts/*/queues/*/0.qi",
    "idx": "msg_stores/vhosts/*/queues/*/0.idx",
    "mnesia": "rabbit_durable_queue.DCD",
}


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
@pytest.mark.parametrize("kind", sorted(FIFO_TARGETS))
def test_fifo_is_never_opened(kind, tmp_path, capsys):
    node = copy_node("3.10.8-clean", tmp_path / "mnesia")
    path = sorted(node.glob(FIFO_TARGETS[kind]))[0]
    path.unlink()
    os.mkfifo(path)  # crafted: a FIFO named like a broker file (opening it for reading blocks forever)
    t0 = time.monotonic()
    every_command(node, tmp_path, capsys)
    if kind != "mnesia":  # node-level metadata files are read as absent (the metadata notes say so)
        assert (path.name, None) in findings(node, "not-regular-file")
    rc, _, err = run_cli(["dump", str(path)], capsys)
    assert rc in (8, 16) and str(path) in err and len(err.strip().splitlines()) == 1
    assert time.monotonic() - t0 < 120


#: a file of each place and kind, and a sample that holds one: replaced by a directory of the same
#: name (crafted), each must be a ``not-regular-file`` finding naming it, never an exception
#: (``cannot read: Is a directory`` stopped every command before) nor a silent skip (a WAL or
#: .rdq lost without a word)
DIR_TARGETS = {
    "metadata": ("3.10.8-clean", "rabbit_durable_queue.DCD"),
    "mnesia-log": ("3.10.8-clean", "LATEST.LOG"),
    "ra-names": ("4.3.6-quorum-clean", "quorum/*/names.dets"),
    "ra-wal": ("4.3.6-quorum-clean", "quorum/*/*.wal"),
    "ra-config": ("4.3.6-quorum-clean", "quorum/*/*/config"),
    "ra-snapshot": ("4.3.6-quorum-clean", "quorum/*/*/snapshots/*/snapshot.dat"),
    "khepri-wal": ("4.3.6-quorum-clean", "coordination/*/*.wal"),
    "vhost-name": ("4.3.6-quorum-clean", "msg_stores/vhosts/*/.vhost"),
    "recovery": ("4.3.6-quorum-clean", "msg_stores/vhosts/*/recovery.dets"),
    "rdq": ("4.3.6-quorum-clean", "msg_stores/vhosts/*/msg_store_persistent/*.rdq"),
    "ets": ("4.3.6-quorum-clean", "msg_stores/vhosts/*/msg_store_persistent/msg_store_index.ets"),
    "clean-dot": ("4.3.6-quorum-clean", "msg_stores/vhosts/*/msg_store_persistent/clean.dot"),
    "queue-name": ("4.3.6-quorum-clean", "msg_stores/vhosts/*/queues/*/.queue_name"),
    "qi": ("4.3.6-quorum-clean", "msg_stores/vhosts/*/queues/*/*.qi"),
    "qs": ("4.3.6-quorum-clean", "msg_stores/vhosts/*/queues/*/*.qs"),
    "idx": ("3.10.8-clean", "msg_stores/vhosts/*/queues/*/*.idx"),
    "jif": ("3.10.8-clean", "msg_stores/vhosts/*/queues/*/journal.jif"),
    "osiris-segment": ("4.3.6-streams-clean", "stream/*/*.segment"),
    "osiris-index": ("4.3.6-streams-clean", "stream/*/*.index"),
}


@pytest.mark.parametrize("kind", sorted(DIR_TARGETS))
def test_a_directory_named_like_a_broker_file_is_a_finding(kind, tmp_path):
    import shutil

    dataset, pattern = DIR_TARGETS[kind]
    node = copy_node(dataset, tmp_path / "n")
    path = sorted(node.glob(pattern))[0]
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    path.mkdir()
    rows = cqforensics.read_table(node, "findings").to_pylist()
    assert ["not-regular-file", str(path)] in [[r["code"], r["file"]] for r in rows]


def test_sparse_rdq_is_walked_by_its_extents(tmp_path, capsys):
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    store = sorted(node.glob("msg_stores/vhosts/*/msg_store_persistent"))[0]
    src = (store / "0.rdq").read_bytes()
    big = store / "7.rdq"
    with open(big, "wb") as f:  # crafted: real entries, a 3 GiB hole, the same entries again
        f.write(src)
        f.truncate(3 << 30)
        f.seek(3 << 30)
        f.write(src)
    if os.stat(big).st_blocks * 512 > 64 << 20:
        pytest.skip("this file system does not make sparse files")
    from cqforensics.readers import rdq

    f = rdq.walk(big, 7)
    assert [h.kind for h in f.holes] == ["zeroed"] and f.holes[0].offset == len(src)
    assert len(f) == 2 * len(rdq.walk(store / "0.rdq", 0))
    rc, out, _ = run_cli(["dump", str(big)], capsys)
    assert rc == 0 and "zeroed" in out
    every_command(node, tmp_path, capsys, tables=("store", "holes", "files"))
    # not timed (a loaded CI machine took 72 s): tests/tables/test_scale.py checks the bytes a read of a
    # hole costs instead


# -- 2. malformed but decodable terms ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, crafted",
    [
        (".config", b"[" * 5000 + b"]" * 5000 + b"."),  # crafted: nested 5,000 deep
        (".config", b"{segment_entry_count, " + b"9" * 5000 + b"}."),  # crafted: a 5,000-digit integer
        ("clean.dot", b"{client_refs, " + b"[" * 5000 + b"]" * 5000 + b"}."),
        ("clean.dot", b"{client_refs, [" + b"7" * 5000 + b"]}."),
    ],
)
def test_text_files_nested_or_huge_are_format_errors(name, crafted, tmp_path, capsys):
    node = copy_node("3.10.8-clean", tmp_path / "mnesia")
    target = sorted(list(node.glob(f"msg_stores/vhosts/*/{name}")) + list(node.glob(f"msg_stores/vhosts/*/*/{name}")))[
        0
    ]
    target.write_bytes(crafted)
    every_command(node, tmp_path, capsys, tables=("messages", "queues", "findings"))
    if name == ".config":
        assert (".config", 201 if crafted[:1] == b"[" else 22) in findings(node, "term-file-damaged")


def test_huge_integers_and_deep_terms_in_term_files(tmp_path, capsys):
    from cqforensics.codecs import etf

    node = copy_node("3.10.8-clean", tmp_path / "mnesia")
    ets = sorted(node.glob("msg_stores/vhosts/*/msg_store_persistent/msg_store_index.ets"))[0]
    big = 10**5000
    raw = big.to_bytes((big.bit_length() + 7) // 8, "little")
    term = b"\x83o" + struct.pack(">I", len(raw)) + b"\x00" + raw  # crafted: a 5,000-digit bignum
    data = ets.read_bytes()
    ets.write_bytes(data + struct.pack(">I", len(term)) + data[12:16] + term)  # appended as one more item
    with pytest.raises(etf.EtfError):
        etf.decode(term)
    rc, out, err = run_cli(["dump", str(ets)], capsys)
    assert rc == 0 and "error" in out
    every_command(node, tmp_path, capsys, tables=("refcounts", "findings"))


def _replace(t, pred, new):
    if pred(t):
        return new
    if isinstance(t, tuple):
        return tuple(_replace(x, pred, new) for x in t)
    return t


def test_mc_payload_fragments_of_lists_and_surrogate_chars_are_format_errors(tmp_path):
    from cqforensics.base.errors import FormatError
    from cqforensics.codecs import amqp10, etf
    from cqforensics.message import fast as fastpath
    from cqforensics.readers import rdq

    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    path = sorted(node.glob("msg_stores/vhosts/*/msg_store_persistent/0.rdq"))[0]
    data = path.read_bytes()
    f = rdq.walk(path, 0, data)
    start, length = rdq.term_span(int(f.offsets[0]), int(f.totals[0]))
    term, _ = etf.decode(data[start : start + length])
    assert fastpath.decode(data[start : start + length])["body"]
    # crafted: the body fragments (a list of binaries in the real term) become a list of lists
    bad = _replace(term, lambda t: isinstance(t, list) and t and all(isinstance(x, bytes) for x in t), [[b"a"], [b"b"]])
    assert bad != term
    with pytest.raises(FormatError):
        fastpath.decode(etf.term_to_binary(bad))
    with pytest.raises(FormatError):
        amqp10.Decoder(b"\x73\x00\x00\xd8\x00").value(0)  # crafted: a UTF-16 surrogate as an AMQP 1.0 char


# -- 3. names and paths that are not UTF-8 ----------------------------------------------------------


def _bad_names(node: Path) -> dict[str, bytes]:
    """Crafted: non-UTF-8 names in every place of a node (bytes paths; Python sees surrogates)."""
    b = os.fsencode(node)
    vhost = sorted(glob.glob(b + b"/msg_stores/vhosts/*"))[0]
    queues = sorted(glob.glob(b + b"/msg_stores/vhosts/*/queues/*"))
    made = {
        "queue_qi": queues[1] + b"/\xfe\xff.qi",
        "queue_stray": queues[2] + b"/stray\xff",
        "store_rdq": vhost + b"/msg_store_persistent/stray\xff.rdq",
        "vhost_stray": vhost + b"/odd\xff",
        "node_file": b + b"/\xffnode/\xfe",
    }
    os.mkdir(b + b"/\xffnode")
    os.mkdir(queues[0][: queues[0].rindex(b"/")] + b"/\xff\xfeempty")  # an empty queue dir: nothing to write
    for p in made.values():
        with open(p, "wb") as f:
            f.write(b"junk")
    return made


def test_non_utf8_names_in_every_command(tmp_path, capsys):
    from cqforensics.base.errors import display

    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    made = _bad_names(node)
    renamed = sorted(glob.glob(os.fsencode(node) + b"/msg_stores/vhosts/*/queues/*"))[0]
    os.rename(renamed, renamed + b"\xff\xfe")  # crafted: a queue dir whose name is not UTF-8
    every_command(
        node,
        tmp_path,
        capsys,
        tables=("messages", "index", "acks", "store", "refcounts", "holes", "files", "queues", "findings"),
    )
    for t in ("messages", "index", "acks", "store", "refcounts", "holes", "files", "queues", "findings"):
        rows = cqforensics.read_table(node.parent, t).to_pylist()
        for r in rows:
            for v in r.values():
                if isinstance(v, str):
                    v.encode("utf-8")  # valid text everywhere, no lone surrogates
    files = {r["file"] for r in cqforensics.read_table(node, "files").to_pylist()}
    assert display(made["queue_qi"]) in files and display(made["queue_qi"]).endswith("\\xfe\\xff.qi")
    found = {(r["code"], r["file"]) for r in cqforensics.read_table(node, "findings").to_pylist()}
    assert ("unknown-file", display(made["vhost_stray"])) in found
    assert any(
        q.endswith("\\xff\\xfe") for q in (r["queue_dir"] for r in cqforensics.read_table(node, "queues").to_pylist())
    )
    for args in (
        ["fsck", str(node.parent)],
        ["fsck", "--jsonl", str(node.parent)],
        ["audit", str(node.parent)],
        ["verify", str(node)],
        ["dump", os.fsdecode(made["queue_qi"])],
        ["dump", "--jsonl", os.fsdecode(made["store_rdq"])],
    ):
        rc, out, err = run_cli(args, capsys)
        assert rc in (0, 4) and "internal error" not in err, (args, err)
        out.encode("utf-8")
    rc, _, err = run_cli(["dump", os.fsdecode(renamed + b"\xff\xfe")], capsys)  # a dir: one line naming it
    assert rc == 16 and display(renamed + b"\xff\xfe") in err


@pytest.mark.parametrize("command", ["compact", "rebuild"])
def test_writers_carry_non_utf8_names(command, tmp_path, capsys):
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")
    made = _bad_names(node)
    dst = tmp_path / "out"
    rc, _, err = run_cli([command, str(node.parent), str(dst)], capsys)
    assert rc in (0, 1), err
    # the stray node-level file is copied as any other non-store file, under its own bytes
    rel = made["node_file"][len(os.fsencode(node.parent)) :]
    assert os.path.exists(os.fsencode(dst) + rel)
    run_cli(["verify", str(dst)], capsys)


def test_read_table_on_a_symlink_loop_or_an_unreadable_dir(tmp_path, monkeypatch):
    from cqforensics.base.errors import OperationalError

    loop = tmp_path / "a"
    os.symlink(tmp_path / "b", loop)
    os.symlink(loop, tmp_path / "b")  # crafted: a -> b -> a
    with pytest.raises(OperationalError, match=str(loop)):
        cqforensics.read_table(loop, "messages")
    node = copy_node("4.3.6-kill", tmp_path / "mnesia")

    def denied(path=".", *a, **kw):
        raise PermissionError(13, "Permission denied", os.fspath(path))

    monkeypatch.setattr(os, "scandir", denied)  # as root, chmod cannot make EACCES
    for p in (node.parent, node):
        with pytest.raises(OperationalError, match="Permission denied") as e:
            cqforensics.read_table(p, "messages")
        assert str(p) in str(e.value)


def test_input_under_a_non_utf8_dir_prints_valid_text(tmp_path, capsys):
    """Every report names its input as text (``errors.display``): under a non-UTF-8 dir name the
    output is still valid UTF-8 (a strict stdout, as with LANG=en_US.UTF-8, would raise otherwise)."""
    base = tmp_path / os.fsdecode(b"\xffbase")
    node = copy_node("4.3.6-kill", base / "mnesia")
    mnesia = str(node.parent)
    every_command(node, tmp_path, capsys, tables=("files", "findings", "queues"))
    for args in (
        ["fsck", mnesia],
        ["fsck", "--json", "--deep", mnesia],
        ["audit", mnesia],
        ["verify", "--json", mnesia],
        ["compact", "--dry-run", mnesia, str(tmp_path / "dry")],
        ["rebuild", mnesia, str(tmp_path / "rb")],
        ["compact", "--json", mnesia, str(tmp_path / "cp")],
        ["dump", str(sorted(node.rglob("*.qi"))[0])],
    ):
        rc, out, err = run_cli(args, capsys)
        assert rc in (0, 1, 4), (args, err)
        out.encode("utf-8")
        err.encode("utf-8")
        assert "\\xffbase" in out or args[0] in ("dump", "audit"), args
    lost = (tmp_path / "rb" / "lost+found" / "lost+found.jsonl").read_text(encoding="utf-8")
    assert "\\\\xffbase" in lost


# -- 5. name files the broker never reads: the writers accept their own output --------------------------
#
# Issue 33: a .vhost holding a 2 MB name (its vhost's name followed by 2 MB of "V") made rebuild and
# compact refuse their own output (exit 8): the layout read the first MiB of it, the writers all of
# it, and took it for a vhost dir renamed away from its own dir. A name file is read one way
# (layout.read_name_file); a dir that is the own dir of a vhost of the metadata holds that vhost
# whatever its .vhost says, and is written with the metadata's name.


def _tail(path: Path, n: int) -> None:
    """Crafted: the name in ``path`` followed by ``n`` bytes of V (a .queue_name keeps its lines)."""
    raw = path.read_bytes()
    if path.name == ".queue_name":
        end = raw.index(b"\n", raw.index(b"\nQUEUE: ") + 8)
        path.write_bytes(raw[:end] + b"V" * n + raw[end:])
    else:
        path.write_bytes(raw + b"V" * n)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name_file, n, command",
    [
        (".vhost", 2 << 20, "rebuild"),
        (".vhost", 2 << 20, "compact"),
        (".vhost", (1 << 20) + 1, "compact"),
        (".vhost", 1 << 20, "rebuild"),
        (".vhost", 300, "compact"),
        (".queue_name", 2 << 20, "rebuild"),
    ],
)
def test_writers_accept_their_output_whatever_a_name_file_holds(name_file, n, command, tmp_path, capsys):
    node = copy_node("4.3.6-clean", tmp_path / "mnesia")
    vhost_dir = next(p for p in node.glob("msg_stores/vhosts/*") if (p / ".vhost").read_bytes() == "staging/ü".encode())
    target = vhost_dir / ".vhost" if name_file == ".vhost" else next(vhost_dir.glob("queues/*/.queue_name"))
    _tail(target, n)
    code = {"missing-queue-name", "queue-dir-mismatch"}
    assert any(
        c in code
        for c, _ in [
            (f["code"], 0)
            for f in cqforensics.read_table(node, "findings").to_pylist()
            if f["file"] in (str(target), str(target.parent))
        ]
    )
    dst = tmp_path / "out"
    rc, out, err = run_cli([command, str(node.parent), str(dst)], capsys)
    assert rc in (0, 1), err  # never 8: damaged input is a salvage (or exit 4), never an operational error
    written = dst / node.name / "msg_stores" / "vhosts" / vhost_dir.name
    assert (written / ".vhost").read_bytes() == "staging/ü".encode()  # the metadata's name, afresh
    assert sorted(p.name for p in (dst / node.name / "msg_stores" / "vhosts").iterdir()) == sorted(
        p.name for p in (node / "msg_stores" / "vhosts").iterdir()
    )
    rc, out, _ = run_cli(["verify", str(dst)], capsys)
    assert rc == 0, out


@pytest.mark.slow
def test_a_vhost_dir_no_name_is_known_for_is_written_without_its_damaged_name(tmp_path, capsys):
    """Crafted: a copy of a vhost dir under a dir name no vhost has, its .vhost 2 MB long. No name
    is known for it (not the metadata's, not its .vhost's): the writers leave the .vhost out (the
    broker writes it at every recovery of the vhost and never reads it) and say so; verify notes
    the missing name, as outside its invariants."""
    import shutil

    node = copy_node("4.3.6-clean", tmp_path / "mnesia")
    src = next(p for p in node.glob("msg_stores/vhosts/*") if (p / ".vhost").read_bytes() == "staging/ü".encode())
    copy = src.parent / "ZZZZZZ"
    shutil.copytree(src, copy)
    _tail(copy / ".vhost", 2 << 20)
    for command in ("rebuild", "compact"):
        dst = tmp_path / command
        rc, out, err = run_cli([command, str(node.parent), str(dst)], capsys)
        assert rc in (0, 1), err
        assert "no name is known for vhost dir ZZZZZZ" in out
        assert not (dst / node.name / "msg_stores/vhosts/ZZZZZZ/.vhost").exists()
        rc, out, _ = run_cli(["verify", str(dst)], capsys)
        assert rc == 0 and "missing-queue-name" in out, out
