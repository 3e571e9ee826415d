"""cqforensics republish: the plan (no broker), and real brokers receiving a sample's messages
(compared with the sample's manifest), including a replay killed with SIGKILL and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from support import ROOT, SAMPLES, manifest, need_broker

DATASET = "4.3.6-kill"


def _rows(dataset=DATASET):
    from cqforensics.commands.republish import read_rows

    return list(read_rows([str(SAMPLES / dataset / "mnesia")]))


def test_plan_sends_survivors_once_per_queue_and_fanout_through_the_exchange():
    from cqforensics.commands.republish import Filters, load_router, plan

    rows = _rows()
    pubs, stats = plan(rows, Filters(), {}, load_router([str(SAMPLES / DATASET / "mnesia")]))
    want = Counter((r["vhost"], r["queue"]) for r in rows if r["survives_restart"])
    got = Counter((p.vhost, q) for p in pubs for q in p.targets)
    assert got == want
    fan = [p for p in pubs if len(p.targets) > 1]
    assert fan and all(p.exchange in ("fanout.audit", "fanout.amqp10") and not p.direct for p in fan)
    # copies of a fan-out whose third copy was acked go direct: the exchange would reach that queue again
    partial = [p for p in pubs if p.direct and p.row["exchange"] == "fanout.audit"]
    assert partial and all(p.exchange == "" and p.routing_key == p.targets[0] for p in partial)


def test_plan_filters_map_and_only_dropped(tmp_path):
    from cqforensics.commands.republish import Filters, plan, read_ids

    rows = _rows()
    pubs, _ = plan(rows, Filters(queues=["orders.v2"]), {"orders.v2": "orders.new"})
    assert {(p.exchange, p.routing_key, tuple(p.targets)) for p in pubs} == {("", "orders.new", ("orders.new",))}
    dropped, _ = plan(rows, Filters(only_dropped=True), {})
    assert dropped and all(not p.row["survives_restart"] and p.row["body"] is not None for p in dropped)
    some = [r for r in rows if r["survives_restart"]][:3]
    (tmp_path / "ids").write_text(
        "# ids\n" + some[0]["msg_id"] + "\n" + (some[1]["properties"]["message_id"] or "-") + "\n"
    )
    picked, _ = plan(rows, Filters(ids=read_ids(str(tmp_path / "ids"))), {})
    assert {p.row["msg_id"] for p in picked} >= {some[0]["msg_id"]}


def test_export_and_node_give_the_same_plan(tmp_path):
    from cqforensics.commands.export import export
    from cqforensics.commands.republish import Filters, plan, read_rows

    a, _ = plan(_rows(), Filters(), {})
    for fmt in ("jsonl", "parquet"):
        export([str(SAMPLES / DATASET / "mnesia")], fmt, tmp_path / fmt)
        for src in (tmp_path / fmt, tmp_path / fmt / f"messages.{fmt}"):
            b, _ = plan(read_rows([str(src)]), Filters(), {})
            assert [(p.vhost, p.exchange, p.routing_key, p.keys, p.targets) for p in a] == [
                (p.vhost, p.exchange, p.routing_key, p.keys, p.targets) for p in b
            ]


def test_dry_run_cli_and_journal_never_inside_an_input(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    node = str(SAMPLES / DATASET / "mnesia")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "cqforensics",
            "republish",
            node,
            "amqp://guest:guest@127.0.0.1:1/",
            "--dry-run",
            "--json",
            "--journal",
            str(tmp_path / "j"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["dry_run"] and doc["copies"] == sum(1 for r in _rows() if r["survives_restart"])
    assert not (tmp_path / "j").exists()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "cqforensics",
            "republish",
            node,
            "amqp://guest:guest@127.0.0.1:1/",
            "--journal",
            str(SAMPLES / DATASET / "mnesia" / "j"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert p.returncode == 16, p.stderr


# -- real brokers ----------------------------------------------------------------------------------


def _declare_topology(b, dataset: str) -> None:
    """The sample's vhosts, queues (with their arguments), exchanges and bindings, on a fresh broker."""
    from brokers.clients import pika_module
    from cqforensics.readers.metadata import read_metadata

    pika = pika_module()
    m = manifest(dataset)
    meta = read_metadata(SAMPLES / dataset / m["node_dir"])
    for vhost in m["vhosts"]:
        if vhost != "/":
            b.ctl("add_vhost", vhost)
            b.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    for vhost in m["vhosts"]:
        params = pika.URLParameters(b.url)
        params.virtual_host = vhost
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        for (vh, name), xtype in meta.exchanges.items():
            if vh.decode() == vhost and name and not name.startswith(b"amq."):
                ch.exchange_declare(name.decode(), xtype, durable=True)
        for q in m["queues"]:
            if q["vhost"] == vhost and q.get("exists_after_restart", True):
                ch.queue_declare(q["name"], durable=True, arguments=q.get("arguments") or None)
        for bd in meta.bindings:
            if bd.vhost.decode() == vhost and bd.dest_kind == "queue":
                ch.queue_bind(bd.destination.decode(), bd.source.decode(), bd.key.decode())
        conn.close()


def _expected(dataset: str, direct: set) -> dict:
    out = {}
    for q in manifest(dataset)["queues"]:
        if q.get("exists_after_restart", True):
            out[(q["vhost"], q["name"])] = [_cmp(x, (q["vhost"], q["name"]) in direct) for x in q["messages"]]
    return out


def _cmp(msg: dict, direct: bool) -> str:
    """A delivered message without what a republish cannot keep: redelivered; for a copy sent
    straight to its queue, the exchange and routing key; AMQP 1.0 creation times set by the
    publisher are kept, the broker-added x-exchange/x-routing-key annotations are not compared."""
    m = {k: v for k, v in msg.items() if k != "redelivered"}
    if direct:
        m.pop("exchange", None)
        m.pop("routing_key", None)
    if m.get("protocol") == "amqp10":
        m.pop("exchange", None)
        m.pop("routing_key", None)
        m["message_annotations"] = {
            k: v for k, v in m["message_annotations"].items() if k not in ("x-exchange", "x-routing-key")
        }
    return json.dumps(m, sort_keys=True)


def _drain(b, dataset: str, direct: set) -> dict:
    from brokers.clients import drain_all

    m = manifest(dataset)
    known = {
        (q["vhost"], q["name"]): {k: v for k, v in q.items() if k in ("vhost", "name", "drain")}
        for q in m["queues"]
        if q.get("exists_after_restart", True)
    }
    got = {}
    for q in drain_all(b, m["vhosts"], known):
        if q.get("exists_after_restart", True):
            got[(q["vhost"], q["name"])] = [_cmp(x, (q["vhost"], q["name"]) in direct) for x in q["messages"]]
    return got


def _direct_queues(dataset: str) -> set:
    """Queues some of whose copies the plan sends straight to the queue (their exchange is lost)."""
    from cqforensics.commands.republish import Filters, load_router, plan

    pubs, _ = plan(_rows(dataset), Filters(), {}, load_router([str(SAMPLES / dataset / "mnesia")]))
    return {(p.vhost, q) for p in pubs if p.direct for q in p.targets}


def _cli(*args, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "cqforensics", "republish", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


@pytest.mark.broker
@pytest.mark.parametrize(
    "dataset",
    [
        "4.3.6-kill",
        "3.10.8-kill",
        # 285 s once on a loaded shared machine (not profiled yet)
        pytest.param("4.3.6-quorum-kill", marks=pytest.mark.slow),
    ],
)
def test_republish_delivers_the_manifest(dataset, broker_dir, tmp_path):
    """Every message the sample's broker delivered after its restart (classic queues; quorum
    queues and their dead-letter queues in the quorum sample) arrives, once, in order."""
    version = dataset.split("-")[0]
    need_broker(version)
    from brokers import Broker

    direct = _direct_queues(dataset)
    with Broker(version, broker_dir / "run") as b:
        b.start()
        _declare_topology(b, dataset)
        p = _cli(str(SAMPLES / dataset / "mnesia"), b.url, "--journal", str(tmp_path / "j"), "--json")
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        report = json.loads(out)
        assert not report["failed"] and report["sent"] == report["planned"]
        got = _drain(b, dataset, direct)
        # no clean stop: leaving the block kills the broker (Broker.close), and nothing is read after it
    want = _expected(dataset, direct)
    for key in sorted(set(got) | set(want)):
        assert got.get(key, []) == want.get(key, []), key


@pytest.mark.broker
def test_republish_killed_mid_replay_resumes_exactly_once(broker_dir, tmp_path):
    version, dataset = "4.3.6", DATASET
    need_broker(version)
    from brokers import Broker

    direct = _direct_queues(dataset)
    journal = tmp_path / "j"
    with Broker(version, broker_dir / "run") as b:
        b.start()
        _declare_topology(b, dataset)
        kills = 0
        for stop_after in (7, 25, 41):  # confirmed publishes before each SIGKILL
            p = _cli(str(SAMPLES / dataset / "mnesia"), b.url, "--journal", str(journal), "--rate", "25")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and p.poll() is None:
                text = journal.read_text() if journal.exists() else ""
                if sum(1 for line in text.splitlines() if '"op": "ok"' in line) >= stop_after:
                    break
                time.sleep(0.01)
            assert p.poll() is None, p.communicate()
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            kills += 1
        p = _cli(str(SAMPLES / dataset / "mnesia"), b.url, "--journal", str(journal), "--json")
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        report = json.loads(out)
        assert report["already"] > 0 and not report["failed"]
        got = _drain(b, dataset, direct)
        # no clean stop: leaving the block kills the broker (Broker.close), and nothing is read after it
    want = _expected(dataset, direct)
    for key in sorted(set(got) | set(want)):  # every message exactly once, in order
        assert got.get(key, []) == want.get(key, []), key
    assert kills == 3
