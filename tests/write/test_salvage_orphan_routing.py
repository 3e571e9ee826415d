"""Issue 13, orphan attribution: the metadata's durable exchanges and bindings (Mnesia
rabbit_durable_route / rabbit_route, Khepri #binding{}) route a message the way the broker does,
so an orphaned store message can be given the queues it reached (``model.routing``,
``VhostScan.orphan_destinations``), and a lost queue the orphans that are its own."""

from __future__ import annotations

import shutil

import pytest

import cqforensics
from cqforensics.codecs import etf, textfiles
from cqforensics.commands.fsck import run as fsck_run
from cqforensics.discovery import nodes as layout
from cqforensics.model.routing import Router, headers_match, route_message, topic_match
from cqforensics.model.vhost import NodeScan
from cqforensics.readers.metadata import Binding, Metadata, QueueRecord, read_metadata
from support import SAMPLES, copy_node, dataset_params

A = etf.Atom


@pytest.mark.parametrize(
    "pattern, key, hit",
    [
        (b"a.b.c", b"a.b.c", True),
        (b"a.*.c", b"a.b.c", True),
        (b"a.*.c", b"a.c", False),
        (b"a.#", b"a", True),
        (b"a.#", b"a.b.c", True),
        (b"#", b"", True),
        (b"#", b"x.y", True),
        (b"#.c", b"a.b.c", True),
        (b"a.#.c", b"a.c", True),
        (b"a.#.c", b"a.x.y.c", True),
        (b"a.#.c", b"a.x.y", False),
        (b"*", b"", False),
        (b"", b"", True),
        (b"a..b", b"a..b", True),
        (b"a.*.b", b"a..b", True),
        (b"*", b"a.b", False),
        (b"*.*", b"a", False),
        (b"a.b", b"a.b.c", False),
        (b"#.#", b"a", True),
        (b"*.#", b"", False),
    ],
)
def test_topic_patterns(pattern, key, hit):
    assert topic_match(pattern, key) is hit


def _h(**kv):
    return {
        k: ({"type": "longstr", "value": v} if isinstance(v, str) else {"type": "signedint", "value": v})
        for k, v in kv.items()
    }


def test_headers_matching():
    args = [(b"x-match", A("longstr"), b"all"), (b"a", A("longstr"), b"1"), (b"n", A("long"), 7)]
    assert headers_match(args, _h(a="1", n=7, extra="z"))
    assert not headers_match(args, _h(a="1"))
    assert not headers_match(args, _h(a="1", n=8))
    anyof = [(b"x-match", A("longstr"), b"any"), (b"a", A("longstr"), b"1"), (b"n", A("long"), 7)]
    assert headers_match(anyof, _h(n=7)) and not headers_match(anyof, _h(b="1"))
    assert headers_match([(b"a", A("void"), None)], _h(a="whatever"))  # void: presence
    # x- keys are left out: "all" of nothing matches, "any" of nothing does not (headers_match/5)
    assert headers_match([(b"x-k", A("longstr"), b"v")], {})
    assert not headers_match([(b"x-match", A("longstr"), b"any"), (b"x-k", A("longstr"), b"v")], _h(**{"x-k": "v"}))
    assert headers_match([(b"x-match", A("longstr"), b"all-with-x"), (b"x-k", A("longstr"), b"v")], _h(**{"x-k": "v"}))


def _meta() -> Metadata:
    m = Metadata("mnesia")
    for q in (b"q1", b"q2", b"q3", b"direct.q", b"ae.q"):
        m.queues[(b"/", q)] = QueueRecord(b"/", q, True, [], "rabbit_classic_queue", "t", "n@h")
    m.exchanges.update(
        {
            (b"/", b"x.direct"): "direct",
            (b"/", b"x.fan"): "fanout",
            (b"/", b"x.topic"): "topic",
            (b"/", b"x.hdr"): "headers",
            (b"/", b"x.e2e"): "fanout",
            (b"/", b"x.ae"): "direct",
            (b"/", b"x.other"): "x-consistent-hash",
            (b"/", b"x.alt"): "fanout",
        }
    )
    m.exchange_args[(b"/", b"x.ae")] = [(b"alternate-exchange", A("longstr"), b"x.alt")]
    m.bindings += [
        Binding(b"/", b"x.direct", b"k1", "queue", b"q1"),
        Binding(b"/", b"x.direct", b"k2", "queue", b"q2"),
        Binding(b"/", b"x.fan", b"", "queue", b"q1"),
        Binding(b"/", b"x.fan", b"", "queue", b"q3"),
        Binding(b"/", b"x.topic", b"orders.*.eu", "queue", b"q2"),
        Binding(b"/", b"x.topic", b"orders.#", "queue", b"q3"),
        Binding(
            b"/",
            b"x.hdr",
            b"",
            "queue",
            b"q1",
            ((b"x-match", A("longstr"), b"any"), (b"kind", A("longstr"), b"invoice")),
        ),
        Binding(b"/", b"x.e2e", b"", "exchange", b"x.direct"),
        Binding(b"/", b"x.ae", b"nomatch-never", "queue", b"q1"),
        Binding(b"/", b"x.alt", b"", "queue", b"ae.q"),
    ]
    return m


def test_routing_by_exchange_type():
    r = Router(_meta())
    assert r.route(b"/", b"", [b"direct.q", b"nope"]) == {b"direct.q"}  # the default exchange
    assert r.route(b"/", b"x.direct", [b"k1"]) == {b"q1"}
    assert r.route(b"/", b"x.direct", [b"k1", b"k2"]) == {b"q1", b"q2"}  # CC'd keys
    assert r.route(b"/", b"x.direct", [b"k3"]) == set()
    assert r.route(b"/", b"x.fan", [b"anything"]) == {b"q1", b"q3"}
    assert r.route(b"/", b"x.topic", [b"orders.big.eu"]) == {b"q2", b"q3"}
    assert r.route(b"/", b"x.topic", [b"orders"]) == {b"q3"}
    assert r.route(b"/", b"x.hdr", [], _h(kind="invoice")) == {b"q1"}
    assert r.route(b"/", b"x.hdr", [], _h(kind="other")) == set()
    assert r.route(b"/", b"x.e2e", [b"k2"]) == {b"q2"}  # exchange-to-exchange
    assert r.route(b"/", b"x.ae", [b"unrouted"]) == {b"ae.q"}  # alternate exchange
    assert r.route(b"/", b"x.other", [b"k"]) is None  # a type we cannot route
    assert r.route(b"/", b"x.missing", [b"k"]) is None  # not in the metadata
    assert route_message(r, b"/", {"exchange": "x.direct", "routing_keys": ["k2"], "headers": None}) == {b"q2"}


@pytest.mark.parametrize("dataset", dataset_params())
def test_routing_agrees_with_where_the_broker_put_every_message(dataset):
    """Every message a queue index holds was routed there by the real broker: routing it again
    through the metadata's bindings (Mnesia or Khepri) names its queue, unless its queue is not
    durable (no metadata) or the message has no exchange (undecodable, transient body gone)."""
    path = SAMPLES / dataset / "mnesia"
    routers = {n.node: (Router(read_metadata(n.path)), read_metadata(n.path)) for n in layout.discover([path])}
    rows = cqforensics.read_table(
        path, "messages", columns=["node", "vhost", "queue", "exchange", "routing_keys", "headers"]
    ).to_pylist()
    checked = 0
    for r in rows:
        router, meta = routers[r["node"]]
        if r["exchange"] is None or not meta.knows(r["vhost"].encode(), r["queue"].encode()):
            continue
        got = route_message(router, r["vhost"].encode(), r)
        assert got is not None and r["queue"].encode() in got, r
        checked += 1
    assert checked > 0


def test_orphans_of_a_lost_queue_are_attributed_to_it(tmp_path):
    """4.2.2 clean stop: dead's index deleted; its messages (dead-lettered through dlx) are left
    in the shared store as orphans, and the dlx binding gives every one of them back to dead."""
    node = copy_node("4.2.2-clean", tmp_path / "mnesia")
    msgs = cqforensics.read_table(node, "messages", columns=["vhost", "queue", "location", "msg_id"]).to_pylist()
    own = {m["msg_id"] for m in msgs if m["queue"] == "dead" and m["location"] == "shared_store"}
    others = {m["msg_id"] for m in msgs if m["queue"] != "dead" and m["vhost"] == "/"}
    assert len(own - others) >= 50
    shutil.rmtree(
        node
        / "msg_stores"
        / "vhosts"
        / textfiles.vhost_dir_name(b"/")
        / "queues"
        / textfiles.queue_dir_name(b"/", b"dead")
    )
    (f,) = [f for f in fsck_run([node]).findings if f.code == "queue-index-missing"]
    assert f.queue == "dead" and f.details["orphans_routed_here"] == len(own - others)
    assert f.details["orphans_in_store"] > f.details["orphans_routed_here"]
    ns = NodeScan(layout.discover([node])[0])
    vs = [v for v in ns.vhosts if v.vhost.name == "/"][0]
    dests = vs.orphan_destinations()
    st = vs.stores["persistent"]
    mine = {st.e_id[e].tobytes() for e, qs in dests.items() if qs and b"dead" in qs}
    assert mine == own - others


# -- with a real broker: its routing is the ground truth, its boot the proof ---------------------------

SENDS = [  # (exchange, routing key, headers): each message a distinct body
    ("x.direct", "k", None),
    ("x.direct", "other", None),
    ("x.direct", "nowhere", None),
    ("x.fanout", "anything", None),
    ("x.topic", "a.b.c", None),
    ("x.topic", "a.b.z", None),
    ("x.topic", "q.z", None),
    ("x.topic", "a.b.c.d", None),
    ("x.headers", "", {"color": "red", "size": "big"}),
    ("x.headers", "", {"color": "red"}),
    ("x.headers", "", {"color": "blue"}),
    ("", "lost", None),
    ("", "keep", None),
]


@pytest.mark.broker
@pytest.mark.parametrize("version", ["3.10.8", "4.3.6"])
def test_lost_queue_orphans_are_routed_as_the_broker_routed_and_restored(version, broker_dir):
    """The real broker routes 13 persistent messages (5,000-byte bodies: shared store) through a
    direct, fanout, topic and headers exchange and the default exchange into two durable queues,
    and stops. Queue ``lost``'s index dir is then deleted: every message the broker had put in it
    is an orphan whose ``routes_to`` names ``lost`` (and no other orphan does), and
    ``rebuild --restore-orphans lost`` writes exactly those back; the broker booted on the
    output delivers them from ``lost``."""
    import hashlib

    from brokers import Broker
    from brokers.clients import pika_module
    from cqforensics.write import rebuild
    from support import need_broker
    from support.live import drain_queue

    need_broker(version)
    pika = pika_module()
    with Broker(version, broker_dir / "run") as b:
        b.start()
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        for q in ("lost", "keep"):
            ch.queue_declare(q, durable=True)
        for x, kind in (("x.direct", "direct"), ("x.fanout", "fanout"), ("x.topic", "topic"), ("x.headers", "headers")):
            ch.exchange_declare(x, kind, durable=True)
        ch.queue_bind("lost", "x.direct", "k")
        ch.queue_bind("keep", "x.direct", "other")
        ch.queue_bind("lost", "x.fanout")
        ch.queue_bind("lost", "x.topic", "a.*.c")
        ch.queue_bind("keep", "x.topic", "#.z")
        ch.queue_bind("lost", "x.headers", arguments={"x-match": "all", "color": "red", "size": "big"})
        ch.queue_bind("keep", "x.headers", arguments={"x-match": "any", "color": "blue", "size": "small"})
        for i, (x, key, headers) in enumerate(SENDS):
            ch.basic_publish(
                x, key, f"{i}:{x}:{key}:".encode() + b"x" * 5000, pika.BasicProperties(delivery_mode=2, headers=headers)
            )
        conn.close()
        b.stop()
        node = b.node_dir
        held = cqforensics.read_table(node, "messages", columns=["queue", "msg_id", "body"]).to_pylist()
        broker_put = {r["msg_id"]: r["body"] for r in held if r["queue"] == "lost"}
        assert len(broker_put) == 5 and len([r for r in held if r["queue"] == "keep"]) == 5
        shutil.rmtree(
            node
            / "msg_stores"
            / "vhosts"
            / textfiles.vhost_dir_name(b"/")
            / "queues"
            / textfiles.queue_dir_name(b"/", b"lost")
        )
        store = cqforensics.read_table(node, "store", columns=["status", "routes_to", "msg_id"]).to_pylist()
        attributed = {
            r["msg_id"] for r in store if r["status"] == "orphan" and r["routes_to"] and "lost" in r["routes_to"]
        }
        assert attributed == set(broker_put)
        result = rebuild(b.mnesia_base, broker_dir / "out", restore_orphans=["lost"])
        assert result.verified and result.totals()["restored_orphans"] == 5
        assert {r["queue"] for r in result.restored} == {"lost"}
        b.install_node(broker_dir / "out")
        b.start()
        got = drain_queue(b, "/", "lost")
        kept = drain_queue(b, "/", "keep")
        # no clean stop: leaving the block kills the broker (Broker.close), and nothing is read after it
    assert not got["errors"] and sorted(got["bodies"]) == sorted(
        hashlib.sha256(x).hexdigest() for x in broker_put.values()
    )
    assert kept["delivered"] == 5
