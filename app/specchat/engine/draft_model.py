"""The draft model as a drafter: a small model with the target's tokenizer
drafts a block token by token, on its own KV cache.

Its blocks are drafted by the one draft step (drafting.py): ``propose``
runs it on the draft's cache; ssd/ runs it on branches of that cache on its
worker thread, starting where ``begin`` leaves the cache and adopting a
branch that was right (``adopt``).

Draft-side vocabulary pruning (as in FR-Spec): byte-level BPE vocabularies
are ordered by merge rank, roughly by frequency, so the first ids cover
almost all running text. Projecting the draft's hidden state onto those
rows only cuts the largest matmul of a small draft model by ~4x for a 150k
vocabulary. Proposals are still exact: greedy verification only compares
tokens, and for sampling q is the real (pruned) distribution.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from functools import partial

import mlx.core as mx

from specchat.engine import warmup
from specchat.engine.compat import compare_tokenizers, facts_from_tokenizer
from specchat.engine.drafter_kinds import DRAFT_MODEL
from specchat.engine.drafters import Build, DraftControl, Drafter, Proposal, Reading, Saved
from specchat.engine.drafting import DraftHead, draft_block
from specchat.engine.errors import EngineError
from specchat.engine.kv import CacheSlot, Tokens
from specchat.engine.loading import LoadedModel, load_folder
from specchat.engine.runner import Runner

PRUNE_ABOVE = 65_536
PRUNE_KEEP = 32_768
# Rows added for rare ids seen in a request's context, before they are forgotten.
CONTEXT_ROWS_MAX = 8_192
# Most pending context ids fed with the first draft forward; more are
# prefilled first (in chunks, without logits).
FEED_MAX = 8
# The draft reads at most the last WINDOW ids of a prompt (an agent's request
# holds files and tool results: thousands of ids a draft model would read
# for a reply of a dozen). When a conversation runs past it, the window moves
# to the last WINDOW_KEPT ids, leaving room for the turns that follow.
WINDOW = 1024
WINDOW_KEPT = 512


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

    def view(self, vocab: int) -> DraftHead:
        """Its rows as they are now, for a block over the target's ``vocab`` ids."""
        return DraftHead(vocab, self.rows, self.rows_max, self.base, self.extra_head)


class ModelDrafter(Drafter):
    """A small model that shares the target's tokenizer.

    Its cache holds a prefix of the context: ``propose`` feeds the context
    it has not seen yet, then every draft token but the last; ``kept`` drops
    the drafts the target did not keep.
    """

    name = DRAFT_MODEL.name
    own_cap_only = True

    def __init__(self, draft: LoadedModel, extra_ids: Sequence[int] = ()):
        """``extra_ids``: ids a pruned output layer always keeps (the
        special tokens)."""
        self.loaded = draft
        self.runner = Runner(draft.model, draft.info.model_type, draft.config)
        self.slot = CacheSlot(self.runner)
        # The context index of the cache's first position: the draft reads
        # at most a window of a long prompt's end (``window_start``).
        self.offset = 0
        self._prompt_length = 0  # this request's prompt, in ids
        self._extra_ids = list(extra_ids)
        self.head: PrunedHead | None = None
        weight = self.runner.head_weight()
        if weight is not None and weight.shape[0] > PRUNE_ABOVE:
            self.prune()

    def prune(self, keep: int = PRUNE_KEEP) -> None:
        """Project onto the first ``keep`` rows only (with the special tokens
        and the ids the context brings), as a vocabulary above PRUNE_ABOVE
        is; a small one too when asked (tests of the pruned path)."""
        weight = self.runner.head_weight()
        if weight is not None and weight.shape[0] > keep:
            self.head = PrunedHead(weight, keep, self._extra_ids)

    def reset(self) -> None:
        self.slot.reset()
        self.offset = 0

    def save(self) -> Saved:
        state = self.slot.take()
        saved = Saved((state, self.offset), state.nbytes)
        self.offset = 0
        return saved

    def restore(self, saved: Saved | None) -> None:
        if saved is None:
            self.reset()
        else:
            state, self.offset = saved.state
            self.slot.put(state)

    def bytes_per_token(self) -> int:
        total = self.runner.bytes_per_token()
        if self.head is not None:
            total -= self.head.weight.nbytes - self.head.nbytes
        return total

    def prepare(self, prompt: Sequence[int], request=None) -> Reading:
        """The cache keeps what it holds of the prompt's window (its end:
        ``window_start``); the rest is read by ``catch_up`` when it is more
        than a block's first forward feeds."""
        if self.head is not None:
            self.head.restart(prompt)
        start = window_start(len(prompt), self.offset)
        if start != self.offset:  # another window: nothing held is of use
            self.slot.reset()
            self.offset = start
        self.slot.sync_to(prompt[start:])
        self._prompt_length = len(prompt)
        unread = len(prompt) - start - self.slot.length
        return Reading(behind=unread > FEED_MAX, unread=unread, reader=self.name)

    def catch_up(self, context: Sequence[int]) -> None:
        reading_prompt = self.offset + self.slot.length < self._prompt_length
        self._pending(self._unseen(context), feed_max=1)
        if reading_prompt and self.offset + self.slot.length == self._prompt_length:
            # As the target's after its prefill: a regenerated reply (the same
            # prompt) goes back here on a cache that cannot drop positions.
            self.slot.mark_prompt()

    def _unseen(self, context: Sequence[int]) -> Sequence[int]:
        """The context's ids past what the cache holds (of its window)."""
        return context[self.offset + self.slot.length:]

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
        return self.head.view(vocab) if self.head is not None else DraftHead(vocab)

    def feed(self, tokens: Tokens, head: DraftHead) -> mx.array:
        """Feed tokens into the draft's own cache: what ``head`` reads."""
        return self.slot.feed(tokens, head.which)

    def begin(self, context: Sequence[int], vocab: int) -> tuple[list[int], DraftHead]:
        """Where a block for ``context`` starts: the cache catches up on
        what was accepted since the last block (many tokens after a run of
        suffix drafts in hybrid mode: draft forward time) but the last few
        ids, which the block's first forward feeds (returned), and is
        checkpointed; with the output columns as they are then."""
        first = self._pending(self._unseen(context))
        self.slot.checkpoint()
        return first, self.view(vocab)

    def adopt(self, cache: list, length: int) -> None:
        """Take a branch of the cache drafted elsewhere (ssd/'s worker)
        holding ``length`` positions of the context as the cache, checkpointed."""
        self.slot.adopt(cache, length - self.offset)
        self.slot.checkpoint()

    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal:
        k = ctl.cap(self.name)
        if k <= 0:
            return Proposal(tokens=[], source=self.name)
        t0 = time.perf_counter()
        first, head = self.begin(context, ctl.vocab)
        block = draft_block(head, lambda t: self.feed(t, head), first, k, ctl.sampling,
                            key_at=lambda _i: ctl.keys.next(),
                            keep_going=partial(ctl.keep_going, self.name), lazy=ctl.lazy)
        return block.proposal(self.name, head, ctl.sampling, t0)

    def kept(self, length: int) -> None:
        self.slot.rewind(max(0, min(self.slot.length, length - self.offset)))

    def finish(self, context: Sequence[int]) -> None:
        self.slot.settle(context[self.offset:])


def window_start(n: int, offset: int) -> int:
    """Where the draft's cache starts for a prompt of ``n`` ids, holding
    ``offset`` now: it stays while the prompt runs at most WINDOW past it
    (the turns of a conversation extend it, read once), else moves to
    WINDOW_KEPT before the end. The draft only proposes; the target checks
    every token, so how much it has read changes speed, never output."""
    if offset <= n and n - offset <= WINDOW:
        return offset
    return max(0, n - WINDOW_KEPT)


def build(b: Build) -> ModelDrafter:
    """drafter_kinds.DRAFT_MODEL's maker: the draft model in ``b.folder``,
    refused in words when its tokenizer is not the target's, and warmed up
    as the target is (warmup.py)."""
    loaded = load_folder(b.folder, b.compute, b.say)
    reasons = compare_tokenizers(facts_from_tokenizer(b.target.tokenizer),
                                 facts_from_tokenizer(loaded.tokenizer))
    if reasons:
        del loaded
        gc.collect()
        raise EngineError(f"{b.folder.name} cannot draft for {b.target.info.name}: "
                          + "; ".join(reasons))
    special = set(b.end_ids) | set(b.target.tokenizer.get_added_vocab().values())
    drafter = ModelDrafter(loaded, extra_ids=sorted(special))
    b.say(f"warming up {loaded.info.name}")
    warmup.warm(drafter.runner)
    return drafter
