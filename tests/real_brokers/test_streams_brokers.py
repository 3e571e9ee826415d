"""Damaged streams against the real brokers: each damage of tests/support/stream_damage.py is made at
test time on a stream a real broker wrote, and the broker of that version is booted on the
damaged node dir as the oracle. What it keeps and serves from ``first`` over the stream protocol
and over AMQP 0-9-1 (prefetch 1: every delivery the broker hands over reaches the consumer; and
prefetch 100 where its first read matters), and the consumer offset it reports, must be what
cqforensics predicted from the files before the boot.

One broker per version serves every damage (one stream each, plus an intact one): a workload
boot, a clean stop, the damage, a second boot. Measured on the shared 2-core machine: 117 s
(3.10.8), 85 s (4.0.5), 98 s (4.3.6); the module 5 min 4 s."""

from __future__ import annotations

import pytest

import cqforensics
from cqforensics.model import recovery
from cqforensics.model.versions import model
from cqforensics.readers import osiris as r_osiris
from support import need_broker
from support.stream_damage import DAMAGES

pytestmark = pytest.mark.broker

VERSIONS = ("3.10.8", "4.0.5", "4.3.6")
NAMES = {"intact": "st.intact", **{k: f"st.{k.replace('_', '-')}" for k in DAMAGES}}
PREFETCH_100 = ("intact", "crc_early", "crc_late")  # where the first read's credit matters
#: streams whose truth is read at once (threads): each read ends after 1 s without a delivery,
#: 3 to 4 reads a stream, so one after another the 11 streams spent about 30 s a version waiting
TRUTH_READERS = 4


def _dirs(node_dir):
    from cqforensics.model.vhost import base64uri

    out = {}
    for kind, name in NAMES.items():
        prefix = base64uri(f"/_{name}_")
        (d,) = [
            d for d in (node_dir / "stream").iterdir() if d.name.startswith(prefix) and d.name[len(prefix) :].isdigit()
        ]
        out[kind] = d
    return out


@pytest.fixture(scope="module", params=VERSIONS)
def booted(request, tmp_path_factory):
    """(version, predictions, truths): the damage made, the prediction taken from the files, the
    broker booted on them and read."""
    import shutil
    import tempfile
    import time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from brokers import Broker, streams

    version = request.param
    need_broker(version)
    base = Path(tempfile.mkdtemp(prefix="cqf-streams-"))
    base.chmod(0o755)
    t0 = time.monotonic()
    try:
        with Broker(version, base / "run", plugins=["rabbitmq_stream"]) as b:
            b.start()
            streams.write_many(b, list(NAMES.values()))
            b.wait_durable(*NAMES.values())
            b.stop()
            dirs = _dirs(b.node_dir)
            done = {kind: DAMAGES[kind](d) for kind, d in dirs.items() if kind in DAMAGES}
            m = model(version)
            predicted = {}
            for kind, d in dirs.items():
                scan = r_osiris.read_stream(d)
                predicted[kind] = {
                    "fate": recovery.stream_fate(scan, m, prefetch=1),
                    "fate100": recovery.stream_fate(scan, m, prefetch=100),
                    "scan": scan,
                }
            rows = cqforensics.read_table(b.mnesia_base, "messages", broker_version=version).to_pylist()
            tracking = cqforensics.read_table(b.mnesia_base, "stream_tracking", broker_version=version).to_pylist()
            b.start()

            def truth(kind):
                refs = {"offset": [streams.CONSUMER], "sequence": [streams.PUBLISHER]}
                return streams.stream_truth(
                    b,
                    NAMES[kind],
                    refs,
                    limit=90 if kind == "intact" else 10,
                    prefetch_100=kind in PREFETCH_100,
                    idle=1.0,
                )

            # the intact stream first, alone: its read waits (90 s at most) for the members the
            # boot starts; then the damaged ones (10 s each), each read as before, several at once
            truths = {"intact": truth("intact")}
            damaged = [k for k in NAMES if k != "intact"]
            with ThreadPoolExecutor(TRUTH_READERS) as pool:
                truths.update(zip(damaged, pool.map(truth, damaged)))
            b.kill()
        print(f"\n{version}: streams damage oracle took {time.monotonic() - t0:.0f}s")
        for kind, p in predicted.items():
            t, f = truths[kind], p["fate"]
            print(
                f"  {kind:16} {f.outcome:6} stream protocol {len(t['served_stream_protocol']['records']):3} "
                f"(predicted {len(_user_offsets(f, p['scan'])):3}), AMQP 0-9-1 prefetch 1 "
                f"{len(t['served_amqp091_one']['messages']):3} (predicted {len(f.amqp091.offsets):3}, fails at "
                f"{f.amqp091.fails_at})"
            )
        yield version, predicted, truths, rows, tracking, done
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_every_damage_changes_what_is_kept_or_served(booted):
    """No damage is a no-op: each changes what the version keeps or serves (so each case above
    tests a rule), as predicted and as the broker did it."""
    version, predicted, truths, _, _, _ = booted
    base = predicted["intact"]
    for kind, p in predicted.items():
        if kind == "intact":
            continue
        same = (
            p["fate"].outcome == "ok"
            and not p["fate"].cut
            and not p["fate"].unreached
            and _user_offsets(p["fate"], p["scan"]) == _user_offsets(base["fate"], base["scan"])
            and p["fate"].amqp091.offsets == base["fate"].amqp091.offsets
            and p["fate100"].amqp091.offsets == base["fate100"].amqp091.offsets
        )
        # a flipped body byte nobody checks: 4.2+ check no CRC, 4.0/4.1 only in a first read of credit above 1
        unchecked = {("crc_late", "4.0.5"), ("crc_late", "4.3.6"), ("crc_early", "4.3.6")}
        assert not same or (kind, version) in unchecked, f"{version} {kind}: changes nothing"


def _user_offsets(fate, scan):
    served = {(c.file, c.pos) for c in fate.served}
    return [r.offset for r in scan.records if (r.chunk.file, r.chunk.pos) in served]


@pytest.mark.parametrize("kind", list(NAMES))
def test_the_stream_protocol_serves_what_was_predicted(booted, kind):
    version, predicted, truths, rows, _, done = booted
    p, t = predicted[kind], truths[kind]
    fate, sp = p["fate"], t["served_stream_protocol"]
    got = [o for o, _, _ in sp["records"]]
    if fate.outcome != "ok":  # the stream does not start, or restarts empty
        assert got == [], f"{version} {kind} {done.get(kind)}: predicted {fate.outcome}, served {len(got)}"
        if fate.outcome == "fails":
            assert not t["available"] or "error" in sp
        return
    assert got == _user_offsets(fate, p["scan"]), f"{version} {kind} {done.get(kind)}: {fate.why}"
    assert [c[0] for c in sp["chunks"]] == [c.chunk_id for c in fate.served if c.chunk_type == 0]
    assert [c[3] for c in sp["chunks"]] == [bool(c.crc_ok) for c in fate.served if c.chunk_type == 0]
    # the table says the same: the rows that survive are the records served, in order
    table = [r["stream_offset"] for r in rows if r["queue"] == NAMES[kind] and r["survives_restart"]]
    assert table == got


@pytest.mark.parametrize("kind", list(NAMES))
def test_an_amqp091_consumer_is_served_what_was_predicted(booted, kind):
    version, predicted, truths, rows, _, done = booted
    p, t = predicted[kind], truths[kind]
    one = t["served_amqp091_one"]
    got = [m["offset"] for m in one["messages"]]
    read = p["fate"].amqp091
    assert got == read.offsets, f"{version} {kind} {done.get(kind)}: {read.why}"
    assert ("error" in one) == (read.fails_at is not None or p["fate"].outcome == "fails"), one.get("error")
    if "served_amqp091" in t:  # prefetch 100: what is handed over before a failing read may be in flight
        hundred = [m["offset"] for m in t["served_amqp091"]["messages"]]
        want = p["fate100"].amqp091
        assert hundred == want.offsets[: len(hundred)], f"{version} {kind}: not a prefix of the prediction"
        if want.fails_at is None or not want.offsets:
            assert hundred == want.offsets
        # the table's amqp091_drop_reason is for prefetch 100
        table = [r["stream_offset"] for r in rows if r["queue"] == NAMES[kind] and r["amqp091_drop_reason"] is None]
        assert table == want.offsets


@pytest.mark.parametrize("kind", list(NAMES))
def test_the_consumer_offset_is_what_the_tracking_table_holds(booted, kind):
    version, predicted, truths, _, tracking, done = booted
    p, t = predicted[kind], truths[kind]
    if p["fate"].outcome == "fails":
        return
    current = {(r["kind"], r["reference"]): r["value"] for r in tracking if r["queue"] == NAMES[kind] and r["current"]}
    want = t["tracking"]["consumer_offsets"]["cons-1"]
    assert current.get(("offset", "cons-1")) == want, f"{version} {kind} {done.get(kind)}"
    seq = t["tracking"]["publisher_sequences"]["pub-1"]
    assert current.get(("sequence", "pub-1"), 0 if seq == 0 else None) == seq
