"""Deciding which draft tokens the target keeps, on the device.

All three rules return, lazily, an int32 array ``[n, next_token]``: n draft
tokens accepted, then the target's own next token (the correction at the
first rejection, or the bonus token when all K pass). The caller reads both
with a single host synchronisation.

- greedy: the target's argmax must equal the draft token. Output is exactly
  plain greedy decoding with the target.
- rejection (Leviathan et al. 2023, Alg. 1): accept x_i with probability
  min(1, p_i(x_i) / q_i(x_i)); at the first rejection sample from
  norm(max(0, p_i - q_i)); if all pass, sample the bonus from p_K. Output is
  distributed exactly as sampling from p. Expected acceptance per token is
  sum_x min(p, q).
- equality: mlx-lm's rule, kept only to compare against: sample t_i ~ p_i
  and accept while t_i == x_i. Also exact in distribution, but acceptance
  drops to sum_x p*q.

A deterministic proposal (prompt lookup) is a draft whose q is one-hot at the
proposed token: accept with probability p_i(x_i), residual p_i without x_i.
"""

from __future__ import annotations

import mlx.core as mx

from specchat.engine.sampling import sample


def _leading_true(mask: mx.array) -> mx.array:
    """Number of leading True values of a 1-D bool array."""
    return mx.sum(mx.cumprod(mask.astype(mx.int32)))


def greedy(target_logits: mx.array, draft: mx.array) -> mx.array:
    """target_logits [K+1, V]; draft [K] (K may be 0)."""
    t = mx.argmax(target_logits, axis=-1).astype(mx.int32)
    k = draft.shape[0]
    if k == 0:
        return mx.concatenate([mx.zeros((1,), mx.int32), t[:1]])
    n = _leading_true(t[:k] == draft.astype(mx.int32))
    return mx.stack([n.astype(mx.int32), t[n]])


def rejection(
    p_logprobs: mx.array,
    draft: mx.array,
    q_probs: mx.array | None,
    key: mx.array,
) -> mx.array:
    """p_logprobs [K+1, V] processed target log-probs; q_probs [K, V] processed
    draft probs, or None for a deterministic (one-hot) proposal."""
    k = draft.shape[0]
    if k == 0:
        tok = sample(p_logprobs[:1], key)
        return mx.concatenate([mx.zeros((1,), mx.int32), tok.astype(mx.int32)])
    k_u, k_s = mx.random.split(key)
    p = mx.exp(p_logprobs)
    x = draft.astype(mx.int32)
    rows = mx.arange(k)
    px = p[rows, x]
    if q_probs is None:
        qx = mx.ones_like(px)
        onehot = mx.arange(p.shape[-1])[None, :] == x[:, None]
        residual = mx.where(onehot, 0.0, p[:k])
    else:
        qx = q_probs[rows, x]
        residual = mx.maximum(p[:k] - q_probs, 0.0)
    u = mx.random.uniform(shape=(k,), key=k_u)
    n = _leading_true(u * qx < px)
    dist = mx.concatenate([residual, p[k:k + 1]], axis=0)[n]
    # p == q on the support leaves no residual mass; then a rejection had
    # probability zero and p itself is the right fallback.
    mass = mx.sum(dist)
    dist = mx.where(mass > 0, dist, p[n])
    tok = sample(mx.log(dist)[None], k_s)
    return mx.concatenate([n[None].astype(mx.int32), tok.astype(mx.int32)])


def equality(p_logprobs: mx.array, draft: mx.array, key: mx.array) -> mx.array:
    """mlx-lm's token-equality rule (for comparison only)."""
    t = sample(p_logprobs, key).astype(mx.int32)
    k = draft.shape[0]
    if k == 0:
        return mx.concatenate([mx.zeros((1,), mx.int32), t[:1]])
    n = _leading_true(t[:k] == draft.astype(mx.int32))
    return mx.stack([n.astype(mx.int32), t[n]])
