"""``cqforensics republish``: send recovered messages to a running broker, resumably.

Sources: a node dir (or mnesia base, or folder of backups: the ``export`` rows), an export
(``DIR`` holding ``messages.jsonl``/``messages.parquet``, or the file itself) or a rebuild's
``lost+found`` (its ``lost+found.jsonl``; bodies come from ``raw/*.etf``).

What is sent (one rule, ``select``): by default what survived, i.e. what the next boot of the
broker would deliver (index rows with ``survives_restart``); ``only_dropped`` sends instead what
the next boot would drop but whose bytes are whole (transient, expired, queue_deleted, ...). A
lost+found holds only what a rebuild could not write: all of it is sent except ``orphan``
(acked) and ``duplicate`` (a second copy) items.

How a message is sent (``plan``): messages are grouped by (vhost, msg_id, body sha256): a
message that reached several queues (a fan-out: one stored message, several queue entries) is
one group. Each selected copy targets its queue, renamed by the queue map. A copy whose queue is
mapped goes to the default exchange with the new queue name as routing key. The unmapped copies
of a group go through their original exchange with their original routing key (one publish for
all of them) when that exchange routes the message to exactly those queues; otherwise (some
copies were acked or filtered out, so the exchange would reach queues that should not get it
again) each goes to the default exchange with its queue name as routing key. Where the message
was routed is told by the source's metadata (node dirs; ``topology`` for exports); without it
the exchange is assumed to route to exactly the queues that held the message. Publishes are
``mandatory`` and confirmed; the default exchange is the original one for messages published
to it.

Stream records (``source`` ``stream``, a node dir's rows of ``queue_type`` ``stream``) are
selected by the same rule (``survives_restart``: the next boot keeps them and a consumer from
``first`` is served them) and sent over AMQP 0-9-1 as a 0-9-1 consumer of the version receives
them (properties, typed headers, body), to the stream itself or, with ``--map``, to any queue:
a stream record has no message id, so each copy is its own publish (through its original
exchange when that routes it to exactly its stream, else by queue name). The stream offset is
not kept (a stream gives new offsets); sections AMQP 0-9-1 cannot carry are lost on the way.

AMQP 1.0 messages (``term_format`` ``mc_amqp*``) are sent over AMQP 1.0 (RabbitMQ 4.x, v2
addresses ``/exchanges/X/K`` and ``/queues/Q``) with their properties, application properties,
message annotations and body section; to a 3.x broker they are not sent (reported).

The journal (JSON lines, each fsynced) makes a replay resumable without loss or duplicates. Every
publish is written as an ``intent`` (its keys, one per target queue: vhost, queue, msg_id, body
sha256; and the depth of each target queue) before it is sent, and as ``ok`` once the broker
confirmed it. One publish is in flight at a time, so after a kill at most one intent is in
doubt; a rerun resolves it by the target queues' depths: all one deeper than recorded -> it
arrived (``ok``), all as recorded -> it did not (sent again). Anything else (someone else
published to or consumed from those queues meanwhile) stops the rerun unless ``in_doubt`` says
``send`` or ``skip``.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import logging
import os
import re
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cqforensics.base.errors import OperationalError, UsageError, queue_ref
from cqforensics.codecs import amqp091

log = logging.getLogger("cqforensics.commands.republish")

#: lost+found reasons never replayed: acked messages and second copies
LOST_FOUND_SKIP = ("orphan", "duplicate")


# -- reading the sources ------------------------------------------------------------------------


def _ts_seconds(v) -> int | None:
    if v is None:
        return None
    if isinstance(v, dt.datetime):
        return int(v.timestamp())
    if isinstance(v, str):
        return int(dt.datetime.fromisoformat(v).timestamp())
    return int(v)


def _norm(row: dict) -> dict:
    """An export/table row (Arrow or JSON line) -> one normal form: msg_id hex, headers and
    annotations as objects, body bytes, timestamp in epoch seconds."""
    r = dict(row)
    if "body_base64" in r:
        b64 = r.pop("body_base64")
        r["body"] = None if b64 is None else base64.b64decode(b64)
    mid = r.get("msg_id")
    if isinstance(mid, (bytes, bytearray)):
        r["msg_id"] = bytes(mid).hex()
    for k in ("headers", "annotations"):
        if isinstance(r.get(k), str):
            r[k] = json.loads(r[k])
    props = dict(r.get("properties") or {})
    props["timestamp"] = _ts_seconds(props.get("timestamp"))
    r["properties"] = props
    r.setdefault("source", "stream" if r.get("queue_type") == "stream" else "index")
    return r


def _lost_found_rows(lf: Path) -> Iterator[dict]:
    from cqforensics.message import fast as fastpath

    with open(lf / "lost+found.jsonl", encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            item = json.loads(line)
            if item.get("reason") in LOST_FOUND_SKIP or not item.get("raw"):
                continue
            try:
                m = fastpath.decode((lf / item["raw"]).read_bytes())
            except Exception as e:  # damaged bytes are why many items are there
                log.warning("lost+found item %s: not decodable (%s); not sent", item.get("item"), e)
                continue
            yield _norm(
                {
                    "node": item.get("node"),
                    "vhost": item.get("vhost"),
                    "queue": item.get("queue"),
                    "msg_id": m["msg_id"],
                    "exchange": m["exchange"],
                    "routing_keys": m["routing_keys"],
                    "properties": m["properties"],
                    "headers": m["headers"],
                    "annotations": m.get("annotations"),
                    "body": m["body"],
                    "term_format": m["term_format"],
                    "survives_restart": False,
                    "drop_reason": item.get("reason"),
                    "source": "lost+found",
                    "seq_id": item.get("seq_id"),
                }
            )


def source_kind(path: Path) -> tuple[str, Path]:
    """(kind, file): jsonl, parquet (an export), lost+found, or node (anything else: read it)."""
    if path.is_file():
        if path.name == "lost+found.jsonl":
            return "lost+found", path.parent
        if path.suffix == ".parquet":
            return "parquet", path
        if path.suffix == ".jsonl":
            return "jsonl", path
        raise UsageError(f"{path}: not an export (messages.jsonl or messages.parquet) nor a lost+found.jsonl")
    if path.is_dir():
        if (path / "lost+found.jsonl").is_file():
            return "lost+found", path
        if (path / "lost+found" / "lost+found.jsonl").is_file() and not (path / "msg_stores").exists():
            return "lost+found", path / "lost+found"
        for name, kind in (("messages.parquet", "parquet"), ("messages.jsonl", "jsonl")):
            if (path / name).is_file():
                return kind, path / name
        return "node", path
    raise OperationalError(f"{path}: no such file or directory")


def read_rows(paths: Iterable, **options) -> Iterator[dict]:
    """Every row of the sources, in normal form (see ``_norm``), in table order."""
    nodes = []
    for p in paths:
        kind, f = source_kind(Path(p))
        if kind == "node":
            nodes.append(str(p))
        elif kind == "jsonl":
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    if line.strip():
                        yield _norm(json.loads(line))
        elif kind == "parquet":
            import pyarrow.parquet as pq

            for b in pq.ParquetFile(f).iter_batches(batch_size=4096):
                for row in b.to_pylist():
                    yield _norm(row)
        else:
            yield from _lost_found_rows(f)
    if nodes:
        from cqforensics.read.api import iter_batches

        for b in iter_batches(nodes, "messages", **options):
            for row in b.to_pylist():
                yield _norm(row)


def _node_dirs(paths) -> list[Path]:
    from cqforensics.discovery import nodes as layout

    out = []
    for p in paths:
        if source_kind(Path(p))[0] == "node":
            try:
                out += list(layout.find_node_dirs(Path(p)))
            except Exception:  # noqa: BLE001 - no topology is a fallback, not an error
                pass
    return out


def load_router(paths):
    """A ``model.routing.Router`` per node name of the sources' metadata (for fan-out decisions)."""
    from cqforensics.model.routing import Router
    from cqforensics.readers.metadata import read_metadata

    routers = {}
    for nd in _node_dirs(paths):
        try:
            meta = read_metadata(nd)
        except Exception:  # noqa: BLE001
            continue
        if meta.kind is not None:
            routers[nd.name] = Router(meta)
    return routers


# -- selection and plan -----------------------------------------------------------------------------


@dataclass
class Filters:
    vhosts: list[str] | None = None
    queues: list[str] | None = None
    since: int | None = None  # epoch seconds, inclusive
    until: int | None = None  # epoch seconds, exclusive
    ids: set[str] | None = None  # msg_id hex or AMQP message_id values
    only_dropped: bool = False
    seen: dict = field(default_factory=lambda: {"vhost": set(), "queue": set()})  # names the sources hold

    def check_names(self) -> None:
        """A --vhost or --queue name no source row has is a usage error naming the close names
        that exist (``driver.check_names`` for node dirs; here for exports and lost+found too)."""
        from cqforensics.read.driver import unmatched

        for what, asked in (("vhost", self.vhosts), ("queue", self.queues)):
            missing = sorted(set(asked or ()) - self.seen[what])
            if missing:
                raise UsageError(unmatched(what, missing, self.seen[what], "in the messages of the sources read"))

    def wanted(self, r: dict) -> bool:
        self.seen["vhost"].add(r["vhost"])
        if self.vhosts is None or r["vhost"] in self.vhosts:
            self.seen["queue"].add(r["queue"])
        if r["source"] == "lost+found":
            pass  # everything a rebuild could not write (LOST_FOUND_SKIP already left out)
        elif r["source"] not in ("index", "stream"):
            return False
        elif self.only_dropped:
            if r.get("survives_restart") or r.get("body") is None or r.get("decode_error"):
                return False
        elif not r.get("survives_restart"):
            return False
        return self.matches(r)

    def matches(self, r: dict) -> bool:
        if self.vhosts and r["vhost"] not in self.vhosts:
            return False
        if self.queues and r["queue"] not in self.queues:
            return False
        ts = r["properties"].get("timestamp")
        if self.since is not None and (ts is None or ts < self.since):
            return False
        if self.until is not None and (ts is None or ts >= self.until):
            return False
        if self.ids is not None:
            if r.get("msg_id") not in self.ids and r["properties"].get("message_id") not in self.ids:
                return False
        return True


def read_ids(path: str) -> set[str]:
    """--ids FILE: one id per line (msg_id hex, or an AMQP message_id); blank lines and # comments skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise OperationalError(f"{path}: cannot read: {e.strerror}") from e
    out = set()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.add(line.lower() if len(line) == 32 and all(c in "0123456789abcdefABCDEF" for c in line) else line)
    return out


def parse_map(items: Iterable[str] | None) -> dict[str, str]:
    out = {}
    for item in items or ():
        old, sep, new = item.partition("=")
        if not sep or not old or not new:
            raise UsageError(f"--map {item!r}: give OLD=NEW (queue names)")
        out[old] = new
    return out


def is_amqp10(r: dict) -> bool:
    tf = r.get("term_format") or ""
    return tf.startswith("mc_amqp") and tf != "mc_amqpl" and "amqp10" in (r.get("annotations") or {})


def body_digest(r: dict) -> str:
    return hashlib.sha256(r.get("body") or b"").hexdigest()


def journal_key(vhost: str, queue: str, msg_id: str | None, digest: str) -> str:
    return hashlib.sha256(json.dumps([vhost, queue, msg_id, digest]).encode()).hexdigest()[:32]


@dataclass
class Publish:
    """One publish: a message and the queues it is to reach."""

    vhost: str
    exchange: str
    routing_key: str
    targets: list[str]  # queue names on the target broker
    keys: list[str]  # journal keys, one per target
    row: dict
    direct: bool  # to the default exchange by queue name (mapped, or a partial fan-out)
    amqp10: bool
    order: dict = field(default_factory=dict)  # target queue -> position of its copy in the source

    def describe(self) -> str:
        how = f"exchange {self.exchange!r} key {self.routing_key!r}" if self.exchange or not self.direct else "direct"
        return f"{self.vhost} -> {','.join(self.targets)} ({how}) msg_id={self.row.get('msg_id')}"


def plan(
    rows: Iterable[dict],
    filters: Filters,
    qmap: dict[str, str],
    routers: dict | None = None,
    assume_routes: bool = True,
) -> tuple[list[Publish], dict]:
    """The publishes, in source order (a group is sent at its first selected copy)."""
    rows = list(rows)
    pos = {id(r): i for i, r in enumerate(rows)}
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["source"] not in ("index", "lost+found", "stream"):
            continue
        key = (r.get("node"), r["vhost"], r.get("msg_id") or f"#{id(r)}", body_digest(r))
        groups.setdefault(key, []).append(r)
    stats = {"rows": len(rows), "selected": 0, "duplicates": 0}
    out: list[Publish] = []
    done: set[tuple] = set()
    for r in rows:
        if not filters.wanted(r):
            continue
        gkey = (r.get("node"), r["vhost"], r.get("msg_id") or f"#{id(r)}", body_digest(r))
        if gkey in done:
            continue
        done.add(gkey)
        copies = [c for c in groups.get(gkey, [r]) if filters.wanted(c)]
        stats["selected"] += len(copies)
        seen_q, uniq = set(), []
        for c in copies:  # the same message twice in one queue: once
            if c["queue"] in seen_q:
                stats["duplicates"] += 1
                continue
            seen_q.add(c["queue"])
            uniq.append(c)
        digest = body_digest(r)
        amqp10 = is_amqp10(r)
        mapped = [c for c in uniq if c["queue"] in qmap]
        plain = [c for c in uniq if c["queue"] not in qmap]
        for c in mapped:
            q = qmap[c["queue"]]
            out.append(
                Publish(
                    r["vhost"],
                    "",
                    q,
                    [q],
                    [journal_key(r["vhost"], q, r.get("msg_id"), digest)],
                    c,
                    True,
                    amqp10,
                    {q: pos[id(c)]},
                )
            )
        if not plain:
            continue
        exchange = r.get("exchange")
        keys = r.get("routing_keys") or []
        qnames = {c["queue"] for c in plain}
        via_exchange = False
        if exchange and keys is not None:
            router = (routers or {}).get(r.get("node"))
            if router is not None:
                from cqforensics.model.routing import route_message

                routed = route_message(
                    router,
                    r["vhost"].encode(),
                    {"exchange": exchange, "routing_keys": keys, "headers": r.get("headers")},
                )
                via_exchange = routed is not None and {q.decode("utf-8", "surrogateescape") for q in routed} == qnames
            elif assume_routes:
                held = {c["queue"] for c in groups.get(gkey, [r])}
                via_exchange = held == qnames
        if via_exchange:
            qs = sorted(qnames)
            out.append(
                Publish(
                    r["vhost"],
                    exchange,
                    keys[0] if keys else "",
                    qs,
                    [journal_key(r["vhost"], q, r.get("msg_id"), digest) for q in qs],
                    r,
                    False,
                    amqp10,
                    {c["queue"]: pos[id(c)] for c in plain},
                )
            )
        else:
            for c in plain:
                q = c["queue"]
                out.append(
                    Publish(
                        r["vhost"],
                        "",
                        q,
                        [q],
                        [journal_key(r["vhost"], q, r.get("msg_id"), digest)],
                        c,
                        exchange != "" and exchange is not None,
                        amqp10,
                        {q: pos[id(c)]},
                    )
                )
    return keep_queue_order(out), stats


def keep_queue_order(pubs: list[Publish]) -> list[Publish]:
    """Order the publishes so that every target queue receives its messages in the source
    queue's order: a publish reaching several queues goes when it is next in all of them (a
    fan-out message behind a message that went to only one of its queues waits for it)."""
    from collections import deque

    lanes: dict[tuple, deque] = {}
    for i, p in enumerate(pubs):
        for q in p.targets:
            lanes.setdefault((p.vhost, q), []).append(i)
    lanes = {k: deque(sorted(v, key=lambda i, k=k: pubs[i].order.get(k[1], i))) for k, v in lanes.items()}
    import heapq

    def ready(i: int) -> bool:
        p = pubs[i]
        return all(lanes[(p.vhost, q)] and lanes[(p.vhost, q)][0] == i for q in p.targets)

    heap = sorted({lane[0] for lane in lanes.values() if ready(lane[0])})
    out, emitted = [], set()
    while len(out) < len(pubs):
        if heap:
            i = heapq.heappop(heap)
            if i in emitted:
                continue
        else:  # orders that contradict each other (not from one source): the earliest waiting first
            i = min(j for lane in lanes.values() if lane for j in lane if j not in emitted)
        emitted.add(i)
        out.append(pubs[i])
        for q in pubs[i].targets:
            lane = lanes[(pubs[i].vhost, q)]
            lane.remove(i) if lane[0] != i else lane.popleft()
            if lane and ready(lane[0]):
                heapq.heappush(heap, lane[0])
    return out


# -- journal ------------------------------------------------------------------------------------


#: the name of a default journal (``default_journal``)
_DEFAULT_JOURNAL = re.compile(r"cqforensics-republish-[0-9a-f]{12}\.journal")


def journal_problem(path: Path) -> str | None:
    """Why the existing file ``path`` is not a journal of cqforensics (None: it is, and a run
    continues it). A journal's first line is its ``start`` record; an empty file is one only
    under a default journal's name (an older cqforensics left such a file when it could not
    connect). Anything else is a file cqforensics did not write: never written to."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(1 << 16)
    except OSError as e:
        return f"cannot read it: {e.strerror}"
    if not first:
        return None if _DEFAULT_JOURNAL.fullmatch(path.name) else "it is an empty file cqforensics did not write"
    try:
        rec = json.loads(first)
    except ValueError:
        rec = None
    if isinstance(rec, dict) and rec.get("op") == "start" and rec.get("v") == 1:
        return None
    return "it is not a republish journal of cqforensics (its first line is no journal start record)"


class Journal:
    """Append-only JSON lines, fsynced per record. ``ok``: keys confirmed; ``doubt``: the last
    intent of an interrupted run, neither confirmed nor failed. The file is opened (and made, for
    a new journal) by the first record written, so a run that stops before sending anything (no
    client library, no broker) leaves no file behind."""

    def __init__(self, path: Path, dry_run: bool = False):
        self.path = path
        self.dry_run = dry_run
        self.ok: set[str] = set()
        self.failed: dict[str, str] = {}
        self.doubt: list[dict] = []
        self.n = 0
        intents: dict[int, dict] = {}
        if path.exists():
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        rec = json.loads(line)
                    except ValueError:  # a line torn by a kill
                        continue
                    op = rec.get("op")
                    if op == "intent":
                        intents[rec["n"]] = rec
                        self.n = max(self.n, rec["n"])
                    elif op == "ok":
                        i = intents.pop(rec["n"], None)
                        if i:
                            self.ok.update(i["keys"])
                    elif op in ("fail", "resend", "skip"):
                        i = intents.pop(rec["n"], None)
                        if i and op == "fail":
                            for k in i["keys"]:
                                self.failed[k] = rec.get("why", "")
                        if i and op == "skip":
                            self.ok.update(i["keys"])
        self.doubt = list(intents.values())
        self._fh = None

    def write(self, rec: dict) -> None:
        if self._fh is None:
            if self.dry_run:
                raise RuntimeError("a dry run writes no journal")
            self._fh = open(self.path, "a", encoding="utf-8")
        self._fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def intent(self, p: Publish, depth: dict) -> int:
        self.n += 1
        self.write(
            {
                "op": "intent",
                "n": self.n,
                "keys": p.keys,
                "vhost": p.vhost,
                "queues": p.targets,
                "depth": depth,
                "msg_id": p.row.get("msg_id"),
            }
        )
        return self.n

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()


def default_journal(paths, url: str) -> Path:
    parts = urllib.parse.urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    ident = json.dumps([sorted(str(Path(p).absolute()) for p in paths), netloc])
    return Path(f"cqforensics-republish-{hashlib.sha256(ident.encode()).hexdigest()[:12]}.journal")


def redact(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password:
        netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        parts = parts._replace(netloc=netloc)
    return urllib.parse.urlunsplit(parts)


# -- clients ------------------------------------------------------------------------------------


def _raw_properties_class(pika):
    class RawProperties(pika.spec.BasicProperties):
        """Basic properties sent as the bytes ``amqp091.encode_properties`` makes (every field
        type: pika itself can send only a few)."""

        def __init__(self, raw: bytes):
            super().__init__()
            self._raw = raw

        def encode(self):
            return [self._raw]

    return RawProperties


def _amqp10_value(v):
    """Typed JSON of an AMQP 1.0 value -> the proton value."""
    from rabbitmq_amqp_python_client.qpid import proton as p

    if v is None:
        return None
    t, val = v.get("type"), v.get("value")
    if "base64" in v:
        raw = base64.b64decode(v["base64"])
        return raw if t == "binary" else raw.decode("utf-8", "surrogateescape")
    simple = {
        "symbol": p.symbol,
        "ulong": p.ulong,
        "uint": p.uint,
        "ushort": p.ushort,
        "ubyte": p.ubyte,
        "byte": p.byte,
        "short": p.short,
        "int": p.int32,
        "char": p.char,
        "timestamp": p.timestamp,
    }
    if t in simple:
        return simple[t](val)
    if t in ("float", "double"):
        f = float(val)
        return p.float32(f) if t == "float" else f
    if t == "long":
        return int(val)
    if t == "boolean":
        return bool(val)
    if t == "string":
        return str(val)
    if t == "null":
        return None
    if t == "uuid":
        import uuid

        return uuid.UUID(str(val))
    if t == "map":
        if isinstance(val, dict):
            return {k: _amqp10_value(x) for k, x in val.items()}
        return {_amqp10_value(k): _amqp10_value(x) for k, x in val}
    if t in ("list", "array"):
        return [_amqp10_value(x) for x in val]
    if t == "binary":
        return base64.b64decode(val) if isinstance(val, str) else bytes(val)
    raise UsageError(f"AMQP 1.0 value of type {t!r} cannot be sent")


def amqp10_message(r: dict):
    """A proton Message from a row's AMQP 1.0 view (properties, application properties,
    message annotations, body section; header durable/priority/ttl from the 0-9-1 view)."""
    from rabbitmq_amqp_python_client.qpid.proton import Message, symbol

    a = r["annotations"]["amqp10"]
    p10 = a.get("properties") or {}
    m = Message()
    m.inferred = a.get("body_section") == "data"
    if a.get("body_section") == "data" or a.get("body_section") is None:
        m.body = r.get("body") or b""
    else:
        m.body = _amqp10_value(a.get("body_value"))
    props = r["properties"]
    m.durable = props.get("delivery_mode") == 2
    if props.get("priority") is not None:
        m.priority = int(props["priority"])
    if props.get("expiration"):
        m.ttl = int(props["expiration"]) / 1000.0
    val = _amqp10_value
    if p10.get("message_id") is not None:
        m.id = val(p10["message_id"])
    if p10.get("correlation_id") is not None:
        m.correlation_id = val(p10["correlation_id"])
    if p10.get("user_id") is not None:
        m.user_id = val(p10["user_id"])
    for name, attr in (
        ("to", "address"),
        ("subject", "subject"),
        ("reply_to", "reply_to"),
        ("group_id", "group_id"),
        ("reply_to_group_id", "reply_to_group_id"),
    ):
        if p10.get(name) is not None:
            setattr(m, attr, str(val(p10[name])))
    for name in ("content_type", "content_encoding"):
        if p10.get(name) is not None:
            setattr(m, name, symbol(str(val(p10[name]))))
    for name, attr in (("absolute_expiry_time", "expiry_time"), ("creation_time", "creation_time")):
        if p10.get(name) is not None:
            setattr(m, attr, p10[name]["value"] / 1000.0)
    if p10.get("group_sequence") is not None:
        m.group_sequence = int(p10["group_sequence"]["value"])
    app = a.get("application_properties") or {}
    if app:
        m.application_properties = {k: val(v) for k, v in app.items()}
    anns = {k: v for k, v in (a.get("message_annotations") or {}).items() if k not in ("x-exchange", "x-routing-key")}
    if anns:
        m.annotations = {symbol(k): val(v) for k, v in anns.items()}
    return m


def _addr(name: str) -> str:
    return urllib.parse.quote(name, safe="")


class Target:
    """Connections to the target broker: AMQP 0-9-1 (pika, confirms) per vhost, AMQP 1.0 per vhost."""

    def __init__(self, url: str):
        try:
            import pika
        except ImportError:
            raise OperationalError("republish needs pika: python3 -m pip install 'cqforensics[broker]'") from None
        self.pika = pika
        self.url = url
        self.params = pika.URLParameters(url)
        self.RawProperties = _raw_properties_class(pika)
        self._ch: dict[str, object] = {}
        self._conn: dict[str, object] = {}
        self._amqp10: dict[str, object] = {}
        self._senders: dict[tuple, object] = {}
        self.version: str | None = None

    def channel(self, vhost: str):
        ch = self._ch.get(vhost)
        if ch is not None and ch.is_open:
            return ch
        params = self.pika.URLParameters(self.url)
        params.virtual_host = vhost
        try:
            conn = self.pika.BlockingConnection(params)
        except Exception as e:
            raise OperationalError(
                f"{redact(self.url)} (vhost {vhost!r}): cannot connect: {type(e).__name__}: {e}"
            ) from e
        if self.version is None:
            v = conn._impl.server_properties.get("version")
            self.version = v.decode() if isinstance(v, bytes) else v
        ch = conn.channel()
        ch.confirm_delivery()
        self._conn[vhost], self._ch[vhost] = conn, ch
        return ch

    def depth(self, vhost: str, queue: str) -> int | None:
        """The queue's message count, or None when it does not exist."""
        ch = self.channel(vhost)
        try:
            return ch.queue_declare(queue, passive=True).method.message_count
        except self.pika.exceptions.ChannelClosedByBroker:
            self._ch.pop(vhost, None)
            return None

    def exchange_exists(self, vhost: str, exchange: str) -> bool:
        if exchange == "":
            return True
        ch = self.channel(vhost)
        try:
            ch.exchange_declare(exchange, passive=True)
            return True
        except self.pika.exceptions.ChannelClosedByBroker:
            self._ch.pop(vhost, None)
            return False

    def publish_091(self, p: Publish) -> str | None:
        """None when confirmed, else why not."""
        r = p.row
        props = {k: v for k, v in r["properties"].items() if k in amqp091.SCALAR_PROPERTIES}
        headers = r.get("headers")
        if (
            headers is not None
            and r.get("term_format", "").startswith("mc_amqp")
            and r.get("term_format") != "mc_amqpl"
        ):
            headers = None  # AMQP 1.0 application properties: not a 0-9-1 table (sent over 1.0 instead)
        raw = amqp091.encode_properties(props, headers)
        ch = self.channel(p.vhost)
        try:
            ch.basic_publish(p.exchange, p.routing_key, r.get("body") or b"", self.RawProperties(raw), mandatory=True)
        except self.pika.exceptions.UnroutableError:
            return "unroutable (returned by the broker)"
        except self.pika.exceptions.NackError:
            return "nacked by the broker"
        except self.pika.exceptions.ChannelClosedByBroker as e:
            self._ch.pop(p.vhost, None)
            return f"channel closed by the broker: {e}"
        return None

    @staticmethod
    def check_amqp10() -> None:
        """The AMQP 1.0 client library is there (checked before anything is sent or written)."""
        try:
            import rabbitmq_amqp_python_client  # noqa: F401
        except ImportError:
            raise OperationalError(
                "republish needs rabbitmq-amqp-python-client for the AMQP 1.0 messages: "
                "python3 -m pip install 'cqforensics[broker]'"
            ) from None

    def publish_10(self, p: Publish) -> str | None:
        from rabbitmq_amqp_python_client.qpid.proton import Delivery
        from rabbitmq_amqp_python_client.qpid.proton.utils import (
            BlockingConnection,
            SendException,
        )

        conn = self._amqp10.get(p.vhost)
        if conn is None:
            u = urllib.parse.urlsplit(self.url)
            base = (
                f"amqp://{u.username or 'guest'}:{u.password or 'guest'}@{u.hostname or 'localhost'}:{u.port or 5672}"
            )
            conn = BlockingConnection(base, virtual_host=f"vhost:{p.vhost}", allowed_mechs="PLAIN", timeout=60)
            self._amqp10[p.vhost] = conn
        if p.direct or p.exchange == "":
            addr = f"/queues/{_addr(p.targets[0])}"
        else:
            addr = f"/exchanges/{_addr(p.exchange)}" + (f"/{_addr(p.routing_key)}" if p.routing_key else "")
        sender = self._senders.get((p.vhost, addr))
        if sender is None:
            sender = conn.create_sender(addr)
            self._senders[(p.vhost, addr)] = sender
        try:
            sender.send(amqp10_message(p.row))
        except SendException as e:
            self._senders.pop((p.vhost, addr), None)
            state = {Delivery.RELEASED: "released (unroutable)", Delivery.REJECTED: "rejected"}.get(e.state, e.state)
            return f"AMQP 1.0 outcome: {state}"
        return None

    def close(self) -> None:
        for c in list(self._amqp10.values()) + list(self._conn.values()):
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing what may be gone already
                pass


# -- the command ------------------------------------------------------------------------------------


@dataclass
class Report:
    journal: str
    planned: int = 0  # publishes
    copies: int = 0  # queue copies those publishes make
    already: int = 0  # publishes the journal had confirmed before
    sent: int = 0
    failed: list[dict] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    in_doubt: dict[str, int] = field(default_factory=dict)
    by_queue: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False
    stats: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _resolve_doubt(journal: Journal, target: Target, policy: str | None, report: Report) -> None:
    for rec in journal.doubt:
        n, now = rec["n"], {}
        for q in rec.get("queues", []):
            now[q] = target.depth(rec["vhost"], q)
        before = rec.get("depth", {})
        if all(now[q] is not None and before.get(q) is not None and now[q] == before[q] + 1 for q in now):
            journal.write({"op": "ok", "n": n, "resolved": "depth"})
            journal.ok.update(rec["keys"])
            report.in_doubt["arrived"] = report.in_doubt.get("arrived", 0) + 1
        elif all(now[q] is not None and now[q] == before.get(q) for q in now):
            journal.write({"op": "resend", "n": n, "resolved": "depth"})
            report.in_doubt["resent"] = report.in_doubt.get("resent", 0) + 1
        elif policy in ("send", "skip"):
            journal.write({"op": "resend" if policy == "send" else "skip", "n": n, "resolved": policy})
            if policy == "skip":
                journal.ok.update(rec["keys"])
            report.in_doubt[policy] = report.in_doubt.get(policy, 0) + 1
        else:
            raise OperationalError(
                f"{journal.path}: publish #{n} (msg_id {rec.get('msg_id')} to {rec['vhost']}/"
                f"{','.join(rec.get('queues', []))}) was sent but not confirmed when the last run stopped, and the "
                f"queue depths ({now} now, {before} before it) do not tell whether it arrived (something else "
                f"published or consumed meanwhile): rerun with --in-doubt send (may duplicate it) or --in-doubt "
                f"skip (may lose it)"
            )
    journal.doubt = []


def republish(
    paths,
    url: str,
    *,
    journal: str | Path | None = None,
    vhosts=None,
    queues=None,
    since=None,
    until=None,
    ids=None,
    queue_map=None,
    rate: float | None = None,
    dry_run: bool = False,
    only_dropped: bool = False,
    in_doubt: str | None = None,
    topology=None,
    progress=None,
    **options,
) -> Report:
    """Send the selected messages of ``paths`` to the broker at ``url``; see the module doc. The
    journal is an output (``cqforensics.output.guard``): never inside an input or RabbitMQ data, and an
    existing file is continued only when it is a journal of cqforensics (``journal_problem``)."""
    from cqforensics.output.guard import check_output

    if not url.startswith(("amqp://", "amqps://")):
        raise UsageError(f"{redact(url)}: give the broker as amqp://user:pass@host:port/ (or amqps://)")
    if rate is not None and rate <= 0:
        raise UsageError("--rate must be > 0")
    if in_doubt not in (None, "send", "skip"):
        raise UsageError("--in-doubt: send or skip")
    qmap = parse_map(queue_map) if not isinstance(queue_map, dict) else queue_map
    filters = Filters(
        list(vhosts) if vhosts else None,
        list(queues) if queues else None,
        since,
        until,
        set(ids) if ids is not None else None,
        only_dropped,
    )
    jpath = Path(journal) if journal is not None else default_journal(paths, url)
    if not dry_run or jpath.exists() or jpath.is_symlink():
        check_output(jpath, paths, continued=journal_problem)
    j = Journal(jpath, dry_run=dry_run)
    report = Report(journal=str(jpath), dry_run=dry_run)
    routers = load_router(list(paths) + list(topology or []))
    pubs, report.stats = plan(read_rows(paths, **options), filters, qmap, routers)
    filters.check_names()
    report.planned = len(pubs)
    report.copies = sum(len(p.targets) for p in pubs)
    todo = []
    for p in pubs:
        if all(k in j.ok for k in p.keys):
            report.already += 1
        else:
            todo.append(p)
    if dry_run:
        for p in todo:
            for q in p.targets:
                report.by_queue[queue_ref(p.vhost, q)] = report.by_queue.get(queue_ref(p.vhost, q), 0) + 1
            if progress:
                progress(f"would send {p.describe()}")
        report.in_doubt = {"pending": len(j.doubt)} if j.doubt else {}
        return report
    target = Target(url)  # the client library, the broker and what it lacks: all known before any journal is made
    try:
        _resolve_doubt(j, target, in_doubt, report)
        todo = [p for p in todo if not all(k in j.ok for k in p.keys)]
        # what the target lacks is refused before anything is sent
        missing = set()
        for vhost, ex in sorted({(p.vhost, p.exchange) for p in todo if not p.direct}):
            if not target.exchange_exists(vhost, ex):
                missing.add(f"exchange {ex!r} in vhost {vhost!r}")
        for vhost, q in sorted({(p.vhost, q) for p in todo for q in p.targets}):
            if target.depth(vhost, q) is None:
                missing.add(f"queue {queue_ref(vhost, q)}")
        if missing:
            raise OperationalError(
                f"{redact(url)}: the target lacks {', '.join(sorted(missing))}: declare them "
                f"(e.g. import the old node's definitions) or --map the queues"
            )
        major = int((target.version or "4").split(".")[0])
        if major >= 4 and any(p.amqp10 for p in todo):
            target.check_amqp10()
        if todo and (not j.path.exists() or not j.path.stat().st_size):
            j.write(
                {
                    "op": "start",
                    "v": 1,
                    "tool": "cqforensics",
                    "target": redact(url),
                    "inputs": [str(p) for p in paths],
                    "time": dt.datetime.now(dt.UTC).isoformat(),
                }
            )
        interval = 1.0 / rate if rate else 0.0
        next_at = time.monotonic()
        for p in todo:
            if p.amqp10 and major < 4:
                report.skipped["amqp10_needs_4x"] = report.skipped.get("amqp10_needs_4x", 0) + 1
                continue
            if interval:
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                next_at = max(next_at + interval, time.monotonic() - interval)
            depth = {q: target.depth(p.vhost, q) for q in p.targets}
            n = j.intent(p, depth)
            why = target.publish_10(p) if p.amqp10 else target.publish_091(p)
            if why is None:
                j.write({"op": "ok", "n": n})
                j.ok.update(p.keys)
                report.sent += 1
                for q in p.targets:
                    report.by_queue[queue_ref(p.vhost, q)] = report.by_queue.get(queue_ref(p.vhost, q), 0) + 1
            else:
                j.write({"op": "fail", "n": n, "why": why})
                report.failed.append({"vhost": p.vhost, "queues": p.targets, "msg_id": p.row.get("msg_id"), "why": why})
            if progress:
                progress(f"{'sent' if why is None else 'FAILED'} {p.describe()}" + (f": {why}" if why else ""))
    finally:
        target.close()
        j.close()
    return report


__all__ = [
    "LOST_FOUND_SKIP",
    "Filters",
    "Journal",
    "Publish",
    "Report",
    "amqp10_message",
    "default_journal",
    "journal_key",
    "journal_problem",
    "plan",
    "read_rows",
    "republish",
    "source_kind",
]
