"""The ``ssd`` mode's drafter: the draft model drafting the next block on
SSD's worker while the target verifies this one (see the package's
docstring). Its blocks come from the draft model's own step (its ``begin``,
``feed`` and ``adopt``, and drafting.py), with the keys of their positions
(plan.py), so a hit or a miss changes where the time goes, never the tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from specchat.engine.auto_off import ewma
from specchat.engine.draft_model import ModelDrafter
from specchat.engine.drafter_kinds import SSD
from specchat.engine.drafters import Build, DraftControl, Drafter, Proposal, Reading
from specchat.engine.drafting import Drafted, DraftHead
from specchat.engine.errors import EngineError
from specchat.engine.ssd.plan import MAX_KEYS, Key, draft_at, guesses
from specchat.engine.ssd.worker import Job, Spec, worker

EMA = 0.3  # weight of the newest timing


@dataclass(frozen=True)
class Settings:
    """How the drafter speculates. The defaults are what the app uses."""

    keys: int | None = None  # keys per job; None: as many as the measured overlap allows
    # Wait for every planned key before looking the outcome up: the worker's
    # timing then never decides hits (deterministic, for tests and replays).
    settle: bool = False
    device: str | None = None  # the worker's stream: "cpu", "gpu", None: MLX's default


DEFAULTS = Settings()


@dataclass
class Stats:
    """One request's speculation, for the Summary."""

    hits: int = 0  # blocks that were speculated (or being speculated) for the outcome
    misses: int = 0  # outcome not speculated: drafted the ordinary way
    fallbacks: int = 0  # nothing speculated at all (first step, unsupported cache, ...)
    hidden_s: float = 0.0  # draft forward seconds verification hid
    draft_s: float = 0.0  # draft forward seconds behind every block verified
    spec_s: float = 0.0  # worker forward seconds, used or not

    @property
    def overlap(self) -> float:
        return self.hidden_s / self.draft_s if self.draft_s > 0 else 0.0

    def fields(self) -> dict:
        return {**asdict(self), "overlap": self.overlap}


class SpeculativeDrafter(Drafter):
    """The `ssd` mode's drafter, built around the engine's draft model."""

    name = SSD.name

    def __init__(self, model: ModelDrafter):
        self.model = model
        self.counts = Stats()
        self._job: Job | None = None
        self._last: tuple[int, int] | None = None  # (context length, its last id) at the last block
        self._base: int | None = None  # the request's base for position keys
        self._window_s: float | None = None  # proposal to next proposal, measured
        self._forward_s: float | None = None  # one worker forward, measured
        self.branchable = all(type(c) is KVCache for c in model.slot.cache)

    def prepare(self, prompt: Sequence[int], request=None) -> Reading:
        """A request starts: its counts from zero, the draft synced to
        ``prompt``; the first block is drafted at once (the prompt read
        first, as prompt processing), as the overlap measurements in
        docs/benchmarks.md ran."""
        self._drop_job()
        self.counts = Stats()
        self._base = None
        return replace(self.model.prepare(prompt, request), first_token_first=False)

    def reset(self) -> None:
        self._drop_job()
        self.model.reset()

    def save(self) -> None:
        """Its conversation's state is the draft model's, saved with it."""
        self._drop_job()

    def restore(self, saved) -> None:
        self._drop_job()

    def stats(self) -> dict:
        """This request's counts, for Summary.drafter_stats."""
        return {self.name: self.counts.fields()}

    def kept(self, length: int) -> None:
        self.model.kept(length)

    def catch_up(self, context: Sequence[int]) -> None:
        self._drop_job()
        self.model.catch_up(context)

    def finish(self, context: Sequence[int]) -> None:
        self.model.finish(context)

    def _drop_job(self) -> None:
        """Cancel any speculation; the next step drafts the ordinary way."""
        self._last = None
        if self._job is not None:
            self._job.cancel()
            self._job = None
        worker().cancel()

    # -- one step ------------------------------------------------------------------------
    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal:
        t0 = time.perf_counter()
        spec, status, waited = self._collect(context)
        k = ctl.cap(self.name)
        if k <= 0:
            self._last = None
            return Proposal(tokens=[], source=self.name)
        if self._base is None and not ctl.sampling.greedy:
            a, b = ctl.keys.next().tolist()
            self._base = (int(a) << 32) | int(b)
        if spec is not None:
            self.counts.hits += 1
            head = self.model.view(ctl.vocab)
            block, forwards, q = self._hit(spec, waited, context, k, head, ctl)
        else:
            if status == "miss":
                self.counts.misses += 1
            else:
                self.counts.fallbacks += 1
            first, head = self.model.begin(context, ctl.vocab)  # it may add rows: head after
            block = self._draft(head, first, context, k, ctl)
            forwards, q = block.forwards, None
            self.counts.draft_s += block.forward_s
        self._launch(context, block, head, ctl)
        return block.proposal(self.name, head, ctl.sampling, t0, forwards=forwards, q=q)

    def _draft(self, head: DraftHead, first: list[int], context: Sequence[int], k: int,
               ctl: DraftControl, out: Drafted | None = None) -> Drafted:
        """Draft on the draft model's own cache, as the worker drafts: with
        the keys of the tokens' positions."""
        return draft_at(head, lambda t: self.model.feed(t, head), first, k, ctl.sampling,
                        self._base, len(context), partial(ctl.keep_going, self.name), out=out)

    def _hit(self, spec: Spec, waited: float, context: Sequence[int], k: int, head: DraftHead,
             ctl: DraftControl) -> tuple[Drafted, int, mx.array | None]:
        """The speculated block, cut or drafted on where the policy says:
        (the block, the forwards drafted on, its q when the worker's)."""
        block, more = self._use(spec, context, k, partial(ctl.keep_going, self.name))
        # Draft seconds on the critical path: waiting for the worker to
        # finish this key, and drafting on past what it speculated.
        exposed = waited
        hidden = max(0.0, spec.block.forward_s - waited)
        forwards, q = 0, None
        if more:  # the policy wants a longer block than was speculated: draft on
            before = block.forward_s, block.forwards
            self._draft(head, [block.tokens[-1]], context, k, ctl, out=block)
            exposed += block.forward_s - before[0]
            forwards = block.forwards - before[1]
        elif spec.q is not None:
            q = spec.q[:len(block.tokens)]
        self.counts.hidden_s += hidden
        self.counts.draft_s += hidden + exposed
        return block, forwards, q

    def _outcome(self, job: Job, context: Sequence[int]) -> Key | None:
        """(accepted, the target's token) of the last block, read off the
        context the loop committed since; None if the context did not
        follow that block (a new request, a paused step)."""
        if self._last is None:
            return None
        length, last = self._last
        n = len(context) - length - 1
        if not (0 <= n <= len(job.proposed)) or context[length - 1] != last:
            return None
        if list(context[length:length + n]) != job.proposed[:n]:
            return None
        return n, int(context[-1])

    def _collect(self, context: Sequence[int]) -> tuple[Spec | None, str, float]:
        """The last job's block for what was verified: (spec or None,
        "hit" | "miss" | "fallback", seconds waited for it)."""
        job, self._job = self._job, None
        if job is None:
            return None, "fallback", 0.0
        outcome = self._outcome(job, context)
        self._window_s = ewma(self._window_s, time.perf_counter() - job.submitted, EMA)
        spec, waited = job.take(outcome, DEFAULTS.settle)
        job.cancel()
        with job.cond:
            self.counts.spec_s += job.spent_s
            if job.forwards:
                self._forward_s = ewma(self._forward_s, job.spent_s / job.forwards, EMA)
        if outcome is None:
            return None, "fallback", waited
        return spec, ("hit" if spec is not None else "miss"), waited

    def _use(self, spec: Spec, context: Sequence[int], k: int,
             keep_going: Callable[[list[float]], bool]) -> tuple[Drafted, bool]:
        """Make the branch the draft's cache and cut the block where the
        engine's own drafting would have stopped (k tokens, or
        ``keep_going``); True if it would have drafted further."""
        # Past the context the branch holds t, then every token of the block but the last.
        self.model.adopt(spec.cache, len(context) + len(spec.block.tokens) - 1)
        b = spec.block
        keep, more = len(b.tokens), True
        for i in range(1, len(b.tokens) + 1):
            if i >= k or not keep_going(b.confs[:i]):
                keep, more = i, False
                break
        return Drafted(tokens=b.tokens[:keep], confs=b.confs[:keep], alts=b.alts[:keep],
                       q_rows=b.q_rows[:keep], forward_s=b.forward_s,
                       forwards=b.forwards), more

    # -- speculation -------------------------------------------------------------------
    def _budget(self, length: int, ctl: DraftControl) -> int:
        """Keys that fit in the overlap: measured seconds from one proposal
        to the next over seconds per worker forward (before measurements:
        the cost model's verify over its draft forward)."""
        if DEFAULTS.keys is not None:
            return DEFAULTS.keys
        if self._window_s is not None and self._forward_s:
            forwards = self._window_s / self._forward_s
        else:
            cost = getattr(ctl.policy, "cost", None)
            forwards = (cost.verify(length + 1) / cost.draft) if cost and cost.draft > 0 else 3.0
        return max(1, min(MAX_KEYS, int((forwards - 1) // max(length, 1))))

    def _launch(self, context: Sequence[int], block: Drafted, head: DraftHead,
                ctl: DraftControl) -> None:
        self._last = (len(context), int(context[-1])) if block.tokens else None
        if not block.tokens or not self.branchable:
            return
        budget = self._budget(len(block.tokens), ctl)
        if budget <= 0:
            return
        md = self.model
        start = len(context)
        base_len = start + len(block.tokens) - 1
        if md.slot.length < base_len:
            return
        snapshot = [(c.keys[..., :base_len, :], c.values[..., :base_len, :])
                    for c in md.slot.cache]
        mx.eval(snapshot)
        calib = getattr(ctl.policy, "calibration", None)
        accept = [calib(c) if calib is not None else c for c in block.confs]
        keys, bonus, p_bonus = guesses(block, accept, budget)
        job = Job(md.runner, head, snapshot, start, block, keys, bonus, p_bonus, len(block.tokens),
                  ctl.sampling, self._base, DEFAULTS.device)
        self._job = job
        worker().submit(job)


def build(b: Build) -> SpeculativeDrafter:
    """drafter_kinds.SSD's maker: around the pair's draft model (``b.base``)."""
    if not isinstance(b.base, ModelDrafter):
        raise EngineError("The ssd mode drafts ahead with a draft model; the loaded draft is a "
                          "draft head: use the draft or hybrid mode.")
    return SpeculativeDrafter(b.base)
