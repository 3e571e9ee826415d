"""The cyclic garbage collector paused while a long-lived object graph is built.

A node of 20,000 queue dirs is listed into some 400,000 objects (a ``QueueDir``, its lists,
paths and names each) and its Khepri metadata decoded into as many again, all kept for the
whole command and none of them garbage. Each of CPython's full collections traverses every
tracked object alive, and they come the more often the more objects are made: measured on
such a node, a third of the cost of listing it. ``building()`` pauses the collector for the
span of such a build (reference counting still frees everything as usual; a cycle made there
is collected at the next collection after it) and restores it as it was: nesting, and from
several threads, it resumes once the last build ends, and only when it ran before the first.
Use it only around work whose memory is bounded by its result (a listing, the metadata), not
around a pass over data of any size.
"""

from __future__ import annotations

import contextlib
import gc
import threading

_lock = threading.Lock()
_depth = 0
_resume = False  # whether the collector ran when the outermost build began


@contextlib.contextmanager
def building():
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()


#: full collections come after this many collections of the middle generation during a command
#: (CPython's default is 10)
COMMAND_FULL_AFTER = 100
_command_depth = 0
_saved_threshold: tuple[int, ...] | None = None


@contextlib.contextmanager
def command():
    """The span of one command (the CLI's, or one ``read_table``): the collector's full
    collections, each a traversal of every object alive, come ten times less often
    (``COMMAND_FULL_AFTER``) and the threshold is restored after. The young generations are
    collected as usual, so the cycles a command makes and drops are still freed as it goes; only
    those that live long enough to reach the oldest generation wait longer. Measured on a node of
    20,000 queue dirs: the listing, metadata and verdicts, kept for the whole command, were
    traversed by 4 full collections (about 1 CPU s of ``fsck``'s 6); a few tens of MB more at the
    peak."""
    global _command_depth, _saved_threshold
    with _lock:
        if _command_depth == 0:
            _saved_threshold = gc.get_threshold()
            young, middle, _ = _saved_threshold
            gc.set_threshold(young, middle, max(COMMAND_FULL_AFTER, _saved_threshold[2]))
        _command_depth += 1
    try:
        yield
    finally:
        with _lock:
            _command_depth -= 1
            if _command_depth == 0 and _saved_threshold is not None:
                gc.set_threshold(*_saved_threshold)
