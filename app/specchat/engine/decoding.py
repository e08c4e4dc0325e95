"""The decoding loop: plain, draft-model, lookup and hybrid speculation are
one loop whose drafter may propose nothing.

Each step feeds [last token, d1..dK] to the target in one forward pass,
decides on the device how many drafts to keep (see acceptance.py), reads
that decision back with one host sync, rewinds the target's KV cache past
the rejected drafts, and emits a StepEvent. Plain decoding is the K = 0 case
of the same step, so every mode shares stopping, streaming and statistics.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.tokenizer_utils import TokenizerWrapper

from specchat.engine import acceptance, threads
from specchat.engine.draft_policy import DraftPolicy
from specchat.engine.drafters import DraftControl, Drafter, Proposal
from specchat.engine.events import GenerateRequest, GenerationResult, StepEvent, Summary
from specchat.engine.kv import CacheSlot
from specchat.engine.sampling import KeyStream, processed_logprobs
from specchat.engine.textstream import TextStream


@dataclass
class _Tally:
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    forward_s: float = 0.0
    by_source: dict | None = None

    def add(self, source: str | None, k: int, n: int) -> None:
        self.steps += 1
        self.drafted += k
        self.accepted += n
        if source and k:
            d = self.by_source.setdefault(source, {"drafted": 0, "accepted": 0, "steps": 0})
            d["drafted"] += k
            d["accepted"] += n
            d["steps"] += 1


class _Verifier:
    """Feeds [last token, d1..dK] to the target and decides on the device what
    to keep; ``step`` reads the decision back (one host sync).

    Plain decoding runs one step ahead, as mlx-lm's ``generate_step`` does:
    the next forward pass is queued on the still-lazy next token before the
    current one is read back, so the device does not sit idle while Python
    handles a token. The queued step's token joins the cache early; ``close``
    drops it, leaving the cache exactly as the unpipelined loop would.
    """

    def __init__(self, slot: CacheSlot, sampling, rule: str, keys: KeyStream, pipelined: bool):
        self.slot = slot
        self.sampling = sampling
        self.rule = rule
        self.keys = keys
        self.pipelined = pipelined
        self._queued: mx.array | None = None

    def _verdict(self, tokens: list[int] | mx.array, proposal: Proposal) -> mx.array:
        lazy = isinstance(tokens, mx.array)
        logits = self.slot.feed(tokens, "all", ids=[-1] if lazy else None).astype(mx.float32)
        drafts = mx.array(proposal.tokens, dtype=mx.int32)
        if self.sampling.greedy:
            return acceptance.greedy(logits, drafts)
        p = processed_logprobs(logits, self.sampling)
        if self.rule == "equality":
            return acceptance.equality(p, drafts, self.keys.next())
        return acceptance.rejection(p, drafts, proposal.q, self.keys.next())

    def step(self, last: int, proposal: Proposal) -> tuple[int, int]:
        """(accepted drafts, the target's next token)."""
        if not self.pipelined:
            n, nxt = self._verdict([last, *proposal.tokens], proposal).tolist()
            return n, nxt
        current = self._queued if self._queued is not None else self._verdict([last], proposal)
        self._queued = self._verdict(current[1:], proposal)
        mx.async_eval(self._queued)
        n, nxt = current.tolist()
        self.slot.ids[-1] = nxt  # the queued step fed it before it was known
        return n, nxt

    def close(self) -> None:
        if self._queued is not None:
            self.slot.rewind(len(self.slot.ids) - 1)
            self._queued = None


def decode(
    slot: CacheSlot,
    tokenizer: TokenizerWrapper,
    eos_ids: set[int],
    prompt_ids: Sequence[int],
    request: GenerateRequest,
    drafter: Drafter | None,
    policy: DraftPolicy,
    mode: str,
    vocab: int,
    cancelled: threading.Event | None = None,
    on_step: Callable[[StepEvent], None] | None = None,
) -> GenerationResult:
    t_start = time.perf_counter()
    governor = threads.governor()
    governor.take_counts()
    sampling = request.sampling
    keys = KeyStream(sampling.seed)
    stream = TextStream(tokenizer, request.stop_strings)
    tally = _Tally(by_source={})

    pending = slot.sync_to(prompt_ids)
    reused = len(prompt_ids) - len(pending)
    slot.prefill(pending[:-1])
    if drafter is not None:
        drafter.prepare(prompt_ids)
    prefill_s = time.perf_counter() - t_start
    tally.forward_s += prefill_s

    context = list(prompt_ids)  # committed ids; the last one is not in the cache yet
    out: list[int] = []
    text_parts: list[str] = []
    finish = "length"
    ttft = None
    no_draft = Proposal(tokens=[], source="")
    verifier = _Verifier(slot, sampling, request.draft.acceptance, keys, pipelined=drafter is None)

    while True:
        if cancelled is not None and cancelled.is_set():
            finish = "cancelled"
            break
        remaining = request.max_tokens - len(out)
        if remaining <= 0:
            finish = "length"
            break
        governor.tick()
        proposal = no_draft
        if drafter is not None and remaining > 1:
            ctl = DraftControl(
                sampling=sampling,
                keys=keys,
                vocab=vocab,
                cap=lambda src, r=remaining: min(policy.cap(src), r - 1),
                keep_going=policy.keep_going,
                lazy=policy.fixed_k is not None,
            )
            proposal = drafter.propose(context, ctl)
        k = proposal.k
        t_v = time.perf_counter()
        n, nxt = verifier.step(context[-1], proposal)
        verify_s = time.perf_counter() - t_v
        slot.rewind(len(slot.ids) - (k - n))
        tally.forward_s += verify_s + proposal.draft_s
        tally.add(proposal.source or None, k, n)
        policy.observe(proposal.key or None, k, n, proposal.confidences)

        new = [*proposal.tokens[:n], nxt]
        origins = ["draft"] * n + ["target"]
        kept: list[int] = []
        piece = []
        done = False
        for tok in new:
            if tok in eos_ids:
                finish, done = "stop", True
                break
            kept.append(tok)
            piece.append(stream.add(tok))
            if stream.stopped:
                finish, done = "stop_string", True
                break
            if len(out) + len(kept) >= request.max_tokens:
                finish, done = "length", True
                break
        out.extend(kept)
        context.extend(kept)
        if done:
            tail = stream.finish()
            if piece:
                piece[-1] += tail
            elif tail:
                piece.append(tail)
        text = "".join(piece)
        text_parts.append(text)
        now = time.perf_counter()
        if ttft is None:
            ttft = now - t_start
        if on_step is not None:
            on_step(StepEvent(
                index=tally.steps - 1,
                token_ids=tuple(kept),
                text=text,
                origins=tuple(origins[:len(kept)]),
                pieces=tuple(piece) if len(piece) == len(kept) else (),
                drafted=k,
                accepted=n,
                k=k,
                drafter=proposal.source or None,
                step_s=now - t_v + proposal.draft_s,
                elapsed_s=now - t_start,
                total_tokens=len(out),
            ))
        if done:
            break

    verifier.close()
    tail = stream.finish()  # cancelled, or the budget ran out between steps
    if tail:
        text_parts.append(tail)
        if on_step is not None:
            on_step(StepEvent(index=tally.steps, token_ids=(), text=tail, origins=(), drafted=0,
                              accepted=0, k=0, drafter=None, step_s=0.0,
                              elapsed_s=time.perf_counter() - t_start, total_tokens=len(out)))
    wall = time.perf_counter() - t_start
    decode_s = max(wall - prefill_s, 1e-9)
    summary = Summary(
        mode=mode,
        finish_reason=finish,
        new_tokens=len(out),
        steps=tally.steps,
        drafted=tally.drafted,
        accepted=tally.accepted,
        acceptance_rate=(tally.accepted / tally.drafted) if tally.drafted else 0.0,
        tokens_per_step=(len(out) / tally.steps) if tally.steps else 0.0,
        tokens_per_s=len(out) / decode_s,
        ttft_s=ttft if ttft is not None else wall,
        wall_s=wall,
        prompt_tokens=len(prompt_ids),
        reused_prompt_tokens=reused,
        prefill_s=prefill_s,
        forward_s=tally.forward_s,
        overhead_s=max(0.0, wall - tally.forward_s),
        drafted_by=tally.by_source,
        blas_threads=governor.take_counts(),
    )
    return GenerationResult(text="".join(text_parts), token_ids=tuple(out), summary=summary)
