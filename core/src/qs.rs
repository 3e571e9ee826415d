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
    let end = offset + ENTRY_HEADER_SIZE + size;
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
