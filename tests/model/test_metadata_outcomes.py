"""Mnesia commits of the presume-abort protocol count only with their logged outcome.

A durable queue declaration is such a transaction on 3.10.8 and 4.0.5: Mnesia appends its
``#commit{}`` to LATEST.LOG, then a separate ``#decision{outcome = committed}``, both through
disk_log's write cache. A kill -9 between the two
flushes left real 4.0.5 nodes with the commit alone, and their next boot answered NOT_FOUND for
the queue (tests/real_brokers/test_brokers.py::test_declaration_without_its_outcome_is_not_recovered boots such
a file). The cases here are crafted from the kill -9 samples: the declaration's outcome item is
cut out of LATEST.LOG, as that kill leaves it."""

from __future__ import annotations

import pytest

from cqforensics.readers.metadata import read_metadata
from support import copy_node
from support.damage import drop_declaration_outcome


@pytest.mark.parametrize("dataset", ["4.0.5-kill", "3.10.8-kill"])
def test_declaration_without_its_outcome_is_not_a_durable_queue(dataset, tmp_path):
    node = copy_node(dataset, tmp_path / "mnesia")
    before = read_metadata(node)
    vhost, name = drop_declaration_outcome(node)
    assert before.knows(vhost, name) is True
    after = read_metadata(node)
    assert after.knows(vhost, name) is False
    assert set(after.queues) == set(before.queues) - {(vhost, name)}  # every other transaction still counts
    assert any("without its logged outcome" in n for n in after.notes), after.notes
