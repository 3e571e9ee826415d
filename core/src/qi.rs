//! CQv2 `.qi` slots (readers.qi.read_qi and model.index._v2_chunk, the Python reference): each
//! 32-byte slot classified as the broker's recovery reads it, and the index records of the used
//! slots, in one pass; plus the slots the reader has a finding about (the findings' texts stay
//! in Python).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher for one u64 key (an id's first 8 bytes, a .qs offset): a multiply that spreads
/// every input bit into the high bits the table looks at; SipHash is several times slower.
#[derive(Default)]
struct Mix(u64);

impl Hasher for Mix {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(26);
    }
}

pub const SLOT: usize = 32;
pub const HEADER: i64 = 64;

// codes.SlotClass, codes.RecordKind, codes.Location
const EMPTY: u8 = 0;
const LIVE: u8 = 1;
const GHOST: u8 = 2;
const BAD: u8 = 3;
const PUBLISH: u8 = 0;
const KIND_GHOST: u8 = 3;
const KIND_BAD: u8 = 4;
const LOC_NONE: i8 = -1;

#[derive(Default)]
pub struct Slots {
    pub klass: Vec<u8>,
    pub malformed: Vec<u8>,
    pub expiry: Vec<i64>,                // per slot, 0 where none or out of range
    pub bad_expiry: Vec<i64>,            // used slots whose expiry does not fit (a finding each)
    pub stray: Vec<i64>,                 // ghost slots without a location (a finding each)
    pub qs_range: Vec<i64>,              // used .qs slots whose offset is >= 2^63
    pub rejected: Vec<i64>,              // bad or malformed slots
    pub duplicates: Vec<(i64, i64, u8)>, // (slot, first slot with the same key, location kind)
    // the records of the used slots (model.index.Records)
    pub used: Vec<i64>,
    pub kind: Vec<u8>,
    pub persistent: Vec<i8>,
    pub loc: Vec<i8>,
    pub msg_id: Vec<u8>,
    pub store_offset: Vec<u64>, // as the slot holds it (the model caps one past int64)
    pub store_size: Vec<i64>,
    pub size: Vec<i64>,
    pub status: Vec<i32>,
    pub live: Vec<i64>, // positions in `used` of the live slots
}

#[inline]
fn be64(s: &[u8], o: usize) -> u64 {
    u64::from_be_bytes(s[o..o + 8].try_into().unwrap())
}

#[inline]
fn be32(s: &[u8], o: usize) -> u32 {
    u32::from_be_bytes(s[o..o + 4].try_into().unwrap())
}

/// `slots`: whole slots only. `expiry_max`: the largest expiry a timestamp column holds.
pub fn decode(slots: &[u8], expiry_max: u64) -> Slots {
    let n = slots.len() / SLOT;
    let mut o = Slots {
        klass: vec![EMPTY; n],
        malformed: vec![0; n],
        expiry: vec![0; n],
        used: Vec::with_capacity(n),
        kind: Vec::with_capacity(n),
        persistent: Vec::with_capacity(n),
        loc: Vec::with_capacity(n),
        msg_id: Vec::with_capacity(16 * n),
        store_offset: Vec::with_capacity(n),
        store_size: Vec::with_capacity(n),
        size: Vec::with_capacity(n),
        status: Vec::with_capacity(n),
        live: Vec::with_capacity(n),
        ..Default::default()
    };
    let (mut id_keys, mut qs_keys) = (Vec::with_capacity(n), Vec::new()); // (key's first 8 bytes, slot)
    for i in 0..n {
        let s = &slots[i * SLOT..(i + 1) * SLOT];
        let (status, flags, kind) = (s[0], s[1], s[3]);
        let persistent = flags & 1 == 1;
        let reserved = flags & 0xFE != 0 || s[2] != 0;
        let id_zero = s[4..20].iter().all(|&b| b == 0);
        let malformed = status == 1
            && persistent
            && !reserved
            && (kind > 2 || (kind == 0 && !id_zero) || (kind == 2 && be32(s, 16) != 0));
        let klass = if status > 1 || (status == 1 && persistent && reserved) {
            BAD
        } else if status == 1 {
            LIVE
        } else if s[1..].iter().any(|&b| b != 0) {
            GHOST
        } else {
            EMPTY
        };
        o.klass[i] = klass;
        o.malformed[i] = malformed as u8;
        let expiry = be64(s, 24);
        let expiry_bad = expiry > expiry_max;
        o.expiry[i] = if expiry_bad { 0 } else { expiry as i64 };
        if klass == EMPTY {
            continue;
        }
        let slot = i as i64;
        if expiry_bad {
            o.bad_expiry.push(slot);
        }
        if klass == GHOST && kind != 1 && kind != 2 {
            o.stray.push(slot);
        }
        let qs_offset = be64(s, 4);
        if kind == 2 && qs_offset >= 1 << 63 {
            o.qs_range.push(slot);
        }
        if klass == BAD || malformed {
            o.rejected.push(slot);
        }
        if kind == 1 {
            id_keys.push((qs_offset, slot)); // the id's first 8 bytes
        } else if kind == 2 {
            qs_keys.push((qs_offset, slot));
        }
        if status == 1 {
            o.live.push(o.used.len() as i64);
        }
        o.used.push(slot);
        o.kind.push(match klass {
            GHOST => KIND_GHOST,
            BAD => KIND_BAD,
            _ => PUBLISH,
        });
        o.persistent.push((flags & 1) as i8);
        o.loc.push(if kind <= 2 && !malformed { kind as i8 } else { LOC_NONE });
        o.msg_id.extend_from_slice(if kind == 1 { &s[4..20] } else { &[0u8; 16] });
        let qs = kind == 2;
        o.store_offset.push(if qs { qs_offset } else { 0 });
        o.store_size.push(if qs { be32(s, 12) as i64 } else { 0 });
        o.size.push(be32(s, 20) as i64);
        o.status.push(status as i32);
    }
    // the reference reports the message id copies first, then the .qs ones
    o.duplicates = copies(slots, id_keys, 1);
    o.duplicates.extend(copies(slots, qs_keys, 2));
    o
}

/// `(slot, first slot, kind)` of the slots whose key (the 16-byte id at offset 4 for kind 1,
/// the .qs offset for kind 2) an earlier slot holds, in slot order. `keys`: (first 8 bytes of
/// the key, slot) in slot order; distinct first 8 bytes, the usual case, prove distinct keys.
fn copies(slots: &[u8], keys: Vec<(u64, i64)>, kind: u8) -> Vec<(i64, i64, u8)> {
    let mut seen: HashSet<u64, BuildHasherDefault<Mix>> =
        HashSet::with_capacity_and_hasher(keys.len(), Default::default());
    if keys.iter().all(|k| seen.insert(k.0)) {
        return Vec::new();
    }
    let key = |slot: i64| {
        let s = slot as usize * SLOT;
        &slots[s + 4..s + if kind == 1 { 20 } else { 12 }]
    };
    let mut first: HashMap<&[u8], i64> = HashMap::new();
    let mut out = Vec::new();
    for (_, slot) in keys {
        let f = *first.entry(key(slot)).or_insert(slot);
        if f != slot {
            out.push((slot, f, kind));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(status: u8, flags: u8, kind: u8, tail: &[u8]) -> Vec<u8> {
        let mut s = vec![status, flags, 0, kind];
        s.extend_from_slice(tail);
        s.resize(SLOT, 0);
        s
    }

    #[test]
    fn classes_and_records() {
        let mut b = slot(1, 1, 1, &[7; 16]); // live persistent, shared store
        b.extend(slot(0, 0, 0, &[])); // empty
        b.extend(slot(0, 1, 2, &[0, 0, 0, 0, 0, 0, 0, 64])); // ghost of a .qs entry
        b.extend(slot(2, 0, 0, &[])); // bad status
        b.extend(slot(1, 1, 1, &[7; 16])); // a copy of slot 0
        let d = decode(&b, i64::MAX as u64);
        assert_eq!(d.klass, vec![LIVE, EMPTY, GHOST, BAD, LIVE]);
        assert_eq!(d.used, vec![0, 2, 3, 4]);
        assert_eq!(d.live, vec![0, 3]);
        assert_eq!(d.rejected, vec![3]);
        assert_eq!(d.duplicates, vec![(4, 0, 1)]);
        assert_eq!(d.loc, vec![1, 2, 0, 1]);
        assert_eq!(d.store_offset, vec![0, 64, 0, 0]);
    }

    #[test]
    fn garbage_never_panics() {
        let mut x: u64 = 99;
        for len in 0..300 {
            let b: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    (x >> 56) as u8
                })
                .collect();
            let d = decode(&b, i64::MAX as u64);
            assert_eq!(d.klass.len(), len / SLOT);
        }
    }
}
