//! Arrow-layout column builders (validity bitmap, int32 offsets, values): the buffers go to
//! Python as bytes and become Arrow arrays with `pa.Array.from_buffers`, without a Python
//! object per value. `decode_batch` builds the `messages` columns of a batch of stored terms.

use crate::io::{Spans, WINDOW_GAP};
use crate::message;

#[derive(Default)]
pub struct Validity {
    pub bits: Vec<u8>,
    pub len: usize,
    pub nulls: usize,
}

impl Validity {
    pub fn clear(&mut self) {
        self.bits.clear();
        self.len = 0;
        self.nulls = 0;
    }

    #[inline]
    pub fn push(&mut self, valid: bool) {
        if self.len.is_multiple_of(8) {
            self.bits.push(0);
        }
        if valid {
            *self.bits.last_mut().unwrap() |= 1 << (self.len % 8);
        } else {
            self.nulls += 1;
        }
        self.len += 1;
    }
}

/// string / binary with int32 offsets.
pub struct VarCol {
    pub valid: Validity,
    pub offsets: Vec<i32>,
    pub data: Vec<u8>,
}

impl Default for VarCol {
    fn default() -> Self {
        VarCol { valid: Validity::default(), offsets: vec![0], data: Vec::new() }
    }
}

impl VarCol {
    /// Empty again, keeping the buffers' capacity (columns are reused from batch to batch).
    pub fn clear(&mut self) {
        self.valid.clear();
        self.offsets.clear();
        self.offsets.push(0);
        self.data.clear();
    }

    /// Appends a value; false when the column would pass the int32 offset range.
    #[inline]
    pub fn push(&mut self, v: Option<&[u8]>) -> bool {
        if let Some(b) = v {
            if self.data.len() + b.len() > i32::MAX as usize {
                return false;
            }
            self.data.extend_from_slice(b);
        }
        self.valid.push(v.is_some());
        self.offsets.push(self.data.len() as i32);
        true
    }
}

#[derive(Default)]
pub struct NumCol<T> {
    pub valid: Validity,
    pub values: Vec<T>,
}

impl<T: Default + Copy> NumCol<T> {
    pub fn clear(&mut self) {
        self.valid.clear();
        self.values.clear();
    }

    #[inline]
    pub fn push(&mut self, v: Option<T>) {
        self.valid.push(v.is_some());
        self.values.push(v.unwrap_or_default());
    }
}

/// list<string>
pub struct ListCol {
    pub valid: Validity,
    pub offsets: Vec<i32>,
    pub items: VarCol,
}

impl Default for ListCol {
    fn default() -> Self {
        ListCol { valid: Validity::default(), offsets: vec![0], items: VarCol::default() }
    }
}

impl ListCol {
    pub fn clear(&mut self) {
        self.valid.clear();
        self.offsets.clear();
        self.offsets.push(0);
        self.items.clear();
    }

    /// Appends a list of these items (bytes of UTF-8 text); false when they would pass the
    /// int32 offset range.
    pub fn push_items<'b>(&mut self, items: impl Iterator<Item = &'b [u8]>) -> bool {
        for b in items {
            if !self.items.push(Some(b)) {
                return false;
            }
        }
        self.valid.push(true);
        self.offsets.push(self.items.valid.len as i32);
        true
    }

    /// Appends a null list.
    pub fn push_null(&mut self) {
        self.valid.push(false);
        self.offsets.push(self.items.valid.len as i32);
    }
}

/// Plain integers: no padding, every byte initialised, any bytes a valid value.
pub trait Plain: Copy {}
impl Plain for u8 {}
impl Plain for i32 {}
impl Plain for i64 {}
impl Plain for i8 {}
impl Plain for u32 {}
impl Plain for u64 {}

/// Numbers as their native-endian bytes (Arrow's layout).
pub fn as_bytes<T: Plain>(v: &[T]) -> &[u8] {
    // SAFETY: `Plain` values have no padding and every byte initialised; u8's alignment is 1
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// Row status of a decoded batch (`decode_batch`).
pub const DECODED: u8 = 0;
pub const FALLBACK: u8 = 1; // the reference decodes this row
pub const NO_TERM: u8 = 2;
/// `expiration`'s place in amqp091::STRING_PROPS
const EXPIRATION: usize = 4;

/// The `messages` columns of a batch (but the body's: `Batch`), Arrow-layout.
#[derive(Default)]
pub struct Columns {
    pub msg_id: VarCol,
    pub exchange: VarCol,
    pub routing_keys: ListCol,
    pub strings: [VarCol; 10],
    pub delivery_mode: NumCol<i32>,
    pub priority: NumCol<i32>,
    pub timestamp: NumCol<i64>,
    pub props_valid: Validity,
    pub headers: VarCol,
    pub annotations: VarCol,
    pub body_size: NumCol<i64>,
    pub term_format: VarCol,
    pub decode_error: VarCol,
}

thread_local! {
    /// The decode's output columns, kept between calls so their buffers keep their capacity
    /// (no regrowing and no fresh pages batch after batch).
    static COLUMNS: std::cell::RefCell<Columns> = std::cell::RefCell::new(Columns::default());
}

impl Columns {
    /// This thread's columns, empty, with the capacity they had (give them back with `reuse`).
    pub fn take() -> Columns {
        let mut c = COLUMNS.with(|cell| cell.take());
        c.clear();
        c
    }

    /// Keeps the columns' buffers for the thread's next batch.
    pub fn reuse(self) {
        COLUMNS.with(|cell| cell.replace(self));
    }

    fn clear(&mut self) {
        for c in [
            &mut self.msg_id,
            &mut self.exchange,
            &mut self.headers,
            &mut self.annotations,
            &mut self.term_format,
            &mut self.decode_error,
        ] {
            c.clear();
        }
        for c in self.strings.iter_mut() {
            c.clear();
        }
        self.routing_keys.clear();
        self.delivery_mode.clear();
        self.priority.clear();
        self.timestamp.clear();
        self.props_valid.clear();
        self.body_size.clear();
    }

    /// A row with only a message id (no term, or one the reference decodes).
    fn push_empty(&mut self, msg_id: Option<&[u8]>) {
        self.msg_id.push(msg_id);
        self.exchange.push(None);
        self.routing_keys.push_null();
        for s in self.strings.iter_mut() {
            s.push(None);
        }
        self.delivery_mode.push(None);
        self.priority.push(None);
        self.timestamp.push(None);
        self.props_valid.push(false);
        self.headers.push(None);
        self.annotations.push(None);
        self.body_size.push(None);
        self.term_format.push(None);
        self.decode_error.push(None);
    }

    /// A row decoded here; the message id is the index's when it holds one.
    fn push_decoded(&mut self, m: &message::Msg, texts: &message::Scratch, index_id: Option<&[u8]>) {
        let (msg_id, error) = match (index_id, m.msg_id) {
            (Some(i), Some(t)) if i != t => (Some(i), Some("the stored term's message id differs from the index's")),
            (Some(i), _) => (Some(i), None),
            (None, t) => (t, None),
        };
        self.msg_id.push(msg_id);
        self.exchange.push(m.exchange.map(str::as_bytes));
        self.routing_keys.push_items(m.routing_keys.iter());
        for (k, (col, v)) in self.strings.iter_mut().zip(m.props.strings.iter()).enumerate() {
            match (k, m.expiration) {
                (EXPIRATION, message::Expiration::Removed) => col.push(None),
                (EXPIRATION, message::Expiration::Replaced) => col.push(Some(texts.expiration.as_bytes())),
                _ => col.push(v.map(str::as_bytes)),
            };
        }
        self.delivery_mode.push(m.props.delivery_mode);
        self.priority.push(m.props.priority);
        self.timestamp.push(m.timestamp_us);
        self.props_valid.push(true);
        self.headers.push(m.headers.then_some(texts.headers.as_bytes()));
        self.annotations.push(m.annotations.then_some(texts.annotations.as_bytes()));
        self.body_size.push(Some(m.body.len() as i64));
        self.term_format.push(Some(match m.format {
            message::Format::McAmqpl => b"mc_amqpl".as_slice(),
            message::Format::BasicMessage => b"basic_message".as_slice(),
        }));
        self.decode_error.push(error.map(str::as_bytes));
    }
}

/// A decoded batch: each row's status (`DECODED`, `FALLBACK`, `NO_TERM`), its columns, and the
/// body column's validity and offsets (its bytes are in the buffer given to `decode_batch`).
pub struct Batch {
    pub status: Vec<u8>,
    pub columns: Columns,
    pub body_valid: Validity,
    pub body_offsets: Vec<i32>,
}

/// One batch of stored terms decoded into columns (`bindings::decode_messages` says how).
/// `index_ids`: 16 bytes per row, `has_id`: one byte per row (the index holds the id); `out`:
/// the body column's bytes, room for every term when bodies are wanted (a body is never
/// longer than its term).
pub fn decode_batch(spans: &mut Spans, index_ids: &[u8], has_id: &[u8], want_body: bool, out: &mut [u8]) -> Batch {
    let n = spans.len();
    let dec = message::Decoder::default();
    let mut texts = message::Scratch::default();
    let mut c = Columns::take();
    let mut status = Vec::with_capacity(n);
    let mut body_offsets: Vec<i32> = Vec::with_capacity(n + 1);
    body_offsets.push(0);
    let mut body_valid = Validity::default();
    let mut body_total = 0usize;
    let id_of = |k: usize| if has_id[k] != 0 { Some(&index_ids[16 * k..16 * k + 16]) } else { None };
    let mut gap = vec![0u8; WINDOW_GAP as usize];
    let mut k = 0;
    while k < n {
        // unmapped, a run of nearby terms is read by one preadv straight into the body column,
        // where each body is then moved down to its place: one copy from the page cache, and
        // no page faults (the run's other bytes are overwritten by the bodies after them)
        if want_body && !spans.map_files {
            if let Some(j) = spans.read_run(k, &mut out[body_total..], &mut gap) {
                let mut at = body_total;
                for r in k..j {
                    let len = spans.cut_len(r);
                    let free = out.len() - body_total;
                    let kept =
                        record(&mut c, &mut status, &dec, &mut texts, Some(&out[at..at + len]), id_of(r), true, free);
                    if let Some((off, n)) = kept {
                        out.copy_within(at + off..at + off + n, body_total); // never past the terms after it
                    }
                    body_valid.push(kept.is_some());
                    body_total += kept.map_or(0, |(_, n)| n);
                    body_offsets.push(body_total as i32);
                    at += len;
                }
                k = j;
                continue;
            }
        }
        let free = out.len() - body_total;
        let term = spans.span(k);
        // where the term's body is to be copied from: (offset in the term, length)
        let kept = record(&mut c, &mut status, &dec, &mut texts, term, id_of(k), want_body, free);
        if let (Some((off, len)), Some(term)) = (kept, term) {
            out[body_total..body_total + len].copy_from_slice(&term[off..off + len]);
        }
        body_valid.push(kept.is_some());
        body_total += kept.map_or(0, |(_, len)| len);
        body_offsets.push(body_total as i32);
        k += 1;
    }
    Batch { status, columns: c, body_valid, body_offsets }
}

/// Decodes one row's term (None: no term) and records it: its status and its columns. Returns
/// the body's place in the term, `(offset, length)`, when the body is kept (bodies wanted, and
/// it fits in the `free` bytes left of the body buffer; else the reference decodes the row).
#[allow(clippy::too_many_arguments)] // the decode's state, passed apart so the term may borrow the body buffer
fn record(
    c: &mut Columns,
    status: &mut Vec<u8>,
    dec: &message::Decoder,
    texts: &mut message::Scratch,
    term: Option<&[u8]>,
    index_id: Option<&[u8]>,
    want_body: bool,
    free: usize,
) -> Option<(usize, usize)> {
    let Some(raw) = term else {
        status.push(NO_TERM);
        c.push_empty(index_id);
        return None;
    };
    // the body is a slice of the term: its offset there
    let place = |body: &[u8]| {
        let off = (body.as_ptr() as usize).wrapping_sub(raw.as_ptr() as usize);
        (off.checked_add(body.len())? <= raw.len()).then_some((off, body.len()))
    };
    match dec.decode(raw, texts) {
        Ok(m) if !want_body || (m.body.len() <= free && place(m.body).is_some()) => {
            status.push(DECODED);
            c.push_decoded(&m, texts, index_id);
            if want_body {
                place(m.body)
            } else {
                None
            }
        }
        _ => {
            status.push(FALLBACK);
            c.push_empty(index_id);
            None
        }
    }
}
