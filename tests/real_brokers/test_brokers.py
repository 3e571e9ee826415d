"""Real brokers (3.10.8, 4.0.5, 4.3.6): the harness starts, kills and restarts them, and every
committed sample boots on the broker that wrote it and delivers exactly its manifest."""

from __future__ import annotations

import pytest

from support import SAMPLES, datasets, manifest, need_broker
from support.live import boot_and_drain, comparable

pytestmark = pytest.mark.broker

VERSIONS = ("3.10.8", "4.0.5", "4.3.6")


@pytest.mark.parametrize("version", VERSIONS)
def test_harness_start_publish_kill_restart_stop(version, broker_dir):
    need_broker(version)
    from brokers import Broker, BrokerError
    from brokers.clients import pika_module

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
        # confirmed messages are on disk; the declaration's Mnesia outcome may not be yet
        b.wait_durable("harness")
        with pytest.raises(BrokerError, match="declaration of 'never.declared' in vhost '/'"):
            b.wait_durable("harness", "never.declared", timeout=0.5)
        b.kill()
        assert not list(b.node_dir.glob("msg_stores/vhosts/*/msg_store_persistent/clean.dot"))
        b.start()
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        assert conn.channel().queue_declare("harness", durable=True, passive=True).method.message_count == 20
        conn.close()
        b.stop()
        assert list(b.node_dir.glob("msg_stores/vhosts/*/msg_store_persistent/clean.dot"))


# the imported datasets (3.12.14, 3.13.7, 4.1.8, 4.2.2) were written by brokers no runtime here
# provides: they are proven by reading (tests/model/test_oracle.py), never booted
# (the streams and quorum samples are booted by their own tests, on the samples and on damaged
# copies: tests/real_brokers/test_streams_brokers.py, tests/real_brokers/test_quorum_brokers.py; a drain of their queues is
# not what their ground truth records: records served from first, dead letters timed by the boot)
BOOTED = [
    d
    for d in datasets()
    if manifest(d)["broker"]["rabbitmq"] in VERSIONS and "-streams-" not in d and "-quorum-" not in d
]


@pytest.mark.parametrize("dataset", BOOTED)
def test_sample_boots_and_delivers_its_manifest(dataset, broker_dir):
    """The oracle is reproducible: the committed bytes, booted again, give the same deliveries."""
    got = comparable(
        [
            q
            for q in boot_and_drain(dataset, broker_dir / "run", clean_stop=False)
            if q.get("exists_after_restart", True)
        ]
    )
    want = comparable([q for q in manifest(dataset)["queues"] if q.get("exists_after_restart", True)])
    assert got == want


@pytest.mark.parametrize("dataset", ["4.0.5-kill", "3.10.8-kill"])
def test_declaration_without_its_outcome_is_not_recovered(dataset, broker_dir):
    """The kill sample with a declaration's logged outcome cut out of LATEST.LOG (as a kill -9
    between the two disk_log flushes leaves it) boots with exactly the queues the reader lists:
    Mnesia aborts the undecided declaration (tests/model/test_metadata_outcomes.py)."""
    from brokers import Broker
    from brokers.clients import list_all_queues
    from cqforensics.readers.metadata import read_metadata
    from support.damage import drop_declaration_outcome

    version = manifest(dataset)["broker"]["rabbitmq"]
    need_broker(version)
    with Broker(version, broker_dir / "run") as b:
        b.install_node(SAMPLES / dataset / "mnesia")
        dropped = drop_declaration_outcome(b.node_dir)
        meta = read_metadata(b.node_dir)
        assert dropped not in meta.queues
        b.start()
        listed = list_all_queues(b)  # (one rabbitmqctl call for every vhost)
        booted = {(vhost, q["name"].encode()) for vhost in meta.vhosts for q in listed.get(vhost.decode(), [])}
        b.kill()
    assert booted == set(meta.queues)
