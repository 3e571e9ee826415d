//! The shared-store `.rdq` walk: entries `<<Size:64, MsgId:16, Body, 255>>` and the holes
//! between them. Same rules as the Python reference (`cqforensics.readers.rdq.walk`): follow
//! sizes from offset 0; where the chain breaks, remember a torn entry (size fits, marker
//! missing) and slide to the next offset holding a candidate (a complete entry with its 255
//! marker). Every candidate met is judged (the reference's "which candidates become entries"):
//! a trusted id (in `referenced`) is taken; an untrusted one only when its term looks like a
//! message term and no trusted candidate starts inside it; the others are rejected and the walk
//! moves on to the next candidate after their first byte.

pub const MARK: u8 = 255;
const CHECK_EVERY: usize = 1 << 20; // how often a long scan reports its progress to the pager

/// Drops the pages a scan of a read-only file map has passed (`madvise(MADV_DONTNEED)`, like the
/// reader's `files.drop_pages`): they stay in the page cache and fault back in if read again,
/// but leave the process's RSS, so a walk of a huge file keeps its memory flat. Only ever
/// enabled for a map (on heap memory MADV_DONTNEED would zero the pages).
pub(crate) mod pager {
    use std::cell::Cell;

    const STEP: usize = 16 << 20;

    thread_local! {
        static STATE: Cell<(usize, usize, usize)> = const { Cell::new((0, 0, 0)) }; // base, len, dropped up to
    }

    pub fn start(data: &[u8]) {
        STATE.with(|s| s.set((data.as_ptr() as usize, data.len(), 0)));
    }

    pub fn stop() {
        STATE.with(|s| s.set((0, 0, 0)));
    }

    /// A scan starts again at `from` (pages it faults back in are dropped again as it passes).
    pub fn rewind(from: usize) {
        STATE.with(|s| {
            let (base, len, dropped) = s.get();
            s.set((base, len, dropped.min(from)));
        });
    }

    /// The scan has read everything it needs before `upto`.
    #[inline]
    pub fn passed(upto: usize) {
        STATE.with(|s| {
            let (base, len, dropped) = s.get();
            if base == 0 || upto < dropped + STEP {
                return;
            }
            crate::io::drop_pages(base + dropped, upto.min(len).saturating_sub(dropped));
            s.set((base, len, upto));
        });
    }
}
pub const HEADER: usize = 24; // Size:64 + MsgId:128

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoleKind {
    Zeroed = 0,
    Garbage = 1,
    TruncatedTail = 2,
}

#[derive(Debug, Default)]
pub struct Walk {
    pub offsets: Vec<i64>,
    pub totals: Vec<i64>,
    pub ids: Vec<u8>, // 16 bytes per entry
    pub holes: Vec<(u64, u64, HoleKind)>,
    pub torn: Vec<(u64, u64, [u8; 16])>, // (offset, total, id) of entries without their marker
    /// (offset, total, id, reason, hidden): candidates not taken; reason 0 = not a message term,
    /// 1 = hides the referenced candidate at `hidden` (else -1)
    pub rejected: Vec<(u64, u64, [u8; 16], u8, i64)>,
}

pub const NOT_A_MESSAGE_TERM: u8 = 0;
pub const HIDES_REFERENCED: u8 = 1;

/// Ids to trust: 16-byte ids sorted bytewise, back to back, and optionally their directory
/// (`readers.rdq.Referenced.directory`): 65,537 native u32, entry `b` the position of the first
/// id whose first two bytes are `b` or more. Every entry of a walk is looked up; with the
/// directory a lookup searches one prefix's few ids instead of the whole list (a binary search
/// over 200 k ids cost as much as the walk of a warm file).
pub struct Referenced<'a> {
    ids: &'a [u8],
    dir: Option<&'a [u8]>,
}

const DIRECTORY: usize = (1 << 16) + 1;

impl<'a> Referenced<'a> {
    pub fn sorted(ids: &'a [u8]) -> Referenced<'a> {
        Referenced { ids, dir: None }
    }

    /// `ids` with their directory; one of the wrong length is not used.
    pub fn with_directory(ids: &'a [u8], dir: Option<&'a [u8]>) -> Referenced<'a> {
        Referenced { ids, dir: dir.filter(|d| d.len() == 4 * DIRECTORY) }
    }

    fn is_empty(&self) -> bool {
        self.ids.len() < 16
    }

    /// The id at position m, read as a big-endian integer: bytewise order is the order of these
    /// (compared as two words, inline, rather than by a call to memcmp at each step).
    #[inline]
    fn key(&self, m: usize) -> u128 {
        u128::from_be_bytes(self.ids[m * 16..m * 16 + 16].try_into().unwrap())
    }

    /// The positions `[lo, hi)` the ids with `id`'s first two bytes lie in (all of them without a
    /// directory; the directory's bounds are clamped to the ids, so no directory reads past them).
    #[inline]
    fn bounds(&self, id: &[u8]) -> (usize, usize) {
        let n = self.ids.len() / 16;
        let Some(d) = self.dir else { return (0, n) };
        let b = (id[0] as usize) << 8 | id[1] as usize;
        let at = |k: usize| u32::from_ne_bytes(d[4 * k..4 * k + 4].try_into().unwrap()) as usize;
        let (lo, hi) = (at(b).min(n), at(b + 1).min(n));
        if lo <= hi {
            (lo, hi)
        } else {
            (0, n)
        }
    }

    fn contains(&self, id: &[u8]) -> bool {
        let want = u128::from_be_bytes(id[..16].try_into().unwrap());
        let (mut lo, mut hi) = self.bounds(id);
        while lo < hi {
            let m = (lo + hi) / 2;
            match self.key(m).cmp(&want) {
                std::cmp::Ordering::Less => lo = m + 1,
                std::cmp::Ordering::Greater => hi = m,
                std::cmp::Ordering::Equal => return true,
            }
        }
        false
    }
}

/// The outer framing of a stored message term at `data[s..s + n]` (readers.rdq.plausible_term):
/// 131, then a tuple of arity >= 2 whose first element is an atom inside the term, or a
/// compressed term (80, a non-zero size, a zlib stream).
pub fn plausible_term(data: &[u8], s: usize, n: usize) -> bool {
    if n < 4 || data[s] != 131 {
        return false;
    }
    let be32 = |p: usize| u32::from_be_bytes(data[p..p + 4].try_into().unwrap()) as usize;
    let (arity, k) = match data[s + 1] {
        80 => return n >= 7 && be32(s + 2) > 0 && data[s + 6] == 0x78,
        104 => (data[s + 2] as usize, 3usize),
        105 => {
            if n < 7 {
                return false;
            }
            (be32(s + 2), 6usize)
        }
        _ => return false,
    };
    if arity < 2 || k + 2 > n {
        return false;
    }
    match data[s + k] {
        115 | 119 => k + 2 + data[s + k + 1] as usize <= n,
        100 | 118 => k + 3 <= n && k + 3 + u16::from_be_bytes([data[s + k + 1], data[s + k + 2]]) as usize <= n,
        _ => false,
    }
}

/// The trusted candidates ahead of the walk, by one lazy forward scan (`lo` never decreases
/// between calls, so each byte is looked at once at most).
struct TrustedAhead {
    frontier: usize,
    found: Option<usize>, // the last trusted candidate found, not yet passed
}

impl TrustedAhead {
    /// The smallest trusted candidate offset in `[lo, hi)`.
    fn first(
        &mut self,
        data: &[u8],
        ext: Option<&[(usize, usize)]>,
        refs: &Referenced,
        lo: usize,
        hi: usize,
    ) -> Option<usize> {
        if refs.is_empty() {
            return None;
        }
        loop {
            if let Some(p) = self.found {
                if p >= lo {
                    return if p < hi { Some(p) } else { None };
                }
                self.found = None;
            }
            if self.frontier >= hi {
                return None;
            }
            let from = self.frontier.max(lo);
            match next_candidate_before(data, from, hi, ext) {
                None => {
                    self.frontier = hi;
                    return None;
                }
                Some(p) => {
                    self.frontier = p + 1;
                    if refs.contains(&data[p + 8..p + 24]) {
                        self.found = Some(p);
                    }
                }
            }
        }
    }
}

#[inline]
fn size_at(data: &[u8], o: usize) -> u64 {
    u64::from_be_bytes(data[o..o + 8].try_into().unwrap())
}

/// A complete entry with its marker starts at `p` (the size field read as zeros past the end).
#[inline]
fn is_candidate(data: &[u8], p: usize) -> bool {
    let end = data.len();
    if p + 25 > end {
        return false; // limit = end - 9 - p must be >= 16
    }
    let size = size_at(data, p);
    size >= 16 && size <= (end - 9 - p) as u64 && data[p + 8 + size as usize] == MARK
}

/// The first candidate offset in `[from, end)`, skipping the holes of a sparse file
/// (`extents`: sorted `[start, end)` data ranges; everything else reads as zeros, where no
/// entry can start).
fn next_candidate(data: &[u8], from: usize, extents: Option<&[(usize, usize)]>) -> Option<usize> {
    next_candidate_before(data, from, data.len(), extents)
}

/// The first candidate offset in `[from, until)`.
fn next_candidate_before(data: &[u8], from: usize, until: usize, extents: Option<&[(usize, usize)]>) -> Option<usize> {
    let end = until.min(data.len());
    let mut p = from;
    let mut ext_i = 0usize;
    let mut report = p + CHECK_EVERY;
    while p < end {
        if p >= report {
            pager::passed(p.saturating_sub(HEADER));
            report = p + CHECK_EVERY;
        }
        if let Some(ext) = extents {
            while ext_i < ext.len() && ext[ext_i].1 <= p {
                ext_i += 1;
            }
            if ext_i == ext.len() {
                return None; // only zeros from here on
            }
            let lo = ext[ext_i].0.saturating_sub(7);
            if p < lo {
                p = lo;
            }
            let stop = ext[ext_i].1.min(end);
            if p >= end {
                return None;
            }
            while p < stop {
                if is_candidate(data, p) {
                    return Some(p);
                }
                p = next_size_prefix(data, p + 1, stop);
            }
            continue;
        }
        // dense: a zero size field is never an entry; through a zero run, no offset is a
        // candidate until 7 bytes before its end (a size field needs a nonzero byte)
        if p + 8 <= data.len() && data[p..p + 8].iter().all(|&b| b == 0) {
            p = (p + 1).max(first_nonzero(data, p + 8).saturating_sub(7));
            continue;
        }
        if is_candidate(data, p) {
            return Some(p);
        }
        // through nonzero bytes (an orphan's body searched for trusted entries, garbage), only
        // an offset opening a size field's run of high zero bytes can start an entry
        p = next_size_prefix(data, p + 1, end);
    }
    None
}

/// How many high bytes of every size field that fits in `data` are zero (a size is below the
/// file's length).
#[inline]
fn zero_size_bytes(data: &[u8]) -> usize {
    ((data.len() as u64).leading_zeros() / 8) as usize
}

/// Bit i set: `block[i]` is zero (SSE2, which every x86-64 has: four compares and masks).
#[cfg(target_arch = "x86_64")]
#[inline]
fn zero_mask(block: &[u8; 64]) -> u64 {
    use std::arch::x86_64::{__m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_setzero_si128};
    let mut m = 0u64;
    for (i, chunk) in block.chunks_exact(16).enumerate() {
        // SAFETY: SSE2 is part of x86-64; an unaligned load of the 16 bytes of `chunk`
        let bits = unsafe {
            let v = _mm_loadu_si128(chunk.as_ptr() as *const __m128i);
            _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_setzero_si128())) as u16
        };
        m |= (bits as u64) << (16 * i);
    }
    m
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn zero_mask(block: &[u8; 64]) -> u64 {
    block.iter().enumerate().fold(0u64, |m, (i, &b)| m | ((b == 0) as u64) << i)
}

/// The first offset in `[from, end)` that can start an entry by its size field's high bytes
/// (`zero_size_bytes` zeros from there: `is_candidate` is false everywhere else), 64 bytes at a
/// time; `end` when none. Offsets too close to the end of `data` for a whole block are all
/// returned (`is_candidate` judges them).
fn next_size_prefix(data: &[u8], from: usize, end: usize) -> usize {
    let k = zero_size_bytes(data);
    if k == 0 {
        return from.min(end);
    }
    let mut p = from;
    let mut report = p + CHECK_EVERY;
    while p < end && p + 64 <= data.len() {
        let mut run = zero_mask(data[p..p + 64].try_into().unwrap());
        for _ in 1..k {
            run &= run >> 1; // bit i: bytes i.. i + k - 1 are all zero
        }
        run &= u64::MAX >> (k - 1); // runs wholly inside the block
        if run != 0 {
            return (p + run.trailing_zeros() as usize).min(end);
        }
        p += 65 - k;
        if p >= report {
            pager::passed(p.saturating_sub(HEADER));
            report = p + CHECK_EVERY;
        }
    }
    p.min(end)
}

/// Whether a block holds a nonzero byte: an OR over it, which the compiler vectorises (an
/// early-exit `any` is a byte at a time).
#[inline]
fn block_nonzero(block: &[u8]) -> bool {
    block.iter().fold(0u8, |acc, &b| acc | b) != 0
}

/// The offset of the first nonzero byte at or after `from` (`data.len()` when none), 64 bytes at
/// a time; reported to the pager as it goes.
fn first_nonzero(data: &[u8], from: usize) -> usize {
    let n = data.len();
    let mut i = from;
    let mut report = i + CHECK_EVERY;
    while i + 64 <= n && !block_nonzero(&data[i..i + 64]) {
        i += 64;
        if i >= report {
            pager::passed(i);
            report = i + CHECK_EVERY;
        }
    }
    while i < n && data[i] == 0 {
        i += 1;
    }
    i
}

/// Whether `data[a..b]` holds a nonzero byte, a megabyte at a time (reported to the pager).
fn any_nonzero(data: &[u8], a: usize, b: usize) -> bool {
    let mut c = a;
    pager::rewind(a);
    while c < b {
        let d = (c + CHECK_EVERY).min(b);
        if data[c..d].chunks(4096).any(block_nonzero) {
            return true;
        }
        pager::passed(d);
        c = d;
    }
    false
}

fn hole_kind(data: &[u8], o: usize, n: usize, extents: Option<&[(usize, usize)]>) -> HoleKind {
    let garbage = match extents {
        None => any_nonzero(data, o, o + n),
        Some(ext) => ext.iter().any(|&(a, b)| {
            let (a, b) = (a.max(o), b.min(o + n));
            a < b && any_nonzero(data, a, b)
        }),
    };
    if garbage {
        HoleKind::Garbage
    } else {
        HoleKind::Zeroed
    }
}

/// An entry header at `o` whose size runs past the end of the file (a write cut short).
fn is_truncated_tail(data: &[u8], o: usize) -> bool {
    let end = data.len();
    if o + 8 > end {
        return data[o..end].iter().any(|&b| b != 0);
    }
    let size = size_at(data, o);
    size >= 16 && (o as u64).saturating_add(size).saturating_add(9) > end as u64 && size < (1u64 << 40)
}

pub fn walk(data: &[u8], extents: Option<&[(usize, usize)]>, referenced: &Referenced) -> Walk {
    walk_map(data, extents, referenced, false)
}

/// `walk`; `mapped`: `data` is a read-only file map whose passed pages may be dropped (`pager`).
pub fn walk_map(data: &[u8], extents: Option<&[(usize, usize)]>, referenced: &Referenced, mapped: bool) -> Walk {
    if mapped {
        pager::start(data);
    }
    let w = walk_pages(data, extents, referenced);
    pager::stop();
    w
}

/// The walk is a chain of dependent reads (a header gives the next header's place), each a
/// cache miss: the places of the next entries are guessed from this one's size (a store's
/// messages are often of similar sizes) and asked for ahead. A wrong guess costs nothing.
#[inline]
fn ahead_hint(data: &[u8], next: usize, step: usize) {
    #[cfg(target_arch = "x86_64")]
    for k in 1..=2 {
        let at = next + k * step;
        if at + HEADER <= data.len() {
            // SAFETY: SSE is part of x86-64; a prefetch of an address inside the slice reads nothing
            unsafe { std::arch::x86_64::_mm_prefetch(data.as_ptr().add(at).cast(), std::arch::x86_64::_MM_HINT_T0) };
        }
    }
}

fn walk_pages(data: &[u8], extents: Option<&[(usize, usize)]>, referenced: &Referenced) -> Walk {
    let end = data.len();
    let mut w = Walk::default();
    let mut ahead = TrustedAhead { frontier: 0, found: None };
    let mut hole: Option<usize> = None;
    let mut o = 0usize;
    while o < end {
        pager::passed(hole.unwrap_or(o)); // a hole's bytes are read again to tell its kind
        if o + HEADER <= end {
            let size = size_at(data, o);
            let fits = size >= 16 && size <= (end - o - 9) as u64;
            if fits && data[o + size as usize + 8] == MARK {
                let nxt = o + size as usize + 9;
                ahead_hint(data, nxt, nxt - o);
                let id = &data[o + 8..o + 24];
                let mut reason = None;
                let mut hidden = -1i64;
                if !referenced.contains(id) {
                    if !plausible_term(data, o + HEADER, size as usize - 16) {
                        reason = Some(NOT_A_MESSAGE_TERM);
                    } else if let Some(h) = ahead.first(data, extents, referenced, o + 1, nxt) {
                        reason = Some(HIDES_REFERENCED);
                        hidden = h as i64;
                    }
                }
                match reason {
                    None => {
                        if let Some(h) = hole.take() {
                            w.holes.push((h as u64, (o - h) as u64, hole_kind(data, h, o - h, extents)));
                        }
                        w.offsets.push(o as i64);
                        w.totals.push(size as i64 + 9);
                        w.ids.extend_from_slice(id);
                        o = nxt;
                        continue;
                    }
                    Some(r) => w.rejected.push((o as u64, size + 9, id.try_into().unwrap(), r, hidden)),
                }
            } else if fits {
                w.torn.push((o as u64, size + 9, data[o + 8..o + 24].try_into().unwrap()));
            }
        }
        if hole.is_none() {
            hole = Some(o); // the chain breaks at o
        }
        o = next_candidate(data, o + 1, extents).unwrap_or(end);
    }
    if let Some(h) = hole {
        let kind =
            if is_truncated_tail(data, h) { HoleKind::TruncatedTail } else { hole_kind(data, h, end - h, extents) };
        w.holes.push((h as u64, (end - h) as u64, kind));
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Referenced<'static> = Referenced { ids: &[], dir: None };

    /// `contains` agrees with a plain scan on uniform ids and on skewed ones, for ids present,
    /// absent, below and above every id.
    #[test]
    fn referenced_contains_agrees_with_a_scan() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for skew in [false, true] {
            let mut ids: Vec<[u8; 16]> = (0..3000)
                .map(|k| {
                    let hi = if skew { (k as u64).pow(4) } else { next() };
                    let v = ((hi as u128) << 64) | next() as u128;
                    v.to_be_bytes()
                })
                .collect();
            ids.sort();
            ids.dedup();
            let flat: Vec<u8> = ids.iter().step_by(2).flatten().copied().collect();
            let dir = directory(&flat);
            for refs in [Referenced::sorted(&flat), Referenced::with_directory(&flat, Some(&dir))] {
                for (k, id) in ids.iter().enumerate() {
                    assert_eq!(refs.contains(id), k % 2 == 0, "skew {skew} id {k}");
                }
                assert!(!refs.contains(&[0u8; 16]) || ids[0] == [0u8; 16]);
                assert!(!refs.contains(&[0xFFu8; 16]));
            }
        }
        // a directory of the wrong length is not used; one out of range reads nothing past the ids
        let flat: Vec<u8> = [[1u8; 16], [2u8; 16]].concat();
        let junk: Vec<u8> = (0..DIRECTORY as u32).flat_map(|k| (u32::MAX - k).to_ne_bytes()).collect();
        for dir in [&junk[..], &junk[..40]] {
            let refs = Referenced::with_directory(&flat, Some(dir));
            let _ = (refs.contains(&[1u8; 16]), refs.contains(&[3u8; 16]));
        }
    }

    /// The directory `readers.rdq.Referenced.directory` makes.
    fn directory(flat: &[u8]) -> Vec<u8> {
        (0..DIRECTORY)
            .map(|b| flat.chunks(16).take_while(|id| ((id[0] as usize) << 8 | id[1] as usize) < b).count() as u32)
            .flat_map(|k| k.to_ne_bytes())
            .collect()
    }

    /// An entry whose term looks like a message record: {x, <<body>>}
    fn entry(id: u8, body: &[u8]) -> Vec<u8> {
        let mut term = vec![131, 104, 2, 119, 1, b'x', 109];
        term.extend_from_slice(&(body.len() as u32).to_be_bytes());
        term.extend_from_slice(body);
        raw_entry(&[id; 16], &term)
    }

    fn raw_entry(id: &[u8; 16], term: &[u8]) -> Vec<u8> {
        let mut v = ((16 + term.len()) as u64).to_be_bytes().to_vec();
        v.extend_from_slice(id);
        v.extend_from_slice(term);
        v.push(MARK);
        v
    }

    #[test]
    fn healthy_chain() {
        let mut d = entry(1, b"abc");
        let n1 = d.len() as i64;
        d.extend(entry(2, b"defg"));
        let w = walk(&d, None, &NONE);
        assert_eq!(w.offsets, vec![0, n1]);
        assert_eq!(w.totals, vec![n1, d.len() as i64 - n1]);
        assert!(w.holes.is_empty() && w.rejected.is_empty());
    }

    #[test]
    fn zeroed_gap_then_entry() {
        let mut d = entry(1, b"abc");
        let n1 = d.len();
        d.extend(vec![0u8; 100]);
        d.extend(entry(2, b"x"));
        let w = walk(&d, None, &NONE);
        assert_eq!(w.offsets, vec![0, n1 as i64 + 100]);
        assert_eq!(w.holes, vec![(n1 as u64, 100, HoleKind::Zeroed)]);
    }

    #[test]
    fn truncated_tail() {
        let mut d = entry(1, b"abc");
        let n1 = d.len() as u64;
        let e = entry(2, b"0123456789");
        d.extend_from_slice(&e[..20]);
        let w = walk(&d, None, &NONE);
        assert_eq!(w.holes, vec![(n1, 20, HoleKind::TruncatedTail)]);
    }

    #[test]
    fn plausible_terms() {
        let t = [131u8, 104, 6, 100, 0, 13];
        assert!(!plausible_term(&t, 0, t.len())); // atom runs past the term
        let t = [131u8, 104, 6, 100, 0, 1, b'a'];
        assert!(plausible_term(&t, 0, t.len()));
        assert!(!plausible_term(&[104u8, 6, 119, 1, b'a'], 0, 5));
        assert!(!plausible_term(&[131u8, 104, 1, 119, 1, b'a'], 0, 6)); // arity 1
        assert!(plausible_term(&[131u8, 80, 0, 0, 0, 9, 0x78], 0, 7));
    }

    #[test]
    fn untrusted_junk_candidate_is_rejected_and_the_walk_goes_on() {
        let mut d = entry(1, b"abc");
        let n1 = d.len();
        d.extend(raw_entry(&[9; 16], b"not a term"));
        let n2 = d.len();
        d.extend(entry(3, b"z"));
        let w = walk(&d, None, &NONE);
        assert_eq!(w.offsets, vec![0, n2 as i64]);
        assert_eq!(w.rejected.len(), 1);
        assert_eq!((w.rejected[0].0, w.rejected[0].3), (n1 as u64, NOT_A_MESSAGE_TERM));
        assert_eq!(w.holes, vec![(n1 as u64, (n2 - n1) as u64, HoleKind::Garbage)]);
        // trusted: taken whatever its term
        let ids = [9u8; 16];
        let w = walk(&d, None, &Referenced::sorted(&ids));
        assert_eq!(w.offsets, vec![0, n1 as i64, n2 as i64]);
        assert!(w.rejected.is_empty());
    }

    #[test]
    fn an_unreferenced_candidate_never_hides_a_referenced_one() {
        // crafted: an orphan-looking entry whose size swallows a referenced entry inside it
        let inner = entry(7, b"real");
        let mut term = vec![131u8, 104, 2, 119, 1, b'x', 106, 0, 0, 0, 0, 0];
        term.extend(&inner);
        term.extend([0u8; 8]);
        let d = raw_entry(&[5; 16], &term);
        let big = (16 + term.len()) as u64;
        let inner_at = HEADER + 12;
        let w0 = walk(&d, None, &NONE);
        assert_eq!(w0.offsets, vec![0]); // nothing referenced: the plausible outer one is taken
        let ids = [7u8; 16];
        let w = walk(&d, None, &Referenced::sorted(&ids));
        assert_eq!(w.offsets, vec![inner_at as i64]);
        assert_eq!(w.rejected, vec![(0, big + 9, [5; 16], HIDES_REFERENCED, inner_at as i64)]);
    }

    #[test]
    fn garbage_never_panics() {
        let mut x: u64 = 0x9E3779B97F4A7C15;
        let ids: Vec<u8> = (0..64u8).flat_map(|i| [i % 7; 16]).collect();
        for n in 0..2000usize {
            let d: Vec<u8> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if x.is_multiple_of(5) {
                        255
                    } else if x.is_multiple_of(11) {
                        131
                    } else {
                        (x % 7) as u8
                    }
                })
                .collect();
            for refs in [Referenced::sorted(&[]), Referenced::sorted(&ids[..16 * 7])] {
                let w = walk(&d, None, &refs);
                let covered: u64 =
                    w.totals.iter().map(|&t| t as u64).sum::<u64>() + w.holes.iter().map(|h| h.1).sum::<u64>();
                assert_eq!(covered, n as u64);
            }
        }
    }

    #[test]
    fn the_candidate_search_finds_what_a_byte_by_byte_search_finds() {
        // crafted: bytes rich in zero runs and 255 markers, sizes small enough to fit, so that
        // candidates are dense; the fast search (zero runs skipped, size-field prefixes) must
        // stop exactly where testing every offset does
        let mut x: u64 = 0x2545F4914F6CDD1D;
        for n in [0usize, 30, 200, 1000, 5000, 70000, 300000] {
            let d: Vec<u8> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    match x % 13 {
                        0..=6 => 0,
                        7 => 255,
                        8 => 16 + (x >> 8) as u8 % 40,
                        _ => (x >> 16) as u8,
                    }
                })
                .collect();
            let mut from = 0;
            while from < n {
                let naive = (from..n).find(|&p| is_candidate(&d, p));
                assert_eq!(next_candidate(&d, from, None), naive, "n {n} from {from}");
                from = naive.map_or(n, |p| p + 1);
            }
        }
    }
}
