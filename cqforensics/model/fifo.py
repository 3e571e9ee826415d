"""``rabbit_fifo``, the quorum queue's Ra state machine, replayed in Python: every command of
machine versions 2 to 8 applied as RabbitMQ 3.10 to 4.3 apply it, so that the queue's state after
its log (which messages are ready, in which order, which are checked out by which consumer,
their delivery counts, what waits for at-least-once dead-lettering) is known without a broker.

Sources (FIFO = deps/rabbit/src/rabbit_fifo.erl, FIFOQ = rabbit_fifo_q.erl, PQ =
rabbit_fifo_pq.erl, DLX = rabbit_fifo_dlx.erl): machine 2 = FIFO@v3.10.8, 3 = FIFO@v3.12.14 and
v3.13.7, 4-5 = FIFO@v4.0.5, 6-7 = FIFO@v4.1.8 and v4.2.2, 8 = FIFO@v4.3.5. The behaviour is
selected by the *effective machine version* the log itself carries (Ra's noop entries and the
snapshot's meta), as Ra selects the module (``which_module/1``).

What is modelled: enqueue (tracked per enqueuer, duplicates and out-of-sequence seqnos dropped
as FIFO maybe_enqueue does), requeue, checkout (dequeue settled/unsettled, consumers with
simple_prefetch or credited credit, cancel/remove), settle, return, discard, modify, credit,
purge, down/nodeup/nodedown, update_config, at-least-once dead-lettering (``{dlx, ...}``),
delivery limits, message TTL (expiry at checkout), max-length/max-bytes (drop-head and
reject-publish), priorities (4.0-4.2 two levels, 4.3 32 levels), single active consumer.
What is not: 4.3's delayed retry and consumer timeouts' effects between commands (only the
state a snapshot records), effects on other queues (at-most-once dead-letters leave the queue).
Where Erlang iterates a map whose order matters (a small map iterates in key order), keys are
sorted by Erlang term order.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field

from cqforensics.codecs import etf

UNDEF = "undefined"

# -- messages ----------------------------------------------------------------------------------


class Msg:
    """?MSG(Index, Header): the raft index of the message's enqueue and its header (a dict with
    ``size`` and, when set, ``expiry``, ``delivery_count``, ``acquired_count``, ``anns``)."""

    __slots__ = ("index", "header", "priority")

    def __init__(self, index: int, header: dict, priority: int = 4):
        self.index = index
        self.header = header
        self.priority = priority  # the queue it was enqueued to (4.x): FIFOQ hi/no, PQ level

    def copy(self) -> Msg:
        return Msg(self.index, dict(self.header), self.priority)

    def __repr__(self) -> str:
        return f"Msg({self.index}, {self.header})"


def _incr(h: dict, key: str) -> None:
    h[key] = h.get(key, 0) + 1


# -- ready queues ------------------------------------------------------------------------------


class FifoQ:
    """FIFOQ (machine 4-7): two queues, ``hi`` (priority above 4) and ``no``, served 2:1 by a
    dequeue counter that lets a ``no`` message through every third dequeue when its index is
    lower (rabbit_fifo_q next/1)."""

    WEIGHT = 2

    def __init__(self):
        self.hi: deque[Msg] = deque()
        self.no: deque[Msg] = deque()
        self.counter = 0

    def __len__(self):
        return len(self.hi) + len(self.no)

    def put(self, msg: Msg, hi: bool):
        (self.hi if hi else self.no).append(msg)

    def _next(self):
        if self.hi and self.no and self.counter == self.WEIGHT:
            return self.hi if self.hi[0].index < self.no[0].index else self.no
        if self.hi:
            return self.hi
        return self.no

    def peek(self):
        hi, no = self.hi, self.no  # _next()'s choice, written out: a peek per checkout
        if hi and no and self.counter == self.WEIGHT:
            return hi[0] if hi[0].index < no[0].index else no[0]
        return hi[0] if hi else no[0] if no else None

    def pop(self):
        if not len(self):
            return None
        q = self._next()
        self.counter = 0 if self.counter == self.WEIGHT else self.counter + 1
        return q.popleft()

    def items(self):
        return list(self.hi) + list(self.no)

    def clear(self):
        self.hi.clear()
        self.no.clear()


class PrioQ:
    """PQ (machine 8): 32 levels (0-31, higher served first), FIFO within a level."""

    def __init__(self):
        self.levels: dict[int, deque[Msg]] = {}

    def __len__(self):
        return sum(len(q) for q in self.levels.values())

    def put(self, msg: Msg, priority: int):
        self.levels.setdefault(priority, deque()).append(msg)

    def _top(self):
        for p in sorted(self.levels, reverse=True):
            if self.levels[p]:
                return self.levels[p]
        return None

    def peek(self):
        q = self._top()
        return q[0] if q else None

    def pop(self):
        q = self._top()
        return q.popleft() if q else None

    def items(self):
        return [m for p in sorted(self.levels, reverse=True) for m in self.levels[p]]

    def clear(self):
        self.levels.clear()


class PlainQ:
    """lqueue (machine 2-3): one FIFO."""

    def __init__(self):
        self.q: deque[Msg] = deque()

    def __len__(self):
        return len(self.q)

    def put(self, msg: Msg, _=None):
        self.q.append(msg)

    def peek(self):
        return self.q[0] if self.q else None

    def pop(self):
        return self.q.popleft() if self.q else None

    def items(self):
        return list(self.q)

    def clear(self):
        self.q.clear()


# -- consumers ---------------------------------------------------------------------------------


@dataclass
class Consumer:
    key: object  # (Tag, Pid) or, from machine 4, the checkout's raft index
    tag: bytes | None
    pid: object
    lifetime: str = "once"  # once | auto
    mode: object = "simple_prefetch"  # machine 2: simple_prefetch | credited; 3+: (simple_prefetch, N) | (credited, DC)
    priority: int = 0
    credit: int = 0
    status: str = "up"  # up | suspected_down | cancelled | quiescing | waiting
    next_msg_id: int = 0
    delivery_count: int = 0
    checked_out: dict[int, Msg] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    @property
    def max_credit(self) -> int | None:
        m = self.mode
        if isinstance(m, tuple) and m[0] == "simple_prefetch":
            return m[1]
        return None

    @property
    def credited(self) -> bool:
        m = self.mode
        return m == "credited" or (isinstance(m, tuple) and m[0] == "credited")


@dataclass
class Dlx:
    """DLX state: messages waiting to be dead-lettered at least once (``discards``: (reason,
    Msg)) and the worker's checked-out ones."""

    discards: deque = field(default_factory=deque)
    consumer_pid: object = None
    prefetch: int = 0
    checked_out: dict[int, tuple] = field(default_factory=dict)
    next_msg_id: int = 0


class ServiceQueue:
    """priority_queue of consumer keys: higher priority first, FIFO within one; a key is in it once."""

    def __init__(self):
        self.items: list[tuple[int, int, object]] = []
        self.n = 0

    def member(self, key) -> bool:
        return any(k == key for _, _, k in self.items)

    def put(self, key, priority: int):
        self.n += 1
        self.items.append((priority, self.n, key))

    def _best(self):
        return max(range(len(self.items)), key=lambda i: (self.items[i][0], -self.items[i][1]))

    def peek(self):
        return self.items[self._best()][2] if self.items else None

    def remove(self, key):
        self.items = [it for it in self.items if it[2] != key]

    def pop(self):
        if not self.items:
            return None
        return self.items.pop(self._best())[2]


# -- configuration -------------------------------------------------------------------------------


@dataclass
class Cfg:
    name: str | None = None
    resource: tuple | None = None  # (vhost, queue name)
    dead_letter_handler: str | None = None  # None | at_most_once | at_least_once
    overflow: str = "drop_head"
    max_length: int | None = None
    max_bytes: int | None = None
    single_active: bool = False
    delivery_limit: int | None = None
    expires: int | None = None
    msg_ttl: int | None = None
    #: at-most-once: (dead-letter exchange, routing key or None) of
    #: {at_most_once, {rabbit_quorum_queue, dead_letter_publish, [XRes, RK, QRes]}}
    dlx_target: tuple[bytes, bytes | None] | None = None


def _opt_int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def cfg_from_map(conf: dict, cfg: Cfg | None = None) -> Cfg:
    """FIFO update_config/2 of a config map (the server config's machine config, or an
    ``update_config`` command)."""
    cfg = cfg or Cfg()
    dlh = conf.get("dead_letter_handler")
    if isinstance(dlh, tuple) and dlh and dlh[0] == "at_most_once":
        cfg.dead_letter_handler = "at_most_once"
        mfa = dlh[1] if len(dlh) > 1 else None
        args = mfa[2] if isinstance(mfa, tuple) and len(mfa) == 3 and isinstance(mfa[2], list) else []
        if args and isinstance(args[0], tuple) and len(args[0]) == 4 and isinstance(args[0][3], bytes):
            rk = args[1] if len(args) > 1 and isinstance(args[1], bytes) else None
            cfg.dlx_target = (args[0][3], rk)
    elif dlh == "at_least_once":
        cfg.dead_letter_handler = "at_least_once"
    else:
        cfg.dead_letter_handler = None
    cfg.overflow = str(conf.get("overflow_strategy", "drop_head"))
    cfg.max_length = _opt_int(conf.get("max_length"))
    cfg.max_bytes = _opt_int(conf.get("max_bytes"))
    cfg.delivery_limit = _opt_int(conf.get("delivery_limit"))
    if cfg.delivery_limit is not None and cfg.delivery_limit < 0:  # 4.0+: -1 = no limit
        cfg.delivery_limit = None
    cfg.expires = _opt_int(conf.get("expires"))
    cfg.msg_ttl = _opt_int(conf.get("msg_ttl"))
    cfg.single_active = conf.get("single_active_consumer_on") == "true"
    if "name" in conf:
        cfg.name = str(conf["name"])
    r = conf.get("queue_resource")
    if isinstance(r, tuple) and len(r) == 4:
        cfg.resource = (r[1], r[3])
    return cfg


# -- what a command needs to know of a message ---------------------------------------------------


@dataclass(frozen=True)
class MsgFacts:
    """What rabbit_fifo reads of a message at enqueue (FIFO message_size/1, maybe_set_msg_ttl/4,
    priority_tag/1 and msg_priority/1, maybe_set_msg_delivery_count/2)."""

    size: int
    ttl: int | None = None  # per-message TTL (ms)
    priority: int | None = None
    delivery_count: int | None = None  # the #mc annotation
    is_mc: bool = False


def _iolist_size(v) -> int:
    if isinstance(v, (bytes, bytearray)):
        return len(v)
    if isinstance(v, list):
        return sum(_iolist_size(x) for x in v)
    if isinstance(v, int):
        return 1
    return 0


def message_facts(msg, size=None) -> MsgFacts:
    """MsgFacts of a stored message term (``size``: the v4+ ``{MetaSize, PayloadSize}`` of the
    enqueue command, when it carries one)."""
    try:
        return _facts(msg, size)
    except (TypeError, ValueError, IndexError, KeyError, AttributeError):
        return MsgFacts(0)


def _expiration(props_bin_or_props) -> int | None:
    from cqforensics.codecs import amqp091

    try:
        if isinstance(props_bin_or_props, (bytes, bytearray)):
            props, _ = amqp091.decode_properties(bytes(props_bin_or_props))
            exp = props.get("expiration")
        elif isinstance(props_bin_or_props, tuple) and props_bin_or_props[0] == "P_basic":
            exp = props_bin_or_props[8]
            exp = exp.decode() if isinstance(exp, bytes) else None
        else:
            return None
        return int(exp) if exp is not None else None
    except Exception:  # an unparsable expiration: the channel refuses it before it is stored
        return None


def _facts(msg, size) -> MsgFacts:
    if isinstance(msg, tuple) and msg and msg[0] == "basic_message":
        content = msg[3]
        body = _iolist_size(content[5])
        props = content[2] if content[2] != "none" else content[3]
        ttl = _expiration(content[2]) if isinstance(content[2], tuple) else None
        pri = None
        if isinstance(content[2], tuple) and len(content[2]) > 5:
            pri = _opt_int(content[2][5])
        return MsgFacts(body, ttl, pri)
    if isinstance(msg, tuple) and msg and msg[0] == "mc":
        anns = msg[3] if isinstance(msg[3], dict) else {}
        meta, payload = size if isinstance(size, tuple) and len(size) == 2 else (0, 0)
        ttl = _opt_int(anns.get("ttl"))
        pri = _opt_int(anns.get("p"))
        dc = _opt_int(anns.get("delivery_count"))
        proto, data = msg[1], msg[2]
        if pri is None and proto == "mc_amqpl" and isinstance(data, tuple):
            from cqforensics.message import reference as m

            props, _ = m._content_props(data, [])  # marks: the columns, not these facts, report them
            pri = props.get("priority")
            if ttl is None and props.get("expiration") is not None:
                try:
                    ttl = int(props["expiration"])
                except ValueError:
                    ttl = None
        if not payload and proto == "mc_amqpl" and isinstance(data, tuple):
            payload = _iolist_size(data[5])
        return MsgFacts(payload, ttl, pri, dc, True)
    return MsgFacts(0)


# -- the state machine ---------------------------------------------------------------------------


class Unsupported(Exception):
    """A command this model does not apply (kept as a note; the replay goes on)."""


@dataclass
class Event:
    """What a command did to one message (for the raft_log table and the timeline)."""

    index: int  # the message's raft index
    what: str  # enqueued / duplicate / checked_out / settled / returned / requeued / dead_lettered / dropped / expired / purged


class Fifo:
    """One quorum queue's rabbit_fifo state. ``apply(meta, command)`` applies a decoded
    ``rabbit_fifo.Command``; ``meta``: index, ts (system_time), machine_version, reply."""

    def __init__(self, cfg: Cfg, machine_version: int = 0):
        self.cfg = cfg
        self.mv = machine_version
        self.messages = self._new_queue()
        self.returns: deque[Msg] = deque()
        self.messages_total = 0
        self.enqueuers: dict[object, int] = {}  # pid -> next seqno
        #: a replay of entries some of which damage removed: an enqueue past a gap in its
        #: enqueuer's sequence is taken (the gap is the damage, not a lost publish the broker
        #: would have refused as out of sequence), so every message the files hold is listed
        self.lenient = False
        self.consumers: dict[object, Consumer] = {}
        self.service = ServiceQueue()
        self.waiting: list[tuple[object, Consumer]] = []
        self.dlx = Dlx()
        self.dead_lettered: list[tuple[str, Msg, str]] = []  # (reason, msg, strategy) that left the queue
        #: (entry index, reason, msg) of every at-most-once dead letter: the boot republishes those of
        #: entries it applies again (above meta.dets' last_applied)
        self.published: list[tuple[int, str, Msg]] = []
        self.index = 0  # the entry being applied
        self.dropped: list[tuple[str, Msg]] = []  # (why, msg) gone without dead-lettering
        self.notes: list[str] = []
        self.last_ts = 0

    def clone(self) -> Fifo:
        """A copy whose applies leave this one as it is (``model.quorum.boot`` predicts on one):
        what a command changes (the queues, consumers, enqueuers, the dead-letter state, each
        ``Msg`` in them: one copy per object, shared where the original shares it, as
        ``copy.deepcopy`` makes) copied; the history lists (``dead_lettered``, ``published``,
        ``dropped``) copied as lists, their ``Msg``s, which have left the queue and never change
        again, shared. A small part of a deepcopy's cost, which was most of a boot's."""
        msgs: dict[int, Msg] = {}

        def m_(m: Msg) -> Msg:
            c = msgs.get(id(m))
            if c is None:
                c = msgs[id(m)] = Msg(m.index, dict(m.header), m.priority)
            return c

        cons: dict[int, Consumer] = {}

        def c_(c: Consumer) -> Consumer:
            n = cons.get(id(c))
            if n is None:
                n = cons[id(c)] = copy.copy(c)
                n.checked_out = {k: m_(m) for k, m in c.checked_out.items()}
                n.meta = dict(c.meta)
            return n

        f = copy.copy(self)
        f.cfg = copy.copy(self.cfg)
        q = self.messages
        if isinstance(q, PrioQ):
            f.messages = PrioQ()
            f.messages.levels = {p: deque(m_(m) for m in d) for p, d in q.levels.items()}
        elif isinstance(q, FifoQ):
            f.messages = FifoQ()
            f.messages.hi, f.messages.no = deque(m_(m) for m in q.hi), deque(m_(m) for m in q.no)
            f.messages.counter = q.counter
        else:
            f.messages = PlainQ()
            f.messages.q = deque(m_(m) for m in q.q)
        f.returns = deque(m_(m) for m in self.returns)
        f.enqueuers = dict(self.enqueuers)
        f.consumers = {k: c_(c) for k, c in self.consumers.items()}
        f.service = ServiceQueue()
        f.service.items, f.service.n = list(self.service.items), self.service.n
        f.waiting = [(k, c_(c)) for k, c in self.waiting]
        d = self.dlx
        f.dlx = Dlx(
            deque((r, m_(m)) for r, m in d.discards),
            d.consumer_pid,
            d.prefetch,
            {k: (r, m_(m)) for k, (r, m) in d.checked_out.items()},
            d.next_msg_id,
        )
        f.dead_lettered, f.published, f.dropped, f.notes = (
            list(self.dead_lettered),
            list(self.published),
            list(self.dropped),
            list(self.notes),
        )
        return f

    # -- queues ------------------------------------------------------------------------------

    def _new_queue(self):
        if self.mv >= 8:
            return PrioQ()
        if self.mv >= 4:
            return FifoQ()
        return PlainQ()

    def upgrade(self, to: int) -> None:
        """Ra's {machine_version, From, To}: FIFO convert/4 (3 -> 4 copies delivery_count to
        acquired_count and moves the messages into FIFOQ; 7 -> 8 into PQ)."""
        if to <= self.mv:
            return
        old = self.mv
        self.mv = to
        if (old < 4 <= to) or (old < 8 <= to):  # a new kind of ready queue (FIFOQ from 4, PQ from 8)
            items = self.messages.items()
            self.messages = self._new_queue()
            for m in items:
                self._put(m)
        if old < 4 <= to:
            for m in list(self.returns) + [m for c in self.consumers.values() for m in c.checked_out.values()]:
                if "delivery_count" in m.header:
                    m.header["acquired_count"] = m.header["delivery_count"]
        if old < 3 <= to:  # convert_v2_to_v3: simple_prefetch consumers get their prefetch as max credit
            for c in self.consumers.values():
                if c.mode == "simple_prefetch":
                    c.mode = ("simple_prefetch", c.meta.get("prefetch", 0))

    def _put(self, m: Msg) -> None:
        if self.mv >= 8:
            self.messages.put(m, m.priority)
        elif self.mv >= 4:
            self.messages.put(m, m.priority > 4)
        else:
            self.messages.put(m)

    def ready(self) -> int:
        return len(self.returns) + len(self.messages)

    def _peek(self):
        return self.returns[0] if self.returns else self.messages.peek()

    def _take(self):
        if self.returns:
            return self.returns.popleft()
        return self.messages.pop()

    # -- apply -------------------------------------------------------------------------------

    def apply(self, meta: dict, cmd) -> None:
        ts = meta.get("ts") or self.last_ts
        if self.mv >= 8:
            ts = max(ts, self.last_ts)  # FIFO@v4.3.5 apply/3: last_command_time, monotonic
        self.last_ts = ts
        self.index = meta.get("index", self.index)
        if meta.get("ts") != ts:
            meta = {**meta, "ts": ts}
        handler = _HANDLERS.get(cmd.name)
        if handler is None:
            raise Unsupported(cmd.name)
        handler(self, meta, cmd)

    def _cmd_enqueue(self, meta, cmd):
        pid, seq = cmd.pid, cmd.seq
        if cmd.size is not None and pid is None:  # {e, Seq, Msg, Size}: the enqueuer is the notify pid
            r = meta.get("reply")
            if isinstance(r, tuple) and len(r) == 3 and r[0] == "notify":
                pid = r[2]
            else:
                pid = None
                seq = None
        facts = meta.get("facts") or message_facts(cmd.msg, cmd.size)
        if pid is not None:
            nxt = self.enqueuers.get(pid)
            if nxt is None:
                self.enqueuers[pid] = nxt = 1
            if seq != nxt and not (self.lenient and isinstance(seq, int) and seq > nxt):
                return  # FIFO maybe_enqueue: out_of_sequence (not enqueued) or duplicate
            self.enqueuers[pid] = (seq if self.lenient and isinstance(seq, int) else nxt) + 1
        idx = meta["index"]
        size = facts.size
        header = {"size": size}
        ttl = self._ttl(facts)
        if ttl is not None:
            header["expiry"] = meta["ts"] + ttl
        if self.mv >= 4 and facts.is_mc and facts.delivery_count is not None:
            header["delivery_count"] = facts.delivery_count
        prio = facts.priority
        if self.mv >= 8:
            level = 4 if prio is None else max(0, min(prio, 31))
        else:
            level = prio if prio is not None else 0
        m = Msg(idx, header, level if facts.is_mc or self.mv >= 8 else 0)
        if self.mv >= 4 and not facts.is_mc:
            m.priority = 0
        self._put(m)
        self.messages_total += 1
        self.checkout(meta)

    def _ttl(self, facts: MsgFacts) -> int | None:
        q = self.cfg.msg_ttl
        if self.mv < 4 and not facts.is_mc:
            # FIFO@v3.10.8 maybe_set_msg_ttl/4: a #basic_message whose properties were decoded
            # (rabbit_quorum_queue leaves them decoded only when it has a per-message TTL)
            m = facts.ttl
        else:
            m = facts.ttl if facts.is_mc else None
        vals = [v for v in (q, m) if v is not None]
        return min(vals) if vals else None

    def _cmd_register_enqueuer(self, meta, cmd):
        self.enqueuers.setdefault(cmd.pid, 1)

    def _find(self, key):
        """FIFO find_consumer/2 (machine 4+): a (Tag, Pid) key also finds an integer-keyed consumer."""
        if key in self.consumers:
            return key, self.consumers[key]
        if self.mv >= 4 and isinstance(key, tuple):
            for k, c in self.consumers.items():
                if (c.tag, c.pid) == key:
                    return k, c
        return None, None

    def _cmd_settle(self, meta, cmd):
        key, con = self._find(cmd.consumer)
        if con is None:
            return
        self._complete(meta, key, con, cmd.msg_ids)
        self._activate_next()
        self.checkout(meta)

    def _complete(self, meta, key, con, msg_ids):
        n = 0
        for mid in msg_ids:
            if con.checked_out.pop(mid, None) is not None:
                n += 1
        con.credit = self._increase_credit(con, n)
        self.messages_total -= n
        self._update_or_remove(meta, key, con)

    def _cmd_discard(self, meta, cmd):
        key, con = self._find(cmd.consumer)
        if con is None:
            return
        if self.mv == 4 and key != cmd.consumer:
            return  # FIFO@v4.0.5: machine 4's discard only finds a consumer by its own key
        self._discard(meta, key, con, cmd.msg_ids, True, {})

    def _discard(self, meta, key, con, msg_ids, failed, anns):
        msgs = []
        for mid in msg_ids:
            m = con.checked_out.get(mid)
            if m is not None:
                m = m.copy()
                if self.mv >= 4:
                    self._incr_msg(m, failed, anns)
                msgs.append(m)
        self._dead_letter(msgs, "rejected")
        self._complete(meta, key, con, msg_ids)
        self._activate_next()
        self.checkout(meta)

    def _incr_msg(self, m: Msg, failed: bool, anns: dict) -> None:
        """FIFO@v4.0.5 incr_msg/3 (v8 incr_msg_headers/3)."""
        _incr(m.header, "acquired_count")
        if anns:
            m.header["anns"] = {**m.header.get("anns", {}), **anns}
        if failed:
            _incr(m.header, "delivery_count")

    def _dead_letter(self, msgs: list[Msg], reason: str) -> None:
        """DLX discard/4: at-least-once keeps them (``discards``), at-most-once publishes them
        (they leave), none drops them."""
        dlh = self.cfg.dead_letter_handler
        for m in msgs:
            if dlh == "at_least_once" and reason != "maxlen":
                self.dlx.discards.append((reason, m))
            else:
                self.dead_lettered.append((reason, m, dlh or "none"))
                if dlh == "at_most_once":
                    self.published.append((self.index, reason, m))

    def _cmd_return(self, meta, cmd):
        key, con = self._find(cmd.consumer)
        if con is None:
            return
        self._return(meta, key, con, list(cmd.msg_ids), False, {})

    def _cmd_modify(self, meta, cmd):
        key, con = self._find(cmd.consumer)
        if con is None:
            return
        failed, undeliverable = cmd.flags
        anns = cmd.annotations if isinstance(cmd.annotations, dict) else {}
        if undeliverable:
            self._discard(meta, key, con, cmd.msg_ids, failed, anns)
        else:
            self._return(meta, key, con, list(cmd.msg_ids), failed, anns)

    def _return(self, meta, key, con, msg_ids, failed, anns):
        if self.mv < 4:
            # FIFO@v3.10.8 return/5: maps:fold over maps:with(MsgIds, Checked): key order
            ids = sorted(i for i in set(msg_ids) if i in con.checked_out)
        else:
            ids = [i for i in msg_ids if i in con.checked_out]
        for mid in ids:
            if mid in con.checked_out:
                self._return_one(meta, key, mid, failed, anns)
        con = self.consumers.get(key)
        if con is not None:
            if self.mv == 2:
                con.credit = self._increase_credit(con, len(ids))
            self._update_or_remove(meta, key, con)
        if self.mv >= 4:
            self._activate_next()
        self.checkout(meta)

    def _return_one(self, meta, key, mid, failed, anns):
        con = self.consumers[key]
        m = con.checked_out[mid].copy()
        if self.mv >= 4:
            self._incr_msg(m, failed, anns)
            count = m.header.get("delivery_count" if self.mv >= 8 else "acquired_count", 0)
        else:
            _incr(m.header, "delivery_count")
            count = m.header["delivery_count"]
        limit = self.cfg.delivery_limit
        if limit is not None and count > limit:
            self._dead_letter([m], "delivery_limit")
            self._complete(meta, key, con, [mid])
            return
        del con.checked_out[mid]
        if self.mv >= 3:
            con.credit = self._increase_credit(con, 1)
        self.returns.append(m)
        if self.mv >= 8:
            self._update_or_remove(meta, key, con)

    def _cmd_requeue(self, meta, cmd):
        key, con = self._find(cmd.consumer) if self.mv >= 4 else (cmd.consumer, self.consumers.get(cmd.consumer))
        mid = cmd.msg_ids[0] if cmd.msg_ids else None
        if con is None or mid not in con.checked_out:
            return
        old = con.checked_out.pop(mid)
        # the header the client was given (the command's), not the state's: FIFO apply/3 #requeue{}
        h = header_from_term(cmd.header) if cmd.header is not None else dict(old.header)
        _incr(h, "acquired_count" if self.mv >= 4 else "delivery_count")
        con.credit = self._increase_credit(con, 1)
        m = Msg(meta["index"], h, 4 if self.mv >= 8 else 0)
        self._put(m)
        self._update_or_remove(meta, key, con)
        if self.mv >= 7:
            self._activate_next()
        self.checkout(meta)

    def _cmd_credit(self, meta, cmd):
        key, con = self._find(cmd.consumer)
        if con is None:
            for i, (k, c) in enumerate(self.waiting):
                if k == cmd.consumer:
                    c.credit = max(0, (_opt_int(cmd.delivery_count) or 0) + (cmd.credit or 0) - c.delivery_count)
            return
        dc = _opt_int(cmd.delivery_count) or 0
        con.credit = max(0, dc + (cmd.credit or 0) - con.delivery_count)
        self._queue_consumer(key, con)
        self.checkout(meta)
        if cmd.drain:
            con = self.consumers.get(key)
            if con is not None:
                con.delivery_count += con.credit
                con.credit = 0

    def _cmd_checkout(self, meta, cmd):
        spec = cmd.spec
        cid = cmd.consumer
        if isinstance(spec, tuple) and spec and spec[0] == "dequeue":
            self._dequeue(meta, cid, spec[1], cmd.meta or {})
            return
        if spec in ("cancel", "remove"):
            key, con = self._find(cid)
            if con is None:
                return
            self._cancel(meta, key, con, str(spec))
            self._activate_next()
            self.checkout(meta)
            return
        if not isinstance(spec, tuple):
            raise Unsupported(f"checkout spec {spec!r}")
        if len(spec) == 3:  # {Life, Credit, Mode} (machine 2-3, and older clients on 4+)
            life, credit, mode = str(spec[0]), spec[1], str(spec[2])
            if self.mv >= 3:
                mode = ("simple_prefetch", credit) if mode == "simple_prefetch" else ("credited", 0)
        else:  # {Life, Mode}: Mode = {simple_prefetch, N} | {credited, DeliveryCount} | credited
            life, mode = str(spec[0]), spec[1]
            if isinstance(mode, tuple):
                mode = (str(mode[0]), mode[1])
                credit = mode[1] if mode[0] == "simple_prefetch" else 0
            else:
                mode, credit = str(mode), 0
        cmeta = cmd.meta or {}
        prio = cmeta.get("priority")
        if not isinstance(prio, int):
            prio = _x_priority(cmeta.get("args"))
        if self.mv >= 4:
            key, existing = self._find(cid)
            if existing is None:
                key = meta["index"] if len(spec) == 2 else cid
        else:
            key, existing = cid, self.consumers.get(cid)
        tag, pid = cid if isinstance(cid, tuple) and len(cid) == 2 else (None, cid)
        self._update_consumer(meta, key, tag, pid, cmeta, life, mode, credit, prio, existing)
        self._activate_next()
        self.checkout(meta)

    def _update_consumer(self, meta, key, tag, pid, cmeta, life, mode, credit, prio, existing):
        dc = mode[1] if isinstance(mode, tuple) and mode[0] == "credited" and self.mv >= 4 else 0
        if self.cfg.single_active:
            active = self._active()
            if active is not None and active[0] == key and active[1].status == "up":
                c = active[1]
                self._merge(c, cmeta, life, mode, credit, prio)
                self._update_or_remove(meta, key, c)
                return
            if active is None and key in self.consumers:
                c = self.consumers[key]
                self._merge(c, cmeta, life, mode, credit, prio)
                self._update_or_remove(meta, key, c)
                return
            c = Consumer(key, tag, pid, life, mode, prio, credit, "up", delivery_count=dc, meta=cmeta)
            self._add_waiting(key, c)
            return
        if existing is not None:
            self._merge(existing, cmeta, life, mode, credit, prio)
            c = existing
        else:
            c = Consumer(key, tag, pid, life, mode, prio, credit, "up", delivery_count=dc, meta=cmeta)
        self._update_or_remove(meta, key, c)

    def _merge(self, c: Consumer, cmeta, life, mode, credit, prio):
        c.meta, c.lifetime, c.mode, c.priority = cmeta, life, mode, prio
        c.status = "up"
        c.credit = max(0, credit - len(c.checked_out))

    def _dequeue(self, meta, cid, settlement, cmeta):
        if self.cfg.single_active:
            return
        if self.ready() == 0:
            return
        if self._find(cid)[1] is not None:
            return
        con = Consumer(
            cid,
            cid[0] if isinstance(cid, tuple) else None,
            cid[1] if isinstance(cid, tuple) else cid,
            "once",
            ("simple_prefetch", 1) if self.mv >= 3 else "simple_prefetch",
            0,
            1,
        )
        self.consumers[cid] = con
        self.service.put(cid, 0)
        ok = self._checkout_one(meta)
        if ok is None:  # all ready messages expired
            self.consumers.pop(cid, None)
            self._evaluate_limit(meta)
            return
        if settlement == "settled":
            mid = next(iter(con.checked_out), None)
            if mid is not None:
                self._complete(meta, cid, con, [mid])
                if self.mv >= 4:
                    self._activate_next()
                self.checkout(meta)
        self._evaluate_limit(meta)

    def _cmd_purge(self, meta, cmd):
        n = self.ready()
        self.messages = self._new_queue()  # FIFO apply/3 #purge{}: a new queue (4.0-4.2: its dequeue counter reset)
        self.returns.clear()
        self.messages_total -= n
        self._evaluate_limit(meta)

    def _cmd_purge_nodes(self, meta, cmd):
        for node in cmd.nodes:
            for pid in self._pids_on(node):
                self._handle_down(meta, pid)

    def _cmd_garbage_collection(self, meta, cmd):
        pass

    def _cmd_update_config(self, meta, cmd):
        cfg_from_map(cmd.config or {}, self.cfg)
        self.checkout(meta)

    def _cmd_timeout(self, meta, cmd):
        self.checkout(meta)

    def _cmd_nodeup(self, meta, cmd):
        for key, c in list(self.consumers.items()):
            if _pid_node(c.pid) == cmd.node and c.status != "cancelled":
                c.status = "up"
                self._update_or_remove(meta, key, c)
        self._activate_next()
        self.checkout(meta)

    def _cmd_nodedown(self, meta, cmd):
        pass

    def _cmd_machine_version(self, meta, cmd):
        self.upgrade(cmd.versions[1] or self.mv)

    def _cmd_down(self, meta, cmd):
        info = cmd.info
        if info == "noconnection":
            node = _pid_node(cmd.pid)
            for key, c in sorted(self.consumers.items(), key=lambda kv: etf.term_order_key(kv[0])):
                if _pid_node(c.pid) == node and c.status == "up":
                    if self.mv < 8:
                        if self.mv == 2:
                            c.credit = self._increase_credit(c, len(c.checked_out))
                        c.status = "suspected_down"
                        self._return_all(meta, key, c, False)
                    else:  # 4.3: suspected, messages kept until consumer_disconnected_timeout
                        c.status = "suspected_down"
            self.checkout(meta)
            return
        self._handle_down(meta, cmd.pid)
        self._activate_next()
        self.checkout(meta)

    def _handle_down(self, meta, pid):
        self.enqueuers.pop(pid, None)
        self.waiting = [(k, c) for k, c in self.waiting if c.pid != pid]
        for key in sorted((k for k, c in self.consumers.items() if c.pid == pid), key=etf.term_order_key):
            con = self.consumers.get(key)
            if con is not None:
                self._cancel(meta, key, con, "down")
        if self.dlx.consumer_pid == pid:  # the dead-letter worker: its messages wait for the next one
            self._dlx_release()

    def _cancel(self, meta, key, con, reason):
        if reason == "cancel":
            con.lifetime, con.credit, con.status = "once", 0, "cancelled"
            self._update_or_remove(meta, key, con)
            return
        self._return_all(meta, key, con, reason == "down")
        self.consumers.pop(key, None)

    def _return_all(self, meta, key, con, failed):
        self.consumers[key] = con
        for mid in sorted(con.checked_out):
            if key in self.consumers and mid in self.consumers[key].checked_out:
                self._return_one(meta, key, mid, failed if self.mv >= 4 else False, {})

    def _pids_on(self, node) -> list:
        pids = {c.pid for c in self.consumers.values()} | set(self.enqueuers)
        return sorted((p for p in pids if _pid_node(p) == node), key=etf.term_order_key)

    # -- dead-letter worker (DLX apply/4) --------------------------------------------------------

    def _cmd_dlx_checkout(self, meta, cmd):
        if self.cfg.dead_letter_handler != "at_least_once":
            return
        if self.dlx.consumer_pid is not None:
            self._dlx_release()
        self.dlx.consumer_pid, self.dlx.prefetch = cmd.pid, cmd.credit or 0
        self.dlx.checked_out, self.dlx.next_msg_id = {}, 0
        self._dlx_checkout()

    def _dlx_release(self):
        """Checked-out dead letters go back to the front of ``discards``, in their order."""
        back = [self.dlx.checked_out[i] for i in sorted(self.dlx.checked_out)]
        self.dlx.discards.extendleft(reversed(back))
        self.dlx.checked_out = {}

    def _cmd_dlx_settle(self, meta, cmd):
        if self.cfg.dead_letter_handler != "at_least_once":
            return
        for mid in cmd.msg_ids:
            item = self.dlx.checked_out.pop(mid, None)
            if item is not None:
                self.dead_lettered.append((item[0], item[1], "at_least_once"))

    def _dlx_checkout(self):
        if self.cfg.dead_letter_handler != "at_least_once" or self.dlx.consumer_pid is None:
            return
        while len(self.dlx.checked_out) < self.dlx.prefetch and self.dlx.discards:
            self.dlx.checked_out[self.dlx.next_msg_id] = self.dlx.discards.popleft()
            self.dlx.next_msg_id += 1

    # -- checkout --------------------------------------------------------------------------------

    def _increase_credit(self, con: Consumer, n: int) -> int:
        if con.lifetime == "once" or (con.lifetime == "auto" and con.credited):
            return con.credit
        mx = con.max_credit
        if self.mv >= 3 and mx is not None and mx > 0:
            return min(mx, con.credit + n)
        return con.credit + n

    def _queue_consumer(self, key, con):
        if con.credit > 0 and con.status == "up" and not self.service.member(key):
            self.service.put(key, con.priority)

    def _update_or_remove(self, meta, key, con):
        if con.lifetime == "once" and con.credit == 0:
            if not con.checked_out:
                self.consumers.pop(key, None)
            else:
                self.consumers[key] = con
            return
        if con.status == "quiescing" and not con.checked_out and self.mv >= 4:
            self.consumers.pop(key, None)
            con.status = "up"
            self._add_waiting(key, con)
            return
        self.consumers[key] = con
        self._queue_consumer(key, con)

    def checkout(self, meta) -> None:
        while self._checkout_one(meta):
            pass
        self._dlx_checkout()
        self._evaluate_limit(meta)

    def _expire(self, ts) -> bool:
        expired = False
        while True:
            m = self._peek()
            if m is None:
                return expired
            exp = m.header.get("expiry")
            if exp is None or ts < exp:
                return expired
            self._take()
            self.messages_total -= 1
            self._dead_letter([m], "expired")
            expired = True

    def _checkout_one(self, meta):
        """One message to the consumer at the head of the service queue (FIFO checkout_one/4);
        True when one went, False when nothing could go, None when the ready messages all
        expired (a dequeue then answers empty)."""
        expired = self._expire(meta["ts"])
        while True:
            key = self.service.peek()
            if key is None:
                return None if expired and not self.ready() else False
            con = self.consumers.get(key)
            if con is None:
                self.service.remove(key)
                continue
            if not self.ready():  # the service queue is left as it was
                return None if expired else False
            self.service.remove(key)
            if con.credit == 0 or con.status != "up":
                continue
            m = self._take()
            con.checked_out[con.next_msg_id] = m
            con.next_msg_id += 1
            con.credit -= 1
            con.delivery_count += 1
            self._update_or_remove(meta, key, con)
            return True

    def _evaluate_limit(self, meta) -> None:
        if self.cfg.max_length is None and self.cfg.max_bytes is None:
            return
        while self._over_limit() and self.cfg.overflow == "drop_head":
            m = self._take()
            if m is None:
                return
            self.messages_total -= 1
            self._dead_letter([m], "maxlen")

    def _over_limit(self) -> bool:
        n = self.ready() + len(self.dlx.discards) + len(self.dlx.checked_out)
        if self.cfg.max_length is not None and n > self.cfg.max_length:
            return True
        if self.cfg.max_bytes is not None:
            b = sum(m.header.get("size", 0) for m in list(self.returns) + self.messages.items())
            b += sum(m.header.get("size", 0) for _, m in list(self.dlx.discards) + list(self.dlx.checked_out.values()))
            return b > self.cfg.max_bytes
        return False

    # -- single active consumer ------------------------------------------------------------------

    def _active(self):
        for k, c in self.consumers.items():
            if c.status in ("up", "suspected_down", "quiescing"):
                return k, c
        return None

    def _add_waiting(self, key, con):
        self.waiting.append((key, con))
        self.waiting.sort(key=lambda kc: (kc[1].status != "up", -kc[1].priority))

    def _activate_next(self):
        if not self.cfg.single_active or not self.waiting:
            return
        nk, nc = self.waiting[0]
        if nc.status != "up":
            return
        active = self._active()
        if active is None:
            self.waiting.pop(0)
            self.consumers[nk] = nc
            self._queue_consumer(nk, nc)
        elif self.mv >= 4 and nc.priority > active[1].priority:
            if not active[1].checked_out:
                self.waiting.pop(0)
                self.consumers.pop(active[0])
                self.consumers[nk] = nc
                self._queue_consumer(nk, nc)
                self._add_waiting(*active)
            else:
                active[1].status = "quiescing"


#: command name -> its Fifo method (``Fifo.apply``'s dispatch)
_HANDLERS = {k[len("_cmd_") :]: v for k, v in vars(Fifo).items() if k.startswith("_cmd_")}


def header_from_term(h) -> dict:
    """A msg_header() term (FIFOH: a size, ``[Size | Expiry]`` or a map) as a dict."""
    if isinstance(h, int) and not isinstance(h, bool):
        return {"size": h}
    if isinstance(h, etf.ImproperList) and len(h.items) == 1:
        return {"size": h.items[0], "expiry": h.tail}
    if isinstance(h, dict):
        out = {str(k): v for k, v in h.items() if isinstance(k, str)}
        if "anns" in out and not isinstance(out["anns"], dict):
            out.pop("anns")
        out.setdefault("size", 0)
        return out
    return {"size": 0}


def _x_priority(args) -> int:
    if isinstance(args, list):
        for item in args:
            if isinstance(item, tuple) and len(item) == 3 and item[0] == b"x-priority" and isinstance(item[2], int):
                return item[2]
    return 0


def _pid_node(pid):
    return etf.pid_node(pid)


__all__ = [
    "Cfg",
    "Consumer",
    "Dlx",
    "Event",
    "Fifo",
    "FifoQ",
    "Msg",
    "MsgFacts",
    "PlainQ",
    "PrioQ",
    "Unsupported",
    "cfg_from_map",
    "header_from_term",
    "message_facts",
]


# -- a snapshot's machine state -------------------------------------------------------------------

_PACKED_IDX_MAX = (1 << 44) - 1


def msg_from_term(t, priority: int = 4) -> Msg | None:
    """?MSG(Idx, Header) (FIFOH), or machine 8's packed integer ``Idx bxor (Size bsl 44)``."""
    if isinstance(t, etf.ImproperList) and len(t.items) == 1 and isinstance(t.items[0], int):
        return Msg(t.items[0], header_from_term(t.tail), priority)
    if isinstance(t, int) and not isinstance(t, bool) and t >= 0:
        return Msg(t & _PACKED_IDX_MAX, {"size": (t >> 44) & 0x7FFF}, priority)
    return None


def _lqueue(t) -> list:
    """lqueue {Len, In, Out} (and queue-like {In, Out} / priority_queue squeue) -> items in order."""
    if isinstance(t, tuple):
        if len(t) == 3 and isinstance(t[0], int):
            return list(t[2]) + list(reversed(t[1]))
        if len(t) == 2 and isinstance(t[0], list):
            return list(t[1]) + list(reversed(t[0]))
        if len(t) == 4 and t[0] == "queue":
            return list(t[2]) + list(reversed(t[1]))
    return []


def _service_queue(t) -> list[tuple[int, object]]:
    """rabbit priority_queue -> [(priority, item)] in service order."""
    if isinstance(t, tuple) and t and t[0] == "queue":
        return [(0, x) for x in _lqueue(t)]
    if isinstance(t, tuple) and len(t) == 2 and t[0] == "pqueue":
        out = []
        for item in t[1]:
            if isinstance(item, tuple) and len(item) == 2:
                out += [(-item[0], x) for x in _lqueue(item[1])]
        return out
    return []


def _consumer(key, t, mv: int) -> Consumer | None:
    if not (isinstance(t, tuple) and len(t) >= 7 and t[0] == "consumer"):
        return None
    ccfg = t[1]
    meta, pid, tag, mode, life, prio = (
        ccfg[1:7] if isinstance(ccfg, tuple) and len(ccfg) >= 7 else ({}, None, None, "simple_prefetch", "once", 0)
    )
    status = t[2]
    if isinstance(status, tuple) and status:
        status = status[0]
    checked = {}
    if isinstance(t[4], dict):
        for mid, m in t[4].items():
            if isinstance(m, tuple) and len(m) == 2 and mv >= 8:  # ?C_MSG(Timeout, Msg)
                m = m[1]
            msg = msg_from_term(m)
            if msg is not None and isinstance(mid, int):
                checked[mid] = msg
    if isinstance(mode, tuple):
        mode = (str(mode[0]), mode[1])
    else:
        mode = str(mode)
    dc = t[6] if isinstance(t[6], int) else 0
    return Consumer(
        key,
        tag if isinstance(tag, bytes) else None,
        pid,
        str(life),
        mode,
        prio if isinstance(prio, int) else 0,
        t[5] if isinstance(t[5], int) else 0,
        str(status),
        t[3] if isinstance(t[3], int) else 0,
        dc,
        dict(sorted(checked.items())),
        meta if isinstance(meta, dict) else {},
    )


def from_snapshot(state, mv: int, cfg: Cfg | None = None) -> Fifo:
    """The Fifo a snapshot's machine state term describes (#rabbit_fifo{} of FIFOH at the
    version's tag: the fields this model keeps share their positions from machine 2 to 8).
    Raises ValueError when the term is no rabbit_fifo state."""
    if not (isinstance(state, tuple) and len(state) >= 18 and state[0] == "rabbit_fifo"):
        raise ValueError("not a #rabbit_fifo{} state")
    c = state[1]
    cfg = cfg or Cfg()
    if isinstance(c, tuple) and len(c) >= 13 and c[0] == "cfg":
        cfg.name = str(c[1])
        if isinstance(c[2], tuple) and len(c[2]) == 4:
            cfg.resource = (c[2][1], c[2][3])
        dlh = c[4]
        cfg.dead_letter_handler = (
            "at_most_once"
            if isinstance(dlh, tuple) and dlh and dlh[0] == "at_most_once"
            else "at_least_once"
            if dlh == "at_least_once"
            else None
        )
        cfg.overflow = str(c[6])
        cfg.max_length, cfg.max_bytes = _opt_int(c[7]), _opt_int(c[8])
        cfg.single_active = c[9] == "single_active"
        cfg.delivery_limit, cfg.expires, cfg.msg_ttl = _opt_int(c[10]), _opt_int(c[11]), _opt_int(c[12])
        if cfg.delivery_limit is not None and cfg.delivery_limit < 0:
            cfg.delivery_limit = None
    f = Fifo(cfg, mv)
    msgs = state[2]
    if mv >= 8 and isinstance(msgs, tuple) and msgs and msgs[0] == "pq":
        for inv, q in sorted((msgs[1] or {}).items()) if isinstance(msgs[1], dict) else ():
            for t in _lqueue(q):
                m = msg_from_term(t, 31 - inv)
                if m is not None:
                    f.messages.put(m, m.priority)
    elif mv >= 4 and isinstance(msgs, tuple) and msgs and msgs[0] == "rabbit_fifo_q":
        for t in _lqueue(msgs[1]):
            m = msg_from_term(t, 9)
            if m is not None:
                f.messages.put(m, True)
        for t in _lqueue(msgs[2]):
            m = msg_from_term(t, 0)
            if m is not None:
                f.messages.put(m, False)
        f.messages.counter = msgs[4] if isinstance(msgs[4], int) else 0
    else:
        for t in _lqueue(msgs):
            m = msg_from_term(t, 0)
            if m is not None:
                f.messages.put(m) if mv < 4 else f.messages.put(m, False)
    f.messages_total = state[3] if isinstance(state[3], int) else 0
    f.returns = deque(m for m in (msg_from_term(t) for t in _lqueue(state[4])) if m is not None)
    if isinstance(state[6], dict):
        for pid, e in state[6].items():
            if isinstance(e, tuple) and len(e) >= 2 and e[0] == "enqueuer":
                f.enqueuers[pid] = e[1]
    if isinstance(state[9], dict):
        for key, t in sorted(state[9].items(), key=lambda kv: etf.term_order_key(kv[0])):
            con = _consumer(key, t, mv)
            if con is not None:
                f.consumers[key] = con
    for prio, key in _service_queue(state[10]):
        f.service.put(key, prio)
    d = state[11]
    if isinstance(d, tuple) and len(d) >= 3 and d[0] == "rabbit_fifo_dlx":
        for t in _lqueue(d[2]):
            if isinstance(t, etf.ImproperList) and len(t.items) == 1:
                m = msg_from_term(t.tail)
                if m is not None:
                    f.dlx.discards.append((str(t.items[0]), m))
        dc = d[1]
        if isinstance(dc, tuple) and len(dc) >= 5 and dc[0] == "dlx_consumer":
            f.dlx.consumer_pid, f.dlx.prefetch = dc[1], dc[2] if isinstance(dc[2], int) else 0
            for mid, t in sorted(dc[3].items()) if isinstance(dc[3], dict) else ():
                if isinstance(t, etf.ImproperList) and len(t.items) == 1:
                    m = msg_from_term(t.tail)
                    if m is not None:
                        f.dlx.checked_out[mid] = (str(t.items[0]), m)
            f.dlx.next_msg_id = dc[4] if isinstance(dc[4], int) else 0
    if isinstance(state[14], list):
        for item in state[14]:
            if isinstance(item, tuple) and len(item) == 2:
                con = _consumer(item[0], item[1], mv)
                if con is not None:
                    f.waiting.append((item[0], con))
    if mv >= 8 and isinstance(state[7], int):
        f.last_ts = state[7]
    return f
