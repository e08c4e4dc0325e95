"""Which outcomes SSD speculates for, and the keys its blocks are drawn with.

A block d1..dK ends in an outcome (n, t). The guesses for t come from the
draft's own distribution (the alternatives ``draft_block`` keeps per token).
Keys per position follow the paper: with the miss probability of a fan-out
F falling as F^-r and P(n) the chance that verification ends after n
accepted drafts, minimising sum_n P(n) F_n^-r for a budget sum_n F_n = B
gives F_n proportional to P(n)^(1/(1+r)); P(n) here comes from each
position's calibrated acceptance, and r = 1 (``POWER``, an assumption: the
paper fits it). Every draft token of SSD, on either thread, is drawn with
the key of its absolute position, so a speculated block is the block the
engine would have drafted itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx

from specchat.engine.drafting import Drafted, DraftHead, draft_block
from specchat.engine.events import SamplingParams

F_MAX = 4  # most keys per position (and alternatives read back per drafted token)
MAX_KEYS = 8  # most keys per job
POWER = 1.0  # r: the miss rate of a fan-out F taken to fall as F^-r
_MASK64 = (1 << 64) - 1

Key = tuple[int, int]  # (drafts accepted, the target's token after them)


def position_key(base: int, position: int) -> mx.array:
    """The PRNG key for the draft token at ``position`` (splitmix64 of the
    request's base and the position)."""
    z = (base + 0x9E3779B97F4A7C15 * (position + 1)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return mx.random.key((z ^ (z >> 31)) >> 1)


def draft_at(head: DraftHead, feed: Callable, first: list[int], k: int, sampling: SamplingParams,
             base: int | None, position: int, keep_going: Callable[[list[float]], bool],
             **more) -> Drafted | None:
    """draft_block with the position keys (the first new token at absolute
    ``position``) and the alternatives the guesses need: the engine's
    blocks and the worker's are drafted alike."""
    return draft_block(head, feed, first, k, sampling,
                       key_at=lambda i: position_key(base, position + i), keep_going=keep_going,
                       alts=F_MAX, **more)


def fan_out(p_end: Sequence[float], budget: int, caps: Sequence[int]) -> list[int]:
    """Keys per position: F_n proportional to P(n)^(1/(1+r)) (the paper's
    optimum), ``budget`` in all, at most ``caps[n]`` each. Whole keys are
    handed out one at a time to the position whose share is most behind
    (the D'Hondt rule), which gives the proportional split in integers."""
    w = [max(p, 0.0) ** (1.0 / (1.0 + POWER)) for p in p_end]
    f = [0] * len(w)
    for _ in range(budget):
        best = max((i for i in range(len(w)) if f[i] < caps[i] and w[i] > 0),
                   key=lambda i: w[i] / (f[i] + 1), default=None)
        if best is None:
            break
        f[best] += 1
    return f


def ending_probs(accept: Sequence[float]) -> list[float]:
    """P(verification ends after n accepted drafts), n = 0..K, from each
    draft token's acceptance chance."""
    out, survive = [], 1.0
    for a in accept:
        out.append(survive * (1.0 - a))
        survive *= a
    out.append(survive)
    return out


def guesses(block: Drafted, accept: Sequence[float],
            budget: int) -> tuple[list[tuple[Key, float]], int, float]:
    """The outcomes to speculate for after ``block`` (each token's
    acceptance chance ``accept``), ``budget`` keys in all: the keys after a
    rejection with their probabilities, how many bonus keys (read off the
    draft after the whole block, on the worker) and the bonus position's
    probability."""
    p_end = ending_probs(accept)
    k = len(block.tokens)
    counts = fan_out(p_end, budget, [len(a) for a in block.alts] + [F_MAX])
    keys: list[tuple[Key, float]] = []
    for n in range(k):
        rest = max(1e-9, 1.0 - block.confs[n])
        keys += [((n, t), p_end[n] * min(1.0, q / rest)) for t, q in block.alts[n][:counts[n]]]
    return keys, counts[k], p_end[k]
