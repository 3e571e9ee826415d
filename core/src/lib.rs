//! cqforensics' compiled core (PyO3): the hot paths of the readers, each tested equal to the
//! Python reference it mirrors (tests/test_core.py). The Python side (`cqforensics.core`)
//! turns the buffers returned here into numpy arrays and Arrow columns.

pub mod amqp091;
pub mod columns;
pub mod ets;
pub mod message;
pub mod qi;
pub mod qs;
pub mod rdq;

use columns::{as_bytes, ListCol, NumCol, Validity, VarCol};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

/// Bumped whenever a function's arguments or results change: the Python side refuses a core
/// built from other sources (a stale build) and says how to rebuild.
pub const ABI: u32 = 13;

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
/// bytes, ids as 16 bytes each, holes `(offsets, lengths, kinds)` (int64, int64 and one byte
/// each, a `HoleKind`: a compacted store has thousands per file), torn `[(offset, total, id)]`,
/// rejected `[(offset, total, id, reason, hidden)]`. `referenced`: the ids to trust, 16 bytes
/// each, sorted bytewise; `directory`: theirs (`rdq::Referenced`), or None.
#[pyfunction]
#[pyo3(signature = (data, extents=None, referenced=None, mapped=false, directory=None))]
fn walk_rdq<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    extents: Option<Vec<(usize, usize)>>,
    referenced: Option<&[u8]>, // bytes, borrowed: extracting a Vec<u8> would convert it byte by byte
    mapped: bool,              // data is a read-only file map: pages behind the walk may be dropped
    directory: Option<&[u8]>,
) -> PyResult<Bound<'py, PyTuple>> {
    let view = View::new(data)?;
    let (ptr, len) = (view.ptr, view.len);
    let refs: &[u8] = referenced.unwrap_or_default();
    let w = py.detach(move || {
        let bytes: &[u8] = if len == 0 { &[] } else { unsafe { std::slice::from_raw_parts(ptr as *const u8, len) } };
        rdq::walk_map(bytes, extents.as_deref(), &rdq::Referenced::with_directory(refs, directory), mapped)
    });
    drop(view);
    let hole_offsets: Vec<i64> = w.holes.iter().map(|h| h.0 as i64).collect();
    let hole_lengths: Vec<i64> = w.holes.iter().map(|h| h.1 as i64).collect();
    let hole_kinds: Vec<u8> = w.holes.iter().map(|h| h.2 as u8).collect();
    let holes = (
        PyBytes::new(py, as_bytes(&hole_offsets)),
        PyBytes::new(py, as_bytes(&hole_lengths)),
        PyBytes::new(py, &hole_kinds),
    );
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
            holes.into_pyobject(py)?.into_any(),
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
        [
            bits.into_any(),
            nulls.into_pyobject(py)?.into_any(),
            PyBytes::new(py, as_bytes(&c.offsets)).into_any(),
            PyBytes::new(py, &c.data).into_any(),
        ],
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

    fn emit<'py>(&self, py: Python<'py>, out: &Bound<'py, PyDict>) -> PyResult<()> {
        out.set_item("msg_id", var_col(py, &self.msg_id)?)?;
        out.set_item("exchange", var_col(py, &self.exchange)?)?;
        let (bits, nulls) = validity(py, &self.routing_keys.valid);
        out.set_item(
            "routing_keys",
            (
                bits,
                nulls,
                PyBytes::new(py, as_bytes(&self.routing_keys.offsets)),
                var_col(py, &self.routing_keys.items)?,
            ),
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

/// Where a batch's stored terms are: a buffer (bytes, a map), or a file open for reading (its
/// descriptor). `decode_messages` maps such a file for the call (`FileMap`: each body is then
/// copied once, from the page cache into its column); `read_spans` reads it with `preadv`
/// straight into the column; the window of `pread`s is the way left when neither can.
enum Source {
    Mem(View),
    File(i32, u64), // descriptor, size
}

impl Source {
    fn new(obj: &Bound<'_, PyAny>) -> PyResult<Source> {
        if obj.is_instance_of::<pyo3::types::PyInt>() {
            let fd: i32 = obj.extract()?;
            // SAFETY: fstat fills the struct it is given
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            if unsafe { libc::fstat(fd, &mut st) } != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            return Ok(Source::File(fd, st.st_size.max(0) as u64));
        }
        View::new(obj).map(Source::Mem)
    }

    /// The length of row's term `[start, start + len)` once cut where the source ends (an
    /// index may claim any length: never more room than the file holds).
    fn cut(&self, start: i64, len: i64) -> usize {
        let size = match self {
            Source::Mem(v) => v.len as u64,
            Source::File(_, size) => *size,
        };
        (len.max(0) as u64).min(size.saturating_sub(start.max(0) as u64)) as usize
    }
}

/// `buf.len()` bytes of `fd` from `offset`, fewer where the file ends first or a read fails
/// (a term cut short, as a slice past a buffer's end is).
fn read_at(fd: i32, buf: &mut [u8], offset: u64) -> usize {
    let mut got = 0;
    while got < buf.len() {
        let Ok(at) = libc::off_t::try_from(offset + got as u64) else { break };
        // SAFETY: writes at most the rest of `buf`
        let r = unsafe { libc::pread(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got, at) };
        if r > 0 {
            got += r as usize;
        } else if r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        } else {
            break;
        }
    }
    got
}

thread_local! {
    /// The read window's buffer, kept between calls so it keeps its capacity.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// At most this many bytes are read from a file at once for the terms of consecutive rows...
const WINDOW: usize = 1 << 20;
/// ...spanning at most this many bytes no row uses between two of them (dead entries, another
/// queue's or another share's messages): one read per run of nearby terms, not one per term. A
/// read costs a system call, about as much as copying a few kilobytes: a wider gap would read
/// more bytes than it saves in calls (a read in P shares would read every byte P times).
const WINDOW_GAP: u64 = 4 << 10;

/// The bytes of one file that the last read brought in: `[start, start + bytes.len())` of
/// source `file`.
struct Window {
    bytes: Vec<u8>,
    file: i32,
    start: u64,
}

impl Window {
    fn holds(&self, file: i32, at: u64, len: usize) -> bool {
        file == self.file && at >= self.start && at + len as u64 <= self.start + self.bytes.len() as u64
    }

    fn fill(&mut self, fd: i32, file: i32, at: u64, len: usize) {
        self.bytes.resize(len, 0);
        let got = read_at(fd, &mut self.bytes, at);
        self.bytes.truncate(got);
        (self.file, self.start) = (file, at);
    }

    /// A row's term: its bytes in the window, cut where the file ended
    fn term(&self, at: u64, len: usize) -> &[u8] {
        let s = ((at - self.start) as usize).min(self.bytes.len());
        &self.bytes[s..(s + len).min(self.bytes.len())]
    }
}

/// Where one read for row `k`'s term (from `at`, ending at `end`) stops: it takes in the terms
/// of the rows after it while they are in the same file, after `at`, within `WINDOW_GAP` of
/// what it holds so far and within `WINDOW` of `at`.
fn window_end(file_ix: &[i32], starts: &[i64], lens: &[i64], f: &Source, k: usize, mut end: u64) -> u64 {
    let at = starts[k].max(0) as u64;
    for j in k + 1..file_ix.len() {
        let (s, l) = (starts[j].max(0) as u64, f.cut(starts[j], lens[j]) as u64);
        if file_ix[j] != file_ix[k] || s < at || s > end + WINDOW_GAP || s + l - at > WINDOW as u64 {
            break;
        }
        end = end.max(s + l);
    }
    end
}

/// Byte spans of files, row by row: row k is `[starts[k], starts[k] + lens[k])` of
/// `sources[file_ix[k]]` (cut where it ends; none when `file_ix[k] < 0`); a file's spans are read
/// a run of nearby spans at a time (`Window`). Arguments as native-endian bytes.
struct Spans {
    sources: Vec<Source>,
    file_ix: Vec<i32>,
    starts: Vec<i64>,
    lens: Vec<i64>,
    window: Window,
    /// read files through a map of each (made at its first row, unmapped when done) rather
    /// than into the window: the bytes are then copied once, from the page cache to where
    /// they go, instead of twice
    map_files: bool,
    maps: Vec<Option<Option<FileMap>>>, // per source: not tried yet, or the map if one could be made
    /// rows read through the maps since their pages were last dropped
    mapped_rows: usize,
}

/// The maps' pages are dropped every this many rows read through them: each row faults in up to
/// 64 KiB around its term (the kernel's fault-around), so rows lying apart (a share's, or a
/// compacted store's) would otherwise hold a batch's worth of such pages at once.
const ROWS_PER_DROP: usize = 256;

/// A read-only map of a whole file, unmapped when dropped.
struct FileMap {
    ptr: *mut libc::c_void,
    len: usize,
}

impl FileMap {
    fn new(fd: i32, len: u64) -> Option<FileMap> {
        let len = usize::try_from(len).ok().filter(|&n| n > 0)?;
        // SAFETY: a fresh read-only shared map of a descriptor the caller holds open
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, fd, 0) };
        (ptr != libc::MAP_FAILED).then_some(FileMap { ptr, len })
    }

    /// Drops the pages mapped so far (they are faulted in again from the page cache if read).
    fn drop_pages(&self) {
        // SAFETY: advice on the map made in `new`; no slice of it is borrowed across this call
        unsafe { libc::madvise(self.ptr, self.len, libc::MADV_DONTNEED) };
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: mapped for `len` bytes, read-only, until dropped (a file cut meanwhile makes
        // reads past its new end fault, as the walk's maps of the same files would)
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: the map made in `new`, no longer borrowed
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

impl Spans {
    fn new(
        sources: &Bound<'_, PyList>,
        file_ix: &[u8],
        starts: &[u8],
        lens: &[u8],
        what: &str,
        map_files: bool,
    ) -> PyResult<Spans> {
        let ints = |b: &[u8]| b.chunks_exact(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
        let file_ix: Vec<i32> = file_ix.chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap())).collect();
        let (starts, lens) = (ints(starts), ints(lens));
        if starts.len() != file_ix.len() || lens.len() != file_ix.len() {
            return Err(pyo3::exceptions::PyValueError::new_err(format!("{what}: arguments differ in length")));
        }
        let sources = sources.iter().map(|b| Source::new(&b)).collect::<PyResult<Vec<Source>>>()?;
        let window = Window { bytes: SCRATCH.with(|cell| cell.take()), file: -1, start: 0 };
        let maps = sources.iter().map(|_| None).collect();
        Ok(Spans { sources, file_ix, starts, lens, window, map_files, maps, mapped_rows: 0 })
    }

    fn len(&self) -> usize {
        self.file_ix.len()
    }

    fn source(&self, k: usize) -> Option<&Source> {
        usize::try_from(self.file_ix[k]).ok().and_then(|f| self.sources.get(f))
    }

    /// The bytes of every span together (each cut where its file ends).
    fn total(&self) -> usize {
        (0..self.len())
            .filter_map(|k| self.source(k).map(|f| f.cut(self.starts[k], self.lens[k])))
            .fold(0usize, usize::saturating_add)
    }

    /// Row k's bytes, None when it has no file.
    fn span(&mut self, k: usize) -> Option<&[u8]> {
        let ix = usize::try_from(self.file_ix[k]).ok()?;
        let f = self.sources.get(ix)?;
        let slice = |data: &'_ [u8]| {
            let s = (self.starts[k].max(0) as usize).min(data.len());
            (s, s.saturating_add(self.lens[k].max(0) as usize).min(data.len()))
        };
        if let (Source::File(fd, size), true) = (f, self.map_files) {
            self.mapped_rows += 1;
            if self.mapped_rows > ROWS_PER_DROP {
                self.maps.iter().flatten().flatten().for_each(FileMap::drop_pages);
                self.mapped_rows = 1;
            }
            if let Some(m) = self.maps[ix].get_or_insert_with(|| FileMap::new(*fd, *size)) {
                let (s, e) = slice(m.bytes());
                return Some(&m.bytes()[s..e]);
            }
        }
        match f {
            Source::Mem(v) => {
                let (s, e) = slice(v.slice());
                Some(&v.slice()[s..e])
            }
            Source::File(fd, _) => {
                let len = f.cut(self.starts[k], self.lens[k]);
                let at = self.starts[k].max(0) as u64;
                if !self.window.holds(self.file_ix[k], at, len) {
                    let end = window_end(&self.file_ix, &self.starts, &self.lens, f, k, at + len as u64);
                    self.window.fill(*fd, self.file_ix[k], at, (end - at) as usize);
                }
                Some(self.window.term(at, len))
            }
        }
    }
}

/// Most pieces one `preadv` takes (Linux's UIO_MAXIOV).
const MAX_IOV: usize = 1024;

impl Spans {
    /// Rows k..j of one file, in order, each within `WINDOW_GAP` of the one before and all within
    /// `WINDOW` of row k's start (row k however long): read by one `preadv` straight into `out`,
    /// row after row, the gaps between rows into `gap` (at least `WINDOW_GAP` bytes). Returns j,
    /// or None when row k is not in a file or the read came short (a file cut meanwhile).
    fn read_run(&self, k: usize, out: &mut [u8], gap: &mut [u8]) -> Option<usize> {
        let f = self.source(k)?;
        let Source::File(fd, _) = f else { return None };
        let at = self.starts[k].max(0) as u64;
        let (mut end, mut put, mut j) = (at, 0usize, k);
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(64);
        while j < self.len() && iov.len() + 2 <= MAX_IOV && self.file_ix[j] == self.file_ix[k] {
            let (s, l) = (self.starts[j].max(0) as u64, f.cut(self.starts[j], self.lens[j]));
            if s < end || s - end > WINDOW_GAP || (j > k && s + l as u64 - at > WINDOW as u64) || put + l > out.len() {
                break;
            }
            if s > end {
                iov.push(libc::iovec { iov_base: gap.as_mut_ptr().cast(), iov_len: (s - end) as usize });
            }
            if l > 0 {
                iov.push(libc::iovec { iov_base: out[put..].as_mut_ptr().cast(), iov_len: l });
            }
            (put, end, j) = (put + l, s + l as u64, j + 1);
        }
        let want = (end - at) as usize;
        let from = libc::off_t::try_from(at).ok()?;
        // SAFETY: every piece lies inside `out` (rows placed one after another within its length)
        // or inside `gap` (no gap is longer than WINDOW_GAP)
        let got = unsafe { libc::preadv(*fd, iov.as_ptr(), iov.len() as i32, from) };
        (got >= 0 && got as usize == want && j > k).then_some(j)
    }
}

impl Drop for Spans {
    /// The window's buffer is kept for the next call (a huge term's room is not).
    fn drop(&mut self) {
        let mut scratch = std::mem::take(&mut self.window.bytes);
        if scratch.capacity() > 4 * WINDOW {
            scratch = Vec::new();
        }
        scratch.clear();
        SCRATCH.with(|cell| cell.replace(scratch));
    }
}

/// A writable buffer of `len` bytes made by `alloc` (pyarrow.allocate_buffer: from Arrow's
/// memory pool, which keeps the memory a dropped batch frees for the next one, where a new
/// bytes object of megabytes is fresh pages, each faulted in anew), and a view to fill it.
fn pool_buffer<'py>(alloc: &Bound<'py, PyAny>, len: usize) -> PyResult<(Bound<'py, PyAny>, PyBuffer<i8>)> {
    let obj = alloc.call1((len,))?;
    let buf = PyBuffer::<i8>::get(&obj)?; // Arrow exports its bytes as signed (format "b")
    if buf.readonly() || !buf.is_c_contiguous() || buf.len_bytes() < len {
        return Err(pyo3::exceptions::PyValueError::new_err("decode_messages: body buffer not writable"));
    }
    Ok((obj, buf))
}

/// The decoded `messages` columns of a batch of stored terms (tables._decode_chunk). Row k's
/// term is the bytes `[starts[k], starts[k] + lens[k])` of `sources[file_ix[k]]`, a buffer or
/// an open file's descriptor (cut where it ends; `file_ix[k] < 0`: no term); `index_ids` 16
/// bytes per row, `has_id` one byte per row (the index holds the id). Returns a dict of Arrow
/// buffers and `status` (one byte per row: 0 decoded here, 1 for the reference to decode, 2 no
/// term). `map_files`: a file's terms are read through a map of it made for the call
/// (`FileMap`, else as below), and each body is copied from there into the column's buffer.
/// Otherwise, with bodies, a run of nearby terms is read by one `preadv` into the body buffer
/// itself (`Spans::read_run`) and each body moved down to its place (no page faults, one copy:
/// the faster way on the bench stores); without bodies, or where a run cannot be read, terms
/// come through a window of nearby terms (`Window`). The body buffer has room for every term,
/// so it may be longer than its last offset.
#[pyfunction]
#[pyo3(signature = (sources, file_ix, starts, lens, index_ids, has_id, want_body, body_alloc, map_files=true))]
#[allow(clippy::too_many_arguments)]
fn decode_messages<'py>(
    py: Python<'py>,
    sources: &Bound<'py, PyList>,
    file_ix: &[u8],
    starts: &[u8],
    lens: &[u8],
    index_ids: &[u8],
    has_id: &[u8],
    want_body: bool,
    body_alloc: &Bound<'py, PyAny>,
    map_files: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let n = has_id.len();
    let mut spans = Spans::new(sources, file_ix, starts, lens, "decode_messages", map_files)?;
    if index_ids.len() != 16 * n || spans.len() != n {
        return Err(pyo3::exceptions::PyValueError::new_err("decode_messages: arguments differ in length"));
    }
    // room for every term (a body is never longer than its term), within the int32 offsets
    let room = if want_body { spans.total().min(i32::MAX as usize) } else { 0 };
    let (body_data, body_view) = pool_buffer(body_alloc, room)?;
    // SAFETY: the new buffer, writable, not yet shared with any Python code
    let out: &mut [u8] = unsafe { std::slice::from_raw_parts_mut(body_view.buf_ptr() as *mut u8, room) };
    let dec = message::Decoder::default();
    let mut texts = message::Scratch::default();
    let mut c = COLUMNS.with(|cell| cell.take());
    c.clear();
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
                    let len = spans.source(r).map_or(0, |f| f.cut(spans.starts[r], spans.lens[r]));
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
    drop(spans);
    let out_dict = PyDict::new(py);
    out_dict.set_item("status", PyBytes::new(py, &status))?;
    let (bits, nulls) = validity(py, &body_valid);
    out_dict.set_item("body", (bits, nulls, PyBytes::new(py, as_bytes(&body_offsets)), body_data))?;
    let emitted = c.emit(py, &out_dict);
    COLUMNS.with(|cell| cell.replace(c));
    emitted?;
    Ok(out_dict)
}

/// The bytes of many spans of files as one Arrow binary column (the `store` table's raw terms):
/// row k is `[starts[k], starts[k] + lens[k])` of `sources[file_ix[k]]` (cut where it ends; null
/// when `file_ix[k] < 0`), a file's runs of nearby spans each read by one `preadv` straight into
/// the column (`Spans::read_run`).
/// Returns `(validity bits, null count, int32 offsets, data buffer from `alloc`)`.
#[pyfunction]
fn read_spans<'py>(
    py: Python<'py>,
    sources: &Bound<'py, PyList>,
    file_ix: &[u8],
    starts: &[u8],
    lens: &[u8],
    alloc: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    let mut spans = Spans::new(sources, file_ix, starts, lens, "read_spans", false)?;
    let total = spans.total();
    if total > i32::MAX as usize {
        return Err(pyo3::exceptions::PyValueError::new_err("read_spans: more bytes than int32 offsets address"));
    }
    let (data, view) = pool_buffer(alloc, total)?;
    // SAFETY: the new buffer, writable, not yet shared with any Python code
    let out: &mut [u8] = unsafe { std::slice::from_raw_parts_mut(view.buf_ptr() as *mut u8, total) };
    let mut offsets: Vec<i32> = Vec::with_capacity(spans.len() + 1);
    offsets.push(0);
    let mut valid = Validity::default();
    let mut at_out = 0usize;
    let mut gap = vec![0u8; WINDOW_GAP as usize];
    let mut k = 0;
    while k < spans.len() {
        // runs of a file's rows go straight from the file into the column (one copy, not two)
        if let Some(j) = spans.read_run(k, &mut out[at_out..], &mut gap) {
            for r in k..j {
                at_out += spans.source(r).map_or(0, |f| f.cut(spans.starts[r], spans.lens[r]));
                valid.push(true);
                offsets.push(at_out as i32);
            }
            k = j;
            continue;
        }
        let got = spans.span(k);
        if let Some(b) = got {
            out[at_out..at_out + b.len()].copy_from_slice(b);
            at_out += b.len();
        }
        valid.push(got.is_some());
        offsets.push(at_out as i32);
        k += 1;
    }
    drop(spans);
    let (bits, nulls) = validity(py, &valid);
    (bits, nulls, PyBytes::new(py, as_bytes(&offsets)), data).into_pyobject(py)
}

/// Decodes one row's term (None: no term) and records it: its status and its columns. Returns
/// the body's place in the term, `(offset, length)`, when the body is kept (bodies wanted, and
/// it fits in the `free` bytes left of the body buffer; else the reference decodes the row).
#[allow(clippy::too_many_arguments)]
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

/// Garbage runs of a `.qs` segment's bytes from `start` (readers.qs.garbage_runs):
/// `(offsets, lengths, resume)`, native int64 bytes, at most `limit` runs, `resume` the offset to
/// call again from when the limit cut the scan short (else None). `holes`: a sparse file's holes,
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
) -> PyResult<Bound<'py, PyTuple>> {
    let view = View::new(data)?;
    let (ptr, len) = (view.ptr, view.len);
    let (runs, resume) = py.detach(move || {
        let bytes: &[u8] = if len == 0 { &[] } else { unsafe { std::slice::from_raw_parts(ptr as *const u8, len) } };
        if mapped {
            rdq::pager::start(bytes);
        }
        let r = qs::garbage_runs(bytes, start, &holes, limit.max(1));
        rdq::pager::stop();
        r
    });
    drop(view);
    let offsets: Vec<i64> = runs.iter().map(|r| r.0 as i64).collect();
    let lengths: Vec<i64> = runs.iter().map(|r| r.1 as i64).collect();
    (PyBytes::new(py, as_bytes(&offsets)), PyBytes::new(py, as_bytes(&lengths)), resume).into_pyobject(py)
}

/// The slots of a `.qi` segment (whole slots only), classified, with the records of the used
/// ones and the slots the reader has findings about (`qi::Slots`): a dict of native-endian
/// arrays as bytes, `duplicates` as `(slot, first slot, location kind)` tuples.
#[pyfunction]
fn qi_slots<'py>(py: Python<'py>, slots: &Bound<'py, PyAny>, expiry_max: u64) -> PyResult<Bound<'py, PyDict>> {
    let view = View::new(slots)?;
    let d = qi::decode(view.slice(), expiry_max);
    drop(view);
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
    let view = View::new(data)?;
    let (ptr, len) = (view.ptr, view.len);
    let w = py.detach(move || {
        let bytes: &[u8] = if len == 0 { &[] } else { unsafe { std::slice::from_raw_parts(ptr as *const u8, len) } };
        ets::walk(bytes, start, max_items)
    });
    drop(view);
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

#[pymodule]
fn cqforensics_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ABI", ABI)?;
    m.add_function(wrap_pyfunction!(walk_rdq, m)?)?;
    m.add_function(wrap_pyfunction!(decode_messages, m)?)?;
    m.add_function(wrap_pyfunction!(check_qs, m)?)?;
    m.add_function(wrap_pyfunction!(qs_garbage, m)?)?;
    m.add_function(wrap_pyfunction!(qi_slots, m)?)?;
    m.add_function(wrap_pyfunction!(read_spans, m)?)?;
    m.add_function(wrap_pyfunction!(disk_log_items, m)?)?;
    Ok(())
}
