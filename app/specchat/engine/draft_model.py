"""The draft model as a drafter: a small model with the target's tokenizer
drafts a block token by token (``draft_block``), on its own KV cache.

``draft_block`` is the one proposal loop: ``ModelDrafter`` runs it on the
draft's cache, and ssd.py runs it on branches of that cache on its worker
thread. Either way a block stops after k tokens or where the policy's early
stop says (``keep_going``), and at T > 0 keeps each token's q row for
rejection sampling.

Draft-side vocabulary pruning (as in FR-Spec): byte-level BPE vocabularies
are ordered by merge rank, roughly by frequency, so the first ids cover
almost all running text. Projecting the draft's hidden state onto those
rows only cuts the largest matmul of a small draft model by ~4x for a 150k
vocabulary. Proposals are still exact: greedy verification only compares
tokens, and for sampling q is the real (pruned) distribution.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import mlx.core as mx

from specchat.engine.drafter_kinds import DRAFT_MODEL
from specchat.engine.drafters import DraftControl, Drafter, Proposal
from specchat.engine.events import SamplingParams
from specchat.engine.kv import CacheSlot, Tokens
from specchat.engine.loading import LoadedModel
from specchat.engine.runner import Runner
from specchat.engine.sampling import processed_logprobs, sample

PRUNE_ABOVE = 65_536
PRUNE_KEEP = 32_768
# Rows added for rare ids seen in a request's context, before they are forgotten.
CONTEXT_ROWS_MAX = 8_192
# Most pending context ids fed with the first draft forward; more are
# prefilled first (in chunks, without logits).
FEED_MAX = 8


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
        self.rows_max = max(self.base_set, default=-1)  # known on the host: no sync to read

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
        self.rows_max = max(max(self.base_set, default=-1), max(self.extra))
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


class DraftHead:
    """The draft's output layer as it is when a block starts, over the ids
    the target has. The pruned rows are fixed for the block (ssd.py's worker
    drafts while the engine thread may add rows). A draft whose output layer
    is wider than the target's (another padding of the same tokenizer) could
    otherwise propose an id the target has no row for, and acceptance would
    read some other token's probability for it: such columns are -inf."""

    def __init__(self, runner: Runner | None, pruned: PrunedHead | None, vocab: int,
                 rows: mx.array | None = None, rows_max: int = -1):
        """``rows`` (with their largest id): the target id of each column of
        logits a feed returns, for a drafter with a vocabulary of its own (an
        EAGLE-3 head's); otherwise columns are the target's ids."""
        self.vocab = vocab
        self.which = "hidden" if pruned is not None else "last"  # what a feed returns
        self.base = self.extra = self.mask = None
        self.rows = rows
        if pruned is not None:
            self.base, self.extra, self.rows = pruned.base, pruned.extra_head, pruned.rows
            rows_max = pruned.rows_max
        if rows_max >= vocab:
            self.mask = self.rows < vocab

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


@dataclass
class Drafted:
    """A block as drafting produced it: per token its confidence (its
    probability under the draft), when asked the draft's next choices there
    (id and probability, the token itself left out: ssd.py's guesses) and,
    when sampling, its q row."""

    tokens: list[int] = field(default_factory=list)
    confs: list[float] = field(default_factory=list)
    alts: list[list[tuple[int, float]]] = field(default_factory=list)
    q_rows: list[mx.array] = field(default_factory=list)
    forward_s: float = 0.0
    forwards: int = 0


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
        if greedy:
            probs = mx.softmax(logits, axis=-1)
            idx = mx.argmax(logits, axis=-1)
        else:
            lp = processed_logprobs(logits, sampling)
            probs = mx.exp(lp)
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
            n_top = min(alts + 1, probs.shape[-1])
            top = mx.argpartition(-probs[0], kth=n_top - 1)[:n_top]
            want += [head.ids(top), probs[0, top]]
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


class ModelDrafter(Drafter):
    """A small model that shares the target's tokenizer.

    Its cache holds a prefix of the context: ``propose`` feeds the context
    it has not seen yet, then every draft token but the last; ``kept`` drops
    the drafts the target did not keep.
    """

    name = DRAFT_MODEL.name
    own_cap_only = True

    def __init__(self, draft: LoadedModel, extra_ids: Sequence[int] = (), prune: bool | None = None,
                 keep: int = PRUNE_KEEP):
        self.loaded = draft
        self.runner = Runner(draft.model, draft.info.model_type, draft.config)
        self.slot = CacheSlot(self.runner)
        self._prompt_length = 0  # this request's prompt, in ids
        self.head: PrunedHead | None = None
        weight = self.runner.head_weight()
        vocab = weight.shape[0] if weight is not None else 0
        if prune is None:
            prune = vocab > PRUNE_ABOVE
        if prune and weight is not None and vocab > keep:
            self.head = PrunedHead(weight, keep, extra_ids)

    def reset(self) -> None:
        self.slot.reset()

    def bytes_per_token(self) -> int:
        total = self.runner.bytes_per_token()
        if self.head is not None:
            total -= self.head.weight.nbytes - self.head.nbytes
        return total

    def prepare(self, prompt: Sequence[int], request=None) -> None:
        """The prefix of the prompt the cache already holds is kept; the loop
        has the rest read (``catch_up``) after the reply's first token."""
        if self.head is not None:
            self.head.restart(prompt)
        self.slot.sync_to(prompt)
        self._prompt_length = len(prompt)

    def ready(self, context: Sequence[int]) -> bool:
        return len(context) - self.slot.length <= FEED_MAX

    def catch_up(self, context: Sequence[int]) -> None:
        reading_prompt = self.slot.length < self._prompt_length
        self._pending(context[self.slot.length:], feed_max=1)
        if reading_prompt and self.slot.length == self._prompt_length:
            # As the target's after its prefill: a regenerated reply (the same
            # prompt) goes back here on a cache that cannot drop positions.
            self.slot.mark_prompt()

    def _pending(self, pending: Sequence[int], feed_max: int = FEED_MAX) -> list[int]:
        """Prefill all but the last ``feed_max`` of the context ids the cache
        has not seen (they are left for the first draft forward, which
        computes logits for the last one only), covering them in the head."""
        pending = list(pending)
        if self.head is not None:
            self.head.cover(pending)
        if len(pending) > feed_max:
            self.slot.prefill(pending[:-1])
            pending = pending[-1:]
        return pending

    def forward_last(self, tokens: Tokens, cache) -> mx.array:
        """[1, V'] logits for the last of ``tokens`` fed into ``cache`` (V' =
        the pruned width if pruned): one draft step, as measuring tools time it."""
        if self.head is None:
            return self.runner(tokens, cache, "last")
        return self.head(self.runner(tokens, cache, "hidden"))

    def view(self, vocab: int) -> DraftHead:
        return DraftHead(self.runner, self.head, vocab)

    def feed(self, tokens: Tokens, head: DraftHead) -> mx.array:
        """Feed tokens into the draft's own cache: what ``head`` reads."""
        return self.slot.feed(tokens, head.which)

    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal:
        k = ctl.cap(self.name)
        if k <= 0:
            return Proposal(tokens=[], source=self.name)
        t0 = time.perf_counter()
        # Catch up on what was accepted since the last call (many tokens after
        # a run of suffix drafts in hybrid mode): that is draft forward time.
        first = self._pending(context[self.slot.length:])
        self.slot.checkpoint()
        head = self.view(ctl.vocab)
        block = draft_block(head, lambda t: self.feed(t, head), first, k, ctl.sampling,
                            key_at=lambda _i: ctl.keys.next(), keep_going=partial(ctl.keep_going, self.name),
                            lazy=ctl.lazy)
        q = None if ctl.sampling.greedy else head.full_q(block.q_rows)
        return Proposal(tokens=block.tokens, source=self.name, q=q, confidences=block.confs,
                        draft_s=time.perf_counter() - t0, forwards=block.forwards)

    def kept(self, length: int) -> None:
        self.slot.rewind(min(self.slot.length, length))

    def finish(self, context: Sequence[int]) -> None:
        self.slot.settle(context)
