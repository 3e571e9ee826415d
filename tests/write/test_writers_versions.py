"""compact and rebuild with ``broker_version`` = a target version: every sample dataset written
for targets across the boundaries (3.13: #mc; 4.0: v2 index only, AMQP 1.0 stored as ``v1``).
The output is read back as that version reads it: the delivered messages equal the source's
(body, exchange, routing keys, properties, headers, message id, queue and SeqId), except the
ones reported as not representable by the target (lost+found), and every stored term has a
shape and atom encoding that the target's own sample data has."""

from __future__ import annotations

import functools
import json

import pytest

import cqforensics
from cqforensics.discovery import nodes as layout
from cqforensics.model import versions
from cqforensics.model.options import make_options
from cqforensics.model.vhost import NodeScan
from cqforensics.write import compact, formats, rebuild
from support import SAMPLES, dataset_params
from support.oracle import datasets

TARGETS = ["3.10", "3.12", "3.13", "4.0", "4.2", "4.3"]
#: the sample each target's own data is compared with
OWN_DATA = {
    "3.10": "3.10.8-clean",
    "3.12": "3.12.14-clean",
    "3.13": "3.13.7-clean",
    "4.0": "4.0.5-clean",
    "4.2": "4.2.2-clean",
    "4.3": "4.3.6-clean",
}

COLUMNS = [
    "vhost",
    "queue",
    "priority",
    "seq_id",
    "msg_id",
    "index_version",
    "exchange",
    "routing_keys",
    "properties",
    "headers",
    "body",
    "term_format",
    "survives_restart",
    "drop_reason",
]
COMPARED = ("msg_id", "exchange", "routing_keys", "properties", "body")


def _key(r) -> tuple:
    return r["vhost"], r["queue"], r["priority"] or 0, r["seq_id"]


def _kept(path, version: str | None = None) -> dict[tuple, dict]:
    """The messages a boot delivers or expires, by (vhost, queue, priority, seq id)."""
    rows = cqforensics.read_table(
        path,
        "messages",
        columns=[*COLUMNS, "queue_type", "location"],
        **({"broker_version": version} if version else {}),
    ).to_pylist()
    # the classic queues' stored messages: what compact re-encodes for a version (a stream's dir and a
    # quorum queue's Ra data are carried over as they are; a quorum queue's dead letters replayed into a
    # classic queue at the boot are predicted, not stored)
    return {
        _key(r): r
        for r in rows
        if (r["survives_restart"] or r["drop_reason"] == "expired")
        and r["queue_type"] == "classic"
        and r["location"] != "dead_letter_replay"
    }


@functools.cache
def _source(dataset: str) -> dict[tuple, dict]:
    return _kept(SAMPLES / dataset / "mnesia")


def stored_terms(path, version: str):
    """Every live index entry's stored term, as ``version`` locates it."""
    for node in layout.discover([path]):
        ns = NodeScan(node, make_options(broker_version=version, bodies=False, decode=False))
        for vs in ns.vhosts:
            try:
                for q in vs.all_queue_dirs:
                    for qx in vs.scan_queue(q):
                        if not len(qx.live):
                            continue
                        res = vs.resolve(qx)
                        for fb, start, n in zip(res.body_file.tolist(), res.body_start.tolist(), res.body_len.tolist()):
                            if fb >= 0:
                                yield bytes(vs.bodies.read(res.body_files[fb], start, n))
            finally:
                vs.close()


def _shape(raw: bytes) -> tuple:
    s = formats.term_shape(raw)
    return s.record, s.protocol, s.state, s.utf8


def _writes(model: versions.BrokerModel) -> tuple:
    return model.stores_mc, model.utf8_atoms, model.amqp10_state


@functools.cache
def sample_shapes(dataset: str) -> frozenset:
    """The shapes of a sample's stored terms, as its own version locates them: read once per
    process, whatever the targets whose own shapes it is among (own_shapes of the six targets
    read most samples several times over: 22 of the 27 s of a dataset's six compact cases)."""
    return frozenset(map(_shape, stored_terms(SAMPLES / dataset / "mnesia", dataset.split("-")[0])))


@functools.cache
def own_shapes(target: str) -> frozenset:
    """The term shapes (record, protocol, state, UTF-8 atoms) in the target's own sample, and in
    the samples of the versions the version table says write the same shapes (the 4.2.2
    sample has no AMQP 1.0 message; the 4.0.5, 4.1.8 and 4.3.6 ones do)."""
    same = [OWN_DATA[target]] + [
        d
        for d in datasets()
        if d != OWN_DATA[target] and _writes(versions.model(d.split("-")[0])) == _writes(versions.model(target))
    ]
    shapes = set().union(*(sample_shapes(d) for d in same))
    # #mc{mc_mqtt} keeps one state record from 3.13.0 on (deps/rabbitmq_mqtt/src/mc_mqtt.erl, 3.13.7 =
    # 4.x): its shape comes from any sample of a version that stores #mc{} with the same atoms
    mqtt = [
        d for d in datasets() if _writes(versions.model(d.split("-")[0]))[:2] == _writes(versions.model(target))[:2]
    ]
    shapes |= {s for d in mqtt for s in sample_shapes(d) if s[1] == "mc_mqtt"}
    return frozenset(shapes)


def _headers(h):
    return json.loads(h) if h else None


def _check(dataset: str, target: str, out, result) -> None:
    assert result.verified, (dataset, target)
    assert result.broker_version == target
    src = _source(dataset)
    lost_found = out / "lost+found" / "lost+found.jsonl"
    items = [json.loads(line) for line in lost_found.read_text().splitlines()] if lost_found.exists() else []
    unrepresentable = {
        (i["vhost"], i["queue"], i["priority"] or 0, i["seq_id"]): i
        for i in items
        if i["reason"] == formats.NOT_REPRESENTABLE
    }
    assert result.totals()["quarantined"].get(formats.NOT_REPRESENTABLE, 0) == len(unrepresentable)
    model = versions.model(target)
    for i in unrepresentable.values():  # only what the target has no stored form for
        assert i["detail"] and i["raw"]
        assert i["term_format"] not in ("basic_message", "mc_amqpl")
        assert not model.stores_mc or (i["term_format"] == "mc_amqp") != (model.amqp10_state == "v1")
    got = _kept(out, target)
    want = {k: r for k, r in src.items() if k not in unrepresentable}
    assert set(unrepresentable) <= set(src)
    assert sorted(got) == sorted(want), (dataset, target)
    for k, r in want.items():
        g = got[k]
        for c in COMPARED:
            assert g[c] == r[c], (dataset, target, k, c, g[c], r[c])
        assert _headers(g["headers"]) == _headers(r["headers"]), (dataset, target, k)
        assert g["index_version"] == (2 if model.index_v2_only else r["index_version"]), (dataset, target, k)
        if r["term_format"] in ("basic_message", "mc_amqpl"):  # AMQP 0-9-1: the target's shape
            assert g["term_format"] == ("mc_amqpl" if model.stores_mc else "basic_message"), (dataset, target, k)
        else:
            assert g["term_format"] == r["term_format"], (dataset, target, k)
    # every stored term looks like the target's own data, and says so to the version inference
    terms = list(stored_terms(out, target))
    assert len(terms) >= len(want)
    shapes = {_shape(t) for t in terms}
    assert shapes <= own_shapes(target), (dataset, target, shapes - own_shapes(target))
    ev = versions.Evidence()
    for t in terms:
        versions.term_evidence(t, ev)
    assert ev.range().contains(target), (dataset, target, ev.range())


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dataset", dataset_params())
def test_compact_writes_what_the_target_version_writes(dataset, target, tmp_path):
    out = tmp_path / "out"
    result = compact(SAMPLES / dataset / "mnesia", out, broker_version=target)
    # the stores are the target's; the metadata copied from SRC boots on it or not (exit 4, kept)
    from cqforensics.write.retarget import metadata_gap

    gap = metadata_gap(versions.model(result.source_version), versions.model(target))
    assert result.exit_code == (4 if gap else 0) and bool(result.cannot_boot) == bool(gap), result.cannot_boot
    _check(dataset, target, out, result)


KILLED = [d for d in datasets() if d.endswith("-kill")]


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dataset", KILLED)
def test_rebuild_writes_what_the_target_version_writes(dataset, target, tmp_path):
    out = tmp_path / "out"
    result = rebuild(SAMPLES / dataset / "mnesia", out, broker_version=target)
    _check(dataset, target, out, result)


def test_the_write_plan_per_target():
    """The one decision table (formats.term_plan, formats.index_version) on crafted shapes."""
    S = formats.TermShape
    basic_l1, basic_u8 = S("basic_message", None, None, False), S("basic_message", None, None, True)
    amqpl = S("mc", "mc_amqpl", "content", True)
    amqp_v1, amqp_msg = S("mc", "mc_amqp", "v1", True), S("mc", "mc_amqp", "msg", True)
    mqtt = S("mc", "mc_mqtt", "mqtt_msg", True)
    K, R, U = formats.KEEP, formats.REENCODE, formats.UNREPRESENTABLE
    want = {  # target: basic L1, basic UTF-8, mc_amqpl, mc_amqp v1, mc_amqp msg, mc_mqtt
        "3.10": (K, R, R, U, U, U),
        "3.12": (K, R, R, U, U, U),
        "3.13": (R, R, K, U, K, K),
        "4.0": (R, R, K, K, U, K),
        "4.3": (R, R, K, K, U, K),
    }
    for target, actions in want.items():
        m = versions.model(target)
        got = tuple(formats.term_plan(m, s)[0] for s in (basic_l1, basic_u8, amqpl, amqp_v1, amqp_msg, mqtt))
        assert got == actions, target
        assert formats.term_plan(m, S())[0] == K  # unknown shapes are left as they are
        assert formats.index_version(m) == m.default_index_version
        assert formats.index_version(m, current=1) == (2 if m.index_v2_only else 1)
        assert formats.index_version(m, declared=2, current=1) == 2
