"""Writer output retargeted to another release series, booted by a real broker of that series.

The metadata, feature flags and recovery files of one series do not boot on another
(``write/retarget.py`` says why, from the RabbitMQ source), so the output takes them from a
template: a node of the target version, booted once on an empty dir, into which the source's
vhosts, exchanges, queues and bindings were imported (``retarget.definitions``), then stopped.
The broker boots on the output and delivers what the original delivered (the sample manifest),
less what the target has no stored form for (AMQP 1.0 messages on 3.10: lost+found)."""

from __future__ import annotations

import json

import pytest

from support import SAMPLES, manifest, need_broker
from support.live import comparable

# (sample, target): 3.10.8 data for both 4.x brokers, 4.3.6 data (Khepri, #mc, AMQP 1.0) for 3.10.8
CASES = [("3.10.8-kill", "4.0.5"), ("3.10.8-clean", "4.3.6"), ("4.3.6-clean", "3.10.8"), ("4.3.6-kill", "3.10.8")]


def _template(b, src, target: str) -> list[str]:
    """Boot ``b`` on an empty node dir, import the definitions SRC needs with guest's permission
    on every vhost added (one rabbitmqctl call, not one more per vhost), stop it cleanly: the
    operator's steps before writing (docs/commands.md)."""
    from cqforensics.model.versions import model
    from cqforensics.write import retarget

    d = retarget.write_definitions(src, model(target), b.run_dir / "definitions.json")
    vhosts = [v["name"] for v in d["vhosts"]]
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    d["permissions"] = [{"user": "guest", "vhost": v, **everything} for v in vhosts]
    defs = b.run_dir / "definitions-and-permissions.json"
    defs.write_text(json.dumps(d, ensure_ascii=False), encoding="utf-8")
    b.start()
    b.ctl("import_definitions", str(defs))
    b.stop()
    return vhosts


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """``template(src, target)``: (the node dir of a stopped ``_template`` of the target version
    holding SRC's definitions, its vhosts). Made once per session for each set of definitions
    (keyed by their digest: 4.3.6-clean and 4.3.6-kill, damaged or not, need the same 3.10.8
    template) and only read by the cases (compact and rebuild read a template, never write it):
    a template costs a boot, an import and a clean stop of the target broker."""
    import hashlib
    import shutil
    import tempfile
    from pathlib import Path

    from brokers import Broker
    from cqforensics.model.versions import model
    from cqforensics.write import retarget
    from support.session import made_once

    def make(src, target: str) -> tuple[Path, list[str]]:
        need_broker(target)
        defs = json.dumps(retarget.definitions(src, model(target)), sort_keys=True, ensure_ascii=False)
        digest = hashlib.sha256(defs.encode()).hexdigest()[:16]

        def write(part: Path) -> None:
            base = Path(tempfile.mkdtemp(prefix="cqf-broker-"))
            base.chmod(0o755)
            try:
                with Broker(target, base / "run") as b:
                    vhosts = _template(b, src, target)
                shutil.copytree(b.mnesia_base, part / "mnesia", symlinks=True)
                (part / "vhosts.json").write_text(json.dumps(vhosts), encoding="utf-8")
            finally:
                shutil.rmtree(base, ignore_errors=True)

        made = made_once(tmp_path_factory, f"template-{target}-{digest}", write)
        return made / "mnesia" / "rabbit@localhost", json.loads((made / "vhosts.json").read_text(encoding="utf-8"))

    return make


def _expected(dataset: str, target: str) -> tuple[list[dict], int]:
    """The manifest's queues as the target delivers them after the move, and how many messages
    it cannot hold (AMQP 1.0 messages stored as #mc{mc_amqp} have no form on 3.10 - 3.12)."""
    from cqforensics.model.versions import model

    queues, unrepresentable = [], 0
    for q in manifest(dataset)["queues"]:
        if not q.get("exists_after_restart", True):
            continue
        keep = q["messages"]
        if not model(target).stores_mc:
            keep = [m for m in keep if m["protocol"] != "amqp10"]
            unrepresentable += len(q["messages"]) - len(keep)
        queues.append({**q, "messages": keep})
    return queues, unrepresentable


@pytest.mark.broker
@pytest.mark.parametrize("dataset, target", CASES, ids=[f"{d}-for-{t}" for d, t in CASES])
def test_compact_for_another_series_boots_with_a_template(dataset, target, broker_dir, template):
    from brokers import Broker
    from brokers.clients import drain_all
    from cqforensics.write import compact

    need_broker(target)
    src = SAMPLES / dataset / "mnesia"
    expected, unrepresentable = _expected(dataset, target)
    tnode, vhosts = template(src, target)
    with Broker(target, broker_dir / "run") as b:
        out = broker_dir / "out"
        result = compact(src, out, broker_version=target, template=tnode)
        assert result.verified
        lost = sum(q.quarantined.get("target_cannot_represent", 0) for q in result.queues)
        assert (out / "rabbit@localhost-feature_flags").read_bytes() == (
            tnode.parent / "rabbit@localhost-feature_flags"
        ).read_bytes()
        b.install_node(out)
        b.start()
        got = drain_all(b, vhosts)  # every queue drained over AMQP 0-9-1
        b.kill()  # (nothing reads the node after the drain)
    got = [
        q for q in got if q["messages"] or any(e["name"] == q["name"] and e["vhost"] == q["vhost"] for e in expected)
    ]
    want = comparable([q for q in expected if q["messages"]])
    assert {k: v for k, v in comparable(got).items() if v} == want
    assert {(q["vhost"], q["name"]) for q in got} == {(q["vhost"], q["name"]) for q in expected}
    assert lost == unrepresentable


@pytest.mark.broker
def test_without_a_template_the_other_series_refuses_the_node(broker_dir):
    """What the template is for: 3.10.8's own metadata and feature flags, carried to 4.0.5, stop
    its boot (the flags 4.0 requires are not enabled in the 3.10.8 feature-flag file)."""
    from brokers import Broker
    from brokers.harness import BrokerError
    from cqforensics.write import compact

    need_broker("4.0.5")
    out = broker_dir / "out"
    result = compact(SAMPLES / "3.10.8-kill" / "mnesia", out, broker_version="4.0.5")
    assert result.exit_code == 4 and any("--template" in n for n in result.cannot_boot)  # no success
    with Broker("4.0.5", broker_dir / "run") as b:
        b.install_node(out)
        with pytest.raises(BrokerError, match="feature_flags"):
            b.start(timeout=120)


def test_definitions_declare_what_the_written_dirs_need():
    from cqforensics.model.versions import model
    from cqforensics.write import retarget

    d = retarget.definitions(SAMPLES / "3.10.8-clean" / "mnesia", model("3.10.8"))
    qs = {(q["vhost"], q["name"]): q["arguments"] for q in d["queues"]}
    assert qs[("/", "orders.v1")]["x-queue-version"] == 1 and qs[("/", "orders.v2")]["x-queue-version"] == 2
    assert qs[("/", "delay")]["x-dead-letter-exchange"] == "dlx" and qs[("/", "jobs.prio")]["x-max-priority"] == 5
    assert {v["name"] for v in d["vhosts"]} == {"/", "staging/ü"}
    assert {e["name"] for e in d["exchanges"]} == {"fanout.audit", "dlx"}
    assert {(b["source"], b["destination"]) for b in d["bindings"]} >= {("dlx", "dead"), ("fanout.audit", "audit.a")}
    d4 = retarget.definitions(SAMPLES / "3.10.8-clean" / "mnesia", model("4.3.6"))
    assert all("x-queue-version" not in q["arguments"] for q in d4["queues"])  # 4.x: v2 only
    d3 = retarget.definitions(SAMPLES / "4.3.6-clean" / "mnesia", model("3.10.8"))
    assert {q["arguments"]["x-queue-version"] for q in d3["queues"]} == {2}  # 4.3.6's v2 dirs stay v2
    json.dumps(d), json.dumps(d3)


def test_metadata_gap():
    from cqforensics.model.versions import model
    from cqforensics.write.retarget import metadata_gap

    assert metadata_gap(model("3.10.8"), model("3.10.2")) is None
    assert metadata_gap(model("4.0.5"), model("4.3.6")) is None  # the broker migrates it (booted)
    assert metadata_gap(model("3.13"), model("4.0")) is None
    assert "feature flags" in metadata_gap(model("3.10.8"), model("4.0.5"))
    assert "downgrade" in metadata_gap(model("4.3.6"), model("3.10.8"))


def test_a_template_lacking_a_queue_is_refused(tmp_path):
    """A queue dir the template does not declare would be deleted by its boot: refused, nothing
    written."""
    from cqforensics.base.errors import UsageError
    from cqforensics.write import compact

    with pytest.raises(UsageError, match="orders.v1"):
        compact(
            SAMPLES / "3.10.8-clean" / "mnesia",
            tmp_path / "out",
            broker_version="4.3.6",
            template=SAMPLES / "4.3.6-clean" / "mnesia" / "rabbit@localhost",
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.broker
@pytest.mark.parametrize(
    "dataset, scenario, target",
    [("3.10.8-kill", "v1_segment_truncated", "4.3.6"), ("4.3.6-kill", "qi_reserved_bit", "3.10.8")],
)
def test_rebuild_for_another_series_delivers_every_salvaged_message(dataset, scenario, target, broker_dir, template):
    """rebuild of a damaged node, written for the other series with a template: the target
    delivers every message the output's indexes hold (read back as the target version)."""
    import shutil

    import cqforensics
    from brokers import Broker
    from brokers.clients import drain_all
    from cqforensics.write import rebuild
    from support.oracle import compare_deliveries
    from support.scenarios import SCENARIOS

    need_broker(target)
    src = broker_dir / "damaged"
    shutil.copytree(SAMPLES / dataset / "mnesia", src)
    SCENARIOS[scenario](src / "rabbit@localhost")
    tnode, vhosts = template(src, target)
    with Broker(target, broker_dir / "run") as b:
        out = broker_dir / "out"
        result = rebuild(src, out, broker_version=target, template=tnode)
        assert result.verified and result.rescued > 0
        salvaged = cqforensics.read_table(out, broker_version=target).to_pylist()
        assert sum(r["survives_restart"] for r in salvaged) > 0
        b.install_node(out)
        b.start()
        got = drain_all(b, vhosts)
        b.kill()
    assert compare_deliveries(got, salvaged) == []


@pytest.mark.broker
def test_compact_for_a_later_4x_needs_no_template(broker_dir):
    """Within 4.x the broker upgrades the metadata itself: 4.0.5's Mnesia node, compacted for
    4.3.6 with its own metadata, boots on 4.3.6 (which moves it to Khepri) and delivers the
    manifest."""
    from brokers import Broker
    from brokers.clients import drain_all
    from cqforensics.write import compact

    need_broker("4.3.6")
    dataset = "4.0.5-kill"
    out = broker_dir / "out"
    result = compact(SAMPLES / dataset / "mnesia", out, broker_version="4.3.6")
    assert result.verified and not any("--template" in n for n in result.notes)
    m = manifest(dataset)
    known = {
        (q["vhost"], q["name"]): {k: v for k, v in q.items() if k in ("vhost", "name", "drain")}
        for q in m["queues"]
        if q.get("exists_after_restart", True)
    }
    with Broker("4.3.6", broker_dir / "run") as b:
        b.install_node(out)
        b.start()
        got = drain_all(b, m["vhosts"], known)
        b.kill()
        assert (b.node_dir / "coordination").is_dir()  # Khepri
    expected, _ = _expected(dataset, "4.3.6")
    assert comparable(got) == comparable(expected)
