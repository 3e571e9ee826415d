"""Audits as queries over the tables (the same ones Spark users run in SQL): orphaned messages
and their bytes, the queues the orphans would have reached, duplicates by message id and by content across queues, reference counts
against a clean shutdown's recorded index, live vs garbage bytes per file and what compaction
would reclaim.

Every row names its node, so a fleet's audit tells the nodes apart, and the audit can be
narrowed to vhosts and queues (names that match nothing are a usage error, as everywhere).
Reference counts are judged by fsck's model: a problem is what fsck reports as one (a persistent
message's body in no store file: ``msg-missing``; a recorded count the indexes contradict:
``refcount-mismatch``). A transient message whose body is not on disk is none: the broker
deletes the transient store at every boot and drops transient messages whatever (after a kill
-9 their bodies were never written); those are counted apart.

Streams: their records are in the duplicate groups (a message routed to a classic queue and
to streams is one stored copy per stream: such a group is a ``fan-out (a copy per stream)``),
and ``streams`` sums each stream (records, kept by the next boot, served to an AMQP 0-9-1
consumer, offsets). Orphans, reference counts, files and compaction are the shared store's and
the ``.qs`` files': stream files have none of them (osiris retention deletes whole segments,
nothing is left to compact). ``covers`` says so in the output."""

from __future__ import annotations

import hashlib
from collections import defaultdict

from cqforensics.base.errors import display
from cqforensics.model.options import make_options
from cqforensics.read import driver
from cqforensics.read.api import iter_batches

#: the tables an audit reads, each once (a progress display counts them as passes)
TABLES = ("store", "messages", "refcounts", "files")


def _rows(paths, table, columns, **kw):
    for b in iter_batches(paths, table, columns=columns, **kw):
        yield from b.to_pylist()


def audit(paths, vhosts=None, queues=None, progress=None, **options) -> dict:
    """The audit document (``cqforensics-audit/1``) of every node dir under ``paths``, narrowed
    to ``vhosts`` and ``queues`` (names; None: all). With ``queues``, what belongs to no queue is
    left out but for the orphans whose exchange and routing keys reach one of them, and the
    files are those queues' ``.qs`` files. ``progress``: a display ``(text, done, total)``. The
    four tables are read over the same node scans (listed and their metadata read once)."""
    want_v, want_q = driver.names(vhosts, "vhosts"), driver.names(queues, "queues")
    nodes = driver.discovered(
        paths,
        make_options(**{k: v for k, v in options.items() if k == "broker_version"}, bodies=False, decode=False),
        want_v,
        want_q,
    )
    paths = driver.Nodes(nodes)
    progress = driver.Progress.of(progress, passes=len(TABLES))
    kw = {**options, "vhosts": vhosts, "progress": progress}
    orphans = defaultdict(lambda: {"entries": 0, "bytes": 0})
    # orphans by the queues their exchange and routing keys reach under the metadata's bindings
    # (the store table's routes_to): where a lost queue's messages went, and what rebuild
    # --restore-orphans would give back
    routed = defaultdict(lambda: {"entries": 0, "bytes": 0})
    for r in _rows(paths, "store", ["node", "vhost", "store", "file", "total_size", "status", "routes_to"], **kw):
        dest = r["routes_to"]
        if want_q is not None and not (dest and want_q & set(dest)):
            continue
        if r["status"] in ("orphan", "duplicate", "corrupt"):
            o = orphans[(r["node"], r["vhost"], r["file"], r["status"])]
            o["entries"] += 1
            o["bytes"] += r["total_size"]
        if r["status"] == "orphan":
            for q in dest if dest else [None if dest is None else ""]:
                if want_q is not None and q not in want_q:
                    continue
                g = routed[(r["node"], r["vhost"], q)]
                g["entries"] += 1
                g["bytes"] += r["total_size"]
    by_message_id = defaultdict(list)
    by_content = defaultdict(list)
    streams = {}
    for r in _rows(
        paths,
        "messages",
        [
            "node",
            "vhost",
            "queue",
            "priority",
            "seq_id",
            "msg_id",
            "properties",
            "body",
            "store_file",
            "store_offset",
            "survives_restart",
            "queue_type",
            "stream_offset",
            "amqp091_drop_reason",
            "raft_index",
        ],
        queues=queues,
        **kw,
    ):
        # a quorum queue's message: its raft index (no seq_id), stored in its log entry (WAL or segment)
        where = {
            "node": r["node"],
            "vhost": r["vhost"],
            "queue": r["queue"],
            "seq_id": r["seq_id"],
            "store_file": r["store_file"],
            "store_offset": r["store_offset"] if r["store_file"] else None,
        }
        if r["queue_type"] == "quorum":
            where.update(queue_type="quorum", raft_index=r["raft_index"])
        if r["queue_type"] == "stream":
            where["stream_offset"] = r["stream_offset"]
            st = streams.setdefault(
                (r["node"], r["vhost"], r["queue"]),
                {"records": 0, "kept": 0, "served_amqp091": 0, "first_offset": None, "last_offset": None},
            )
            st["records"] += 1
            st["kept"] += bool(r["survives_restart"])
            st["served_amqp091"] += r["amqp091_drop_reason"] is None
            st["first_offset"] = r["stream_offset"] if st["first_offset"] is None else st["first_offset"]
            st["last_offset"] = r["stream_offset"]
        mid = (r["properties"] or {}).get("message_id")
        if mid:
            by_message_id[(r["node"], r["vhost"], mid)].append(where)
        if r["body"] is not None:
            by_content[(r["node"], r["vhost"], hashlib.sha256(r["body"]).hexdigest())].append(where)

    def groups(d: dict, label: str) -> list[dict]:
        out = []
        for (node, vhost, key), members in sorted(d.items(), key=lambda kv: (-len(kv[1]), str(kv[0]))):
            if len(members) < 2:
                continue
            stored = {(m["store_file"], m["store_offset"]) if m["store_file"] else None for m in members}
            in_streams = [m for m in members if "stream_offset" in m]
            queues = sorted({str(m["queue"]) for m in members})
            # one stored entry referenced from several queues is a fan-out, not a duplicate; a
            # stream keeps a copy of its own of every message routed to it
            kind = (
                "fan-out (one stored message)"
                if len(stored) == 1 and None not in stored
                else "fan-out (a copy per stream)"
                if in_streams
                and len(queues) == len(members)
                and len({(m["store_file"], m["store_offset"]) for m in members if "stream_offset" not in m}) <= 1
                else "separately stored copies"
            )
            out.append(
                {
                    "node": node,
                    "vhost": vhost,
                    label: key,
                    "copies": len(members),
                    "queues": queues,
                    "kind": kind,
                    "where": members,
                }
            )
        return out

    refs, transient = [], defaultdict(int)
    for r in _rows(
        paths,
        "refcounts",
        ["node", "vhost", "store", "msg_id", "copies", "computed_refs", "recorded_refs", "status", "file", "queues"],
        **kw,
    ):
        if r["status"] not in ("mismatch", "missing") or want_q is not None and not want_q & set(r["queues"] or ()):
            continue
        if r["store"] == "persistent":
            refs.append({k: v for k, v in r.items() if k != "queues"})
        elif r["status"] == "missing":  # a transient message's body: dropped at boot whatever (fsck: no error)
            transient[(r["node"], r["vhost"])] += 1
    files = [
        r
        for r in _rows(
            paths,
            "files",
            ["node", "vhost", "queue", "file", "kind", "size", "live_bytes", "garbage_bytes", "garbage_ratio"],
            queues=queues,
            **kw,
        )
        if r["kind"] == "qs" or r["kind"] == "rdq" and want_q is None
    ]
    if want_q is not None:
        files = [r for r in files if r["queue"] in want_q]
    reclaim = sum(r["garbage_bytes"] or 0 for r in files)
    total = sum(r["size"] or 0 for r in files)
    return {
        "format": "cqforensics-audit/1",
        "nodes": [
            {
                "node": display(ns.node.node),
                "path": display(ns.node.path),
                "not_read": [u.to_dict() for u in ns.unread_storage],
            }
            for ns in nodes
        ],
        "filters": {
            "vhosts": sorted(want_v) if want_v is not None else None,
            "queues": sorted(want_q) if want_q is not None else None,
        },
        "orphans": [
            {"node": k[0], "vhost": k[1], "file": k[2], "status": k[3], **v} for k, v in sorted(orphans.items())
        ],
        # queue: a queue name; "" routed to no queue; None not known (undecodable, unknown exchange)
        "orphans_by_queue": [
            {"node": k[0], "vhost": k[1], "queue": k[2], **v}
            for k, v in sorted(routed.items(), key=lambda kv: tuple(map(str, kv[0])))
        ],
        "duplicates_by_message_id": groups(by_message_id, "message_id"),
        "duplicates_by_content": groups(by_content, "body_sha256"),
        "refcount_problems": [{**r, "msg_id": r["msg_id"].hex()} for r in refs],
        "transient_bodies_missing": [{"node": k[0], "vhost": k[1], "entries": n} for k, n in sorted(transient.items())],
        "files": files,
        "compaction": {
            "store_bytes": total,
            "reclaimable_bytes": reclaim,
            "reclaimable_ratio": reclaim / total if total else 0.0,
        },
        "streams": [{"node": k[0], "vhost": k[1], "queue": k[2], **v} for k, v in sorted(streams.items())],
        "covers": {
            "streams": "stream records are in duplicates_by_message_id/by_content and in streams; orphans, "
            "refcounts, files and compaction are the shared store's and .qs files' (streams have "
            "none: osiris retention deletes whole segments)"
        },
    }
