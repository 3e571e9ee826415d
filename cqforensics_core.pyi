"""Type stub of the compiled core ``cqforensics_core`` (Rust, PyO3: ``core/src/bindings.rs``).

Every public name of the module, with its signature; tests/codecs/test_core_stub.py checks this file
names exactly the module's public names, and each function's parameters as the module reports
them (``__text_signature__``). Buffers are read through the buffer protocol without a copy
(bytes, mmap, memoryview, numpy arrays of the item type named); the Python side
(``cqforensics/compiled/__init__.py``) turns the results into numpy arrays and Arrow columns.
"""

from collections.abc import Callable

from typing_extensions import Buffer

#: bumped whenever a function's arguments or results change (cqforensics.compiled refuses another)
ABI: int
#: whether this is a debug build (about 10x slower: ``cqforensics.compiled.status`` says so)
DEBUG: bool

class VarColumn:
    """An Arrow column of variable-length values (binary, string)."""

    @property
    def validity(self) -> bytes: ...  # one bit a row; unused when null_count is 0
    @property
    def null_count(self) -> int: ...
    @property
    def offsets(self) -> bytes: ...  # int32, rows + 1
    @property
    def data(self) -> Buffer: ...  # bytes, or the pyarrow.Buffer the caller's alloc made

class NumColumn:
    """An Arrow column of fixed-width numbers."""

    @property
    def validity(self) -> bytes: ...
    @property
    def null_count(self) -> int: ...
    @property
    def values(self) -> bytes: ...  # native-endian

class ListColumn:
    """An Arrow list<string> column."""

    @property
    def validity(self) -> bytes: ...
    @property
    def null_count(self) -> int: ...
    @property
    def offsets(self) -> bytes: ...  # int32 positions in items, rows + 1
    @property
    def items(self) -> VarColumn: ...

class StructColumn:
    """The validity of an Arrow struct column."""

    @property
    def validity(self) -> bytes: ...
    @property
    def null_count(self) -> int: ...

class RdqWalk:
    """One ``.rdq`` file walked."""

    @property
    def offsets(self) -> bytes: ...  # int64, one per entry
    @property
    def totals(self) -> bytes: ...  # int64
    @property
    def ids(self) -> bytes: ...  # 16 bytes per entry
    @property
    def hole_offsets(self) -> bytes: ...  # int64, one per hole
    @property
    def hole_lengths(self) -> bytes: ...  # int64
    @property
    def hole_kinds(self) -> bytes: ...  # one byte per hole: a position in readers.rdq.HOLE_KINDS
    @property
    def torn(self) -> list[tuple[int, int, bytes]]: ...  # (offset, total, id)
    @property
    def rejected(self) -> list[tuple[int, int, bytes, str, int]]: ...  # (offset, total, id, reason, hidden)

class GarbageRuns:
    """Garbage runs of a ``.qs`` segment."""

    @property
    def offsets(self) -> bytes: ...  # int64
    @property
    def lengths(self) -> bytes: ...  # int64
    @property
    def resume(self) -> int | None: ...  # where to call again when the limit cut the scan short

def walk_rdq(
    data: Buffer,
    extents: list[tuple[int, int]] | None = None,
    referenced: Buffer | None = None,
    mapped: bool = False,
    directory: Buffer | None = None,
) -> RdqWalk: ...
def decode_messages(
    sources: list[Buffer | int],
    file_ix: Buffer,
    starts: Buffer,
    lens: Buffer,
    index_ids: Buffer,
    has_id: Buffer,
    want_body: bool,
    body_alloc: Callable[[int], Buffer],
    map_files: bool = True,
) -> dict[str, VarColumn | NumColumn | ListColumn | StructColumn | bytes]: ...
def read_spans(
    sources: list[Buffer | int], file_ix: Buffer, starts: Buffer, lens: Buffer, alloc: Callable[[int], Buffer]
) -> VarColumn: ...
def check_qs(data: Buffer, offsets: Buffer, sizes: Buffer) -> bytes: ...
def qs_garbage(
    data: Buffer, start: int, holes: list[tuple[int, int]], limit: int, mapped: bool = False
) -> GarbageRuns: ...
def qi_slots(slots: Buffer, expiry_max: int) -> dict[str, bytes | list[tuple[int, int, int]]]: ...
def disk_log_items(data: Buffer, start: int = ..., max_items: int = ...) -> dict[str, object]: ...
def decode_term(
    data: Buffer,
    pos: int,
    makers: tuple[
        Callable[[bytes, bool], str], Callable[[int, bytes], object], Callable[[list, object], object], Callable
    ],
) -> tuple[object, int] | None: ...
def decode_fields(
    data: Buffer,
    starts: list[int],
    limit: int,
    wanted: list[int],
    makers: tuple[
        Callable[[bytes, bool], str], Callable[[int, bytes], object], Callable[[list, object], object], Callable
    ],
) -> list[tuple[tuple, int] | None]: ...
def decode_terms(
    datas: list[Buffer],
    pos: int,
    makers: tuple[
        Callable[[bytes, bool], str], Callable[[int, bytes], object], Callable[[list, object], object], Callable
    ],
) -> list[object | None]: ...
