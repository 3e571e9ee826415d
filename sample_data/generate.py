#!/usr/bin/env python3
"""Generate the sample node dirs from real RabbitMQ brokers, with their ground truth.

For each dataset: boot a fresh broker of the given version, run the scenario below, stop it
(``rabbitmqctl shutdown`` or kill -9), copy its mnesia base to ``OUT/<dataset>/mnesia`` (the
committed sample), then restart the broker on the *original* dir and drain every queue,
recording what it delivered, in order, into ``OUT/<dataset>/manifest.json`` (the oracle).
Profiles in ``ARCHIVED`` are committed as ``rabbit.tar.gz`` + ``manifest.json.gz`` instead.

    python sample_data/generate.py                      # every dataset into sample_data/
    python sample_data/generate.py 4.3.6-kill --out /tmp/samples
    python sample_data/generate.py --readme             # refresh README.md's checksum list

Needs root (chroots) and the runtimes (python -m brokers.runtimes install).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from brokers import Broker  # noqa: E402
from brokers.clients import (  # noqa: E402
    ALL_TYPES,
    amqp10_connection,
    drain_all,
    mqtt_client,
    mqtt_close,
    mqtt_publish,
    mqtt_subscribe,
    pika_module,
    proton,
    stomp_connection,
    stomp_send,
)

pika = pika_module()

VHOST2 = "staging/ü"  # a second vhost, with a non-ASCII name
LOREM = b"RabbitMQ classic-queue forensic sample; every byte of it was written by a real broker. "

#: dataset name -> (broker version, stop mode, profile). Profiles other than "full" change
#: broker settings (recorded in the manifest; a broker booting the sample must use them too).
DATASETS = {
    "3.10.8-clean": ("3.10.8", "clean", "full"),
    "3.10.8-kill": ("3.10.8", "kill", "full"),
    "3.10.8-segments": ("3.10.8", "clean", "segments"),
    "4.0.5-clean": ("4.0.5", "clean", "full"),
    "4.0.5-kill": ("4.0.5", "kill", "full"),
    "4.3.6-clean": ("4.3.6", "clean", "full"),
    "4.3.6-kill": ("4.3.6", "kill", "full"),
    "4.3.6-rolled": ("4.3.6", "kill", "rolled"),
    # MQTT 3.1.1 / 5.0 and STOMP publishers (committed as an archive, see ARCHIVED)
    "3.10.8-proto-clean": ("3.10.8", "clean", "protocols"),
    "3.10.8-proto-kill": ("3.10.8", "kill", "protocols"),
    "4.0.5-proto-clean": ("4.0.5", "clean", "protocols"),
    "4.0.5-proto-kill": ("4.0.5", "kill", "protocols"),
    "4.3.6-proto-clean": ("4.3.6", "clean", "protocols"),
    "4.3.6-proto-kill": ("4.3.6", "kill", "protocols"),
    # streams over AMQP 0-9-1, AMQP 1.0 (4.x) and the stream protocol (committed as an archive)
    "3.10.8-streams-clean": ("3.10.8", "clean", "streams"),
    "3.10.8-streams-kill": ("3.10.8", "kill", "streams"),
    "4.0.5-streams-clean": ("4.0.5", "clean", "streams"),
    "4.0.5-streams-kill": ("4.0.5", "kill", "streams"),
    "4.3.6-streams-clean": ("4.3.6", "clean", "streams"),
    "4.3.6-streams-kill": ("4.3.6", "kill", "streams"),
    # quorum queues beside classic ones (committed as an archive, see ARCHIVED)
    "3.10.8-quorum-clean": ("3.10.8", "clean", "quorum"),
    "3.10.8-quorum-kill": ("3.10.8", "kill", "quorum"),
    "4.0.5-quorum-clean": ("4.0.5", "clean", "quorum"),
    "4.0.5-quorum-kill": ("4.0.5", "kill", "quorum"),
    "4.3.6-quorum-clean": ("4.3.6", "clean", "quorum"),
    "4.3.6-quorum-kill": ("4.3.6", "kill", "quorum"),
}
#: rabbit application settings per profile (advanced.config)
SETTINGS = {
    "full": {},
    # 64 KiB shared-store files: the store rolls over many files, and compaction shows up
    "rolled": {"msg_store_file_size_limit": 65536},
    # 32-entry index segments (v1 via the vhost's .config, v2 via the app env)
    "segments": {"queue_index_segment_entry_count": 32, "classic_queue_index_v2_segment_entry_count": 32},
    "protocols": {},
    "streams": {},
    # a small Ra WAL (ra app env, the rabbitmq.conf key raft.wal_max_size_bytes) and small segments
    # (raft.segment_max_entries): the WAL rolls over during the churn, so segments, a snapshot and
    # a WAL holding the rest are all on disk at the stop
    "quorum": {"ra.wal_max_size_bytes": 1048576, "ra.segment_max_entries": 1024},
}
#: protocol plugins enabled per profile (a broker booting such a sample needs them: manifest "plugins")
PLUGINS = {"protocols": ["rabbitmq_mqtt", "rabbitmq_stomp"], "streams": ["rabbitmq_stream"]}
#: profiles committed as ``<dataset>/rabbit.tar.gz`` + ``manifest.json.gz`` (unpacked by the tests
#: into the gitignored ``<dataset>/mnesia/``) instead of an unpacked node dir
ARCHIVED = {"protocols", "streams", "quorum"}
ARCHIVE = "rabbit.tar.gz"
QUEUE_TTL_MS = 4000


def advanced_config(settings: dict) -> str | None:
    """advanced.config of a profile's settings: ``key`` is a rabbit application setting,
    ``app.key`` one of another application (``ra.wal_max_size_bytes``)."""
    if not settings:
        return None
    apps: dict[str, list[str]] = {}
    for k, v in settings.items():
        app, _, key = k.rpartition(".")
        apps.setdefault(app or "rabbit", []).append(f"{{{key}, {v}}}")
    return "[" + ", ".join(f"{{{app}, [{', '.join(items)}]}}" for app, items in apps.items()) + "].\n"


def body(tag: str, n: int) -> bytes:
    """A deterministic, compressible body of exactly n bytes that names its message."""
    head = f"[{tag}] ".encode()
    return (head + LOREM * (n // len(LOREM) + 1))[:n]


def full_props(i: int, **over) -> pika.BasicProperties:
    """All 14 basic properties set (user_id must be the connection's user)."""
    kw = dict(
        content_type="application/json",
        content_encoding="identity",
        headers=dict(ALL_TYPES, seq=i),
        delivery_mode=2,
        priority=i % 10,
        correlation_id=f"corr-{i}",
        reply_to="replies",
        expiration=None,
        message_id=f"msg-{i}",
        timestamp=1_700_000_000 + i,
        type="order.created",
        user_id="guest",
        app_id="cqforensics-generator",
        cluster_id="cluster-a",
    )
    kw.update(over)
    return pika.BasicProperties(**kw)


PERSISTENT = dict(delivery_mode=2)
TRANSIENT = dict(delivery_mode=1)


class Scenario:
    """The workload every dataset gets; version-specific parts are switched on features."""

    def __init__(self, broker: Broker, profile: str):
        self.b = broker
        self.v = broker.version
        self.profile = profile
        self.v1 = self.v.startswith("3.")  # CQv1 queues exist only on 3.x
        self.amqp10 = not self.v.startswith("3.")
        self.queues: dict[tuple[str, str], dict] = {}  # (vhost, name) -> declared info
        self.held = []  # connections holding delivered-but-unacked messages at shutdown
        self.ttl_published_at = 0.0
        self.published: list[dict] = []  # what the MQTT and STOMP publishers sent (profile protocols)

    # -- helpers -------------------------------------------------------------------------

    def channel(self, vhost: str = "/"):
        params = pika.URLParameters(self.b.url)
        params.virtual_host = vhost
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.confirm_delivery()  # publishes return once the broker has persisted them
        return conn, ch

    def declare(self, ch, vhost, name, version=2, drain="amqp091", **args):
        arguments = dict(args)
        if self.v.startswith("3."):  # 4.x has CQv2 only
            arguments["x-queue-version"] = version
        ch.queue_declare(name, durable=True, arguments=arguments)
        self.queues[(vhost, name)] = {
            "vhost": vhost,
            "name": name,
            "index_version": version,
            "arguments": {k: v for k, v in arguments.items()},
            "drain": drain,
        }

    def publish(self, ch, exchange, rk, data, props=None):
        ch.basic_publish(exchange, rk, data, props or pika.BasicProperties(**PERSISTENT), mandatory=False)

    # -- the workload ----------------------------------------------------------------------

    def run(self) -> None:
        self.b.ctl("add_vhost", VHOST2)
        self.b.ctl("set_permissions", "-p", VHOST2, "guest", ".*", ".*", ".*")
        if self.profile == "rolled":
            self.rolled_store()
            return
        if self.profile == "segments":
            self.segments()
            return
        if self.profile == "protocols":
            self.protocols()
            return
        if self.profile == "quorum":
            self.quorum()
            return
        conn, ch = self.channel("/")
        self.orders(ch, "orders.v2", 2)
        if self.v1:
            self.orders(ch, "orders.v1", 1)
        self.fanout(ch)
        self.priority(ch)
        self.ttl(ch)
        self.dead_letters(ch)
        self.transient(ch, "transient.mix", 2)
        if self.v1:
            self.transient(ch, "transient.mix.v1", 1)
        conn.close()
        if self.amqp10:
            self.amqp10_messages()
        conn, ch = self.channel(VHOST2)
        self.events(ch, "events", 2)
        if self.v1:
            self.events(ch, "events.v1", 1)
        conn.close()
        self.exclusive()
        self.hold_unacked("/", "orders.v2", 2)
        if self.v1:
            self.hold_unacked("/", "orders.v1", 2)
        conn, ch = self.channel("/")
        self.short_ttl(ch)  # last: these must still be on disk at the stop, expired at the restart
        conn.close()

    def orders(self, ch, q, version):
        """Mixed sizes around the 4096-byte embedding threshold, every property and header type;
        the first 3 acked, the next 2 delivered and left unacked at shutdown (hold_unacked)."""
        self.declare(ch, "/", q, version)
        sizes = [0, 16, 700, 3000, 4000, 4095, 4096, 4200, 9000, 10_000, 20_000, 50, 5000, 1]
        for i, n in enumerate(sizes):
            props = (
                full_props(i)
                if i % 3 == 0
                else pika.BasicProperties(
                    delivery_mode=2, message_id=f"{q}-{i}", headers={"i": i, "q": q} if i % 3 == 1 else None
                )
            )
            self.publish(ch, "", q, body(f"{q}#{i}", n), props)
        for _ in range(3):
            method, _, _ = ch.basic_get(q, auto_ack=False)
            ch.basic_ack(method.delivery_tag)

    def fanout(self, ch):
        """One fanout feeding three queues: shared-store bodies referenced 3 times."""
        ch.exchange_declare("fanout.audit", "fanout", durable=True)
        for name, version in (("audit.a", 2), ("audit.b", 2), ("audit.c", 1 if self.v1 else 2)):
            self.declare(ch, "/", name, version)
            ch.queue_bind(name, "fanout.audit")
        for i, n in enumerate([6000, 200, 12000, 4500, 100, 8000]):
            self.publish(
                ch,
                "fanout.audit",
                f"audit.{i}",
                body(f"audit#{i}", n),
                pika.BasicProperties(delivery_mode=2, message_id=f"audit-{i}", app_id="auditor"),
            )
        for _ in range(2):  # consumed from one queue only: references drop from 3 to 2
            method, _, _ = ch.basic_get("audit.a", auto_ack=False)
            ch.basic_ack(method.delivery_tag)

    def priority(self, ch):
        """x-max-priority 5: one queue dir per priority level (0..5)."""
        self.declare(ch, "/", "jobs.prio", 2, **{"x-max-priority": 5})
        for i, p in enumerate([None, 0, 1, 5, 3, 9, 2, 5, None, 4, 1, 3]):
            n = 5000 if i % 4 == 0 else 300
            self.publish(
                ch,
                "",
                "jobs.prio",
                body(f"prio#{i}", n),
                pika.BasicProperties(delivery_mode=2, priority=p, message_id=f"job-{i}"),
            )

    def ttl(self, ch):
        """Per-message TTL mixed with messages that never expire; TTLs are short enough that
        they have all expired when the broker restarts, so booting this data later is stable."""
        self.declare(ch, "/", "ttl.mixed", 2)
        for i in range(8):
            exp = "1500" if i % 2 else None
            self.publish(
                ch,
                "",
                "ttl.mixed",
                body(f"ttl#{i}", 5000 if i % 3 == 0 else 120),
                pika.BasicProperties(delivery_mode=2, expiration=exp, message_id=f"ttl-{i}"),
            )

    def short_ttl(self, ch):
        """Per-queue TTL (x-message-ttl): everything expires between the stop and the restart."""
        self.declare(ch, "/", "ttl.queue", 2, **{"x-message-ttl": QUEUE_TTL_MS})
        for i in range(4):
            self.publish(ch, "", "ttl.queue", body(f"qttl#{i}", 4500 if i % 2 else 64))
        self.ttl_published_at = time.monotonic()

    def dead_letters(self, ch):
        """Dead-lettering by reject (work -> dead) and by expiry (delay -> dead): x-death headers."""
        ch.exchange_declare("dlx", "direct", durable=True)
        self.declare(ch, "/", "dead", 2)
        ch.queue_bind("dead", "dlx", routing_key="dead")
        self.declare(ch, "/", "work", 2, **{"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dead"})
        self.declare(
            ch,
            "/",
            "delay",
            2,
            **{"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dead", "x-message-ttl": 200},
        )
        for i in range(6):
            props = (
                full_props(100 + i)
                if i == 0
                else pika.BasicProperties(delivery_mode=2, message_id=f"work-{i}", headers={"attempt": i})
            )
            self.publish(ch, "", "work", body(f"work#{i}", 7000 if i % 2 else 500), props)
        for i in range(4):  # reject 4 of 6: dead-lettered with reason 'rejected'
            method, _, _ = ch.basic_get("work", auto_ack=False)
            ch.basic_reject(method.delivery_tag, requeue=False)
        for i in range(3):
            self.publish(
                ch,
                "",
                "delay",
                body(f"delay#{i}", 6000 if i == 1 else 80),
                pika.BasicProperties(delivery_mode=2, message_id=f"delay-{i}", headers={"kind": "retry"}),
            )
        deadline = time.time() + 30
        while time.time() < deadline:  # the broker expires them into 'dead'
            if ch.queue_declare("delay", passive=True).method.message_count == 0:
                break
            time.sleep(0.2)

    def transient(self, ch, q, version):
        """Transient (delivery_mode 1) and persistent messages in one durable queue."""
        args = {"x-queue-mode": "lazy"} if self.v.startswith("3.") else {}  # lazy: 3.x pages them to disk
        self.declare(ch, "/", q, version, **args)
        for i in range(12):
            mode = TRANSIENT if i % 2 else PERSISTENT
            self.publish(
                ch,
                "",
                q,
                body(f"{q}#{i}", 6000 if i % 3 == 0 else 150),
                pika.BasicProperties(message_id=f"{q}-{i}", **mode),
            )

    def events(self, ch, q, version):
        """The second vhost: its own shared store."""
        self.declare(ch, VHOST2, q, version)
        for i, n in enumerate([100, 5000, 20, 4096, 7000, 300, 10]):
            self.publish(
                ch,
                "",
                q,
                body(f"{q}#{i}", n),
                pika.BasicProperties(
                    delivery_mode=2, type="event", message_id=f"{q}-{i}", headers={"region": "eu-ü", "n": i}
                ),
            )
        # CC: the stored routing keys are [publish key | CC keys] (the CC target need not exist)
        self.publish(
            ch,
            "",
            q,
            body(f"{q}#cc", 64),
            pika.BasicProperties(delivery_mode=2, message_id=f"{q}-cc", headers={"CC": [f"{q}.cc-copy"]}),
        )
        method, _, _ = ch.basic_get(q, auto_ack=False)
        ch.basic_ack(method.delivery_tag)

    def hold_unacked(self, vhost, q, n):
        conn, ch = self.channel(vhost)
        ch.basic_qos(prefetch_count=n)
        for _ in range(n):
            method, _, _ = ch.basic_get(q, auto_ack=False)
            assert method is not None
        self.held.append(conn)  # never acked: delivered-but-unacked when the broker stops

    def exclusive(self):
        """An exclusive (non-durable) queue holding messages at the stop: its dir is not in the
        durable-queue metadata, so the broker deletes it at the next boot."""
        conn, ch = self.channel("/")
        ch.queue_declare("session.exclusive", exclusive=True)
        self.queues[("/", "session.exclusive")] = {
            "vhost": "/",
            "name": "session.exclusive",
            "index_version": 2,
            "arguments": {},
            "drain": "amqp091",
            "exclusive": True,
        }
        for i in range(6):
            self.publish(ch, "", "session.exclusive", body(f"excl#{i}", 6000 if i % 2 else 90))
        self.held.append(conn)

    def segments(self):
        """Queues spanning many 32-entry index segments, the first ones fully acked (deleted)."""
        conn, ch = self.channel("/")
        for name, version in (("seg.v1", 1), ("seg.v2", 2)):
            self.declare(ch, "/", name, version)
            for i in range(150):
                props = pika.BasicProperties(delivery_mode=1 if i % 10 == 7 else 2, message_id=f"{name}-{i}")
                self.publish(ch, "", name, body(f"{name}#{i}", 4500 if i % 25 == 0 else 24), props)
            for _ in range(40):  # segment 0 entirely, segment 1 partly
                method, _, _ = ch.basic_get(name, auto_ack=False)
                ch.basic_ack(method.delivery_tag)
        conn.close()
        self.hold_unacked("/", "seg.v1", 3)
        self.hold_unacked("/", "seg.v2", 3)

    def amqp10_messages(self):
        """AMQP 1.0 publishes (stored as #mc{mc_amqp}): data and amqp-value bodies, application
        properties, message annotations, a transient one, one fanned out to two queues."""
        p = proton()
        conn, ch = self.channel("/")
        self.declare(ch, "/", "amqp10.q", 2, drain="amqp10")
        ch.exchange_declare("fanout.amqp10", "fanout", durable=True)
        for name in ("amqp10.a", "amqp10.b"):
            self.declare(ch, "/", name, 2, drain="amqp10")
            ch.queue_bind(name, "fanout.amqp10")
        conn.close()
        c = amqp10_connection(self.b.port, "/")
        snd = c.create_sender("/queues/amqp10.q")
        msgs = [
            p.Message(
                body=body("amqp10#0", 100),
                inferred=True,
                durable=True,
                id="a10-0",
                subject="small",
                content_type=p.symbol("text/plain"),
                application_properties={
                    "str": "v",
                    "int": 7,
                    "bool": True,
                    "double": 2.5,
                    "sym": p.symbol("s"),
                    "ulong": p.ulong(2**40),
                    "bin": b"\x00\xff",
                    "ts": p.timestamp(1_700_000_000_000),
                },
            ),
            p.Message(
                body=body("amqp10#1", 9000),
                inferred=True,
                durable=True,
                id=p.ulong(42),
                correlation_id="corr-a10",
                reply_to="/queues/replies",
                group_id="g1",
                group_sequence=3,
                creation_time=1_700_000_000.5,
                annotations={"x-opt-tenant": "acme", "x-opt-n": 5},
            ),
            p.Message(
                body="an amqp-value string body",
                durable=True,
                id="a10-2",
                user_id=b"guest",
                content_encoding=p.symbol("utf-8"),
            ),
            p.Message(body=body("amqp10#3", 200), inferred=True, durable=False, id="a10-3"),  # transient
            p.Message(
                body=body("amqp10#4", 4200),
                inferred=True,
                durable=True,
                id="a10-4",
                priority=7,
                application_properties={"k": None},
            ),
        ]
        for m in msgs:
            snd.send(m)
        snd.close()
        snd = c.create_sender("/exchanges/fanout.amqp10")
        for i, n in enumerate([5500, 50]):
            snd.send(
                p.Message(
                    body=body(f"amqp10-fan#{i}", n), inferred=True, durable=True, id=f"a10-fan-{i}", subject=f"fan-{i}"
                )
            )
        snd.close()
        c.close()

    # -- MQTT and STOMP (profile protocols) --------------------------------------------------

    def protocols(self):
        """MQTT 3.1.1 and 5.0 (5.0 from 3.13 on) and STOMP 1.2 publishers; AMQP 0-9-1 queues
        bound to amq.topic (the MQTT exchange) and to amq.direct, persistent MQTT sessions that
        went offline with messages queued, STOMP's own durable queues."""
        v5 = not self.v.startswith("3.")
        conn, ch = self.channel("/")
        self.declare(ch, "/", "mqtt.v311", 2)
        ch.queue_bind("mqtt.v311", "amq.topic", routing_key="v311.#")
        self.declare(ch, "/", "mqtt.copy", 2)  # a second copy of the fanned-out topics
        ch.queue_bind("mqtt.copy", "amq.topic", routing_key="*.fan.#")
        if v5:
            self.declare(ch, "/", "mqtt.v5", 2)
            ch.queue_bind("mqtt.v5", "amq.topic", routing_key="v5.#")
        self.declare(ch, "/", "stomp.pre", 1)  # CQv1 on 3.10
        self.declare(ch, "/", "stomp.topic", 2)
        ch.queue_bind("stomp.topic", "amq.topic", routing_key="stomp.#")
        self.declare(ch, "/", "stomp.direct", 2)
        ch.queue_bind("stomp.direct", "amq.direct", routing_key="stomp-direct")
        conn.close()
        port = self.b.mqtt_port

        # persistent sessions: subscribe at QoS 1, go offline; messages queue up while they are away
        sub = mqtt_client(port, "sub311", "3.1.1", clean=False)
        mqtt_subscribe(sub, "offline/v311/#", 1)
        mqtt_close(sub)
        self.session_queue("mqtt-subscription-sub311qos1")
        if v5:
            sub = mqtt_client(port, "sub5", "5.0", clean=False, session_expiry=86400)
            mqtt_subscribe(sub, "offline/v5/#", 1)
            mqtt_close(sub)
            self.session_queue("mqtt-subscription-sub5qos1")

        pub = mqtt_client(port, "pub311", "3.1.1")
        sends = [
            ("v311/sensors/room-1/temp", body("mqtt311#0", 40), 1, False),
            ("v311/sensors/room-1/temp", body("mqtt311#1", 60), 0, False),  # QoS 0: transient
            ("v311/sensors/big", body("mqtt311#2", 6000), 1, False),  # shared store
            ("v311/status", body("mqtt311#3", 30), 1, True),  # retained
            ("v311/dotted.name/x", body("mqtt311#4", 50), 1, False),  # a '.' inside a level
            ("v311/zone/ü", body("mqtt311#5", 4200), 1, False),
            ("v311/fan/one", body("mqtt311#6", 5000), 1, False),  # also in mqtt.copy
            ("v311/empty", b"", 1, False),
            ("offline/v311/a", body("mqtt311-off#0", 100), 1, False),
            ("offline/v311/a", body("mqtt311-off#1", 7000), 1, False),
            ("offline/v311/b", body("mqtt311-off#2", 20), 0, False),  # QoS 0 into a QoS 1 session
            ("offline/v5/c", body("mqtt311-off#3", 90), 1, False),  # 3.1.1 publisher, 5.0 session
        ]
        for topic, data, qos, retain in sends:
            if topic.startswith("offline/v5/") and not v5:
                continue
            self.published.append(mqtt_publish(pub, "3.1.1", topic, data, qos, retain))
        mqtt_close(pub)

        if v5:
            self.mqtt5()
        self.stomp()

    def mqtt5(self):
        """MQTT 5.0 PUBLISH properties: what an AMQP 0-9-1 consumer gets of each."""
        pub = mqtt_client(self.b.mqtt_port, "pub5", "5.0")
        ten_years = 10 * 365 * 86400  # an expiry no later boot of the sample reaches
        users = [
            ("region", "eu-west"),
            ("x-tenant", "acme"),
            ("dup", "first"),
            ("dup", "second"),
            ("ключ", "значение"),
            ("empty", ""),
        ]
        sends = [
            (
                "v5/orders/created",
                body("mqtt5#0", 80),
                1,
                False,
                {"ContentType": "application/json", "UserProperty": users},
            ),
            (
                "v5/orders/reply",
                body("mqtt5#1", 120),
                1,
                False,
                {"ResponseTopic": "replies/v5/client-1", "CorrelationData": b"corr-5-1"},
            ),
            (
                "v5/orders/binary-corr",
                body("mqtt5#2", 64),
                1,
                False,  # not a valid shortstr: x-correlation-id
                {"CorrelationData": b"\x00\x01\xfe\xff", "ResponseTopic": "replies/a.b"},
            ),
            ("v5/orders/long-corr", body("mqtt5#3", 64), 1, False, {"CorrelationData": ("c" * 300).encode()}),
            (
                "v5/orders/expiring",
                body("mqtt5#4", 5000),
                1,
                False,  # expiration + timestamp
                {"MessageExpiryInterval": ten_years, "ContentType": "text/plain", "PayloadFormatIndicator": 1},
            ),
            (
                "v5/orders/short-ttl",
                body("mqtt5#5", 70),
                1,
                False,  # expired by the restart
                {"MessageExpiryInterval": 1},
            ),
            (
                "v5/orders/non-ascii-ct",
                body("mqtt5#6", 70),
                1,
                False,
                {"ContentType": "text/plain; charset=ü", "UserProperty": [("n", "1")]},
            ),
            ("v5/orders/long-ct", body("mqtt5#7", 70), 1, False, {"ContentType": "application/" + "x" * 300}),
            (
                "v5/orders/qos0",
                body("mqtt5#8", 90),
                0,
                False,  # transient
                {"UserProperty": [("k", "v")]},
            ),
            (
                "v5/fan/two",
                body("mqtt5#9", 9000),
                1,
                True,  # retained; also in mqtt.copy
                {"UserProperty": [("fan", "yes")], "ContentType": "application/octet-stream"},
            ),
            ("v5/plain", body("mqtt5#10", 10), 1, False, None),
            (
                "offline/v5/d",
                body("mqtt5-off#0", 300),
                1,
                False,
                {"UserProperty": [("session", "offline")], "ResponseTopic": "back/to/me", "CorrelationData": b"off-1"},
            ),
            ("offline/v5/d", body("mqtt5-off#1", 4500), 1, False, {"MessageExpiryInterval": ten_years}),
            ("offline/v5/d", body("mqtt5-off#2", 50), 0, False, None),
            (
                "offline/v311/from-v5",
                body("mqtt5-off#3", 55),
                1,
                False,  # 5.0 publisher, 3.1.1 session
                {"UserProperty": [("to", "v311")]},
            ),
        ]
        for topic, data, qos, retain, props in sends:
            self.published.append(mqtt_publish(pub, "5.0", topic, data, qos, retain, props))
        mqtt_close(pub)

    def stomp(self):
        """STOMP 1.2 SENDs: persistent and transient, every header that maps onto a basic
        property, custom headers (escaped characters, non-ASCII); to a queue STOMP declares
        (/queue/), an existing queue (/amq/queue/), the topic exchange (/topic/) and an exchange."""
        conn = stomp_connection(self.b.stomp_port, "/")
        mapped = {
            "content-type": "application/xml",
            "content-encoding": "gzip",
            "correlation-id": "corr-stomp",
            "reply-to": "/queue/replies",
            "amqp-message-id": "stomp-msg-1",
            "priority": "3",
            "type": "invoice",
            "app-id": "stomp-app",
            "timestamp": "1700000123",
            "user-id": "guest",
            "expiration": str(10 * 365 * 86400 * 1000),
        }
        custom = {
            "x-custom": "custom value",
            "colon": "a:b",
            "newline": "line1\nline2",
            "backslash": "c\\d",
            "unicode": "grüße ✓",
            "number": "42",
        }
        sends = [
            ("/queue/stomp.q", body("stomp#0", 100), {"persistent": "true"}),
            ("/queue/stomp.q", body("stomp#1", 120), {}),  # transient
            ("/queue/stomp.q", body("stomp#2", 5000), {"persistent": "true", **mapped, **custom}),
            ("/queue/stomp.q", body("stomp#3", 80), {"persistent": "true", **custom}),
            ("/queue/stomp.q", body("stomp#4", 6000), {**custom}),  # transient, big
            ("/amq/queue/stomp.pre", body("stomp#5", 200), {"persistent": "true", "content-type": "text/plain"}),
            ("/amq/queue/stomp.pre", body("stomp#6", 4100), {"persistent": "true", "priority": "9"}),
            ("/amq/queue/stomp.pre", body("stomp#7", 10), {"persistent": "false"}),
            ("/topic/stomp.events.created", body("stomp#8", 150), {"persistent": "true", "x-event": "created"}),
            ("/topic/stomp.events.deleted", body("stomp#9", 90), {}),
            ("/exchange/amq.direct/stomp-direct", body("stomp#10", 4500), {"persistent": "true", "kind": "direct"}),
        ]
        for dest, data, headers in sends:
            self.published.append(stomp_send(conn, dest, data, headers))
        conn.disconnect()
        self.queues.setdefault(
            ("/", "stomp.q"), {"vhost": "/", "name": "stomp.q", "drain": "amqp091", "created_by": "stomp"}
        )

    def session_queue(self, name):
        self.queues[("/", name)] = {"vhost": "/", "name": name, "drain": "amqp091", "created_by": "mqtt"}

    # -- quorum queues (profile quorum) ------------------------------------------------------

    def declare_quorum(self, ch, name, **args):
        arguments = {"x-queue-type": "quorum", **args}
        ch.queue_declare(name, durable=True, arguments=arguments)
        self.queues[("/", name)] = {
            "vhost": "/",
            "name": name,
            "queue_type": "quorum",
            "arguments": arguments,
            "drain": "amqp091",
        }

    def quorum(self):
        """Quorum queues beside classic ones. ``qq.orders``: a churn of 2,500 messages published,
        2,000 consumed and 500 purged (the log passes Ra's snapshot interval of 4,096 entries and
        rolls the small WAL over, and 4.x snapshots at a purge, so snapshots and segments exist),
        then bodies of 0 B to 150 kB with every
        property and header type (priorities 0-9: 4.x quorum queues deliver priorities above 4
        first), one transient; 2 acked, 2 returned (nack, requeue), 3 checked out (basic.get, no
        ack) at the stop. ``qq.work``: delivery limit 2, dead-lettered at least once
        (``x-dead-letter-strategy``, which needs ``x-overflow`` reject-publish) to the quorum queue
        ``qq.dead``: 2 rejected, one returned until it passes the limit, one returned once, 2
        held by a consumer (prefetch 2) at the stop. ``qq.amo``: dead-lettered at most once (the
        default) to the classic queue ``cq.dead``: 2 rejected. ``cq.side``: a classic queue."""
        conn, ch = self.channel("/")
        self.declare(ch, "/", "cq.side", 2)
        for i, n in enumerate([10, 5000, 300]):
            self.publish(
                ch, "", "cq.side", body(f"side#{i}", n), pika.BasicProperties(delivery_mode=2, message_id=f"side-{i}")
            )
        self.declare_quorum(ch, "qq.orders")
        for i in range(2500):
            self.publish(
                ch,
                "",
                "qq.orders",
                body(f"churn#{i}", 3000 if i % 50 == 0 else 40),
                pika.BasicProperties(delivery_mode=2),
            )
        for _ in range(2000):
            method, _, _ = ch.basic_get("qq.orders", auto_ack=True)
            assert method is not None
        ch.queue_purge("qq.orders")  # the other 500 (4.x: a purge forces a snapshot)
        sizes = [0, 1, 16, 700, 4096, 20_000, 70_000, 150_000, 50, 5000, 300, 12, 9000, 100, 64, 2000]
        for i, n in enumerate(sizes):
            if i % 3 == 0:
                props = full_props(i)
            elif i == 4:
                props = pika.BasicProperties(delivery_mode=1, message_id=f"qq.orders-{i}")  # transient
            else:
                props = pika.BasicProperties(
                    delivery_mode=2,
                    message_id=f"qq.orders-{i}",
                    priority=i % 10,
                    headers={"i": i, "q": "qq.orders"} if i % 3 == 1 else None,
                )
            self.publish(ch, "", "qq.orders", body(f"qq.orders#{i}", n), props)
        for _ in range(2):
            method, _, _ = ch.basic_get("qq.orders", auto_ack=False)
            ch.basic_ack(method.delivery_tag)
        for _ in range(2):
            method, _, _ = ch.basic_get("qq.orders", auto_ack=False)
            ch.basic_nack(method.delivery_tag, requeue=True)

        ch.exchange_declare("qdlx", "direct", durable=True)
        self.declare_quorum(ch, "qq.dead")
        ch.queue_bind("qq.dead", "qdlx", routing_key="dead")
        self.declare(ch, "/", "cq.dead", 2)
        ch.queue_bind("cq.dead", "qdlx", routing_key="amo")
        self.declare_quorum(
            ch,
            "qq.work",
            **{
                "x-delivery-limit": 2,
                "x-dead-letter-exchange": "qdlx",
                "x-dead-letter-routing-key": "dead",
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            },
        )
        for i in range(10):
            props = (
                full_props(200 + i)
                if i == 0
                else pika.BasicProperties(delivery_mode=2, message_id=f"work-{i}", headers={"attempt": i})
            )
            self.publish(ch, "", "qq.work", body(f"work#{i}", 6000 if i % 3 == 0 else 120), props)
        for _ in range(2):  # rejected: dead-lettered (reason rejected) into qq.dead
            method, _, _ = ch.basic_get("qq.work", auto_ack=False)
            ch.basic_reject(method.delivery_tag, requeue=False)
        first = None
        for _ in range(8):  # returned until it passes the delivery limit: dead-lettered (delivery_limit)
            method, props, _ = ch.basic_get("qq.work", auto_ack=False)
            if first is None:
                first = props.message_id
            elif props.message_id != first:
                ch.basic_nack(method.delivery_tag, requeue=True)  # the next one, returned once
                break
            ch.basic_nack(method.delivery_tag, requeue=True)
        self.declare_quorum(ch, "qq.amo", **{"x-dead-letter-exchange": "qdlx", "x-dead-letter-routing-key": "amo"})
        for i in range(4):
            self.publish(
                ch,
                "",
                "qq.amo",
                body(f"amo#{i}", 80 if i % 2 else 4500),
                pika.BasicProperties(delivery_mode=2, message_id=f"amo-{i}"),
            )
        for _ in range(2):  # rejected: dead-lettered at most once into cq.dead
            method, _, _ = ch.basic_get("qq.amo", auto_ack=False)
            ch.basic_reject(method.delivery_tag, requeue=False)
        deadline = time.time() + 30
        while time.time() < deadline:  # the at-least-once dead-letter worker has moved them
            if ch.queue_declare("qq.dead", passive=True).method.message_count >= 3:
                break
            time.sleep(0.2)
        conn.close()
        self.hold_unacked("/", "qq.orders", 3)
        self.hold_consumed("/", "qq.work", 2)

    def hold_consumed(self, vhost, q, n):
        """A consumer (prefetch n, manual acks) that has received n messages and never acks."""
        conn, ch = self.channel(vhost)
        ch.basic_qos(prefetch_count=n)
        got = []
        ch.basic_consume(q, lambda c, m, p, b: got.append(m.delivery_tag), auto_ack=False)
        deadline = time.time() + 30
        while len(got) < n and time.time() < deadline:
            conn.process_data_events(time_limit=0.2)
        assert len(got) == n, got
        self.held.append(conn)

    def rolled_store(self):
        """Many 64 KiB .rdq files; one queue's messages are all consumed so the broker compacts
        the files (zero-filling the holes it cannot fill with moved messages).

        The store's GC timer (15 s) skips files that saw removes after it was armed, so a burst
        of acks alone leaves them pending; one more ack later (as any steady workload makes)
        arms a timer that compacts them all."""
        conn, ch = self.channel("/")
        for q in ("bulk.trigger", "bulk.keep", "bulk.drop"):
            self.declare(ch, "/", q, 2)
        self.publish(ch, "", "bulk.trigger", body("trigger", 5000))  # lands in 0.rdq
        for i in range(60):
            self.publish(ch, "", "bulk.keep", body(f"keep#{i}", 5000))
            self.publish(ch, "", "bulk.drop", body(f"drop#{i}", 12000))
        while True:
            method, _, _ = ch.basic_get("bulk.drop", auto_ack=False)
            if method is None:
                break
            ch.basic_ack(method.delivery_tag)
        time.sleep(16)
        method, _, _ = ch.basic_get("bulk.trigger", auto_ack=False)
        ch.basic_ack(method.delivery_tag)
        conn.close()
        time.sleep(22)  # timer (15 s) + compaction


# -- running a dataset ---------------------------------------------------------------------


def wait_ra_registered(broker: Broker, timeout: float = 30.0) -> None:
    """Wait until Ra's directory (``quorum/<node>/names.dets``) registers every quorum queue's
    server (a data dir with a ``config``): the table is written by DETS's auto-save, and a node
    killed before it holds a server's name cannot restart that server (its queue then answers
    no leader, for ever). A kill -9 should hit messages, not this."""
    from cqforensics.readers.terms import read_dets_objects

    system = broker.node_dir / "quorum" / broker.nodename
    deadline = time.monotonic() + timeout
    while True:
        uids = {p.parent.name.encode() for p in system.glob("*/config")}
        try:
            known = {o[1] for o in read_dets_objects(system / "names.dets") if isinstance(o, tuple) and len(o) == 2}
        except Exception:  # written while we read: look again
            known = set()
        if uids <= known:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"names.dets still lacks {sorted(uids - known)} after {timeout:.0f}s")
        time.sleep(0.2)


def settle_quorum(broker: Broker, queues: dict, timeout: float = 60.0) -> None:
    """Wait until the quorum queues hold no message checked out by a consumer of before the
    stop: after the boot each queue's leader sees those consumers gone and returns their
    messages, a moment after the node accepts connections; draining before that would see
    them come back in the middle."""
    names = {name for (vhost, name), q in queues.items() if q.get("queue_type") == "quorum"}
    deadline = time.monotonic() + timeout
    while True:
        out = broker.ctl("list_queues", "-p", "/", "name", "messages_unacknowledged", "--formatter", "json", "-q")
        rows = {r["name"]: r for r in json.loads(out or "[]")}
        if all(rows.get(n, {}).get("messages_unacknowledged") == 0 for n in names):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"quorum queues still hold checked-out messages after {timeout:.0f}s: {rows}")
        time.sleep(0.5)


def package_versions(broker: Broker) -> dict:
    root = broker.runtime.root
    out = subprocess.run(
        [
            "dpkg-query",
            f"--admindir={root}/var/lib/dpkg",
            "-W",
            "-f",
            "${Package} ${Version}\n",
            "rabbitmq-server",
            "erlang-base",
        ],
        capture_output=True,
        text=True,
    ).stdout
    pk = dict(line.split(" ", 1) for line in out.splitlines() if line)
    otp = (root / "usr/lib/erlang/releases").glob("*/OTP_VERSION")
    return {
        "rabbitmq": broker.version,
        "suite": broker.runtime.suite,
        "package": pk.get("rabbitmq-server"),
        "erlang_package": pk.get("erlang-base"),
        "otp": next((f.read_text().strip() for f in otp), None),
    }


def now_ms() -> int:
    return int(time.time() * 1000)


def generate(name: str, out: Path, work: Path) -> dict:
    version, stop, profile = DATASETS[name]
    if profile == "streams":
        return generate_streams(name, out, work)
    adv = advanced_config(SETTINGS[profile])
    run = work / name
    shutil.rmtree(run, ignore_errors=True)
    dest = out / name
    plugins = PLUGINS.get(profile, [])
    with Broker(version, run, advanced_config=adv, plugins=plugins) as b:
        t0 = time.monotonic()
        b.start()
        sc = Scenario(b, profile)
        sc.run()
        # a kill -9 should hit messages, not declarations: wait until the metadata files hold every
        # durable declaration the way the next boot recovers it (Broker.wait_durable)
        durable: dict[str, list[str]] = {}
        for (vhost, qname), q in sc.queues.items():
            if not q.get("exclusive"):
                durable.setdefault(vhost, []).append(qname)
        for vhost, names in durable.items():
            b.wait_durable(*names, vhost=vhost)
        if profile == "quorum":
            wait_ra_registered(b)
        stopped_at = now_ms()
        if stop == "clean":
            b.stop()
        else:
            b.kill()
        for conn in sc.held:
            try:
                conn.close()
            except Exception:  # the broker is gone; the connection is already dead
                pass
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        shutil.copytree(b.mnesia_base, dest / "mnesia", symlinks=True)  # the sample: before any restart
        # the per-queue TTL messages must have expired by the restart (they were on disk at the stop)
        time.sleep(max(0.0, sc.ttl_published_at + QUEUE_TTL_MS / 1000 + 1 - time.monotonic()))
        b.start()
        restarted_at = now_ms()
        if profile == "quorum":
            settle_quorum(b, sc.queues)
        queues = drain_all(b, ["/", VHOST2], sc.queues)
        drained_at = now_ms()
        b.stop()
        manifest = {
            "dataset": name,
            "broker": package_versions(b),
            "stop": stop,
            "node": b.nodename,
            "node_dir": f"mnesia/{b.nodename}",
            "profile": profile,
            "settings": SETTINGS[profile],
            "stopped_at_ms": stopped_at,
            "restarted_at_ms": restarted_at,
            "drained_at_ms": drained_at,
            "vhosts": ["/", VHOST2],
            "queues": queues,
        }
        if plugins:
            manifest["plugins"] = plugins
            manifest["published"] = sc.published
    _clean_snapshot(dest / "mnesia")
    if profile in ARCHIVED:
        _archive(dest, manifest)
    else:
        (dest / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    total = sum(len(q["messages"]) for q in queues)
    print(
        f"{name}: {len(queues)} queues, {total} messages delivered after restart ({time.monotonic() - t0:.0f}s)",
        file=sys.stderr,
    )
    return manifest


def generate_streams(name: str, out: Path, work: Path) -> dict:
    """A ``streams`` dataset: the workload of ``brokers.streams`` (streams and a
    classic queue fed by one topic exchange over AMQP 0-9-1, the stream protocol with
    sub-batches of every compression, named consumers' stored offsets, a publisher's sequence,
    AMQP 1.0 on 4.x; one stream rolls segments, one loses its first segments to retention),
    stopped cleanly or killed; the ground truth is read from the broker restarted on the
    original dir: per stream, every chunk and record served from ``first`` over the stream
    protocol, every message over AMQP 0-9-1, the tracking it reports for every reference on
    disk; and the classic queue drained."""
    from brokers import streams
    from brokers.clients import drain_091

    version, stop, profile = DATASETS[name]
    run = work / name
    shutil.rmtree(run, ignore_errors=True)
    dest = out / name
    with Broker(version, run, plugins=PLUGINS[profile]) as b:
        t0 = time.monotonic()
        b.start()
        sent = streams.write(b, amqp10=not version.startswith("3."))
        b.wait_durable(*streams.STREAMS, streams.CLASSIC)
        stopped_at = now_ms()
        b.stop() if stop == "clean" else b.kill()
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        shutil.copytree(b.mnesia_base, dest / "mnesia", symlinks=True)
        b.start()
        restarted_at = now_ms()
        truth = streams.ground_truth(b, dest / "mnesia" / b.nodename)
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        classic = drain_091(conn.channel(), streams.CLASSIC)
        conn.close()
        b.stop()
        manifest = {
            "dataset": name,
            "broker": package_versions(b),
            "stop": stop,
            "node": b.nodename,
            "node_dir": f"mnesia/{b.nodename}",
            "profile": profile,
            "settings": SETTINGS[profile],
            "plugins": PLUGINS[profile],
            "stopped_at_ms": stopped_at,
            "restarted_at_ms": restarted_at,
            "vhosts": ["/"],
            "sent": sent,
            "streams": truth,
            "queues": [{"vhost": "/", "name": streams.CLASSIC, "messages": classic}],
        }
    _clean_snapshot(dest / "mnesia")
    _archive(dest, manifest)
    for t in truth:
        print(
            f"{name} {t['stream']}: {len(t['served_amqp091']['messages'])} served over AMQP 0-9-1"
            f"{' (' + t['served_amqp091']['error'] + ')' if 'error' in t['served_amqp091'] else ''}, "
            f"{len(t['served_stream_protocol']['records'])} over the stream protocol, tracking "
            f"{t['tracking']}",
            file=sys.stderr,
        )
    print(f"{name}: {time.monotonic() - t0:.0f}s", file=sys.stderr)
    return manifest


def _archive(dest: Path, manifest: dict) -> None:
    """Commit form of an ARCHIVED profile: the node dir as ``rabbit.tar.gz`` (the files as the
    broker left them, owner and times reset) and the manifest as ``manifest.json.gz``; the
    unpacked copy stays in ``mnesia/`` (gitignored; tests/support/oracle.py extract_archives() makes it
    from the archive when missing)."""
    import tarfile

    def reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = manifest["stopped_at_ms"] // 1000
        return info

    tarball = dest / ARCHIVE
    with gzip.GzipFile(tarball, "wb", compresslevel=9, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for path in sorted((dest / "mnesia").rglob("*")):
                tf.add(path, arcname=path.relative_to(dest / "mnesia").as_posix(), recursive=False, filter=reset)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    manifest.update(archive=ARCHIVE, archive_sha256=digest)
    text = json.dumps(manifest, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
    (dest / "manifest.json.gz").write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    (dest / ".mnesia.extracted").write_text(digest + "\n")
    (dest / "manifest.json").unlink(missing_ok=True)


def _clean_snapshot(base: Path) -> None:
    """Drop what is not the broker's data (plugin expansion dirs) and make files world-readable."""
    for p in base.glob("*-plugins-expand"):
        shutil.rmtree(p)
    for dirpath, dirnames, filenames in os.walk(base):
        for n in dirnames:
            os.chmod(os.path.join(dirpath, n), 0o755)
        for n in filenames:
            os.chmod(os.path.join(dirpath, n), 0o644)
    if os.geteuid() == 0:
        uid, gid = os.stat(base.parent).st_uid, os.stat(base.parent).st_gid
        for dirpath, dirnames, filenames in os.walk(base):
            for n in dirnames + filenames:
                os.lchown(os.path.join(dirpath, n), uid, gid)


README_HEAD = """# Sample data: real RabbitMQ node dirs with their ground truth

Every byte under `<dataset>/mnesia/` was written by a real RabbitMQ broker; nothing here is
hand-made. Each dataset is the mnesia base of one node (`mnesia/rabbit@localhost/...`, plus the
feature-flag file the broker keeps beside it), copied right after the broker stopped, before any
restart. `<dataset>/manifest.json` is the ground truth recorded from the broker itself: the broker
was restarted on the original dir and every queue was drained; per queue, in delivery order, it
holds each message's body sha256 and length, exchange, routing key, redelivered flag, all basic
properties and the typed headers (AMQP 1.0 queues were drained over AMQP 1.0 and record their
sections instead). `restarted_at_ms` is the reference time for TTL expiry.

## How it was made

    python sample_data/generate.py            # as root; regenerates every dataset and this file

`generate.py` (in this folder) drives the brokers through `brokers` (RabbitMQ 3.10.8
from Debian bookworm on the host; 4.0.5 from trixie and 4.3.6 from sid in debootstrap chroots,
see `python -m brokers.runtimes install`). Clients: pika (AMQP 0-9-1) and the proton
bundled with rabbitmq-amqp-python-client (AMQP 1.0). Message ids are random, so a regeneration
gives different bytes with the same structure.

## The scenario (datasets with profile `full`)

| queue (vhost `/` unless noted) | settings | what it exercises |
|---|---|---|
| `orders.v2`, `orders.v1` (3.10 only) | x-queue-version 2 / 1 | bodies 0 B..20 kB around the 4096-byte embedding threshold; all 14 basic properties and a header of every AMQP 0-9-1 field type on every third message; first 3 acked, next 2 delivered and left unacked at the stop |
| `audit.a`, `audit.b`, `audit.c` | fanout `fanout.audit`; `audit.c` is v1 on 3.10 | shared-store bodies referenced 3 times; 2 consumed from `audit.a` only |
| `jobs.prio` | x-max-priority 5 | one queue dir per priority level (`.queue_name` = name, NUL, level) |
| `ttl.mixed` | per-message TTL 1.5 s on every other message | expired entries still on disk at the stop |
| `ttl.queue` | x-message-ttl 4 s, published just before the stop | everything expires before the restart |
| `work` -> `dead`, `delay` -> `dead` | x-dead-letter-exchange `dlx`; `delay` has x-message-ttl 200 ms | x-death by reject and by expiry (3.10 stores decoded properties) |
| `transient.mix`, `transient.mix.v1` (3.10) | lazy on 3.10 | transient and persistent messages in one durable queue |
| `session.exclusive` | exclusive | a queue dir the durable metadata does not know |
| `amqp10.q`, `amqp10.a`, `amqp10.b` (4.x) | AMQP 1.0 publishes; fanout `fanout.amqp10` | `#mc{mc_amqp}`: data and amqp-value bodies, application properties, annotations, a non-durable message |
| `events`, `events.v1` (3.10) in vhost `staging/ü` | | a second vhost (non-ASCII name) with its own shared store |

Profile `segments` (3.10.8): queues `seg.v1` and `seg.v2` of 150 messages over 32-entry index
segments, the first 40 acked. Profile `rolled` (4.3.6): 64 KiB shared-store files; `bulk.drop`
is consumed entirely so the broker compacts the files and zero-fills the holes it cannot fill.
Profiles other than `full` change broker settings (below): a broker booting such a sample must
be given the same settings (`manifest.json` `settings`).

Profile `protocols` (3.10.8, 4.0.5, 4.3.6; plugins `rabbitmq_mqtt` and `rabbitmq_stomp`, listed in
the manifest's `plugins`): MQTT 3.1.1 and 5.0 (5.0 on 4.x only: 3.10 has no MQTT 5) and STOMP 1.2
publishers. Queues `mqtt.v311`, `mqtt.v5` and `mqtt.copy` (bound to `amq.topic`, the MQTT
exchange: QoS 0 and 1, retained, topics with a `.` inside a level and a non-ASCII level, an empty
payload, a fan-out to two queues, MQTT 5.0 content type, correlation data (text, binary, > 255 bytes),
response topic, user properties (duplicate keys, `x-` keys, non-ASCII), message expiry (10 years,
and 1 s: expired by the restart), non-ASCII and over-long content types); persistent sessions
`sub311` (3.1.1, clean_session false) and `sub5` (5.0, clean_start false, session expiry 1 day)
that subscribed at QoS 1 and went offline before QoS 0 and QoS 1 messages were queued for them
(`mqtt-subscription-sub311qos1`, `mqtt-subscription-sub5qos1`); STOMP SENDs to `/queue/stomp.q`
(declared by STOMP), `/amq/queue/stomp.pre` (CQv1 on 3.10), `/topic/...` (`stomp.topic`) and
`/exchange/amq.direct/...` (`stomp.direct`), persistent and transient, with every header that maps
onto a basic property and custom headers (escaped `:`, `\\`, newline; non-ASCII). 4.x stores MQTT
messages as `#mc{mc_mqtt}`, 3.10 as `#basic_message` (the plugin publishes over AMQP 0-9-1 with
`x-mqtt-publish-qos`/`x-mqtt-dup` headers); STOMP messages are AMQP 0-9-1 messages on every
version. The manifest's `published` lists what each MQTT/STOMP publisher sent (topic or
destination, QoS, retain, MQTT 5.0 properties, STOMP headers, body sha256). These datasets are
committed as `rabbit.tar.gz` (the node dir, node `rabbit@localhost`) and `manifest.json.gz`,
unpacked by the tests like the imported ones below.

Profile `quorum` (3.10.8, 4.0.5, 4.3.6; committed as archives the same way): quorum queues beside
classic ones, with Ra settings that put every file kind on disk (a 1 MiB WAL and 1,024-entry
segments: `raft.wal_max_size_bytes`, `raft.segment_max_entries`, recorded as the manifest's
`settings`). `qq.orders`: a churn of 2,500 messages (2,000 consumed, 500 purged: the log passes
Ra's snapshot interval, the WAL rolls over into segments, 4.x snapshots at the purge), then 16
messages of 0 B to 150 kB with every property and header type and priorities 0-9 (one
transient), 2 acked, 2 returned (nack, requeue), 3 checked out by basic.get at the stop;
`qq.work`: `x-delivery-limit` 2, dead-lettered at least once (`x-dead-letter-strategy`
at-least-once, `x-overflow` reject-publish) to the quorum queue `qq.dead` through the direct
exchange `qdlx`: 2 rejected, one returned until it passed the limit, one returned once, 2 held
by a consumer with prefetch 2 at the stop; `qq.amo`: dead-lettered at most once (the default) to
the classic queue `cq.dead`; `cq.side`: a classic queue. 3.10 stores `#basic_message`, 4.x
`#mc`. Before a kill -9 the generator waits for `names.dets` to register every queue's Ra
server (DETS auto-save; a kill before it loses the registration and the queue answers "leader
not known" for ever, seen on 3.10.8); after the restart it waits until the leaders have
returned the messages of the consumers gone with the old node before draining.

## Datasets

| dataset | broker (Debian package) | Erlang/OTP | stop | profile | settings | queues | messages delivered after restart |
|---|---|---|---|---|---|---|---|
"""


README_IMPORTED = """
## Datasets written by brokers that cannot be installed here

RabbitMQ 3.12.14, 3.13.7, 4.1.8 and 4.2.2 have no package for this host, so no test boots them:
their node dirs were written elsewhere by the real brokers (core builds, no plugins) and are
proven by reading. Each `<dataset>/` holds the node dir exactly as copied after `rabbitmqctl stop`,
as `NAME.tar.gz` (node name `NAME@localhost`; a 16 MiB mostly empty `0.rdq` per store makes the
unpacked dir about 21 MB), and `manifest.json.gz`, converted from that broker's ground truth
(`truth.json`: the broker was restarted on the original dir and every queue drained) by
`python sample_data/import_extra.py FOLDER...` (in this folder; its docstring gives the rules).

* The archive is unpacked into `<dataset>/mnesia/` (gitignored) by the tests before anything reads
  it (`tests/support/oracle.py` `extract_archives()`, run when `tests/conftest.py` is imported; idempotent,
  it re-extracts only when the archive changed). By hand:
  `mkdir -p D/mnesia && tar xzf D/NAME.tar.gz -C D/mnesia`.
* The truth records 6 of the 13 basic properties (`content_type`, `delivery_mode`, `priority`,
  `message_id`, `timestamp`, `expiration`): the manifest lists them in `properties_recorded` and
  the oracle compares exactly those. Headers were recorded as the client decoded them and are
  typed by the publisher's and the broker's encoding rules (`import_extra.py`).
* `restarted_at_ms` is the truth's `snapshot_ms` (when the files were copied; TTLs are judged
  then). Queue arguments come from the node's own metadata store (not in the truth).
* 3.13.7 ran on OTP 27 (upstream supports 3.13 on OTP 26 only); its atoms are UTF-8 as OTP 26
  writes them. 4.2.2 ran with the `khepri_db` feature flag enabled from the first start (no
  Mnesia table files). 3.12.14 and 3.13.7 have CQv1 queues (`legacy`, `audit.b`).

Scenario (the same on every imported version): vhost `/` with `orders` (bodies of 0 B to 70 kB
around the 4096-byte embedding threshold, every AMQP 0-9-1 field type in headers, 39 transient
messages that the restart drops, 5 messages fetched and returned), `legacy`, fan-out
`audit.a`/`audit.b` (one stored copy referenced twice), `prio` (x-max-priority), `ttl`
(x-message-ttl 1 day and per-message expiration 1 h), `work` -> `dead` (dead-lettered by reject,
x-death), and vhost `prod` with `payments`.

| dataset | broker | Erlang/OTP | stop | archive | metadata store | queues | messages delivered after restart |
|---|---|---|---|---|---|---|---|
"""


def _unpacked(out: Path, rel: str) -> bool:
    """Files unpacked from a committed archive (gitignored): the archive is listed instead."""
    parts = rel.split("/")
    return len(parts) > 1 and any((out / parts[0]).glob("*.tar.gz")) and parts[1] in ("mnesia", ".mnesia.extracted")


def write_readme(out: Path) -> None:
    """sample_data/README.md: provenance and the sha256 of every committed file
    (tests/house/test_sample_data.py checks the list against the files)."""
    rows = []
    for name in DATASETS:
        mf = next((f for f in (out / name / "manifest.json", out / name / "manifest.json.gz") if f.exists()), None)
        if mf is None:
            continue
        m = json.loads(gzip.decompress(mf.read_bytes()) if mf.suffix == ".gz" else mf.read_bytes())
        b = m["broker"]
        settings = ", ".join(f"`{k}` = {v}" for k, v in m["settings"].items()) or "defaults"
        count = sum(len(q["messages"]) for q in m["queues"])
        rows.append(
            f"| `{name}` | RabbitMQ {b['rabbitmq']} ({b['package']}, {b['suite']}) | {b['otp']} | "
            f"{'rabbitmqctl shutdown' if m['stop'] == 'clean' else 'kill -9'} | {m['profile']} | {settings} | "
            f"{len(m['queues'])} | {count} |"
        )
    imported = []
    for mf in sorted(out.glob("*/manifest.json*")):
        m = json.loads(gzip.decompress(mf.read_bytes()) if mf.suffix == ".gz" else mf.read_bytes())
        if m["dataset"] in DATASETS or "archive" not in m:
            continue
        b = m["broker"]
        store = "Khepri" if not any((out / m["dataset"]).glob("mnesia/*/schema.DAT")) else "Mnesia"
        count = sum(len(q["messages"]) for q in m["queues"])
        imported.append(
            f"| `{m['dataset']}` | RabbitMQ {b['rabbitmq']} | {b['otp']} | "
            f"{'rabbitmqctl stop' if m['stop'] == 'clean' else 'kill -9'} | `{m['archive']}` | {store} | "
            f"{len(m['queues'])} | {count} |"
        )
    sums = []
    for f in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = f.relative_to(out).as_posix()
        if rel == "README.md" or "__pycache__" in rel or _unpacked(out, rel):
            continue
        sums.append(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {rel}")
    text = (
        README_HEAD
        + "\n".join(rows)
        + "\n"
        + (README_IMPORTED + "\n".join(imported) + "\n" if imported else "")
        + "\n## SHA-256 of every file\n\n```\n"
        + "\n".join(sums)
        + "\n```\n"
    )
    (out / "README.md").write_text(text)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("datasets", nargs="*", help=f"default: all of {', '.join(DATASETS)}")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    ap.add_argument("--work", type=Path, default=None, help="scratch dir for broker run dirs")
    ap.add_argument("--readme", action="store_true", help="only rewrite README.md (provenance + checksums)")
    args = ap.parse_args(argv)
    if args.readme:
        write_readme(args.out)
        return
    names = args.datasets or list(DATASETS)
    unknown = sorted(set(names) - set(DATASETS))
    if unknown:
        ap.error(f"unknown dataset(s): {', '.join(unknown)}")
    work = args.work or Path(tempfile.mkdtemp(prefix="cqf-gen-"))
    for name in names:
        generate(name, args.out, work)
    if args.out.resolve() == Path(__file__).resolve().parent:
        write_readme(args.out)


if __name__ == "__main__":
    main()
