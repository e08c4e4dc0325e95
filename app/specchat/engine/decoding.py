"""The decoding loop: plain decoding and every kind of speculation are one
loop whose drafter may propose nothing.

Each step asks the drafter for a block d1..dK (drafters.py; the draft model
is draft_model.py), feeds [last token, d1..dK] to the target in one forward
pass, decides on the device how many drafts to keep (verifier.py, with
acceptance.py's rules), reads that decision back with one host sync, then
rolls back: the target's cache and the drafter are told how many tokens of
context + block are kept (``CacheSlot.rewind``, ``Drafter.kept``), and a
StepEvent is emitted. Plain decoding is the K = 0 case of the same step, so
every mode shares stopping, streaming and statistics.

The loop is three small steps, in the spirit of mlx-lm's ``generate_step``:
``verified_blocks`` is a generator of what each verify step accepted,
``commit`` applies the stopping rules to a block and describes it as a
StepEvent, and ``summarize`` turns what was produced into the result.
``decode`` strings them together for one request, a ``Decoding``.

Break-even auto-off (auto_off.BreakEven) decides, before each step a
drafter would draft in, whether to speculate, decode plainly (the drafter is
not asked: a K = 0 step) or probe; it observes every step's timing after.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field

from mlx_lm.tokenizer_utils import TokenizerWrapper

from specchat.engine import threads
from specchat.engine.auto_off import PAUSED, PROBE, SPECULATE, auto_off_applies
from specchat.engine.draft_policy import DraftPolicy
from specchat.engine.drafters import NO_DRAFT, DraftControl, Drafter, Proposal, Reading
from specchat.engine.events import (
    REASONING,
    GenerateRequest,
    GenerationResult,
    StepEvent,
    Summary,
)
from specchat.engine.kv import CacheSlot
from specchat.engine.part_stats import PartCounter
from specchat.engine.reply_parts import Released, ReplySplitter, merged
from specchat.engine.sampling import KeyStream
from specchat.engine.textstream import TextStream
from specchat.engine.verifier import Verifier
from specchat.origins import TARGET


@dataclass
class Decoding:
    """One request, as the loop reads it (and never changes it)."""

    slot: CacheSlot  # the target's cache
    tokenizer: TokenizerWrapper
    end_ids: set[int]  # tokens that end the reply
    prompt_ids: Sequence[int]
    request: GenerateRequest
    drafter: Drafter | None  # None: plain decoding
    policy: DraftPolicy
    mode: str  # the mode's name, for the summary
    vocab: int  # the target's logits width
    cancelled: threading.Event | None = None
    # Splits the reply's text into reasoning, answer and tool calls and
    # finds its stop strings (reply_parts.py); none: a reply that is all
    # answer, with the request's stop strings.
    splitter: ReplySplitter | None = None


@dataclass
class Block:
    """One verify step's outcome, before the stopping rules: the drafts the
    target accepted, then its own next token."""

    proposal: Proposal
    accepted: int
    next_token: int
    started: float  # when the verify pass started (perf_counter)
    paused: bool = False  # decoded plainly: auto-off had paused speculation
    probe: bool = False  # speculated while paused, to see whether it pays again
    catch_up_s: float = 0.0  # the drafter catching up on paused tokens before a probe

    @property
    def tokens(self) -> list[int]:
        return [*self.proposal.tokens[:self.accepted], self.next_token]

    @property
    def origins(self) -> list[str]:
        return [*self.proposal.origins[:self.accepted], TARGET]


@dataclass
class _Tally:
    steps: int = 0
    paused: int = 0  # steps decoded plainly by auto-off
    drafted: int = 0
    accepted: int = 0
    forward_s: float = 0.0
    by_source: dict = field(default_factory=dict)
    by_origin: dict = field(default_factory=dict)  # emitted tokens per origin

    def add(self, proposal: Proposal, n: int) -> None:
        """One verify step: ``n`` of the proposal's tokens accepted. Each
        part (drafter kind) is counted on its own, under its kind and, within
        it, under its statistics key (``by_key``: the suffix drafter's source
        and match length)."""
        self.steps += 1
        self.drafted += proposal.k
        self.accepted += n
        for part, got in proposal.judged(n):
            d = self.by_source.setdefault(part.source, {"drafted": 0, "accepted": 0, "steps": 0})
            d["drafted"] += part.k
            d["accepted"] += got
            d["steps"] += 1
            if part.key != part.source:
                kd = d.setdefault("by_key", {}).setdefault(part.key, {"drafted": 0, "accepted": 0})
                kd["drafted"] += part.k
                kd["accepted"] += got

    def emitted(self, origins: Sequence[str]) -> None:
        for o in origins:
            self.by_origin[o] = self.by_origin.get(o, 0) + 1


@dataclass
class Progress:
    """What a request has produced so far. The step generator reads the
    context and the token count; ``commit`` extends them."""

    started: float  # perf_counter at the request's start
    context: list[int]  # committed ids; the last one is not in the cache yet
    keys: KeyStream  # every random draw of the request, drafter and verifier alike
    stream: TextStream
    reading: Reading  # what the drafter said of the prompt as the request started
    prefill_s: float = 0.0  # reading the prompt: the target's prefill, then the drafter's
    reused: int = 0  # prompt tokens already in the cache
    prompt_read: bool = False  # the drafter has read the prompt
    out: list[int] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)  # each kept token's part
    text: list[str] = field(default_factory=list)
    finish: str = "length"
    done: bool = False
    ttft: float | None = None
    tally: _Tally = field(default_factory=_Tally)
    by_part: PartCounter = field(default_factory=PartCounter)  # fed every event emitted


def start(d: Decoding) -> Progress:
    """The drafter reads what it keeps of the prompt and says how far the
    target may reuse its cache; the target prefills the rest (all but the
    prompt's last token, which the first step feeds): both count toward
    time to first token, not as a step. Starts the count of BLAS threads
    per step."""
    t_start = time.perf_counter()
    threads.governor().take_counts()
    keys = KeyStream(d.request.sampling.seed)
    stream = TextStream(d.tokenizer, d.request.stop_strings, d.splitter)
    reading = d.drafter.prepare(d.prompt_ids, d.request) if d.drafter is not None else Reading()
    pending = d.slot.sync_to(d.prompt_ids, limit=reading.reuse)
    d.slot.prefill(pending[:-1])
    d.slot.mark_prompt()
    d.policy.break_even.enabled = auto_off_applies(d.request, d.drafter is not None)
    prefill_s = time.perf_counter() - t_start
    run = Progress(started=t_start, context=list(d.prompt_ids), keys=keys, stream=stream,
                   reading=reading, prefill_s=prefill_s,
                   reused=len(d.prompt_ids) - len(pending))
    run.tally.forward_s += prefill_s
    return run


def _seeded(sampling) -> bool:
    return not sampling.greedy and sampling.seed is not None


def _read_prompt(d: Decoding, run: Progress) -> float:
    """The drafter reads what it has not seen of the prompt, once, before
    its first proposal: usually after the reply's first token went out, so
    that speculation costs no time to first token. Its time is prompt
    processing (``prefill_s``), kept out of the draft timing that the policy
    and auto-off learn from: a long prompt is not a slow drafter."""
    if run.prompt_read:
        return 0.0
    read_s = 0.0
    if run.reading.behind:
        # Not for a seeded sampled reply: whether the drafter is behind depends
        # on what an earlier reply left in its cache, and the seed promises
        # the same tokens whatever came before, so it drafts from the first step.
        seeded = _seeded(d.request.sampling)
        if run.tally.steps == 0 and run.reading.first_token_first and not seeded:
            return 0.0  # the first token first
        if not seeded and not d.policy.worth_reading(
                run.reading.reader or d.drafter.name, run.reading.unread, len(run.out),
                d.request.max_tokens - len(run.out)):
            return 0.0  # not yet: the reply so far has not paid for the reading
        read_s = _catch_up(d, run)
        run.prefill_s += read_s
    run.prompt_read = True
    return read_s


def _propose(d: Decoding, run: Progress, remaining: int) -> Proposal | None:
    """The drafter's block for this step, capped by the policy and by the
    token budget (the target's own token needs one)."""
    if d.drafter is None or remaining <= 1 or not (run.prompt_read or run.reading.drafts_behind):
        return None
    policy = d.policy
    ctl = DraftControl(
        sampling=d.request.sampling,
        keys=run.keys,
        vocab=d.vocab,
        cap=lambda kind, key=None: min(policy.cap(kind, key), remaining - 1),
        keep_going=policy.keep_going,
        lazy=policy.fixed_k is not None,
        policy=policy,
    )
    return d.drafter.propose(run.context, ctl)


def _catch_up(d: Decoding, run: Progress) -> float:
    """The drafter catches up on the context, timed apart: the prompt
    (above), or before a probe what it skipped while paused, so that the
    probe measures speculation and not the pause's backlog."""
    t0 = time.perf_counter()
    d.drafter.catch_up(run.context)
    return time.perf_counter() - t0


def _next_is_plain(d: Decoding, run: Progress, proposal: Proposal, remaining: int) -> bool:
    """Whether a step after this one is sure to come and to draft nothing, so
    that its forward can be queued before this one is read back, as plain
    decoding's is (verifier.py): no drafter; auto-off paused with no probe
    due; or a drafter that drafts only under its own cap, which the policy
    will keep at 0. A step that drafted may change any of that, so it never
    runs ahead; nor does the step that spends the token budget (as in
    mlx-lm's ``generate_step``), whose queued forward would only delay the
    next request. A wrong "yes" would verify drafts against a forward queued
    without them, which the verifier refuses."""
    if remaining <= 1 or proposal.k:
        return False
    if d.drafter is None:
        return True
    upcoming = d.policy.break_even.upcoming()
    if upcoming == PAUSED:
        return True
    return (upcoming == SPECULATE and run.prompt_read and d.drafter.own_cap_only
            and d.policy.declines(d.drafter.name))


def verified_blocks(d: Decoding, run: Progress) -> Iterator[Block]:
    """Draft, verify, roll back: one Block per step, until the request is
    cancelled or its budget spent (``run.finish`` says which). The caller
    commits each block before asking for the next, and closes the generator
    when it stops early, which drops a pipelined step's queued token."""
    verifier = Verifier(d.slot, d.request.sampling, d.request.draft.acceptance, run.keys)
    governor = threads.governor()
    last_end = time.perf_counter()  # where the previous verify ended
    try:
        while True:
            if d.cancelled is not None and d.cancelled.is_set():
                run.finish = "cancelled"
                return
            remaining = d.request.max_tokens - len(run.out)
            if remaining <= 0:
                run.finish = "length"
                return
            governor.tick()
            drafting = d.drafter is not None and remaining > 1
            step = d.policy.break_even.next_step() if drafting else None
            read_s = _read_prompt(d, run) if drafting and step != PAUSED else 0.0
            catch_up_s = _catch_up(d, run) if step == PROBE else 0.0
            proposal = (None if step == PAUSED else _propose(d, run, remaining)) or NO_DRAFT
            ahead = _next_is_plain(d, run, proposal, remaining)
            t_v = time.perf_counter()
            n, nxt = verifier.step(run.context[-1], proposal, ahead=ahead)
            end = time.perf_counter()
            verify_s = end - t_v
            # Roll back: context + the n accepted drafts are kept (the
            # target's own next token is fed with the next step).
            kept = len(run.context) + n
            if proposal.k:
                d.slot.rewind(kept)
            if d.drafter is not None:
                d.drafter.kept(kept)
            run.tally.forward_s += verify_s + proposal.draft_s + catch_up_s + read_s
            run.tally.add(proposal, n)
            run.tally.paused += step == PAUSED
            d.policy.observe_proposal(proposal, n)
            # The rest of the step's wall time (the previous block's commit and
            # event, proposing) is the loop's own work: auto-off counts it per step.
            other_s = end - last_end - verify_s - proposal.draft_s - catch_up_s - read_s
            last_end = end
            d.policy.break_even.observe(proposal, n, verify_s, other_s)
            yield Block(proposal, n, nxt, t_v, paused=step == PAUSED, probe=step == PROBE,
                        catch_up_s=catch_up_s)
    finally:
        verifier.close()


def _keep(d: Decoding, run: Progress, tokens: list[int]) -> tuple[list[int], list[str], Released]:
    """A block's tokens up to an end token, a stop string, the call that
    ends a reply of one call, or the token budget (which end the reply:
    ``run.done``); the text each released, and its parts."""
    kept: list[int] = []
    pieces: list[str] = []
    released = Released()
    for tok in tokens:
        if tok in d.end_ids:
            run.finish, run.done = "stop", True
            break
        kept.append(tok)
        got = run.stream.step(tok)
        pieces.append(got.raw)
        released.add(got)
        run.labels.append(got.part)
        if run.stream.stopped:
            run.finish, run.done = "stop_string", True
            break
        if run.stream.parts.done:
            run.finish, run.done = "tool_calls", True
            break
        if len(run.out) + len(kept) >= d.request.max_tokens:
            run.finish, run.done = "length", True
            break
    return kept, pieces, released


def _ending(run: Progress) -> tuple[str, Released]:
    """The text held back when the reply ends, and what the end of the
    reply releases of its parts (an open call read as it stands)."""
    released = run.stream.end()
    return released.raw, released


def commit(d: Decoding, run: Progress, block: Block) -> StepEvent:
    """Add a block's kept tokens to the reply (flushing the text when the
    reply ends) and describe the step."""
    kept, pieces, released = _keep(d, run, block.tokens)
    run.tally.emitted(block.origins[:len(kept)])
    run.out.extend(kept)
    run.context.extend(kept)
    if run.done:
        tail, end = _ending(run)
        released.add(end)
        if pieces:
            pieces[-1] += tail
        elif tail:
            pieces.append(tail)
    text = "".join(pieces)
    run.text.append(text)
    now = time.perf_counter()
    if run.ttft is None:
        run.ttft = now - run.started
    p = block.proposal
    event = StepEvent(
        index=run.tally.steps - 1,
        token_ids=tuple(kept),
        text=text,
        origins=tuple(block.origins[:len(kept)]),
        pieces=tuple(pieces) if len(pieces) == len(kept) else (),
        drafted=p.k,
        accepted=block.accepted,
        k=p.k,
        drafter=p.source or None,
        step_s=now - block.started + p.draft_s + block.catch_up_s,
        elapsed_s=now - run.started,
        total_tokens=len(run.out),
        paused=block.paused,
        probe=block.probe,
        origin_totals=tuple(run.tally.by_origin.items()),
        segments=merged(released.segments),
        parts=tuple(run.labels[len(run.labels) - len(kept):]),
        tool_calls=tuple(released.calls),
    )
    run.by_part.add(event)
    return event


def _tail_event(run: Progress, tail: str, released: Released) -> StepEvent:
    """Text held back when the reply ended between steps (cancelled, or
    the budget ran out), and its parts: no tokens, just the rest."""
    event = StepEvent(index=run.tally.steps, token_ids=(), text=tail, origins=(), drafted=0,
                      accepted=0, k=0, drafter=None, step_s=0.0,
                      elapsed_s=time.perf_counter() - run.started, total_tokens=len(run.out),
                      segments=merged(released.segments), tool_calls=tuple(released.calls))
    run.by_part.add(event)
    return event


def summarize(d: Decoding, run: Progress) -> GenerationResult:
    wall = time.perf_counter() - run.started
    decode_s = max(wall - run.prefill_s, 1e-9)
    tally, n = run.tally, len(run.out)
    parts = run.stream.parts
    # OpenAI's word for a reply that ended after calling tools.
    finish = "tool_calls" if parts.calls and run.finish in ("stop", "stop_string") else run.finish
    summary = Summary(
        mode=d.mode,
        finish_reason=finish,
        new_tokens=n,
        steps=tally.steps,
        drafted=tally.drafted,
        accepted=tally.accepted,
        acceptance_rate=(tally.accepted / tally.drafted) if tally.drafted else 0.0,
        tokens_per_step=(n / tally.steps) if tally.steps else 0.0,
        tokens_per_s=n / decode_s,
        ttft_s=run.ttft if run.ttft is not None else wall,
        wall_s=wall,
        prompt_tokens=len(d.prompt_ids),
        reused_prompt_tokens=run.reused,
        prefill_s=run.prefill_s,
        forward_s=tally.forward_s,
        overhead_s=max(0.0, wall - tally.forward_s),
        drafted_by=tally.by_source,
        tokens_by_origin=dict(tally.by_origin),
        blas_threads=threads.governor().take_counts(),
        drafter_stats=d.drafter.stats() if d.drafter is not None else {},
        paused_steps=tally.paused,
        auto_off=d.policy.break_even.report(),
        by_part=run.by_part.record(),
        ended_in_reasoning=parts.part == REASONING,
    )
    return GenerationResult(text="".join(run.text), token_ids=tuple(run.out), summary=summary,
                            answer="".join(parts.answer), reasoning="".join(parts.reasoning),
                            tool_calls=tuple(parts.calls), notes=tuple(parts.notes),
                            parts=tuple(run.labels), stop_string=parts.stop_string)


def decode(d: Decoding, on_step: Callable[[StepEvent], None] | None = None) -> GenerationResult:
    """One reply: prefill, then verified blocks committed until the reply
    ends, each step reported to ``on_step``."""
    emit = on_step or (lambda _event: None)
    run = None
    try:
        # The target's hidden states go to a drafter that reads them for this
        # request only, however it ends (a failed prefill included).
        with d.slot.tapped(d.drafter.hidden_tap if d.drafter is not None else None):
            run = start(d)
            with closing(verified_blocks(d, run)) as blocks:
                for block in blocks:
                    emit(commit(d, run, block))
                    if run.done:
                        break
    finally:
        # Whatever ended the reply, the caches hold a prefix of what was
        # committed, recorded for the next request's prefix reuse.
        if run is not None:
            d.slot.settle(run.context)
            if d.drafter is not None:
                d.drafter.finish(run.context)
    tail, released = _ending(run)
    if tail or released.segments or released.calls:
        run.text.append(tail)
        emit(_tail_event(run, tail, released))
    return summarize(d, run)
