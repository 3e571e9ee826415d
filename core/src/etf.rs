//! Erlang external terms made into Python values, for the tags a Ra log entry is made of
//! (`codecs/etf.py` is the reference: the same values, of the same Python types, made by its own
//! constructors). Anything else (a compressed term, a fun or an export, a big integer past 64
//! bits, a list or map as a map key, damage of any kind) is not decided here: the walk gives up
//! (`None`) and the reference decodes the whole term, errors and their offsets included. So this
//! path is never stricter or looser than the reference, only faster where the term is plain.

use std::cell::RefCell;
use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

/// the external term format's version byte (`etf.VERSION`)
pub const VERSION: u8 = 131;

/// the reference's MAX_DEPTH: deeper terms are the reference's error to word
const MAX_DEPTH: u32 = 200;

const NEW_FLOAT: u8 = 70;
const NEW_PID: u8 = 88;
const NEW_PORT: u8 = 89;
const NEWER_REFERENCE: u8 = 90;
const REFERENCE: u8 = 101;
const PORT: u8 = 102;
const PID: u8 = 103;
const NEW_REFERENCE: u8 = 114;
const V4_PORT: u8 = 120;
const SMALL_INTEGER: u8 = 97;
const INTEGER: u8 = 98;
const ATOM: u8 = 100;
const SMALL_TUPLE: u8 = 104;
const LARGE_TUPLE: u8 = 105;
const NIL: u8 = 106;
const STRING: u8 = 107;
const LIST: u8 = 108;
const BINARY: u8 = 109;
const SMALL_BIG: u8 = 110;
const SMALL_ATOM: u8 = 115;
const MAP: u8 = 116;
const ATOM_UTF8: u8 = 118;
const SMALL_ATOM_UTF8: u8 = 119;

/// The atoms `atom` made during a run of decodes, by name bytes, for Latin-1 (`[0]`) and UTF-8
/// (`[1]`) atoms: the same object again for the same name, as `etf.make_atom`'s own cache gives
/// it, without a call into Python (a Ra log's entries name the same dozen atoms each: those
/// calls were a third of an entry's decode).
pub type AtomMemo<'py> = RefCell<[HashMap<Vec<u8>, Bound<'py, PyAny>>; 2]>;

/// The atoms one memo keeps at most (`etf.make_atom`'s cache keeps as many)
const ATOM_MEMO_MAX: usize = 65536;

/// The decoding of one buffer: its bytes, and the reference's makers of the values that are
/// no Python builtin: `atom` (`etf.make_atom`: its cache, its `Atom` type, its UTF-8 check),
/// `opaque` (`etf.Opaque(tag, raw)`: a pid, port or reference kept as its bytes), `improper`
/// (`etf.ImproperList(items, tail)`) and `hashable` (`etf._hashable`: a list or map used as a
/// map key, made a tuple); `atoms`: the run's atoms made so far.
pub struct Terms<'a, 'py> {
    pub py: Python<'py>,
    pub buf: &'a [u8],
    pub atom: &'a Bound<'py, PyAny>,
    pub opaque: &'a Bound<'py, PyAny>,
    pub improper: &'a Bound<'py, PyAny>,
    pub hashable: &'a Bound<'py, PyAny>,
    pub atoms: &'a AtomMemo<'py>,
}

impl<'a, 'py> Terms<'a, 'py> {
    pub fn new(
        py: Python<'py>,
        buf: &'a [u8],
        makers: (&'a Bound<'py, PyAny>, &'a Bound<'py, PyAny>, &'a Bound<'py, PyAny>, &'a Bound<'py, PyAny>),
        atoms: &'a AtomMemo<'py>,
    ) -> Self {
        let (atom, opaque, improper, hashable) = makers;
        Terms { py, buf, atom, opaque, improper, hashable, atoms }
    }

    fn bytes(&self, pos: usize, n: usize) -> Option<&'a [u8]> {
        self.buf.get(pos..pos.checked_add(n)?)
    }

    fn u8_at(&self, pos: usize) -> Option<u8> {
        self.buf.get(pos).copied()
    }

    fn u16_at(&self, pos: usize) -> Option<usize> {
        let b = self.bytes(pos, 2)?;
        Some(u16::from_be_bytes([b[0], b[1]]) as usize)
    }

    fn u32_at(&self, pos: usize) -> Option<usize> {
        let b = self.bytes(pos, 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    fn make_atom(&self, pos: usize, n: usize, utf8: bool) -> Option<(Bound<'py, PyAny>, usize)> {
        let raw = self.bytes(pos, n)?;
        if let Some(a) = self.atoms.borrow()[utf8 as usize].get(raw) {
            return Some((a.clone(), pos + n));
        }
        // the reference raises on an atom that is not valid UTF-8: given up here, it words it
        let a = self.atom.call1((PyBytes::new(self.py, raw), utf8)).ok()?;
        let mut memo = self.atoms.borrow_mut();
        if memo[utf8 as usize].len() < ATOM_MEMO_MAX {
            memo[utf8 as usize].insert(raw.to_vec(), a.clone());
        }
        Some((a, pos + n))
    }

    /// The tuple whose tag is at `pos` with only the elements at the positions `wanted` marks
    /// made into values (None in the others' places), and where it ends; the others are walked
    /// by `skip`, which decides exactly the terms `term` decides (the reference's
    /// `tuple_fields`). None: not a tuple, or not a term this path decides.
    pub fn fields(&self, pos: usize, wanted: &[bool]) -> Option<(Bound<'py, PyAny>, usize)> {
        let tag = self.u8_at(pos)?;
        let (n, mut q) = match tag {
            SMALL_TUPLE => (self.u8_at(pos + 1)? as usize, pos + 2),
            LARGE_TUPLE => (self.u32_at(pos + 1)?, pos + 5),
            _ => return None,
        };
        if n > self.buf.len().saturating_sub(q) {
            return None;
        }
        let mut items = Vec::with_capacity(n);
        for i in 0..n {
            if wanted.get(i).copied().unwrap_or(false) {
                let (v, r) = self.term(q, 1)?;
                items.push(v);
                q = r;
            } else {
                q = self.skip(q, 1)?;
                items.push(self.py.None().into_bound(self.py));
            }
        }
        Some((PyTuple::new(self.py, items).ok()?.into_any(), q))
    }

    /// Where the term at `pos` ends, walked without making it, or None: a term `term` would not
    /// decide (so the reference decides it), or a map key that is no atom, number or binary
    /// (whether the reference can hash it is left to the reference).
    pub fn skip(&self, pos: usize, depth: u32) -> Option<usize> {
        if depth > MAX_DEPTH {
            return None;
        }
        let tag = self.u8_at(pos)?;
        let p = pos + 1;
        let atom = |at: usize, n: usize, utf8: bool| -> Option<usize> {
            let raw = self.bytes(at, n)?;
            if utf8 {
                std::str::from_utf8(raw).ok()?; // the reference raises on it
            }
            Some(at + n)
        };
        match tag {
            SMALL_ATOM_UTF8 | SMALL_ATOM => atom(p + 1, self.u8_at(p)? as usize, tag == SMALL_ATOM_UTF8),
            ATOM_UTF8 | ATOM => atom(p + 2, self.u16_at(p)?, tag == ATOM_UTF8),
            BINARY => {
                let n = self.u32_at(p)?;
                self.bytes(p + 4, n)?;
                Some(p + 4 + n)
            }
            NIL => Some(p),
            SMALL_INTEGER => self.bytes(p, 1).map(|_| p + 1),
            INTEGER => self.bytes(p, 4).map(|_| p + 4),
            NEW_FLOAT => self.bytes(p, 8).map(|_| p + 8),
            SMALL_BIG => {
                let n = self.u8_at(p)? as usize;
                if n > 8 {
                    return None;
                }
                self.bytes(p + 1, n + 1).map(|_| p + 2 + n)
            }
            STRING => {
                let n = self.u16_at(p)?;
                self.bytes(p + 2, n).map(|_| p + 2 + n)
            }
            SMALL_TUPLE | LARGE_TUPLE | LIST => {
                let (n, mut q) = match tag {
                    SMALL_TUPLE => (self.u8_at(p)? as usize, p + 1),
                    _ => (self.u32_at(p)?, p + 4),
                };
                if n > self.buf.len().saturating_sub(q) {
                    return None;
                }
                for _ in 0..n + (tag == LIST) as usize {
                    q = self.skip(q, depth + 1)?; // a list's tail too
                }
                Some(q)
            }
            MAP => {
                let n = self.u32_at(p)?;
                let mut q = p + 4;
                if n.checked_mul(2)? > self.buf.len().saturating_sub(q) {
                    return None;
                }
                for _ in 0..n {
                    let key_tag = self.u8_at(q)?;
                    if !matches!(
                        key_tag,
                        SMALL_ATOM_UTF8 | SMALL_ATOM | ATOM_UTF8 | ATOM | BINARY | SMALL_INTEGER | INTEGER | NEW_FLOAT
                    ) {
                        return None;
                    }
                    q = self.skip(q, depth + 1)?;
                    q = self.skip(q, depth + 1)?;
                }
                Some(q)
            }
            NEW_PID | PID | NEW_PORT | PORT | V4_PORT | REFERENCE => {
                let q = self.skip(p, depth + 1)?; // the node's atom
                let fixed = match tag {
                    NEW_PID | V4_PORT => 12,
                    PID => 9,
                    NEW_PORT => 8,
                    _ => 5,
                };
                self.bytes(q, fixed).map(|_| q + fixed)
            }
            NEWER_REFERENCE | NEW_REFERENCE => {
                let n = self.u16_at(p)?;
                let q = self.skip(p + 2, depth + 1)?;
                let size = 4 * n + if tag == NEWER_REFERENCE { 4 } else { 1 };
                self.bytes(q, size).map(|_| q + size)
            }
            _ => None,
        }
    }

    /// The term whose tag is at `pos` and where it ends, or None: not a term this path decides.
    pub fn term(&self, pos: usize, depth: u32) -> Option<(Bound<'py, PyAny>, usize)> {
        if depth > MAX_DEPTH {
            return None;
        }
        let py = self.py;
        let tag = self.u8_at(pos)?;
        let p = pos + 1;
        match tag {
            SMALL_ATOM_UTF8 | SMALL_ATOM => {
                let n = self.u8_at(p)? as usize;
                self.make_atom(p + 1, n, tag == SMALL_ATOM_UTF8)
            }
            ATOM_UTF8 | ATOM => {
                let n = self.u16_at(p)?;
                self.make_atom(p + 2, n, tag == ATOM_UTF8)
            }
            BINARY => {
                let n = self.u32_at(p)?;
                let b = self.bytes(p + 4, n)?;
                Some((PyBytes::new(py, b).into_any(), p + 4 + n))
            }
            NIL => Some((PyList::empty(py).into_any(), p)),
            SMALL_INTEGER => Some((self.u8_at(p)?.into_pyobject(py).ok()?.into_any(), p + 1)),
            INTEGER => {
                let b = self.bytes(p, 4)?;
                let v = i32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                Some((v.into_pyobject(py).ok()?.into_any(), p + 4))
            }
            NEW_FLOAT => {
                let b = self.bytes(p, 8)?;
                let v = f64::from_be_bytes(b.try_into().ok()?);
                Some((v.into_pyobject(py).ok()?.into_any(), p + 8))
            }
            SMALL_BIG => {
                let n = self.u8_at(p)? as usize;
                if n > 8 {
                    return None; // past 64 bits: the reference's arbitrary-precision int
                }
                let sign = self.u8_at(p + 1)?;
                let b = self.bytes(p + 2, n)?;
                let mut v: i128 = 0;
                for (k, byte) in b.iter().enumerate() {
                    v |= (*byte as i128) << (8 * k);
                }
                let v = if sign != 0 { -v } else { v };
                Some((v.into_pyobject(py).ok()?.into_any(), p + 2 + n))
            }
            STRING => {
                let n = self.u16_at(p)?;
                let b = self.bytes(p + 2, n)?;
                let l = PyList::new(py, b.iter().copied()).ok()?;
                Some((l.into_any(), p + 2 + n))
            }
            SMALL_TUPLE | LARGE_TUPLE => {
                let (n, q) =
                    if tag == SMALL_TUPLE { (self.u8_at(p)? as usize, p + 1) } else { (self.u32_at(p)?, p + 4) };
                let (items, q) = self.items(n, q, depth)?;
                Some((PyTuple::new(py, items).ok()?.into_any(), q))
            }
            LIST => {
                let (items, q) = self.items(self.u32_at(p)?, p + 4, depth)?;
                let list = PyList::new(py, items).ok()?;
                let (tail, r) = self.term(q, depth + 1)?;
                // a tail that decodes to the empty list (NIL, or an empty string or list) makes a
                // proper list, as the reference's `tail == []` test has it
                if tail.downcast::<PyList>().is_ok_and(|t| t.is_empty()) {
                    return Some((list.into_any(), r));
                }
                let v = self.improper.call1((list, tail)).ok()?;
                Some((v, r))
            }
            MAP => {
                let n = self.u32_at(p)?;
                let mut q = p + 4;
                if n.checked_mul(2)? > self.buf.len().saturating_sub(q) {
                    return None;
                }
                let out = PyDict::new(py);
                for _ in 0..n {
                    let key_tag = self.u8_at(q)?;
                    let (mut k, r) = self.term(q, depth + 1)?;
                    if matches!(key_tag, LIST | NIL | STRING | MAP) {
                        k = self.hashable.call1((k,)).ok()?; // as the reference keys it
                    }
                    let (v, s) = self.term(r, depth + 1)?;
                    out.set_item(k, v).ok()?; // an unhashable key (a list inside a tuple): given up
                    q = s;
                }
                Some((out.into_any(), q))
            }
            NEW_PID | PID | NEW_PORT | PORT | V4_PORT | REFERENCE => {
                let (_, q) = self.term(p, depth + 1)?; // the node's atom
                let fixed = match tag {
                    NEW_PID | V4_PORT => 12,
                    PID => 9,
                    NEW_PORT => 8,
                    _ => 5,
                };
                self.opaque_at(tag, pos, q.checked_add(fixed)?)
            }
            NEWER_REFERENCE | NEW_REFERENCE => {
                let n = self.u16_at(p)?;
                let (_, q) = self.term(p + 2, depth + 1)?;
                let size = 4 * n + if tag == NEWER_REFERENCE { 4 } else { 1 };
                self.opaque_at(tag, pos, q.checked_add(size)?)
            }
            _ => None,
        }
    }

    /// The `n` terms from `pos` (a tuple's or list's elements) and where they end; `n` checked
    /// against the bytes left first (each term takes one at least), as the reference does.
    fn items(&self, n: usize, pos: usize, depth: u32) -> Option<(Vec<Bound<'py, PyAny>>, usize)> {
        if n > self.buf.len().saturating_sub(pos) {
            return None;
        }
        let mut items = Vec::with_capacity(n);
        let mut q = pos;
        for _ in 0..n {
            let (v, r) = self.term(q, depth + 1)?;
            items.push(v);
            q = r;
        }
        Some((items, q))
    }

    /// The pid, port or reference tagged at `pos` and ending at `end`, as the reference keeps it.
    fn opaque_at(&self, tag: u8, pos: usize, end: usize) -> Option<(Bound<'py, PyAny>, usize)> {
        let raw = self.buf.get(pos..end)?;
        let v = self.opaque.call1((tag, PyBytes::new(self.py, raw))).ok()?;
        Some((v, end))
    }
}
