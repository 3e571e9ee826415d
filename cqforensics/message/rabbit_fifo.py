"""Ra log entries of a quorum queue and the ``rabbit_fifo`` commands they carry, decoded from
their Erlang terms (spec: docs/formats/quorum.md section 7; sources: FIFO =
deps/rabbit/src/rabbit_fifo.erl and DLX = rabbit_fifo_dlx.erl at v3.10.8, v3.12.14, v3.13.7,
v4.0.5, v4.1.8, v4.2.2, v4.3.5; Ra's entries: ra_server.erl, ra_log.erl).

A codec: terms in, typed commands out, nothing applied (``model.quorum`` replays them). Every
shape a machine version 2-8 writes is recognised (v0/v1 commands of 3.8/3.9, read by 3.10 only
from an upgraded log, are listed as ``unknown``); an unrecognised term is a ``Command`` named
``unknown`` carrying the term, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cqforensics.base.errors import FormatError
from cqforensics.codecs import etf
from cqforensics.message import reference as message

#: the command names (``Command.name``; the ``raft_log`` table's ``command`` column)
COMMANDS = (
    "enqueue",
    "requeue",
    "register_enqueuer",
    "checkout",
    "settle",
    "return",
    "discard",
    "modify",
    "credit",
    "purge",
    "purge_nodes",
    "update_config",
    "garbage_collection",
    "down",
    "nodeup",
    "nodedown",
    "timeout",
    "dlx_checkout",
    "dlx_settle",
    "machine_version",
    "unknown",
)

#: the entry kinds (``Entry.kind``)
ENTRY_KINDS = ("command", "noop", "cluster_change", "first", "other")


#: Command and Entry are plain slotted dataclasses, not frozen ones: one of each is made per log
#: entry, and a frozen dataclass of Command's 22 fields cost four times as much to make (each
#: field set through object.__setattr__), a tenth of a replay. Nothing changes them once made.


@dataclass(slots=True)
class Command:
    """One rabbit_fifo command. Which fields are set depends on ``name``:

    * ``enqueue``: ``pid`` (None for an untracked enqueue, and for the v4+ ``{e, Seq, Msg,
      Size}`` form, whose enqueuer is the reply mode's pid: ``Entry.enqueuer``), ``seq``, ``msg``
      (the stored message term), ``size`` (v4+: ``(MetaSize, PayloadSize)``);
    * ``requeue``: ``consumer``, ``msg_ids`` ([MsgId]), ``index`` (the message's old raft index),
      ``header``, ``msg``;
    * ``settle``/``return``/``discard``/``modify``: ``consumer`` (a ``(Tag, Pid)`` consumer id, or
      v4+'s integer consumer key: the raft index of its checkout), ``msg_ids``; ``modify`` also
      ``flags`` (delivery_failed, undeliverable_here) and ``annotations``;
    * ``checkout``: ``consumer`` (the consumer id), ``spec`` (the raw spec term), ``meta``;
    * ``credit``: ``consumer``, ``credit``, ``delivery_count``, ``drain``;
    * ``register_enqueuer``/``down``: ``pid`` (and ``info`` for down); ``nodeup``/``nodedown``:
      ``node``; ``purge_nodes``: ``nodes``; ``update_config``: ``config``;
    * ``dlx_checkout``: ``pid``, ``credit`` (prefetch); ``dlx_settle``: ``msg_ids``;
    * ``machine_version``: ``versions`` (From, To).
    """

    name: str
    pid: object = None
    seq: int | None = None
    msg: object = None
    size: tuple | None = None
    consumer: object = None
    msg_ids: tuple = ()
    index: int | None = None
    header: object = None
    spec: object = None
    meta: dict | None = None
    credit: int | None = None
    delivery_count: object = None
    drain: bool | None = None
    flags: tuple = ()
    annotations: object = None
    info: object = None
    node: object = None
    nodes: tuple = ()
    config: dict | None = None
    versions: tuple = ()
    term: object = field(default=None, compare=False)  # the undecoded term of an ``unknown`` command


@dataclass(slots=True)
class Entry:
    """A Ra log entry: a machine command (``'$usr'``), a leader's ``noop`` (carrying the machine
    version it runs), a cluster change, the ``undefined`` placeholder at index 0, or other."""

    kind: str
    ts: int | None = None  # Meta's ``ts`` (system time, ms) when the leader appended it
    command: Command | None = None
    machine_version: int | None = None  # noop
    reply: object = None  # the reply mode (``{notify, Corr, Pid}``, ``noreply``, ...)
    term: object = field(default=None, compare=False)

    @property
    def enqueuer(self):
        """The pid a ``{notify, Corr, Pid}`` reply mode names (v4+: the enqueuer of ``{e, ...}``)."""
        r = self.reply
        if isinstance(r, tuple) and len(r) == 3 and r[0] == "notify":
            return r[2]
        return None


def _atom(v, name: str) -> bool:
    return isinstance(v, etf.Atom) and v == name


def _ints(v) -> tuple:
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return tuple(v)
    raise FormatError("msg ids are not a list of integers")


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def decode_command(cmd) -> Command:
    """A rabbit_fifo command term -> Command (``unknown`` when no clause of any version matches)."""
    try:
        return _command(cmd)
    except (FormatError, TypeError, ValueError, IndexError):
        return Command("unknown", term=cmd)


def _enqueue(cmd) -> Command:
    pid = None if _atom(cmd[1], "undefined") else cmd[1]
    return Command("enqueue", pid=pid, seq=_int(cmd[2]), msg=cmd[3])


def _dlx(cmd) -> Command | None:
    sub = cmd[1]  # DLX apply/4: {dlx, {checkout, Pid, Prefetch}}, {dlx, {settle, MsgIds}}
    if not (isinstance(sub, tuple) and sub):
        return None
    if _atom(sub[0], "checkout") and len(sub) == 3:
        return Command("dlx_checkout", pid=sub[1], credit=_int(sub[2]))
    if _atom(sub[0], "settle") and len(sub) == 2:
        return Command("dlx_settle", msg_ids=_ints(sub[1]))
    return None


#: (tag, arity) of a command tuple -> its Command (None: no clause matches, ``unknown``)
_SHAPES = {
    # FIFO@v4.0.5 ?ENQ_V2: {e, Seq, Msg, {MetaSize, PayloadSize}}
    ("e", 4): lambda c: Command("enqueue", seq=_int(c[1]), msg=c[2], size=c[3] if isinstance(c[3], tuple) else None),
    ("enqueue", 4): _enqueue,
    ("requeue", 6): lambda c: Command(
        "requeue", consumer=c[1], msg_ids=(_int(c[2]),), index=_int(c[3]), header=c[4], msg=c[5]
    ),
    ("register_enqueuer", 2): lambda c: Command("register_enqueuer", pid=c[1]),
    ("checkout", 4): lambda c: Command(
        "checkout", consumer=c[1], spec=c[2], meta=c[3] if isinstance(c[3], dict) else {}
    ),
    ("settle", 3): lambda c: Command("settle", consumer=c[1], msg_ids=_ints(c[2])),
    ("return", 3): lambda c: Command("return", consumer=c[1], msg_ids=_ints(c[2])),
    ("discard", 3): lambda c: Command("discard", consumer=c[1], msg_ids=_ints(c[2])),
    ("modify", 6): lambda c: Command(
        "modify", consumer=c[1], msg_ids=_ints(c[2]), flags=(c[3] == "true", c[4] == "true"), annotations=c[5]
    ),
    ("credit", 5): lambda c: Command(
        "credit", consumer=c[1], credit=_int(c[2]), delivery_count=c[3], drain=c[4] == "true"
    ),
    ("purge", 1): lambda c: Command("purge"),
    ("purge_nodes", 2): lambda c: Command("purge_nodes", nodes=tuple(c[1]) if isinstance(c[1], list) else ()),
    ("update_config", 2): lambda c: Command("update_config", config=c[1] if isinstance(c[1], dict) else {}),
    ("garbage_collection", 1): lambda c: Command("garbage_collection"),
    ("down", 3): lambda c: Command("down", pid=c[1], info=c[2]),
    ("nodeup", 2): lambda c: Command("nodeup", node=c[1]),
    ("nodedown", 2): lambda c: Command("nodedown", node=c[1]),
    ("timeout", 2): lambda c: Command("timeout", info=c[1]),
    ("machine_version", 3): lambda c: Command("machine_version", versions=(_int(c[1]), _int(c[2]))),
    ("dlx", 2): _dlx,
}


def _command(cmd) -> Command:
    if isinstance(cmd, tuple) and cmd and isinstance(cmd[0], etf.Atom):
        make = _SHAPES.get((cmd[0], len(cmd)))  # an Atom is a str: it finds its name
        got = make(cmd) if make is not None else None
        if got is not None:
            return got
    return Command("unknown", term=cmd)


def decode_entry(term) -> Entry:
    """A Ra log entry term -> Entry."""
    if isinstance(term, tuple) and len(term) == 4 and _atom(term[0], "$usr"):
        meta = term[1] if isinstance(term[1], dict) else {}
        return Entry("command", _int(meta.get("ts")), decode_command(term[2]), reply=term[3], term=term)
    if isinstance(term, tuple) and len(term) == 3 and _atom(term[0], "noop"):
        meta = term[1] if isinstance(term[1], dict) else {}
        return Entry("noop", _int(meta.get("ts")), machine_version=_int(term[2]), term=term)
    if isinstance(term, tuple) and term and isinstance(term[0], etf.Atom) and str(term[0]).startswith("$ra_"):
        meta = term[1] if len(term) > 1 and isinstance(term[1], dict) else {}
        return Entry("cluster_change", _int(meta.get("ts")), term=term)
    if _atom(term, "undefined"):
        return Entry("first", term=term)
    return Entry("other", term=term)


def decode(data) -> Entry:
    """The stored bytes of a log entry -> Entry (raises FormatError when they are no term)."""
    term, _ = etf.decode(data)
    return decode_entry(term)


def message_fields(msg) -> dict:
    """The message columns (``message.FIELDS``) of a stored message term carried by an enqueue
    or requeue; raises FormatError for a term of a shape no broker writes."""
    return message.normalise_checked(msg)


def consumer_tag(consumer) -> bytes | None:
    """The consumer tag of a ``(Tag, Pid)`` consumer id (None for an integer key)."""
    if isinstance(consumer, tuple) and len(consumer) == 2 and isinstance(consumer[0], bytes):
        return consumer[0]
    return None


__all__ = [
    "COMMANDS",
    "Command",
    "ENTRY_KINDS",
    "Entry",
    "consumer_tag",
    "decode",
    "decode_command",
    "decode_entry",
    "message_fields",
]
