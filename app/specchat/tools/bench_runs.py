"""Running one bench variant on one prompt: SpecChat's engine, or mlx-lm's
own ``generate_step`` and ``speculative_generate_step`` generators on the
same ``nn.Module`` objects the engine loaded.

Every run starts from an empty KV cache whose prompt (all but its last
token) is prefilled before the clock starts, for SpecChat and mlx-lm alike,
so tokens/s measures decoding only.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler

from specchat.engine import attention, threads
from specchat.engine.events import SamplingParams
from specchat.engine.session import Engine
from specchat.tools.forward_timing import prefill
from specchat.tools.prompts import Prompt
from specchat.tools.variants import Variant


@dataclass
class Run:
    """One variant on one prompt."""

    mode: str
    prompt: str
    kind: str
    token_ids: list[int]
    decode_s: float
    steps: int
    drafted: int
    accepted: int
    rejections: int  # steps that ended with a rejected draft
    overhead_s: float | None = None  # time outside forward passes (SpecChat only)
    wall_s: float = 0.0
    ttft_s: float | None = None  # request to first token, prefill included (SpecChat only)
    k_used: list[int] = field(default_factory=list)
    blas_threads: dict = field(default_factory=dict)  # steps at each BLAS thread count
    origins: dict = field(default_factory=dict)  # emitted tokens per origin (events.py)
    by_key: dict = field(default_factory=dict)  # suffix drafts per statistics key (source, match)
    # Drafted and accepted per drafter kind, each with its statistics keys
    # (Summary.drafted_by), and how often the hybrid asked each option.
    drafted_by: dict = field(default_factory=dict)
    hybrid: dict = field(default_factory=dict)  # Summary.drafter_stats["hybrid"]
    ssd: dict = field(default_factory=dict)  # the ssd mode's counts (Summary.drafter_stats["ssd"])
    paused: int = 0  # steps break-even auto-off decoded plainly
    auto_off: dict = field(default_factory=dict)  # what it measured (Summary.auto_off)

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.decode_s if self.decode_s > 0 else 0.0


def run_variant(engine: Engine, variant: Variant, prompt: Prompt, max_tokens: int,
                sampling: SamplingParams) -> Run:
    run = run_mlx_lm if variant.mlx_lm else run_ours
    return run(engine, variant, prompt, max_tokens, sampling)


def run_ours(engine: Engine, variant: Variant, prompt: Prompt, max_tokens: int,
             sampling: SamplingParams) -> Run:
    engine.reset_cache()
    events = []
    req = prompt.request(max_tokens=max_tokens, sampling=sampling, draft=variant.settings())
    engine.history.enabled = variant.history
    try:
        r = engine.generate(req, on_step=events.append)
    finally:
        engine.history.enabled = True
    s = r.summary
    steps = [e for e in events if e.token_ids or e.drafted]
    return Run(mode=variant.name, prompt=prompt.id, kind=prompt.kind, token_ids=list(r.token_ids),
               decode_s=s.wall_s - s.prefill_s, steps=s.steps, drafted=s.drafted,
               accepted=s.accepted,
               rejections=sum(1 for e in steps if e.drafted and e.accepted < e.drafted),
               overhead_s=s.overhead_s, wall_s=s.wall_s, ttft_s=s.ttft_s,
               k_used=[e.k for e in steps],
               blas_threads=s.blas_threads, origins=dict(s.tokens_by_origin),
               by_key=dict(s.drafted_by.get("suffix", {}).get("by_key", {})),
               drafted_by=copy.deepcopy(s.drafted_by),
               hybrid=dict(s.drafter_stats.get("hybrid", {})),
               ssd=dict(s.drafter_stats.get("ssd", {})), paused=s.paused_steps,
               auto_off=dict(s.auto_off))


def mlx_lm_tokens(engine: Engine, k: int, ids: list[int], max_tokens: int,
                   sampling: SamplingParams):
    """mlx-lm's generator for K drafts (0: plain), its caches prefilled
    with all but the prompt's last token."""
    target = engine.target.model
    sampler = make_sampler(temp=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
    if sampling.seed is not None:
        mx.random.seed(sampling.seed)
    cache = make_prompt_cache(target)
    prefill(target, cache, ids[:-1])
    last = mx.array(ids[-1:])
    if k == 0:
        return ((t, lp, False) for t, lp in generate_step(
            last, target, max_tokens=max_tokens, sampler=sampler, prompt_cache=cache))
    draft = engine.draft.model
    dcache = make_prompt_cache(draft)
    prefill(draft, dcache, ids[:-1])
    return speculative_generate_step(last, target, draft, num_draft_tokens=k,
                                     max_tokens=max_tokens, sampler=sampler,
                                     prompt_cache=cache + dcache)


def run_mlx_lm(engine: Engine, variant: Variant, prompt: Prompt, max_tokens: int,
               sampling: SamplingParams) -> Run:
    """mlx-lm's own generators on the engine's loaded models."""
    k = variant.k
    ids = engine.prompt_ids(prompt.request())
    eos = engine.end_ids
    out: list[int] = []
    from_draft: list[bool] = []
    # mlx-lm gets the same BLAS thread policy as SpecChat's loop (a tick
    # between the tokens it yields), so the comparison is of decoding alone;
    # and its own attention (engine/attention.py), as mlx-lm ships it.
    governor = threads.governor()
    with attention.stock():
        gen = mlx_lm_tokens(engine, k, ids, max_tokens, sampling)
        governor.take_counts()
        t0 = time.perf_counter()
        for tok, _lp, fd in gen:
            governor.tick()
            tok = int(tok)
            if tok in eos:
                break
            out.append(tok)
            from_draft.append(bool(fd))
            if len(out) >= max_tokens:
                break
        decode_s = time.perf_counter() - t0
        gen.close()
    rounds = _rounds(from_draft)
    return Run(mode=variant.name, prompt=prompt.id, kind=prompt.kind, token_ids=out,
               decode_s=decode_s, steps=len(rounds), drafted=len(rounds) * k,
               accepted=sum(rounds), rejections=sum(1 for n in rounds if n < k), wall_s=decode_s,
               k_used=[k] * len(rounds), blas_threads=governor.take_counts())


def _rounds(from_draft: list[bool]) -> list[int]:
    """Accepted draft tokens per mlx-lm round: each round yields its accepted
    draft tokens, then one token of the target's own."""
    rounds, n = [], 0
    for f in from_draft:
        if f:
            n += 1
        else:
            rounds.append(n)
            n = 0
    if n:
        rounds.append(n)  # cut short by the token budget or an end token
    return rounds
