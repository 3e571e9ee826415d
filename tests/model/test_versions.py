"""The version model against the data: every sample's version is inferred as a range holding
the version that wrote it, fsck's next-boot prediction (made for that inferred version) equals
what the broker delivered, and the version table (model.versions.BEHAVIOURS) is what
BrokerModel answers, series by series."""

from __future__ import annotations

import pytest

from cqforensics.commands import fsck
from cqforensics.discovery import nodes as layout
from cqforensics.model import versions
from cqforensics.model.options import make_options
from cqforensics.model.vhost import NodeScan, feature_flags
from support import SAMPLES, dataset_params, manifest
from support.oracle import delivered_counts

#: the range each sample must be inferred as (the narrowest its evidence allows)
EXPECTED = {
    "3.10.8": "3.10 - 3.12",
    "3.12.14": "3.10 - 3.12",
    "3.13.7": "3.13",
    "4.0.5": "4.0",
    "4.1.8": "4.1 - 4.2",
    "4.2.2": "4.1 - 4.2",
    "4.3.6": "4.3.1 - 4.3.x",
}  # the quorum WAL name: 8 digits up to 4.0
#: samples with quorum queues: the machine version their logs' noop entries carry narrows it
EXPECTED_QUORUM = {"3.10.8": "3.10", "4.0.5": "4.0.3 - 4.0.x", "4.3.6": "4.3.1 - 4.3.x"}


def _expected(dataset: str) -> str:
    version = manifest(dataset)["broker"]["rabbitmq"]
    return (EXPECTED_QUORUM if "-quorum-" in dataset else EXPECTED)[version]


def _scan(dataset: str) -> NodeScan:
    return NodeScan(next(iter(layout.discover(SAMPLES / dataset))), make_options())


@pytest.mark.parametrize("dataset", dataset_params())
def test_inference_names_a_range_holding_the_true_version(dataset):
    version = manifest(dataset)["broker"]["rabbitmq"]
    r = _scan(dataset).version_range
    assert r.contains(version), f"{dataset}: inferred {r}"
    assert r.label == _expected(dataset), str(r)
    assert r.reasons and all(why for why in r.reasons)
    assert r.model.version <= r.high  # the prediction uses a version of the range


@pytest.mark.parametrize("dataset", dataset_params())
def test_fsck_predicts_what_the_broker_delivered(dataset):
    """Per queue, the inferred version's predicted deliveries equal the broker's, nothing
    crashes or hangs, and fsck shows the range it inferred."""
    m = manifest(dataset)
    report = fsck.run(SAMPLES / dataset, as_of=m["restarted_at_ms"])
    (node,) = report.nodes
    assert node.boot == "ok"
    assert node.written_by["label"] == _expected(dataset)
    assert node.version_source.startswith(f"inferred: written by {node.written_by['label']}: ")
    got = {}
    for q in report.queues:
        assert q.crash is None, q
        key = (q.vhost, q.queue)
        got[key] = got.get(key, 0) + q.predicted_after_restart
    want = delivered_counts(m)
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in want.items() if v}


@pytest.mark.parametrize("series", list(versions.SERIES))
def test_the_version_table_is_what_the_model_answers(series):
    model = versions.model(versions.SERIES[series])
    for name, (values, source) in versions.BEHAVIOURS.items():
        assert set(values) == set(versions.SERIES), name
        assert source, name
        assert getattr(model, name) == values[series], f"{series}: {name}"


def test_every_version_from_3_10_to_4_3_has_a_series():
    for v in ("3.10.0", "3.11.28", "3.12.14", "3.13.0", "3.13.7", "4.0.5", "4.1.8", "4.2.2", "4.3.6"):
        versions.model(v)  # inside the supported range
    assert list(versions.SERIES) == ["3.10", "3.11", "3.12", "3.13.0", "3.13.1+", "4.0", "4.1", "4.2", "4.3"]


def test_contradicting_evidence_is_left_out_and_said_so():
    # crafted: Khepri (3.13+) with #basic_message terms (up to 3.12): the metadata store wins
    r = versions.Evidence(khepri=True, basic_message=True).range()
    assert (r.low, r.high) == ((3, 13, 0), versions.NEWEST)
    assert any(why.startswith("ignored") for why in r.reasons)
    # no evidence at all: every version, predicted as the newest
    r = versions.Evidence().range()
    assert r.label == "3.10 - 4.3" and r.model.label == "4.3" and r.why == "no version evidence in the data"


def test_feature_flags_beside_the_node_dir_bound_the_version_from_below(tmp_path):
    node = tmp_path / "rabbit@h"
    node.mkdir()
    assert feature_flags(node) == ()
    (tmp_path / "rabbit@h-feature_flags").write_text("[khepri_db,\n 'rabbitmq_4.1.0', quorum_queue].\n")
    assert feature_flags(node) == ("khepri_db", "rabbitmq_4.1.0", "quorum_queue")
    r = versions.Evidence(feature_flags=feature_flags(node), mnesia=True).range()
    assert r.label == "4.1 - 4.2"
