//! The shared-store `.rdq` walk: entries `<<Size:64, MsgId:16, Body, 255>>` and the holes
//! between them. Same rules as the Python reference (`cqforensics.readers.rdq.walk`): follow
//! sizes from offset 0; where the chain breaks, remember a torn entry (size fits, marker
//! missing) and slide to the next offset holding a complete entry with its 255 marker.

pub const MARK: u8 = 255;
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
    let end = data.len();
    let mut p = from;
    let mut ext_i = 0usize;
    while p < end {
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
            while p < stop {
                if is_candidate(data, p) {
                    return Some(p);
                }
                p += 1;
            }
            continue;
        }
        // dense: skip 8 zero bytes at a time (a zero size field is never an entry)
        if p + 16 <= end && data[p..p + 16].iter().all(|&b| b == 0) {
            p += 8;
            continue;
        }
        if is_candidate(data, p) {
            return Some(p);
        }
        p += 1;
    }
    None
}

fn hole_kind(data: &[u8], o: usize, n: usize, extents: Option<&[(usize, usize)]>) -> HoleKind {
    let garbage = match extents {
        None => data[o..o + n].iter().any(|&b| b != 0),
        Some(ext) => ext.iter().any(|&(a, b)| {
            let (a, b) = (a.max(o), b.min(o + n));
            a < b && data[a..b].iter().any(|&x| x != 0)
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

pub fn walk(data: &[u8], extents: Option<&[(usize, usize)]>) -> Walk {
    let end = data.len();
    let mut w = Walk::default();
    let mut o = 0usize;
    while o < end {
        if o + HEADER <= end {
            let size = size_at(data, o);
            if size >= 16 && size <= (end - o - 9) as u64 && data[o + size as usize + 8] == MARK {
                w.offsets.push(o as i64);
                w.totals.push(size as i64 + 9);
                w.ids.extend_from_slice(&data[o + 8..o + 24]);
                o += size as usize + 9;
                continue;
            }
            if size >= 16 && size <= (end - o - 9) as u64 {
                w.torn.push((o as u64, size + 9, data[o + 8..o + 24].try_into().unwrap()));
            }
        }
        let stop = next_candidate(data, o + 1, extents).unwrap_or(end);
        if stop == end && is_truncated_tail(data, o) {
            w.holes.push((o as u64, (end - o) as u64, HoleKind::TruncatedTail));
        } else {
            w.holes.push((o as u64, (stop - o) as u64, hole_kind(data, o, stop - o, extents)));
        }
        o = stop;
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u8, body: &[u8]) -> Vec<u8> {
        let mut v = ((16 + body.len()) as u64).to_be_bytes().to_vec();
        v.extend_from_slice(&[id; 16]);
        v.extend_from_slice(body);
        v.push(MARK);
        v
    }

    #[test]
    fn healthy_chain() {
        let mut d = entry(1, b"abc");
        d.extend(entry(2, b"defg"));
        let w = walk(&d, None);
        assert_eq!(w.offsets, vec![0, 28]);
        assert_eq!(w.totals, vec![28, 29]);
        assert!(w.holes.is_empty());
    }

    #[test]
    fn zeroed_gap_then_entry() {
        let mut d = entry(1, b"abc");
        d.extend(vec![0u8; 100]);
        d.extend(entry(2, b"x"));
        let w = walk(&d, None);
        assert_eq!(w.offsets, vec![0, 128]);
        assert_eq!(w.holes, vec![(28, 100, HoleKind::Zeroed)]);
    }

    #[test]
    fn truncated_tail() {
        let mut d = entry(1, b"abc");
        let e = entry(2, b"0123456789");
        d.extend_from_slice(&e[..20]);
        let w = walk(&d, None);
        assert_eq!(w.holes, vec![(28, 20, HoleKind::TruncatedTail)]);
    }

    #[test]
    fn garbage_never_panics() {
        let mut x: u64 = 0x9E3779B97F4A7C15;
        for n in 0..2000usize {
            let d: Vec<u8> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if x % 5 == 0 { 255 } else { (x % 7) as u8 }
                })
                .collect();
            let w = walk(&d, None);
            let covered: u64 = w.totals.iter().map(|&t| t as u64).sum::<u64>()
                + w.holes.iter().map(|h| h.1).sum::<u64>();
            assert_eq!(covered, n as u64);
        }
    }
}
