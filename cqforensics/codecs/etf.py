"""Erlang External Term Format: a tolerant, bounded decoder and a byte-exact encoder.

Decoding maps terms to Python values:

=========================  ==========================================================
Erlang                     Python
=========================  ==========================================================
atom                       :class:`Atom` (a ``str``; ``.utf8`` remembers the encoding)
integer / big integer      ``int``
float                      ``float``
binary / bit binary        ``bytes`` / :class:`BitBinary`
tuple                      ``tuple``
proper list, string        ``list`` (STRING_EXT decodes to a list of ints)
improper list              :class:`ImproperList`
map                        ``dict`` (insertion order = order on the wire)
pid, port, ref, fun        :class:`Opaque` (tag + raw bytes, re-encoded verbatim)
=========================  ==========================================================

Hostile input is bounded: nesting depth, element counts larger than the remaining bytes and
compressed terms (tag 80) raise :class:`EtfError` with the offset; nothing hangs or allocates
more than the input justifies. Decompression has a budget per decode, not per compressed term:
the sizes that all compressed terms of one decode claim (nested ones included) add up, and a
claim beyond what is left of ``max_decompressed`` (64 MiB by default) fails before anything is
inflated, so a 1.6 MB term cannot expand to gigabytes. ``decode_budget()`` makes several decodes
(the parts of one message) share one budget. Error messages never embed decoded values.

``encode`` reproduces what ``term_to_binary/1`` writes for the terms RabbitMQ stores, given the
node's atom encoding (OTP <= 25: ATOM_EXT; OTP >= 26: SMALL_ATOM_UTF8/ATOM_UTF8), so decoded
broker terms re-encode byte-identically (tests check this on every sample message).
Sources: OTP ``erts/emulator/beam/external.c``, ``lib/erts/doc/src/erl_ext_dist.xml``.
"""

from __future__ import annotations

import contextlib
import contextvars
import struct
import threading
import zlib
from dataclasses import dataclass

from cqforensics.base.errors import FormatError, plural

VERSION = 131
NEW_FLOAT, BIT_BINARY, COMPRESSED = 70, 77, 80
NEW_PID, NEW_PORT, NEWER_REFERENCE, V4_PORT = 88, 89, 90, 120
SMALL_INTEGER, INTEGER, FLOAT, ATOM, REFERENCE, PORT, PID = 97, 98, 99, 100, 101, 102, 103
SMALL_TUPLE, LARGE_TUPLE, NIL, STRING, LIST, BINARY, SMALL_BIG, LARGE_BIG = 104, 105, 106, 107, 108, 109, 110, 111
NEW_FUN, EXPORT, NEW_REFERENCE, SMALL_ATOM, MAP, FUN, ATOM_UTF8, SMALL_ATOM_UTF8 = (
    112,
    113,
    114,
    115,
    116,
    117,
    118,
    119,
)

MAX_DEPTH = 200
MAX_BIG_BYTES = 1024  # ~2,466 digits: larger integers break Python's int/str conversion (4,300 digits)
MAX_DECOMPRESSED = 64 << 20  # bytes all compressed terms of one decode may inflate to, together
_ZCHUNK = 1 << 16  # compressed bytes fed to zlib at a time


class EtfError(FormatError):
    """Bytes that are not a valid external term; ``offset`` is within the decoded buffer."""


class Atom(str):
    """An Erlang atom. ``utf8`` is the wire encoding it came with (None: choose on encode)."""

    __slots__ = ("utf8",)

    def __new__(cls, name: str, utf8: bool | None = None):
        self = str.__new__(cls, name)
        self.utf8 = utf8
        return self

    def __repr__(self) -> str:
        return f"Atom({str.__repr__(self)})"


@dataclass(frozen=True)
class BitBinary:
    data: bytes
    bits: int  # bits used in the last byte (1..8)


@dataclass(frozen=True)
class ImproperList:
    items: list
    tail: object


@dataclass(frozen=True)
class Opaque:
    """A pid, port, reference or fun: kept as raw bytes (tag included) and written back as is."""

    tag: int
    raw: bytes


_u16 = struct.Struct(">H").unpack_from
_u32 = struct.Struct(">I").unpack_from
_i32 = struct.Struct(">i").unpack_from
_f64 = struct.Struct(">d").unpack_from

_ATOM_CACHE: dict[tuple[bytes, bool], Atom] = {}


def make_atom(raw: bytes, utf8: bool) -> Atom:
    """The atom of these name bytes (``utf8``: its wire encoding), from the cache decoded atoms
    share; raises UnicodeDecodeError for a UTF-8 atom that is not UTF-8. The compiled core's
    term decoder makes its atoms with it, so both decoders give the same objects."""
    key = (raw, utf8)
    a = _ATOM_CACHE.get(key)
    if a is None:
        a = Atom(raw.decode("utf-8" if utf8 else "latin-1"), utf8)
        if len(_ATOM_CACHE) < 65536:
            _ATOM_CACHE[key] = a
    return a


class _Budget:
    """Bytes compressed terms may still inflate to; charging one also charges its parent (the
    budget of an enclosing ``decode_budget``)."""

    __slots__ = ("limit", "left", "parent")

    def __init__(self, limit: int, parent: _Budget | None = None):
        self.limit = self.left = max(0, int(limit))
        self.parent = parent

    def charge(self, n: int, offset: int) -> None:
        b = self
        while b is not None:
            if n > b.left:
                raise EtfError(
                    f"compressed term claims {plural(n, 'byte')}, over the decompression limit ({b.left} of "
                    f"the budget of {plural(b.limit, 'byte')} left)",
                    offset=offset,
                )
            b = b.parent
        b = self
        while b is not None:
            b.left -= n
            b = b.parent


_SHARED: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("cqforensics_etf_budget", default=None)


@contextlib.contextmanager
def decode_budget(limit: int = MAX_DECOMPRESSED):
    """Within this block every decode shares one decompression budget of ``limit`` bytes (on
    top of each decode's own): the parts of one message decoded one after another, or a whole
    command's worth of decodes, cannot inflate to more than ``limit`` together. Nests."""
    token = _SHARED.set(_Budget(limit, _SHARED.get()))
    try:
        yield
    finally:
        _SHARED.reset(token)


class _Decoder:
    __slots__ = ("buf", "end", "max_decompressed", "budget")

    def __init__(self, buf, max_decompressed: int, budget: _Budget | None = None):
        self.buf = buf
        self.end = len(buf)
        self.max_decompressed = max_decompressed
        self.budget = budget if budget is not None else _Budget(max_decompressed, _SHARED.get())

    def need(self, pos: int, n: int, what: str) -> None:
        if n < 0 or pos + n > self.end:
            raise EtfError(f"{what} needs {plural(n, 'byte')}, {max(0, self.end - pos)} left", offset=pos)

    def atom(self, pos: int, n: int, utf8: bool) -> Atom:
        self.need(pos, n, "atom")
        try:
            return make_atom(bytes(self.buf[pos : pos + n]), utf8)
        except UnicodeDecodeError:
            raise EtfError("atom is not valid UTF-8", offset=pos) from None

    def tuple_arity(self, tag: int, p: int, pos: int) -> tuple[int, int]:
        """The arity of the tuple tagged at ``pos`` (its arity field at ``p``) and where its
        elements start, checked against the bytes left (each element takes at least one)."""
        if tag == SMALL_TUPLE:
            self.need(p, 1, "tuple arity")
            n, p = self.buf[p], p + 1
        else:
            self.need(p, 4, "tuple arity")
            (n,), p = _u32(self.buf, p), p + 4
        if n > self.end - p:
            raise EtfError(f"tuple arity {n} exceeds the remaining bytes", offset=pos)
        return n, p

    def term(self, pos: int, depth: int):
        if pos >= self.end:
            raise EtfError("term truncated", offset=pos)
        if depth > MAX_DEPTH:
            raise EtfError(f"terms nested deeper than {MAX_DEPTH}", offset=pos)
        buf, end = self.buf, self.end
        tag = buf[pos]
        p = pos + 1
        # the common tags first, their bounds checked inline (``need`` only words the error)
        if tag == SMALL_ATOM_UTF8 or tag == SMALL_ATOM:
            if p + 1 > end:
                self.need(p, 1, "atom length")
            n = buf[p]
            q = p + 1 + n
            if q > end:
                self.need(p + 1, n, "atom")
            a = _ATOM_CACHE.get((bytes(buf[p + 1 : q]), tag == SMALL_ATOM_UTF8))
            return (a if a is not None else self.atom(p + 1, n, tag == SMALL_ATOM_UTF8)), q
        if tag == BINARY:
            if p + 4 > end:
                self.need(p, 4, "binary length")
            (n,) = _u32(buf, p)
            p += 4
            if p + n > end:
                self.need(p, n, "binary")
            return bytes(buf[p : p + n]), p + n
        if tag == NIL:
            return [], p
        if tag == SMALL_INTEGER:
            if p + 1 > end:
                self.need(p, 1, "small integer")
            return buf[p], p + 1
        if tag == ATOM or tag == ATOM_UTF8:
            self.need(p, 2, "atom length")
            (n,) = _u16(buf, p)
            return self.atom(p + 2, n, tag == ATOM_UTF8), p + 2 + n
        if tag == SMALL_TUPLE or tag == LARGE_TUPLE:
            n, p = self.tuple_arity(tag, p, pos)
            items = []
            for _ in range(n):
                v, p = self.term(p, depth + 1)
                items.append(v)
            return tuple(items), p
        if tag == LIST:
            self.need(p, 4, "list length")
            (n,) = _u32(buf, p)
            p += 4
            if n > self.end - p:
                raise EtfError(f"list length {n} exceeds the remaining bytes", offset=pos)
            items = []
            for _ in range(n):
                v, p = self.term(p, depth + 1)
                items.append(v)
            tail, p = self.term(p, depth + 1)
            if tail == [] and type(tail) is list:
                return items, p
            return ImproperList(items, tail), p
        if tag == MAP:
            self.need(p, 4, "map arity")
            (n,) = _u32(buf, p)
            p += 4
            if 2 * n > self.end - p:
                raise EtfError(f"map arity {n} exceeds the remaining bytes", offset=pos)
            out = {}
            for _ in range(n):
                k, p = self.term(p, depth + 1)
                v, p = self.term(p, depth + 1)
                try:
                    out[_hashable(k)] = v
                except TypeError:
                    raise EtfError("unhashable map key", offset=p) from None
            return out, p
        if tag == INTEGER:
            self.need(p, 4, "integer")
            return _i32(buf, p)[0], p + 4
        if tag == STRING:
            self.need(p, 2, "string length")
            (n,) = _u16(buf, p)
            self.need(p + 2, n, "string")
            return list(buf[p + 2 : p + 2 + n]), p + 2 + n
        if tag == NEW_FLOAT:
            self.need(p, 8, "float")
            return _f64(buf, p)[0], p + 8
        if tag == SMALL_BIG or tag == LARGE_BIG:
            if tag == SMALL_BIG:
                self.need(p, 2, "big integer header")
                n, p = buf[p], p + 1
            else:
                self.need(p, 5, "big integer header")
                (n,), p = _u32(buf, p), p + 4
            if n > MAX_BIG_BYTES:
                raise EtfError(f"big integer of {plural(n, 'byte')} (more than {MAX_BIG_BYTES})", offset=p)
            sign = buf[p]
            self.need(p + 1, n, "big integer")
            v = int.from_bytes(buf[p + 1 : p + 1 + n], "little")
            return (-v if sign else v), p + 1 + n
        if tag == BIT_BINARY:
            self.need(p, 5, "bit binary header")
            (n,) = _u32(buf, p)
            bits = buf[p + 4]
            self.need(p + 5, n, "bit binary")
            return BitBinary(bytes(buf[p + 5 : p + 5 + n]), bits), p + 5 + n
        if tag == FLOAT:
            self.need(p, 31, "float text")
            text = bytes(buf[p : p + 31]).split(b"\0", 1)[0]
            try:
                return float(text), p + 31
            except ValueError:
                raise EtfError("bad float text", offset=p) from None
        if tag == COMPRESSED:
            return self.compressed(p, depth)
        if tag in _OPAQUE:
            q = self.skip_opaque(tag, p, depth)
            return Opaque(tag, bytes(buf[pos:q])), q
        raise EtfError(f"unknown term tag {tag}", offset=pos)

    def skip(self, pos: int, depth: int) -> int:
        """The end of the term at ``pos``, checked as ``term`` checks it but built into nothing
        (a compressed term, whose end only its inflation tells, is decoded)."""
        if pos >= self.end:
            raise EtfError("term truncated", offset=pos)
        if depth > MAX_DEPTH:
            raise EtfError(f"terms nested deeper than {MAX_DEPTH}", offset=pos)
        buf = self.buf
        tag = buf[pos]
        p = pos + 1
        if tag == SMALL_ATOM_UTF8 or tag == SMALL_ATOM:
            self.need(p, 1, "atom length")
            n = buf[p]
            q = p + 1 + n
            if q > self.end or (bytes(buf[p + 1 : q]), tag == SMALL_ATOM_UTF8) not in _ATOM_CACHE:
                self.atom(p + 1, n, tag == SMALL_ATOM_UTF8)  # checked (and cached) as a decode would
            return q
        if tag == NIL:
            return p
        if tag == SMALL_INTEGER:
            self.need(p, 1, "small integer")
            return p + 1
        if tag == BINARY:
            self.need(p, 4, "binary length")
            (n,) = _u32(buf, p)
            self.need(p + 4, n, "binary")
            return p + 4 + n
        if tag == SMALL_TUPLE or tag == LARGE_TUPLE or tag == LIST:
            if tag == SMALL_TUPLE:
                self.need(p, 1, "tuple arity")
                n, p = buf[p], p + 1
            else:
                self.need(p, 4, "list length" if tag == LIST else "tuple arity")
                (n,), p = _u32(buf, p), p + 4
            if n > self.end - p:
                raise EtfError(
                    f"{'list length' if tag == LIST else 'tuple arity'} {n} exceeds the remaining bytes", offset=pos
                )
            for _ in range(n + (tag == LIST)):  # a list's tail too
                p = self.skip(p, depth + 1)
            return p
        return self.term(pos, depth)[1]  # the rest (maps: their keys must hash) as a decode does

    def tuple_fields(self, pos: int, wanted: frozenset[int]):
        """The tuple at ``pos`` with only its ``wanted`` elements decoded (None in the others'
        places), and its end: the bytes are checked as ``term`` checks them."""
        buf = self.buf
        tag = buf[pos] if pos < self.end else None
        if tag != SMALL_TUPLE and tag != LARGE_TUPLE:
            return self.term(pos, 0)
        n, p = self.tuple_arity(tag, pos + 1, pos)
        items = []
        end = self.end
        for i in range(n):
            if i in wanted:
                v, p = self.term(p, 1)
                items.append(v)
                continue
            items.append(None)
            # the fields most records leave as [] or a known atom, skipped inline (``skip`` for
            # anything else, and to word any error)
            t = buf[p] if p < end else None
            if t == NIL:
                p += 1
                continue
            if (t == SMALL_ATOM_UTF8 or t == SMALL_ATOM) and p + 1 < end:
                q = p + 2 + buf[p + 1]
                if q <= end and (bytes(buf[p + 2 : q]), t == SMALL_ATOM_UTF8) in _ATOM_CACHE:
                    p = q
                    continue
            p = self.skip(p, 1)
        return tuple(items), p

    def compressed(self, p: int, depth: int):
        self.need(p, 4, "uncompressed size")
        (size,) = _u32(self.buf, p)
        self.budget.charge(size, p)  # before inflating anything: the claims of one decode add up
        # fed in chunks: zlib copies the input it has not used, so one call on the whole rest of
        # a large buffer would copy it again for every compressed term in it
        z = zlib.decompressobj()
        src = memoryview(self.buf)
        pos, tail, parts, got = p + 4, b"", [], 0
        try:
            while not z.eof and got <= size:
                if not tail:
                    if pos >= self.end:
                        break
                    tail = src[pos : min(pos + _ZCHUNK, self.end)]  # never past the end the decoder has
                    pos += len(tail)
                part = z.decompress(tail, size + 1 - got)
                tail = z.unconsumed_tail
                parts.append(part)
                got += len(part)
        except zlib.error as e:
            raise EtfError(f"bad zlib data: {str(e)[:80]}", offset=p + 4) from None
        if got != size or not z.eof:
            raise EtfError(
                f"compressed term inflates to {'more than ' if got > size else ''}{plural(got, 'byte')}, "
                f"header says {size}",
                offset=p,
            )
        data = b"".join(parts)
        del parts
        inner = _Decoder(data, self.max_decompressed, self.budget)  # nested compressed terms: same budget
        v, q = inner.term(0, depth + 1)
        if q != size:
            raise EtfError("trailing bytes inside a compressed term", offset=p)
        return v, pos - len(tail) - len(z.unused_data)

    def skip_opaque(self, tag: int, p: int, depth: int) -> int:
        """End offset of a pid/port/ref/fun starting after its tag (contents not interpreted)."""
        buf = self.buf
        if tag in (NEW_PID, PID, NEW_PORT, PORT, V4_PORT, REFERENCE):
            _, p = self.term(p, depth + 1)  # node atom
            fixed = {NEW_PID: 12, PID: 9, NEW_PORT: 8, PORT: 5, V4_PORT: 12, REFERENCE: 5}[tag]
            self.need(p, fixed, "pid/port/ref")
            return p + fixed
        if tag in (NEWER_REFERENCE, NEW_REFERENCE):
            self.need(p, 2, "reference length")
            (n,) = _u16(buf, p)
            _, p = self.term(p + 2, depth + 1)
            size = 4 * n + (4 if tag == NEWER_REFERENCE else 1)
            self.need(p, size, "reference")
            return p + size
        if tag == EXPORT:
            for _ in range(3):
                _, p = self.term(p, depth + 1)
            return p
        if tag == NEW_FUN:
            self.need(p, 4, "fun size")
            (size,) = _u32(buf, p)
            self.need(p, size, "fun")
            return p + size
        if tag == FUN:
            self.need(p, 4, "fun free vars")
            (nfree,) = _u32(buf, p)
            p += 4
            if 4 + nfree > self.end - p:  # every term takes a byte at least
                raise EtfError(f"fun with {nfree} free variables exceeds the remaining bytes", offset=p - 4)
            for _ in range(4 + nfree):  # pid, module, index, uniq, free vars
                _, p = self.term(p, depth + 1)
            return p
        raise EtfError(f"unknown opaque tag {tag}", offset=p - 1)


_OPAQUE = frozenset(
    {NEW_PID, PID, NEW_PORT, PORT, V4_PORT, REFERENCE, NEWER_REFERENCE, NEW_REFERENCE, EXPORT, NEW_FUN, FUN}
)


def _hashable(v):
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple((k, _hashable(x)) for k, x in v.items())
    return v


def decode(buf, *, offset: int = 0, max_decompressed: int = MAX_DECOMPRESSED, exact: bool = False):
    """Decode the external term at ``buf[offset:]`` (leading 131 byte required).

    Returns ``(term, end_offset)``. Trailing bytes are allowed (``binary_to_term`` ignores
    them too) unless ``exact``.
    """
    if offset >= len(buf) or buf[offset] != VERSION:
        got = buf[offset] if offset < len(buf) else None
        raise EtfError(f"not an external term (first byte {got!r}, want 131)", offset=offset)
    d = _Decoder(buf, max_decompressed)
    try:
        term, end = d.term(offset + 1, 0)
    except RecursionError:
        raise EtfError("terms nested too deeply", offset=offset) from None
    if exact and end != len(buf):
        raise EtfError(f"{len(buf) - end} trailing bytes after the term", offset=end)
    return term, end


_LAST = threading.local()  # the buffer decode_at last read, and its budget


def decode_at(buf, pos: int, *, max_decompressed: int = MAX_DECOMPRESSED):
    """Decode the term whose tag is at ``buf[pos]`` (no version byte); returns (term, end).

    Successive calls on the same buffer object (the parts of one stored term, read one after
    another as ``fastpath`` does) share one decompression budget, so many compressed parts of
    one message cannot each inflate to the limit."""
    last = getattr(_LAST, "state", None)
    if last is not None and last[0] is buf and last[1] == max_decompressed and last[3] is _SHARED.get():
        budget = last[2]
    else:
        budget = _Budget(max_decompressed, _SHARED.get())
        _LAST.state = (buf, max_decompressed, budget, _SHARED.get())
    try:
        return _Decoder(buf, max_decompressed, budget).term(pos, 0)
    except RecursionError:
        raise EtfError("terms nested too deeply", offset=pos) from None


def decode_fields_at(buf, pos: int, wanted, *, end: int | None = None, max_decompressed: int = MAX_DECOMPRESSED):
    """The tuple whose tag is at ``buf[pos]`` with only the elements at the positions ``wanted``
    decoded (None in the others' places), and its end: as ``decode_at``, for a reader that needs
    a few fields of many large records (a term that is no tuple is decoded whole). The skipped
    bytes are checked as a decode checks them, so a record decodes here exactly when it decodes
    whole. ``end``: the record must end by ``buf[end]`` (as if ``buf`` ended there, without
    the copy or view a slice of it would make for each record)."""
    try:
        d = _Decoder(buf, max_decompressed)
        if end is not None:
            d.end = min(d.end, max(pos, end))
        return d.tuple_fields(pos, frozenset(wanted))
    except RecursionError:
        raise EtfError("terms nested too deeply", offset=pos) from None


def binary_to_term(buf):
    """Decode a whole buffer holding one term (trailing bytes allowed)."""
    return decode(buf)[0]


# -- encoding ----------------------------------------------------------------------------------


def term_to_binary(term, *, utf8_atoms: bool = True) -> bytes:
    """Encode like ``term_to_binary/1`` on an OTP node with the given atom encoding.

    Atoms that carry their own ``utf8`` flag (decoded ones) keep it, so decoded terms
    re-encode exactly as they were read.
    """
    out = bytearray([VERSION])
    _encode(term, out, utf8_atoms)
    return bytes(out)


def _encode(t, out: bytearray, utf8: bool) -> None:
    if isinstance(t, Atom) or (isinstance(t, bool)):
        if isinstance(t, bool):
            t = Atom("true" if t else "false")
        use_utf8 = utf8 if t.utf8 is None else t.utf8
        if use_utf8:
            raw = t.encode("utf-8")
            if len(raw) < 256:
                out += bytes((SMALL_ATOM_UTF8, len(raw))) + raw
            else:
                out += bytes((ATOM_UTF8,)) + struct.pack(">H", len(raw)) + raw
        else:
            raw = t.encode("latin-1")
            out += bytes((ATOM,)) + struct.pack(">H", len(raw)) + raw
    elif isinstance(t, int):
        if 0 <= t < 256:
            out += bytes((SMALL_INTEGER, t))
        elif -(2**31) <= t < 2**31:
            out += bytes((INTEGER,)) + struct.pack(">i", t)
        else:
            mag = abs(t)
            raw = mag.to_bytes((mag.bit_length() + 7) // 8, "little")
            if len(raw) < 256:
                out += bytes((SMALL_BIG, len(raw), 1 if t < 0 else 0)) + raw
            else:
                out += bytes((LARGE_BIG,)) + struct.pack(">I", len(raw)) + bytes((1 if t < 0 else 0,)) + raw
    elif isinstance(t, (bytes, bytearray, memoryview)):
        out += bytes((BINARY,)) + struct.pack(">I", len(t)) + bytes(t)
    elif isinstance(t, tuple):
        if len(t) < 256:
            out += bytes((SMALL_TUPLE, len(t)))
        else:
            out += bytes((LARGE_TUPLE,)) + struct.pack(">I", len(t))
        for x in t:
            _encode(x, out, utf8)
    elif isinstance(t, list):
        if not t:
            out.append(NIL)
        elif len(t) < 65536 and all(type(x) is int and 0 <= x < 256 for x in t):
            out += bytes((STRING,)) + struct.pack(">H", len(t)) + bytes(t)
        else:
            out += bytes((LIST,)) + struct.pack(">I", len(t))
            for x in t:
                _encode(x, out, utf8)
            out.append(NIL)
    elif isinstance(t, dict):
        out += bytes((MAP,)) + struct.pack(">I", len(t))
        for k, v in t.items():
            _encode(k, out, utf8)
            _encode(v, out, utf8)
    elif isinstance(t, float):
        out += bytes((NEW_FLOAT,)) + struct.pack(">d", t)
    elif isinstance(t, str):  # a plain str is a binary of its UTF-8 bytes
        raw = t.encode("utf-8")
        out += bytes((BINARY,)) + struct.pack(">I", len(raw)) + raw
    elif isinstance(t, ImproperList):
        out += bytes((LIST,)) + struct.pack(">I", len(t.items))
        for x in t.items:
            _encode(x, out, utf8)
        _encode(t.tail, out, utf8)
    elif isinstance(t, BitBinary):
        out += bytes((BIT_BINARY,)) + struct.pack(">I", len(t.data)) + bytes((t.bits,)) + t.data
    elif isinstance(t, Opaque):
        out += t.raw
    elif t is None:
        _encode(Atom("undefined"), out, utf8)
    else:
        raise TypeError(f"cannot encode {type(t).__name__} as an Erlang term")


def term_order_key(t):
    """Sort key for Erlang term order (number < atom < reference < fun < port < pid < tuple
    < map < nil < list < bit string), used to lay out small maps as term_to_binary does."""
    if isinstance(t, bool):
        t = Atom("true" if t else "false")
    if isinstance(t, (int, float)):
        return (0, t)
    if isinstance(t, Atom):
        return (1, str(t))
    if isinstance(t, Opaque):
        return (2, t.tag, t.raw)
    if isinstance(t, tuple):
        return (6, len(t), tuple(term_order_key(x) for x in t))
    if isinstance(t, dict):
        return (7, len(t), tuple(sorted(term_order_key(k) for k in t)))
    if isinstance(t, list):
        return (8, tuple(term_order_key(x) for x in t)) if t else (8,)
    if isinstance(t, (bytes, bytearray, str, BitBinary)):
        raw = t.encode() if isinstance(t, str) else (t.data if isinstance(t, BitBinary) else bytes(t))
        return (10, raw)
    return (11, repr(t))


def erlang_map(pairs) -> dict:
    """A dict whose iteration order is the order term_to_binary uses for a small map."""
    return dict(sorted(pairs, key=lambda kv: term_order_key(kv[0])))


# -- text ---------------------------------------------------------------------------------------

_RESERVED = frozenset(
    "after and andalso band begin bnot bor bsl bsr bxor case catch cond div else end fun if "
    "let maybe not of or orelse receive rem try when xor".split()
)
_ESCAPES = {
    "\\": "\\\\",
    "\n": "\\n",
    "\t": "\\t",
    "\r": "\\r",
    "\b": "\\b",
    "\f": "\\f",
    "\v": "\\v",
    "\x1b": "\\e",
    "\x7f": "\\d",
}


def _quoted(text: str, quote: str) -> str:
    out = []
    for ch in text:
        if ch == quote:
            out.append("\\" + ch)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 32:
            out.append(f"\\x{{{ord(ch):X}}}")
        else:
            out.append(ch)
    return quote + "".join(out) + quote


def _atom_text(a: str) -> str:
    if a and "a" <= a[0] <= "z" and a not in _RESERVED and all(c.isascii() and (c.isalnum() or c in "_@") for c in a):
        return a
    return _quoted(a, "'")


def _printable(text: str) -> bool:
    return all(ch.isprintable() or ch in "\n\t\r" for ch in text)


def _binary_text(b: bytes) -> str:
    if b:
        try:
            text = b.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and _printable(text):
            return f"<<{_quoted(text, chr(34))}{'' if text.isascii() else '/utf8'}>>"
    return "<<" + ",".join(str(x) for x in b) + ">>"


def _opaque_text(o: Opaque) -> str:
    """Pids as ``<node.id.serial>`` (the node named, as the term holds it); ports, references
    and funs as ``#Port<...>``, ``#Ref<...>``, ``#Fun<...>`` with their node and raw words."""
    try:
        d = _Decoder(o.raw, MAX_DECOMPRESSED)
        if o.tag in (NEW_PID, PID):
            node, p = d.term(1, 0)
            ident, serial = _u32(o.raw, p)[0], _u32(o.raw, p + 4)[0]
            return f"<{_atom_text(node)}.{ident}.{serial}>"
        if o.tag in (NEW_PORT, PORT, V4_PORT):
            node, p = d.term(1, 0)
            n = 8 if o.tag == V4_PORT else 4
            return f"#Port<{_atom_text(node)}.{int.from_bytes(o.raw[p : p + n], 'big')}>"
        if o.tag in (NEWER_REFERENCE, NEW_REFERENCE, REFERENCE):
            if o.tag == REFERENCE:
                node, p = d.term(1, 0)
                words = [_u32(o.raw, p)[0]]
            else:
                (n,) = _u16(o.raw, 1)
                node, p = d.term(3, 0)
                p += 4 if o.tag == NEWER_REFERENCE else 1
                words = [_u32(o.raw, p + 4 * i)[0] for i in range(n)]
            return f"#Ref<{_atom_text(node)}.{'.'.join(str(w) for w in reversed(words))}>"
        if o.tag == EXPORT:
            m, p = d.term(1, 0)
            f, p = d.term(p, 0)
            a, _ = d.term(p, 0)
            return f"fun {_atom_text(m)}:{_atom_text(f)}/{a}"
    except (EtfError, struct.error, TypeError):
        pass
    return f"#Fun<{o.raw.hex()}>" if o.tag in (NEW_FUN, FUN) else f"#Opaque<{o.tag}:{o.raw.hex()}>"


def opaque_node(t) -> str | None:
    """The node a decoded pid, port or reference names (``rabbit@host``), None when ``t`` is none
    of these or unreadable."""
    if not isinstance(t, Opaque) or t.tag not in (
        NEW_PID,
        PID,
        NEW_PORT,
        PORT,
        V4_PORT,
        REFERENCE,
        NEWER_REFERENCE,
        NEW_REFERENCE,
    ):
        return None
    try:
        node, _ = _Decoder(t.raw, 0).term(3 if t.tag in (NEWER_REFERENCE, NEW_REFERENCE) else 1, 0)
    except (EtfError, struct.error, IndexError):
        return None
    return str(node) if isinstance(node, Atom) else None


def pid_node(t) -> str | None:
    """The node a decoded pid names (``rabbit@host``), None when ``t`` is no readable pid."""
    if not (isinstance(t, Opaque) and t.tag in (NEW_PID, PID)):
        return None
    raw = t.raw
    if len(raw) > 2 and (raw[1] == SMALL_ATOM_UTF8 or raw[1] == SMALL_ATOM):  # an atom decoded before
        node = _ATOM_CACHE.get((raw[3 : 3 + raw[2]], raw[1] == SMALL_ATOM_UTF8))
        if node is not None and 3 + raw[2] <= len(raw):
            return str(node)
    try:
        node, _ = _Decoder(raw, 0).term(1, 0)
    except (EtfError, struct.error, IndexError):
        return None
    return str(node) if isinstance(node, Atom) else None


def format_term(t) -> str:
    """A decoded term as Erlang writes it (``io:format("~0p")``-like): atoms bare or quoted,
    ``{tuples}``, ``[lists]`` (printable character lists as ``"strings"``), ``[a|Tail]``,
    ``#{maps}``, ``<<"binaries">>`` / ``<<1,2,3>>`` / ``<<1,2:3>>``, pids as ``<node.id.serial>``."""
    if isinstance(t, Atom):
        return _atom_text(t)
    if isinstance(t, bool):  # not produced by decode; shown as the atoms Erlang has
        return "true" if t else "false"
    if isinstance(t, int):
        return str(t)
    if isinstance(t, float):
        return repr(t)
    if isinstance(t, (bytes, bytearray)):
        return _binary_text(bytes(t))
    if isinstance(t, str):  # a plain str (not an Atom): Elixir-style text, shown as a binary
        return _binary_text(t.encode("utf-8"))
    if isinstance(t, tuple):
        return "{" + ",".join(format_term(x) for x in t) + "}"
    if isinstance(t, list):
        if t and all(type(x) is int and (32 <= x < 127 or x in (9, 10, 13)) for x in t):
            return _quoted("".join(map(chr, t)), '"')
        return "[" + ",".join(format_term(x) for x in t) + "]"
    if isinstance(t, ImproperList):
        return "[" + ",".join(format_term(x) for x in t.items) + "|" + format_term(t.tail) + "]"
    if isinstance(t, dict):
        return "#{" + ",".join(f"{format_term(k)} => {format_term(v)}" for k, v in t.items()) + "}"
    if isinstance(t, BitBinary):
        if not t.data:
            return "<<>>"
        *whole, last = t.data
        return "<<" + ",".join([str(x) for x in whole] + [f"{last >> (8 - t.bits)}:{t.bits}"]) + ">>"
    if isinstance(t, Opaque):
        return _opaque_text(t)
    return repr(t)
