"""``specchat bench``: SpecChat's decoding modes against mlx-lm's, in one
process, on the same loaded weights, interleaved prompt by prompt.

Every run starts from an empty KV cache whose prompt (all but its last
token) is prefilled before the clock starts, for SpecChat and mlx-lm alike,
so tokens/s measures decoding only. mlx-lm's baselines run its own
``generate_step`` and ``speculative_generate_step`` generators on the same
``nn.Module`` objects the engine loaded.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler

from specchat.engine import cpuload, threads
from specchat.engine.draft_policy import expected_tokens
from specchat.engine.errors import EngineError
from specchat.engine.events import DraftSettings, GenerateRequest, Message, SamplingParams
from specchat.engine.kv import PREFILL_CHUNK, common_prefix
from specchat.engine.session import Engine

OURS = {
    "plain": DraftSettings(mode="plain"),
    "spec": DraftSettings(mode="hybrid"),
    "spec-k2": DraftSettings(mode="draft", k=2),
    "spec-k4": DraftSettings(mode="draft", k=4),
    "lookup": DraftSettings(mode="lookup"),
}
MLX_LM_K = {"mlx-lm-plain": 0, "mlx-lm-spec-k2": 2, "mlx-lm-spec-k3": 3, "mlx-lm-spec-k4": 4,
            "mlx-lm-spec-k6": 6}
KINDS = ("code", "explain", "grounded", "repetitive")


@dataclass
class Prompt:
    id: str
    kind: str
    messages: tuple[Message, ...]


@dataclass
class Run:
    """One mode on one prompt."""

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
    k_used: list[int] = field(default_factory=list)
    blas_threads: dict = field(default_factory=dict)  # steps at each BLAS thread count

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.decode_s if self.decode_s > 0 else 0.0


def load_prompts(path: str | Path) -> list[Prompt]:
    prompts = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            kind = obj["kind"]
            if kind not in KINDS:
                raise ValueError(f"kind must be one of {', '.join(KINDS)}")
            msgs = tuple(Message(m["role"], m["content"]) for m in obj["messages"])
            prompts.append(Prompt(str(obj["id"]), kind, msgs))
        except (ValueError, KeyError, TypeError) as exc:
            raise EngineError(f"{path}:{n}: not a prompt line ({exc})") from exc
    if not prompts:
        raise EngineError(f"{path}: no prompts")
    return prompts


# -- running one mode ------------------------------------------------------------------

def run_ours(engine: Engine, mode: str, prompt: Prompt, max_tokens: int,
             sampling: SamplingParams) -> Run:
    engine.reset_cache()
    events = []
    req = GenerateRequest(messages=prompt.messages, max_tokens=max_tokens, sampling=sampling,
                          draft=OURS[mode])
    r = engine.generate(req, on_step=events.append)
    s = r.summary
    steps = [e for e in events if e.token_ids or e.drafted]
    return Run(mode=mode, prompt=prompt.id, kind=prompt.kind, token_ids=list(r.token_ids),
               decode_s=s.wall_s - s.prefill_s, steps=s.steps, drafted=s.drafted,
               accepted=s.accepted,
               rejections=sum(1 for e in steps if e.drafted and e.accepted < e.drafted),
               overhead_s=s.overhead_s, wall_s=s.wall_s, k_used=[e.k for e in steps],
               blas_threads=s.blas_threads)


def prefill(model, cache, ids: list[int]) -> None:
    for i in range(0, len(ids), PREFILL_CHUNK):
        model(mx.array(ids[i:i + PREFILL_CHUNK])[None], cache=cache)
        mx.eval([c.state for c in cache])


def run_mlx_lm(engine: Engine, mode: str, prompt: Prompt, max_tokens: int,
               sampling: SamplingParams) -> Run:
    """mlx-lm's own generators on the engine's loaded models."""
    k = MLX_LM_K[mode]
    ids = engine.prompt_ids(GenerateRequest(messages=prompt.messages))
    eos = engine.end_ids
    target = engine.target.model
    sampler = make_sampler(temp=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
    if sampling.seed is not None:
        mx.random.seed(sampling.seed)
    cache = make_prompt_cache(target)
    prefill(target, cache, ids[:-1])
    last = mx.array(ids[-1:])
    if k == 0:
        gen = ((t, lp, False) for t, lp in generate_step(
            last, target, max_tokens=max_tokens, sampler=sampler, prompt_cache=cache))
    else:
        draft = engine.draft.model
        dcache = make_prompt_cache(draft)
        prefill(draft, dcache, ids[:-1])
        gen = speculative_generate_step(last, target, draft, num_draft_tokens=k,
                                        max_tokens=max_tokens, sampler=sampler,
                                        prompt_cache=cache + dcache)
    out: list[int] = []
    from_draft: list[bool] = []
    # mlx-lm gets the same BLAS thread policy as SpecChat's loop (a tick
    # between the tokens it yields), so the comparison is of decoding alone.
    governor = threads.governor()
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
    return Run(mode=mode, prompt=prompt.id, kind=prompt.kind, token_ids=out, decode_s=decode_s,
               steps=len(rounds), drafted=len(rounds) * k, accepted=sum(rounds),
               rejections=sum(1 for n in rounds if n < k), wall_s=decode_s,
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


# -- forward-pass costs ------------------------------------------------------------------

def step_time(forward, ids: list[int], m: int, cache, reps: int) -> float:
    """Median seconds for ``forward(last m ids, cache)``, rewinding the cache
    after each run so every repetition sees the same context."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(forward(ids[-m:], cache))
        times.append(time.perf_counter() - t0)
        for c in cache:
            c.trim(m)
    return statistics.median(times)


def measure_costs(engine: Engine, ids: list[int], reps: int = 3) -> dict:
    """Seconds per target forward over m tokens and per draft forward, on a
    real context, for Leviathan's formula. Each is timed as decoding runs it:
    the target with logits for every position, the draft with logits for the
    last position over its (pruned) head."""

    def timed(model, forward, m: int) -> float:
        cache = make_prompt_cache(model)
        prefill(model, cache, ids)
        return step_time(forward, ids, m, cache, reps)

    target = engine.target_runner
    costs = {"target": {m: timed(target.model, lambda x, c: target(x, c, "all"), m)
                        for m in (1, 3, 5, 9)}}
    drafter = engine.model_drafter
    if drafter is not None:
        costs["draft"] = timed(drafter.runner.model, drafter.forward_last, 1)
    return costs


def leviathan(alpha: float, k: int, c: float, verify) -> float:
    return expected_tokens(alpha, k) / (k * c + verify(k + 1))


# -- the report --------------------------------------------------------------------------

def _alpha(runs: list[Run]) -> float | None:
    acc = sum(r.accepted for r in runs)
    trials = acc + sum(r.rejections for r in runs)
    return acc / trials if trials else None


def summarize(runs: list[Run], plain: dict[str, list[int]], base_tps: float | None,
              mlx_plain_tps: float | None) -> dict:
    tps = statistics.median(r.tokens_per_s for r in runs)
    drafted = sum(r.drafted for r in runs)
    steps = sum(r.steps for r in runs)
    tokens = sum(len(r.token_ids) for r in runs)
    divergences = []
    for r in runs:
        ref = plain.get(r.prompt)
        if ref is None:
            continue
        if r.token_ids != ref:
            divergences.append({"prompt": r.prompt,
                                "position": common_prefix(r.token_ids, ref)})
    out = {
        "tokens_per_s": tps,
        "acceptance_rate": (sum(r.accepted for r in runs) / drafted) if drafted else None,
        "tokens_per_step": tokens / steps if steps else None,
        "speedup_vs_plain": tps / base_tps if base_tps else None,
        "speedup_vs_mlx_lm_plain": tps / mlx_plain_tps if mlx_plain_tps else None,
        "identical_to_plain": (not divergences) if plain else None,
        "divergences": divergences,
        "prompts": len(runs),
        "new_tokens": tokens,
        "per_token_acceptance": _alpha(runs),
        "mean_k": (sum(sum(r.k_used) for r in runs) / steps) if steps else 0.0,
    }
    used: dict[int, int] = {}
    for r in runs:
        for n, c in r.blas_threads.items():
            used[n] = used.get(n, 0) + c
    out["blas_threads"] = dict(sorted(used.items()))
    over = [r for r in runs if r.overhead_s is not None]
    if over:
        out["overhead_fraction"] = sum(r.overhead_s for r in over) / sum(r.wall_s for r in over)
    return out


def machine_info(engine: Engine) -> dict:
    import importlib.metadata as md

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return {
        "system": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "python": platform.python_version(),
        "mlx": md.version("mlx"),
        "mlx_lm": md.version("mlx-lm"),
        "device": engine.compute.device,
        "dtype": engine.compute.dtype,
        "blas": engine.compute.blas,
        "blas_threads": _thread_policy(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def _thread_policy() -> str:
    gov = threads.governor()
    if gov.active:
        return f"auto (1 to {gov.ceiling})"
    return f"fixed at {gov.threads}" if gov.fixed or gov.pinned else "not adjustable"


def run_bench(engine: Engine, prompts: list[Prompt], modes: list[str], max_tokens: int,
              sampling: SamplingParams, log=print, background_load: int = 0) -> dict:
    if any(m.startswith("mlx-lm-spec") or m.startswith("spec") for m in modes) and engine.draft is None:
        raise EngineError("the bench needs a draft model for the speculative modes")
    greedy = sampling.greedy
    # Warm-up: one short run per mode, not counted (first-call allocations).
    warm = Prompt("warmup", "code", (Message("user", "Say hi."),))
    for mode in modes:
        (run_ours if mode in OURS else run_mlx_lm)(engine, mode, warm, 4, sampling)
    mx.reset_peak_memory()
    runs: dict[str, list[Run]] = {m: [] for m in modes}
    order = list(modes)
    for i, prompt in enumerate(prompts):
        # Rotate the mode order so no mode always runs first (or last).
        rot = order[i % len(order):] + order[:i % len(order)]
        for mode in rot:
            fn = run_ours if mode in OURS else run_mlx_lm
            r = fn(engine, mode, prompt, max_tokens, sampling)
            runs[mode].append(r)
            log(f"  {prompt.id:<22} {mode:<15} {len(r.token_ids):>4} tok  "
                f"{r.tokens_per_s:6.2f} tok/s  accepted {r.accepted}/{r.drafted}")
    peak = mx.get_peak_memory()
    plain_ids = {r.prompt: r.token_ids for r in runs.get("plain", [])} if greedy else {}

    def table(selected: dict[str, list[Run]]) -> dict:
        base = statistics.median(r.tokens_per_s for r in selected["plain"]) if selected.get("plain") else None
        mlxb = (statistics.median(r.tokens_per_s for r in selected["mlx-lm-plain"])
                if selected.get("mlx-lm-plain") else None)
        return {m: summarize(rs, plain_ids if m != "plain" else {}, base, mlxb)
                for m, rs in selected.items() if rs}

    modes_out = table(runs)
    by_kind = {}
    for kind in KINDS:
        sel = {m: [r for r in rs if r.kind == kind] for m, rs in runs.items()}
        if any(sel.values()):
            by_kind[kind] = table(sel)

    ids = engine.prompt_ids(GenerateRequest(messages=prompts[0].messages))
    costs = measure_costs(engine, ids)
    t1 = costs["target"][1]
    slope = (costs["target"][9] - t1) / 8 / t1
    c = costs.get("draft", 0.0) / t1

    def verify(m: int) -> float:
        return 1 + slope * (m - 1)

    for m, s in modes_out.items():
        a = s.get("per_token_acceptance")
        if a is None or m in ("plain", "mlx-lm-plain"):
            continue
        cost_c = 0.0 if m == "lookup" else c
        if m in MLX_LM_K or m in ("spec-k2", "spec-k4"):
            k = MLX_LM_K.get(m) or int(m.rsplit("k", 1)[1])
            s["theoretical_speedup"] = leviathan(a, k, cost_c, verify)
        else:
            s["theoretical_speedup"] = max(leviathan(a, k, cost_c, verify) for k in range(1, 17))
        if s.get("speedup_vs_plain"):
            s["fraction_of_theory"] = s["speedup_vs_plain"] / s["theoretical_speedup"]

    kv_tokens = max(len(engine.prompt_ids(GenerateRequest(messages=p.messages))) for p in prompts)
    kv_tokens += max_tokens + 16
    weights = engine.target.info.weight_bytes + (engine.draft.info.weight_bytes if engine.draft else 0)
    kv = engine.kv_bytes(kv_tokens)
    return {
        "machine": machine_info(engine),
        "models": {
            "target": _model_json(engine.target.info),
            "draft": _model_json(engine.draft.info) if engine.draft else None,
        },
        "settings": {"max_tokens": max_tokens, "temperature": sampling.temperature,
                     "top_p": sampling.top_p, "top_k": sampling.top_k, "seed": sampling.seed,
                     "prompts": len(prompts), "modes": modes, "background_load": background_load},
        "costs": {"target_forward_s": costs["target"], "draft_forward_s": costs.get("draft"),
                  "draft_over_target": c, "verify_slope": slope},
        "memory": {"peak_bytes": peak, "weights_bytes": weights, "kv_cache_bytes": kv,
                   "ratio": peak / (weights + kv) if weights + kv else None},
        "modes": modes_out,
        "by_kind": by_kind,
    }


def _model_json(info) -> dict:
    return {"name": info.name, "path": info.path, "model_type": info.model_type,
            "params": info.n_params, "dtype": info.dtype, "weight_bytes": info.weight_bytes}


def _cell(v, fmt: str, width: int, suffix: str = "") -> str:
    text = format(v, fmt) + suffix if isinstance(v, int | float) else "-"
    return text.rjust(width)


def format_report(rep: dict) -> str:
    lines = []
    m = rep["machine"]
    lines.append(f"{m['cpu']} ({m['cores']} cores), {m['system']}, mlx {m['mlx']}, "
                 f"mlx-lm {m['mlx_lm']}, {m['device']}/{m['dtype']}/{m['blas']}"
                 + (f" (threads {m['blas_threads']})" if m.get("blas_threads") else "")
                 + f", {m['date']}")
    t, d = rep["models"]["target"], rep["models"]["draft"]
    lines.append(f"target {t['name']} ({t['params'] / 1e9:.2f}B {t['dtype']})"
                 + (f", draft {d['name']} ({d['params'] / 1e9:.2f}B {d['dtype']})" if d else ""))
    st = rep["settings"]
    lines.append(f"{st['prompts']} prompts, {st['max_tokens']} new tokens, temperature "
                 f"{st['temperature']}, seed {st['seed']}")
    load = st.get("background_load", 0)
    lines.append(f"background load: {load} spinning process{'es' if load != 1 else ''}"
                 + (f" (load average {m['load_average'][0]} at the start, {m['load_average'][1]}"
                    " at the end)" if m.get("load_average") else ""))

    def block(title: str, modes: dict) -> None:
        lines.append("")
        lines.append(title)
        lines.append(f"{'mode':<16}{'tok/s':>8}{'accept':>8}{'tok/step':>9}{'vs plain':>9}"
                     f"{'vs mlx-lm':>10}{'theory':>8}  identical")
        for name, s in modes.items():
            ident = {True: "yes", False: "NO", None: "-"}[s.get("identical_to_plain")]
            if s.get("divergences"):
                ident += " (" + ", ".join(f"{d['prompt']}@{d['position']}"
                                          for d in s["divergences"][:3]) + ")"
            lines.append(f"{name:<16}{_cell(s['tokens_per_s'], '.2f', 8)}"
                         f"{_cell(s['acceptance_rate'], '.0%', 8)}"
                         f"{_cell(s['tokens_per_step'], '.2f', 9)}"
                         f"{_cell(s['speedup_vs_plain'], '.2f', 9, 'x')}"
                         f"{_cell(s['speedup_vs_mlx_lm_plain'], '.2f', 10, 'x')}"
                         f"{_cell(s.get('theoretical_speedup'), '.2f', 8, 'x')}  {ident}")

    block("all prompts (tokens/s: median over prompts)", rep["modes"])
    for kind, modes in rep["by_kind"].items():
        block(f"{kind} prompts", modes)
    c = rep["costs"]
    lines.append("")
    lines.append("forward passes: target " + ", ".join(
        f"{m} tok {s * 1000:.0f} ms" for m, s in c["target_forward_s"].items())
        + (f"; draft 1 tok {c['draft_forward_s'] * 1000:.0f} ms (c = {c['draft_over_target']:.2f})"
           if c["draft_forward_s"] else ""))
    used = {k: v["blas_threads"] for k, v in rep["modes"].items() if v.get("blas_threads")}
    if used:
        lines.append("BLAS threads (steps at each count): " + ", ".join(
            f"{k} " + "/".join(f"{n}:{c}" for n, c in v.items()) for k, v in used.items()))
    over = {k: v["overhead_fraction"] for k, v in rep["modes"].items() if "overhead_fraction" in v}
    if over:
        lines.append("time outside forward passes: " + ", ".join(f"{k} {v:.1%}" for k, v in over.items()))
    mem = rep["memory"]
    lines.append(f"peak memory {mem['peak_bytes'] / 2**30:.2f} GiB = {mem['ratio']:.2f}x "
                 f"(weights {mem['weights_bytes'] / 2**30:.2f} GiB + KV {mem['kv_cache_bytes'] / 2**30:.3f} GiB)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from specchat.library.engine_link import make_client

    prompts = load_prompts(args.prompts)
    if args.max_tokens < 1:
        raise EngineError("--max-tokens must be at least 1")
    if args.background_load < 0:
        raise EngineError("--background-load must be 0 or more processes")
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed)
    from specchat.engine.events import LoadProgress
    from specchat.engine.worker import JobDone, JobFailed

    client = make_client()
    pair = None
    for ev in client.load(args.target, args.draft):
        if isinstance(ev, LoadProgress):
            print(f"[{ev.stage}] {ev.message}", file=sys.stderr)
        elif isinstance(ev, JobFailed):
            raise EngineError(ev.message)
        elif isinstance(ev, JobDone):
            pair = ev.result
    print(f"loaded {pair.target.name} + {pair.draft.name if pair.draft else '-'} on "
          f"{pair.compute.device}/{pair.compute.dtype}/{pair.compute.blas}", file=sys.stderr)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    load_before = cpuload.load_average()
    with cpuload.BackgroundLoad(args.background_load):
        if args.background_load:
            log(f"background load: {args.background_load} spinning processes")
            time.sleep(3)  # let the scheduler spread them before the first run
        rep = client.call(lambda eng: run_bench(eng, prompts, list(args.modes), args.max_tokens,
                                                sampling, log, args.background_load)).wait()
    rep["machine"]["load_average"] = [load_before, cpuload.load_average()]
    rep["command"] = " ".join(["specchat", *sys.argv[1:]])
    print(format_report(rep))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rep, indent=2))
    client.close()
    return 0
