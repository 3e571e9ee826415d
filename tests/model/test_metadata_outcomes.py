"""Mnesia commits of the presume-abort protocol count only with their logged outcome.

A durable queue declaration is such a transaction on 3.10.8 and 4.0.5: Mnesia appends its
``#commit{}`` to LATEST.LOG, then a separate ``#decision{outcome = committed}``, both through
disk_log's write cache. A kill -9 between the two
flushes left real 4.0.5 nodes with the commit alone, and their next boot answered NOT_FOUND for
the queue (tests/real_brokers/test_brokers.py::test_declaration_without_its_outcome_is_not_recovered boots such
a file). The cases here are crafted from the kill -9 samples: the declaration's outcome item is
cut out of LATEST.LOG, as that kill leaves it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cqforensics.readers.metadata import read_metadata
from cqforensics.readers.terms import read_disk_log
from support import copy_node


def drop_declaration_outcome(node: Path) -> tuple[bytes, bytes]:
    """Cut out of ``node``'s LATEST.LOG the ``committed`` outcome of the last durable queue
    declaration it logs; returns that queue's (vhost, name)."""
    path = node / "LATEST.LOG"
    data = path.read_bytes()
    log = read_disk_log(path, data)
    assert log.error is None, log.error
    ends = log.offsets[1:] + [len(data)]
    for i in reversed(range(len(log.items))):
        item = log.items[i]
        if not (isinstance(item, tuple) and item[0] == "commit" and isinstance(item[2], tuple)):
            continue  # not a presume-abort commit (those carry a #decision{})
        for op in item[4]:  # disc_copies ops: {{Tab, Key}, Record, Op}
            if op[0][0] == "rabbit_durable_queue" and op[2] == "write":
                tid = item[2][1]
                j = next(
                    j
                    for j in range(i + 1, len(log.items))
                    if isinstance(log.items[j], tuple) and log.items[j][0] == "decision" and log.items[j][1] == tid
                )
                path.write_bytes(data[: log.offsets[j]] + data[ends[j] :])
                resource = op[1][1]
                return resource[1], resource[3]
    raise AssertionError(f"{path}: no durable queue declaration with a logged outcome")


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
