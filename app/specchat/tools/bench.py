"""``specchat bench``: SpecChat's decoding modes against mlx-lm's, in one
process, on the same loaded weights, interleaved prompt by prompt.

What runs is a list of variants (variants.py); one run is bench_runs.py,
the forward-pass costs forward_timing.py, the report bench_report.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

import mlx.core as mx

from specchat.engine.errors import EngineError
from specchat.engine.events import LoadProgress, Message, SamplingParams
from specchat.engine.session import Engine
from specchat.library.engine_link import make_client
from specchat.library.facts import kv_shape
from specchat.library.memory import kv_bytes
from specchat.tools import bench_output, cpuload
from specchat.tools.bench_report import add_theory, format_report, machine_info, model_json, tables
from specchat.tools.bench_runs import Run, run_variant
from specchat.tools.forward_timing import relative_costs
from specchat.tools.prompts import Prompt, load_prompts
from specchat.tools.variants import VARIANTS, Variant


def _auto_off_note(r: Run) -> str:
    """What break-even auto-off did in a run (auto_off.BreakEven), where
    it applied: how many steps it decoded plainly, in how many pauses, and
    how many probes it spent finding out whether speculation paid again."""
    a = r.auto_off
    if not a:
        return ""
    return (f"  auto-off: paused {r.paused} steps ({a.get('pauses', 0)} pauses, "
            f"{a.get('probes', 0)} probes)")


def run_all(engine: Engine, prompts: list[Prompt], variants: list[Variant], max_tokens: int,
            sampling: SamplingParams, log=print, history: str = "none") -> dict[str, list[Run]]:
    """Every variant on every prompt, after one uncounted warm-up run each
    (first-call allocations); peak memory counts from after the warm-up.

    ``history="session"``: the history index starts empty and, after each
    prompt's runs, takes that prompt's conversation (its messages and the
    reply), as a user's day of chats would fill it; every variant it can
    change also runs cold (``-cold``: history ignored) on the same prompts.
    ``"none"``: the history stays empty."""
    warm = Prompt("warmup", "code", (Message("user", "Say hi."),))
    for v in variants:
        run_variant(engine, v, warm, 4, sampling)
    engine.history.clear()
    if history == "session":
        variants = variants + [v.cold() for v in variants if v.uses_history]
    mx.reset_peak_memory()
    runs: dict[str, list[Run]] = {v.name: [] for v in variants}
    for i, prompt in enumerate(prompts):
        # Rotate the order so no variant always runs first (or last).
        rot = variants[i % len(variants):] + variants[:i % len(variants)]
        for v in rot:
            r = run_variant(engine, v, prompt, max_tokens, sampling)
            runs[v.name].append(r)
            log(f"  {prompt.id:<22} {v.name:<15} {len(r.token_ids):>4} tok  "
                f"{r.tokens_per_s:6.2f} tok/s  accepted {r.accepted}/{r.drafted}"
                + _auto_off_note(r))
        if history == "session":
            reply = runs[rot[0].name][-1].token_ids
            ids = engine.prompt_ids(prompt.request())
            engine.history.put(f"bench:{prompt.id}", [*ids, *reply])
    return runs


def _memory(engine: Engine, prompts: list[Prompt], max_tokens: int, peak: int) -> dict:
    """Peak memory against the weights plus a KV cache for the longest run."""
    kv_tokens = max(len(engine.prompt_ids(p.request())) for p in prompts)
    kv_tokens += max_tokens + 16
    weights = engine.target.info.weight_bytes + (engine.draft.info.weight_bytes if engine.draft else 0)
    kv = 0
    for m in (engine.target, engine.draft):  # estimated as the library's memory check does
        if m is not None:
            layers, kv_heads, head_dim = kv_shape(m.config)
            per_token = 2 * layers * kv_heads * head_dim if layers and kv_heads and head_dim else 0
            kv += kv_bytes(per_token, kv_tokens, engine.compute.dtype)
    return {"peak_bytes": peak, "weights_bytes": weights, "kv_cache_bytes": kv,
            "ratio": peak / (weights + kv) if weights + kv else None}


def run_bench(engine: Engine, prompts: list[Prompt], modes: list[str], max_tokens: int,
              sampling: SamplingParams, log=print, background_load: int = 0,
              history: str = "none", auto_off: bool = True) -> dict:
    """The whole bench on the engine thread: the runs, their statistics, the
    forward-pass costs and theoretical speedups, memory, the machine.
    ``auto_off``: break-even auto-off for every SpecChat variant (on, as in
    the app, or off: speculation even where it is slower than plain)."""
    variants = [replace(VARIANTS[m], auto_off=auto_off) for m in modes]
    cannot = {v.name: why for v in variants if (why := v.cannot_run(engine.pair))}
    if cannot:
        raise EngineError("these modes cannot run on the models loaded: " + "; ".join(
            f"{name} {why}" for name, why in cannot.items()))
    runs = run_all(engine, prompts, variants, max_tokens, sampling, log, history)
    peak = mx.get_peak_memory()
    modes_out, by_kind = tables(runs, sampling.greedy)
    costs = relative_costs(engine, engine.prompt_ids(prompts[0].request()))
    add_theory(modes_out, costs)
    memory = _memory(engine, prompts, max_tokens, peak)
    return {
        "machine": machine_info(engine),
        "models": {
            "target": model_json(engine.target.info),
            "draft": model_json(engine.draft.info) if engine.draft else None,
            "head": model_json(engine.head.info) if engine.head else None,
        },
        "settings": {"max_tokens": max_tokens, "temperature": sampling.temperature,
                     "top_p": sampling.top_p, "top_k": sampling.top_k, "seed": sampling.seed,
                     "prompts": len(prompts), "modes": modes, "background_load": background_load,
                     "history": history, "auto_off": auto_off},
        "costs": costs,
        "memory": memory,
        "modes": modes_out,
        "by_kind": by_kind,
    }


def main(args: argparse.Namespace) -> int:
    prompts = load_prompts(args.prompts)
    if getattr(args, "kinds", None):
        prompts = [p for p in prompts if p.kind in args.kinds]
    if getattr(args, "ids", None):
        unknown = set(args.ids) - {p.id for p in prompts}
        if unknown:
            raise EngineError(f"{args.prompts} has no prompt {', '.join(sorted(unknown))}"
                              + (" of the kinds given" if args.kinds else ""))
        prompts = [p for p in prompts if p.id in args.ids]
    if not prompts:
        raise EngineError(f"{args.prompts} has no prompts of kind {', '.join(args.kinds)}")
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed)
    auto_off = getattr(args, "auto_off", "on") == "on"

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def progress(ev) -> None:
        if isinstance(ev, LoadProgress):
            log(f"[{ev.stage}] {ev.message}")

    client = make_client()
    pair = client.load(args.target, args.draft, head=getattr(args, "head", None)).wait(
        on_event=progress)
    log(f"loaded {pair.target.name} + {pair.draft.name if pair.draft else '-'}"
        f"{' + ' + pair.head.name if pair.head else ''} on "
        f"{pair.compute.device}/{pair.compute.dtype}/{pair.compute.blas}")
    modes = args.modes or [n for n, v in VARIANTS.items() if v.cannot_run(pair) is None]
    load_before = cpuload.load_average()
    with cpuload.BackgroundLoad(args.background_load):
        if args.background_load:
            log(f"background load: {args.background_load} spinning processes")
            time.sleep(3)  # let the scheduler spread them before the first run
        rep = client.call(lambda eng: run_bench(eng, prompts, list(modes), args.max_tokens,
                                                sampling, log, args.background_load,
                                                getattr(args, "history", "none"),
                                                auto_off)).wait()
    rep["machine"]["load_average"] = [load_before, cpuload.load_average()]
    rep["command"] = " ".join(["specchat", *sys.argv[1:]])
    print(format_report(rep))
    if args.json_out is not None:  # checked before anything loaded (cli.py), and again now
        bench_output.write(args.json_out, rep)
    client.close()
    return 0
