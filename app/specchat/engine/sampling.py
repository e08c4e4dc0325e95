"""Processed distributions and sampling, batched over positions.

The processed distribution is mlx-lm's: top-p on the model's log-probs, then
top-k, then temperature. Speculative acceptance compares exactly these
distributions for target and draft, so the output follows what plain
sampling with the same settings would produce.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_k, apply_top_p

from specchat.engine.events import SamplingParams


def processed_logprobs(logits: mx.array, params: SamplingParams) -> mx.array:
    """Log-probabilities of the processed distribution, row-wise. [N, V] -> [N, V]."""
    logits = logits.astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    if 0.0 < params.top_p < 1.0:
        lp = apply_top_p(lp, params.top_p)
    if 0 < params.top_k < lp.shape[-1]:
        lp = apply_top_k(lp, params.top_k)
    if params.temperature > 0 and params.temperature != 1.0:
        lp = lp * (1.0 / params.temperature)
    return lp - mx.logsumexp(lp, axis=-1, keepdims=True)


def sample(logprobs: mx.array, key: mx.array) -> mx.array:
    """One token per row from log-probabilities. [N, V] -> [N]."""
    return mx.random.categorical(logprobs, axis=-1, key=key)


class KeyStream:
    """Explicit PRNG keys so a seeded run is reproducible no matter what else
    in the process draws random numbers."""

    def __init__(self, seed: int | None):
        if seed is None:
            import secrets

            seed = secrets.randbits(63)
        self._key = mx.random.key(seed)

    def next(self) -> mx.array:
        self._key, sub = mx.random.split(self._key)
        return sub
