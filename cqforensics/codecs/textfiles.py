"""The small text files of a node dir: ``.vhost``, ``.queue_name``, ``.config`` and
``clean.dot`` (Erlang terms as text, as ``file:consult/1`` reads them).

Sources: VH = rabbit_vhost.erl (.vhost, .config), IDX2/QI1 (.queue_name), RF = rabbit_file.erl
``write_term_file`` (clean.dot: one ``~w.`` term per line).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass

from cqforensics.base.errors import FormatError
from cqforensics.codecs.etf import Atom

_DIGITS36 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_PAIRS36 = [a + b for a in _DIGITS36 for b in _DIGITS36]  # two digits per step: every dir name is one


def b36(data: bytes) -> str:
    """Upper-case base 36 of a big-endian integer, as ``~.36B`` formats it."""
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, r = divmod(n, 1296)
        out.append(_PAIRS36[r])
    text = "".join(reversed(out)).lstrip("0")
    return text or "0"


@functools.lru_cache(maxsize=4096)  # asked for each queue of the metadata: a node has few vhosts
def vhost_dir_name(vhost: bytes) -> str:
    """VH vhost_name_to_dir_name: base 36 of md5(vhost)."""
    return b36(hashlib.md5(vhost).digest())


@functools.lru_cache(maxsize=1 << 16)  # a queue's dir is named from its .queue_name and from the metadata
def queue_dir_name(vhost: bytes, name: bytes) -> str:
    """IDX2 queue_name_to_dir_name: base 36 of md5("queue" ++ vhost ++ name)."""
    return b36(hashlib.md5(b"queue" + vhost + name).digest())


def priority_queue_name(name: bytes, priority: int) -> bytes:
    """rabbit_priority_queue mutate_name_bin: each level is <<Name, 0, P:8>>."""
    return name + b"\x00" + bytes([priority])


@dataclass(frozen=True)
class QueueName:
    """What a ``.queue_name`` stub says; ``name`` is the full stored name (priority suffix
    included), ``base``/``priority`` split it."""

    vhost: bytes
    name: bytes
    index: str | None  # "v2" when the stub says INDEX: v2

    @property
    def priority(self) -> int | None:
        if len(self.name) >= 2 and self.name[-2] == 0:
            return self.name[-1]
        return None

    @property
    def base(self) -> bytes:
        return self.name[:-2] if self.priority is not None else self.name


def parse_queue_name(raw: bytes, vhost: bytes | None = None) -> QueueName:
    """Parse ``VHOST: <vhost>\\nQUEUE: <name>\\n[INDEX: v2\\n]``.

    Names may contain newlines, so when the vhost is known it anchors the split.
    """
    if not raw.startswith(b"VHOST: "):
        raise FormatError("does not start with 'VHOST: '", offset=0)
    rest = raw[7:]
    if vhost is not None and rest.startswith(vhost + b"\nQUEUE: "):
        vh, rest = vhost, rest[len(vhost) + 8 :]
    else:
        cut = rest.find(b"\nQUEUE: ")
        if cut < 0:
            raise FormatError("no 'QUEUE: ' line", offset=7)
        vh, rest = rest[:cut], rest[cut + 8 :]
    index = None
    if rest.endswith(b"\nINDEX: v2\n"):
        rest, index = rest[:-11], "v2"
    elif rest.endswith(b"\n"):
        rest = rest[:-1]
    else:
        raise FormatError("queue line is not terminated", offset=len(raw))
    return QueueName(vh, rest, index)


# -- Erlang terms as text (file:consult) --------------------------------------------------------

_TOKEN = re.compile(
    rb"""
    \s+ | %[^\n]*                                   # whitespace, comments
  | (?P<bin><<)  | (?P<ebin>>>)
  | (?P<map>\#\{) | (?P<arrow>=>)
  | (?P<punct>[{}\[\],.|/])
  | (?P<float>-?\d+\.\d+(?:[eE][-+]?\d+)?)
  | (?P<int>-?\d+)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<qatom>'(?:[^'\\]|\\.)*')
  | (?P<atom>[a-z][A-Za-z0-9_@]*)
""",
    re.VERBOSE,
)


def _tokens(text: bytes):
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise FormatError(f"unexpected character {text[pos : pos + 1]!r}", offset=pos)
        pos = m.end()
        if m.lastgroup:
            yield m.lastgroup, m.group(m.lastgroup), m.start()


MAX_DEPTH = 200  # nesting of the terms of a text file (deeper input is damage, not recursion)
MAX_DIGITS = 1000  # digits of one number (Python refuses int/str conversions past 4,300)


def consult(text: bytes) -> list:
    """The terms of an Erlang text file (tuples, lists, maps ``#{K => V}``, atoms, integers,
    floats, strings, binaries ``<<1,2>>``/``<<"s">>``/``<<"s"/utf8>>``), each ended by a full
    stop."""
    toks = list(_tokens(text))
    out, i = [], 0

    def term(i, depth=0):
        if i >= len(toks):
            raise FormatError("unexpected end of terms", offset=len(text))
        kind, val, off = toks[i]
        if depth > MAX_DEPTH:
            raise FormatError(f"terms nested deeper than {MAX_DEPTH}", offset=off)
        if kind in ("int", "float") and len(val) > MAX_DIGITS:
            raise FormatError(f"number of {len(val)} digits (more than {MAX_DIGITS})", offset=off)
        if kind == "int":
            return int(val), i + 1
        if kind == "float":
            return float(val), i + 1
        if kind == "atom":
            return Atom(val.decode()), i + 1
        if kind == "qatom":
            return Atom(_unescape(val[1:-1]).decode("utf-8", "replace")), i + 1
        if kind == "str":
            return list(_unescape(val[1:-1])), i + 1
        if kind == "bin":
            data, i = bytearray(), i + 1
            while toks[i][0] != "ebin":
                k, v, o = toks[i]
                if k == "int":
                    if len(v) > MAX_DIGITS:
                        raise FormatError(f"number of {len(v)} digits in binary", offset=o)
                    data.append(int(v) & 0xFF)
                elif k == "str":
                    chars = _unescape(v[1:-1])
                    if toks[i + 1][:2] == ("punct", b"/") and toks[i + 2][:2] == ("atom", b"utf8"):
                        i += 2  # <<"..."/utf8>>: the characters' UTF-8 bytes (as ~p prints them)
                        chars = chars.decode("utf-8", "replace").encode("utf-8")
                    data += chars
                elif not (k == "punct" and v == b","):
                    raise FormatError(f"unexpected {v!r} in binary", offset=o)
                i += 1
            return bytes(data), i + 1
        if kind == "map":
            out, i = {}, i + 1
            while not (toks[i][0] == "punct" and toks[i][1] == b"}"):
                k, i = term(i, depth + 1)
                if toks[i][0] != "arrow":
                    raise FormatError("a map key not followed by '=>'", offset=toks[i][2])
                v, i = term(i + 1, depth + 1)
                try:
                    out[k if not isinstance(k, list) else tuple(k)] = v
                except TypeError:  # a map or tuple of maps as a key: no key any check asks for
                    pass
                if toks[i][0] == "punct" and toks[i][1] == b",":
                    i += 1
            return out, i + 1
        if kind == "punct" and val in (b"{", b"["):
            close = b"}" if val == b"{" else b"]"
            items, i = [], i + 1
            while not (toks[i][0] == "punct" and toks[i][1] == close):
                v, i = term(i, depth + 1)
                items.append(v)
                if toks[i][0] == "punct" and toks[i][1] == b",":
                    i += 1
            return (tuple(items) if close == b"}" else items), i + 1
        raise FormatError(f"unexpected {val!r}", offset=off)

    try:
        while i < len(toks):
            v, i = term(i)
            if i >= len(toks) or toks[i][1] != b".":
                raise FormatError("term not ended by '.'", offset=toks[i][2] if i < len(toks) else len(text))
            out.append(v)
            i += 1
    except IndexError:
        raise FormatError("unexpected end of terms", offset=len(text)) from None
    return out


def _unescape(s: bytes) -> bytes:
    return re.sub(rb"\\(.)", lambda m: {b"n": b"\n", b"t": b"\t"}.get(m.group(1), m.group(1)), s)


def proplist(terms: list) -> dict:
    """``[{Key, Value}, ...]`` -> dict; the first occurrence wins, as in proplists:get_value."""
    out = {}
    for t in terms:
        if isinstance(t, tuple) and len(t) == 2:
            try:
                if t[0] not in out:
                    out[t[0]] = t[1]
            except TypeError:  # a list or map as the key (no proplist key any lookup asks for)
                continue
    return out


def segment_entry_count(raw: bytes | None) -> int | None:
    """``{segment_entry_count, N}.`` from a vhost's ``.config``; None when absent or unreadable."""
    if raw is None:
        return None
    value = proplist(consult(raw)).get("segment_entry_count")
    return value if isinstance(value, int) and 0 < value <= 16384 else None


# -- the shape each writer gives its text file --------------------------------------------------------


def _atoms(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, Atom) for x in v)


def _client_refs(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, bytes) and len(x) == 16 for x in v)


def _vhost_config(terms: list, node: str | None) -> str | None:
    n = proplist(terms).get("segment_entry_count")
    if not (isinstance(n, int) and 0 < n <= 16384):
        return (
            "no {segment_entry_count, N} term (VH write_config writes one): the broker falls back to its "
            "configured default and reads the vhost's index segments with that count"
        )
    return None


def _clean_dot(transient: bool):
    def check(terms: list, node: str | None) -> str | None:
        p = proplist(terms)
        if not _client_refs(p.get("client_refs")) or not isinstance(p.get("index_module", Atom("")), Atom):
            return (
                "not the {client_refs, [<<Ref:16/binary>>, ...]} term (and, before 4.0, {index_module, M}) "
                "MS terminate writes"
            )
        if transient and p["client_refs"]:
            return (
                "client_refs recorded for the transient store, whose clean.dot always records none (a file of "
                "a persistent store put in its place); the broker deletes the transient store at boot"
            )
        return None

    return check


def _cluster_nodes(terms: list, node: str | None) -> str | None:
    if len(terms) != 1:
        return "not one term (rabbit_node_monitor writes {AllNodes, DiscNodes}): the broker refuses to boot"
    t = terms[0]
    if isinstance(t, tuple) and len(t) == 2 and _atoms(t[0]) and _atoms(t[1]):
        nodes = t[0]
        if not set(t[1]) <= set(nodes):
            return (
                f"its disc nodes ({', '.join(map(str, t[1]))}) are not all among its nodes "
                f"({', '.join(map(str, nodes))}): rabbit_node_monitor writes a subset"
            )
    elif _atoms(t):  # the legacy form, still read
        nodes = t
    else:
        return "not {AllNodes, DiscNodes} (lists of node names): the broker refuses to boot"
    if node is not None and nodes and node not in nodes:
        return (
            f"the cluster it records ({', '.join(map(str, nodes))}) does not include this node ({node}): "
            "the broker waits at boot for those nodes' tables"
        )
    return None


def _one(test, what: str):
    def check(terms: list, node: str | None) -> str | None:
        return None if len(terms) == 1 and test(terms[0]) else f"not {what}"

    return check


#: file name -> the check of its terms (None: fine), after the common ones (text, parses)
TEXT_SHAPES = {
    ".config": _vhost_config,
    "clean.dot:persistent": _clean_dot(False),
    "clean.dot:transient": _clean_dot(True),
    "cluster_nodes.config": _cluster_nodes,
    "nodes_running_at_shutdown": _one(
        _atoms, "one list of node names (rabbit_node_monitor): the broker refuses to boot"
    ),
    "node-type.txt": _one(lambda t: t in (Atom("disc"), Atom("ram")), "the atom disc or ram"),
    "rabbit_serial": _one(lambda t: isinstance(t, int) and t >= 0, "one non-negative integer"),
    "schema_version": _one(_atoms, "one list of upgrade step names"),
    "ra-config": _one(
        lambda t: isinstance(t, dict),
        "one map (ra_log:write_config writes the server's config as ~p.): Ra cannot restart the server",
    ),
}


def text_damage(raw: bytes, shape: str, node: str | None = None) -> tuple[str, int | None] | None:
    """What is wrong with a broker-written text file, as ``(problem, offset)``, or None: a NUL
    byte (every writer writes printable text: ``~w``/``~p``), terms ``file:consult`` cannot read,
    or terms that are not the shape its writer gives it (``TEXT_SHAPES``; ``node``: this node's
    name, which the cluster files must hold)."""
    nul = raw.find(b"\0")
    if nul >= 0:
        return "a NUL byte (the broker writes text): zeroed or overwritten", nul
    try:
        terms = consult(raw)
    except FormatError as e:
        return f"unreadable terms: {e.message}", e.offset
    problem = TEXT_SHAPES[shape](terms, node)
    return (problem, None) if problem else None
