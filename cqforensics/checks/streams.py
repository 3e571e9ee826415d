"""Streams: the findings of a stream and its per-queue verdict (what the next boot keeps and a
consumer from ``first`` is served), from its read (``readers.osiris``) and its fate
(``model.recovery.stream_fate``)."""

from __future__ import annotations

from cqforensics.base.enums import Fate
from cqforensics.base.errors import display
from cqforensics.base.findings import Finding
from cqforensics.model.recovery import AMQP091_PREFETCH


def stream_findings(vs, e) -> list[Finding]:
    """Every finding about stream ``e`` (a ``model.vhost.StreamEntry``) listed by scan ``vs``:
    the reader's (file damage), and what the next boot and the consumers of the version lose."""
    node, vhost = _where(vs)
    where = dict(node=node, vhost=vhost, queue=e.label)
    out = [f.scoped(**where) for f in e.scan.findings]
    fate, model = e.fate, vs.node.model
    by_chunk, _ = fate.record_fates(e.scan.records)
    if fate.outcome != "ok" or fate.cut:
        lost = sum(
            1
            for r in e.scan.records
            if (r.chunk.file, r.chunk.pos) in by_chunk
            and by_chunk[(r.chunk.file, r.chunk.pos)] != Fate.STREAM_UNREACHED
        )
        out.append(
            Finding(
                "stream-boot-loss",
                f"{model.label}: {fate.why} ({lost} record(s))",
                display(e.path),
                None,
                details={"outcome": fate.outcome, "cut_chunks": len(fate.cut or []), "records": lost},
                **where,
            )
        )
    if fate.unreached:
        f0, p0, c0 = fate.unreached[0]
        out.append(
            Finding(
                "stream-not-served",
                f"{model.label}: {len(fate.unreached)} kept chunk(s) from chunk {c0} "
                "on are never reached by a reader from first (a gap in chunk ids before them)",
                display(f0),
                p0,
                details={
                    "protocol": "all",
                    "reason": Fate.STREAM_UNREACHED.label,
                    "first_chunk": c0,
                    "chunks": len(fate.unreached),
                },
                **where,
            )
        )
    read = fate.amqp091
    if fate.outcome == "ok":
        served = {(c.file, c.pos) for c in fate.served}
        reached = [r.offset for r in e.scan.records if (r.chunk.file, r.chunk.pos) in served]
        if read.skipped:
            out.append(
                Finding(
                    "stream-not-served",
                    f"{model.label}: {len(read.skipped)} record(s) of compressed "
                    "sub-batches are skipped by an AMQP 0-9-1 consumer (only a stream-protocol client "
                    "can decompress them)",
                    display(e.path),
                    None,
                    details={
                        "protocol": "amqp091",
                        "reason": Fate.STREAM_COMPRESSED_SKIPPED.label,
                        "first": min(read.skipped),
                        "count": len(read.skipped),
                    },
                    **where,
                )
            )
        if read.fails_at is not None:
            got = set(read.offsets) | read.skipped
            missed = [o for o in reached if o not in got]
            out.append(
                Finding(
                    "stream-not-served",
                    f"{model.label}: an AMQP 0-9-1 consumer's channel fails reading "
                    f"chunk {read.fails_at} ({read.why}); {len(missed)} record(s) from offset "
                    f"{missed[0] if missed else read.fails_at} on are never delivered to it (prefetch "
                    f"{AMQP091_PREFETCH})",
                    display(e.path),
                    None,
                    details={
                        "protocol": "amqp091",
                        "reason": Fate.STREAM_READ_FAILS.label,
                        "chunk_id": read.fails_at,
                        "first": missed[0] if missed else None,
                        "count": len(missed),
                    },
                    **where,
                )
            )
    return out


def stream_verdict(vs, e, verdict_type):
    """The per-queue verdict of stream ``e`` (``verdict_type``: ``checks.vhost.QueueVerdict``):
    its records, how many the next boot keeps and a reader from ``first`` reaches, the others
    by reason; ``crash`` is ``stream`` when the stream does not start."""
    node, vhost = _where(vs)
    by_chunk, _ = e.fate.record_fates(e.scan.records)
    v = verdict_type(node, vhost, e.label, recovery=vs.recovery, queue_type="stream")
    v.dirs = 1
    v.messages = len(e.scan.records)
    for r in e.scan.records:
        f = by_chunk.get((r.chunk.file, r.chunk.pos))
        if f is None:
            v.predicted_after_restart += 1
        else:
            v.drops[f.reason] = v.drops.get(f.reason, 0) + 1
    if e.fate.outcome == "fails":
        v.crash = "stream"
    v.predicted_min = v.predicted_max = v.predicted_after_restart  # no store behind a stream that could crash
    return v


def _where(vs) -> tuple[str, str | None]:
    node = display(vs.node.node.node)
    vhost = vs.vhost.name if vs.vhost.name is not None else vs.vhost.label
    return node, display(vhost)
