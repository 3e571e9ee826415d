"""``--deep``: decode every stored message the index holds (the broker never does at boot).

Whatever a ``messages`` row marks is a finding here, with the stored term's file and offset: a
term that does not decode (``msg-corrupt``, ``qs-entry-undecodable``, as the row's
``decode_error``), a message id other than the index's, and the values the row shows as null
(``value-out-of-range``: of another kind than the broker writes, or past their column's range;
``schema.value_marks``, the rule the row's ``decode_error`` is written by). Only ``--deep``
makes these: without it no message term is decoded."""

from __future__ import annotations

from cqforensics.base.enums import Location
from cqforensics.base.errors import plural
from cqforensics.base.findings import Finding
from cqforensics.base.schema import value_marks
from cqforensics.message import fast as fastpath
from cqforensics.model.index import IndexChunk
from cqforensics.model.recovery import Resolved
from cqforensics.model.vhost import VhostScan

#: stored formats whose index size field is the body's size (AMQP 1.0's counts its sections)
_SIZE_IS_BODY = frozenset({"basic_message", "mc_amqpl", "mc_mqtt"})


def decode_checks(vs: VhostScan, qx: IndexChunk, res: Resolved) -> list[Finding]:
    """--deep: decode every stored message the index holds (the broker never does at boot)."""
    out = []
    r = qx.rec
    has_id = qx.index_ids(qx.live)  # the entries whose index holds the message id (the row compares it too)
    durable = vs.queue_known(qx.qdir) is True

    def at_index(code: str, text: str, i: int, j: int, f: int, **details) -> Finding:
        """A finding about index entry ``i`` (its file and offset), naming the stored term too."""
        where = {"store_file": str(res.body_files[f]), "store_offset": int(res.store_offset[j])}
        file = str(qx.files[int(r.file[i])]) if qx.files else None
        return Finding(
            code,
            text,
            file,
            int(r.offset[i]),
            queue=qx.qdir.name,
            priority=qx.qdir.priority,
            details={"seq_id": int(r.seq[i]), **details, **where},
        )

    def at_term(code: str, text: str, i: int, j: int, f: int, **details) -> Finding:
        """A finding about the stored term of index entry ``i`` (the term's file and offset)."""
        return Finding(
            code,
            text,
            str(res.body_files[f]),
            int(res.store_offset[j]),
            queue=qx.qdir.name,
            priority=qx.qdir.priority,
            details={"seq_id": int(r.seq[i]), **details},
        )

    for j, i in enumerate(qx.live.tolist()):
        f = int(res.body_file[j])
        if f < 0:
            continue
        start = int(res.body_start[j])
        raw = vs.bodies.read(res.body_files[f], start, int(res.body_len[j]))
        marked = None
        try:
            msg = fastpath.decode(raw)
            bad = None
            if has_id[j] and msg["msg_id"] is not None and msg["msg_id"] != r.msg_id[i].tobytes():
                bad = "the stored term's message id differs from the index's"
            marked = value_marks(msg)
            if (
                durable
                and bad is None
                and msg["persistent"] is not None
                and msg["persistent"] != (r.persistent[i] == 1)
            ):
                # a durable queue's index flag is its message's own persistence (IsPersistent)
                text = (
                    f"the index marks the message {'persistent' if r.persistent[i] == 1 else 'transient'}, "
                    f"its stored term says it is {'persistent' if msg['persistent'] else 'transient'}: "
                    "one of the two was flipped (the next boot goes by the index)"
                )
                out.append(at_index("persistence-mismatch", text, i, j, f))
        except Exception as e:  # any failure to decode is the finding
            bad = f"{type(e).__name__}: {e}"
        if bad is None and msg.get("term_format") in _SIZE_IS_BODY and len(msg["body"]) != int(r.size[i]):
            # the index records the body's size at publish (the stats it recovers): checked on
            # every sample, equal for these formats; a disagreement is a damaged index entry
            text = (
                f"the index records a {int(r.size[i])}-byte message, its stored body has "
                f"{plural(len(msg['body']), 'byte')}: the index entry's size field is damaged (or the body)"
            )
            out.append(
                at_index("index-size-mismatch", text, i, j, f, index_size=int(r.size[i]), body_size=len(msg["body"]))
            )
        if marked:
            text = f"the stored message shows values as null: {marked}"
            out.append(at_term("value-out-of-range", text, i, j, f, values=marked))
        if bad:
            code = "qs-entry-undecodable" if r.loc[i] == Location.QUEUE_STORE else "msg-corrupt"
            out.append(at_term(code, bad[:300], i, j, f))
    return out
