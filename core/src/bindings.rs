//! The Python bindings of the core (PyO3): each function takes Python buffers (bytes, maps,
//! numpy arrays, memoryviews) without copying them, runs a Rust path with the GIL released
//! where it reads only its own borrows, and returns Arrow-layout buffers as bytes (the Python
//! side, `cqforensics.compiled`, makes numpy arrays and Arrow columns of them). The two patterns
//! of Python memory the core touches are here, each in one helper: a buffer read (`View`) and
//! a fresh buffer written (`OutBuf`).

use pyo3::buffer::{Element, PyBuffer};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::columns::{self, as_bytes, Columns, NumCol, Plain, Validity, VarCol};
use crate::io::{Source, Spans};
use crate::{amqp091, etf, ets, qi, qs, rdq};

/// Bumped whenever a function's arguments or results change: the Python side refuses a core
/// built from other sources (a stale build) and says how to rebuild.
pub const ABI: u32 = 17;

/// A read-only view of a Python buffer of `T`s (bytes, mmap, memoryview, numpy array), held
/// for as long as its slice is used.
struct View<T: Element> {
    buf: PyBuffer<T>,
}

impl<T: Element> View<T> {
    fn new(obj: &Bound<'_, PyAny>) -> PyResult<View<T>> {
        let buf = PyBuffer::<T>::get(obj)?; // checks the item type and the alignment
        if !buf.is_c_contiguous() {
            return Err(pyo3::exceptions::PyValueError::new_err("buffer is not contiguous"));
        }
        Ok(View { buf })
    }

    fn slice(&self) -> &[T] {
        if self.buf.item_count() == 0 {
            return &[];
        }
        // SAFETY: the buffer export is held by `self` (so the memory stays alive and unmoved),
        // it is C-contiguous with `item_count` aligned items of T (checked in `new`). No Python
        // code runs while a binding reads the slice with the GIL held; where one releases it,
        // it reads what its caller does not write meanwhile (the readers' bytes, read-only maps
        // and their own index arrays, none shared with another thread).
        unsafe { std::slice::from_raw_parts(self.buf.buf_ptr() as *const T, self.buf.item_count()) }
    }
}

/// Every entry of one `.rdq` file and its holes (readers.rdq.walk), as an `RdqWalk` (a
/// compacted store has thousands of holes per file). `referenced`: the ids to trust, 16 bytes
/// each, sorted bytewise; `directory`: theirs (`rdq::Referenced`), or None; both any buffer.
#[pyfunction]
#[pyo3(signature = (data, extents=None, referenced=None, mapped=false, directory=None))]
fn walk_rdq<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    extents: Option<Vec<(usize, usize)>>,
    referenced: Option<&Bound<'py, PyAny>>,
    mapped: bool, // data is a read-only file map: pages behind the walk may be dropped
    directory: Option<&Bound<'py, PyAny>>,
) -> PyResult<RdqWalk> {
    let view = View::<u8>::new(data)?;
    let referenced = referenced.map(View::<u8>::new).transpose()?;
    let directory = directory.map(View::<u8>::new).transpose()?;
    let (bytes, refs, dir) =
        (view.slice(), referenced.as_ref().map_or(&[][..], View::slice), directory.as_ref().map(View::slice));
    let w = py.detach(|| rdq::walk_map(bytes, extents.as_deref(), &rdq::Referenced::with_directory(refs, dir), mapped));
    let hole_offsets: Vec<i64> = w.holes.iter().map(|h| h.0 as i64).collect();
    let hole_lengths: Vec<i64> = w.holes.iter().map(|h| h.1 as i64).collect();
    let hole_kinds: Vec<u8> = w.holes.iter().map(|h| h.2 as u8).collect();
    let torn = PyList::empty(py);
    for (o, t, id) in &w.torn {
        torn.append((o, t, PyBytes::new(py, id)))?;
    }
    let reasons = ["not_a_message_term", "hides_referenced"];
    let rejected = PyList::empty(py);
    for (o, t, id, r, hidden) in &w.rejected {
        rejected.append((o, t, PyBytes::new(py, id), reasons[*r as usize], hidden))?;
    }
    Ok(RdqWalk {
        offsets: bytes_of(py, &w.offsets),
        totals: bytes_of(py, &w.totals),
        ids: bytes_of(py, &w.ids),
        hole_offsets: bytes_of(py, &hole_offsets),
        hole_lengths: bytes_of(py, &hole_lengths),
        hole_kinds: bytes_of(py, &hole_kinds),
        torn: torn.unbind(),
        rejected: rejected.unbind(),
    })
}

fn bytes_of<T: Plain>(py: Python<'_>, v: &[T]) -> Py<PyBytes> {
    PyBytes::new(py, as_bytes(v)).unbind()
}

/// An Arrow column of variable-length values (binary, string): `validity` (a bitmap, one bit a
/// row, unused when `null_count` is 0), int32 `offsets` (rows + 1) and the values' `data`.
#[pyclass(frozen, get_all, module = "cqforensics_core")]
pub struct VarColumn {
    validity: Py<PyBytes>,
    null_count: usize,
    offsets: Py<PyBytes>,
    data: Py<PyAny>,
}

/// An Arrow column of fixed-width numbers: `validity`, `null_count` and the native-endian `values`.
#[pyclass(frozen, get_all, module = "cqforensics_core")]
pub struct NumColumn {
    validity: Py<PyBytes>,
    null_count: usize,
    values: Py<PyBytes>,
}

/// An Arrow list<string> column: `validity`, `null_count`, int32 `offsets` into `items`.
#[pyclass(frozen, get_all, module = "cqforensics_core")]
pub struct ListColumn {
    validity: Py<PyBytes>,
    null_count: usize,
    offsets: Py<PyBytes>,
    items: Py<VarColumn>,
}

/// The validity of an Arrow struct column (its children are columns of their own).
#[pyclass(frozen, get_all, module = "cqforensics_core")]
pub struct StructColumn {
    validity: Py<PyBytes>,
    null_count: usize,
}

/// One `.rdq` file walked (`walk_rdq`).
#[pyclass(frozen, get_all, module = "cqforensics_core")]
pub struct RdqWalk {
    /// the entries' offsets and totals (int64) and ids (16 bytes each)
    offsets: Py<PyBytes>,
    totals: Py<PyBytes>,
    ids: Py<PyBytes>,
    /// the holes' offsets and lengths (int64) and kinds (one byte each, an `rdq::HoleKind`)
    hole_offsets: Py<PyBytes>,
    hole_lengths: Py<PyBytes>,
    hole_kinds: Py<PyBytes>,
    /// `[(offset, total, id)]` of the entries without their marker
    torn: Py<PyList>,
    /// `[(offset, total, id, reason, hidden)]` of the candidates not taken
    rejected: Py<PyList>,
}

/// Garbage runs of a `.qs` segment (`qs_garbage`).
#[pyclass(frozen, get_all, module = "cqforensics_core")]
pub struct GarbageRuns {
    /// the runs' offsets and lengths (int64)
    offsets: Py<PyBytes>,
    lengths: Py<PyBytes>,
    /// where to call again when the limit cut the scan short, else None
    resume: Option<usize>,
}

fn validity(py: Python<'_>, v: &Validity) -> StructColumn {
    StructColumn { validity: PyBytes::new(py, &v.bits).unbind(), null_count: v.nulls }
}

fn var_col(py: Python<'_>, c: &VarCol) -> VarColumn {
    let v = validity(py, &c.valid);
    VarColumn {
        validity: v.validity,
        null_count: v.null_count,
        offsets: bytes_of(py, &c.offsets),
        data: PyBytes::new(py, &c.data).into_any().unbind(),
    }
}

fn num_col<T: Plain>(py: Python<'_>, c: &NumCol<T>) -> NumColumn {
    let v = validity(py, &c.valid);
    NumColumn { validity: v.validity, null_count: v.null_count, values: bytes_of(py, &c.values) }
}

/// The columns into the dict `cqforensics.compiled.decode_messages` reads, by name.
fn emit<'py>(c: &Columns, py: Python<'py>, out: &Bound<'py, PyDict>) -> PyResult<()> {
    out.set_item("msg_id", var_col(py, &c.msg_id))?;
    out.set_item("exchange", var_col(py, &c.exchange))?;
    let v = validity(py, &c.routing_keys.valid);
    let items = Py::new(py, var_col(py, &c.routing_keys.items))?;
    let rks = ListColumn {
        validity: v.validity,
        null_count: v.null_count,
        offsets: bytes_of(py, &c.routing_keys.offsets),
        items,
    };
    out.set_item("routing_keys", rks)?;
    for (name, col) in amqp091::STRING_PROPS.iter().zip(c.strings.iter()) {
        out.set_item(*name, var_col(py, col))?;
    }
    out.set_item("delivery_mode", num_col(py, &c.delivery_mode))?;
    out.set_item("priority", num_col(py, &c.priority))?;
    out.set_item("timestamp", num_col(py, &c.timestamp))?;
    out.set_item("properties", validity(py, &c.props_valid))?;
    out.set_item("headers", var_col(py, &c.headers))?;
    out.set_item("annotations", var_col(py, &c.annotations))?;
    out.set_item("body_size", num_col(py, &c.body_size))?;
    out.set_item("term_format", var_col(py, &c.term_format))?;
    out.set_item("decode_error", var_col(py, &c.decode_error))?;
    Ok(())
}

/// A writable buffer of `len` bytes made by `alloc` (pyarrow.allocate_buffer: from Arrow's
/// memory pool, which keeps the memory a dropped batch frees for the next one, where a new
/// bytes object of megabytes is fresh pages, each faulted in anew), to be filled here before
/// Python sees it.
struct OutBuf<'py> {
    obj: Bound<'py, PyAny>,
    buf: PyBuffer<i8>, // Arrow exports its bytes as signed (format "b")
    len: usize,
}

impl<'py> OutBuf<'py> {
    fn new(alloc: &Bound<'py, PyAny>, len: usize, what: &str) -> PyResult<OutBuf<'py>> {
        let obj = alloc.call1((len,))?;
        let buf = PyBuffer::<i8>::get(&obj)?;
        if buf.readonly() || !buf.is_c_contiguous() || buf.len_bytes() < len {
            return Err(pyo3::exceptions::PyValueError::new_err(format!("{what}: output buffer not writable")));
        }
        Ok(OutBuf { obj, buf, len })
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: a buffer `alloc` made for this call, writable, C-contiguous and at least `len`
        // bytes (checked in `new`), its export held by `self`; no Python code has it yet (the
        // object goes back to Python only after the fill), and `&mut self` makes this slice the
        // only one.
        unsafe { std::slice::from_raw_parts_mut(self.buf.buf_ptr() as *mut u8, self.len) }
    }
}

/// The sources of a batch: buffers (borrowed through `views`) and open files' descriptors.
fn sources<'a>(list: &Bound<'_, PyList>, views: &'a [Option<View<u8>>]) -> PyResult<Vec<Source<'a>>> {
    list.iter()
        .zip(views)
        .map(|(obj, view)| match view {
            Some(v) => Ok(Source::Mem(v.slice())),
            None => Ok(Source::file(obj.extract()?)?),
        })
        .collect()
}

/// A view of each source that is a buffer (None for a descriptor).
fn source_views(list: &Bound<'_, PyList>) -> PyResult<Vec<Option<View<u8>>>> {
    list.iter()
        .map(|obj| if obj.is_instance_of::<pyo3::types::PyInt>() { Ok(None) } else { View::new(&obj).map(Some) })
        .collect()
}

fn mismatch(what: &str) -> PyErr {
    pyo3::exceptions::PyValueError::new_err(format!("{what}: arguments differ in length"))
}

/// The decoded `messages` columns of a batch of stored terms (tables._decode_chunk). Row k's
/// term is the bytes `[starts[k], starts[k] + lens[k])` of `sources[file_ix[k]]`, a buffer or
/// an open file's descriptor (cut where it ends; `file_ix[k] < 0`: no term); `file_ix` int32,
/// `starts` and `lens` int64, `index_ids` 16 bytes per row, `has_id` one byte per row (the
/// index holds the id), each any buffer (numpy arrays go in as they are). Returns a dict: each
/// column by name (`VarColumn`, `NumColumn`, `ListColumn`, `StructColumn`) and `status` (one
/// byte per row: 0 decoded here, 1 for the reference to decode, 2 no term). `map_files`: a file's terms are read through a map of it made for the call
/// (`FileMap`, else as below), and each body is copied from there into the column's buffer.
/// Otherwise, with bodies, a run of nearby terms is read by one `preadv` into the body buffer
/// itself (`Spans::read_run`) and each body moved down to its place (no page faults, one copy:
/// the faster way on the bench stores); without bodies, or where a run cannot be read, terms
/// come through a window of nearby terms (`Window`). The body buffer has room for every term,
/// so it may be longer than its last offset.
#[pyfunction]
#[pyo3(signature = (sources, file_ix, starts, lens, index_ids, has_id, want_body, body_alloc, map_files=true))]
#[allow(clippy::too_many_arguments)] // the Python signature: each argument a column of the batch
fn decode_messages<'py>(
    py: Python<'py>,
    sources: &Bound<'py, PyList>,
    file_ix: &Bound<'py, PyAny>,
    starts: &Bound<'py, PyAny>,
    lens: &Bound<'py, PyAny>,
    index_ids: &Bound<'py, PyAny>,
    has_id: &Bound<'py, PyAny>,
    want_body: bool,
    body_alloc: &Bound<'py, PyAny>,
    map_files: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let views = source_views(sources)?;
    let (file_ix, starts, lens) = (View::<i32>::new(file_ix)?, View::<i64>::new(starts)?, View::<i64>::new(lens)?);
    let (index_ids, has_id) = (View::<u8>::new(index_ids)?, View::<u8>::new(has_id)?);
    let (index_ids, has_id) = (index_ids.slice(), has_id.slice());
    let n = has_id.len();
    let mut spans =
        Spans::new(self::sources(sources, &views)?, file_ix.slice(), starts.slice(), lens.slice(), map_files)
            .map_err(|_| mismatch("decode_messages"))?;
    if index_ids.len() != 16 * n || spans.len() != n {
        return Err(mismatch("decode_messages"));
    }
    // room for every term (a body is never longer than its term), within the int32 offsets
    let room = if want_body { spans.total().min(i32::MAX as usize) } else { 0 };
    let mut body = OutBuf::new(body_alloc, room, "decode_messages")?;
    let batch = columns::decode_batch(&mut spans, index_ids, has_id, want_body, body.bytes_mut());
    drop(spans);
    let out = PyDict::new(py);
    out.set_item("status", PyBytes::new(py, &batch.status))?;
    let v = validity(py, &batch.body_valid);
    let body = VarColumn {
        validity: v.validity,
        null_count: v.null_count,
        offsets: bytes_of(py, &batch.body_offsets),
        data: body.obj.unbind(),
    };
    out.set_item("body", body)?;
    let emitted = emit(&batch.columns, py, &out);
    batch.columns.reuse();
    emitted?;
    Ok(out)
}

/// The bytes of many spans of files as one Arrow binary column (the `store` table's raw terms):
/// row k is `[starts[k], starts[k] + lens[k])` of `sources[file_ix[k]]` (cut where it ends; null
/// when `file_ix[k] < 0`), a file's runs of nearby spans each read by one `preadv` straight into
/// the column (`Spans::read_run`).
/// `file_ix` int32, `starts` and `lens` int64 buffers (numpy arrays). The data buffer comes
/// from `alloc` (pyarrow.allocate_buffer).
#[pyfunction]
fn read_spans<'py>(
    py: Python<'py>,
    sources: &Bound<'py, PyList>,
    file_ix: &Bound<'py, PyAny>,
    starts: &Bound<'py, PyAny>,
    lens: &Bound<'py, PyAny>,
    alloc: &Bound<'py, PyAny>,
) -> PyResult<VarColumn> {
    let views = source_views(sources)?;
    let (file_ix, starts, lens) = (View::<i32>::new(file_ix)?, View::<i64>::new(starts)?, View::<i64>::new(lens)?);
    let mut spans = Spans::new(self::sources(sources, &views)?, file_ix.slice(), starts.slice(), lens.slice(), false)
        .map_err(|_| mismatch("read_spans"))?;
    let total = spans.total();
    if total > i32::MAX as usize {
        return Err(pyo3::exceptions::PyValueError::new_err("read_spans: more bytes than int32 offsets address"));
    }
    let mut data = OutBuf::new(alloc, total, "read_spans")?;
    let mut offsets: Vec<i32> = Vec::with_capacity(spans.len() + 1);
    offsets.push(0);
    let mut valid = Validity::default();
    let mut at = 0usize;
    spans.read_all(data.bytes_mut(), |len| {
        valid.push(len.is_some());
        at += len.unwrap_or(0);
        offsets.push(at as i32);
    });
    drop(spans);
    let v = validity(py, &valid);
    Ok(VarColumn {
        validity: v.validity,
        null_count: v.null_count,
        offsets: bytes_of(py, &offsets),
        data: data.obj.unbind(),
    })
}

/// The QsStatus code of each `.qs` entry the index places at `offsets[k]` with term
/// `sizes[k]` (int64 buffers, numpy arrays as they are), as one byte each.
#[pyfunction]
fn check_qs<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    offsets: &Bound<'py, PyAny>,
    sizes: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let (view, offsets, sizes) = (View::<u8>::new(data)?, View::<i64>::new(offsets)?, View::<i64>::new(sizes)?);
    let (bytes, offsets, sizes) = (view.slice(), offsets.slice(), sizes.slice());
    if offsets.len() != sizes.len() {
        return Err(pyo3::exceptions::PyValueError::new_err("offsets and sizes differ in length"));
    }
    let out: Vec<u8> = py.detach(|| offsets.iter().zip(sizes).map(|(&o, &s)| qs::check(bytes, o, s)).collect());
    Ok(PyBytes::new(py, &out))
}

/// Garbage runs of a `.qs` segment's bytes from `start` (readers.qs.garbage_runs), at most
/// `limit` of them, as `GarbageRuns`. `holes`: a sparse file's holes,
/// sorted `[start, end)`. A map's pages are dropped behind the scan (`mapped`).
#[pyfunction]
#[pyo3(signature = (data, start, holes, limit, mapped=false))]
fn qs_garbage<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    start: usize,
    holes: Vec<(usize, usize)>,
    limit: usize,
    mapped: bool,
) -> PyResult<GarbageRuns> {
    let view = View::<u8>::new(data)?;
    let bytes = view.slice();
    let (runs, resume) = py.detach(|| {
        if mapped {
            rdq::pager::start(bytes);
        }
        let r = qs::garbage_runs(bytes, start, &holes, limit.max(1));
        rdq::pager::stop();
        r
    });
    let offsets: Vec<i64> = runs.iter().map(|r| r.0 as i64).collect();
    let lengths: Vec<i64> = runs.iter().map(|r| r.1 as i64).collect();
    Ok(GarbageRuns { offsets: bytes_of(py, &offsets), lengths: bytes_of(py, &lengths), resume })
}

/// The slots of a `.qi` segment (whole slots only), classified, with the records of the used
/// ones and the slots the reader has findings about (`qi::Slots`): a dict of native-endian
/// arrays as bytes, `duplicates` as `(slot, first slot, location kind)` tuples.
#[pyfunction]
fn qi_slots<'py>(py: Python<'py>, slots: &Bound<'py, PyAny>, expiry_max: u64) -> PyResult<Bound<'py, PyDict>> {
    let view = View::<u8>::new(slots)?;
    let d = qi::decode(view.slice(), expiry_max);
    let out = PyDict::new(py);
    out.set_item("klass", PyBytes::new(py, &d.klass))?;
    out.set_item("malformed", PyBytes::new(py, &d.malformed))?;
    out.set_item("kind", PyBytes::new(py, &d.kind))?;
    out.set_item("msg_id", PyBytes::new(py, &d.msg_id))?;
    for (name, v) in [("persistent", &d.persistent), ("loc", &d.loc)] {
        out.set_item(name, PyBytes::new(py, as_bytes(v)))?;
    }
    for (name, v) in [
        ("expiry", &d.expiry),
        ("bad_expiry", &d.bad_expiry),
        ("stray", &d.stray),
        ("qs_range", &d.qs_range),
        ("rejected", &d.rejected),
        ("used", &d.used),
        ("store_size", &d.store_size),
        ("size", &d.size),
        ("live", &d.live),
    ] {
        out.set_item(name, PyBytes::new(py, as_bytes(v)))?;
    }
    out.set_item("store_offset", PyBytes::new(py, as_bytes(&d.store_offset)))?;
    out.set_item("status", PyBytes::new(py, as_bytes(&d.status)))?;
    out.set_item("duplicates", d.duplicates)?;
    Ok(out)
}

/// The items of a disk_log (`ets::walk`, strictly): a dict of native-endian arrays as bytes,
/// one row per item (`offsets`, `starts`, `lengths`; `decoded`: 1 where the item is a `#msg_location{}` record decoded into `ids`
/// (16 bytes a row), `ref_counts`, `files`, `locations` and `totals`), `stop` (None, or the
/// strict walk's `(code, offset)`), `md5_items` and `next` (where to go on from after
/// `max_items` items, from `start`; None: done).
#[pyfunction]
#[pyo3(signature = (data, start=ets::HEADER_SIZE, max_items=usize::MAX))]
fn disk_log_items<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    start: usize,
    max_items: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let view = View::<u8>::new(data)?;
    let bytes = view.slice();
    let w = py.detach(|| ets::walk(bytes, start, max_items));
    let n = w.records.len();
    let mut decoded = vec![0u8; n];
    let mut ids = vec![0u8; 16 * n];
    let mut ints = [vec![0i64; n], vec![0i64; n], vec![0i64; n], vec![0i64; n]];
    for (k, r) in w.records.iter().enumerate() {
        if let Some(r) = r {
            decoded[k] = 1;
            ids[16 * k..16 * k + 16].copy_from_slice(&r.id);
            for (col, v) in ints.iter_mut().zip([r.ref_count, r.file, r.offset, r.total]) {
                col[k] = v;
            }
        }
    }
    let out = PyDict::new(py);
    for (name, v) in [("offsets", &w.offsets), ("starts", &w.starts), ("lengths", &w.lengths)] {
        out.set_item(name, PyBytes::new(py, as_bytes(v)))?;
    }
    out.set_item("decoded", PyBytes::new(py, &decoded))?;
    out.set_item("ids", PyBytes::new(py, &ids))?;
    for (name, v) in ["ref_counts", "files", "locations", "totals"].iter().zip(ints.iter()) {
        out.set_item(*name, PyBytes::new(py, as_bytes(v)))?;
    }
    out.set_item("stop", w.stop.map(|(why, at)| (why as u8, at)))?;
    out.set_item("md5_items", w.md5_items)?;
    out.set_item("next", w.next)?;
    Ok(out)
}

/// The external term whose tag is at `data[pos]` as the Python values `codecs/etf.py` makes
/// (`makers`: its `(atom, opaque, improper, hashable)`, `etf::Terms`), and where it ends; None
/// for a term the reference decodes (compressed, a fun, damaged, ...). The bytes are copied
/// first: the makers are Python code, run while the term is walked.
#[pyfunction]
fn decode_term<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    pos: usize,
    makers: (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>),
) -> PyResult<Option<(Bound<'py, PyAny>, usize)>> {
    let bytes = View::<u8>::new(data)?.slice().to_vec();
    let atoms = etf::AtomMemo::default();
    Ok(etf::Terms::new(py, &bytes, (&makers.0, &makers.1, &makers.2, &makers.3), &atoms).term(pos, 0))
}

/// `decode_term` of each buffer of `datas` (its term from `pos`), in one call: a list of the
/// terms, None where the reference decodes it (as `decode_term` gives None) or where the buffer
/// is no external term of version 131 at all. Each distinct atom is made once for the run.
#[pyfunction]
fn decode_terms<'py>(
    py: Python<'py>,
    datas: &Bound<'py, PyList>,
    pos: usize,
    makers: (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>),
) -> PyResult<Bound<'py, PyList>> {
    let atoms = etf::AtomMemo::default();
    let out = PyList::empty(py);
    for data in datas.iter() {
        let bytes = View::<u8>::new(&data)?.slice().to_vec();
        let got = if bytes.len() < 2 || bytes[0] != etf::VERSION {
            None
        } else {
            etf::Terms::new(py, &bytes, (&makers.0, &makers.1, &makers.2, &makers.3), &atoms).term(pos, 0)
        };
        match got {
            Some((term, _)) => out.append(term)?,
            None => out.append(py.None())?,
        }
    }
    Ok(out)
}

/// For each start in `starts`: the tuple whose tag is there, ending within `limit` bytes of
/// it, with only its elements at the positions `wanted` made into values (`etf::Terms::fields`:
/// None in the others' places), and where it ends; or None, for a record the reference decodes
/// (not a tuple, not plain, damaged). The records carved from one log: the bytes are copied
/// once (the makers are Python code), the atoms made once.
#[pyfunction]
fn decode_fields<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    starts: Vec<usize>,
    limit: usize,
    wanted: Vec<usize>,
    makers: (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>),
) -> PyResult<Bound<'py, PyList>> {
    let bytes = View::<u8>::new(data)?.slice().to_vec();
    let mut mask = vec![false; wanted.iter().max().map_or(0, |m| m + 1)];
    for w in wanted {
        mask[w] = true;
    }
    let atoms = etf::AtomMemo::default();
    let mut terms = etf::Terms::new(py, &bytes, (&makers.0, &makers.1, &makers.2, &makers.3), &atoms);
    let out = PyList::empty(py);
    for start in starts {
        terms.buf = &bytes[..bytes.len().min(start.saturating_add(limit))];
        match terms.fields(start, &mask) {
            Some(got) => out.append(got)?,
            None => out.append(py.None())?,
        }
    }
    Ok(out)
}

#[pymodule]
fn cqforensics_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ABI", ABI)?;
    // a debug build (an editable install before setuptools-rust was told `debug = false`) decodes
    // about 10x slower: `cqforensics --version` and the benchmarks say so
    m.add("DEBUG", cfg!(debug_assertions))?;
    m.add_function(wrap_pyfunction!(walk_rdq, m)?)?;
    m.add_function(wrap_pyfunction!(decode_messages, m)?)?;
    m.add_function(wrap_pyfunction!(check_qs, m)?)?;
    m.add_function(wrap_pyfunction!(qs_garbage, m)?)?;
    m.add_function(wrap_pyfunction!(qi_slots, m)?)?;
    m.add_function(wrap_pyfunction!(read_spans, m)?)?;
    m.add_function(wrap_pyfunction!(disk_log_items, m)?)?;
    m.add_function(wrap_pyfunction!(decode_term, m)?)?;
    m.add_function(wrap_pyfunction!(decode_fields, m)?)?;
    m.add_function(wrap_pyfunction!(decode_terms, m)?)?;
    m.add_class::<VarColumn>()?;
    m.add_class::<NumColumn>()?;
    m.add_class::<ListColumn>()?;
    m.add_class::<StructColumn>()?;
    m.add_class::<RdqWalk>()?;
    m.add_class::<GarbageRuns>()?;
    Ok(())
}
