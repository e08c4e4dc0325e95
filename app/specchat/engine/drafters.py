"""Drafters: who proposes the tokens the target verifies.

A drafter is anything with ``prepare(prompt)``, ``propose(context, ctl) ->
Proposal`` and ``reset()``. The context is every committed token (prompt and
output so far); a drafter keeps whatever state it likes (a KV cache, an
n-gram index) and resynchronises it against the context on each call, so the
loop never has to tell it what was accepted. What the policy needs to know
about a kind of drafter (its cost, prior, longest block) is declared in
drafter_kinds.py, under the drafter's ``name``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import mlx.core as mx

from specchat.engine import events
from specchat.engine.drafter_kinds import DRAFT_MODEL, LOOKUP
from specchat.engine.events import SamplingParams
from specchat.engine.kv import CacheSlot
from specchat.engine.loading import LoadedModel
from specchat.engine.lookup import NgramIndex
from specchat.engine.runner import Runner
from specchat.engine.sampling import KeyStream, processed_logprobs, sample


@dataclass(frozen=True)
class Part:
    """A run of a proposal's tokens drafted by one drafter kind (a chained
    proposal has several: a suffix match, then the draft model)."""

    source: str  # drafter kind
    key: str  # statistics key
    k: int
    confidences: tuple[float, ...] = ()


# The origin of an accepted token, by the kind that drafted it (events.py).
ORIGIN_OF_KIND = {DRAFT_MODEL.name: events.DRAFT_MODEL, LOOKUP.name: events.CONVERSATION}


@dataclass
class Proposal:
    tokens: list[int]
    source: str  # the drafter kind's name (drafter_kinds.py); "" when nothing is drafted
    key: str = ""  # what the policy keeps statistics under (defaults to source)
    q: mx.array | None = None  # [k, V] processed draft probs (sampling only)
    confidences: list[float] = field(default_factory=list)
    draft_s: float = 0.0  # seconds spent in draft forwards (catching up included)
    forwards: int = 0  # draft forward passes behind draft_s
    origins: list[str] = field(default_factory=list)  # per token (events.py's origins)
    parts: list[Part] = field(default_factory=list)  # per drafter kind, in order

    def __post_init__(self) -> None:
        self.key = self.key or self.source
        if not self.origins:
            self.origins = [ORIGIN_OF_KIND.get(self.source, events.DRAFT_MODEL)] * len(self.tokens)
        if not self.parts and self.tokens:
            self.parts = [Part(self.source, self.key, len(self.tokens), tuple(self.confidences))]

    @property
    def k(self) -> int:
        return len(self.tokens)

    def judged(self, n: int) -> Iterator[tuple[Part, int]]:
        """Each part the target judged when ``n`` tokens were accepted, with
        how many of its tokens it kept. A part after the first rejection
        was never judged (its first token starts past n)."""
        offset = 0
        for part in self.parts:
            if offset > n:
                return
            yield part, min(n - offset, part.k)
            offset += part.k


@dataclass
class DraftControl:
    """What the loop tells a drafter for one step."""

    sampling: SamplingParams
    keys: KeyStream
    vocab: int  # target logits width; q rows are padded/cut to it
    # Max draft length this step for a drafter kind (statistics under an
    # optional finer key): cap(kind, key=None).
    cap: Callable[..., int]
    keep_going: Callable[[list[float]], bool] = lambda confs: True
    # Fixed K: no early stop, so the draft tokens can stay on the device
    # until the block is done (one host sync per block instead of per token).
    lazy: bool = False
    # Another drafter is asked if this one proposes nothing, so weak
    # proposals may be left to it.
    fallback: bool = False
    # The request's draft policy (draft_policy.DraftPolicy), for drafters that
    # weigh options by measured acceptance and cost (hybrid.py).
    policy: Any = None


class Drafter(Protocol):
    name: str

    def prepare(self, prompt: Sequence[int]) -> None:
        """Called during prefill, so that a drafter's own prompt processing
        counts as prefill (time to first token), not as a decoding step; and
        again mid-request with the longer context before break-even
        auto-off probes speculation (catching up outside the probe's
        timing). So it must sync its state to the context, never reset it."""
        ...

    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal: ...

    def reset(self) -> None: ...


class LookupDrafter:
    """Draftless speculation from n-gram matches in the context.

    Single-token matches are ignored (on the benchmark they were accepted a
    quarter of the time); acceptance is tracked per match length, since a
    6-token match continues correctly far more often than a 2-token one, and
    the draft length follows from it. With another drafter to fall back on
    (hybrid mode), matches shorter than ``min_match`` are left to it.
    """

    name = LOOKUP.name

    def __init__(self, min_n: int = 2, max_n: int = 6, min_match: int = 3):
        self.index = NgramIndex(min_n, max_n)
        self.min_match = min_match

    def prepare(self, prompt: Sequence[int]) -> None:
        pass  # the n-gram index catches up lazily, in microseconds

    def match(self, context: Sequence[int]) -> tuple[list[int], int]:
        return self.index.propose(context, LOOKUP.cap)

    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal:
        tokens, n = self.match(context)
        if not tokens or (ctl.fallback and n < self.min_match):
            return Proposal(tokens=[], source=self.name)
        key = f"{self.name}{min(n, 4)}"
        return Proposal(tokens=tokens[:ctl.cap(self.name, key)], source=self.name, key=key)

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
# Rows added for rare ids seen in a request's context, before they are forgotten.
CONTEXT_ROWS_MAX = 8_192


class PrunedHead:
    """The draft's output projection restricted to the frequent ids, the
    special tokens, and every rarer id that has appeared in the context.

    Frequency alone fails exactly where drafting should shine: an edit of
    the user's code copies its identifiers, and a rare id outside the kept
    rows can never be proposed. Those ids are in the prompt, so the rows for
    the context's ids are added as they appear (a few hundred rows at most
    per request), and the draft can propose them again.
    Each request starts from its own context's rows (``restart``): rows left
    by an earlier request would change what the draft proposes, so a seeded
    sampled request's tokens, and a bench's comparison of modes, would depend
    on what ran before.
    """

    def __init__(self, weight: mx.array, keep: int, always: Sequence[int] = ()):
        self.weight = weight  # the full [V, H] head, to gather context rows from
        self.vocab = int(weight.shape[0])
        base = sorted(set(range(min(keep, self.vocab))) | {i for i in always if 0 <= i < self.vocab})
        self.base_ids = mx.array(base, dtype=mx.uint32)
        self.base = weight[self.base_ids]
        self.base_set = frozenset(base)
        self._base_only()
        mx.eval(self.base)

    def _base_only(self) -> None:
        """No rows beyond the base ones: at creation, and as a request starts."""
        self.known = set(self.base_set)
        self.extra: list[int] = []
        self.extra_head: mx.array | None = None
        self.rows = self.base_ids  # the token id behind each logit column

    def restart(self, tokens: Sequence[int]) -> None:
        """Rows for exactly the base ids and those of ``tokens`` (a request's
        context), dropping any an earlier request added."""
        want = {t for t in tokens if t not in self.base_set and 0 <= t < self.vocab}
        if self.extra == sorted(want):
            return  # the same context again
        # Rebuilt in sorted order, not kept in the order the ids arrived:
        # sampling reads the columns in order, so the same key over another
        # order can draw another token.
        self._base_only()
        self.cover(list(want))

    def cover(self, tokens: Sequence[int]) -> None:
        """Make sure every id in ``tokens`` can be proposed."""
        new = {t for t in tokens if t not in self.known and 0 <= t < self.vocab}
        if not new:
            return
        if len(self.extra) + len(new) > CONTEXT_ROWS_MAX:
            self.known.difference_update(self.extra)
            self.extra = []
        self.extra.extend(sorted(new))
        self.known.update(new)
        ids = mx.array(self.extra, dtype=mx.uint32)
        self.extra_head = self.weight[ids]
        self.rows = mx.concatenate([self.base_ids, ids])
        mx.eval(self.extra_head, self.rows)

    def __call__(self, h: mx.array) -> mx.array:
        """[L, H] hidden states -> [L, R] logits over ``rows``."""
        logits = h @ self.base.T
        if self.extra_head is not None:
            logits = mx.concatenate([logits, h @ self.extra_head.T], axis=-1)
        return logits

    @property
    def nbytes(self) -> int:
        return self.base.nbytes + (self.extra_head.nbytes if self.extra_head is not None else 0)


class ModelDrafter:
    """A small model that shares the target's tokenizer."""

    name = DRAFT_MODEL.name

    def __init__(self, draft: LoadedModel, extra_ids: Sequence[int] = (), prune: bool | None = None,
                 keep: int = PRUNE_KEEP):
        self.loaded = draft
        self.runner = Runner(draft.model, draft.info.model_type, draft.config)
        self.slot = CacheSlot(self.runner)
        self.head: PrunedHead | None = None
        weight = self.runner.head_weight()
        vocab = weight.shape[0] if weight is not None else 0
        if prune is None:
            prune = vocab > PRUNE_ABOVE
        if prune and weight is not None and vocab > keep:
            self.head = PrunedHead(weight, keep, extra_ids)
        self._mask_key: tuple[int, int] | None = None
        self._mask: mx.array | None = None

    def reset(self) -> None:
        self.slot.reset()

    def bytes_per_token(self) -> int:
        total = self.runner.bytes_per_token()
        if self.head is not None:
            total -= self.head.weight.nbytes - self.head.nbytes
        return total

    def prepare(self, prompt: Sequence[int]) -> None:
        if self.head is not None:
            self.head.restart(prompt)
        self._catch_up(prompt, feed_max=1)

    def _catch_up(self, context: Sequence[int], feed_max: int = 8) -> list[int]:
        """Sync the draft's cache with ``context`` and return the ids still to
        feed. Up to ``feed_max`` of them are left for the first draft forward,
        which computes logits for the last one only; more are prefilled first
        (in chunks, without logits)."""
        pending = self.slot.sync_to(context)
        if self.head is not None:
            self.head.cover(pending)
        if len(pending) > feed_max:
            self.slot.prefill(pending[:-1])
            pending = pending[-1:]
        return pending

    def head_logits(self, h: mx.array) -> mx.array:
        """Logits for final hidden states [L, H]: over ``head.rows`` when pruned."""
        if self.head is not None:
            return self.head(h)
        return self.runner.head(h)

    def forward_last(self, tokens: list[int] | mx.array, cache) -> mx.array:
        """[1, V'] logits for the last of ``tokens`` fed into ``cache`` (V' =
        the pruned width if pruned): one draft step."""
        if self.head is None:
            return self.runner(tokens, cache, "last")
        return self.head(self.runner.hidden(tokens, cache)[-1:])

    def _logits(self, tokens: list[int] | mx.array) -> mx.array:
        """One draft step on the drafter's own cache. A device array's ids
        are recorded as -1 until the block is read back."""
        out = self.forward_last(tokens, self.slot.cache)
        self.slot.ids.extend([-1] * tokens.size if isinstance(tokens, mx.array) else tokens)
        return out

    def _to_token(self, idx: mx.array) -> mx.array:
        return self.head.rows[idx] if self.head is not None else idx

    def _target_ids_only(self, logits: mx.array, vocab: int) -> mx.array:
        """The draft's logits over ids the target has. A draft whose output
        layer is wider than the target's (a different padding of the same
        tokenizer) could otherwise propose an id the target has no row for,
        and acceptance would read some other token's probability for it."""
        if self.head is None:
            return logits[..., :vocab] if logits.shape[-1] > vocab else logits
        rows = self.head.rows
        if self._mask_key != (vocab, rows.size):
            self._mask_key = (vocab, rows.size)
            self._mask = None if int(mx.max(rows).item()) < vocab else rows < vocab
        return logits if self._mask is None else mx.where(self._mask, logits, -mx.inf)

    def _full_q(self, probs: mx.array, vocab: int) -> mx.array:
        """Draft probabilities over the target's vocabulary width (ids past
        it have probability 0: see ``_target_ids_only``)."""
        if self.head is not None:
            rows = self.head.rows
            full = mx.zeros((probs.shape[0], vocab), probs.dtype)
            keep = rows < vocab
            if not bool(mx.all(keep)):
                rows, probs = rows[keep], probs[:, keep]
            full[:, rows] = probs
            return full
        w = probs.shape[-1]
        if w == vocab:
            return probs
        return mx.concatenate([probs, mx.zeros((probs.shape[0], vocab - w), probs.dtype)], axis=1)

    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal:
        k = ctl.cap(self.name)
        if k <= 0:
            return Proposal(tokens=[], source=self.name)
        t0 = time.perf_counter()
        # Catch up on what was accepted since the last call (many tokens after
        # a run of lookup proposals in hybrid mode): that is draft forward time.
        feed: list[int] | mx.array = self._catch_up(context)
        greedy = ctl.sampling.greedy
        toks: list[mx.array] = []
        tokens: list[int] = []
        confs: list[float] = []
        q_rows: list[mx.array] = []
        while True:
            logits = self._target_ids_only(self._logits(feed).astype(mx.float32), ctl.vocab)
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


class DrafterChain:
    """Several drafters asked in order; the first that proposes wins the step.

    Hybrid mode is prompt lookup, then the draft model: lookup is free, so
    whenever the reply is copying from the prompt it wins outright, and the
    draft model drafts the rest. Every drafter but the last is told it has a
    fallback (``DraftControl.fallback``), so it can leave weak proposals to
    the next one.
    """

    def __init__(self, drafters: Sequence[Drafter]):
        self.drafters = list(drafters)
        self.name = "+".join(d.name for d in self.drafters)

    def prepare(self, prompt: Sequence[int]) -> None:
        for d in self.drafters:
            d.prepare(prompt)

    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal:
        *first, last = self.drafters
        for d in first:
            proposal = d.propose(context, replace(ctl, fallback=True))
            if proposal.tokens:
                return proposal
        return last.propose(context, ctl)

    def reset(self) -> None:
        for d in self.drafters:
            d.reset()
