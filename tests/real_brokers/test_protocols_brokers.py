"""The harness runs brokers with the MQTT and STOMP plugins (issue 14), and a node dir written
with the MQTT plugin gets it back when a test boots it (tests/real_brokers/test_brokers.py boots every
``*-proto-*`` sample and compares its deliveries with the manifest)."""

from __future__ import annotations

import pytest

from brokers import plugins_needed
from support import SAMPLES, datasets, need_broker

PROTO = [d for d in datasets() if "-proto-" in d]


@pytest.mark.parametrize("dataset", PROTO)
def test_plugins_needed_reads_the_feature_flags(dataset):
    """4.x records the MQTT plugin's feature flags; 3.10 needs no plugin to deliver its samples."""
    want = ["rabbitmq_mqtt"] if dataset.startswith("4.") else []
    assert plugins_needed(SAMPLES / dataset / "mnesia") == want
    assert plugins_needed(SAMPLES / "4.3.6-clean" / "mnesia") == []


@pytest.mark.broker
@pytest.mark.parametrize("version", ["3.10.8", "4.3.6"])
def test_harness_enables_mqtt_and_stomp(version, broker_dir):
    need_broker(version)
    from brokers import Broker
    from brokers.clients import (
        drain_091,
        mqtt_client,
        mqtt_close,
        mqtt_publish,
        pika_module,
        stomp_connection,
        stomp_send,
    )

    pika = pika_module()
    with Broker(version, broker_dir / "run", plugins=["rabbitmq_stomp", "rabbitmq_mqtt"]) as b:
        assert (b.run_dir / "enabled_plugins").read_text() == "[rabbitmq_mqtt,rabbitmq_stomp].\n"
        b.start()
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.queue_declare("h", durable=True)
        ch.queue_bind("h", "amq.topic", routing_key="t.#")
        mqtt_version = "3.1.1" if version.startswith("3.") else "5.0"
        c = mqtt_client(b.mqtt_port, "harness", mqtt_version)
        props = {"UserProperty": [("k", "v")]} if mqtt_version == "5.0" else None
        mqtt_publish(c, mqtt_version, "t/x", b"from mqtt", 1, props=props)
        mqtt_close(c)
        s = stomp_connection(b.stomp_port)
        stomp_send(s, "/amq/queue/h", b"from stomp", {"persistent": "true", "custom": "1"})
        s.disconnect()
        got = drain_091(ch, "h")
        conn.close()
        b.stop()
    assert [m["body_len"] for m in got] == [9, 10]
    assert got[1]["headers"]["custom"] == {"type": "longstr", "value": "1"}
    if mqtt_version == "5.0":
        assert got[0]["headers"] == {"k": {"type": "longstr", "value": "v"}}


def test_unknown_plugin_is_refused(tmp_path):
    from brokers import Broker, BrokerError, runtime

    if runtime("3.10.8").unavailable():
        pytest.skip("needs an installed runtime to construct a Broker")
    with pytest.raises(BrokerError):
        Broker("3.10.8", tmp_path / "run", plugins=["rabbitmq_web_mqtt"])
