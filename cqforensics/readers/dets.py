"""DETS v9 structure: the header, the segment array, the slots and the object blocks, checked
the way OTP's ``dets_v9.erl`` lays them out and reads them (``term-file-damaged`` findings).

``terms.dets_findings`` checks the cookie and version, the free-list chain at the end and the
object count of the ACTIVE-marker scan. That misses damage OTP reads through: a flipped bit in a
segment or slot pointer leaves every object in place (the scan still finds it) while OTP's
lookups go through the pointer. ``structure_findings`` walks the structure as OTP does.

File layout (``dets_v9.erl``, the comment at the top and ``read_file_header``/``file_header``;
constants from ``dets.hrl``), all words big-endian u32:

=========  =================================================================================
bytes      content
=========  =================================================================================
0          free-list pointer (not digested)        4   cookie 0x00ABCDEF (not digested)
8          closed properly: 1, or 0 (not digested) 12  type: 1 set, 2 bag, 3 duplicate_bag
16         version 9                               20  m (hash modulus, a power of two)
24         next (slots in use)                     28  keypos
32         no_objects                              36  no_keys
40         min_no_slots                            44  max_no_slots
48         hash method: 0 phash, 1 phash2          52  n (split pointer)
56..168    28 counters: object collections of 2^4 .. 2^31 bytes (the buddy sizes)
168..184   MD5 of bytes 12..168 (9(c)+; all zero: no MD5)
184..188   base of the buddy system (0: 1336); the size word at the end is the file size - this word
188..312   reserved, written as zeros, never read
312..1336  256 pointers to segment-array parts (one per 131072 slots)
1336..     parts (512 segment pointers, 2048 bytes), segments (256 slots of
           ``<<Size:32, Pointer:32>>``, 2048 bytes), object blocks ``<<Size:32, ?ACTIVE:32,
           Objects>>``, each in a buddy block of the next power of two >= Size
fl..       the free lists: ``<<Size:32, ?FREE:32, Pos:32, Addr:32...>>`` (the free buddy blocks
           of 2^(Pos-1) bytes, ascending), ``<<12:32, ?FREE:32, 12345:32>>``, the size word
=========  =================================================================================

What OTP does with it when it opens a table (``dets:fopen_existing_file``,
``dets_v9:check_file_header``, ``init_freelist``, ``cache_segps``): a wrong cookie, type code,
version or hash-method code, an MD5 that does not match, or a closed flag other than 0/1 make the
open fail (no repair); a closed flag 0, a size word that does not match, or free lists it cannot
read make it repair the table (a full scan of the object blocks: nothing is lost). Otherwise it
trusts the structure: it reads ``no_parts(next)`` part pointers and, from each part, the segment
pointers up to the first zero word; a lookup goes ``slot_position`` -> ``ipread_s32bu_p32bu`` (the
slot's size and pointer, then Size bytes at the pointer, which must begin ``<<Size:32, _:32>>``)
-> ``bin2objs``; a write goes through ``per_key``, which also wants the status ACTIVE. A slot
OTP cannot read this way makes it mark the table corrupt (every later call fails).

What ``structure_findings`` checks, for a table closed properly (one not closed properly gets the
header checks OTP makes before it repairs: MD5, type, hash method, closed flag; and ``open_words``:
the reserved bytes, part, segment and slot words OTP writes in a known form whenever it writes them,
and the blocks its slots name, which the repair rebuilds the table from):

* the header: its MD5 (a single flipped bit is located, named, and undone for the rest of the walk),
  the type and hash-method codes, every field in its range and the hash parameters consistent
  (``hash_invars``; next = m + n; m, min and max powers of two), no_keys <= no_objects (= for a set),
  the reserved bytes zero, the size word at the end against the base word;
* the free-list pointer against the chain it names (a pointer one bit away that names the real
  chain is a flipped bit), the free lists in the order ``bin_to_tree`` wants;
* the part pointers (part 0 always at 1336) and segment pointers in use (segment 0 right after the
  parts allocated first), all on 2048-byte buddy boundaries inside the data, none shared; the
  unused ones zero (OTP writes zeros and ignores them until the table grows: info). A pointer whose
  target is wrong but one bit away from a right one is named with the value it had;
* every slot: empty (two zero words) or naming a block ``<<Size, ACTIVE>>`` of its size on its
  buddy boundary, inside the data and no bigger than the biggest collection the header counts; the
  block's objects whole (``bin2objs``), decodable, tuples of >= keypos elements, and (hash method
  phash2) each key hashing to its slot (``db_hash``: ``erlang:phash2`` as ``make_hash2`` computes
  it); every block reached by one slot only (the one its keys hash to);
* every ACTIVE block the marker scan finds is reached by a slot (else it is named, and pinned on
  the slot pointer one bit away from it when there is one);
* the buddy system: parts, segments, object blocks (their buddy blocks) and the free blocks tile the
  space from 1336 to 2^31 bytes above the base without gap or overlap (a gap is pinned on the
  pointer or free-list entry one bit away from it);
* the header's object, key and per-size collection counts against what the slots reach.

Checks are bounded on hostile input: every loop has a cap, every read is bounded by the file size,
and work past the caps (``MAX_*``) is skipped (then the checks that need a complete walk are).
"""

from __future__ import annotations

import bisect
import hashlib
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cqforensics import compiled as core
from cqforensics.base.errors import plural
from cqforensics.base.findings import INFO, Finding
from cqforensics.codecs import etf
from cqforensics.readers import files

COOKIE = 0x00ABCDEF  # dets.hrl ?MAGIC
VERSION = 9
ACTIVE = 0x12345678  # dets.hrl ?ACTIVE
FREE = 0x03ABCDEF  # dets.hrl ?FREE
ENDFREE = 12345  # dets_v9.erl ?ENDFREE
SET, BAG, DUPLICATE_BAG = 1, 2, 3  # dets.hrl
PHASH, PHASH2 = 0, 1  # dets_v9.erl ?PHASH, ?PHASH2
HEADSZ = 56 + 28 * 4 + 16 + 4  # ?HEADSZ: 188 bytes read by read_file_header
COUNTERS_AT, MD5_AT, FL_BASE_AT = 56, 168, 184
DIGESTED = (12, MD5_AT)  # the MD5 covers the 44 + 112 bytes after the closed flag
HEADEND = HEADSZ + 124  # ?HEADEND: 312, the part pointers start here
SEGARRSZ = 256  # part pointers
SEGPARTSZ = 512  # segment pointers per part
SEGSZP = 256  # slots per segment
PART_BYTES = 4 * SEGPARTSZ
SEG_BYTES = 8 * SEGSZP
BASE = HEADEND + 4 * SEGARRSZ  # ?BASE: 1336
MAXSLOTS = SEGARRSZ * SEGPARTSZ * SEGSZP  # 2^25
MIN_LOG, MAX_LOG = 4, 31  # the counters: buddy sizes 2^4 .. 2^31
ALIGN = 2048  # every buddy base is BASE + k*2048: a block of S bytes starts on min(S, 2048)

MAX_SLOTS = 1 << 18  # non-empty slots examined (and as many again looked at before, to judge segments)
MAX_FIXES = 64  # pointers for which the value one bit away is looked for
MAX_DECODE_BYTES = 64 << 20  # object bytes decoded (all collections together)
MAX_OBJECTS = 200_000  # objects decoded
MAX_COLLECTION = 16 << 20  # a collection larger than this is not decoded
MAX_MARKERS = 1 << 20  # ACTIVE markers looked at
MAX_FREE_ADDRESSES = 1 << 18  # free-list addresses (and blocks) read, all chains tried together
MAX_REPORTED = 24  # findings of one kind before one summary finding
KEEP = 4 * MAX_REPORTED + 64  # problems of one kind kept (for merging) before they are only counted

_U32 = struct.Struct(">I").unpack_from
_U32x2 = struct.Struct(">II").unpack_from
_U32x3 = struct.Struct(">III").unpack_from
_HEAD = struct.Struct(">14I")

FIELDS = {
    0: "free-list pointer",
    4: "cookie",
    8: "closed-properly flag",
    12: "type",
    16: "version",
    20: "m (hash modulus)",
    24: "next (slots in use)",
    28: "keypos",
    32: "no_objects",
    36: "no_keys",
    40: "min_no_slots",
    44: "max_no_slots",
    48: "hash method",
    52: "n (split pointer)",
}
TYPES = {SET: "set", BAG: "bag", DUPLICATE_BAG: "duplicate_bag"}
OPEN_FAILS = "OTP's dets:open_file fails on it (no repair)"


def field_name(offset: int) -> str:
    """What the header word at ``offset`` (a multiple of 4) holds."""
    if offset in FIELDS:
        return FIELDS[offset]
    if COUNTERS_AT <= offset < MD5_AT:
        return f"the counter of {1 << ((offset - COUNTERS_AT) // 4 + MIN_LOG)}-byte object collections"
    if MD5_AT <= offset < FL_BASE_AT:
        return "the header MD5"
    if FL_BASE_AT <= offset < HEADSZ:
        return "the buddy-system base"
    if HEADSZ <= offset < HEADEND:
        return "the reserved header bytes"
    if HEADEND <= offset < BASE:
        return f"part pointer {(offset - HEADEND) // 4}"
    return "no header field"


@dataclass(frozen=True)
class Header:
    freelist: int
    cookie: int
    closed: int
    type: int
    version: int
    m: int
    next: int
    keypos: int
    no_objects: int
    no_keys: int
    min_slots: int
    max_slots: int
    hash_method: int
    n: int
    counters: tuple  # 28 words: collections of 2^4 .. 2^31 bytes
    md5: bytes
    fl_base: int

    @classmethod
    def parse(cls, head) -> Header:
        words = _HEAD.unpack_from(head, 0)
        counters = struct.unpack_from(">28I", head, COUNTERS_AT)
        return cls(*words, counters, bytes(head[MD5_AT : MD5_AT + 16]), _U32(head, FL_BASE_AT)[0])

    @property
    def has_counters(self) -> bool:
        """9(b)+: per-size counters (all zero with objects present: a 9(a) table, read_file_header)."""
        return any(self.counters) or self.no_objects == 0

    @property
    def max_collection(self) -> int | None:
        """``maxobjsize``: the biggest collection a slot may name (None: 9(a), no limit)."""
        if not self.has_counters:
            return None
        logs = [i + MIN_LOG for i, c in enumerate(self.counters) if c]
        return 1 << max(logs) if logs else 0


# -- erlang:phash2 ------------------------------------------------------------------------------
# make_hash2 of erts/emulator/beam/utils.c (a Bob Jenkins mix over the term's structure) and the
# atom hash of erts/emulator/beam/atom.c (hashpjw over the UTF-8 name, 64-bit HashValue, with the
# "latin1 clutch" folding C2/C3 sequences back to one byte). Checked against erlang:phash2/1 on
# OTP 25 in tests/readers/test_dets.py. Pids, ports, references, funs and maps are not hashed (None).

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
HCONST = 0x9E3779B9
_HC = {i: (HCONST * i) & _M32 for i in range(2, 23)}
_NIL_FIRST = 3468870702  # the hash of [] when nothing was hashed before it
_NIL_DEF = 0x2  # erl_term.h NIL_DEF


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    """Bob Jenkins' MIX (utils.c), on 32-bit words."""
    a = (a - b - c) & _M32
    a ^= c >> 13
    b = (b - c - a) & _M32
    b ^= (a << 8) & _M32
    c = (c - a - b) & _M32
    c ^= b >> 13
    a = (a - b - c) & _M32
    a ^= c >> 12
    b = (b - c - a) & _M32
    b ^= (a << 16) & _M32
    c = (c - a - b) & _M32
    c ^= b >> 5
    a = (a - b - c) & _M32
    a ^= c >> 3
    b = (b - c - a) & _M32
    b ^= (a << 10) & _M32
    c = (c - a - b) & _M32
    c ^= b >> 15
    return a, b, c


def _uhash2(x: int, y: int, const: int, h: int) -> int:
    """UINT32_HASH_2: mix two words into the running hash."""
    return _mix((const + x) & _M32, (const + y) & _M32, h)[2]


# block_hash_final_bytes: the 0..11 bytes left after the 12-byte rounds, (word, shift) per byte
_TAIL = ((0, 0), (0, 8), (0, 16), (0, 24), (1, 0), (1, 8), (1, 16), (1, 24), (2, 8), (2, 16), (2, 24))


def _block_hash(buf: bytes, initval: int) -> int:
    """block_hash (utils.c): a binary's bytes, 12 at a time as three little-endian words."""
    abc = [HCONST, HCONST, initval]
    n = len(buf)
    full = n - n % 12
    for i in range(0, full, 12):
        w0, w1, w2 = struct.unpack_from("<III", buf, i)
        abc = list(_mix((abc[0] + w0) & _M32, (abc[1] + w1) & _M32, (abc[2] + w2) & _M32))
    abc[2] = (abc[2] + n) & _M32  # the first byte of c is reserved for the length
    for k, byte in enumerate(buf[full:]):
        word, shift = _TAIL[k]
        abc[word] = (abc[word] + (byte << shift)) & _M32
    return _mix(*abc)[2]


def atom_hash(name: str) -> int:
    """``atom_hash`` (atom.c): the atom table's hash value of an atom, truncated to 32 bits."""
    p = name.encode("utf-8", "surrogatepass")
    h, i, n = 0, 0, len(p)
    while i < n:
        v = p[i]
        i += 1
        if i < n and (v & 0xFE) == 0xC2 and (p[i] & 0xC0) == 0x80:
            v = ((v << 6) | (p[i] & 0x3F)) & 0xFF
            i += 1
        h = ((h << 4) + v) & _M64
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
            h ^= g
    return h & _M32


class _Cdr:
    """The rest of a list from ``start`` (the C code pushes CDR cells)."""

    __slots__ = ("items", "start", "tail")

    def __init__(self, items, start, tail):
        self.items, self.start, self.tail = items, start, tail


def _is_byte(v) -> bool:
    return type(v) is int and 0 <= v <= 255


def make_hash2(term) -> int | None:
    """``make_hash2`` (utils.c) of a decoded term (``etf`` types); None for a term it cannot hash
    here (pids, ports, references, funs, maps)."""
    h = 0
    stack: list = []
    steps = 0
    while True:
        steps += 1
        if steps > 1 << 20:
            return None
        t = term
        if isinstance(t, _Cdr):
            t = t.tail if t.start >= len(t.items) else t
        if isinstance(t, (list, etf.ImproperList, _Cdr)) and not (type(t) is list and not t):
            if isinstance(t, _Cdr):
                items, i, tail = t.items, t.start, t.tail
            elif isinstance(t, etf.ImproperList):
                items, i, tail = t.items, 0, t.tail
            else:
                items, i, tail = t, 0, []
            c = sh = 0
            while i < len(items) and _is_byte(items[i]):  # the string optimization
                sh = ((sh << 8) + items[i]) & _M32
                if c == 3:
                    h = _uhash2(sh, 0, _HC[4], h)
                    c = sh = 0
                else:
                    c += 1
                i += 1
            if c > 0:
                h = _uhash2(sh, 0, _HC[4], h)
            if i < len(items):
                stack.append(_Cdr(items, i + 1, tail))
                term = items[i]
            else:
                term = tail
            continue
        if type(t) is list:  # []
            h = _NIL_FIRST if h == 0 else _uhash2(_NIL_DEF, 0, _HC[2], h)
        elif isinstance(t, etf.Atom):
            v = atom_hash(t)
            h = v if h == 0 else _uhash2(v, 0, _HC[3], h)
        elif type(t) is tuple:
            h = _uhash2(len(t), 0, _HC[9], h)
            if t:
                stack.extend(reversed(t[1:]))
                term = t[0]
                continue
        elif type(t) is int:
            if -(1 << 27) <= t < (1 << 27):
                if t < 0:
                    h = _uhash2((-t) & _M32, 0, HCONST, h)
                h = _uhash2(t & _M32, 0, HCONST, h)
            else:
                const, m = (_HC[10], -t) if t < 0 else (_HC[11], t)
                while True:  # the 64-bit digits of the magnitude, least significant first
                    d = m & _M64
                    h = _uhash2(d & _M32, d >> 32, const, h)
                    m >>= 64
                    if not m:
                        break
        elif type(t) is float:
            hi, lo = struct.unpack(">II", struct.pack(">d", 0.0 if t == 0.0 else t))
            h = _uhash2(hi, lo, _HC[12], h)
        elif type(t) is bytes:
            con = (_HC[13] + h) & _M32
            h = _block_hash(t, con) if t else con
        elif isinstance(t, etf.BitBinary):
            con = (_HC[13] + h) & _M32
            if t.bits >= 8 or not t.data:
                h = _block_hash(t.data, con) if t.data else con
            else:
                sz = len(t.data) - 1
                h = _block_hash(t.data[:sz], con)
                h = _uhash2(t.bits, t.data[sz] >> (8 - t.bits), _HC[15], h)
        else:
            return None  # pid, port, reference, fun, map: not hashed here
        if not stack:
            return h
        term = stack.pop()


def phash2(term) -> int | None:
    """``erlang:phash2/1``: 0 .. 2^27-1 (None: a term ``make_hash2`` here does not cover)."""
    h = make_hash2(term)
    return None if h is None else h & ((1 << 27) - 1)


def slot_of(key, m: int, n: int) -> int | None:
    """``dets_v9:db_hash/2`` for hash method phash2: the slot a key lives in."""
    h = phash2(key)
    if h is None:
        return None
    s = h & (m - 1)
    return h & (2 * m - 1) if s < n else s


# -- the check ----------------------------------------------------------------------------------


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _buddy(size: int) -> int:
    """The buddy block a collection of ``size`` bytes occupies (dets_utils:alloc of adjsz(size):
    the smallest power of two >= size)."""
    return 1 << max(0, (size - 1).bit_length())


def _one_bit(a: int, b: int) -> bool:
    return a != b and (a ^ b) & ((a ^ b) - 1) == 0


@dataclass
class _Problem:
    kind: str
    message: str
    offset: int | None
    pointer: int | None = None  # the value of the pointer word at ``offset``, for a bad pointer
    severity: str | None = None
    details: dict = field(default_factory=dict)


@dataclass
class _Ref:
    slot: int
    at: int  # the slot's offset (size word; the pointer word is at + 4)
    size: int  # the slot's size word
    block_size: int  # the size the block has (its own word when that is the whole one)
    ok: bool  # the slot reads this block the way OTP wants


@dataclass
class _Item:
    """Something that occupies bytes of the buddy system."""

    start: int
    end: int
    what: str
    at: int | None  # where the word naming it is
    kind: str  # part, segment, block, unreached, free
    extra: tuple = ()  # more offsets worth naming (a free entry's size-class word)
    verified: bool = False  # its content checks out (then a pointer one bit away from a gap is not it)


@dataclass
class _Chain:
    free: list  # (address, size, offset of the address word, offset of the size-class word)
    starts: set
    end: int  # where the end block ends
    problem: tuple | None  # (offset, why) OTP cannot read them (bad_freelists)


def _chain(data, fl: int, budget: list) -> _Chain | None:
    """The free lists from ``fl`` (dets_v9 free_lists_from_file/bin_to_tree); None when there is
    no well-formed chain there (no ?FREE block, or it runs off the file, or is too long).
    ``budget``: [blocks and addresses left to read], shared by every chain tried."""
    size = len(data)
    free, starts, o, run, last, problem = [], set(), fl, None, -1, None
    while True:
        budget[0] -= 1
        if o + 12 > size or budget[0] < 0:
            return None
        bsize, magic, pos = _U32x3(data, o)
        if magic != FREE or bsize < 12 or (bsize - 12) % 4:
            return None
        starts.add(o)
        if pos == ENDFREE:
            return _Chain(free, starts, o + 12, problem)
        budget[0] -= (bsize - 12) // 4
        if o + bsize > size or budget[0] < 0:
            return None
        if not 1 <= pos <= 32:
            problem = problem or (o + 8, f"free-list block at {o} names buddy size class {pos} (1..32)")
        else:
            if pos != run:
                run, last = pos, -1
            n = (bsize - 12) // 4
            for k, a in enumerate(struct.unpack_from(f">{n}I", data, o + 12)):
                if a <= last:
                    why = f"free-list address {a} at {o + 12 + 4 * k} is not above the one before it ({last})"
                    problem = problem or (o + 12 + 4 * k, why)
                last = a
                free.append((a, 1 << (pos - 1), o + 12 + 4 * k, o + 8))
        o += bsize


class _Check:
    def __init__(self, path: Path, data):
        self.path, self.data, self.size = path, data, len(data)
        self.problems: list[_Problem] = []
        self.kinds: dict[str, int] = {}
        self.complete = True  # the walk saw everything (no cap hit, nothing skipped)
        self.lost = False  # a part or segment could not be read: what it holds is unreached
        self.decoded = self.objects = 0
        self.found_objects = self.found_keys = 0
        self.collections: dict[int, int] = {}
        self.scored = self.fixes = 0
        self.decode_at = core.term_decoder_at()  # objects' terms (None: the reference decodes them)

    # -- problems ---------------------------------------------------------------------------
    def problem(
        self,
        kind: str,
        message: str,
        offset: int | None,
        pointer: int | None = None,
        severity: str | None = None,
        **details,
    ) -> _Problem:
        n = self.kinds[kind] = self.kinds.get(kind, 0) + 1
        p = _Problem(kind, message, offset, pointer, severity, details)
        if n <= KEEP:  # beyond: only counted (hostile input: bounded memory)
            self.problems.append(p)
        return p

    def emit(self) -> list[Finding]:
        out, shown = [], {}
        for p in self.problems:
            n = shown[p.kind] = shown.get(p.kind, 0) + 1
            if n <= MAX_REPORTED:
                out.append(
                    Finding(
                        "term-file-damaged",
                        p.message,
                        str(self.path),
                        p.offset,
                        severity=p.severity,
                        details={"check": p.kind, **p.details},
                    )
                )
        for kind, n in self.kinds.items():
            more = n - min(shown.get(kind, 0), MAX_REPORTED)
            if more > 0:
                out.append(
                    Finding(
                        "term-file-damaged",
                        f"{more} more problems of the same kind ({kind}) are not listed",
                        str(self.path),
                        None,
                        details={"check": kind, "more": more},
                    )
                )
        return out

    def word(self, off: int) -> int:
        return _U32(self.data, off)[0]

    # -- header -----------------------------------------------------------------------------
    def header(self) -> Header:
        """check_file_header's checks (made for open and closed tables alike: OTP makes them
        before it looks at the closed flag). Returns the header to walk with: when the MD5 shows
        which single bit flipped, the header as it was before the flip."""
        h = Header.parse(bytes(self.data[:HEADSZ]))
        if h.md5 != bytes(16):
            digested = bytearray(self.data[DIGESTED[0] : DIGESTED[1]])
            actual = hashlib.md5(digested).digest()
            if actual != h.md5:
                h = self.md5_mismatch(h, digested, actual)
        if h.type not in TYPES:
            self.problem(
                "header-type",
                f"the header's type code is {h.type} (1 set, 2 bag, 3 duplicate_bag): {OPEN_FAILS} (invalid_type_code)",
                12,
                field="type",
                value=h.type,
            )
        if h.hash_method not in (PHASH, PHASH2):
            self.problem(
                "header-hash-method",
                f"the header's hash method is {h.hash_method} (0 phash, 1 phash2): {OPEN_FAILS} (bad_hash_bif)",
                48,
                field="hash method",
                value=h.hash_method,
            )
        if h.closed not in (0, 1):
            self.problem(
                "header-closed",
                f"the closed-properly flag is {h.closed:#x} (OTP writes 0 or 1): {OPEN_FAILS} (not_a_dets_file)",
                8,
                field="closed-properly flag",
                value=h.closed,
            )
        return h

    def md5_mismatch(self, h: Header, digested: bytearray, actual: bytes) -> Header:
        """Say which bit flipped if one did, and undo it for the rest of the walk."""
        for i in range(len(digested)):
            for b in range(8):
                digested[i] ^= 1 << b
                if hashlib.md5(digested).digest() == h.md5:
                    off = DIGESTED[0] + i
                    word = off & ~3
                    was, now = _U32(digested, word - DIGESTED[0])[0], self.word(word)
                    self.problem(
                        "header-md5",
                        f"the header does not match its MD5: bit {b} of byte {off} is flipped "
                        f"({field_name(word)} reads {now}, the MD5 says it was {was}); {OPEN_FAILS} "
                        "(not_a_dets_file)",
                        off,
                        field=field_name(word),
                        value=now,
                        was=was,
                    )
                    fixed = bytearray(self.data[:HEADSZ])
                    fixed[DIGESTED[0] : DIGESTED[1]] = digested
                    return Header.parse(bytes(fixed))
                digested[i] ^= 1 << b
        diff = [i for i in range(16) if actual[i] != h.md5[i]]
        if len(diff) == 1 and _one_bit(actual[diff[0]], h.md5[diff[0]]):
            off = MD5_AT + diff[0]
            self.problem(
                "header-md5",
                f"the header's MD5 has a flipped bit in byte {off} (the fields match it with "
                f"that bit restored); {OPEN_FAILS} (not_a_dets_file)",
                off,
                field="the header MD5",
            )
            return h
        self.problem(
            "header-md5",
            "the header's fields (bytes 12..167) do not match their MD5 (bytes 168..183), "
            f"and no single flipped bit explains it; {OPEN_FAILS} (not_a_dets_file)",
            MD5_AT,
            field="the header MD5",
        )
        return h

    def fields(self, h: Header) -> bool:
        """The hash parameters and counts in their legal ranges (dets_v9 hash_invars, slots2,
        prep_table_copy; next = m + n holds after every grow/2). False: the slot geometry
        cannot be trusted."""
        ok = True

        def bad(off: int, why: str, geometry: bool = True):
            nonlocal ok
            ok = ok and not geometry
            value = self.word(off)
            self.problem(
                "header-field",
                f"the header's {field_name(off)} is {value}: {why}",
                off,
                field=field_name(off),
                value=value,
            )

        if h.keypos < 1:
            bad(28, "keypos counts from 1 (element(KeyPos, Object) fails on every object)", False)
        for off, v in ((40, h.min_slots), (44, h.max_slots), (20, h.m)):
            if not (_pow2(v) and SEGSZP <= v <= MAXSLOTS):
                bad(off, f"it is always a power of two from {SEGSZP} to {MAXSLOTS}")
        if h.next % SEGSZP or not SEGSZP <= h.next <= MAXSLOTS:
            bad(24, f"it is always a multiple of {SEGSZP} from {SEGSZP} to {MAXSLOTS}")
        if h.n % SEGSZP or h.n >= max(h.m, 1):
            bad(52, f"it is always a multiple of {SEGSZP} below m ({h.m})")
        if ok:
            if h.next != h.m + h.n:
                bad(24, f"it is always m + n ({h.m} + {h.n}): OTP's hash and the slots in use disagree")
            elif not h.min_slots <= h.m <= h.next <= h.max_slots:
                bad(
                    40,
                    f"OTP keeps min_no_slots <= m <= next <= max_no_slots ({h.min_slots}, {h.m}, {h.next}, "
                    f"{h.max_slots})",
                )
        if h.no_keys > h.no_objects:
            bad(36, f"more keys than objects ({h.no_objects})", False)
        elif h.type == SET and h.no_keys != h.no_objects:
            bad(36, f"a set holds one object per key, and no_objects is {h.no_objects}", False)
        return ok

    def reserved(self) -> None:
        r = bytes(self.data[HEADSZ:HEADEND])
        if any(r):
            i = next(i for i, b in enumerate(r) if b)
            self.problem(
                "header-reserved",
                f"reserved header byte {HEADSZ + i} is {r[i]:#04x}: OTP writes zeros "
                "there and never reads them (harmless, but a changed byte)",
                HEADSZ + i,
                severity=INFO,
            )

    # -- free lists -------------------------------------------------------------------------
    def freelists(self, h: Header) -> tuple[int, _Chain | None]:
        """(where the table's data ends, the free lists) — the free-list pointer checked against
        the chain it names: a chain that does not end at the size word, or one that a pointer
        one bit lower would also reach, means the pointer has a flipped bit."""
        size, fl = self.size, h.freelist
        budget = [MAX_FREE_ADDRESSES]

        def chain(c: int) -> _Chain | None:
            if not BASE <= c <= size - 16 or self.word(c + 4) != FREE:
                return None
            ch = _chain(self.data, c, budget)
            return ch if ch is not None and ch.end + 4 == size else None

        here = chain(fl)
        names_block = BASE <= fl <= size - 16 and self.word(fl + 4) == FREE
        for k in range(32 if here is not None or not names_block else 0):
            c = fl ^ (1 << k)
            if here is not None and c > fl:
                continue
            ch = chain(c)
            if ch is None or ch.problem is not None or (here is not None and fl not in ch.starts):
                continue
            effect = (
                "OTP reads the free lists from there, fails (bad_freelists) and repairs the table at open"
                if here is None
                else "OTP reads only the free lists from there on: the free blocks listed "
                f"before ({len(ch.free) - len(here.free)}) are lost to it"
            )
            self.problem(
                "free-list-pointer",
                f"the header's free-list pointer is {fl}: bit {k} is flipped (the free "
                f"lists start at {c}, where a chain of them ends at the file's size word); {effect}",
                0,
                pointer=fl,
                was=c,
            )
            return c, ch
        if here is not None and here.problem is not None:
            off, why = here.problem
            self.problem(
                "free-lists",
                f"{why}: OTP cannot read the free lists (bad_freelists) and repairs the table at open",
                off,
            )
        end = fl if BASE <= fl <= size else size
        return end, here

    def trailer(self, h: Header, free: list | None) -> None:
        """read_file_header's trailer: the last word + the raw base word is the file size (else
        OTP takes the table for not closed and repairs it)."""
        last = self.word(self.size - 4)
        self.trailer_ok = last + h.fl_base == self.size
        if self.trailer_ok:
            return

        def base_ok(b: int) -> bool:
            return b == 0 or (b >= BASE + 2 * ALIGN and (b - BASE) % ALIGN == 0)

        implied = self.size - last
        top = self.buddy_base(free) if free else None
        if _one_bit(h.fl_base, implied) and base_ok(implied) and (not base_ok(h.fl_base) or top == implied):
            off, what = FL_BASE_AT, f"the header's buddy-system base ({h.fl_base}) has a flipped bit"
        else:
            off, what = self.size - 4, f"the size word at the end ({last}) is wrong"
        self.problem(
            "trailer",
            f"{what}: size word + base = {last + h.fl_base}, the file has {plural(self.size, 'byte')}; OTP "
            "takes the table for not closed properly and repairs it at open (a full scan)",
            off,
            size_word=last,
            base=h.fl_base,
        )

    # -- parts and segments -----------------------------------------------------------------
    def in_free(self, a: int, b: int) -> bool:
        if not self.free_iv:
            return False
        i = bisect.bisect_right(self.free_starts, b - 1) - 1
        return i >= 0 and self.free_max_end[i] > a

    def area(self, p: int, nbytes: int, end: int) -> str | None:
        """Why ``p`` cannot be the start of a part or segment (None: it can)."""
        if p == 0:
            return "it is 0"
        if p < BASE:
            return f"it points into the file header (below {BASE})"
        if p + nbytes > end:
            return f"the {plural(nbytes, 'byte')} it names run past the end of the table's data ({end})"
        if (p - BASE) % ALIGN:
            return f"it is not on a {ALIGN}-byte boundary of the buddy system"
        return None

    def part_anomalies(self, p: int, index: int, nsegs: int | None, end: int) -> int:
        """Words of a part at ``p`` that cannot be what OTP writes there (a used segment pointer
        that names no segment place, an unused one that is not 0)."""
        words = np.frombuffer(self.data, dtype=">u4", count=SEGPARTSZ, offset=p).astype(np.int64)
        want = self.segments_in(index, nsegs, words)
        used = words[:want]
        bad = (used < BASE) | (used + SEG_BYTES > end) | ((used - BASE) % ALIGN != 0)
        return int(np.count_nonzero(bad)) + int(np.count_nonzero(words[want:]))

    @staticmethod
    def segments_in(index: int, nsegs: int | None, words) -> int:
        if nsegs is None:  # cache_segps1: up to the first 0
            zero = np.flatnonzero(words == 0)
            return int(zero[0]) if len(zero) else SEGPARTSZ
        return max(0, min(SEGPARTSZ, nsegs - index * SEGPARTSZ))

    def seg_score(self, s: int, end: int) -> tuple[int, int]:
        """(slots that point at no block, slots that point at a block) of a segment at ``s``."""
        arr = np.frombuffer(self.data, dtype=">u4", count=2 * SEGSZP, offset=s).reshape(SEGSZP, 2)
        bad = good = 0
        nonempty = np.flatnonzero(arr[:, 0] | arr[:, 1])
        self.scored += len(nonempty)
        if self.scored > MAX_SLOTS:
            self.complete = False
            return 0, 0
        for k in nonempty:
            size, ptr = int(arr[k, 0]), int(arr[k, 1])
            if size == 0 or ptr < BASE or ptr + 8 > end or _U32x2(self.data, ptr) != (size, ACTIVE):
                bad += 1
            else:
                good += 1
        return bad, good

    def fix(self, p: int, ok) -> int | None:
        """The one value one bit away from ``p`` that ``ok`` accepts (None: none, or several)."""
        self.fixes += 1
        if self.fixes > MAX_FIXES:
            return None
        found = [c for c in (p ^ (1 << k) for k in range(32)) if ok(c)]
        return found[0] if len(found) == 1 else None

    def walk(self, h: Header, geometry_ok: bool, end: int):
        """The parts and segments (cache_segps): [(segment number, address, pointer offset)]."""
        data = self.data
        ptrs = np.frombuffer(data, dtype=">u4", count=SEGARRSZ, offset=HEADEND)
        if geometry_ok:
            nsegs = (h.next - 1) // SEGSZP + 1
            nparts = (nsegs - 1) // SEGPARTSZ + 1
        else:  # as cache_segps would find them: parts up to the first 0, segments up to the first 0
            zero = np.flatnonzero(ptrs == 0)
            nparts = max(1, int(zero[0]) if len(zero) else SEGARRSZ)
            nsegs = None
            self.complete = False
        parts = []
        for i in range(SEGARRSZ):
            p, at = int(ptrs[i]), HEADEND + 4 * i
            if i < nparts:
                parts.append((i, p, at))
            elif p:
                self.problem(
                    "unused-pointer",
                    f"part pointer {i} (at byte {at}) is {p:#x}, but the table has {nparts} "
                    f"part(s): OTP writes 0 there and ignores it until the table grows past "
                    f"{plural(i * SEGPARTSZ * SEGSZP, 'slot')} (then overwrites it); a flipped bit",
                    at,
                    pointer=p,
                    severity=INFO,
                )
        part_addrs = [p for _, p, _ in parts]
        segments = []
        for i, p, at in parts:
            why = self.area(p, PART_BYTES, end)
            if why is None and i == 0 and p != BASE:
                why = f"part 0 always lies at {BASE} (OTP allocates the parts before anything else)"
            if why is None and part_addrs.count(p) > 1:
                why = "another part pointer names the same bytes"
            anomalies = self.part_anomalies(p, i, nsegs, end) if why is None else None
            good = None
            if why or anomalies:

                def ok(c, i=i):
                    return (
                        ((c == BASE) if i == 0 else c not in part_addrs and not self.in_free(c, c + PART_BYTES))
                        and self.area(c, PART_BYTES, end) is None
                        and self.part_anomalies(c, i, nsegs, end) == 0
                    )

                good = self.fix(p, ok) if (why or anomalies >= 2) else None
                if why is None and good is not None:
                    why = f"{anomalies} of the words read there are no segment pointers of this part"
            if why:
                was = f"; one bit away, {good} holds the part (a flipped bit)" if good else ""
                self.problem(
                    "part-pointer",
                    f"part pointer {i} (at byte {at}) is {p:#x}: {why}{was}; OTP reads the "
                    f"segment pointers of slots {i * SEGPARTSZ * SEGSZP}.. from there, so lookups in them "
                    "fail or read garbage",
                    at,
                    pointer=p,
                    **({"was": good} if good else {}),
                )
                if good is None:
                    self.lost = True
                    continue
                p, anomalies = good, 0
            self.items.append(
                _Item(
                    p,
                    p + PART_BYTES,
                    f"segment-array part {i}",
                    at,
                    "part",
                    verified=anomalies == 0 and (i > 0 or p == BASE),
                )
            )
            words = np.frombuffer(data, dtype=">u4", count=SEGPARTSZ, offset=p)
            want = self.segments_in(i, nsegs, words)
            for k in range(SEGPARTSZ):
                s, sat, segno = int(words[k]), p + 4 * k, i * SEGPARTSZ + k
                if k < want:
                    segments.append([segno, s, sat])
                elif s:
                    self.problem(
                        "unused-pointer",
                        f"segment pointer {segno} (at byte {sat}) is {s:#x}, but the table "
                        f"uses {nsegs if nsegs is not None else want} segment(s): OTP writes 0 there and "
                        "ignores it until the table grows into that segment (then overwrites it); a flipped "
                        "bit",
                        sat,
                        pointer=s,
                        severity=INFO,
                    )
        known = set(part_addrs) | {s for _, s, _ in segments}
        counts: dict[int, int] = {}
        for _, s, _ in segments:
            counts[s] = counts.get(s, 0) + 1
        first0 = BASE + PART_BYTES, BASE + PART_BYTES * max(1, len(parts))
        out = []
        for segno, s, sat in segments:

            def usable(c, segno=segno):
                return not (self.area(c, SEG_BYTES, end) or (segno == 0 and not first0[0] <= c <= first0[1]))

            why = self.area(s, SEG_BYTES, end)
            if why is None and segno == 0 and not first0[0] <= s <= first0[1]:
                why = f"segment 0 always lies right after the parts OTP allocated first ({first0[0]}..{first0[1]})"
            if why is None and (s in part_addrs or counts[s] > 1):
                why = "another part or segment pointer names the same bytes"
            bad = good = 0
            if why is None:
                bad, good = self.seg_score(s, end)
            fixed = None
            if why is not None or bad:

                def ok(c, segno=segno, floor=good):
                    if c in known or not usable(c) or self.in_free(c, c + SEG_BYTES):
                        return False
                    b, g = self.seg_score(c, end)
                    return b == 0 and g >= max(1, floor)

                fixed = self.fix(s, ok)
                if fixed is not None and why is None:
                    why = f"{bad} of the slots read there point at no object block"
            if why:
                was = f"; one bit away, {fixed} holds the segment (a flipped bit)" if fixed else ""
                tail = (
                    " OTP stops reading segment pointers at the first 0, so lookups in these slots crash"
                    if s == 0
                    else " lookups in these slots read garbage or miss"
                )
                self.problem(
                    "segment-pointer",
                    f"segment {segno}'s pointer (at byte {sat}) is {s:#x}: {why}{was}; it "
                    f"holds slots {segno * SEGSZP}..{segno * SEGSZP + SEGSZP - 1}:{tail}",
                    sat,
                    pointer=s,
                    **({"was": fixed} if fixed else {}),
                )
                if fixed is None:
                    self.lost = True
                    continue
                s, bad, good = fixed, 0, 1
            pinned = segno == 0 and first0[0] == first0[1] == s
            self.items.append(
                _Item(s, s + SEG_BYTES, f"segment {segno}", sat, "segment", verified=bad == 0 and (good > 0 or pinned))
            )
            out.append((segno, s, sat))
        return out

    # -- a table not closed properly --------------------------------------------------------
    def open_words(self, h: Header) -> None:
        """A table not closed properly (kill -9): OTP's repair rebuilds it from the object blocks
        alone (dets_v9 fsck_input: <<Size, ACTIVE>> blocks from BASE on), so its part, segment and
        slot words are never read; the header's counts are those of its last open. What still
        holds is what every word OTP writes there is, whenever it wrote it (info: a changed byte
        OTP ignores): a part or segment pointer is 0 or a 2048-byte buddy boundary (part 0 at
        BASE), allocated in order (no pointer after a 0: grow/allocate_segment), and a slot two
        zero words or a size and a pointer on its buddy boundary (updated/re_hash_write write
        <<0:32, 0:32>> for an empty slot). A single flipped bit in a zero word breaks one of these.
        And a used slot names the ``<<Size, ACTIVE>>`` block the repair finds its objects in (it
        writes the block and the slot in one pwrite): a block header or object damaged there is
        skipped by the repair (``fsck_objs``), its objects lost (a warning)."""

        def bad(kind: str, at: int, value: int, why: str) -> None:
            self.problem(
                "open-table",
                f"{kind} (at byte {at}) is {value:#x}: {why}; the table was not closed "
                "properly, so OTP repairs it at open from its object blocks and never reads this word, "
                "but it writes no such value there (a flipped bit)",
                at,
                pointer=value,
                severity=INFO,
            )

        def pointers(first: int, count: int, what, need: int) -> list[tuple[int, int]]:
            """The valid pointers of ``count`` words from ``first`` (in order, up to the first 0)."""
            words = np.frombuffer(self.data, dtype=">u4", count=count, offset=first).tolist()
            valid, ended = [], False
            for k, v in enumerate(words):
                at = first + 4 * k
                if v == 0:
                    ended = True
                elif ended:
                    bad(what(k), at, v, "a pointer after a 0 one (OTP allocates them in order)")
                elif v < BASE or (v - BASE) % ALIGN or v + need > self.size:
                    bad(what(k), at, v, f"no {ALIGN}-byte buddy boundary inside the file")
                    ended = True
                else:
                    valid.append((k, v))
            return valid

        if self.size < BASE + PART_BYTES + SEG_BYTES:
            least = BASE + PART_BYTES + SEG_BYTES
            self.problem(
                "truncated",
                f"the file ends at {self.size}, before the end of segment 0 ({least}): OTP writes "
                "the header, part 0 and segment 0 when it creates a table, so the file is torn (OTP's repair "
                "at open finds no object past its end)",
                self.size,
            )
            return
        parts = pointers(HEADEND, SEGARRSZ, lambda k: f"part pointer {k}", PART_BYTES)
        first = self.word(HEADEND)
        if first == 0 or (parts and parts[0] == (0, first) and first != BASE):  # (else pointers() said why)
            bad("part pointer 0", HEADEND, first, f"part 0 always lies at {BASE} (OTP writes it first)")
        parts = [(0, BASE)] + [x for x in parts if x[0] > 0]  # part 0 read where it always is
        segments = []
        for i, p in parts[: MAX_SLOTS // (SEGPARTSZ * SEGSZP) + 1]:
            segments += pointers(p, SEGPARTSZ, lambda k, i=i: f"segment pointer {i * SEGPARTSZ + k}", SEG_BYTES)
        for _, sp in segments[: MAX_SLOTS // SEGSZP]:
            arr = np.frombuffer(self.data, dtype=">u4", count=2 * SEGSZP, offset=sp).reshape(SEGSZP, 2).astype(np.int64)
            size, ptr = arr[:, 0], arr[:, 1]
            buddy = np.maximum(1, 1 << np.ceil(np.log2(np.maximum(size, 1))).astype(np.int64))
            wrong = ((size == 0) != (ptr == 0)) | (
                (size != 0) & ((size < 14) | (ptr < BASE) | ((ptr - BASE) % np.minimum(buddy, ALIGN) != 0))
            )
            for k in np.flatnonzero(wrong)[:MAX_REPORTED].tolist():
                bad(
                    f"slot {k} of the segment at {sp}",
                    sp + 8 * k,
                    int(size[k]) << 32 | int(ptr[k]),
                    "an empty slot is two zero words, a used one a size and a pointer on its buddy boundary",
                )
            for k in np.flatnonzero(~wrong & (size != 0) & (ptr + size <= self.size)).tolist():
                at, n = int(ptr[k]), int(size[k])
                why = (
                    self.parse(h, at, n, self.size, decode=True)
                    if _U32x2(self.data, at) == (n, ACTIVE)
                    else (at, f"no <<{n}, ACTIVE>> block header there")
                )
                if isinstance(why, tuple):
                    self.problem(
                        "open-table",
                        f"slot {k} of the segment at {sp} names the {n}-byte object block at {at}: "
                        f"{why[1]}; the table was not closed properly, and OTP's repair at open skips such a "
                        "block (fsck_objs): its objects are lost",
                        why[0],
                        slot_offset=sp + 8 * k,
                        block=at,
                    )

    # -- slots and blocks -------------------------------------------------------------------
    def structure_at(self, ptr: int) -> _Item | None:
        """The part or segment ``ptr`` lies in, if any."""
        i = bisect.bisect_right(self.structure_starts, ptr) - 1
        return self.structure[i] if i >= 0 and ptr < self.structure[i].end else None

    def slots(self, h: Header, segments, end: int, hash_ok: bool) -> None:
        self.structure = sorted(self.items, key=lambda it: it.start)
        self.structure_starts = [it.start for it in self.structure]
        refs: dict[int, list[_Ref]] = {}
        self.limit = h.max_collection
        examined = 0
        for segno, sp, _ in segments:
            arr = np.frombuffer(self.data, dtype=">u4", count=2 * SEGSZP, offset=sp).reshape(SEGSZP, 2)
            nonempty = np.flatnonzero(arr[:, 0] | arr[:, 1]).tolist()
            if not nonempty:
                continue
            sizes, ptrs = arr[:, 0].tolist(), arr[:, 1].tolist()
            for k in nonempty:
                examined += 1
                if examined > MAX_SLOTS:
                    self.complete = False
                    break
                self.slot(h, segno * SEGSZP + k, sp + 8 * k, sizes[k], ptrs[k], end, refs)
        for ptr, rs in refs.items():
            self.block(h, ptr, rs, end, hash_ok)

    def slot(self, h: Header, s: int, at: int, size: int, ptr: int, end: int, refs: dict) -> None:
        def bad(off: int, why: str, pointer: bool = False, **details):
            if self.kinds.get("slot", 0) >= KEEP:  # only counted: do not build the message
                self.kinds["slot"] += 1
                return
            self.problem(
                "slot",
                f"slot {s} (at byte {at}: size {size}, pointer {ptr:#x}) {why}",
                off,
                pointer=ptr if pointer else None,
                slot=s,
                slot_offset=at,
                pointer_offset=at + 4,
                **details,
            )

        def ref(block_size: int, ok: bool):
            refs.setdefault(ptr, []).append(_Ref(s, at, size, block_size, ok))

        if size == 0:
            return bad(
                at + 4,
                "has size 0 but a pointer: an empty slot is two zero words; OTP's reads of this slot "
                "fail and mark the table corrupt",
                True,
            )
        if ptr == 0:
            return bad(
                at, "has a size but pointer 0: OTP reads the file header as its objects and marks the table corrupt"
            )
        if ptr < BASE or ptr + 8 > end:
            return bad(
                at + 4,
                f"points outside the object area ({BASE}..{end}): OTP's lookups in this slot fail and "
                "mark the table corrupt",
                True,
            )
        inside = self.structure_at(ptr)
        if inside is not None:
            return bad(
                at + 4,
                f"points into {inside.what} ({inside.start}..{inside.end}), not at an object block: "
                "OTP's lookups in this slot fail or read garbage",
                True,
            )
        word, status = _U32x2(self.data, ptr)
        if word != size:
            if status == ACTIVE and 8 < word <= end - ptr and self.parse(h, ptr, word, end) is None:
                ref(word, False)
                return bad(
                    at,
                    f"names {plural(size, 'byte')}, but the block it points at has {word}: a flipped bit in the slot; "
                    "OTP's match on the block header fails, lookups in this slot fail",
                )
            if status == ACTIVE and ptr + size <= end and self.parse(h, ptr, size, end) is None:
                ref(size, False)
                return bad(
                    ptr,
                    f"points at a block whose size word reads {word}: a flipped bit in the block header; "
                    "OTP's lookups in this slot fail",
                    block=ptr,
                )
            return bad(
                at + 4,
                "points at no object block (no <<Size, ACTIVE>> header of that size there): OTP's "
                "lookups in this slot fail or read garbage",
                True,
            )
        if ptr + size > end:
            return bad(
                at,
                f"names a block that runs past the end of the table's data ({end}): OTP cuts it off at the next write",
            )
        if (ptr - BASE) % min(_buddy(size), ALIGN):
            return bad(
                at + 4, f"points at {ptr}, which is not on a boundary of its {_buddy(size)}-byte buddy block", True
            )
        limit = self.limit
        if limit is not None and size > limit:
            ref(size, False)
            return bad(
                at,
                f"names {plural(size, 'byte')}, more than the biggest collection the header counts ({limit}): OTP "
                "refuses the read (eof) and marks the table corrupt",
            )
        if status != ACTIVE:
            ref(size, False)
            return bad(
                ptr + 4,
                f"points at a block whose status is {status:#x}, not ACTIVE: OTP's updates and "
                "single-key lookups in this slot fail (per_key wants ACTIVE)",
                True,
                block=ptr,
            )
        ref(size, True)

    def block(self, h: Header, ptr: int, rs: list, end: int, hash_ok: bool) -> None:
        owner = rs[0]
        got = self.parse(h, ptr, owner.block_size, end, decode=True, hash_ok=hash_ok)
        key_slots = got.key_slots if isinstance(got, _Parsed) else set()
        if len(rs) > 1:
            cand = [r for r in rs if r.slot in key_slots]
            owner = cand[0] if len(cand) == 1 else rs[0]
            for r in rs:
                if r is not owner and self.kinds.get("slot", 0) >= KEEP:
                    self.kinds["slot"] += 1
                elif r is not owner:
                    self.problem(
                        "slot",
                        f"slot {r.slot} (at byte {r.at}) points at {ptr}, the block of slot {owner.slot}"
                        f"{' (its keys hash there)' if cand else ''}: a flipped bit in this pointer; every "
                        f"object block belongs to one slot, OTP's lookups in slot {r.slot} miss their objects",
                        r.at + 4,
                        pointer=ptr,
                        slot=r.slot,
                        slot_offset=r.at,
                    )
        self.blocks.append(
            _Item(
                ptr,
                ptr + _buddy(owner.block_size),
                f"the object block of slot {owner.slot}",
                owner.at + 4,
                "block",
                verified=owner.ok and not isinstance(got, tuple),
            )
        )
        self.reached.add(ptr)
        if isinstance(got, tuple):
            off, why = got
            self.problem("object", f"slot {owner.slot}'s block at {ptr}: {why}", off, slot=owner.slot, block=ptr)
            return
        if got is None:
            return
        if hash_ok and owner.ok:
            for off, key, want in got.keys:
                if want is not None and want != owner.slot:
                    text = etf.format_term(key)
                    text = text if len(text) <= 120 else text[:117] + "..."
                    self.problem(
                        "object",
                        f"slot {owner.slot}'s block at {ptr}: the object at {off} has key {text}, "
                        f"which phash2 puts in slot {want}: OTP's lookups of that key look in slot {want} and "
                        "miss it (a flipped bit in the key)",
                        off,
                        slot=owner.slot,
                        block=ptr,
                    )
                    break

    def parse(self, h: Header, ptr: int, size: int, end: int, decode: bool = False, hash_ok: bool = False):
        """The objects of the block at ``ptr`` read in ``size`` bytes as bin2objs does: None
        (whole, not decoded), a ``_Parsed`` (decoded), or (offset, why)."""
        if size < 8 + 4 + 2:
            return (ptr, f"a block of {plural(size, 'byte')} cannot hold an object")
        if ptr + size > end:
            return (ptr, f"the block's {plural(size, 'byte')} run past the end of the table's data ({end})")
        if decode and (size > MAX_COLLECTION or self.decoded + size > MAX_DECODE_BYTES or self.objects >= MAX_OBJECTS):
            self.complete = False
            decode = False
        buf = bytes(self.data[ptr : ptr + size]) if decode else self.data
        base = 0 if decode else ptr
        pos, stop = base + 8, base + size
        bag = h.type in (BAG, DUPLICATE_BAG)
        parsed = _Parsed() if decode else None
        while pos < stop:
            if bag:
                if pos + 8 > stop:
                    return (ptr + pos - base, "the objects end inside a key's size word")
                group = _U32(buf, pos)[0]
                if group < 9 or pos + group > stop:
                    return (ptr + pos - base, f"a key's objects claim {plural(group, 'byte')}, {stop - pos} are left")
                q, gend = pos + 4, pos + group
            else:
                q, gend = pos, stop
            if parsed is not None:
                parsed.nkeys += 1
            while q < gend:
                if q + 4 > gend:
                    return (ptr + q - base, "the objects end inside an object's size word")
                osz = _U32(buf, q)[0]
                if osz < 5 or q + osz > gend:
                    return (ptr + q - base, f"an object claims {plural(osz, 'byte')}, {gend - q} are left")
                if parsed is not None:
                    why = self.term(h, buf, q + 4, q + osz, ptr, parsed, hash_ok)
                    if why is not None:
                        return (ptr + q, why)
                q += osz
                if not bag:
                    break
            pos = gend if bag else q
        if parsed is not None:
            self.decoded += size
            self.found_objects += parsed.nobj
            self.found_keys += parsed.nkeys
            self.collections[_buddy(size)] = self.collections.get(_buddy(size), 0) + 1
        return parsed

    def term(
        self, h: Header, buf: bytes, start: int, obj_end: int, ptr: int, parsed: _Parsed, hash_ok: bool
    ) -> str | None:
        self.objects += 1
        parsed.nobj += 1
        # the compiled core decodes a term that ends within its object's size (a term's value is
        # its bytes' alone); one it leaves (damage, past the object) the reference decodes
        got = self.decode_at(buf, start, obj_end) if self.decode_at else None
        try:  # binary_to_term on the rest of the collection, as bin2objs does
            term = got[0] if got is not None else etf.decode(buf, offset=start)[0]
        except (etf.EtfError, RecursionError, ValueError, OverflowError, IndexError, struct.error) as e:
            return f"the object at {ptr + start} does not decode ({getattr(e, 'message', e)}): OTP's reads of this slot fail"
        if type(term) is not tuple or len(term) < max(1, h.keypos):
            return (
                f"the object at {ptr + start} is no tuple of at least {h.keypos} elements: element(KeyPos) fails on "
                "it, OTP's reads of this slot fail"
            )
        if hash_ok:
            key = term[h.keypos - 1]
            want = slot_of(key, h.m, h.n)
            parsed.keys.append((ptr + start, key, want))
            if want is not None:
                parsed.key_slots.add(want)
        return None

    # -- what no slot reaches, and the buddy system ------------------------------------------
    def orphans(self, h: Header, end: int) -> list[_Item]:
        """Object blocks the ACTIVE-marker scan finds (as terms._dets_objects does) that no
        slot reaches."""
        used = sorted((it.start, it.end) for it in self.items + self.blocks)
        starts = [a for a, _ in used]
        maxend, m = [], 0
        for _, b in used:
            m = max(m, b)
            maxend.append(m)
        found: list[_Item] = []
        extents = files.data_extents(self.path, self.size) if self.size > (64 << 20) else None
        ranges = [(max(BASE, a - 4), min(b, end)) for a, b in extents] if extents is not None else [(BASE, end)]
        seen = 0
        marker = ACTIVE.to_bytes(4, "big")
        for lo, hi in ranges:
            o = files.find(self.data, marker, lo + 4, hi)
            while o >= 0:
                seen += 1
                if seen > MAX_MARKERS:
                    self.complete = False
                    return found
                b, nxt = o - 4, o + 4
                i = bisect.bisect_right(starts, b) - 1
                if b not in self.reached and not (i >= 0 and maxend[i] > b):
                    size = self.word(b)
                    if 8 < size <= end - b and self.parse(h, b, size, end) is None:
                        found.append(_Item(b, b + _buddy(size), f"the unreached block at {b}", b, "unreached"))
                        nxt = max(nxt, b + size + 4)
                o = files.find(self.data, marker, nxt, hi)
        return found

    def explain(self, lost: list[_Item]) -> list[_Item]:
        """Pin an unreached block on the slot pointer one bit away from it; the rest stay."""
        left = []
        pointers = [p for p in self.problems if p.pointer is not None and p.kind == "slot"]
        for it in lost:
            culprit = next((p for p in pointers if _one_bit(p.pointer, it.start)), None)
            if culprit is not None:
                culprit.message += f"; one bit away, at {it.start}, lies a block no slot reaches: the one it named"
                culprit.details["was"] = it.start
                culprit.offset = culprit.details.get("pointer_offset", culprit.offset)  # the pointer flipped
            else:
                left.append(it)
        return left

    def buddy_base(self, free: list, lowest: int | None = None, highest: int = 0) -> int | None:
        """Where the buddy system starts (it spans 2^31 bytes from there; init_file sets it after
        the parts and segments it allocates first): the header's base when the size word agrees
        with it, else the one the top free block implies (the upper 2^30 bytes, or all 2^31 of an
        empty table, never split), else the end of the free blocks - 2^31. None: no such base."""

        def valid(b: int) -> bool:
            return BASE + 2 * ALIGN <= b and (b - BASE) % ALIGN == 0 and (lowest is None or b <= lowest)

        if self.fl_base and self.trailer_ok and valid(self.fl_base):
            return self.fl_base
        half = 1 << (MAX_LOG - 1)
        tops = [a - half if size == half else a for a, size, _, _ in free if size >= half]
        tops = [t for t in tops if valid(t)]
        if tops:
            return tops[-1]
        end = max(highest, max((a + size for a, size, _, _ in free), default=0)) - (1 << MAX_LOG)
        return end if valid(end) else None

    def coverage(self, items: list[_Item], free: list) -> None:
        """The buddy allocator's invariant: from BASE to the top of the buddy space, the parts,
        segments, object blocks (their buddy blocks) and the free blocks of the free lists tile the
        bytes with no gap and no overlap, and a free block lies on a boundary of its size."""
        items = list(items)
        suspicious: set[int] = set()
        aligned = []
        for a, size, at, pos_at in free:
            it = _Item(a, a + size, f"the free block at {a} ({plural(size, 'byte')})", at, "free", (pos_at,))
            if a < BASE or (a - BASE) % min(size, ALIGN):
                self.problem(
                    "free-lists",
                    f"the free lists give a free block of {plural(size, 'byte')} at {a} (entry at byte {at}),"
                    " which is not on a boundary of its size: a flipped bit in the address or its size class "
                    f"(at byte {pos_at}); OTP would hand out or merge the wrong bytes",
                    at,
                    pointer=a,
                    offsets=[at, pos_at],
                )
                continue
            items.append(it)
            aligned.append((a, size, at, pos_at))
        lowest = min((it.start for it in items if it.kind == "block"), default=None)  # objects lie above the base
        base = self.buddy_base(aligned, lowest, max((it.end for it in items), default=0))
        if base is None:
            if aligned and not self.kinds.get("free-lists"):
                a, size, at, pos_at = max(aligned)
                self.problem(
                    "free-lists",
                    f"the free blocks do not reach the top of the buddy space (2^31 bytes from "
                    "its base, which lies right after the parts and segments): the last free block "
                    f"({a}, {plural(size, 'byte')}, entry at byte {at}) has a flipped bit in its address or size "
                    f"class (byte {pos_at}); OTP would hand out the wrong bytes",
                    at,
                    offsets=[at, pos_at],
                )
            return
        top = base + (1 << MAX_LOG)
        items.sort(key=lambda it: (it.start, it.end))
        gaps, overlaps = [], []
        cur, prev = BASE, None
        for it in items:
            if it.end > top:
                suspicious.add(id(it))
            if it.start >= top:
                continue
            if it.start > cur:
                gaps.append((cur, it.start, prev))
            elif prev is not None and it.start < cur:
                overlaps.append((prev, it))
                suspicious.update((id(prev), id(it)))
            if it.end > cur:
                cur, prev = it.end, it
        if cur < top:
            gaps.append((cur, top, prev))
        blamed: set[int] = set()

        def blame(culprit: _Item, g0: int, g1: int) -> None:
            blamed.add(id(culprit))
            effect = (
                "OTP would hand out the wrong bytes" if culprit.kind == "free" else "OTP reads it from the wrong place"
            )
            self.problem(
                "free-lists" if culprit.kind == "free" else "coverage",
                f"{culprit.what} is named at byte {culprit.at} as {culprit.start}, one flipped bit away from "
                f"{g0}, where {plural(g1 - g0, 'byte')} nothing else accounts for lie: {effect}",
                culprit.at,
                pointer=culprit.start,
                was=g0,
                offsets=[culprit.at, *culprit.extra],
            )

        for g0, g1, before in gaps:
            near = [
                it
                for it in items
                if it.at is not None and it.kind != "unreached" and _one_bit(it.start, g0) and id(it) not in blamed
            ]
            near.sort(key=lambda it: (id(it) not in suspicious, it.verified, it.kind != "free"))
            if near and id(near[0]) in suspicious:
                blame(near[0], g0, g1)
            elif (
                before is not None
                and before.kind == "free"
                and before.end == g0
                and _pow2(g1 - before.start)
                and _one_bit((g1 - before.start).bit_length(), (before.end - before.start).bit_length())
            ):
                blamed.add(id(before))  # its size class lost a bit: the block is bigger than the entry says
                self.problem(
                    "free-lists",
                    f"the free-list block at byte {before.extra[0] - 8} says the free block at "
                    f"{before.start} has {plural(before.end - before.start, 'byte')}, but {plural(g1 - before.start, 'byte')} are "
                    f"free there: a flipped bit in its size class (byte {before.extra[0]}); OTP would lose or "
                    "hand out the wrong bytes",
                    before.extra[0],
                    offsets=[before.at, *before.extra],
                )
            elif near:
                blame(near[0], g0, g1)
            else:
                named = [before.at, *before.extra] if before is not None and before.at is not None else []
                self.problem(
                    "coverage",
                    f"bytes {g0}..{g1} ({plural(g1 - g0, 'byte')}) are neither free nor used by a part, a "
                    "segment or an object block: a pointer or a free-list entry lost them (a flipped bit)",
                    g0,
                    length=g1 - g0,
                    offsets=named,
                )
        for it in items:
            if it.end > top and id(it) not in blamed:
                blamed.add(id(it))
                self.problem(
                    "free-lists" if it.kind == "free" else "coverage",
                    f"{it.what} (named at byte {it.at}) runs past the top of the buddy space ({base} + 2^31 = "
                    f"{top}): a flipped bit",
                    it.at,
                    offsets=[it.at, *it.extra],
                )
        for a, b in overlaps:
            if id(a) in blamed or id(b) in blamed:
                continue
            if (a.kind == "free") != (b.kind == "free"):
                culprit = a if a.kind == "free" else b
            elif a.kind == "free":
                culprit = a  # the earlier free block runs into the next: its size class is wrong
            else:
                culprit = b if a.verified or not b.verified else a
            other = b if culprit is a else a
            blamed.add(id(culprit))
            self.problem(
                "coverage",
                f"{culprit.what} (named at byte {culprit.at}) overlaps {other.what} (named at byte "
                f"{other.at}): two things claim the same bytes, a flipped bit in one of them; OTP would hand "
                "out or overwrite live bytes",
                culprit.at,
                offsets=[culprit.at, *culprit.extra, other.at],
            )

    def totals(self, h: Header) -> None:
        if self.found_objects != h.no_objects:
            self.problem(
                "count",
                f"the header records {plural(h.no_objects, 'object')}, the slots reach {self.found_objects}",
                32,
                recorded=h.no_objects,
                found=self.found_objects,
            )
        if self.found_keys != h.no_keys:
            self.problem(
                "count",
                f"the header records {plural(h.no_keys, 'key')}, the slots reach {self.found_keys}",
                36,
                recorded=h.no_keys,
                found=self.found_keys,
            )
        if h.has_counters:
            for i, c in enumerate(h.counters):
                got = self.collections.get(1 << (i + MIN_LOG), 0)
                if got != c:
                    self.problem(
                        "count",
                        f"the header counts {c} object collections of {plural(1 << (i + MIN_LOG), 'byte')}, "
                        f"the slots reach {got}: OTP sizes its reads by these counters",
                        COUNTERS_AT + 4 * i,
                        recorded=c,
                        found=got,
                    )

    def run(self) -> None:
        h = self.header()
        if h.closed != 1 and not (h.closed not in (0, 1) and h.closed & 1):
            self.reserved()  # written as zeros whenever the header is written, open or closed
            self.open_words(h)  # not closed properly: OTP repairs it at open (a full scan)
            return
        geometry_ok = self.fields(h)
        self.reserved()
        if self.size < BASE + PART_BYTES:
            self.problem(
                "truncated",
                f"the file ends at {self.size}, before the first segment-array part "
                f"({BASE}..{BASE + PART_BYTES}): OTP cannot read the table",
                self.size,
            )
            return
        end, chain = self.freelists(h)
        free = chain.free if chain is not None and chain.problem is None else None
        self.fl_base, self.trailer_ok = h.fl_base, False
        if chain is not None:
            self.trailer(h, free)
        self.free_iv = sorted((a, a + s) for a, s, _, _ in free) if free else []
        self.free_starts = [a for a, _ in self.free_iv]
        self.free_max_end, m = [], 0
        for _, b in self.free_iv:
            m = max(m, b)
            self.free_max_end.append(m)
        self.items: list[_Item] = []
        self.blocks: list[_Item] = []
        self.reached: set[int] = set()
        segments = self.walk(h, geometry_ok, end)
        if h.type not in TYPES:
            return
        hash_ok = geometry_ok and h.hash_method == PHASH2 and h.keypos >= 1
        self.slots(h, segments, end, hash_ok)
        if self.lost or not self.complete and self.kinds.get("slot", 0) > MAX_REPORTED:
            return  # a part or segment is lost: every block it held is unreached (already said)
        lost = self.explain(self.orphans(h, end))
        if len(lost) > 3:
            shown = ", ".join(str(b.start) for b in lost[:8])
            self.problem(
                "unreached",
                f"{plural(len(lost), 'object block')} ({shown}{', ...' if len(lost) > 8 else ''}) are "
                "reached by no slot: OTP's lookups never find their objects (a part, segment or slot pointer "
                "lost them)",
                lost[0].start,
                blocks=[b.start for b in lost[:64]],
            )
        else:
            for b in lost:
                self.problem(
                    "unreached",
                    f"the object block at {b.start} is reached by no slot: OTP's lookups never "
                    "find its objects (its slot pointer has a flipped bit, or the block was injected)",
                    b.start,
                    block=b.start,
                )
        if free is not None:
            self.coverage(self.items + self.blocks + lost, free)
        structural = any(self.kinds.get(k) for k in ("part-pointer", "segment-pointer", "slot", "object", "unreached"))
        if self.complete and not structural:
            self.totals(h)


@dataclass
class _Parsed:
    nobj: int = 0
    nkeys: int = 0
    keys: list = field(default_factory=list)  # (offset, key, slot phash2 gives it)
    key_slots: set = field(default_factory=set)


def structure_findings(path: Path, data) -> list[Finding]:
    """``term-file-damaged`` findings for the structure of a DETS v9 table (``data``: the whole
    file, bytes or a map). Leaves to ``terms.dets_findings`` what it checks (no DETS header, the
    free-list chain's end, the marker-scan count). For a table not closed properly the header
    checks OTP makes before it repairs (MD5, type, hash method, closed flag) and ``open_words``."""
    size = len(data)
    if size < 20 or _U32(data, 4)[0] != COOKIE or _U32(data, 16)[0] != VERSION:
        return []  # no DETS v9 table: dets_findings says so
    if size < HEADSZ:
        return [
            Finding(
                "term-file-damaged",
                f"a DETS table of {plural(size, 'byte')} ends inside its {HEADSZ}-byte header: OTP cannot open it",
                str(path),
                size,
                details={"check": "truncated"},
            )
        ]
    check = _Check(path, data)
    check.run()
    return check.emit()
