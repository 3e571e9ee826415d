"""cqforensics.base.enums and cqforensics.model: the codes, the options path and the one recovery model.

The end-to-end proof of the recovery model is test_predict_brokers.py (real brokers booted on
the samples); these tests pin its rules one by one, on small crafted inputs labelled as such.
"""

from __future__ import annotations

import numpy as np
import pytest

import cqforensics
from cqforensics.base.enums import FATE_LABELS, Fate, Location, QsStatus, RecordKind, StoreStatus, labels
from cqforensics.base.errors import UsageError
from cqforensics.model import recovery, versions
from cqforensics.model.options import DECODED_COLUMNS, Options, make_options, needs, parse_as_of
from support import SAMPLES

# -- codes -----------------------------------------------------------------------------------------


def test_code_labels_are_the_public_spellings():
    assert labels(Location) == ("memory", "shared_store", "queue_store", "embedded")
    assert labels(RecordKind) == ("publish", "deliver", "ack", "ghost", "bad")
    assert labels(StoreStatus) == ("live", "orphan", "duplicate", "corrupt")
    assert FATE_LABELS[0] == "delivered" and Fate.DELIVERED.reason is None
    assert Fate.BODY_UNREACHABLE.reason == "body_unreachable"
    assert QsStatus.BAD_CRC.label == "bad_crc"


def test_codes_of_different_families_are_different_types():
    # the collision that used to exist: readers.qi BAD = 3 and scan GHOST = 3
    from cqforensics.base.enums import SlotClass

    assert SlotClass.BAD == 3 and RecordKind.GHOST == 3
    assert type(SlotClass.BAD) is not type(RecordKind.GHOST)


# -- options ---------------------------------------------------------------------------------------


def test_options_are_built_and_validated_in_one_place():
    o = make_options(broker_version="4.0", as_of="2026-01-01T00:00:00Z")
    assert isinstance(o, Options) and o.as_of_ms == 1767225600000
    with pytest.raises(AttributeError):  # dataclasses.FrozenInstanceError
        o.bodies = False  # frozen: what was validated cannot change afterwards
    for bad in (
        {"broker_version": "5.0"},
        {"batch_rows": 0},
        {"batch_rows": True},
        {"as_of": "yesterday"},
        {"as_of": 10**17},
    ):
        with pytest.raises(UsageError):
            make_options(**bad)


@pytest.mark.parametrize(
    "value",
    [1767225600000, "1767225600000", "2026-01-01T00:00:00Z", "2026-01-01T00:00:00", "2026-01-01T01:00:00+01:00"],
)
def test_every_spelling_of_a_time_is_parsed_alike(value):
    assert parse_as_of(value) == 1767225600000


def test_a_projection_decides_what_is_read():
    assert needs("messages", None) == {}
    assert needs("messages", ["queue", "seq_id"]) == {"bodies": False, "decode": False}
    assert needs("messages", ["queue", "headers"]) == {"bodies": False}
    assert needs("store", ["file"]) == {"bodies": False}
    assert "body" in DECODED_COLUMNS and "queue" not in DECODED_COLUMNS


# -- versions ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version,sequential,last_copy,mc,v1,takes_vhost",
    [
        ("3.10", True, True, False, True, True),
        ("3.12", True, True, False, True, True),
        ("3.13.0", True, False, True, True, False),
        ("3.13.1", False, False, True, True, False),
        ("4.0", False, False, True, True, False),
        ("4.3", False, False, True, False, False),
    ],
)
def test_version_behaviour_is_asked_of_the_model(version, sequential, last_copy, mc, v1, takes_vhost):
    m = versions.model(version)
    assert (m.sequential_scan, m.last_copy_wins, m.stores_mc, m.reads_v1, m.store_serves_current_file_reads) == (
        sequential,
        last_copy,
        mc,
        v1,
        takes_vhost,
    )


# -- recovery: the rules, one by one (crafted arrays, labelled as such) -----------------------------


def test_claims_first_copy_from_3_13_and_last_copy_in_a_file_up_to_3_12():
    # crafted: one id stored twice in file 0 (offsets 0 and 100), once in file 1
    e_file = np.array([0, 0, 1])
    e_offset = np.array([0, 100, 0])
    group = np.array([0, 0, 0])
    reach = np.ones(3, bool)
    # walk order is (file, offset): the first reachable copy is the one used
    assert recovery.claims(e_file, e_offset, reach, group, 1, versions.model("4.3")).tolist() == [0]
    # unreachable copies are never claimed
    reach = np.array([False, True, True])
    assert recovery.claims(e_file, e_offset, reach, group, 1, versions.model("4.3")).tolist() == [1]
    # <= 3.12 folds a file's candidates in reverse: the last copy of the first file holding it
    assert recovery.claims(e_file, e_offset, np.ones(3, bool), group, 1, versions.model("3.10")).tolist() == [1]
    assert recovery.claims(e_file, e_offset, np.zeros(3, bool), group, 1, versions.model("4.3")).tolist() == [-1]


def test_what_no_boot_delivers():
    assert recovery.intrinsic_fate(0, Location.SHARED_STORE) == Fate.TRANSIENT
    assert recovery.intrinsic_fate(1, Location.MEMORY) == Fate.NOT_ON_DISK
    assert recovery.intrinsic_fate(1, Location.NONE) == Fate.BAD_LOCATION
    for loc in (Location.SHARED_STORE, Location.QUEUE_STORE, Location.EMBEDDED):
        assert recovery.intrinsic_fate(1, loc) is None


def test_every_fate_has_one_writer_rule_and_one_finding():
    fates = set(Fate)
    salvage, quarantine = recovery.SALVAGEABLE, recovery.QUARANTINED
    assert not salvage & quarantine
    assert recovery.BY_DESIGN <= quarantine and recovery.KEPT_AS_IS <= salvage
    lost_outright = fates - salvage - quarantine  # no bytes worth keeping: reported lost
    assert lost_outright == {
        Fate.NOT_ON_DISK,
        Fate.BAD_LOCATION,
        Fate.BODY_MISSING,
        Fate.QS_MISSING_FILE,
        Fate.QS_BAD_HEADER,
        Fate.QS_OUT_OF_RANGE,
    }
    assert set(recovery.FINDING_OF_FATE) == fates - recovery.KEPT_AS_IS
    from cqforensics.base.findings import CODES

    assert set(recovery.FINDING_OF_FATE.values()) <= set(CODES)


@pytest.mark.parametrize("dataset", ["3.10.8-clean", "3.10.8-kill", "4.3.6-clean", "4.3.6-kill"])
def test_recovery_mode_follows_the_shutdown_files(dataset):
    from cqforensics.discovery import nodes as layout
    from cqforensics.model.vhost import NodeScan

    ns = NodeScan(next(iter(layout.discover(SAMPLES / dataset))), make_options())
    modes = {vs.recovery for vs in ns.vhosts}
    assert modes == ({"clean"} if dataset.endswith("clean") else {"dirty"})
    dirty = NodeScan(ns.node, make_options(assume_dirty=True))
    assert {vs.recovery for vs in dirty.vhosts} == {"dirty"}


def test_the_tables_and_fsck_agree_with_the_recovery_model():
    """drop_reason of every message is exactly what model.recovery.resolve decided."""
    t = cqforensics.read_table(SAMPLES / "3.10.8-kill", "messages", columns=["survives_restart", "drop_reason"])
    rows = t.to_pylist()
    assert rows and all(r["survives_restart"] == (r["drop_reason"] is None) for r in rows)
    assert {r["drop_reason"] for r in rows} <= set(FATE_LABELS[1:]) | {None}


def test_the_fate_rules_select_as_np_select_does():
    """recovery.first_of, which applies only the rules that hold somewhere, is np.select
    (crafted random conditions, choices scalar and per row)."""
    rng = np.random.default_rng(7)
    for n in (0, 1, 5, 300):
        for density in (0.0, 0.01, 0.5):
            conds = [rng.random(n) < density for _ in range(6)]
            choices = [3, rng.integers(-1, 20, n).astype(np.int8), 5, 0, rng.integers(0, 9, n).astype(np.int8), 11]
            want = np.select(conds, choices, 2).astype(np.int8)
            assert recovery.first_of(conds, choices, 2, n).tolist() == want.tolist()
