"""Real brokers (3.10.8, 4.0.5, 4.3.6): the harness starts, kills and restarts them, and every
committed sample boots on the broker that wrote it and delivers exactly its manifest."""

from __future__ import annotations

import json
import time

import pytest

from conftest import SAMPLES, datasets, manifest, need_broker

pytestmark = pytest.mark.broker

VERSIONS = ("3.10.8", "4.0.5", "4.3.6")


@pytest.mark.parametrize("version", VERSIONS)
def test_harness_start_publish_kill_restart_stop(version, broker_dir):
    need_broker(version)
    from cqforensics.broker import Broker
    from cqforensics.broker.clients import pika_module

    pika = pika_module()
    with Broker(version, broker_dir / "run") as b:
        b.start()
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("harness", durable=True, arguments={"x-queue-version": 2})
        for i in range(20):
            ch.basic_publish("", "harness", b"x" * (i * 500), pika.BasicProperties(delivery_mode=2))
        conn.close()
        # confirmed messages are on disk; the declaration reaches the metadata store's log a
        # moment later (once seen taking over 1.5 s on 4.0.5): wait until our reader sees it
        from cqforensics.readers.metadata import read_metadata

        deadline = time.monotonic() + 30
        while not read_metadata(b.node_dir).knows(b"/", b"harness") and time.monotonic() < deadline:
            time.sleep(0.2)
        b.kill()
        assert not list(b.node_dir.glob("msg_stores/vhosts/*/msg_store_persistent/clean.dot"))
        b.start()
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        assert conn.channel().queue_declare("harness", durable=True, passive=True).method.message_count == 20
        conn.close()
        b.stop()
        assert list(b.node_dir.glob("msg_stores/vhosts/*/msg_store_persistent/clean.dot"))


def _comparable(queues: list[dict]) -> dict:
    """Per queue, the delivered messages without the fields a later boot may change."""
    out = {}
    for q in queues:
        msgs = []
        for m in q["messages"]:
            m = {k: v for k, v in m.items() if k != "redelivered"}
            msgs.append(json.dumps(m, sort_keys=True))
        out[(q["vhost"], q["name"])] = msgs
    return out


def boot_and_drain(dataset: str, run_dir, node_dir=None) -> list[dict]:
    """Boot the dataset's broker version on a copy (or on ``node_dir``'s mnesia base) and drain it."""
    from cqforensics.broker import Broker
    from cqforensics.broker.clients import drain_all

    m = manifest(dataset)
    version = m["broker"]["rabbitmq"]
    need_broker(version)
    settings = m.get("settings") or {}
    adv = None
    if settings:
        items = ", ".join(f"{{{k}, {v}}}" for k, v in settings.items())
        adv = f"[{{rabbit, [{items}]}}].\n"
    known = {(q["vhost"], q["name"]): {k: v for k, v in q.items() if k in ("vhost", "name", "drain", "index_version",
                                                                         "arguments")}
             for q in m["queues"] if q.get("exists_after_restart", True)}
    with Broker(version, run_dir, advanced_config=adv) as b:
        b.install_node(SAMPLES / dataset / "mnesia" if node_dir is None else node_dir.parent)
        b.start()
        queues = drain_all(b, m["vhosts"], known)
        b.stop()
    return queues


# the imported datasets (3.12.14, 3.13.7, 4.1.8, 4.2.2) were written by brokers no runtime here
# provides: they are proven by reading (tests/test_oracle.py), never booted
BOOTED = [d for d in datasets() if manifest(d)["broker"]["rabbitmq"] in VERSIONS]


@pytest.mark.parametrize("dataset", BOOTED)
def test_sample_boots_and_delivers_its_manifest(dataset, broker_dir):
    """The oracle is reproducible: the committed bytes, booted again, give the same deliveries."""
    got = _comparable([q for q in boot_and_drain(dataset, broker_dir / "run") if q.get("exists_after_restart", True)])
    want = _comparable([q for q in manifest(dataset)["queues"] if q.get("exists_after_restart", True)])
    assert got == want
