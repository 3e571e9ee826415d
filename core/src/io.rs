//! The core's file I/O: where a batch's byte spans are (`Source`: a buffer, or a file Python
//! holds open), and how they are read (`Spans`): through a map of the file (`FileMap`), a run
//! of nearby spans by one `preadv` straight to where they go (`Spans::read_run`), or a window
//! of nearby spans read at once (`Window`). Every system call the core makes is here, each
//! behind one small helper that says why it is sound; nothing here knows Python.

use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::fs::FileExt;

/// A file Python holds open (its descriptor), for one call: a duplicate of the descriptor, so
/// that every later use of it is safe code and closes only the duplicate.
pub fn borrow_file(fd: RawFd) -> std::io::Result<File> {
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: the descriptor is used only here, to duplicate it at once (a number that is not
    // open fails the dup with EBADF); the caller holds it open for the call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    Ok(File::from(fd.try_clone_to_owned()?))
}

/// The size of the system's memory pages.
fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system; it touches no memory of ours
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize
}

/// Drops the process's pages of `[addr, addr + len)`, rounded inwards to whole pages
/// (`madvise(MADV_DONTNEED)`, like the reader's `files.drop_pages`). The range must lie in a
/// read-only shared map of a file (`FileMap`; the scan `rdq::pager` follows, enabled only for a
/// buffer the caller says is such a map): there the bytes read the same afterwards, faulted
/// back in from the page cache, so no borrow of them sees a change (on heap memory the pages
/// would read as zeros). A failure only means the pages stay.
pub(crate) fn drop_pages(addr: usize, len: usize) {
    let page = page_size();
    let (a, b) = (addr.div_ceil(page) * page, (addr + len) / page * page);
    if b > a {
        // SAFETY: advice on a range of a read-only shared file map (above), which stays mapped
        unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_DONTNEED) };
    }
}

/// A read-only map of a whole file, unmapped when dropped.
pub struct FileMap {
    ptr: *mut libc::c_void,
    len: usize,
}

impl FileMap {
    pub fn new(file: &File, len: u64) -> Option<FileMap> {
        let len = usize::try_from(len).ok().filter(|&n| n > 0)?;
        // SAFETY: a fresh read-only shared map of an open file, owned by the FileMap until it is
        // dropped
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        (ptr != libc::MAP_FAILED).then_some(FileMap { ptr, len })
    }

    /// Drops the pages mapped so far (they are faulted in again from the page cache if read).
    pub fn drop_pages(&self) {
        drop_pages(self.ptr as usize, self.len);
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: mapped for `len` bytes, read-only, until dropped, and never written by us (a
        // file cut meanwhile makes reads past its new end fault, as the walk's maps of the same
        // files would)
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: the map made in `new`; `bytes` borrows the FileMap, so no slice of it is left
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Most pieces one `preadv` takes (Linux's UIO_MAXIOV).
const MAX_IOV: usize = 1024;

/// One scattered read: consecutive bytes of a file into pieces of `out` (taken one after
/// another from its start) and of `gap` (bytes to skip, each piece read over the same
/// scratch), by one `preadv`.
pub struct Scatter<'a> {
    // the buffers' pointers, each taken once (every piece derives from them), and lengths
    out: (*mut u8, usize),
    gap: (*mut u8, usize),
    put: usize,
    iov: Vec<libc::iovec>,
    _borrows: std::marker::PhantomData<&'a mut [u8]>,
}

impl<'a> Scatter<'a> {
    pub fn new(out: &'a mut [u8], gap: &'a mut [u8]) -> Scatter<'a> {
        let (out, gap) = ((out.as_mut_ptr(), out.len()), (gap.as_mut_ptr(), gap.len()));
        Scatter { out, gap, put: 0, iov: Vec::with_capacity(64), _borrows: std::marker::PhantomData }
    }

    /// Whether two more pieces fit in one call.
    pub fn has_room(&self) -> bool {
        self.iov.len() + 2 <= MAX_IOV
    }

    /// The next `skip` bytes of the file are skipped (read into `gap`), the `take` after them go
    /// to the next `take` bytes of `out`; false (nothing added) when `gap` is shorter than
    /// `skip` or `out` has fewer than `take` bytes left.
    pub fn push(&mut self, skip: usize, take: usize) -> bool {
        if skip > self.gap.1 || take > self.out.1 - self.put {
            return false;
        }
        if skip > 0 {
            self.iov.push(libc::iovec { iov_base: self.gap.0.cast(), iov_len: skip });
        }
        if take > 0 {
            self.iov.push(libc::iovec { iov_base: self.out.0.wrapping_add(self.put).cast(), iov_len: take });
        }
        self.put += take;
        true
    }

    /// Reads the pieces from `offset` of `file`; whether all their bytes came.
    pub fn read(self, file: &File, offset: u64) -> bool {
        let want: usize = self.iov.iter().map(|v| v.iov_len).sum();
        let Ok(from) = libc::off_t::try_from(offset) else { return false };
        // SAFETY: every piece lies inside `out` or `gap` (checked by `push`), which
        // this Scatter borrows mutably until the call returns; pieces of `out` do not overlap
        // (`gap`'s may: its bytes are thrown away)
        let got = unsafe { libc::preadv(file.as_raw_fd(), self.iov.as_ptr(), self.iov.len() as i32, from) };
        got >= 0 && got as usize == want
    }
}

/// `buf.len()` bytes of `file` from `offset`, fewer where the file ends first or a read fails
/// (a term cut short, as a slice past a buffer's end is).
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> usize {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    got
}

/// Where a batch's byte spans are: a buffer (bytes, a map), or a file open for reading.
/// `Spans` maps such a file for the call (`FileMap`: each span is then copied once, from the
/// page cache to where it goes), or reads it with `preadv` straight to where it goes
/// (`Spans::read_run`); the window of `pread`s is the way left when neither can.
pub enum Source<'a> {
    Mem(&'a [u8]),
    File(File, u64), // the file, its size
}

impl Source<'_> {
    /// A file Python holds open (`borrow_file`), with its size.
    pub fn file(fd: RawFd) -> std::io::Result<Source<'static>> {
        let file = borrow_file(fd)?;
        let size = file.metadata()?.len();
        Ok(Source::File(file, size))
    }

    /// The length of row's span `[start, start + len)` once cut where the source ends (an
    /// index may claim any length: never more room than the file holds).
    pub fn cut(&self, start: i64, len: i64) -> usize {
        let size = match self {
            Source::Mem(v) => v.len() as u64,
            Source::File(_, size) => *size,
        };
        (len.max(0) as u64).min(size.saturating_sub(start.max(0) as u64)) as usize
    }
}

thread_local! {
    /// The read window's buffer, kept between calls so it keeps its capacity.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// At most this many bytes are read from a file at once for the spans of consecutive rows...
const WINDOW: usize = 1 << 20;
/// ...spanning at most this many bytes no row uses between two of them (dead entries, another
/// queue's or another share's messages): one read per run of nearby spans, not one per span. A
/// read costs a system call, about as much as copying a few kilobytes: a wider gap would read
/// more bytes than it saves in calls (a read in P shares would read every byte P times).
pub const WINDOW_GAP: u64 = 4 << 10;

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

    fn fill(&mut self, f: &File, file: i32, at: u64, len: usize) {
        self.bytes.resize(len, 0);
        let got = read_at(f, &mut self.bytes, at);
        self.bytes.truncate(got);
        (self.file, self.start) = (file, at);
    }

    /// A row's span: its bytes in the window, cut where the file ended
    fn span(&self, at: u64, len: usize) -> &[u8] {
        let s = ((at - self.start) as usize).min(self.bytes.len());
        &self.bytes[s..(s + len).min(self.bytes.len())]
    }
}

/// Where one read for row `k`'s span (from `at`, ending at `end`) stops: it takes in the spans
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

/// The maps' pages are dropped every this many rows read through them: each row faults in up to
/// 64 KiB around its span (the kernel's fault-around), so rows lying apart (a share's, or a
/// compacted store's) would otherwise hold a batch's worth of such pages at once.
const ROWS_PER_DROP: usize = 256;

/// Byte spans of files, row by row: row k is `[starts[k], starts[k] + lens[k])` of
/// `sources[file_ix[k]]` (cut where it ends; none when `file_ix[k] < 0`); a file's spans are read
/// a run of nearby spans at a time (`Window`, `read_run`).
pub struct Spans<'a> {
    sources: Vec<Source<'a>>,
    file_ix: &'a [i32],
    starts: &'a [i64],
    lens: &'a [i64],
    window: Window,
    /// read files through a map of each (made at its first row, unmapped when done) rather
    /// than into the window: the bytes are then copied once, from the page cache to where
    /// they go, instead of twice
    pub map_files: bool,
    maps: Vec<Option<Option<FileMap>>>, // per source: not tried yet, or the map if one could be made
    /// rows read through the maps since their pages were last dropped
    mapped_rows: usize,
}

/// The arguments of a `Spans` differ in length.
#[derive(Debug)]
pub struct LengthMismatch;

impl<'a> Spans<'a> {
    pub fn new(
        sources: Vec<Source<'a>>,
        file_ix: &'a [i32],
        starts: &'a [i64],
        lens: &'a [i64],
        map_files: bool,
    ) -> Result<Spans<'a>, LengthMismatch> {
        if starts.len() != file_ix.len() || lens.len() != file_ix.len() {
            return Err(LengthMismatch);
        }
        let window = Window { bytes: SCRATCH.with(|cell| cell.take()), file: -1, start: 0 };
        let maps = sources.iter().map(|_| None).collect();
        Ok(Spans { sources, file_ix, starts, lens, window, map_files, maps, mapped_rows: 0 })
    }

    pub fn len(&self) -> usize {
        self.file_ix.len()
    }

    pub fn is_empty(&self) -> bool {
        self.file_ix.is_empty()
    }

    fn source(&self, k: usize) -> Option<&Source<'a>> {
        usize::try_from(self.file_ix[k]).ok().and_then(|f| self.sources.get(f))
    }

    /// Row k's length, cut where its source ends (0 without one).
    pub fn cut_len(&self, k: usize) -> usize {
        self.source(k).map_or(0, |f| f.cut(self.starts[k], self.lens[k]))
    }

    /// The bytes of every span together (each cut where its file ends).
    pub fn total(&self) -> usize {
        (0..self.len()).map(|k| self.cut_len(k)).fold(0usize, usize::saturating_add)
    }

    /// Row k's bytes, None when it has no file.
    pub fn span(&mut self, k: usize) -> Option<&[u8]> {
        let ix = usize::try_from(self.file_ix[k]).ok()?;
        let f = self.sources.get(ix)?;
        let slice = |data: &'_ [u8]| {
            let s = (self.starts[k].max(0) as usize).min(data.len());
            (s, s.saturating_add(self.lens[k].max(0) as usize).min(data.len()))
        };
        if let (Source::File(file, size), true) = (f, self.map_files) {
            self.mapped_rows += 1;
            if self.mapped_rows > ROWS_PER_DROP {
                self.maps.iter().flatten().flatten().for_each(FileMap::drop_pages);
                self.mapped_rows = 1;
            }
            if let Some(m) = self.maps[ix].get_or_insert_with(|| FileMap::new(file, *size)) {
                let (s, e) = slice(m.bytes());
                return Some(&m.bytes()[s..e]);
            }
        }
        match f {
            Source::Mem(v) => {
                let (s, e) = slice(v);
                Some(&v[s..e])
            }
            Source::File(file, _) => {
                let len = f.cut(self.starts[k], self.lens[k]);
                let at = self.starts[k].max(0) as u64;
                if !self.window.holds(self.file_ix[k], at, len) {
                    let end = window_end(self.file_ix, self.starts, self.lens, f, k, at + len as u64);
                    self.window.fill(file, self.file_ix[k], at, (end - at) as usize);
                }
                Some(self.window.span(at, len))
            }
        }
    }

    /// Rows k..j of one file, in order, each within `WINDOW_GAP` of the one before and all within
    /// `WINDOW` of row k's start (row k however long): read by one `preadv` straight into `out`,
    /// row after row, the gaps between rows into `gap` (at least `WINDOW_GAP` bytes). Returns j,
    /// or None when row k is not in a file or the read came short (a file cut meanwhile).
    pub fn read_run(&self, k: usize, out: &mut [u8], gap: &mut [u8]) -> Option<usize> {
        let f = self.source(k)?;
        let Source::File(file, _) = f else { return None };
        let at = self.starts[k].max(0) as u64;
        let (mut end, mut j) = (at, k);
        let mut scatter = Scatter::new(out, gap);
        while j < self.len() && scatter.has_room() && self.file_ix[j] == self.file_ix[k] {
            let (s, l) = (self.starts[j].max(0) as u64, f.cut(self.starts[j], self.lens[j]));
            if s < end || s - end > WINDOW_GAP || (j > k && s + l as u64 - at > WINDOW as u64) {
                break;
            }
            if !scatter.push((s - end) as usize, l) {
                break;
            }
            (end, j) = (s + l as u64, j + 1);
        }
        (j > k && scatter.read(file, at)).then_some(j)
    }

    /// Every row's bytes one after another into `out` (at least `total()` bytes long); calls
    /// `row(length)` for each row, None for one without a source.
    pub fn read_all(&mut self, out: &mut [u8], mut row: impl FnMut(Option<usize>)) {
        let mut at_out = 0usize;
        let mut gap = vec![0u8; WINDOW_GAP as usize];
        let mut k = 0;
        while k < self.len() {
            // runs of a file's rows go straight from the file into the column (one copy, not two)
            if let Some(j) = self.read_run(k, &mut out[at_out..], &mut gap) {
                for r in k..j {
                    let len = self.cut_len(r);
                    at_out += len;
                    row(Some(len));
                }
                k = j;
                continue;
            }
            let got = self.span(k);
            if let Some(b) = got {
                out[at_out..at_out + b.len()].copy_from_slice(b);
                at_out += b.len();
            }
            row(got.map(<[u8]>::len));
            k += 1;
        }
    }
}

impl Drop for Spans<'_> {
    /// The window's buffer is kept for the next call (a huge span's room is not).
    fn drop(&mut self) {
        let mut scratch = std::mem::take(&mut self.window.bytes);
        if scratch.capacity() > 4 * WINDOW {
            scratch = Vec::new();
        }
        scratch.clear();
        SCRATCH.with(|cell| cell.replace(scratch));
    }
}
