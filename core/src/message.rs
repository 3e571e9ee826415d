//! The two stored-message layouts that make up almost every store, decoded as the Python
//! fast path does (`cqforensics.message.fast.decode`), with the same results:
//!
//! * 3.13+/4.x `{mc, mc_amqpl, {content, 60, none, PropsBin, rabbit_framing_amqp_0_9_1, [Body]}, Anns}`
//!   whose annotations hold only `id`, `x`, `rk` and `rts`;
//! * 3.10-3.12 `{basic_message, {resource, VHost, exchange, X}, Rks, {content, ...}, Id, IsPersistent}`.
//!
//! Any other shape, value type or damage is `Err(Fallback)`: the reference decodes that entry.

use std::borrow::Cow;

use base64::Engine;

use crate::amqp091::{self, Fallback, Props, R};

/// The range of the timestamp[us] column (schema.TS_MIN_US, TS_MAX_US): beyond it the
/// reference reports the value out of range.
const TS_MIN_US: i128 = -62_135_596_800 * 1_000_000;
const TS_MAX_US: i128 = 253_402_300_800 * 1_000_000 - 1;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Format {
    McAmqpl,
    BasicMessage,
}

/// What the annotations do to the expiration property.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Expiration {
    Kept,
    Removed,
    /// replaced by `Scratch::expiration`
    Replaced,
}

/// A decoded message. Its texts (headers, annotations, a replaced expiration) are in the
/// `Scratch` it was decoded with, until the next decode.
pub struct Msg<'a> {
    pub msg_id: Option<&'a [u8]>,
    pub exchange: Option<&'a str>,
    pub routing_keys: Bins<'a>,
    pub expiration: Expiration,
    pub headers: bool,
    pub props: Props<'a>,
    pub timestamp_us: Option<i64>,
    pub annotations: bool,
    pub body: &'a [u8],
    pub format: Format,
}

/// The buffers a decode builds its texts in, reused from message to message: a message costs
/// no allocation of its own.
#[derive(Default)]
pub struct Scratch {
    pub headers: String,
    pub annotations: String,
    pub expiration: String,
    vals: String,
    entries: Vec<amqp091::Entry<'static>>, // empty between decodes (their names borrow a term)
    anns: Vec<Ann<'static>>,               // likewise
}

/// An empty vector of another lifetime in the same allocation (an in-place collect of nothing).
fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().map(|_| unreachable!()).collect()
}

/// A proper, non-empty list of binaries (checked UTF-8 where it is routing keys): its items'
/// bytes (`m` tags and lengths included) and their number.
#[derive(Clone, Copy, Default)]
pub struct Bins<'a> {
    items: &'a [u8],
    n: usize,
}

impl<'a> Bins<'a> {
    /// The items' bytes (`bin_list` checked their framing).
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let items = self.items;
        let mut p = 0;
        std::iter::from_fn(move || {
            let (b, q) = binary(items, p + 1).ok()?;
            p = q;
            Some(b)
        })
        .take(self.n)
    }

    /// Every item is UTF-8 text.
    fn texts(self) -> R<Self> {
        for b in self.iter() {
            text(b)?;
        }
        Ok(self)
    }
}

/// The items of the list whose `l` tag is at `p`: `l N (m Len Bytes){N} j` with N > 0 (an
/// empty `l` list or an improper tail is the reference's to decide), and the offset after it.
fn bin_list(raw: &[u8], p: usize) -> R<(Bins<'_>, usize)> {
    let n = u32_at(raw, p + 1)?;
    let mut q = p + 5;
    // a count checked against the bytes left before any item is looked at: each takes 5 at least
    if n > raw.len().saturating_sub(q) / 5 {
        return Err(Fallback);
    }
    for _ in 0..n {
        if raw.get(q) != Some(&b'm') {
            return Err(Fallback);
        }
        q = binary(raw, q + 1)?.1;
    }
    if raw.get(q) != Some(&b'j') || n == 0 {
        return Err(Fallback);
    }
    Ok((Bins { items: &raw[p + 5..q], n }, q + 1))
}

struct Layout {
    mc: Vec<u8>,
    bm: Vec<u8>,
    exchange: Vec<u8>,
    content: Vec<u8>,
    framing: Vec<u8>,
    true_: Vec<u8>,
    false_: Vec<u8>,
}

fn atom(name: &[u8], utf8: bool) -> Vec<u8> {
    let mut v = if utf8 { vec![b'w', name.len() as u8] } else { vec![b'd', 0, name.len() as u8] };
    v.extend_from_slice(name);
    v
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

impl Layout {
    fn new(utf8: bool) -> Layout {
        let a = |n: &[u8]| atom(n, utf8);
        Layout {
            mc: cat(&[b"\x83h\x04", &a(b"mc"), &a(b"mc_amqpl")]),
            bm: cat(&[b"\x83h\x06", &a(b"basic_message"), b"h\x04", &a(b"resource"), b"m"]),
            exchange: cat(&[&a(b"exchange"), b"m"]),
            content: cat(&[b"h\x06", &a(b"content"), b"a<", &a(b"none"), b"m"]),
            framing: cat(&[&a(b"rabbit_framing_amqp_0_9_1"), b"l\x00\x00\x00\x01m"]),
            true_: a(b"true"),
            false_: a(b"false"),
        }
    }
}

pub struct Decoder {
    layouts: [Layout; 2],
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder { layouts: [Layout::new(true), Layout::new(false)] }
    }
}

#[inline]
fn starts(raw: &[u8], p: usize, prefix: &[u8]) -> bool {
    raw.get(p..p + prefix.len()) == Some(prefix)
}

#[inline]
fn u32_at(raw: &[u8], p: usize) -> R<usize> {
    Ok(u32::from_be_bytes(raw.get(p..p + 4).ok_or(Fallback)?.try_into().unwrap()) as usize)
}

/// The bytes of a binary whose 4-byte length is at `p`, and the offset after it.
#[inline]
fn binary(raw: &[u8], p: usize) -> R<(&[u8], usize)> {
    let n = u32_at(raw, p)?;
    let end = p + 4 + n;
    Ok((raw.get(p + 4..end).ok_or(Fallback)?, end))
}

#[inline]
fn text(b: &[u8]) -> R<&str> {
    amqp091::utf8(b).ok_or(Fallback)
}

/// A proper list of binaries (`l ... j`) or nil at `p`, as UTF-8 strings.
fn binaries(raw: &[u8], p: usize) -> R<(Bins<'_>, usize)> {
    match raw.get(p) {
        Some(b'j') => Ok((Bins::default(), p + 1)),
        Some(b'l') => {
            let (b, q) = bin_list(raw, p)?;
            Ok((b.texts()?, q))
        }
        _ => Err(Fallback),
    }
}

/// An integer term at `p` (small integer, integer, small big up to 64 bits).
fn integer(raw: &[u8], p: usize) -> R<(i128, usize)> {
    match raw.get(p) {
        Some(b'a') => Ok((*raw.get(p + 1).ok_or(Fallback)? as i128, p + 2)),
        Some(b'b') => {
            let v = i32::from_be_bytes(raw.get(p + 1..p + 5).ok_or(Fallback)?.try_into().unwrap());
            Ok((v as i128, p + 5))
        }
        Some(b'n') => {
            let n = *raw.get(p + 1).ok_or(Fallback)? as usize;
            let sign = *raw.get(p + 2).ok_or(Fallback)?;
            if n > 8 || sign > 1 {
                return Err(Fallback);
            }
            let digits = raw.get(p + 3..p + 3 + n).ok_or(Fallback)?;
            let v = digits.iter().rev().fold(0u64, |acc, &d| (acc << 8) | d as u64) as i128;
            Ok((if sign == 1 { -v } else { v }, p + 3 + n))
        }
        _ => Err(Fallback),
    }
}

/// An annotation value of the kinds stores hold; anything else is for the reference.
enum Val<'a> {
    Bin(&'a [u8]),
    Int(i128),
    Atom(Cow<'a, str>),
    Bins(Bins<'a>),
    Nil,
}

/// An annotation: its name, whether the name is an atom, its value.
type Ann<'a> = (Cow<'a, str>, bool, Val<'a>);

fn latin1(b: &[u8]) -> Cow<'_, str> {
    match amqp091::utf8(b) {
        Some(s) if b.is_ascii() => Cow::Borrowed(s),
        _ => Cow::Owned(b.iter().map(|&c| c as char).collect()),
    }
}

/// An atom at `p` in any of its four encodings, as text (latin-1 ones converted).
fn any_atom(raw: &[u8], p: usize) -> R<(Cow<'_, str>, usize)> {
    let tag = *raw.get(p).ok_or(Fallback)?;
    let (n, at) = match tag {
        b'w' | b's' => (*raw.get(p + 1).ok_or(Fallback)? as usize, p + 2),
        b'v' | b'd' => (u16::from_be_bytes(raw.get(p + 1..p + 3).ok_or(Fallback)?.try_into().unwrap()) as usize, p + 3),
        _ => return Err(Fallback),
    };
    let b = raw.get(at..at + n).ok_or(Fallback)?;
    let name = if tag == b'w' || tag == b'v' { Cow::Borrowed(text(b)?) } else { latin1(b) };
    Ok((name, at + n))
}

fn value(raw: &[u8], p: usize) -> R<(Val<'_>, usize)> {
    Ok(match raw.get(p) {
        Some(b'm') => {
            let (b, q) = binary(raw, p + 1)?;
            (Val::Bin(b), q)
        }
        Some(b'a' | b'b' | b'n') => {
            let (v, q) = integer(raw, p)?;
            (Val::Int(v), q)
        }
        Some(b'w' | b's' | b'v' | b'd') => {
            let (a, q) = any_atom(raw, p)?;
            (Val::Atom(a), q)
        }
        Some(b'j') => (Val::Nil, p + 1),
        Some(b'l') => {
            let (b, q) = bin_list(raw, p)?;
            (Val::Bins(b), q)
        }
        _ => return Err(Fallback),
    })
}

/// message.to_json_value of a binary: UTF-8 text, else `{"base64": ...}`.
fn push_json_bin(out: &mut String, b: &[u8]) {
    match amqp091::utf8(b) {
        Some(s) => amqp091::push_json_str(out, s),
        None => {
            out.push_str("{\"base64\":\"");
            out.push_str(&base64::engine::general_purpose::STANDARD.encode(b));
            out.push_str("\"}");
        }
    }
}

fn push_json_val(out: &mut String, v: &Val) {
    match v {
        Val::Bin(b) => push_json_bin(out, b),
        Val::Int(i) => amqp091::push_int(out, *i),
        Val::Atom(a) => amqp091::push_json_str(out, a),
        Val::Nil => out.push_str("[]"),
        Val::Bins(items) => {
            out.push('[');
            for (i, b) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_json_bin(out, b);
            }
            out.push(']');
        }
    }
}

/// The annotation names the 0-9-1 view or the columns give a meaning to (as atoms), each
/// numbered: a message's annotations are looked up by number, its names compared once.
#[derive(Clone, Copy)]
enum Special {
    Id,
    X,
    Rk,
    Rts,
    P,
    Ts,
    Ttl,
    D,
    Deaths,
    TimestampInMs,
}

fn special(name: &str) -> Option<Special> {
    Some(match name {
        "id" => Special::Id,
        "x" => Special::X,
        "rk" => Special::Rk,
        "rts" => Special::Rts,
        "p" => Special::P,
        "ts" => Special::Ts,
        "ttl" => Special::Ttl,
        "d" => Special::D,
        "deaths" => Special::Deaths,
        "timestamp_in_ms" => Special::TimestampInMs,
        _ => return None,
    })
}

impl Decoder {
    /// The message stored in `raw`; its texts go to `s`.
    pub fn decode<'a>(&self, raw: &'a [u8], s: &mut Scratch) -> R<Msg<'a>> {
        for lay in &self.layouts {
            if starts(raw, 0, &lay.mc) {
                let mut anns = recycle(std::mem::take(&mut s.anns));
                let mut entries = recycle(std::mem::take(&mut s.entries));
                let m = self.mc_amqpl(raw, lay, s, &mut anns, &mut entries);
                (s.anns, s.entries) = (recycle(anns), recycle(entries));
                return m;
            }
            if starts(raw, 0, &lay.bm) {
                let mut entries = recycle(std::mem::take(&mut s.entries));
                let m = self.basic_message(raw, lay, s, &mut entries);
                s.entries = recycle(entries);
                return m;
            }
        }
        Err(Fallback)
    }

    /// A #content{} with encoded properties and one body fragment at p: (props, body, end).
    fn content<'a>(&self, raw: &'a [u8], p: usize, lay: &Layout) -> R<(&'a [u8], &'a [u8], usize)> {
        if !starts(raw, p, &lay.content) {
            return Err(Fallback);
        }
        let (props, p) = binary(raw, p + lay.content.len())?;
        if !starts(raw, p, &lay.framing) {
            return Err(Fallback);
        }
        let (body, p) = binary(raw, p + lay.framing.len())?;
        if raw.get(p) != Some(&b'j') {
            return Err(Fallback);
        }
        Ok((props, body, p + 1))
    }

    /// The basic properties in `props_bin`, their headers' JSON text in `s.headers`.
    fn properties<'a>(props_bin: &'a [u8], s: &mut Scratch, entries: &mut Vec<amqp091::Entry<'a>>) -> R<Props<'a>> {
        s.vals.clear();
        s.headers.clear();
        let props = amqp091::properties(props_bin, &mut s.vals, entries)?;
        if props.headers {
            amqp091::push_entries(&mut s.headers, entries, &s.vals);
        }
        Ok(props)
    }

    /// mc_amqpl with the annotations applied as mc_amqpl:protocol_state does for a 0-9-1
    /// consumer (message._amqpl_view), and the annotations JSON (message._annotations_json).
    fn mc_amqpl<'a>(
        &self,
        raw: &'a [u8],
        lay: &Layout,
        s: &mut Scratch,
        anns: &mut Vec<Ann<'a>>,
        entries: &mut Vec<amqp091::Entry<'a>>,
    ) -> R<Msg<'a>> {
        let (props_bin, body, mut p) = self.content(raw, lay.mc.len(), lay)?;
        if raw.get(p) != Some(&b't') {
            return Err(Fallback);
        }
        let n = u32_at(raw, p + 1)?;
        p += 5;
        if n > raw.len().saturating_sub(p) / 2 {
            return Err(Fallback); // a count past the bytes left (each key and value takes a byte at least)
        }
        let mut slots: [Option<usize>; 10] = [None; 10]; // by Special: where its atom is in anns
                                                         // (name, is an atom, value), in map order
        for _ in 0..n {
            let (key, is_atom, q) = if raw.get(p) == Some(&b'm') {
                let (b, q) = binary(raw, p + 1)?;
                (Cow::Borrowed(text(b)?), false, q)
            } else {
                let (a, q) = any_atom(raw, p)?;
                (a, true, q)
            };
            // a name seen twice (either kind), or a binary spelling a special atom's name,
            // is left to the reference's dict semantics
            let class = special(&key);
            if anns.iter().any(|(k, _, _)| *k == key) || (!is_atom && class.is_some()) {
                return Err(Fallback);
            }
            let (v, q) = value(raw, q)?;
            if let Some(c) = class {
                slots[c as usize] = Some(anns.len());
            }
            anns.push((key, is_atom, v));
            p = q;
        }
        let get = |name: Special| slots[name as usize].map(|i| &anns[i].2);
        // a value of another kind than the broker writes (a guid of another size, a `d` that is
        // no boolean, a `p` or `ts` that is no integer) is the reference's to mark
        let msg_id = match get(Special::Id) {
            None => None,
            Some(Val::Bin(b)) if b.len() == 16 => Some(*b),
            _ => return Err(Fallback),
        };
        match get(Special::D) {
            None => {}
            Some(Val::Atom(a)) if a == "true" || a == "false" => {}
            _ => return Err(Fallback),
        }
        if matches!(get(Special::P), Some(v) if !matches!(v, Val::Int(_)))
            || matches!(get(Special::Ts), Some(v) if !matches!(v, Val::Int(_)))
        {
            return Err(Fallback);
        }
        let exchange = match get(Special::X) {
            None => None,
            Some(Val::Bin(b)) => Some(text(b)?),
            _ => return Err(Fallback),
        };
        let routing_keys = match get(Special::Rk) {
            None | Some(Val::Nil) => Bins::default(),
            Some(Val::Bins(items)) => items.texts()?,
            _ => return Err(Fallback),
        };
        if get(Special::Deaths).is_some() {
            return Err(Fallback);
        }
        let mut props = Self::properties(props_bin, s, entries)?;
        // x- binaries and timestamp_in_ms become headers (sorted with the table's own): rare
        let mut extra: Vec<(String, String)> = Vec::new();
        for (k, is_atom, v) in anns.iter() {
            if *is_atom {
                continue;
            }
            if k.starts_with("x-") {
                let t = match v {
                    Val::Atom(a) if a == "true" || a == "false" => format!("{{\"type\":\"bool\",\"value\":{a}}}"),
                    Val::Int(i) => format!("{{\"type\":\"long\",\"value\":{i}}}"),
                    Val::Bin(b) => {
                        let mut t = String::from("{\"type\":\"longstr\",\"value\":");
                        amqp091::push_json_str(&mut t, text(b)?);
                        t.push('}');
                        t
                    }
                    _ => continue,
                };
                extra.push((k.to_string(), t));
            } else if k == "timestamp_in_ms" {
                if let Val::Int(i) = v {
                    extra.push((k.to_string(), format!("{{\"type\":\"long\",\"value\":{i}}}")));
                }
            }
        }
        if !extra.is_empty() {
            let mut merged: Vec<(String, String)> =
                entries.iter().map(|(k, v)| (k.to_string(), s.vals[v.clone()].to_string())).collect();
            for (k, v) in extra {
                match merged.iter_mut().find(|(m, _)| *m == k) {
                    Some(slot) => slot.1 = v,
                    None => merged.push((k, v)),
                }
            }
            merged.sort_by(|a, b| a.0.cmp(&b.0));
            s.vals.clear();
            entries.clear();
            let texts: Vec<(&str, std::ops::Range<usize>)> = merged
                .iter()
                .map(|(k, v)| {
                    let at = s.vals.len();
                    s.vals.push_str(v);
                    (k.as_str(), at..s.vals.len())
                })
                .collect();
            s.headers.clear();
            amqp091::push_entries(&mut s.headers, &texts, &s.vals);
            props.headers = true;
        }
        let expiration = match get(Special::Ttl) {
            None => Expiration::Kept,
            Some(Val::Atom(a)) if a == "undefined" => Expiration::Removed,
            Some(Val::Int(i)) => {
                s.expiration.clear();
                amqp091::push_int(&mut s.expiration, *i);
                Expiration::Replaced
            }
            _ => return Err(Fallback),
        };
        if props.priority.is_none() {
            if let Some(Val::Int(v)) = get(Special::P) {
                if !(i32::MIN as i128..=i32::MAX as i128).contains(v) {
                    return Err(Fallback); // out of the column's range: the reference reports it
                }
                props.priority = Some(*v as i32);
            }
        }
        if props.delivery_mode.is_none() {
            props.delivery_mode = match get(Special::D) {
                Some(Val::Atom(a)) if a == "false" => None,
                _ => Some(2),
            };
        }
        let ts_ms: Option<i128> = match get(Special::Ts) {
            Some(Val::Int(ms)) => Some(*ms),
            _ => props.timestamp.map(|s| s as i128 * 1000),
        };
        let timestamp_us = match ts_ms {
            None => None,
            Some(ms) if (TS_MIN_US..=TS_MAX_US).contains(&(ms * 1000)) => Some((ms * 1000) as i64),
            Some(_) => return Err(Fallback), // the reference names it out of range
        };
        let out = &mut s.annotations;
        out.clear();
        out.push('{');
        let shown = [Special::Id, Special::X, Special::Rk].map(|c| slots[c as usize]); // (in their columns)
        for (_, (k, _, v)) in anns.iter().enumerate().filter(|(i, _)| !shown.contains(&Some(*i))) {
            if out.len() > 1 {
                out.push(',');
            }
            amqp091::push_json_str(out, k);
            out.push(':');
            push_json_val(out, v);
        }
        out.push('}');
        Ok(Msg {
            msg_id,
            exchange,
            routing_keys,
            expiration,
            headers: props.headers,
            props,
            timestamp_us,
            annotations: out.len() > 2,
            body,
            format: Format::McAmqpl,
        })
    }

    fn basic_message<'a>(
        &self,
        raw: &'a [u8],
        lay: &Layout,
        s: &mut Scratch,
        entries: &mut Vec<amqp091::Entry<'a>>,
    ) -> R<Msg<'a>> {
        let (_vhost, p) = binary(raw, lay.bm.len())?;
        if !starts(raw, p, &lay.exchange) {
            return Err(Fallback);
        }
        let (x, p) = binary(raw, p + lay.exchange.len())?;
        let (rks, p) = binaries(raw, p)?;
        let (props_bin, body, p) = self.content(raw, p, lay)?;
        if raw.get(p..p + 5) != Some(b"m\x00\x00\x00\x10") {
            return Err(Fallback);
        }
        let msg_id = raw.get(p + 5..p + 21).ok_or(Fallback)?;
        let p = p + 21;
        if !starts(raw, p, &lay.true_) && !starts(raw, p, &lay.false_) {
            return Err(Fallback);
        }
        let props = Self::properties(props_bin, s, entries)?;
        let timestamp_us = match props.timestamp {
            None => None,
            Some(s) if (s as i128) * 1_000_000 <= TS_MAX_US => Some(s as i64 * 1_000_000),
            Some(_) => return Err(Fallback),
        };
        Ok(Msg {
            expiration: Expiration::Kept,
            headers: props.headers,
            msg_id: Some(msg_id),
            exchange: Some(text(x)?),
            routing_keys: rks,
            props,
            timestamp_us,
            annotations: false,
            body,
            format: Format::BasicMessage,
        })
    }
}

#[cfg(test)]
mod tests {
    //! Every input here is crafted by hand, byte by byte after the layouts in
    //! /work/shared/docs/rabbitmq-formats.md, to reach one shape or one error path: the real
    //! terms brokers wrote are tests/codecs/test_core.py's (the decode equal to the Python reference on
    //! every sample store).
    use super::*;

    /// `m Len Bytes`
    fn bin(b: &[u8]) -> Vec<u8> {
        cat(&[b"m", &(b.len() as u32).to_be_bytes(), b])
    }

    /// A proper list of binaries, or nil when empty.
    fn bins(items: &[&[u8]]) -> Vec<u8> {
        if items.is_empty() {
            return b"j".to_vec();
        }
        let mut v = cat(&[b"l", &(items.len() as u32).to_be_bytes()]);
        for b in items {
            v.extend(bin(b));
        }
        v.push(b'j');
        v
    }

    /// Encoded basic properties: `fields` as (flag bit, encoded value), bits 15 down to 2.
    fn props(fields: &[(u8, &[u8])]) -> Vec<u8> {
        let flags: u16 = fields.iter().map(|(bit, _)| 1u16 << bit).sum();
        let mut v = flags.to_be_bytes().to_vec();
        for (_, f) in fields {
            v.extend_from_slice(f);
        }
        v
    }

    /// A short string property: `Len:8 Bytes`
    fn short(b: &[u8]) -> Vec<u8> {
        cat(&[&[b.len() as u8], b])
    }

    /// A crafted `#content{}` (class 60, no decoded properties) with these encoded properties
    /// and one body fragment, atoms UTF-8 (`w`) or latin-1 (`d`).
    fn content(props: &[u8], body: &[u8], utf8: bool) -> Vec<u8> {
        let a = |n: &[u8]| atom(n, utf8);
        cat(&[
            b"h\x06",
            &a(b"content"),
            b"a<",
            &a(b"none"),
            &bin(props),
            &a(b"rabbit_framing_amqp_0_9_1"),
            b"l\x00\x00\x00\x01",
            &bin(body),
            b"j",
        ])
    }

    /// A crafted 3.13+ `{mc, mc_amqpl, Content, Anns}` term; `anns`: the map's pairs, encoded.
    fn mc_with(props: &[u8], body: &[u8], anns: &[Vec<u8>], utf8: bool) -> Vec<u8> {
        let a = |n: &[u8]| atom(n, utf8);
        let mut v = cat(&[b"\x83h\x04", &a(b"mc"), &a(b"mc_amqpl"), &content(props, body, utf8)]);
        v.push(b't');
        v.extend((anns.len() as u32 / 2).to_be_bytes());
        for x in anns {
            v.extend_from_slice(x);
        }
        v
    }

    /// A crafted 3.13+ term (no properties, body "hi") whose annotations map is `anns` (its `t`
    /// tag and arity included).
    fn mc(anns: &[u8]) -> Vec<u8> {
        let a = |n: &[u8]| atom(n, true);
        cat(&[b"\x83h\x04", &a(b"mc"), &a(b"mc_amqpl"), &content(b"\x00\x00", b"hi", true), anns])
    }

    /// A crafted 3.10-3.12 `#basic_message{}` term.
    fn bm_with(exchange: &[u8], rks: &[u8], props: &[u8], body: &[u8], id: &[u8; 16], utf8: bool) -> Vec<u8> {
        let a = |n: &[u8]| atom(n, utf8);
        cat(&[
            b"\x83h\x06",
            &a(b"basic_message"),
            b"h\x04",
            &a(b"resource"),
            &bin(b"/"),
            &a(b"exchange"),
            &bin(exchange),
            rks,
            &content(props, body, utf8),
            &bin(id),
            &a(b"true"),
        ])
    }

    const ID: [u8; 16] = *b"0123456789abcdef";

    fn w(name: &[u8]) -> Vec<u8> {
        atom(name, true)
    }

    /// small integer / integer terms
    fn int(v: i32) -> Vec<u8> {
        match u8::try_from(v) {
            Ok(b) => vec![b'a', b],
            Err(_) => cat(&[b"b", &v.to_be_bytes()]),
        }
    }

    fn decode(raw: &[u8]) -> R<(Msg<'_>, Scratch)> {
        let mut s = Scratch::default();
        // the Msg borrows only `raw`; its texts are in the Scratch returned with it
        let m = Decoder::default().decode(raw, &mut s)?;
        Ok((m, s))
    }

    fn strings<'a>(m: &Msg<'a>) -> Vec<(&'static str, &'a str)> {
        amqp091::STRING_PROPS.iter().zip(m.props.strings.iter()).filter_map(|(k, v)| v.map(|v| (*k, v))).collect()
    }

    #[test]
    fn decodes_the_crafted_term() {
        let raw = mc(b"t\x00\x00\x00\x01w\x02rkl\x00\x00\x00\x01m\x00\x00\x00\x01kj");
        let (m, _) = decode(&raw).unwrap();
        assert_eq!(m.body, b"hi");
        assert_eq!(m.routing_keys.iter().collect::<Vec<_>>(), vec![b"k".as_slice()]);
    }

    #[test]
    fn mc_amqpl_columns_from_properties_and_annotations() {
        let p = props(&[
            (15, &short(b"text/plain")),
            (12, &[2]),
            (11, &[3]),
            (8, &short(b"60000")),
            (6, &1_700_000_000u64.to_be_bytes()),
            (3, &short(b"app")),
        ]);
        let anns =
            [w(b"id"), bin(&ID), w(b"x"), bin(b"amq.direct"), w(b"rk"), bins(&[b"k1", b"k2"]), w(b"rts"), int(1234)];
        for utf8 in [true, false] {
            let raw = mc_with(&p, b"body!", &anns, utf8);
            let (m, s) = decode(&raw).unwrap();
            assert_eq!(m.format, Format::McAmqpl);
            assert_eq!(m.msg_id, Some(ID.as_slice()));
            assert_eq!(m.exchange, Some("amq.direct"));
            assert_eq!(m.routing_keys.iter().collect::<Vec<_>>(), vec![b"k1".as_slice(), b"k2"]);
            assert_eq!(m.body, b"body!");
            assert_eq!(strings(&m), vec![("content_type", "text/plain"), ("expiration", "60000"), ("app_id", "app")]);
            assert_eq!((m.props.delivery_mode, m.props.priority), (Some(2), Some(3)));
            assert_eq!(m.timestamp_us, Some(1_700_000_000_000_000));
            assert_eq!(m.expiration, Expiration::Kept);
            assert!(!m.headers);
            // id, x and rk have their columns: only rts is left in the annotations' JSON
            assert!(m.annotations);
            assert_eq!(s.annotations, r#"{"rts":1234}"#);
        }
    }

    #[test]
    fn mc_amqpl_annotations_override_properties_as_the_0_9_1_view_does() {
        let none = props(&[]);
        // ttl undefined removes the expiration; an integer ttl replaces it
        let raw = mc_with(&props(&[(8, &short(b"5"))]), b"", &[w(b"ttl"), w(b"undefined")], true);
        assert_eq!(decode(&raw).unwrap().0.expiration, Expiration::Removed);
        let raw = mc_with(&none, b"", &[w(b"ttl"), int(500)], true);
        let (m, s) = decode(&raw).unwrap();
        assert_eq!((m.expiration, s.expiration.as_str()), (Expiration::Replaced, "500"));
        // p gives the priority, ts the timestamp (ms), d=false no delivery mode (else 2)
        let raw = mc_with(&none, b"", &[w(b"p"), int(7), w(b"ts"), int(-5), w(b"d"), w(b"false")], true);
        let (m, _) = decode(&raw).unwrap();
        assert_eq!((m.props.priority, m.timestamp_us, m.props.delivery_mode), (Some(7), Some(-5000), None));
        let bare = mc_with(&none, b"", &[], true);
        let (m, _) = decode(&bare).unwrap();
        assert_eq!((m.props.delivery_mode, m.timestamp_us, m.annotations), (Some(2), None, false));
        // an x- annotation (binary name) becomes a header
        let raw = mc_with(&none, b"", &[bin(b"x-foo"), bin(b"bar")], true);
        let (m, s) = decode(&raw).unwrap();
        assert!(m.headers);
        assert_eq!(s.headers, r#"{"x-foo":{"type":"longstr","value":"bar"}}"#);
    }

    #[test]
    fn basic_message_columns() {
        let p = props(&[(15, &short(b"application/json")), (12, &[1]), (6, &42u64.to_be_bytes())]);
        for utf8 in [true, false] {
            let raw = bm_with(b"ex", &bins(&[b"a.b"]), &p, b"{}", &ID, utf8);
            let (m, _) = decode(&raw).unwrap();
            assert_eq!(m.format, Format::BasicMessage);
            assert_eq!((m.msg_id, m.exchange), (Some(ID.as_slice()), Some("ex")));
            assert_eq!(m.routing_keys.iter().collect::<Vec<_>>(), vec![b"a.b".as_slice()]);
            assert_eq!(m.body, b"{}");
            assert_eq!(strings(&m), vec![("content_type", "application/json")]);
            assert_eq!((m.props.delivery_mode, m.timestamp_us), (Some(1), Some(42_000_000)));
            assert!(!m.annotations && m.expiration == Expiration::Kept);
        }
        // no routing keys (nil) and an empty body
        let bare = bm_with(b"", b"j", &props(&[]), b"", &ID, true);
        let (m, _) = decode(&bare).unwrap();
        assert_eq!((m.routing_keys.iter().count(), m.body.len()), (0, 0));
    }

    #[test]
    fn every_truncation_falls_back() {
        let anns = [w(b"id"), bin(&ID), w(b"rk"), bins(&[b"k"])];
        for raw in [
            mc_with(&props(&[(15, &short(b"t"))]), b"body", &anns, true),
            bm_with(b"ex", &bins(&[b"k"]), &props(&[(12, &[2])]), b"body", &ID, false),
        ] {
            assert!(decode(&raw).is_ok());
            for n in 0..raw.len() {
                assert!(decode(&raw[..n]).is_err(), "a term cut at {n} of {} decoded", raw.len());
            }
        }
    }

    #[test]
    fn bad_tags_fall_back() {
        let good = mc_with(&props(&[]), b"b", &[w(b"rts"), int(1)], true);
        let at = |needle: &[u8]| good.windows(needle.len()).position(|x| x == needle).unwrap();
        // version byte, outer tuple, content tag, body list tag, annotations map tag, value tag
        for (i, bad) in
            [(0, 0x84u8), (1, b'i'), (at(b"a<"), b'b'), (at(b"l\x00\x00\x00\x01"), b'k'), (at(b"t\x00"), b'h')]
        {
            let mut raw = good.clone();
            raw[i] = bad;
            assert!(decode(&raw).is_err(), "a term with byte {i} set to {bad} decoded");
        }
        // an annotation value of a kind not mirrored here (a float), or of another kind than the
        // broker writes (an id that is no 16-byte binary, d no boolean, p no integer)
        for anns in [
            vec![w(b"rts"), cat(&[b"F", &1.5f64.to_be_bytes()])],
            vec![w(b"id"), bin(b"short")],
            vec![w(b"d"), w(b"maybe")],
            vec![w(b"p"), bin(b"1")],
            vec![w(b"deaths"), b"j".to_vec()],
            vec![w(b"rk"), int(1)],
            vec![w(b"p"), cat(&[b"n\x08\x00", &[0xff; 8]])], // out of the int32 column's range
            vec![w(b"ts"), cat(&[b"n\x08\x00", &[0x7f; 8]])], // out of the timestamp column's range
        ] {
            assert!(decode(&mc_with(&props(&[]), b"", &anns, true)).is_err());
        }
        // names the reference's dict decides: one twice, a binary spelling a special atom
        assert!(decode(&mc_with(&props(&[]), b"", &[w(b"a"), int(1), w(b"a"), int(2)], true)).is_err());
        assert!(decode(&mc_with(&props(&[]), b"", &[bin(b"id"), bin(&ID)], true)).is_err());
        // properties with the continuation flag, a string not UTF-8, a routing key not UTF-8
        assert!(decode(&mc_with(b"\x00\x01", b"", &[], true)).is_err());
        assert!(decode(&mc_with(&props(&[(15, &short(b"\xff"))]), b"", &[], true)).is_err());
        assert!(decode(&bm_with(b"ex", &bins(&[b"\xff"]), &props(&[]), b"", &ID, true)).is_err());
        assert!(decode(&bm_with(b"\xc3", b"j", &props(&[]), b"", &ID, true)).is_err());
        // a basic_message whose persistence flag is no boolean, or whose id is 15 bytes
        let mut raw = bm_with(b"ex", b"j", &props(&[]), b"", &ID, true);
        let n = raw.len();
        raw[n - 1] = b'x';
        assert!(decode(&raw).is_err());
        let raw = bm_with(b"ex", b"j", &props(&[]), b"", &ID, true);
        let short_id = cat(&[&raw[..n - 6 - 21], b"m\x00\x00\x00\x0f", &ID[..15], &raw[n - 6..]]);
        assert!(decode(&short_id).is_err());
        // neither layout
        assert!(decode(b"\x83h\x02w\x02mcj").is_err());
        assert!(decode(b"").is_err());
    }

    #[test]
    fn counts_past_the_bytes_left_fall_back_at_once() {
        let mut s = Scratch::default();
        let d = Decoder::default();
        for anns in [
            &b"t\xff\xff\xff\xffw\x02rkj"[..],
            b"t\x00\x00\x00\x01w\x02rkl\xff\xff\xff\xffm\x00\x00\x00\x01kj",
            b"t\x7f\xff\xff\xff",
        ] {
            let raw = mc(anns);
            let t0 = std::time::Instant::now();
            assert!(d.decode(&raw, &mut s).is_err());
            assert!(t0.elapsed().as_millis() < 100);
        }
        // a routing-key list, a body or a header table claiming 4 GiB
        let huge = b"l\xff\xff\xff\xffm\x00\x00\x00\x01kj";
        assert!(decode(&bm_with(b"ex", huge, &props(&[]), b"", &ID, true)).is_err());
        let mut raw = bm_with(b"ex", b"j", &props(&[]), b"body", &ID, true);
        let at = raw.windows(8).position(|x| x == b"\x00\x00\x00\x04body").unwrap();
        raw[at..at + 4].copy_from_slice(&[0xff; 4]);
        assert!(decode(&raw).is_err());
        let table = props(&[(13, b"\xff\xff\xff\xff")]);
        assert!(decode(&mc_with(&table, b"", &[], true)).is_err());
    }

    #[test]
    fn no_byte_changed_anywhere_panics() {
        let anns =
            [w(b"id"), bin(&ID), w(b"x"), bin(b"x"), w(b"rk"), bins(&[b"k"]), w(b"ttl"), int(9), w(b"p"), int(1)];
        let p = props(&[(15, &short(b"t")), (13, b"\x00\x00\x00\x07\x01kS\x00\x00\x00\x00"), (6, &[0; 8])]);
        for good in [mc_with(&p, b"body", &anns, true), bm_with(b"ex", &bins(&[b"a", b"b"]), &p, b"body", &ID, false)] {
            assert!(decode(&good).is_ok());
            for i in 0..good.len() {
                for v in [0u8, 1, 0x7f, 0xff, b'j', b'm', b'l', b't'] {
                    let mut raw = good.clone();
                    raw[i] = v;
                    let _ = decode(&raw); // Ok or Fallback, never a panic
                }
            }
        }
    }
}
