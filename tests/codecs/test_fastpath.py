"""The fast decoding path gives exactly what the generic normaliser gives, on every sample term."""

from cqforensics.base.errors import FormatError
from cqforensics.message import fast as fastpath
from cqforensics.message import reference as message
from support.terms import stored_terms


def test_fast_path_equals_generic_on_every_sample_term():
    fast_hits = 0
    for path, offset, raw in stored_terms():
        try:
            slow = message.decode_stored(raw)
        except FormatError:
            continue
        assert fastpath.decode(raw) == slow, f"{path}@{offset}"
        lay = fastpath._LAYOUTS
        fast_hits += any(bytes(raw).startswith(layout["mc"]) or bytes(raw).startswith(layout["bm"]) for layout in lay)
    assert fast_hits > 300
