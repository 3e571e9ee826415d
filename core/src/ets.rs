//! The items of an OTP disk_log in its internal format, as `ets:tab2file/2` writes a table
//! (`msg_store_index.ets`, `file_summary.ets`), found as the Python reference finds them
//! (`readers.terms.disk_log_walk`, `read_disk_log`): strictly, item after item from the header
//! on, stopping at the first one that is not whole (`Stop`). What `ets:file2tab/1` loads of a
//! damaged dump is not decided here: `readers.terms.file2tab_load` models it (chunks, skipped
//! bytes, md5s); an undamaged dump, which it loads whole, is this walk's items
//! (`readers.terms.loads_whole`).
//!
//! Framing: `<<1,2,3,4, Status:4/binary>>`, then items `<<Len:32, "bWLA", [md5(<<Len:32>>)],
//! Term:Len/binary>>` (OTP lib/kernel/src/disk_log_1.erl, disk_log.hrl).
//!
//! An item holding the one record a store's message index is made of,
//! `{msg_location, <<MsgId:16/binary>>, RefCount, File, Offset, TotalSize}` with integers of
//! 64 bits (rabbit_msg_store.hrl), is decoded here into columns; any other item (the table
//! info, the end marker, another shape or encoding, damage) is left to the reference's term
//! decoder, which decides what it is.

/// ?LOGMAGIC, ?BIGMAGICHEAD, ?MIN_MD5_TERM (disk_log.hrl)
const FILE_MAGIC: &[u8; 4] = b"\x01\x02\x03\x04";
const ITEM_MAGIC: &[u8; 4] = b"bWLA";
const MIN_MD5_TERM: u32 = 65528;
pub const HEADER_SIZE: usize = 8;

/// Why a strict walk stopped (the reference's `FormatError`s, by offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// fewer than 8 bytes left after the last item (at its offset)
    InsideHeader = 1,
    /// the item header at this offset has no `bWLA` magic
    BadMagic = 2,
    /// the item at this offset runs past the end of the file
    PastEnd = 3,
}

/// One `#msg_location{}` record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Location {
    pub id: [u8; 16],
    pub ref_count: i64,
    pub file: i64,
    pub offset: i64,
    pub total: i64,
}

/// The items the walk found, in file order.
#[derive(Default, Debug)]
pub struct Items {
    /// where each item's header starts
    pub offsets: Vec<i64>,
    /// where its term starts (after the md5, when it has one), and the term's length
    pub starts: Vec<i64>,
    pub lengths: Vec<i64>,
    /// the item's record when it is a `#msg_location{}` decoded here (else the reference's)
    pub records: Vec<Option<Location>>,
    /// where and why it stopped (None: it reached the end)
    pub stop: Option<(Stop, i64)>,
    /// an item of `MIN_MD5_TERM` bytes or more was met (its md5 is checked by file2tab only)
    pub md5_items: bool,
    /// where to walk on from, when it stopped at `max_items` (None: it is done)
    pub next: Option<usize>,
}

/// The items of `data` (a whole file, its header included), from offset `from`
/// (`HEADER_SIZE`: the first item; else where an earlier call said to go on), at most
/// `max_items` of them. A file without the disk_log magic has none.
pub fn walk(data: &[u8], from: usize, max_items: usize) -> Items {
    let mut out = Items::default();
    if data.len() < 4 || &data[..4] != FILE_MAGIC {
        return out;
    }
    let end = data.len();
    let mut o = from.max(HEADER_SIZE);
    while o < end {
        if out.offsets.len() >= max_items {
            out.next = Some(o);
            break;
        }
        if o + 8 > end {
            out.stop = Some((Stop::InsideHeader, o as i64));
            break;
        }
        let size = u32::from_be_bytes(data[o..o + 4].try_into().unwrap());
        if &data[o + 4..o + 8] != ITEM_MAGIC {
            out.stop = Some((Stop::BadMagic, o as i64 + 4));
            break;
        }
        let mut start = o + 8;
        if size >= MIN_MD5_TERM {
            out.md5_items = true; // its md5 is file2tab's to check (`readers.terms.file2tab_load`)
            start += 16;
        }
        let size = size as usize;
        if start + size > end {
            out.stop = Some((Stop::PastEnd, o as i64));
            break;
        }
        out.offsets.push(o as i64);
        out.starts.push(start as i64);
        out.lengths.push(size as i64);
        // the term must fill its item
        out.records.push(location(&data[start..start + size], true));
        o = start + size;
    }
    out
}

const VERSION: u8 = 131;
const SMALL_INTEGER: u8 = 97;
const INTEGER: u8 = 98;
const ATOM: u8 = 100;
const SMALL_TUPLE: u8 = 104;
const BINARY: u8 = 109;
const SMALL_BIG: u8 = 110;
const SMALL_ATOM: u8 = 115;
const ATOM_UTF8: u8 = 118;
const SMALL_ATOM_UTF8: u8 = 119;
const TAG: &[u8] = b"msg_location";

/// `term` as a `#msg_location{}` record, when it is one in the encodings handled here (an atom
/// in any of its four encodings, integers small, 32-bit or small big of up to 8 bytes that fit
/// 64 bits); `exact`: the term must end where `term` does.
pub fn location(term: &[u8], exact: bool) -> Option<Location> {
    if term.len() < 3 || term[0] != VERSION || term[1] != SMALL_TUPLE || term[2] != 6 {
        return None;
    }
    let mut p = atom(term, 3)?;
    if term.get(p) != Some(&BINARY) || term.get(p + 1..p + 5)? != [0, 0, 0, 16] {
        return None;
    }
    let id: [u8; 16] = term.get(p + 5..p + 21)?.try_into().ok()?;
    p += 21;
    let mut ints = [0i64; 4];
    for v in ints.iter_mut() {
        (*v, p) = integer(term, p)?;
    }
    if exact && p != term.len() {
        return None;
    }
    let [ref_count, file, offset, total] = ints;
    Some(Location { id, ref_count, file, offset, total })
}

/// The offset after the atom `msg_location` at `p`.
fn atom(t: &[u8], p: usize) -> Option<usize> {
    let (len, at) = match *t.get(p)? {
        SMALL_ATOM | SMALL_ATOM_UTF8 => (*t.get(p + 1)? as usize, p + 2),
        ATOM | ATOM_UTF8 => (u16::from_be_bytes(t.get(p + 1..p + 3)?.try_into().ok()?) as usize, p + 3),
        _ => return None,
    };
    (t.get(at..at + len)? == TAG).then_some(at + len)
}

/// The integer at `p` and the offset after it.
fn integer(t: &[u8], p: usize) -> Option<(i64, usize)> {
    match *t.get(p)? {
        SMALL_INTEGER => Some((*t.get(p + 1)? as i64, p + 2)),
        INTEGER => Some((i32::from_be_bytes(t.get(p + 1..p + 5)?.try_into().ok()?) as i64, p + 5)),
        SMALL_BIG => {
            let n = *t.get(p + 1)? as usize;
            let sign = *t.get(p + 2)?;
            let digits = t.get(p + 3..p + 3 + n)?;
            if n > 8 {
                return None;
            }
            let mut mag: u64 = 0;
            for &b in digits.iter().rev() {
                mag = mag << 8 | b as u64;
            }
            let v = if sign == 0 {
                i64::try_from(mag).ok()?
            } else if mag <= 1 << 63 {
                (mag as i64).wrapping_neg()
            } else {
                return None;
            };
            Some((v, p + 3 + n))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(term: &[u8]) -> Vec<u8> {
        let mut v = (term.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(ITEM_MAGIC);
        v.extend_from_slice(term);
        v
    }

    fn record(id: u8, ints: &[u8]) -> Vec<u8> {
        let mut t = vec![VERSION, SMALL_TUPLE, 6, SMALL_ATOM_UTF8, 12];
        t.extend_from_slice(TAG);
        t.extend_from_slice(&[BINARY, 0, 0, 0, 16]);
        t.extend_from_slice(&[id; 16]);
        t.extend_from_slice(ints);
        t
    }

    #[test]
    fn records_in_every_integer_encoding() {
        let ints = [SMALL_INTEGER, 1, INTEGER, 0xff, 0xff, 0xff, 0xfe, SMALL_BIG, 2, 1, 1, 1, SMALL_BIG, 0, 0];
        let r = location(&record(7, &ints), true).unwrap();
        assert_eq!((r.ref_count, r.file, r.offset, r.total), (1, -2, -257, 0));
        assert_eq!(r.id, [7; 16]);
        // a small big beyond 64 bits, a trailing byte (strict), a truncated term: the reference's
        let big = [SMALL_INTEGER, 1, SMALL_INTEGER, 1, SMALL_INTEGER, 1, SMALL_BIG, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0x80];
        assert!(location(&record(7, &big), true).is_none());
        let mut long = record(7, &[SMALL_INTEGER, 1, SMALL_INTEGER, 1, SMALL_INTEGER, 1, SMALL_INTEGER, 1]);
        long.push(0);
        assert!(location(&long, true).is_none());
        assert!(location(&long, false).is_some());
        assert!(location(&long[..long.len() - 3], false).is_none());
    }

    #[test]
    fn strict_walks() {
        let ok = record(1, &[SMALL_INTEGER, 1, SMALL_INTEGER, 2, SMALL_INTEGER, 3, SMALL_INTEGER, 4]);
        let mut data = FILE_MAGIC.to_vec();
        data.extend_from_slice(b"\x63\x58\x4d\x0b");
        data.extend_from_slice(&item(&ok));
        data.extend_from_slice(b"junk");
        data.extend_from_slice(&item(&ok));
        let strict = walk(&data, HEADER_SIZE, usize::MAX);
        assert_eq!(strict.offsets, vec![8]);
        assert_eq!(strict.stop, Some((Stop::BadMagic, 8 + 8 + ok.len() as i64 + 4)));
        assert_eq!(walk(&data, HEADER_SIZE, 1).next, Some(8 + 8 + ok.len()));
        assert!(strict.records.iter().all(|r| r.is_some()));
    }
}
