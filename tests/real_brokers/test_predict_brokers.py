"""fsck's next-boot prediction against real brokers: a damaged copy of a sample is checked, then
the broker of that version boots on it and is drained; per queue it must deliver exactly the
predicted number of messages, and crash (or hang) exactly where fsck said it would.

Kill -9 samples exercise the dirty recovery (modelled message by message); clean samples the
clean one (the broker trusts its shutdown state and crashes reading damaged messages).

**Shared boots.** Every (dataset, scenario) case is checked as before: the scenario damages its
own copy of the sample and fsck predicts on that copy alone. What is shared is the broker's boot:
scenarios whose damage stays inside the dir of one queue (``support.scenarios.CONFINED_TO``),
each a different queue, are applied together to one more copy, which the broker boots once;
each queue is then compared with the prediction of the scenario that damaged it (queues none of
them touched, with the prediction every one of them makes). A boot costs 4-6 CPU-seconds; this takes the file from
38 boots to 23. Whether the damages really are independent is checked on every run, by the
recovery model's own rules, before the broker boots: each scenario's changed files lie inside its
queue's dir, no two scenarios touch the same queue, none predicts a vhost or node crash or a
hung boot, and fsck on the combined copy predicts for every queue exactly what the scenario that
touched it (or, untouched, every scenario) predicted alone. A damage of a vhost's shared message
store reaches every queue with messages in it, and a hung boot stops every queue: those
scenarios (``rdq_*``, ``v1_segment_truncated``) boot alone, as every case did before.
A failure names its scenario."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cqforensics.commands import fsck
from support import SAMPLES, copy_node, manifest, need_broker
from support.scenarios import (
    SCENARIOS,
    V1_ONLY,
    apply_changes,
    boot_ids,
    changed_files,
    owners,
    shared_boots,
)

pytestmark = pytest.mark.broker

CLEAN_SCENARIOS = ("rdq_zeroed_range", "rdq_missing", "qs_crc", "qs_missing", "qi_bad_header", "qi_reserved_bit")
CASES = [
    (ds, sc) for ds in ("3.10.8-kill", "4.3.6-kill") for sc in SCENARIOS if sc not in V1_ONLY or ds.startswith("3.")
]
CASES += [(ds, sc) for ds in ("3.10.8-clean", "4.3.6-clean") for sc in CLEAN_SCENARIOS]
CASES += [("4.0.5-kill", sc) for sc in ("rdq_zeroed_range", "qs_crc", "qi_reserved_bit", "qi_bad_header")]

#: a hung boot stops every queue: that scenario (confined to orders.v1's dir) boots alone
BOOTS = shared_boots(CASES, alone={"v1_segment_truncated"})


def walker_crashed_then_silent(b, quiet: float = 15.0):
    """``Broker.start``'s ``stuck`` for the boot a damaged CQv1 index hangs (3.10-3.13): the
    message store's startup walker has crashed on the index (its worker's crash report names
    ``queue_index_walker``) and the node has logged nothing for ``quiet`` seconds since, its
    listener still closed. The store then waits forever for that walker's result: on 3.10.8 the
    log did not grow after the crash report (8 s into the boot) for the 60 s this case used to
    wait out."""
    import time

    seen = {"size": -1, "since": time.monotonic()}

    def stuck() -> str | None:
        try:
            size = b.log_file.stat().st_size
        except FileNotFoundError:
            return None
        now = time.monotonic()
        if size != seen["size"]:
            seen["size"], seen["since"] = size, now
            return None
        if now - seen["since"] < quiet or "queue_index_walker" not in b.log_file.read_text(errors="replace"):
            return None
        return f"the message store's startup walker crashed on the CQv1 index, then nothing logged for {quiet:.0f} s"

    return stuck


def _prediction(report) -> dict:
    return {(q.vhost, q.queue): (q.predicted_after_restart, q.crash) for q in report.queues}


@pytest.mark.parametrize("dataset, scenarios", BOOTS, ids=boot_ids(BOOTS))
def test_prediction_matches_the_real_broker(dataset, scenarios, broker_dir):
    from brokers import Broker, BrokerError
    from brokers.clients import drain_counts

    m = manifest(dataset)
    version = m["broker"]["rabbitmq"]
    need_broker(version)
    amqp10 = {(q["vhost"], q["name"]) for q in m["queues"] if q.get("drain") == "amqp10"}
    sample_node = SAMPLES / dataset / "mnesia" / Path(m["node_dir"]).name
    # each scenario on a copy of its own, predicted there alone (as a case booted alone is)
    reports, changes = {}, {}
    for sc in scenarios:
        node = copy_node(dataset, broker_dir / "alone" / sc)
        SCENARIOS[sc](node)
        reports[sc] = fsck.run(node, broker_version=version)
        changes[sc] = changed_files(sample_node, node)
    shutil.rmtree(broker_dir / "alone")
    owner: dict[tuple, str] = {}  # (vhost, queue) -> the scenario of this boot that damaged it
    if len(scenarios) > 1:
        owner = owners(sample_node, changes)
        for sc in scenarios:
            report = reports[sc]
            assert report.nodes[0].boot == "ok", f"{sc}: predicts a hung boot; it cannot share one"
            wide = [q.queue for q in report.queues if q.crash in ("vhost", "node")]
            assert not wide, f"{sc}: predicts a vhost or node crash ({wide}); it cannot share a boot"
    with Broker(version, broker_dir / "run") as b:
        b.install_node(SAMPLES / dataset / "mnesia")
        for sc in scenarios:
            apply_changes(changes[sc], b.node_dir)
        if len(scenarios) > 1:  # independent by the model: together, each queue as its scenario alone
            together = _prediction(fsck.run(b.node_dir, broker_version=version))
            alone = {sc: _prediction(reports[sc]) for sc in scenarios}
            for key, p in together.items():
                for sc in [owner[key]] if key in owner else scenarios:
                    assert alone[sc].get(key) == p, (
                        f"{'+'.join(scenarios)} together predict {p} for {key}, {sc} alone {alone[sc].get(key)}: "
                        "not independent, they cannot share a boot"
                    )
        elif reports[scenarios[0]].nodes[0].boot == "hangs":
            (sc,) = scenarios
            assert any(f.code == "boot-crash" for f in reports[sc].findings), sc
            with pytest.raises(BrokerError):
                b.start(timeout=60, stuck=walker_crashed_then_silent(b))
            return
        b.start()
        got = drain_counts(b, m["vhosts"], amqp10)
        # nothing below needs the broker, nor a clean stop of it: a node whose queues crashed
        # may not shut down in minutes (3.10.8, rdq_missing: `rabbitmqctl shutdown` once timed
        # out after 180 s, the drain's counts already taken)
        b.kill()
    crashed_vhosts = {v for (v, q), n in got.items() if n == "crash"}
    failures = []
    for sc in scenarios:
        report = reports[sc]
        for q in report.queues:
            key = (q.vhost, q.queue)
            if owner.get(key, sc) != sc:
                continue  # another scenario of this boot damaged it: checked against that one
            if q.crash == "queue":
                if got.get(key, "crash") != "crash":
                    failures.append(f"{sc}: {key}: predicted a crash, the broker delivered {got.get(key)}")
            elif q.crash == "vhost":
                if q.vhost not in crashed_vhosts:
                    failures.append(f"{sc}: {key}: predicted the vhost to crash")
            elif q.vhost in crashed_vhosts and any(v.crash == "vhost" for v in report.queues if v.vhost == q.vhost):
                continue  # a crashing vhost makes its other queues' deliveries a matter of timing
            elif got.get(key, 0) != q.predicted_after_restart:
                failures.append(
                    f"{sc}: {key}: predicted {q.predicted_after_restart}, the broker delivered {got.get(key)}"
                )
        predicted = {(q.vhost, q.queue) for q in report.queues}
        for key, n in got.items():  # queues without a dir of their own (never used) deliver nothing
            if key not in predicted and n != 0:
                failures.append(f"{sc}: {key}: delivered {n} from no queue dir")
        if any(q.crash for q in report.queues):
            if not any(f.code == "boot-crash" and f.severity == "error" for f in report.findings):
                failures.append(f"{sc}: predicts a crash without an error boot-crash finding")
            if report.exit_code != 4:
                failures.append(f"{sc}: predicts a crash, exit code {report.exit_code} (not 4)")
    assert not failures, "\n".join(failures)
