"""``base.heap.command``: full collections come less often during a command, and the process's
own collector settings are back as they were after it (the API runs in its caller's process)."""

from __future__ import annotations

import gc

import pytest

import cqforensics
from cqforensics.base import heap
from cqforensics.base.errors import OperationalError
from support import SAMPLES


def test_a_command_spaces_full_collections_and_restores_the_threshold():
    before = gc.get_threshold()
    with heap.command():
        assert gc.get_threshold()[2] == max(heap.COMMAND_FULL_AFTER, before[2])
        assert gc.get_threshold()[:2] == before[:2]  # the young generations as usual
        with heap.command():  # nested (read_table inside a command)
            assert gc.get_threshold()[2] == max(heap.COMMAND_FULL_AFTER, before[2])
        assert gc.get_threshold()[2] == max(heap.COMMAND_FULL_AFTER, before[2])
    assert gc.get_threshold() == before


def test_read_table_leaves_its_callers_collector_as_it_was(tmp_path):
    before = gc.get_threshold()
    assert cqforensics.read_table(SAMPLES / "4.3.6-kill" / "mnesia", "queues").num_rows
    assert gc.get_threshold() == before
    with pytest.raises(OperationalError):  # and when it raises
        cqforensics.read_table(tmp_path, "queues")
    assert gc.get_threshold() == before
