//! cqforensics' compiled core (PyO3): the hot paths of the readers, each tested equal to the
//! Python reference it mirrors (tests/test_core.py). The Python side (`cqforensics.core`)
//! turns the buffers returned here into numpy arrays and Arrow columns.

pub mod amqp091;
pub mod columns;
pub mod message;
pub mod qs;
pub mod rdq;

use columns::{as_bytes, ListCol, NumCol, VarCol, Validity};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};


/// Bumped whenever a function's arguments or results change: the Python side refuses a core
/// built from other sources (a stale build) and says how to rebuild.
pub const ABI: u32 = 5;

/// Row status of `decode_messages`.
const DECODED: u8 = 0;
const FALLBACK: u8 = 1; // the reference decodes this row
const NO_TERM: u8 = 2;
/// `expiration`'s place in amqp091::STRING_PROPS
const EXPIRATION: usize = 4;

/// A read-only view of a Python buffer (bytes, mmap, memoryview).
struct View {
    _buf: PyBuffer<u8>,
    ptr: usize,
    len: usize,
}

impl View {
    fn new(obj: &Bound<'_, PyAny>) -> PyResult<View> {
        let buf = PyBuffer::<u8>::get(obj)?;
        if !buf.is_c_contiguous() {
            return Err(pyo3::exceptions::PyValueError::new_err("buffer is not contiguous"));
        }
        let (ptr, len) = (buf.buf_ptr() as usize, buf.len_bytes());
        Ok(View { _buf: buf, ptr, len })
    }

    fn slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the buffer is held (so kept alive, unmoved and read-only) as long as the view
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

/// Every entry of one `.rdq` file and its holes (readers.rdq.walk):
/// `(offsets, totals, ids, holes, torn, rejected)` with offsets and totals as native int64
/// bytes, ids as 16 bytes each, holes `[(offset, length, kind)]`, torn `[(offset, total, id)]`,
/// rejected `[(offset, total, id, reason, hidden)]`. `referenced`: the ids to trust, 16 bytes
/// each, sorted bytewise.
#[pyfunction]
#[pyo3(signature = (data, extents=None, referenced=None, mapped=false))]
fn walk_rdq<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    extents: Option<Vec<(usize, usize)>>,
    referenced: Option<&[u8]>, // bytes, borrowed: extracting a Vec<u8> would convert it byte by byte
    mapped: bool,              // data is a read-only file map: pages behind the walk may be dropped
) -> PyResult<Bound<'py, PyTuple>> {
    let view = View::new(data)?;
    let (ptr, len) = (view.ptr, view.len);
    let refs: &[u8] = referenced.unwrap_or_default();
    let w = py.detach(move || {
        let bytes: &[u8] = if len == 0 { &[] } else { unsafe { std::slice::from_raw_parts(ptr as *const u8, len) } };
        rdq::walk_map(bytes, extents.as_deref(), &rdq::Referenced(&refs), mapped)
    });
    drop(view);
    let kinds = ["zeroed", "garbage", "truncated_tail"];
    let holes = PyList::empty(py);
    for (o, n, k) in &w.holes {
        holes.append((o, n, kinds[*k as usize]))?;
    }
    let torn = PyList::empty(py);
    for (o, t, id) in &w.torn {
        torn.append((o, t, PyBytes::new(py, id)))?;
    }
    let reasons = ["not_a_message_term", "hides_referenced"];
    let rejected = PyList::empty(py);
    for (o, t, id, r, hidden) in &w.rejected {
        rejected.append((o, t, PyBytes::new(py, id), reasons[*r as usize], hidden))?;
    }
    PyTuple::new(
        py,
        [
            PyBytes::new(py, as_bytes(&w.offsets)).into_any(),
            PyBytes::new(py, as_bytes(&w.totals)).into_any(),
            PyBytes::new(py, &w.ids).into_any(),
            holes.into_any(),
            torn.into_any(),
            rejected.into_any(),
        ],
    )
}

fn validity<'py>(py: Python<'py>, v: &Validity) -> (Bound<'py, PyBytes>, usize) {
    (PyBytes::new(py, &v.bits), v.nulls)
}

fn var_col<'py>(py: Python<'py>, c: &VarCol) -> PyResult<Bound<'py, PyTuple>> {
    let (bits, nulls) = validity(py, &c.valid);
    PyTuple::new(
        py,
        [bits.into_any(), nulls.into_pyobject(py)?.into_any(), PyBytes::new(py, as_bytes(&c.offsets)).into_any(),
         PyBytes::new(py, &c.data).into_any()],
    )
}

fn num_col<'py, T: Copy>(py: Python<'py>, c: &NumCol<T>) -> PyResult<Bound<'py, PyTuple>> {
    let (bits, nulls) = validity(py, &c.valid);
    PyTuple::new(
        py,
        [bits.into_any(), nulls.into_pyobject(py)?.into_any(), PyBytes::new(py, as_bytes(&c.values)).into_any()],
    )
}

#[derive(Default)]
struct Columns {
    msg_id: VarCol,
    exchange: VarCol,
    routing_keys: ListCol,
    strings: [VarCol; 10],
    delivery_mode: NumCol<i32>,
    priority: NumCol<i32>,
    timestamp: NumCol<i64>,
    props_valid: Validity,
    headers: VarCol,
    annotations: VarCol,
    body_size: NumCol<i64>,
    term_format: VarCol,
    decode_error: VarCol,
}

thread_local! {
    /// The decode's output columns, kept between calls so their buffers keep their capacity
    /// (no regrowing and no fresh pages batch after batch).
    static COLUMNS: std::cell::RefCell<Columns> = std::cell::RefCell::new(Columns::default());
}

impl Columns {
    fn clear(&mut self) {
        for c in [&mut self.msg_id, &mut self.exchange, &mut self.headers, &mut self.annotations, &mut self.term_format,
                  &mut self.decode_error] {
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
        self.routing_keys.push(None);
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
    fn push_decoded(&mut self, m: &message::Msg, index_id: Option<&[u8]>) {
        let (msg_id, error) = match (index_id, m.msg_id) {
            (Some(i), Some(t)) if i != t => (Some(i), Some("the stored term's message id differs from the index's")),
            (Some(i), _) => (Some(i), None),
            (None, t) => (t, None),
        };
        self.msg_id.push(msg_id);
        self.exchange.push(m.exchange.map(str::as_bytes));
        self.routing_keys.push(Some(&m.routing_keys));
        for (k, (col, v)) in self.strings.iter_mut().zip(m.props.strings.iter()).enumerate() {
            match (k, &m.expiration) {
                (EXPIRATION, Some(replaced)) => col.push(replaced.as_deref().map(str::as_bytes)),
                _ => col.push(v.map(str::as_bytes)),
            };
        }
        self.delivery_mode.push(m.props.delivery_mode);
        self.priority.push(m.props.priority);
        self.timestamp.push(m.timestamp_us);
        self.props_valid.push(true);
        self.headers.push(m.headers.as_deref().map(str::as_bytes));
        self.annotations.push(m.annotations.as_deref().map(str::as_bytes));
        self.body_size.push(Some(m.body.len() as i64));
        self.term_format.push(Some(match m.format {
            message::Format::McAmqpl => b"mc_amqpl".as_slice(),
            message::Format::BasicMessage => b"basic_message".as_slice(),
        }));
        self.decode_error.push(error.map(str::as_bytes));
    }

    fn emit<'py>(&self, py: Python<'py>, out: &Bound<'py, PyDict>) -> PyResult<()> {
        out.set_item("msg_id", var_col(py, &self.msg_id)?)?;
        out.set_item("exchange", var_col(py, &self.exchange)?)?;
        let (bits, nulls) = validity(py, &self.routing_keys.valid);
        out.set_item(
            "routing_keys",
            (bits, nulls, PyBytes::new(py, as_bytes(&self.routing_keys.offsets)), var_col(py, &self.routing_keys.items)?),
        )?;
        for (name, col) in amqp091::STRING_PROPS.iter().zip(self.strings.iter()) {
            out.set_item(*name, var_col(py, col)?)?;
        }
        out.set_item("delivery_mode", num_col(py, &self.delivery_mode)?)?;
        out.set_item("priority", num_col(py, &self.priority)?)?;
        out.set_item("timestamp", num_col(py, &self.timestamp)?)?;
        out.set_item("properties", validity(py, &self.props_valid))?;
        out.set_item("headers", var_col(py, &self.headers)?)?;
        out.set_item("annotations", var_col(py, &self.annotations)?)?;
        out.set_item("body_size", num_col(py, &self.body_size)?)?;
        out.set_item("term_format", var_col(py, &self.term_format)?)?;
        out.set_item("decode_error", var_col(py, &self.decode_error)?)?;
        Ok(())
    }
}

/// The decoded `messages` columns of a batch of stored terms (tables._decode_chunk). Row k's
/// term is `buffers[file_ix[k]][starts[k]..starts[k] + lens[k]]` (cut at the buffer's end, as
/// a slice is; `file_ix[k] < 0`: no term); `index_ids` 16 bytes per row, `has_id` one byte per
/// row (the index holds the id). Returns a dict of Arrow buffers and `status` (one byte per
/// row: 0 decoded here, 1 for the reference to decode, 2 no term). Bodies are copied once,
/// from the mapped files straight into the column's buffer.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn decode_messages<'py>(
    py: Python<'py>,
    buffers: &Bound<'py, PyList>,
    file_ix: &[u8],
    starts: &[u8],
    lens: &[u8],
    index_ids: &[u8],
    has_id: &[u8],
    want_body: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let n = has_id.len();
    let ints = |b: &[u8]| b.chunks_exact(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
    let file_ix: Vec<i32> = file_ix.chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap())).collect();
    let (starts, lens) = (ints(starts), ints(lens));
    if index_ids.len() != 16 * n || file_ix.len() != n || starts.len() != n || lens.len() != n {
        return Err(pyo3::exceptions::PyValueError::new_err("decode_messages: arguments differ in length"));
    }
    let views = buffers.iter().map(|b| View::new(&b)).collect::<PyResult<Vec<View>>>()?;
    let files: Vec<&[u8]> = views.iter().map(|v| v.slice()).collect();
    let dec = message::Decoder::default();
    let mut c = COLUMNS.with(|cell| cell.take());
    c.clear();
    let mut status = Vec::with_capacity(n);
    let mut bodies: Vec<&[u8]> = Vec::new();
    let mut body_offsets: Vec<i32> = Vec::with_capacity(n + 1);
    body_offsets.push(0);
    let mut body_valid = Validity::default();
    let mut body_total = 0usize;
    for k in 0..n {
        let index_id = if has_id[k] != 0 { Some(&index_ids[16 * k..16 * k + 16]) } else { None };
        let term = usize::try_from(file_ix[k]).ok().and_then(|f| files.get(f)).map(|data| {
            let s = (starts[k].max(0) as usize).min(data.len());
            let e = s.saturating_add(lens[k].max(0) as usize).min(data.len());
            &data[s..e]
        });
        let decoded = term.map(|raw| dec.decode(raw));
        let m = match decoded {
            None => {
                status.push(NO_TERM);
                c.push_empty(index_id);
                body_valid.push(false);
                body_offsets.push(body_total as i32);
                continue;
            }
            Some(Ok(m)) if !want_body || body_total + m.body.len() <= i32::MAX as usize => m,
            Some(_) => {
                status.push(FALLBACK);
                c.push_empty(index_id);
                body_valid.push(false);
                body_offsets.push(body_total as i32);
                continue;
            }
        };
        status.push(DECODED);
        if want_body {
            bodies.push(m.body);
            body_total += m.body.len();
        }
        body_valid.push(want_body);
        body_offsets.push(body_total as i32);
        c.push_decoded(&m, index_id);
    }
    let out = PyDict::new(py);
    out.set_item("status", PyBytes::new(py, &status))?;
    let body_data = PyBytes::new_with(py, body_total, |buf| {
        let mut at = 0;
        for b in &bodies {
            buf[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        }
        Ok(())
    })?;
    let (bits, nulls) = validity(py, &body_valid);
    out.set_item("body", (bits, nulls, PyBytes::new(py, as_bytes(&body_offsets)), body_data))?;
    drop(bodies);
    drop(files);
    drop(views);
    let emitted = c.emit(py, &out);
    COLUMNS.with(|cell| cell.replace(c));
    emitted?;
    Ok(out)
}

/// The QsStatus code of each `.qs` entry the index places at `offsets[k]` with term
/// `sizes[k]` (native int64 bytes), as one byte each.
#[pyfunction]
fn check_qs<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    offsets: &[u8],
    sizes: &[u8],
) -> PyResult<Bound<'py, PyBytes>> {
    let view = View::new(data)?;
    let ints = |b: &[u8]| b.chunks_exact(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
    let (offsets, sizes) = (ints(offsets), ints(sizes));
    if offsets.len() != sizes.len() {
        return Err(pyo3::exceptions::PyValueError::new_err("offsets and sizes differ in length"));
    }
    let (ptr, len) = (view.ptr, view.len);
    let out: Vec<u8> = py.detach(move || {
        let bytes: &[u8] = if len == 0 { &[] } else { unsafe { std::slice::from_raw_parts(ptr as *const u8, len) } };
        offsets.iter().zip(&sizes).map(|(&o, &s)| qs::check(bytes, o, s)).collect()
    });
    drop(view);
    Ok(PyBytes::new(py, &out))
}

#[pymodule]
fn cqforensics_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ABI", ABI)?;
    m.add_function(wrap_pyfunction!(walk_rdq, m)?)?;
    m.add_function(wrap_pyfunction!(decode_messages, m)?)?;
    m.add_function(wrap_pyfunction!(check_qs, m)?)?;
    Ok(())
}
