"""Drafters: who proposes the tokens the target verifies.

A drafter is anything with ``propose(context, k, ctl) -> Proposal`` and
``reset()``. The context is every committed token (prompt and output so far);
a drafter keeps whatever state it likes (a KV cache, an n-gram index) and
resynchronises it against the context on each call, so the loop never has to
tell it what was accepted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import mlx.core as mx

from specchat.engine.events import SamplingParams
from specchat.engine.kv import CacheSlot
from specchat.engine.loading import LoadedModel
from specchat.engine.lookup import NgramIndex
from specchat.engine.runner import Runner
from specchat.engine.sampling import KeyStream, processed_logprobs, sample


@dataclass
class Proposal:
    tokens: list[int]
    source: str  # "draft" or "lookup"
    key: str = ""  # what the policy keeps statistics under (defaults to source)
    q: mx.array | None = None  # [k, V] processed draft probs (sampling only)
    confidences: list[float] = field(default_factory=list)
    draft_s: float = 0.0  # seconds spent in draft forwards (excl. catch-up prefill)
    forwards: int = 0  # draft forward passes behind draft_s

    def __post_init__(self) -> None:
        self.key = self.key or self.source

    @property
    def k(self) -> int:
        return len(self.tokens)


@dataclass
class DraftControl:
    """What the loop tells a drafter for one step."""

    sampling: SamplingParams
    keys: KeyStream
    vocab: int  # target logits width; q rows are padded/cut to it
    cap: Callable[[str], int]  # max draft length for a source this step
    keep_going: Callable[[list[float]], bool] = lambda confs: True
    # Fixed K: no early stop, so the draft tokens can stay on the device
    # until the block is done (one host sync per block instead of per token).
    lazy: bool = False


class Drafter(Protocol):
    name: str

    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal: ...

    def reset(self) -> None: ...


class LookupDrafter:
    """Draftless speculation from n-gram matches in the context.

    Single-token matches are ignored (on the benchmark they were accepted a
    quarter of the time); acceptance is tracked per match length, since a
    6-token match continues correctly far more often than a 2-token one, and
    the draft length follows from it.
    """

    name = "lookup"

    def __init__(self, min_n: int = 2, max_n: int = 6):
        self.index = NgramIndex(min_n, max_n)

    def match(self, context: Sequence[int]) -> tuple[list[int], int]:
        from specchat.engine.draft_policy import LOOKUP_CAP

        return self.index.propose(context, LOOKUP_CAP)

    def propose(self, context: Sequence[int], ctl: DraftControl,
                found: tuple[list[int], int] | None = None) -> Proposal:
        tokens, n = found if found is not None else self.match(context)
        if not tokens:
            return Proposal(tokens=[], source=self.name)
        key = f"lookup{min(n, 4)}"
        return Proposal(tokens=tokens[:ctl.cap(key)], source=self.name, key=key)

    def reset(self) -> None:
        self.index = NgramIndex(self.index.min_n, self.index.max_n)


# Draft-side vocabulary pruning (as in FR-Spec): byte-level BPE vocabularies
# are ordered by merge rank, roughly by frequency, so the first ids cover
# almost all running text. Projecting the draft's hidden state onto those
# rows only cuts the largest matmul of a small draft model by ~4x for a
# 150k vocabulary. Proposals are still exact: greedy verification only
# compares tokens, and for sampling q is the real (pruned) distribution.
PRUNE_ABOVE = 65_536
PRUNE_KEEP = 32_768


class ModelDrafter:
    """A small model that shares the target's tokenizer."""

    name = "draft"

    def __init__(self, draft: LoadedModel, extra_ids: Sequence[int] = (), prune: bool | None = None):
        self.loaded = draft
        self.runner = Runner(draft.model, draft.info.model_type)
        self.slot = CacheSlot(self.runner)
        self.subset: mx.array | None = None
        self.sub_head: mx.array | None = None
        weight = self.runner.head_weight()
        vocab = weight.shape[0] if weight is not None else 0
        if prune is None:
            prune = vocab > PRUNE_ABOVE
        if prune and weight is not None and vocab > PRUNE_KEEP:
            keep = set(range(PRUNE_KEEP)) | {i for i in extra_ids if 0 <= i < vocab}
            self.subset = mx.array(sorted(keep), dtype=mx.uint32)
            self.sub_head = weight[self.subset]
            mx.eval(self.sub_head)

    def reset(self) -> None:
        self.slot.reset()

    def bytes_per_token(self) -> int:
        total = self.runner.bytes_per_token()
        if self.sub_head is not None:
            total -= self.runner.head_weight().nbytes - self.sub_head.nbytes
        return total

    def _logits(self, tokens: list[int] | mx.array) -> mx.array:
        """[1, V'] logits after feeding ``tokens`` (V' = pruned width if pruned).
        A device array's ids are recorded as -1 until the block is read back."""
        ids = [-1] * tokens.size if isinstance(tokens, mx.array) else list(tokens)
        if self.sub_head is None:
            return self.slot.feed(tokens, "last", ids=ids)
        h = self.runner.hidden(tokens, self.slot.cache)[-1:]
        self.slot.ids.extend(ids)
        return h @ self.sub_head.T

    def _to_token(self, idx: mx.array) -> mx.array:
        return self.subset[idx] if self.subset is not None else idx

    def _full_q(self, probs: mx.array, vocab: int) -> mx.array:
        """Draft probabilities over the target's vocabulary width."""
        if self.subset is not None:
            full = mx.zeros((probs.shape[0], vocab), probs.dtype)
            keep = self.subset < vocab
            idx = self.subset if bool(mx.all(keep)) else self.subset[keep]
            src = probs if idx is self.subset else probs[:, keep]
            full[:, idx] = src
            return full
        w = probs.shape[-1]
        if w == vocab:
            return probs
        if w > vocab:
            return probs[:, :vocab]
        return mx.concatenate([probs, mx.zeros((probs.shape[0], vocab - w), probs.dtype)], axis=1)

    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal:
        k = ctl.cap(self.name)
        if k <= 0:
            return Proposal(tokens=[], source=self.name)
        pending = self.slot.sync_to(context)
        if len(pending) > 8:  # a new prompt: prefill is not part of drafting cost
            self.slot.prefill(pending[:-1])
            pending = pending[-1:]
        greedy = ctl.sampling.greedy
        toks: list[mx.array] = []
        tokens: list[int] = []
        confs: list[float] = []
        q_rows: list[mx.array] = []
        t0 = time.perf_counter()
        feed: list[int] | mx.array = pending
        while True:
            logits = self._logits(feed).astype(mx.float32)
            if greedy:
                idx = mx.argmax(logits, axis=-1)
                conf = mx.max(mx.softmax(logits, axis=-1), axis=-1)
            else:
                lp = processed_logprobs(logits, ctl.sampling)
                idx = sample(lp, ctl.keys.next())
                probs = mx.exp(lp)
                conf = mx.take_along_axis(probs, idx[:, None], axis=-1)[:, 0]
                q_rows.append(probs)
            tok = self._to_token(idx)
            if ctl.lazy:
                toks.append(tok)
                mx.async_eval(tok)
                if len(toks) >= k:
                    break
                feed = tok
                continue
            mx.eval(tok, conf)
            tokens.append(int(tok.item()))
            confs.append(float(conf.item()))
            if len(tokens) >= k or not ctl.keep_going(confs):
                break
            feed = tokens[-1:]
        if ctl.lazy:
            tokens = mx.concatenate(toks).tolist()
        # Every draft token but the last went through the draft model.
        if len(tokens) > 1:
            self.slot.ids[-(len(tokens) - 1):] = tokens[:-1]
        draft_s = time.perf_counter() - t0
        q = None
        if not greedy:
            q = self._full_q(mx.concatenate(q_rows, axis=0), ctl.vocab)
        return Proposal(tokens=tokens, source=self.name, q=q, confidences=confs,
                        draft_s=draft_s, forwards=len(tokens))


class HybridDrafter:
    """Prompt lookup when the context has an n-gram match of at least
    ``min_match`` tokens, the draft model otherwise. Lookup is free, so
    whenever the reply is copying from the prompt it wins outright."""

    name = "hybrid"

    def __init__(self, model: ModelDrafter, lookup: LookupDrafter, min_match: int = 3):
        self.model = model
        self.lookup = lookup
        self.min_match = min_match

    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal:
        found = self.lookup.match(context)
        if found[0] and found[1] >= self.min_match:
            proposal = self.lookup.propose(context, ctl, found)
            if proposal.tokens:
                return proposal
        return self.model.propose(context, ctl)

    def reset(self) -> None:
        self.model.reset()
        self.lookup.reset()
