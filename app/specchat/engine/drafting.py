"""The draft step, written once: a block drafted token by token
(``draft_block``), the block as drafting produced it (``Drafted``), the
``Proposal`` the loop verifies (``Drafted.proposal``), and how a drafter's
logit columns map to the target's ids (``DraftHead``).

The draft model (draft_model.py), the heads that read the target
(head_drafter.py) and SSD's worker (ssd/) all draft through here, so a
block stops, keeps its q rows and becomes a proposal the same way whoever
drafted it. A block stops after k tokens or where the policy's early stop
says (``keep_going``), and at T > 0 keeps each token's q row for rejection
sampling.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

from specchat.engine.drafters import Proposal
from specchat.engine.events import SamplingParams
from specchat.engine.kv import Tokens
from specchat.engine.sampling import processed_logprobs, sample


class DraftHead:
    """A drafter's output columns as they are when a block starts, over the
    ids the target has. A drafter whose output layer is wider than the
    target's (another padding of the same tokenizer) could otherwise propose
    an id the target has no row for, and acceptance would read some other
    token's probability for it: such columns are -inf."""

    def __init__(self, vocab: int, rows: mx.array | None = None, rows_max: int = -1,
                 base: mx.array | None = None, extra: mx.array | None = None):
        """``rows`` (with their largest id): the target id of each column,
        for a drafter with a vocabulary of its own (an EAGLE-3 head's, a
        pruned draft model's); otherwise columns are the target's ids.
        ``base`` and ``extra``: a pruned output layer's weight rows, fixed
        for the block (ssd/'s worker drafts while the engine thread may
        add rows); then a feed returns the hidden state and this projects it."""
        self.vocab = vocab
        self.which = "hidden" if base is not None else "last"  # what a feed returns
        self.base, self.extra, self.rows = base, extra, rows
        self.mask = self.rows < vocab if rows_max >= vocab else None

    def logits(self, out: mx.array) -> mx.array:
        """[1, W] float32 logits from what a feed returned (``which``)."""
        if self.base is None:
            out = out.astype(mx.float32)
            if self.rows is not None:
                return out if self.mask is None else mx.where(self.mask, out, -mx.inf)
            return out[..., :self.vocab] if out.shape[-1] > self.vocab else out
        logits = out @ self.base.T
        if self.extra is not None:
            logits = mx.concatenate([logits, out @ self.extra.T], axis=-1)
        logits = logits.astype(mx.float32)
        return logits if self.mask is None else mx.where(self.mask, logits, -mx.inf)

    def ids(self, idx: mx.array) -> mx.array:
        """Token ids of logit columns."""
        return self.rows[idx] if self.rows is not None else idx

    def full_q(self, q_rows: list[mx.array]) -> mx.array:
        """[k, vocab] draft probabilities over the target's ids (columns the
        target lacks have probability 0: their logits are -inf)."""
        probs = mx.concatenate(q_rows, axis=0)
        if self.rows is not None:
            rows = self.rows
            if self.mask is not None:
                rows, probs = rows[self.mask], probs[:, self.mask]
            full = mx.zeros((probs.shape[0], self.vocab), probs.dtype)
            full[:, rows] = probs
            return full
        w = probs.shape[-1]
        if w == self.vocab:
            return probs
        return mx.concatenate([probs, mx.zeros((probs.shape[0], self.vocab - w), probs.dtype)],
                              axis=1)


def distribution(logits: mx.array, sampling: SamplingParams) -> tuple[mx.array, mx.array | None]:
    """(probabilities, log-probabilities to sample from) of one step's
    logits as drafting reads them: greedy, the softmax of the logits (and
    nothing to sample); sampling, the processed distribution it draws from."""
    if sampling.greedy:
        return mx.softmax(logits, axis=-1), None
    lp = processed_logprobs(logits, sampling)
    return mx.exp(lp), lp


def likeliest(head: DraftHead, probs: mx.array, n: int) -> tuple[mx.array, mx.array]:
    """The ``n`` likeliest columns of one row of probabilities [W]: their
    target ids and probabilities, in no particular order."""
    n = min(n, probs.shape[-1])
    top = mx.argpartition(-probs, kth=n - 1)[:n]
    return head.ids(top), probs[top]


@dataclass
class Drafted:
    """A block as drafting produced it: per token its confidence (its
    probability under the draft), when asked the draft's next choices there
    (id and probability, the token itself left out: ssd's guesses) and,
    when sampling, its q row."""

    tokens: list[int] = field(default_factory=list)
    confs: list[float] = field(default_factory=list)
    alts: list[list[tuple[int, float]]] = field(default_factory=list)
    q_rows: list[mx.array] = field(default_factory=list)
    forward_s: float = 0.0
    forwards: int = 0

    def q(self, head: DraftHead, sampling: SamplingParams) -> mx.array | None:
        """The block's q over the target's ids (sampling only)."""
        if sampling.greedy or not self.q_rows:
            return None
        return head.full_q(self.q_rows)

    def proposal(self, source: str, head: DraftHead, sampling: SamplingParams, started: float,
                 *, key: str = "", forwards: int | None = None,
                 q: mx.array | None = None) -> Proposal:
        """The block as the loop verifies it, drafted by kind ``source`` since
        ``started`` (perf_counter); ``q`` when already computed (ssd's
        speculated blocks), ``forwards`` when other than the block's own."""
        return Proposal(tokens=list(self.tokens), source=source, key=key,
                        q=q if q is not None else self.q(head, sampling),
                        confidences=list(self.confs), draft_s=time.perf_counter() - started,
                        forwards=self.forwards if forwards is None else forwards)


def draft_block(head: DraftHead, feed: Callable[[Tokens], mx.array], first: Tokens, k: int,
                sampling: SamplingParams, key_at: Callable[[int], mx.array],
                keep_going: Callable[[list[float]], bool] = lambda confs: True,
                lazy: bool = False, alts: int = 0, out: Drafted | None = None,
                abandon: Callable[[], bool] = lambda: False) -> Drafted | None:
    """Draft up to k tokens, starting by feeding ``first``; ``feed`` feeds
    tokens into the draft's cache and returns what ``head.which`` names.
    Stops after k tokens or where ``keep_going`` says; ``key_at(i)`` is the
    random key of the block's i-th token (sampling only). With ``lazy`` the
    tokens stay on the device until the block is done (fixed K: one host
    sync per block). ``alts``: how many next choices to keep per token.
    Continues ``out`` when given; returns None if ``abandon`` says so
    between forwards."""
    block = out or Drafted()
    greedy = sampling.greedy
    on_device: list[mx.array] = []
    x = first
    while len(block.tokens) + len(on_device) < k:
        if abandon():
            return None
        t0 = time.perf_counter()
        logits = head.logits(feed(x))
        probs, lp = distribution(logits, sampling)
        if greedy:
            idx = mx.argmax(logits, axis=-1)
        else:
            idx = sample(lp, key_at(len(block.tokens) + len(on_device)))
            block.q_rows.append(probs)
        tok = head.ids(idx)
        block.forwards += 1
        if lazy:
            on_device.append(tok)
            mx.async_eval(tok)
            x = tok
            continue
        conf = probs[0, idx[0]]
        want = [tok, conf]
        if alts:
            want += likeliest(head, probs[0], alts + 1)
        mx.eval(*want)
        block.forward_s += time.perf_counter() - t0
        token = int(tok.item())
        block.tokens.append(token)
        block.confs.append(float(conf.item()))
        if alts:
            ranked = sorted(((i, p) for i, p in zip(want[2].tolist(), want[3].tolist(), strict=True)
                             if i != token and p > 0), key=lambda x: -x[1])
            block.alts.append(ranked[:alts])
        if not keep_going(block.confs):
            break
        x = [token]
    if on_device:
        t0 = time.perf_counter()
        block.tokens.extend(mx.concatenate(on_device).tolist())
        block.forward_s += time.perf_counter() - t0
    return block
