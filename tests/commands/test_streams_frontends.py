"""Streams through every front end: fsck (per-queue prediction and findings, text and JSON),
report, export, audit, republish (the plan without a broker; to a stream and to another queue
on a real broker, with its confirms and its no-duplicate journal). Spark: tests/frontends/test_spark.py."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from cli.main import main
from support import SAMPLES, need_broker
from support.oracle import manifest
from support.stream_damage import DAMAGES

DS = "4.3.6-streams-kill"
NODE = SAMPLES / DS / "mnesia"


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _served(stream):
    (t,) = [t for t in manifest(DS)["streams"] if t["stream"] == stream]
    return t["served_stream_protocol"]["records"]


def test_fsck_lists_each_stream_with_its_prediction_text_and_json(capsys):
    code, out, _ = run(capsys, "fsck", NODE, "--json")
    report = json.loads(out)
    streams = {q["queue"]: q for q in report["queues"] if q["queue_type"] == "stream"}
    assert {k: v["predicted_after_restart"] for k, v in streams.items()} == {
        s: len(_served(s)) for s in ("st.events", "st.retained")
    }
    codes = {(f["code"], f["queue"]) for f in report["findings"]}
    assert ("stream-not-served", "st.events") in codes and ("stream-retention", "st.retained") in codes
    code, out, _ = run(capsys, "fsck", NODE)
    assert code == 0 and "stream-not-served" in out
    assert any(line.split()[1:3] == ["st.events", "stream"] for line in out.splitlines() if len(line.split()) > 2)


def test_fsck_names_the_damage_and_what_the_boot_loses(capsys, tmp_path):
    node = tmp_path / "mnesia"
    shutil.copytree(NODE, node, symlinks=True)
    d = next(p for p in (node / "rabbit@localhost" / "stream").iterdir() if "events" in p.name)
    done = DAMAGES["index_behind"](d)  # crafted from the sample's bytes: the index lost 3 records
    code, out, _ = run(capsys, "fsck", node, "--json")
    report = json.loads(out)
    assert code == 4
    (q,) = [q for q in report["queues"] if q["queue"] == "st.events"]
    assert q["drop_reasons"] == {"stream_chunk_cut": q["dropped"]} and q["dropped"] > 0
    (f,) = [f for f in report["findings"] if f["code"] == "osiris-index-mismatch"]
    assert f["file"].endswith(done["file"].split("/")[-1].replace(".index", ".segment"))
    assert any(f["code"] == "stream-boot-loss" for f in report["findings"])


def test_report_shows_streams(tmp_path, capsys):
    out = tmp_path / "r.html"
    code, _, _ = run(capsys, "report", NODE, "--html", out)
    html = out.read_text()
    assert code == 0
    for name in ("st.events", "st.retained"):
        assert f'data-queue="{name}"' in html
    assert ">stream<" in html and "not served to an AMQP 0-9-1 consumer" in html


def test_export_carries_every_stream_record(tmp_path, capsys):
    code, _, _ = run(capsys, "export", NODE, "--format", "jsonl", "--out", tmp_path / "x")
    rows = [json.loads(line) for line in (tmp_path / "x" / "messages.jsonl").read_text().splitlines()]
    assert code == 0
    for name in ("st.events", "st.retained"):
        mine = [r for r in rows if r["queue"] == name]
        assert mine and all(r["source"] == "stream" for r in mine)
        assert [r["stream_offset"] for r in mine if r["survives_restart"]] == [o for o, _, _ in _served(name)]
    skipped = [r for r in rows if r["amqp091_drop_reason"] == "stream_compressed_skipped"]
    assert len(skipped) == 40 and {r["queue"] for r in skipped} == {"st.events"}  # 4 compressed sub-batches


def test_audit_covers_streams(capsys):
    code, out, _ = run(capsys, "audit", NODE, "--json")
    a = json.loads(out)
    assert code == 0 and "streams" in a["covers"]
    st = {s["queue"]: s for s in a["streams"]}
    assert st["st.events"]["kept"] == len(_served("st.events")) and st["st.retained"]["first_offset"] > 0
    fan = [g for g in a["duplicates_by_message_id"] if g["kind"] == "fan-out (a copy per stream)"]
    assert fan and all({"cq.events", "st.events"} <= set(g["queues"]) for g in fan)
    assert any("st.retained" in g["queues"] for g in fan)


def test_republish_plan_sends_each_kept_stream_record_to_its_stream():
    from cqforensics.commands.republish import Filters, load_router, parse_map, plan, read_rows

    rows = list(read_rows([str(NODE)]))
    pubs, _ = plan(rows, Filters(queues=["st.events"]), {}, load_router([str(NODE)]))
    assert [p.row["stream_offset"] for p in pubs] == [o for o, _, _ in _served("st.events")]
    assert all(p.targets == ["st.events"] and not p.amqp10 for p in pubs)
    # a record the exchange routed to three queues goes straight to its stream: no second copy elsewhere
    assert all(p.exchange == "" and p.routing_key == "st.events" for p in pubs if p.row["exchange"] == "ex.streams")
    pubs, _ = plan(rows, Filters(queues=["st.retained"]), parse_map(["st.retained=cq.copy"]))
    assert {q for p in pubs for q in p.targets} == {"cq.copy"} and len(pubs) == len(_served("st.retained"))


@pytest.mark.broker
def test_republish_to_a_stream_and_to_another_queue(broker_dir, tmp_path):
    """A 4.3.6 broker receives st.events into a stream of that name and st.retained into a
    classic queue; every kept record arrives once, in order, bodies as a 0-9-1 consumer of the
    source broker received them; a second run sends nothing (the journal)."""
    need_broker("4.3.6")
    from brokers import Broker
    from brokers.clients import drain_091, pika_module
    from brokers.streams import served_amqp091
    from cqforensics.commands.republish import republish

    pika = pika_module()
    with Broker("4.3.6", broker_dir / "run") as b:
        b.start()
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.queue_declare("st.events", durable=True, arguments={"x-queue-type": "stream"})
        ch.queue_declare("cq.copy", durable=True)
        conn.close()
        journal = tmp_path / "journal"
        r = republish(
            [str(NODE)],
            b.url,
            journal=journal,
            queues=["st.events", "st.retained"],
            queue_map={"st.retained": "cq.copy"},
        )
        again = republish(
            [str(NODE)],
            b.url,
            journal=journal,
            queues=["st.events", "st.retained"],
            queue_map={"st.retained": "cq.copy"},
        )
        got = served_amqp091(b, "st.events", idle=1.0, prefetch=1)["messages"]
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        copied = drain_091(conn.channel(), "cq.copy")
        conn.close()
        # no clean stop: leaving the block kills the broker (Broker.close), and nothing is read after it
    rep = r.as_dict()
    assert not rep["failed"] and rep["sent"] == len(_served("st.events")) + len(_served("st.retained"))
    assert again.as_dict()["sent"] == 0
    import cqforensics

    rows = cqforensics.read_table(NODE, "messages", broker_version="4.3.6").to_pylist()

    def bodies(name):
        return [
            hashlib.sha256(x["body"] or b"").hexdigest() for x in rows if x["queue"] == name and x["survives_restart"]
        ]

    assert [m["body_sha256"] for m in got] == bodies("st.events")
    assert [m["body_sha256"] for m in copied] == bodies("st.retained")


@pytest.mark.slow
def test_every_command_in_the_streams_doc_runs(tmp_path, capsys, monkeypatch):
    """docs/streams.md shows real invocations: each runs from the checkout (outputs under /tmp
    go to a temp dir) and exits as documented (0, or 4: errors found and left)."""
    import glob
    import shlex

    from support import ROOT

    monkeypatch.chdir(ROOT)
    lines = [
        ln.strip()[2:]
        for ln in (ROOT / "docs" / "streams.md").read_text().splitlines()
        if ln.strip().startswith("$ cqforensics ")
    ]
    assert len(lines) >= 10
    for line in lines:
        argv = []
        for a in shlex.split(line)[1:]:
            a = a.replace("/tmp/", f"{tmp_path}/")
            argv += sorted(glob.glob(a)) if "*" in a else [a]
        code, out, err = run(capsys, *argv)
        assert code in (0, 4), f"{line}: exit {code}\n{err[-800:]}"
        assert "Traceback" not in err and "internal error" not in err, line
