"""Writers without a broker: byte builders equal the grammars, compact keeps every message,
rebuild quarantines with reasons, verify is strict, destinations are never half written, and
inputs are never touched. (Broker acceptance: test_writers_brokers.py.)"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest

import cqforensics
from cqforensics.grammar import idx as c_idx
from cqforensics.grammar import qi as c_qi
from cqforensics.grammar import qs as c_qs
from cqforensics.grammar import rdq as c_rdq
from cqforensics.write import compact, formats, rebuild
from cqforensics.write.verify import verify
from support import ROOT, SAMPLES
from support.cli import fingerprint, run
from support.scenarios import SCENARIOS, V1_ONLY

# -- byte builders == construct grammars ----------------------------------------------------------


def test_segment_header_equals_grammar():
    for magic, grammar in ((c_qi.MAGIC, c_qi.header), (c_qs.MAGIC, c_qs.header)):
        built = formats.segment_header(magic, 3, 2048)
        assert built == grammar.build(dict(from_seq_id=6144, to_seq_id=8192, reserved=bytes(43)))


def test_qi_segment_entries_equal_grammar():
    mid = bytes(range(16))
    slots = np.array([0, 2, 5])
    seg = formats.qi_segment(
        1,
        8,
        slots,
        persistent=np.array([True, True, False]),
        loc_kind=np.array([c_qi.LOC_SHARED_STORE, c_qi.LOC_QUEUE_STORE, c_qi.LOC_MEMORY]),
        msg_id=np.array([mid, b"", b""], dtype="V16"),
        qs_offset=np.array([0, 64, 0]),
        qs_size=np.array([0, 300, 0]),
        size=np.array([5000, 200, 0]),
        expiry=np.array([0, 1_700_000_000_000_000, 0]),
    )
    assert seg[: c_qi.HEADER_SIZE] == formats.segment_header(c_qi.MAGIC, 1, 8)
    body = seg[c_qi.HEADER_SIZE :]
    assert len(body) == 6 * c_qi.ENTRY_SIZE  # up to the last live slot
    want = {
        0: dict(kind=c_qi.LOC_SHARED_STORE, ref=dict(msg_id=mid), persistent=True, size=5000, expiry=0),
        2: dict(
            kind=c_qi.LOC_QUEUE_STORE,
            ref=dict(offset=64, size=300),
            persistent=True,
            size=200,
            expiry=1_700_000_000_000_000,
        ),
        5: dict(kind=c_qi.LOC_MEMORY, ref=None, persistent=False, size=0, expiry=0),
    }
    for slot in range(6):
        raw = body[slot * c_qi.ENTRY_SIZE : (slot + 1) * c_qi.ENTRY_SIZE]
        if slot not in want:
            assert raw == bytes(c_qi.ENTRY_SIZE)  # acked
            continue
        w = want[slot]
        expected = c_qi.entry.build(
            dict(
                status=1,
                flags=dict(reserved=0, persistent=w["persistent"]),
                reserved=0,
                location=dict(kind=w["kind"], ref=w["ref"]),
                size=w["size"],
                expiry=w["expiry"],
            )
        )
        assert raw == expected, slot


def test_qs_rdq_and_v1_records_equal_grammar():
    term = b"\x83h\x02d\x00\x01ak\x00\x03abc"
    head = formats.qs_entry_header(term)
    assert head + term == c_qs.entry.build(
        dict(header=dict(size=len(term), flags=1, crc=zlib.crc32(term) & 0xFFFF, reserved=0), term=term)
    )
    mid = b"\x01" * 16
    built = formats.rdq_entry(mid, term)
    assert built == c_rdq.entry.build(dict(size=16 + len(term), msg_id=mid, body=term, marker=None))
    assert len(built) == formats.rdq_entry_size(len(term))
    pub = formats.v1_publish_head(7, True, mid, 5, 900, len(term)) + term
    assert pub == c_idx.record.build(
        dict(
            head=dict(publish=True, bit2=True, rel_seq=7),
            pub=dict(msg_id=mid, expiry=5, size=900, embedded_size=len(term), embedded=term),
        )
    )
    assert formats.v1_deliver(7) == c_idx.record.build(dict(head=dict(publish=False, bit2=True, rel_seq=7), pub=None))


# -- compact ------------------------------------------------------------------------------------

KEEP = [
    "vhost",
    "queue",
    "priority",
    "seq_id",
    "msg_id",
    "persistent",
    "expiry",
    "exchange",
    "routing_keys",
    "properties",
    "headers",
    "annotations",
    "body",
    "term_format",
    "survives_restart",
    "drop_reason",
    "queue_type",
    "raft_index",
    "raft_term",
    "delivery_count",
    "checked_out",
]


def _kept_messages(path) -> list[dict]:
    """The messages a boot delivers or expires, as a writer must carry them over."""
    # one clock for both reads: a quorum queue's boot dead letters carry the boot's time (as_of)
    rows = cqforensics.read_table(path, "messages", columns=KEEP, as_of=1_800_000_000_000).to_pylist()
    return sorted(
        (r for r in rows if r["survives_restart"] or r["drop_reason"] == "expired"),
        key=lambda r: (r["vhost"], r["queue"], r["priority"] or 0, r["seq_id"] or 0, r["raft_index"] or 0),
    )


def test_compact_keeps_every_message_and_verifies(dataset, tmp_path):
    src = SAMPLES / dataset / "mnesia"
    before = fingerprint(src)
    result = compact(src, tmp_path / "out")
    assert fingerprint(src) == before  # SRC untouched
    assert result.verified and result.exit_code == 0
    assert 0 < result.bytes_after <= result.bytes_before
    assert _kept_messages(tmp_path / "out") == _kept_messages(src)
    assert verify(tmp_path / "out").exit_code == 0
    assert not list((tmp_path / "out").rglob("clean.dot")) and not list((tmp_path / "out").rglob("*.ets"))
    # nothing else left beside DST
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_compact_rolls_store_files_at_the_limit(tmp_path):
    result = compact(SAMPLES / "4.3.6-rolled" / "mnesia", tmp_path / "out", file_size_limit=64 << 10)
    rdqs = sorted((tmp_path / "out").rglob("*.rdq"))
    assert len(rdqs) == result.store_files_written > 2
    for p in rdqs[:-1]:  # an entry that starts below the limit may cross it, as in the broker
        assert p.stat().st_size < (64 << 10) + 40_000
    assert [int(p.stem) for p in rdqs] == list(range(len(rdqs)))
    assert _kept_messages(tmp_path / "out") == _kept_messages(SAMPLES / "4.3.6-rolled" / "mnesia")


def test_compact_dry_run_writes_nothing(tmp_path, capsys):
    code, out, _ = run(
        capsys, "compact", "--dry-run", "--json", str(SAMPLES / "4.3.6-kill" / "mnesia"), str(tmp_path / "out")
    )
    doc = json.loads(out)
    assert code == 0 and doc["dry_run"] and doc["bytes_reclaimed"] > 0
    assert doc["totals"]["written"] > 0
    assert list(tmp_path.iterdir()) == []


def test_compact_refuses_a_damaged_source(tmp_path, capsys):
    src = tmp_path / "src"
    shutil.copytree(SAMPLES / "4.3.6-kill" / "mnesia", src)
    SCENARIOS["qs_crc"](src / "rabbit@localhost")
    code, _, err = run(capsys, "compact", str(src), str(tmp_path / "out"))
    assert code == 4 and "rebuild" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("where", ["non-empty", "inside-src", "a-file", "no-parent"])
def test_destination_rules(where, tmp_path, capsys):
    src = tmp_path / "src"
    shutil.copytree(SAMPLES / "4.3.6-kill" / "mnesia", src)
    dst = {
        "non-empty": tmp_path / "full",
        "inside-src": src / "out",
        "a-file": tmp_path / "f",
        "no-parent": tmp_path / "no" / "out",
    }[where]
    if where == "non-empty":
        dst.mkdir()
        (dst / "keep").write_text("x")
    if where == "a-file":
        dst.write_text("x")
    before = fingerprint(tmp_path)
    for command in ("compact", "rebuild"):
        code, out, err = run(capsys, command, str(src), str(dst))
        assert code == 16, (command, err)
        assert str(dst if where != "no-parent" else dst.parent) in err and "Traceback" not in err
    assert fingerprint(tmp_path) == before


def test_compact_into_an_empty_dir(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    code, out, _ = run(capsys, "compact", str(SAMPLES / "3.10.8-clean" / "mnesia"), str(tmp_path / "out"))
    assert code == 0 and "verify: consistent" in out
    assert verify(tmp_path / "out").exit_code == 0


# -- an output that cannot boot is not success -------------------------------------------------


@pytest.mark.parametrize("command", ["compact", "rebuild"])
def test_an_output_the_target_cannot_boot_exits_4_and_is_kept(command, tmp_path, capsys):
    """compact --broker-version 3.10 of a 4.3 node exited 0 "done" while saying the output cannot
    boot (issue 28): exit 4 (errors left), the reason as an ERROR line and in JSON; the output is
    kept (its stores are right: what --template or a transplant by hand needs)."""
    out = tmp_path / "out"
    code, text, _ = run(capsys, command, "-q", "--broker-version", "3.10", str(SAMPLES / "4.3.6-kill"), str(out))
    assert code & 4 and "ERROR: the output cannot boot" in text and "--template" in text, text
    assert f"exit {code}: " in text and "cannot boot it" in text.splitlines()[-1]
    assert (out / "mnesia" / "rabbit@localhost" / "msg_stores").is_dir()  # kept: the stores are right
    code, doc, _ = run(
        capsys,
        command,
        "-q",
        "--json",
        "--dry-run",
        "--broker-version",
        "3.10",
        str(SAMPLES / "4.3.6-kill"),
        str(tmp_path / "dry"),
    )
    assert code & 4 and json.loads(doc)["cannot_boot"] and json.loads(doc)["exit_code"] == code
    code, text, _ = run(
        capsys, command, "-q", "--broker-version", "4.3", str(SAMPLES / "4.0.5-kill"), str(tmp_path / "up")
    )
    assert not code & 4 and "cannot boot" not in text  # an upgrade the broker performs itself


# -- rebuild ------------------------------------------------------------------------------------


def test_rebuild_quarantines_with_reasons(tmp_path, capsys):
    src = tmp_path / "src"
    shutil.copytree(SAMPLES / "4.3.6-kill" / "mnesia", src)
    SCENARIOS["qs_crc"](src / "rabbit@localhost")
    before = fingerprint(src)
    code, out, _ = run(capsys, "rebuild", "--json", str(src), str(tmp_path / "out"))
    assert fingerprint(src) == before
    doc = json.loads(out)
    assert code == 1 and doc["exit_code"] == 1 and doc["verified"]
    assert doc["totals"]["quarantined"].get("qs_bad_crc") == 1
    assert doc["totals"]["quarantined"].get("transient", 0) > 0  # the broker drops these by design
    lf = tmp_path / "out" / "lost+found"
    items = [json.loads(line) for line in (lf / "lost+found.jsonl").read_text().splitlines()]
    assert len(items) == doc["lost_found"]["items"]
    assert {i["reason"] for i in items} >= {"qs_bad_crc", "transient"}
    for i in items:
        assert i["file"] and i["offset"] is not None
        assert i["queue"] or i["reason"] in ("orphan", "duplicate", "unreferenced", "torn_write")
        if i.get("raw"):
            assert (lf / i["raw"]).is_file() and (lf / i["raw"]).stat().st_size == i["raw_bytes"]
    assert verify(tmp_path / "out").exit_code == 0


def test_rebuild_salvages_behind_a_zeroed_range_that_310_loses(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(SAMPLES / "3.10.8-kill" / "mnesia", src)
    SCENARIOS["rdq_zeroed_range"](src / "rabbit@localhost")
    result = rebuild(src, tmp_path / "out")
    assert result.verified and result.exit_code == 1
    assert result.rescued > 0  # messages written that the 3.10 boot would have dropped
    assert all(q.written >= q.broker_would_deliver for q in result.queues)


def test_rebuild_of_a_consistent_store_is_compact(tmp_path):
    compact(SAMPLES / "4.3.6-clean" / "mnesia", tmp_path / "a")
    result = rebuild(tmp_path / "a", tmp_path / "b")
    assert result.exit_code == 0 and result.lost_found == 0
    assert _kept_messages(tmp_path / "b") == _kept_messages(tmp_path / "a")


# -- verify -------------------------------------------------------------------------------------

VERIFY_CASES = [
    (ds, sc)
    for ds in ("3.10.8-kill", "4.3.6-kill")
    for sc in SCENARIOS
    if sc != "v1_journal_torn" and (sc not in V1_ONLY or ds.startswith("3."))
]


@pytest.fixture(scope="module")
def compacted(tmp_path_factory):
    out = {}
    for ds in ("3.10.8-kill", "4.3.6-kill"):
        out[ds] = tmp_path_factory.mktemp("compacted") / ds
        compact(SAMPLES / ds / "mnesia", out[ds])
    return out


@pytest.mark.parametrize("dataset, scenario", VERIFY_CASES, ids=[f"{d}-{s}" for d, s in VERIFY_CASES])
def test_verify_catches_damage(dataset, scenario, compacted, tmp_path, capsys):
    """Every damage kind of the broker tests breaks a store that verified clean."""
    assert verify(compacted[dataset]).exit_code == 0
    shutil.copytree(compacted[dataset], tmp_path / "x")
    SCENARIOS[scenario](tmp_path / "x" / "rabbit@localhost")
    code, out, _ = run(capsys, "verify", "--json", str(tmp_path / "x"))
    doc = json.loads(out)
    assert code == 4 and not doc["consistent"] and doc["violations"]
    assert any(v["file"] for v in doc["violations"])  # the damage, located


def test_verify_is_strict_about_what_a_boot_drops(capsys):
    """Real broker output with transient messages or orphans is not consistent."""
    code, out, _ = run(capsys, "verify", "--json", str(SAMPLES / "4.3.6-clean"))
    codes = {v["code"] for v in json.loads(out)["violations"]}
    assert code == 4 and {"transient-dropped", "orphan-message"} <= codes
    code, _, _ = run(capsys, "verify", str(SAMPLES / "4.3.6-rolled"))
    assert code == 0


def test_verify_usage_errors(tmp_path, capsys):
    code, _, err = run(capsys, "verify", str(tmp_path / "missing"))
    assert code == 8 and "missing" in err and "Traceback" not in err


# -- never half done: kill -9 at random points ---------------------------------------------------


def _writer(command: str, src, dst) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cqforensics", command, "-q", str(src), str(dst)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _partials(parent) -> list:
    return [p for p in parent.iterdir() if ".cqf-partial-" in p.name]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["compact", "rebuild"])
def test_kill_9_never_leaves_output_that_looks_complete(command, tmp_path):
    src = SAMPLES / "4.3.6-rolled" / "mnesia"
    expected = None
    rnd = random.Random(6)
    t0 = time.monotonic()
    _writer(command, src, tmp_path / "ref").wait()
    duration = time.monotonic() - t0
    expected = _kept_messages(tmp_path / "ref")
    outcomes = set()
    for k in range(8):
        work = tmp_path / f"k{k}"
        work.mkdir()
        dst = work / "out"
        p = _writer(command, src, dst)
        if k < 3:  # while the staging dir is being filled (about 50 ms on this sample)
            deadline = time.monotonic() + 60
            while not _partials(work) and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(0 if k == 0 else rnd.uniform(0, 0.02))  # k == 0: the moment it appears
        else:
            time.sleep(rnd.uniform(0, duration))
        p.send_signal(signal.SIGKILL)
        p.wait()
        if dst.exists():  # complete, or nothing
            outcomes.add("complete")
            assert verify(dst).exit_code == 0 and _kept_messages(dst) == expected
        else:
            outcomes.add("partial" if _partials(work) else "none")
        if not dst.exists():  # the next run finishes and clears what the killed one left
            assert _writer(command, src, dst).wait() in (0, 1)
        assert _partials(work) == [] and _kept_messages(dst) == expected
    assert "partial" in outcomes


# -- the Spark writer (no broker: read back with the readers) ------------------------------------


@pytest.fixture(scope="module")
def source_rows(spark):
    return spark.read.format("rabbitcq").load(str(SAMPLES / "4.3.6-kill")).where("survives_restart")


def _order(rows) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault((r["vhost"], r["queue"]), []).append((r["properties"]["message_id"], r["body"]))
    return out


def test_spark_write_overwrite_then_append_keeps_order(spark, source_rows, tmp_path):
    dst = tmp_path / "node"
    template = SAMPLES / "4.3.6-kill" / "mnesia" / "rabbit@localhost"
    source_rows.write.format("rabbitcq").option("brokerVersion", "4.3.6").option("template", str(template)).mode(
        "overwrite"
    ).save(str(dst))
    first = cqforensics.read_table(dst).to_pylist()
    want = _order(source_rows.collect())
    assert _order(first) == want
    assert all(r["survives_restart"] for r in first) and verify(dst).exit_code == 0
    assert (dst / "rabbit_durable_queue.DCD").exists() or (dst / "coordination").exists()  # the template's metadata
    # append: the new rows after the ones DST holds, same queues
    source_rows.write.format("rabbitcq").option("brokerVersion", "4.3.6").mode("append").save(str(dst))
    both = _order(
        sorted(
            cqforensics.read_table(dst).to_pylist(),
            key=lambda r: (r["vhost"], r["queue"], -(r["priority"] or 0), r["seq_id"]),
        )
    )
    for key, msgs in want.items():
        if key[1] != "jobs.prio":  # a priority queue delivers by level, across both writes
            assert both[key] == msgs + msgs, key
    # overwrite of an existing DST replaces its messages
    source_rows.where("queue = 'work'").write.format("rabbitcq").option("brokerVersion", "4.3.6").mode(
        "overwrite"
    ).save(str(dst))
    assert {r["queue"] for r in cqforensics.read_table(dst).to_pylist()} == {"work"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_spark_write_without_body_fails_at_planning(spark, source_rows, tmp_path):
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        source_rows.drop("body").write.format("rabbitcq").option("brokerVersion", "4.3.6").mode("overwrite").save(
            str(tmp_path / "x")
        )
    assert "column 'body' is missing" in str(e.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, "brokerVersion is required"),
        ({"brokerVersion": "2.8"}, "2.8"),
        ({"brokerVersion": "4.3", "queueVersion": "3"}, "queueVersion must be 1 or 2"),
        ({"brokerVersion": "4.3", "color": "red"}, "unknown option(s) color"),
    ],
)
def test_spark_write_options_are_checked(spark, source_rows, tmp_path, options, message):
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    w = source_rows.write.format("rabbitcq").mode("overwrite")
    for k, v in options.items():
        w = w.option(k, v)
    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        w.save(str(tmp_path / "x"))
    assert message in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_spark_write_refuses_a_queue_the_template_does_not_declare(spark, source_rows, tmp_path):
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    template = SAMPLES / "4.3.6-kill" / "mnesia" / "rabbit@localhost"
    renamed = source_rows.withColumn("queue", source_rows.queue.substr(1, 3))
    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        renamed.write.format("rabbitcq").option("brokerVersion", "4.3.6").option("template", str(template)).mode(
            "overwrite"
        ).save(str(tmp_path / "x"))
    assert "not durable queues in the node's metadata" in str(e.value)
    assert [p for p in tmp_path.iterdir()] == []
