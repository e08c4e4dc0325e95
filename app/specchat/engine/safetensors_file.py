"""safetensors files read without MLX: the header, checked as the format
requires, and the values of small tensors.

The one reader of the format for the engine and the library (a model's
import check, a draft head's and an MTP head's shapes, a head's vocabulary
map): a file is opened only if it is a regular file (``records.open_file``:
a FIFO in its place would block the reader forever), its header's length is
bounded before it is read, and its tensors must tile the data area exactly
(a download cut short shows as tensors needing more bytes than the file
has). Shapes come from here, never from reading a tensor, so a config is
checked against its weights in milliseconds, whatever sizes it states.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specchat import records
from specchat.engine.errors import EngineError
from specchat.errors import SpecChatError

HEADER_MAX = 100_000_000  # bytes of a safetensors header (its JSON) read at most

# safetensors dtypes and their sizes in bytes (safetensors' README).
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "I16": 2,
               "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}

# The dtypes whose values ``read_values`` reads, as struct formats
# (little-endian, as safetensors stores them); BF16 is read as the top half
# of a float32.
_VALUE_FORMATS = {"BOOL": "B", "U8": "B", "I8": "b", "I16": "h", "U16": "H", "I32": "i",
                  "U32": "I", "I64": "q", "U64": "Q", "F16": "e", "F32": "f", "F64": "d",
                  "BF16": "H"}
WHOLE_DTYPES = frozenset({"BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64"})
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})


@dataclass(frozen=True)
class Tensor:
    """One entry of a safetensors header (offsets are into the data area)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int
    file: str  # the shard's file name, for messages


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"tensor {key!r} is listed twice")
        out[key] = value
    return out


def header(path: Path, error: type[SpecChatError] = EngineError,
           shown: Path | None = None) -> tuple[dict, int]:
    """(the JSON header of a safetensors file, the bytes of its data area):
    tensor name -> {"dtype", "shape", "data_offsets"}, ``__metadata__`` left
    out. Its length is bounded before it is read, and a file cut short
    before its header ends is said to be. Messages name ``shown`` (the file
    as the person gave it)."""
    shown = shown or path
    try:
        with records.open_file(path) as f:
            size = f.seek(0, 2)
            f.seek(0)
            raw = f.read(8)
            if len(raw) != 8:
                raise error(f"{shown} is not a safetensors file (only {len(raw)} bytes)")
            (n,) = struct.unpack("<Q", raw)
            if n > HEADER_MAX:
                raise error(f"{shown} is not a safetensors file (its header length {n:,} is "
                            "implausible)")
            if 8 + n > size:
                raise error(f"{shown} is truncated: its header needs {8 + n:,} bytes but the "
                            f"file has {size:,}. The download or copy was probably cut short; "
                            "get it again")
            blob = f.read(n)
    except records.BadRecord as exc:
        raise error(f"{shown} is broken: {exc}") from None
    except OSError as exc:
        raise error(f"Cannot read {shown}: {exc.strerror or exc}") from exc
    try:
        found = json.loads(blob, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise error(f"{shown} is not a valid safetensors file (its header is nested too "
                    "deeply to read)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{shown} is not a valid safetensors file (its header is not valid JSON: "
                    f"{exc})") from None
    if not isinstance(found, dict):
        raise error(f"{shown} is not a valid safetensors file (its header is not a JSON "
                    "object)")
    found.pop("__metadata__", None)
    return found, size - 8 - n


def read(path: Path, error: type[SpecChatError] = EngineError,
         shown: Path | None = None) -> dict[str, Tensor]:
    """Every tensor of one safetensors file, after checking what the format
    requires: a header that fits in the file, known dtypes, shapes of whole
    numbers, each tensor's bytes = its shape times its dtype size, and the
    tensors tiling the data area exactly (no overlap, no gap, nothing
    missing at the end, which is how a cut-short download shows)."""
    shown = shown or path
    found, data = header(path, error, shown)
    tensors = {name: _tensor(name, info, path.name, shown, error)
               for name, info in found.items()}
    at, last = 0, None
    for t in sorted(tensors.values(), key=lambda t: (t.start, t.end)):
        if t.start < at:
            raise error(f"{shown} is damaged: tensor {t.name!r} overlaps {last!r} "
                        f"(bytes {t.start:,}-{t.end:,} of the data)")
        if t.start > at:
            raise error(f"{shown} is damaged: {t.start - at:,} bytes before tensor "
                        f"{t.name!r} belong to no tensor")
        at, last = t.end, t.name
    if at > data:
        raise error(
            f"{shown} is truncated: its tensors need {at:,} bytes of data but the file has "
            f"{data:,}. The download or copy was probably cut short; get it again")
    if at < data:
        raise error(f"{shown} is damaged: {data - at:,} bytes after its last tensor "
                    "belong to no tensor")
    return tensors


def read_renamed(files: Sequence[Path], rename: Callable[[str], str | None],
                 error: type[SpecChatError] = EngineError, shown: Path | None = None
                 ) -> tuple[dict[str, Tensor], dict[str, str], dict[str, Path]]:
    """Every tensor of a head's weight files (``read``), by the name its
    module gives it (``rename``; None: one it does not read), with the name
    its file writes and the file it is in. A tensor two files hold is
    refused: which one would load is not the author's choice. Messages
    name ``shown``, the head's folder as the person gave it."""
    tensors: dict[str, Tensor] = {}
    names: dict[str, str] = {}
    where: dict[str, Path] = {}
    for f in files:
        for key, t in read(f, error, shown / f.name if shown else f).items():
            n = rename(key)
            if n is None:
                continue
            if n in tensors:
                raise error(f"{shown or f.parent} does not fit together: tensor {key} is in "
                            f"both {tensors[n].file} and {f.name}")
            tensors[n], names[n], where[n] = t, key, f
    return tensors, names, where


def _tensor(name: str, info: object, file: str, shown: Path,
            error: type[SpecChatError]) -> Tensor:
    def bad(what: str) -> SpecChatError:
        return error(f"{shown} is not a valid safetensors file: tensor {name!r} {what}")

    if not isinstance(info, dict):
        raise bad("has no description")
    dtype = info.get("dtype")
    if dtype not in DTYPE_BYTES:
        raise bad(f"has unknown dtype {dtype!r}")
    shape = info.get("shape")
    if not isinstance(shape, list) or not all(whole(s) and s >= 0 for s in shape):
        raise bad(f"has shape {shape!r} (expected a list of whole numbers >= 0)")
    offsets = info.get("data_offsets")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(whole, offsets))
            and 0 <= offsets[0] <= offsets[1]):
        raise bad(f"has data_offsets {offsets!r} (expected [start, end], 0 <= start <= end)")
    start, end = offsets
    need = DTYPE_BYTES[dtype] * math.prod(shape)
    if end - start != need:
        raise bad(f"has shape {shape} of {dtype}, which is {need:,} bytes, but its "
                  f"data_offsets span {end - start:,}")
    return Tensor(name, dtype, tuple(shape), start, end, file)


def whole(v: object) -> bool:
    """An int that is no bool: what JSON's whole numbers read as."""
    return isinstance(v, int) and not isinstance(v, bool)


def read_values(path: Path, tensors: list[Tensor], error: type[SpecChatError] = EngineError,
                shown: Path | None = None) -> dict[str, list[float] | list[int]]:
    """The values of a few small tensors of ``path`` (which ``read`` listed),
    flattened, by name: ints for whole-number dtypes, floats for float ones.
    The caller bounds their sizes first (a header may claim any)."""
    shown = shown or path
    out: dict[str, list] = {}
    try:
        with records.open_file(path) as f:
            (n,) = struct.unpack("<Q", f.read(8))
            data_at = 8 + n  # the data area follows the header
            for t in tensors:
                fmt = _VALUE_FORMATS.get(t.dtype)
                if fmt is None:
                    raise error(f"{shown}: tensor {t.name} is of dtype {t.dtype}, which "
                                "SpecChat does not read as numbers")
                f.seek(data_at + t.start)
                raw = f.read(t.end - t.start)
                count = len(raw) // struct.calcsize(fmt)
                values = list(struct.unpack(f"<{count}{fmt}", raw))
                if t.dtype == "BF16":  # the top 16 bits of a float32
                    values = list(struct.unpack(f"<{count}f", struct.pack(
                        f"<{count}I", *(v << 16 for v in values))))
                out[t.name] = values
    except records.BadRecord as exc:
        raise error(f"{shown} is broken: {exc}") from None
    except OSError as exc:
        raise error(f"Cannot read {shown}: {exc.strerror or exc}") from exc
    return out
