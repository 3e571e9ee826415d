"""fsck's next-boot prediction against real brokers: a damaged copy of a sample is checked, then
the broker of that version boots on it and is drained; per queue it must deliver exactly the
predicted number of messages, and crash (or hang) exactly where fsck said it would.

Kill -9 samples exercise the dirty recovery (modelled message by message); clean samples the
clean one (the broker trusts its shutdown state and crashes reading damaged messages)."""

from __future__ import annotations

import pytest

from cqforensics.commands import fsck
from support import SAMPLES, manifest, need_broker
from support.scenarios import SCENARIOS, V1_ONLY

pytestmark = pytest.mark.broker

CLEAN_SCENARIOS = ("rdq_zeroed_range", "rdq_missing", "qs_crc", "qs_missing", "qi_bad_header", "qi_reserved_bit")
CASES = [
    (ds, sc) for ds in ("3.10.8-kill", "4.3.6-kill") for sc in SCENARIOS if sc not in V1_ONLY or ds.startswith("3.")
]
CASES += [(ds, sc) for ds in ("3.10.8-clean", "4.3.6-clean") for sc in CLEAN_SCENARIOS]
CASES += [("4.0.5-kill", sc) for sc in ("rdq_zeroed_range", "qs_crc", "qi_reserved_bit", "qi_bad_header")]


@pytest.mark.parametrize("dataset, scenario", CASES, ids=[f"{d}-{s}" for d, s in CASES])
def test_prediction_matches_the_real_broker(dataset, scenario, broker_dir):
    from brokers import Broker, BrokerError
    from brokers.clients import drain_counts

    m = manifest(dataset)
    version = m["broker"]["rabbitmq"]
    need_broker(version)
    amqp10 = {(q["vhost"], q["name"]) for q in m["queues"] if q.get("drain") == "amqp10"}
    with Broker(version, broker_dir / "run") as b:
        b.install_node(SAMPLES / dataset / "mnesia")
        SCENARIOS[scenario](b.node_dir)
        report = fsck.run(b.node_dir, broker_version=version)
        if report.nodes[0].boot == "hangs":
            assert any(f.code == "boot-crash" for f in report.findings)
            with pytest.raises(BrokerError):
                b.start(timeout=60)
            return
        b.start()
        got = drain_counts(b, m["vhosts"], amqp10)
        # nothing below needs the broker, nor a clean stop of it: a node whose queues crashed
        # may not shut down in minutes (3.10.8, rdq_missing: `rabbitmqctl shutdown` once timed
        # out after 180 s, the drain's counts already taken)
        b.kill()
    crashed_vhosts = {v for (v, q), n in got.items() if n == "crash"}
    for q in report.queues:
        key = (q.vhost, q.queue)
        if q.crash == "queue":
            assert got.get(key, "crash") == "crash", f"{key}: predicted a crash, the broker delivered {got.get(key)}"
        elif q.crash == "vhost":
            assert q.vhost in crashed_vhosts, f"{key}: predicted the vhost to crash"
        elif q.vhost in crashed_vhosts and any(v.crash == "vhost" for v in report.queues if v.vhost == q.vhost):
            continue  # a crashing vhost makes its other queues' deliveries a matter of timing
        else:
            assert got.get(key, 0) == q.predicted_after_restart, (
                f"{key}: predicted {q.predicted_after_restart}, the broker delivered {got.get(key)}"
            )
    predicted = {(q.vhost, q.queue) for q in report.queues}
    for key, n in got.items():  # queues without a dir of their own (never used) deliver nothing
        if key not in predicted:
            assert n == 0, f"{key}: delivered {n} from no queue dir"
    if any(q.crash for q in report.queues):
        assert any(f.code == "boot-crash" and f.severity == "error" for f in report.findings)
        assert report.exit_code == 4
