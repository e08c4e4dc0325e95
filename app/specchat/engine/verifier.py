"""The target's side of a step: one forward pass over [last token, d1..dK]
and the acceptance decision, made on the device and read back with one host
sync (see acceptance.py for the rules)."""

from __future__ import annotations

import mlx.core as mx

from specchat.engine import acceptance
from specchat.engine.drafters import Proposal
from specchat.engine.events import SamplingParams
from specchat.engine.kv import CacheSlot
from specchat.engine.sampling import KeyStream, processed_logprobs


class Verifier:
    """Feeds [last token, d1..dK] to the target and decides on the device what
    to keep; ``step`` reads the decision back (one host sync).

    A step whose successor is known to draft nothing too (plain decoding; a
    request that auto-off has paused; a drafter the policy keeps at K = 0:
    decoding._next_is_plain) runs one step ahead, as mlx-lm's
    ``generate_step`` does: the next forward pass is queued on the
    still-lazy next token before the current one is read back, so the
    device does not sit idle while Python handles a token. The queued
    step's token joins the cache early; ``close`` drops it, leaving the
    cache exactly as the unpipelined loop would.
    Every feed starts with a checkpoint of the cache, so that a cache that
    cannot drop positions can go back (kv.py); the caller says how many
    positions to keep (``CacheSlot.rewind``).
    """

    def __init__(self, slot: CacheSlot, sampling: SamplingParams, rule: str, keys: KeyStream):
        self.slot = slot
        self.sampling = sampling
        self.rule = rule
        self.keys = keys
        self._queued: mx.array | None = None  # the next plain step's verdict, queued early

    def _verdict(self, tokens: list[int] | mx.array, proposal: Proposal) -> mx.array:
        self.slot.checkpoint()  # what a cache that cannot drop positions goes back to
        logits = self.slot.feed(tokens, "all").astype(mx.float32)
        drafts = mx.array(proposal.tokens, dtype=mx.int32)
        if self.sampling.greedy:
            return acceptance.greedy(logits, drafts)
        p = processed_logprobs(logits, self.sampling)
        if self.rule == "equality":
            return acceptance.equality(p, drafts, self.keys.next())
        return acceptance.rejection(p, drafts, proposal.q, self.keys.next())

    def step(self, last: int, proposal: Proposal, ahead: bool = False) -> tuple[int, int]:
        """(accepted drafts, the target's next token). With ``ahead`` (only
        for a step that drafts nothing), the next step is promised to draft
        nothing either, and its forward is queued before this one is read
        back."""
        current, self._queued = self._queued, None
        if current is not None and proposal.k:
            raise RuntimeError("a step was queued as plain, and then given drafts to verify")
        if current is None:
            current = self._verdict([last, *proposal.tokens], proposal)
        if ahead:
            if proposal.k:
                raise RuntimeError("only a step that drafts nothing can queue the next one")
            self._queued = self._verdict(current[1:], proposal)
            mx.async_eval(self._queued)
        n, nxt = current.tolist()
        return n, nxt

    def close(self) -> None:
        """Drop the queued step's token: the cache ends where the
        unpipelined loop's would."""
        if self._queued is not None:
            self.slot.rewind(self.slot.length - 1)
            self._queued = None
