"""The bench's report: per-variant statistics (speed, acceptance, identity
with plain decoding, theoretical speedup), the machine it ran on, and the
table people read."""

from __future__ import annotations

import platform
import statistics
import time
from collections import Counter
from pathlib import Path

from specchat import origins
from specchat.engine import threads
from specchat.engine.drafter_kinds import key_parts
from specchat.engine.prompt_cache import common_prefix
from specchat.engine.session import Engine
from specchat.library.recommendations import cpu_name
from specchat.tools.bench_runs import Run
from specchat.tools.forward_timing import leviathan
from specchat.tools.prompts import KINDS
from specchat.tools.variants import MLX_LM_PLAIN, PLAIN, VARIANTS


def _alpha(runs: list[Run]) -> float | None:
    acc = sum(r.accepted for r in runs)
    trials = acc + sum(r.rejections for r in runs)
    return acc / trials if trials else None


def _drafted_by(runs: list[Run]) -> dict:
    """Drafted and accepted per drafter kind over the runs, each with its
    statistics keys (a head's drafts chained after a suffix draft are its
    ``after`` key's)."""
    out: dict[str, dict] = {}
    for r in runs:
        for source, d in r.drafted_by.items():
            o = out.setdefault(source, {"drafted": 0, "accepted": 0})
            o["drafted"] += d.get("drafted", 0)
            o["accepted"] += d.get("accepted", 0)
            for key, kd in (d.get("by_key") or {}).items():
                ko = o.setdefault("by_key", {}).setdefault(key, {"drafted": 0, "accepted": 0})
                ko["drafted"] += kd["drafted"]
                ko["accepted"] += kd["accepted"]
    return out


def summarize(runs: list[Run], plain: dict[str, list[int]], base_tps: float | None,
              mlx_plain_tps: float | None) -> dict:
    tps = statistics.median(r.tokens_per_s for r in runs)
    drafted = sum(r.drafted for r in runs)
    steps = sum(r.steps for r in runs)
    tokens = sum(len(r.token_ids) for r in runs)
    divergences = [{"prompt": r.prompt, "position": common_prefix(r.token_ids, plain[r.prompt])}
                   for r in runs if r.prompt in plain and r.token_ids != plain[r.prompt]]
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
    used: Counter[int] = Counter()  # steps at each BLAS thread count
    origins: Counter[str] = Counter()  # tokens per origin
    for r in runs:
        used.update(r.blas_threads)
        origins.update(r.origins)
    out["blas_threads"] = dict(sorted(used.items()))
    out["tokens_by_origin"] = dict(origins)
    by_match: dict[str, dict[str, int]] = {}
    for r in runs:
        for key, d in r.by_key.items():
            parts = key_parts(key)
            if parts is None:
                continue
            source, bucket = parts
            b = by_match.setdefault(f"{source} m>={bucket}", {"drafted": 0, "accepted": 0})
            b["drafted"] += d["drafted"]
            b["accepted"] += d["accepted"]
    out["suffix_by_match"] = dict(sorted(by_match.items()))
    out["drafted_by"] = _drafted_by(runs)
    hybrid: Counter[str] = Counter()
    for r in runs:
        hybrid.update(r.hybrid)
    if hybrid:
        out["hybrid_choices"] = dict(hybrid)
    ttft = [r.ttft_s for r in runs if getattr(r, "ttft_s", None) is not None]
    out["ttft_s"] = statistics.median(ttft) if ttft else None
    over = [r for r in runs if r.overhead_s is not None]
    if over:
        out["overhead_fraction"] = sum(r.overhead_s for r in over) / sum(r.wall_s for r in over)
    ssd = _ssd(runs)
    if ssd:
        out["ssd"] = ssd
    return out


def _ssd(runs: list[Run]) -> dict:
    """Speculative speculative decoding over the runs (engine/ssd/, the
    drafter's counts a Run keeps in ``ssd``): hit rate over the steps
    that drafted, and overlap: draft seconds hidden behind verification over
    all draft seconds behind the verified blocks."""
    got = [r.ssd for r in runs if getattr(r, "ssd", None)]
    if not got:
        return {}
    total = {k: sum(g.get(k, 0) for g in got)
             for k in ("hits", "misses", "fallbacks", "hidden_s", "draft_s", "spec_s")}
    steps = total["hits"] + total["misses"] + total["fallbacks"]
    return {**total, "hit_rate": total["hits"] / steps if steps else None,
            "overlap": total["hidden_s"] / total["draft_s"] if total["draft_s"] else None}


def tables(runs: dict[str, list[Run]], greedy: bool) -> tuple[dict, dict]:
    """Statistics per variant over every prompt, and per prompt kind. Speedups
    are against plain decoding, SpecChat's and mlx-lm's; with greedy decoding
    every variant's tokens are checked against plain decoding's."""
    plain_ids = {r.prompt: r.token_ids for r in runs.get(PLAIN.name, [])} if greedy else {}

    def median_tps(selected: dict[str, list[Run]], name: str) -> float | None:
        rs = selected.get(name)
        return statistics.median(r.tokens_per_s for r in rs) if rs else None

    def table(selected: dict[str, list[Run]]) -> dict:
        base, mlxb = median_tps(selected, PLAIN.name), median_tps(selected, MLX_LM_PLAIN.name)
        return {m: summarize(rs, plain_ids if m != PLAIN.name else {}, base, mlxb)
                for m, rs in selected.items() if rs}

    by_kind = {}
    for kind in KINDS:
        sel = {m: [r for r in rs if r.kind == kind] for m, rs in runs.items()}
        if any(sel.values()):
            by_kind[kind] = table(sel)
    return table(runs), by_kind


def add_theory(modes_out: dict, costs: dict) -> None:
    """Leviathan's speedup for each speculative variant at its measured
    acceptance and the measured costs (the best K for adaptive variants),
    and how much of it the variant reached."""
    slope, c = costs["verify_slope"], costs["draft_over_target"]

    def verify(m: int) -> float:
        return 1 + slope * (m - 1)

    for name, s in modes_out.items():
        variant = VARIANTS.get(name) or VARIANTS[name.removesuffix("-cold")]
        a = s.get("per_token_acceptance")
        if a is None or not variant.speculative:
            continue
        cost_c = variant.draft_cost(c)
        if variant.k is not None:
            s["theoretical_speedup"] = leviathan(a, variant.k, cost_c, verify)
        else:
            s["theoretical_speedup"] = max(leviathan(a, k, cost_c, verify) for k in range(1, 17))
        if s.get("speedup_vs_plain"):
            s["fraction_of_theory"] = s["speedup_vs_plain"] / s["theoretical_speedup"]


def machine_info(engine: Engine) -> dict:
    import importlib.metadata as md

    cpu = cpu_name() or platform.processor() or platform.machine()
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
        "attention": engine.compute.attention,
        "blas_threads": _thread_policy(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def _thread_policy() -> str:
    gov = threads.governor()
    if gov.active:
        return f"auto (1 to {gov.ceiling})"
    return f"fixed at {gov.threads}" if gov.fixed or gov.pinned else "not adjustable"


def model_json(info) -> dict:
    """A loaded model, as the report names it."""
    return {"name": info.name, "path": info.path, "model_type": info.model_type,
            "params": info.n_params, "dtype": info.dtype, "weight_bytes": info.weight_bytes}


def _cell(v, fmt: str, width: int, suffix: str = "") -> str:
    text = format(v, fmt) + suffix if isinstance(v, int | float) else "-"
    return text.rjust(width)


def sources(rep: dict) -> list[str]:
    """Where each speculative mode's tokens came from, per kind of prompt,
    and the suffix drafter's acceptance by source and match length: the
    report's lines for them (public: checked alone, without a whole run)."""
    out = []
    groups = {"all": rep["modes"], **rep["by_kind"]}
    rows = []
    for group, modes in groups.items():
        for name, s in modes.items():
            by = s.get("tokens_by_origin") or {}
            total = sum(by.values())
            if not total or set(by) <= {"target"}:
                continue
            shown = ["draft", "conversation", "history",
                     *(o for o in origins.drafted(by) if o not in ("draft", "conversation",
                                                                   "history")), "target"]
            shares = " ".join(f"{o} {by.get(o, 0) / total:.0%}" for o in shown)
            rows.append(f"{group:<11}{name:<16}{shares}")
    if rows:
        out += ["", "where the tokens came from (share of all tokens)"] + rows
    rows = []
    for name, s in rep["modes"].items():
        for bucket, d in (s.get("suffix_by_match") or {}).items():
            if d["drafted"]:
                rows.append(f"{name:<16}{bucket:<20}{d['accepted']:>6}/{d['drafted']:<6}"
                            f"{d['accepted'] / d['drafted']:>6.0%}")
    if rows:
        out += ["", "suffix drafts: accepted/drafted by source and match length"] + rows
    return out


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
    if st.get("history", "none") != "none":
        lines.append(f"history: {st['history']} (modes ending -cold ran with an empty history)")
    lines.append(f"background load: {load} spinning process{'es' if load != 1 else ''}"
                 + (f" (load average {m['load_average'][0]} at the start, {m['load_average'][1]}"
                    " at the end)" if m.get("load_average") else ""))

    def block(title: str, modes: dict) -> None:
        lines.append("")
        lines.append(title)
        lines.append(f"{'mode':<16}{'tok/s':>8}{'accept':>8}{'tok/step':>9}{'vs plain':>9}"
                     f"{'vs mlx-lm':>10}{'theory':>8}{'ttft s':>8}  identical")
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
                         f"{_cell(s.get('theoretical_speedup'), '.2f', 8, 'x')}"
                         f"{_cell(s.get('ttft_s'), '.2f', 8)}  {ident}")

    block("all prompts (tokens/s: median over prompts)", rep["modes"])
    for kind, modes in rep["by_kind"].items():
        block(f"{kind} prompts", modes)
    lines.extend(sources(rep))
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
    for name, v in rep["modes"].items():
        s = v.get("ssd")
        if s and s["hit_rate"] is not None:
            lines.append(f"{name}: next block ready for {s['hit_rate']:.0%} of steps ({s['hits']} hits, "
                         f"{s['misses']} misses, {s['fallbacks']} fallbacks); "
                         f"{s['overlap'] or 0:.0%} of draft time hidden behind verification")
    over = {k: v["overhead_fraction"] for k, v in rep["modes"].items() if "overhead_fraction" in v}
    if over:
        lines.append("time outside forward passes: " + ", ".join(f"{k} {v:.1%}" for k, v in over.items()))
    mem = rep["memory"]
    lines.append(f"peak memory {mem['peak_bytes'] / 2**30:.2f} GiB = {mem['ratio']:.2f}x "
                 f"(weights {mem['weights_bytes'] / 2**30:.2f} GiB + KV {mem['kv_cache_bytes'] / 2**30:.3f} GiB)")
    return "\n".join(lines)
