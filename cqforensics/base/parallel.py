"""Every core: a list of tasks run in forked worker processes, their results handed back in
task order, so that the output of ``-j N`` is that of ``-j 1``, in the same order.

``ordered(tasks, work, jobs)`` forks ``jobs`` workers from the calling process as it is (each
inherits what the caller computed so far: a vhost's store index, the node's metadata, copied
only where written), hands each task to the next idle worker, and yields the items ``work(task)``
yields, task by task in order. A worker's items travel back pickled through a pipe; those of a
task that is not yet the next one wait in the worker's pipe and a bounded buffer (``buffer``
bytes a worker), then the worker itself waits: memory stays flat however far a worker gets
ahead.

Errors: an exception in a worker ends the whole map with the same error in the caller (a
``CQError`` as the same type and message, anything else as ``WorkerError`` with the worker's
traceback, a bug), at that task's place in the order: what came before it is yielded first,
as ``-j 1`` would have. Ctrl-C and SIGTERM reach only the caller (workers ignore SIGINT, and die
with their parent: PR_SET_PDEATHSIG); leaving the generator for any reason, an error, an
interrupt or a consumer that stops early, kills and reaps every worker: no orphan, no zombie.

Only for the CLI and callers that opt in (``jobs > 1``): a fork copies one thread of a process,
so a library must not fork behind its caller's back (a Spark worker, a threaded server).
"""

from __future__ import annotations

import mmap
import os
import pickle
import selectors
import signal
import socket
import struct
import sys
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from cqforensics.base.errors import CQError, OperationalError

_FRAME = struct.Struct("<iBI")  # task index, kind, number of out-of-band buffers (then their lengths)
_ITEM, _DONE, _ERROR = 0, 1, 2
_TASK = struct.Struct("<i")
#: the bytes a result message carries itself; a bigger item goes in a memfd whose descriptor it
#: carries instead (its arrays' buffers written once, mapped by the caller: no copy on the way)
INLINE = 1 << 15
#: result bytes a worker may have waiting in the caller before its pipe is left to fill
BUFFER = 64 << 20
#: the most workers the default (``default_jobs``) starts: each holds its own share of a vhost's state
MAX_DEFAULT_JOBS = 8


#: set in a worker: a map it runs (a task that would split its work) runs in the worker itself,
#: so that ``-j N`` never means more than N processes
_IN_WORKER = False


class WorkerError(OperationalError):
    """An unexpected exception in a worker (a bug); ``details`` is its traceback."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_jobs() -> int:
    """The CLI's ``-j`` when none is given: every usable CPU, at most ``MAX_DEFAULT_JOBS``."""
    return min(usable_cpus(), MAX_DEFAULT_JOBS)


def ordered(tasks: Iterable, work: Callable[[object], Iterable], jobs: int, *, buffer: int = BUFFER) -> Iterator:
    """The items of ``work(task)`` for every task, in task order, computed by ``jobs`` forked
    workers (in this process when ``jobs`` < 2 or there is one task). See the module doc."""
    tasks = list(tasks)
    if jobs < 2 or len(tasks) < 2 or _IN_WORKER or not hasattr(os, "fork"):
        for t in tasks:
            yield from work(t)
        return
    pool = _Pool(tasks, work, min(jobs, len(tasks)), buffer)
    try:
        yield from pool.results()
    finally:
        pool.stop()


def started(tasks: Iterable, work: Callable[[object], Iterable], jobs: int, *, buffer: int = BUFFER) -> Iterator:
    """``ordered``, its ``jobs`` workers (one at least) at work from now on: work that overlaps
    what the caller does before it takes the items (its own maps included). Iterate the result
    to take them, in task order; until then a worker that gets ``buffer`` bytes ahead waits.
    Leaving the iterator early, or never iterating it and dropping it, stops the workers. In a
    worker, or without ``fork``, the tasks run in this process when the items are taken."""
    tasks = list(tasks)
    if not tasks or _IN_WORKER or not hasattr(os, "fork"):
        return ordered(tasks, work, 1, buffer=buffer)
    pool = _Pool(tasks, work, max(1, min(jobs, len(tasks))), buffer)
    pool.start()
    return _Started(pool)


class _Started:
    """The items of a started pool, taken once by iterating; its workers are stopped when they
    are all taken, when the iteration is left, or when this is dropped untaken."""

    def __init__(self, pool: _Pool):
        self._pool: _Pool | None = pool

    def __iter__(self) -> Iterator:
        if self._pool is None:
            raise RuntimeError("the items of a started map are taken once")
        try:
            yield from self._pool.results()
        finally:
            self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool = None

    __del__ = close


class _Worker:
    __slots__ = ("pid", "tasks", "results", "task", "pending", "pending_bytes", "done", "paused")

    def __init__(self, pid: int, tasks: int, results: socket.socket):
        self.pid, self.tasks, self.results = pid, tasks, results
        self.task: int | None = None  # the task it runs
        self.pending: dict[int, deque] = {}  # task -> (kind, item or error, bytes) read, not yet handed on
        self.pending_bytes = 0
        self.done: set[int] = set()  # tasks it finished whose items are not all handed on
        self.paused = False  # its socket is left to fill (its buffer is full)


class _Pool:
    def __init__(self, tasks: list, work: Callable, jobs: int, buffer: int):
        self.tasks, self.buffer = tasks, buffer
        self.workers: list[_Worker] = []
        self.owner: dict[int, _Worker] = {}  # task -> the worker that runs (or ran) it
        self.next_task = 0
        self._current = 0  # the task whose items are handed on now
        self._started = False  # the workers have their first tasks
        sys.stdout.flush()  # nothing buffered in the caller is written twice by a child
        sys.stderr.flush()
        for _ in range(jobs):
            self.workers.append(self._fork(work))

    def _fork(self, work: Callable) -> _Worker:
        task_r, task_w = os.pipe()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            try:
                os.close(task_w)
                mine.close()
                for w in self.workers:  # the other workers' ends belong to the caller
                    os.close(w.tasks)
                    w.results.close()
                _worker(self.tasks, work, task_r, theirs)
            finally:
                os._exit(0)
        os.close(task_r)
        theirs.close()
        mine.setblocking(False)
        return _Worker(pid, task_w, mine)

    def _assign(self, w: _Worker) -> None:
        if self.next_task < len(self.tasks):
            w.task = self.next_task
            self.owner[w.task] = w
            self.next_task += 1
            os.write(w.tasks, _TASK.pack(w.task))
        else:
            w.task = None

    def start(self) -> None:
        """Hand each worker its first task (``results`` does it when this was not called)."""
        if not self._started:
            self._started = True
            for w in self.workers:
                self._assign(w)

    def results(self) -> Iterator:
        sel = selectors.DefaultSelector()
        self.start()
        for w in self.workers:
            sel.register(w.results, selectors.EVENT_READ, w)
        current = self._current = 0
        while current < len(self.tasks):
            self._current = current
            w = self.owner.get(current)
            # hand on what the current task's worker has read already
            while w is not None and w.pending.get(current):
                kind, obj, size = w.pending[current].popleft()
                w.pending_bytes -= size
                if w.paused and w.pending_bytes < self.buffer:
                    sel.register(w.results, selectors.EVENT_READ, w)
                    w.paused = False
                if kind == _ERROR:
                    raise _error(obj)
                yield obj
            if w is not None and current in w.done and not w.pending.get(current):
                w.done.discard(current)
                w.pending.pop(current, None)
                current += 1
                continue
            for key, _ in sel.select():
                self._read(key.data, sel)

    def _read(self, w: _Worker, sel) -> None:
        """Read one message of a worker: a frame, its item inline or in the memfd it carries."""
        try:
            data, fds, _, _ = socket.recv_fds(w.results, INLINE + (1 << 12), 1)
        except BlockingIOError:
            return
        if not data:
            for fd in fds:
                os.close(fd)
            self._ended(w)
        task, kind, nbufs = _FRAME.unpack_from(data)
        if kind == _DONE:
            w.done.add(task)
            self._assign(w)
            return
        lengths = struct.unpack_from(f"<{nbufs + 1}Q", data, _FRAME.size)  # the pickle's, then each buffer's
        at = _FRAME.size + 8 * (nbufs + 1)
        if fds:
            with os.fdopen(fds[0], "rb") as f:  # mapped, then closed: the map keeps the pages
                region = memoryview(mmap.mmap(f.fileno(), sum(lengths), access=mmap.ACCESS_READ))
            at = 0
        else:
            region = memoryview(data)
        parts = []
        for n in lengths:
            parts.append(region[at : at + n])
            at += n
        obj = pickle.loads(parts[0], buffers=parts[1:])
        size = sum(lengths)
        w.pending.setdefault(task, deque()).append((kind, obj, size))
        w.pending_bytes += size
        if w.pending_bytes >= self.buffer and not w.paused and task != self._current:
            sel.unregister(w.results)
            w.paused = True

    def _ended(self, w: _Worker):
        raise OperationalError(
            f"a worker process (pid {w.pid}) ended before it sent its results ({_how_it_ended(w.pid)})"
        )

    def stop(self) -> None:
        """Kill and reap every worker, close every pipe (also when the caller stops early)."""
        for w in self.workers:
            try:
                os.close(w.tasks)
            except OSError:
                pass
            w.results.close()
            try:
                os.kill(w.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for w in self.workers:
            try:
                os.waitpid(w.pid, 0)
            except ChildProcessError:
                pass
        self.workers = []


def _how_it_ended(pid: int) -> str:
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return "already reaped"
    if not done:
        return "still running"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return f"killed by signal {sig}" + (" (out of memory?)" if sig == signal.SIGKILL else "")
    return f"exit status {os.WEXITSTATUS(status)}"


def _worker(tasks: list, work: Callable, task_r: int, out: socket.socket) -> None:
    """A worker's life: run the tasks the caller hands it, send their items back."""
    global _IN_WORKER
    _IN_WORKER = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    _die_with_parent()
    while True:
        raw = os.read(task_r, _TASK.size)
        if len(raw) < _TASK.size:  # the caller closed the pipe: no more tasks
            return
        (k,) = _TASK.unpack(raw)
        try:
            for item in work(tasks[k]):
                _send(out, k, _ITEM, item)
        except BaseException as e:  # noqa: BLE001 (every failure goes back to the caller)
            _send(out, k, _ERROR, _describe(e))
        out.sendall(_FRAME.pack(k, _DONE, 0))


def _send(out: socket.socket, task: int, kind: int, obj) -> None:
    """One item as one message: its pickle and out-of-band buffers inline when small, else
    written into a memfd whose descriptor the message carries."""
    bufs: list = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    views = [b.raw() for b in bufs]
    head = _FRAME.pack(task, kind, len(views)) + struct.pack(
        f"<{len(views) + 1}Q", len(data), *(v.nbytes for v in views)
    )
    if len(head) + len(data) + sum(v.nbytes for v in views) <= INLINE:
        out.sendall(b"".join([head, data, *views]))
        return
    fd = _memfd()
    try:
        for part in [data, *views]:
            view = memoryview(part).cast("B")
            while view:
                view = view[os.write(fd, view) :]
        socket.send_fds(out, [head], [fd])
    finally:
        os.close(fd)


def _memfd() -> int:
    """An anonymous file in memory (memfd; an unlinked temporary file where there is none)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("cqforensics-result", getattr(os, "MFD_CLOEXEC", 0))
    import tempfile

    fd, path = tempfile.mkstemp(prefix="cqf-result-")
    os.unlink(path)
    return fd


def _describe(e: BaseException) -> tuple:
    """An exception as the caller will raise it: a ``CQError`` itself (pickled: its type, message
    and exit code), anything else (a bug) as its type, message and traceback text."""
    if isinstance(e, CQError):
        try:
            return ("cq", pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception:  # noqa: BLE001 (an error that does not pickle goes as its text)
            return ("text", str(e), e.exit_code)
    return ("bug", type(e).__qualname__, " ".join(str(e).split()), "".join(traceback.format_exception(e)))


def _error(desc: tuple) -> BaseException:
    """The caller's exception for a worker's (``_describe``)."""
    if desc[0] == "cq":
        return pickle.loads(desc[1])
    if desc[0] == "text":
        e = OperationalError(desc[1])
        e.exit_code = desc[2]
        return e
    _, name, message, tb = desc
    return WorkerError(f"{name}{': ' + message if message else ''}", tb)


def _die_with_parent() -> None:
    """Ask the kernel to kill this worker when its parent dies (Linux PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before the prctl took
        os._exit(1)
