"""Reading a GGUF file's header: metadata and the tensor table.

Why not ``gguf.GGUFReader``: it parses every metadata array element into its
own numpy view, which takes ~15 s for a Qwen file (150k tokens + 150k
merges) before anything else can happen. The model index wants a summary in
milliseconds, and the importer wants clear messages for damaged files
instead of whatever numpy raises. The format is small and stable (spec:
ggml's docs/gguf.md), so this reads it with ``struct`` only: big arrays are
skipped unless asked for, and every read is bounds-checked against the file
size so a truncated file says so. Tensor *data* is still decoded by the
``gguf`` package (``gguf.quants.dequantize``); the tests check this reader
against ``GGUFReader``.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from specchat import records
from specchat.library.errors import LibraryError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF value types -> struct format (scalars); 8 = string, 9 = array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_STRING, _ARRAY = 8, 9


class TruncatedError(Exception):
    """The file ends before its header says it should (internal)."""


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table. ``dims`` are GGUF order (fastest first);
    the numpy/HF shape is ``dims`` reversed. ``offset`` is from the file start."""

    name: str
    dims: tuple[int, ...]
    type_id: int
    offset: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        return math.prod(self.dims)


@dataclass
class Header:
    """Everything before the tensor data.

    ``metadata`` holds scalars, strings and the arrays that were asked for;
    ``array_lengths`` has the length of every array, read or skipped.
    """

    path: Path
    shown: Path  # what messages call the file: the one the user gave
    version: int
    metadata: dict[str, object]
    array_lengths: dict[str, int]
    tensors: list[TensorInfo]
    data_offset: int
    file_size: int

    @functools.cached_property
    def _by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}

    def tensor(self, name: str) -> TensorInfo | None:
        return self._by_name.get(name)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "?"))


class _Cursor:
    """Reads little-endian values from ``buf`` (big-endian files are refused)."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise TruncatedError(start + n)
        self.pos = start + n
        return start

    def scalar(self, fmt: str):
        st = struct.Struct("<" + fmt)
        return st.unpack_from(self.buf, self.take(st.size))[0]

    def string(self) -> str:
        n = self.scalar("Q")
        start = self.take(n)
        return bytes(self.buf[start:start + n]).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        ln = struct.Struct("<Q")
        for _ in range(count):
            self.take(ln.unpack_from(self.buf, self.take(8))[0])

    def value(self, vtype: int, keep: bool):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item = self.scalar("I")
            count = self.scalar("Q")
            if not keep:
                if item == _STRING:
                    self.skip_strings(count)
                elif item in _SCALARS:
                    self.take(count * struct.calcsize(_SCALARS[item]))
                else:
                    for _ in range(count):
                        self.value(item, False)
                return count, None
            if item in _SCALARS:
                fmt = _SCALARS[item]
                st = struct.Struct(f"<{count}{fmt}")
                return count, list(st.unpack_from(self.buf, self.take(st.size)))
            return count, [self.value(item, True) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {vtype}")


def read_header(path: str | Path, arrays: Iterable[str] = (),
                shown: str | Path | None = None) -> Header:
    """Parse the header of ``path``; arrays named in ``arrays`` are read in
    full (others only counted). Raises LibraryError for anything that is not
    a complete, readable GGUF file, naming ``shown`` (default ``path``): the
    file the user gave, when ``path`` is a temporary or resolved one."""
    path = Path(path)
    where = Path(shown) if shown is not None else path
    keep = set(arrays)
    try:
        with records.open_file(path) as f:  # a regular file only: a FIFO would hang the read
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise LibraryError(f"{where} is not a GGUF file (only {size} bytes)")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                return _parse(path, where, buf, size, keep)
            except TruncatedError as exc:
                raise LibraryError(
                    f"{where} is truncated: its header needs at least {exc.args[0]:,} bytes but "
                    f"the file has {size:,}. The download or copy was probably cut short; "
                    "get the file again") from None
            except (ValueError, UnicodeDecodeError, struct.error, OverflowError) as exc:
                raise LibraryError(f"{where} is not a valid GGUF file ({exc})") from None
            finally:
                buf.close()
    except records.BadRecord as exc:
        raise LibraryError(f"{where} is broken: {exc}") from None
    except OSError as exc:
        raise LibraryError(f"Cannot read {where}: {exc.strerror or exc}") from exc


def _parse(path: Path, where: Path, buf, size: int, keep: set[str]) -> Header:
    if bytes(buf[:4]) != MAGIC:
        raise LibraryError(f"{where} is not a GGUF file (it does not start with 'GGUF')")
    version = struct.unpack_from("<I", buf, 4)[0]
    if struct.unpack_from(">I", buf, 4)[0] in (1, 2, 3):  # written on a big-endian machine
        raise LibraryError(f"{where} is a big-endian GGUF file; only little-endian is supported")
    if version == 0:  # what a file of zeros after the magic reads as
        raise LibraryError(f"{where} is not a valid GGUF file (its version is 0: the file is "
                           "damaged)")
    if version not in (2, 3):
        raise LibraryError(f"{where}: GGUF version {version} is not supported (only 2 and 3)")
    cur = _Cursor(buf, size)
    cur.pos = 8
    n_tensors = cur.scalar("Q")
    n_kv = cur.scalar("Q")
    if n_tensors > size or n_kv > size:
        raise ValueError("implausible tensor or key counts")
    metadata: dict[str, object] = {}
    lengths: dict[str, int] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.scalar("I")
        value = cur.value(vtype, key in keep)
        if vtype == _ARRAY:
            lengths[key], value = value
            if value is None:
                continue
        metadata[key] = value
    infos: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.scalar("I")
        if n_dims > 8:
            raise ValueError(f"tensor {name!r} has {n_dims} dimensions")
        dims = tuple(cur.scalar("Q") for _ in range(n_dims))
        type_id = cur.scalar("I")
        offset = cur.scalar("Q")
        infos.append((name, dims, type_id, offset))
    align = metadata.get("general.alignment", DEFAULT_ALIGNMENT) or DEFAULT_ALIGNMENT
    if isinstance(align, bool) or not isinstance(align, int) or align < 0 or align % 8:
        raise ValueError(f"general.alignment is {align!r}, not a positive multiple of 8")
    data_offset = -(-cur.pos // align) * align
    tensors = [TensorInfo(n, d, t, data_offset + o) for n, d, t, o in infos]
    return Header(path=path, shown=where, version=version, metadata=metadata, array_lengths=lengths,
                  tensors=tensors, data_offset=data_offset, file_size=size)


def tensor_nbytes(info: TensorInfo) -> int:
    """Bytes of a tensor's data in the file (needs the gguf package's sizes)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    qtype = GGMLQuantizationType(info.type_id)
    block, type_size = GGML_QUANT_SIZES[qtype]
    if not info.dims or info.dims[0] % block:
        raise LibraryError(
            f"tensor {info.name!r}: row length {info.dims[0] if info.dims else 0} is not a "
            f"multiple of the {qtype.name} block size {block}")
    return info.n_elements // block * type_size
