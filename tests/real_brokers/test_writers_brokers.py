"""Writers accepted by real brokers: the broker of the sample's version boots on the output and
delivers exactly what it delivers from the original (compact), every salvaged message
(rebuild), or exactly the written rows (Spark writer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import copy_node, manifest
from support.live import assert_delivers_manifest, boot_and_drain
from support.scenarios import (
    SCENARIOS,
    V1_ONLY,
    apply_changes,
    boot_ids,
    changed_files,
    owners,
    shared_boots,
)

pytestmark = pytest.mark.broker


@pytest.mark.parametrize(
    "dataset",
    ["3.10.8-kill", "3.10.8-clean", "3.10.8-segments", "4.3.6-clean", "4.3.6-kill", "4.3.6-rolled", "4.0.5-kill"],
)
def test_compact_output_delivers_what_the_original_does(dataset, broker_dir):
    from cqforensics.write import compact
    from support import SAMPLES

    out = broker_dir / "compacted"
    result = compact(SAMPLES / dataset / "mnesia", out)
    assert result.verified
    assert_delivers_manifest(
        dataset, boot_and_drain(dataset, broker_dir / "run", out / "rabbit@localhost", clean_stop=False)
    )


REBUILD_CASES = [
    (ds, sc) for ds in ("3.10.8-kill", "4.3.6-kill") for sc in SCENARIOS if sc not in V1_ONLY or ds.startswith("3.")
]
REBUILD_CASES += [("3.10.8-clean", "rdq_zeroed_range"), ("4.3.6-clean", "rdq_missing")]
# damage whose messages the broker's own recovery loses while their bytes survive
RESCUES = {"rdq_marker_flip", "qi_bad_header", "qi_reserved_bit", "v1_segment_truncated"}
REBUILD_BOOTS = shared_boots(REBUILD_CASES)


@pytest.mark.parametrize("dataset, scenarios", REBUILD_BOOTS, ids=boot_ids(REBUILD_BOOTS))
def test_rebuild_output_delivers_every_salvaged_message(dataset, scenarios, broker_dir):
    """Each scenario damages a copy of its own, which is rebuilt and checked as it always was.
    Scenarios confined to the dirs of different queues (support.scenarios.CONFINED_TO) share
    the broker's boot (one boot, 4-6 CPU-seconds, for up to six of them): their damages,
    together on one more copy, rebuilt once, booted once; each scenario's own salvage must then
    be what that boot delivers from the queue it damaged and from every queue none of them did."""
    import cqforensics
    from cqforensics.write import rebuild
    from support import SAMPLES
    from support.oracle import compare_deliveries

    sample_node = SAMPLES / dataset / "mnesia" / "rabbit@localhost"
    salvaged, changes = {}, {}
    for sc in scenarios:
        src = broker_dir / sc / "damaged"
        node = copy_node(dataset, src)
        SCENARIOS[sc](node)
        out = broker_dir / sc / "rebuilt"
        result = rebuild(src, out)
        assert result.verified, sc
        for q in result.queues:  # never fewer than the broker's own recovery
            assert q.written >= q.broker_would_deliver, (sc, q)
        if sc in RESCUES or (sc == "rdq_zeroed_range" and dataset.startswith("3.")) or "clean" in dataset:
            assert result.rescued > 0 and result.exit_code == 1, sc
        salvaged[sc] = cqforensics.read_table(out).to_pylist()
        assert sum(r["survives_restart"] for r in salvaged[sc]) > 0, sc
        changes[sc] = changed_files(sample_node, node)
    if len(scenarios) == 1:
        booted = broker_dir / scenarios[0] / "rebuilt" / "rabbit@localhost"
        owner = {}
    else:  # every damage on one copy, rebuilt once
        owner = owners(sample_node, changes)
        node = copy_node(dataset, broker_dir / "together" / "damaged")
        for sc in scenarios:
            apply_changes(changes[sc], node)
        result = rebuild(node.parent, broker_dir / "together" / "rebuilt")
        assert result.verified, "+".join(scenarios)
        booted = broker_dir / "together" / "rebuilt" / "rabbit@localhost"
    got = boot_and_drain(dataset, broker_dir / "run", booted, clean_stop=False)
    got = [q for q in got if q.get("exists_after_restart", True)]
    failures = []
    for sc in scenarios:  # the queues it damaged, and those no scenario of this boot did
        diffs = compare_deliveries(
            [q for q in got if owner.get((q["vhost"], q["name"]), sc) == sc],
            [r for r in salvaged[sc] if owner.get((r["vhost"], r["queue"]), sc) == sc],
        )
        failures += [f"{sc}: {d}" for d in diffs]
    assert not failures, "\n".join(failures)


def _declare_like(b, node_dir) -> list[str]:
    """Declare on broker ``b`` every durable queue (and vhost) of ``node_dir``'s metadata, with
    its arguments: what importing definitions does before a migration."""
    from brokers.clients import pika_module
    from cqforensics.readers.metadata import read_metadata

    pika = pika_module()
    meta = read_metadata(node_dir)
    vhosts = sorted({v for v, _ in meta.queues})
    for v in vhosts:
        if v != b"/":
            b.ctl("add_vhost", v.decode())
            b.ctl("set_permissions", "-p", v.decode(), "guest", ".*", ".*", ".*")
    for v in vhosts:
        params = pika.URLParameters(b.url)
        params.virtual_host = v.decode()
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        for (qv, name), _ in sorted(meta.queues.items()):
            if qv == v:
                args = {k: (x.decode() if isinstance(x, bytes) else x) for k, x in meta.arguments(qv, name).items()}
                ch.queue_declare(name.decode(), durable=True, arguments=args)
        conn.close()
    return [v.decode() for v in vhosts]


def _expected_091(rows: list[dict]) -> dict:
    """What an AMQP 0-9-1 consumer must receive for the written rows, per queue in order."""
    import hashlib
    import json

    from cqforensics.write.rows import headers_table

    out: dict = {}
    for r in rows:
        props = dict(r["properties"])
        ts = props.pop("timestamp")
        props["timestamp"] = None if ts is None else int(ts.timestamp())
        out.setdefault((r["vhost"], r["queue"]), []).append(
            json.dumps(
                {
                    "body_sha256": hashlib.sha256(r["body"]).hexdigest(),
                    "exchange": r["exchange"] or "",
                    "routing_key": (r["routing_keys"] or [r["queue"]])[0],
                    "properties": props,
                    "headers": headers_table(r["headers"], r["term_format"]),
                },
                sort_keys=True,
            )
        )
    return out


def _delivered(queues: list[dict]) -> dict:
    import json

    return {
        (q["vhost"], q["name"]): [
            json.dumps(
                {k: m[k] for k in ("body_sha256", "exchange", "routing_key", "properties", "headers")}, sort_keys=True
            )
            for m in q["messages"]
        ]
        for q in queues
        if q["messages"]
    }


@pytest.mark.parametrize("dataset, move_to", [("3.10.8-kill", "orders.v1"), ("4.3.6-clean", "work")])
def test_spark_writer_output_delivers_the_written_rows(dataset, move_to, broker_dir, spark):
    """A migration: the target node's queues are declared, the node is stopped, rows read from
    the sample are filtered (poison messages out), partly moved to another queue and written
    with the target node as template; the broker boots on the output and delivers exactly them."""
    import shutil

    from pyspark.sql import functions as F

    from brokers import Broker
    from brokers.clients import drain_all
    from support import SAMPLES

    version = manifest(dataset)["broker"]["rabbitmq"]
    from support import need_broker

    need_broker(version)
    src = SAMPLES / dataset / "mnesia" / "rabbit@localhost"
    df = spark.read.format("rabbitcq").load(str(src)).where("survives_restart")
    poison = F.col("properties.message_id").endswith("1")
    moved = F.when(F.col("queue") == "orders.v2", F.lit(move_to)).otherwise(F.col("queue"))
    rows_df = df.where(~poison | F.col("properties.message_id").isNull()).withColumn("queue", moved)
    with Broker(version, broker_dir / "run") as b:
        b.start()
        vhosts = _declare_like(b, src)
        b.stop()
        out = broker_dir / "out"
        out.mkdir()
        shutil.copy2(b.mnesia_base / "rabbit@localhost-feature_flags", out)
        (
            rows_df.write.format("rabbitcq")
            .option("brokerVersion", version)
            .option("template", str(b.node_dir))
            .mode("overwrite")
            .save(str(out / "rabbit@localhost"))
        )
        written = spark.read.format("rabbitcq").load(str(out)).collect()
        assert all(r["survives_restart"] for r in written) and len(written) == rows_df.count() > 0
        b.install_node(out)
        b.start()
        got = drain_all(b, vhosts)
        b.kill()  # (nothing reads the node after the drain)
    expected = _expected_091([r.asDict(recursive=True) for r in rows_df.collect()])
    delivered = _delivered(got)
    assert sorted(delivered) == sorted(expected)
    for key in expected:
        assert delivered[key] == expected[key], key


# -- damage at many offsets of every booted sample: what has bytes left comes back ---------------------


def _spans(node) -> list[dict]:
    """Per message the broker delivers from the undamaged copy: its identity (vhost, queue, body
    digest) and the byte range of its stored entry ([file, start, end): the .rdq entry, size
    field to marker; the .qs entry, header and term; the CQv1 record's embedded term)."""
    import hashlib

    import cqforensics

    store = {
        (r["file"], r["msg_id"]): (r["offset"], r["offset"] + r["total_size"])
        for r in cqforensics.read_table(
            node, "store", columns=["file", "offset", "total_size", "msg_id", "status"]
        ).to_pylist()
        if r["status"] == "live"
    }
    index = {
        (r["file"], r["offset"]): r["store_size"]
        for r in cqforensics.read_table(node, "index", columns=["file", "offset", "store_size"]).to_pylist()
    }
    out = []
    for m in cqforensics.read_table(
        node,
        "messages",
        columns=[
            "vhost",
            "queue",
            "file",
            "offset",
            "location",
            "store_file",
            "store_offset",
            "msg_id",
            "body",
            "survives_restart",
        ],
    ).to_pylist():
        if not m["survives_restart"] or m["body"] is None or m["body"].startswith(b"\x00Sw"):
            continue  # (an AMQP 1.0 amqp-value body: a consumer gets a value, not these bytes)
        if m["location"] == "shared_store":
            start, end = store[(m["store_file"], m["msg_id"])]
        elif m["location"] == "queue_store":
            start, end = m["store_offset"], m["store_offset"] + 8 + index[(m["file"], m["offset"])]
        else:
            start, end = m["store_offset"], m["store_offset"] + index[(m["file"], m["offset"])]
        out.append(
            {
                "id": (m["vhost"], m["queue"], hashlib.sha256(m["body"]).hexdigest()),
                "file": m["store_file"],
                "start": start,
                "end": end,
                "location": m["location"],
            }
        )
    return out


def _damage_many(node, spans: list[dict]) -> list[tuple[str, int, int]]:
    """Damage at several places of the copy, as (file, start, end) ranges of destroyed bytes:
    in the shared store, a zeroed entry head, a flipped size field, 4 KiB zeroed inside the
    largest entry, and the smallest file cut inside its last entry; in the queue stores, a
    zeroed range and a flipped term byte."""
    from support import damage

    hits = []
    rdq = sorted((s for s in spans if s["location"] == "shared_store"), key=lambda s: (s["file"], s["start"]))
    qs = sorted((s for s in spans if s["location"] == "queue_store"), key=lambda s: (s["file"], s["start"]))
    if rdq:
        e = rdq[len(rdq) // 5]
        damage.zero(Path(e["file"]), e["start"], 24)
        hits.append((e["file"], e["start"], e["start"] + 24))
        e = rdq[2 * len(rdq) // 5]
        damage.flip(Path(e["file"]), e["start"] + 5, 0x10)
        hits.append((e["file"], e["start"] + 5, e["start"] + 6))
        big = max(rdq, key=lambda s: s["end"] - s["start"])
        if big["end"] - big["start"] > 3 * 4096:
            mid = (big["start"] + big["end"]) // 2
            damage.zero(Path(big["file"]), mid, 4096)
            hits.append((big["file"], mid, mid + 4096))
        files = sorted({s["file"] for s in rdq}, key=lambda f: -Path(f).stat().st_size)
        cut_in = [s for s in rdq if s["file"] == files[-1] and (s["file"], s["start"], s["end"]) != hits[0]]
        if cut_in:
            e = cut_in[-1]
            at = (e["start"] + e["end"]) // 2
            damage.truncate(Path(e["file"]), at)
            hits.append((e["file"], at, 1 << 62))
    if qs:
        e = qs[len(qs) // 3]
        damage.zero(Path(e["file"]), e["start"] + 10, 16)
        hits.append((e["file"], e["start"] + 10, e["start"] + 26))
        e = qs[2 * len(qs) // 3]
        damage.flip(Path(e["file"]), e["end"] - 2)
        hits.append((e["file"], e["end"] - 2, e["end"] - 1))
    return hits


BOOTED_SAMPLES = [
    "3.10.8-clean",
    "3.10.8-kill",
    "3.10.8-segments",
    "4.0.5-clean",
    "4.0.5-kill",
    "4.3.6-clean",
    "4.3.6-kill",
    "4.3.6-rolled",
]


@pytest.mark.parametrize("dataset", BOOTED_SAMPLES)
def test_rebuild_after_damage_at_many_offsets_delivers_everything_with_bytes_left(dataset, broker_dir):
    """Issue 13: on a copy of the sample, the shared store and the queue stores are damaged at
    several offsets at once (zeroed ranges, flips, a truncation; inside the largest entry too).
    The copy is rebuilt and the real broker of the sample's version booted on the output: it
    delivers every message the undamaged sample delivers whose stored bytes the damage did not
    touch (none lost), and nothing else but altered copies of touched ones (the shared store has
    no checksum: a message whose body bytes were zeroed is delivered as it now reads)."""
    import shutil
    from collections import Counter

    from cqforensics.write import rebuild
    from support import SAMPLES, copy_node

    node = copy_node(dataset, broker_dir / "damaged" / "mnesia")
    spans = _spans(SAMPLES / dataset / "mnesia" / node.name)
    for s in spans:  # the copy's paths
        s["file"] = str(node / Path(s["file"]).relative_to(SAMPLES / dataset / "mnesia" / node.name))
    hits = _damage_many(node, spans)
    assert hits
    touched = [s for s in spans if any(f == s["file"] and a < s["end"] and s["start"] < b for f, a, b in hits)]
    intact = Counter(s["id"] for s in spans) - Counter(s["id"] for s in touched)
    result = rebuild(node.parent, broker_dir / "rebuilt")
    assert result.verified
    got = boot_and_drain(dataset, broker_dir / "run", broker_dir / "rebuilt" / node.name, clean_stop=False)
    delivered = Counter(
        (q["vhost"], q["name"], m["body_sha256"])
        for q in got
        for m in q["messages"]
        if m.get("body_section") != "amqp-value"
    )
    assert not intact - delivered, f"messages with intact bytes not delivered: {intact - delivered}"
    extra = delivered - intact
    per_queue = Counter(s["id"][:2] for s in touched)
    for (vhost, queue, _), n in extra.items():  # altered copies of touched messages only
        assert per_queue[(vhost, queue)] >= n, (vhost, queue, extra)
    shutil.rmtree(broker_dir / "rebuilt")
