"""What one command collective carries.

Rank 0 announces every operation to the other ranks with one ``all_sum``
of a fixed-size int32 vector in which the other ranks contribute zeros, so
the sum is rank 0's vector: a header (operation, which cache, the cache
length the operation starts from, how many ids follow, a cache to forget)
and up to ``INLINE`` token ids. A verify block or a plain step fits inline:
one collective per forward. Longer inputs (prefill chunks, the load
request's JSON) follow in a second ``all_sum`` of exactly that length.

Every rank must issue the collectives in the same order. Rank 0 evaluates
each announcement before it builds the forward (a pipeline stage's receive
depends on no input, so data dependencies alone would not order it after
the announcement), and each announcement depends on the previous forward's
output (``after``), so a forward built lazily after another cannot
overtake it.
"""

from __future__ import annotations

import mlx.core as mx

HEADER = 8
INLINE = 32
SIZE = HEADER + INLINE

# operations
FEED = 1  # run the layers on ids, extending a cache
LOAD = 2  # load a stage of the model named in the JSON payload

# header fields
OP, CACHE, OFFSET, COUNT, FORGET = range(5)


def _sum(x: mx.array, group) -> mx.array:
    return mx.distributed.all_sum(x, group=group, stream=mx.cpu)


def announce(group, op: int, ids: mx.array | None = None, *, cache: int = 0, offset: int = 0,
             forget: int = 0, after: mx.array | None = None) -> mx.array | None:
    """Rank 0's side: broadcast one command (lazily). Returns the ids as
    the other ranks receive them (int32, flat), or None without ids."""
    count = 0 if ids is None else int(ids.size)
    head = mx.array([op, cache, offset, count, forget] + [0] * (HEADER - 5), dtype=mx.int32)
    flat = None if ids is None else ids.reshape(-1).astype(mx.int32)
    inline = flat if flat is not None and count <= INLINE else None
    pad = INLINE - (count if inline is not None else 0)
    parts = [head] + ([inline] if inline is not None else []) + [mx.zeros((pad,), mx.int32)]
    msg = mx.concatenate(parts)
    if after is not None:
        msg = mx.depends(msg, after)
    out = _sum(msg, group)
    if flat is None:
        return None
    if inline is not None:
        return out[HEADER:HEADER + count]
    return _sum(mx.depends(flat, out), group)


def receive(group) -> tuple[list[int], list[int]]:
    """Another rank's side: wait for the next command; (header, ids)."""
    out = _sum(mx.zeros((SIZE,), mx.int32), group)
    mx.eval(out)
    values = out.tolist()
    head = values[:HEADER]
    count = head[COUNT]
    if count <= INLINE:
        return head, values[HEADER:HEADER + count]
    payload = _sum(mx.zeros((count,), mx.int32), group)
    mx.eval(payload)
    return head, payload.tolist()


def to_ids(data: bytes) -> mx.array:
    return mx.array(list(data), dtype=mx.int32)


def from_ids(ids: list[int]) -> bytes:
    return bytes(ids)
