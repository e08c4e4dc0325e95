"""Writing safetensors files one chunk at a time.

``safetensors.numpy.save_file`` needs every tensor in memory at once; a 1.5B
model dequantized to float16 is ~3.5 GB. Since every tensor's dtype and shape
is known before any data is decoded, the header can be written first and the
data streamed after it, so the peak is one chunk of one tensor. The format
(safetensors' README): 8-byte little-endian header length, a JSON header
padded with spaces to a multiple of 8, then the raw little-endian data in
header order. The tests read the result back with ``safetensors`` itself.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_NAMES = {np.dtype("float32"): "F32", np.dtype("float16"): "F16", np.dtype("int32"): "I32"}


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape)


def plan_shards(entries: list[Entry], max_bytes: int) -> list[list[Entry]]:
    """Split entries, in order, into shards of at most ``max_bytes`` each
    (a single larger tensor gets a shard of its own)."""
    shards: list[list[Entry]] = [[]]
    size = 0
    for e in entries:
        if shards[-1] and size + e.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return shards


class StreamingWriter:
    """Writes one safetensors file whose tensors arrive in ``entries`` order,
    each in one or more row chunks."""

    def __init__(self, path: Path, entries: list[Entry], metadata: dict[str, str] | None = None):
        header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
        offset = 0
        for e in entries:
            header[e.name] = {"dtype": _NAMES[e.dtype], "shape": list(e.shape),
                              "data_offsets": [offset, offset + e.nbytes]}
            offset += e.nbytes
        blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
        blob += b" " * (-len(blob) % 8)
        self._entries = list(entries)
        self._index = 0
        self._written = 0  # bytes of the current tensor so far
        self._f = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._f.write(struct.pack("<Q", len(blob)))
        self._f.write(blob)
        self._skip_empty()

    def _skip_empty(self) -> None:
        while self._index < len(self._entries) and self._entries[self._index].nbytes == 0:
            self._index += 1

    def write(self, name: str, chunk: np.ndarray) -> None:
        entry = self._entries[self._index]
        if name != entry.name:
            raise ValueError(f"expected data for {entry.name}, got {name}")
        if chunk.dtype != entry.dtype:
            raise ValueError(f"{name}: dtype {chunk.dtype}, header says {entry.dtype}")
        data = np.ascontiguousarray(chunk).astype(chunk.dtype.newbyteorder("<"), copy=False)
        self._f.write(memoryview(data).cast("B"))
        self._written += data.nbytes
        if self._written > entry.nbytes:
            raise ValueError(f"{name}: more data than its shape {entry.shape} holds")
        if self._written == entry.nbytes:
            self._index += 1
            self._written = 0
            self._skip_empty()

    def close(self) -> None:
        try:
            if self._index != len(self._entries):
                missing = self._entries[self._index].name
                raise ValueError(f"safetensors file incomplete: {missing} not fully written")
            self._f.flush()
        finally:
            self._f.close()

    def abort(self) -> None:
        self._f.close()
