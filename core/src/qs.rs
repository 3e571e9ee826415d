//! Checks of `.qs` entries the index points at (readers.qs.check_entry): the entry header's
//! size must be the index's and, when flagged, the low 16 bits of the term's CRC-32 must match.

const HEADER_SIZE: i64 = 64; // QS2 ?HEADER_SIZE
const ENTRY_HEADER_SIZE: i64 = 8; // <<Size:32, Flags:8, Crc:16, Reserved:8>>

// codes.QsStatus
pub const OK: u8 = 1;
pub const OUT_OF_RANGE: u8 = 4;
pub const BAD_SIZE: u8 = 5;
pub const BAD_CRC: u8 = 6;

pub fn check(data: &[u8], offset: i64, size: i64) -> u8 {
    // any offset and size a caller passes (the index's, damaged or not): no overflow, no panic
    let end = match offset.checked_add(ENTRY_HEADER_SIZE).and_then(|e| e.checked_add(size)) {
        Some(end) => end,
        None => return OUT_OF_RANGE,
    };
    if offset < HEADER_SIZE || size < 0 || end > data.len() as i64 {
        return OUT_OF_RANGE;
    }
    let o = offset as usize;
    let h_size = u32::from_be_bytes(data[o..o + 4].try_into().unwrap()) as i64;
    let flags = data[o + 4];
    let crc = u16::from_be_bytes(data[o + 5..o + 7].try_into().unwrap());
    if h_size != size {
        return BAD_SIZE;
    }
    if flags & 1 != 0 && (crc32fast::hash(&data[o + 8..end as usize]) & 0xFFFF) as u16 != crc {
        return BAD_CRC;
    }
    OK
}

const TERM_TAG: u8 = 131; // every entry's term starts with the external-term-format version byte

/// An entry of the scan's own finding (readers.qs.scan_entries): a header whose term starts
/// with 131 and whose CRC, when flagged, checks. `end`: where the file's bytes end.
fn entry_at(data: &[u8], o: usize) -> Option<usize> {
    let end = data.len();
    if o + ENTRY_HEADER_SIZE as usize + 1 > end {
        return None;
    }
    let size = u32::from_be_bytes(data[o..o + 4].try_into().unwrap()) as usize;
    let (flags, crc, reserved) = (data[o + 4], u16::from_be_bytes([data[o + 5], data[o + 6]]), data[o + 7]);
    let t_start = o + ENTRY_HEADER_SIZE as usize;
    let ok = size > 0
        && size <= end - t_start
        && flags <= 1
        && reserved == 0
        && data[t_start] == TERM_TAG
        && (flags == 0 || (crc32fast::hash(&data[t_start..t_start + size]) & 0xFFFF) as u16 == crc);
    ok.then_some(size)
}

/// The first nonzero byte of `data[from..until]` (`until` when none), 64 bytes at a time.
fn first_nonzero_before(data: &[u8], from: usize, until: usize) -> usize {
    let mut i = from;
    while i + 64 <= until && data[i..i + 64].iter().fold(0u8, |a, &b| a | b) == 0 {
        i += 64;
        crate::rdq::pager::passed(i);
    }
    while i < until && data[i] == 0 {
        i += 1;
    }
    i
}

/// Garbage runs of a `.qs` segment from `start` (readers.qs.garbage_runs: the gaps of
/// `scan_entries` that are not all zeros), in file order, `(offset, length)`; at most `limit`
/// of them, and then the offset to resume from (the entry that ended the last run: the scan's
/// state there is the same as at a fresh start), else None. `holes`: a sparse file's
/// `[start, end)` holes, sorted (they read as zeros and are skipped unread).
pub fn garbage_runs(
    data: &[u8],
    start: usize,
    holes: &[(usize, usize)],
    limit: usize,
) -> (Vec<(usize, usize)>, Option<usize>) {
    let end = data.len();
    let hdr = ENTRY_HEADER_SIZE as usize;
    let mut out = Vec::new();
    let (mut o, mut gap, mut gap_zero) = (start, None::<usize>, true);
    while o < end {
        crate::rdq::pager::passed(o);
        if let Ok(h) = holes.binary_search_by_key(&o, |h| h.0) {
            gap.get_or_insert(o);
            o = holes[h].1;
            continue;
        }
        if let Some(size) = entry_at(data, o) {
            if let Some(g) = gap.take() {
                if !gap_zero {
                    out.push((g, o - g));
                    if out.len() >= limit {
                        return (out, Some(o));
                    }
                }
                gap_zero = true;
            }
            o += hdr + size;
            continue;
        }
        gap.get_or_insert(o);
        let later = holes.partition_point(|h| h.0 <= o);
        let next_hole = holes.get(later).map_or(end, |h| h.0).min(end);
        if data[o] == 0 {
            // an entry's header starts with zeros: resume up to a header before the run's end
            o = (o + 1).max(first_nonzero_before(data, o, next_hole).saturating_sub(hdr));
        } else {
            // no entry can start before the next byte 131 (its term's first byte)
            gap_zero = false;
            let (a, b) = (o + 1 + hdr, (next_hole + hdr).min(end));
            let tag = if a < b { data[a..b].iter().position(|&x| x == TERM_TAG).map(|p| a + p) } else { None };
            o = match tag {
                None => next_hole,
                Some(t) => (t - hdr).min(next_hole),
            };
        }
    }
    if let Some(g) = gap {
        if !gap_zero {
            out.push((g, end - g));
        }
    }
    (out, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_offset_and_size_is_judged_without_a_panic() {
        let data = vec![0u8; 200];
        for (o, s) in [(i64::MAX, 1), (i64::MAX - 4, 8), (64, i64::MAX), (i64::MIN, 0), (64, -1), (190, 8)] {
            assert_eq!(check(&data, o, s), OUT_OF_RANGE);
        }
        assert_eq!(check(&data, 64, 0), OK); // a zero header's size 0 matches
    }
}
