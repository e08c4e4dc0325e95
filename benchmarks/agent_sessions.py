"""Two agents that alternate: time to first token with the prompt cache,
against each request read cold; and the prefill's speed against what this
CPU's BLAS reaches on the forward's own matrix sizes.

    python benchmarks/agent_sessions.py --target bundled:qwen2.5-coder-1.5b \\
        --draft bundled:qwen2.5-coder-0.5b --prompts benchmarks/prompts-agent.jsonl \\
        --tasks fix-add review --json docs/bench/i48-sessions.json

Two tasks' recorded requests (benchmarks/prompts-agent.jsonl: each turn a
request the OpenAI Agents SDK sent) run interleaved, A1 B1 A2 B2 ..., as an
agent and its sub-agent, or two editor windows, send them: each request
is what its agent sent after the previous one's reply. Three ways, in one
process: cold (every cache dropped before each request: the reference),
one conversation at a time (budget 0: the old single cache), and the
prompt cache (its default budget). Each request decodes a few tokens
(greedy, hybrid mode): time to first token is the target's prefill of
what its cache does not hold. Ids are checked equal across the three.

The BLAS reference: the matrix products a prefill of N tokens runs (each
layer's projections and MLP, the output layer for the last row only), timed
alone with MLX on the same dtype; tokens/s = N over their summed time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app"))


def interleaved(prompts, tasks: list[str]) -> list:
    turns = {t: [p for p in prompts if p.id.startswith(f"agent-{t}-")] for t in tasks}
    out = []
    for i in range(max(len(v) for v in turns.values())):
        out += [turns[t][i] for t in tasks if i < len(turns[t])]
    return out


def run(engine, order, way: str, max_tokens: int) -> list[dict]:
    from specchat.engine.events import DraftSettings
    from specchat.engine.prompt_cache import DEFAULT_BYTES

    engine.reset_cache()
    engine.set_prompt_cache(0 if way == "single" else DEFAULT_BYTES)
    rows = []
    for p in order:
        if way == "cold":
            engine.reset_cache()
        r = engine.generate(p.request(max_tokens=max_tokens, draft=DraftSettings(mode="hybrid")))
        s = r.summary
        rows.append({"id": p.id, "prompt_tokens": s.prompt_tokens,
                     "reused": s.reused_prompt_tokens, "ttft_s": s.ttft_s,
                     "prefill_s": s.prefill_s, "token_ids": list(r.token_ids)})
        print(f"  {way:<6} {p.id:<22} {s.prompt_tokens:>5} tok, reused {s.reused_prompt_tokens:>5}"
              f", first token {s.ttft_s:6.2f} s", flush=True)
    use = engine.prompt_cache_use()
    rows.append({"cache": {"budget": use.budget, "held": use.held,
                           "conversations": use.conversations, "switches": use.switches}})
    return rows


def blas_prefill(engine, n: int, repeats: int = 3) -> dict:
    """The prefill's matrix products for ``n`` tokens, timed alone."""
    import mlx.core as mx

    cfg = engine.target.config
    h, inter = int(cfg["hidden_size"]), int(cfg["intermediate_size"])
    heads, kv = int(cfg["num_attention_heads"]), int(cfg.get("num_key_value_heads", 1))
    d = h // heads
    layers = int(cfg["num_hidden_layers"])
    dtype = mx.float32 if engine.compute.dtype == "float32" else mx.float16
    shapes = [(h, heads * d), (h, kv * d), (h, kv * d), (heads * d, h),
              (h, inter), (h, inter), (inter, h)]
    x = {k: mx.random.normal((n, k)).astype(dtype) for k in {a for a, _ in shapes}}
    w = [mx.random.normal((a, b)).astype(dtype) for a, b in shapes]
    mx.eval(list(x.values()), w)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(layers):
            mx.eval([x[a] @ wi for (a, _), wi in zip(shapes, w, strict=True)])
        best = min(best, time.perf_counter() - t0)
    flops = 2 * n * layers * sum(a * b for a, b in shapes)
    return {"tokens": n, "seconds": best, "tokens_per_s": n / best, "gflops": flops / best / 1e9}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", default=str(ROOT / "benchmarks" / "prompts-agent.jsonl"))
    p.add_argument("--tasks", nargs=2, default=["fix-add", "review"])
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--json", dest="json_out")
    args = p.parse_args()
    from specchat import outputs

    if args.json_out:  # refused now, not after the run: never over a file already there
        try:
            outputs.file(args.json_out, "the report", None, "choose another --json file")
        except outputs.Refused as exc:
            sys.exit(f"{Path(__file__).name}: {exc}")

    from specchat import startup

    startup.prepare()
    from specchat.engine.session import Engine
    from specchat.library.refs import resolve
    from specchat.tools.prompts import load_prompts

    order = interleaved(load_prompts(args.prompts), args.tasks)
    engine = Engine()
    engine.load(resolve(args.target), resolve(args.draft))
    print(f"loaded; {len(order)} requests: {' '.join(q.id for q in order)}", flush=True)
    report = {"machine": {"cpu": platform.processor() or platform.machine(),
                          "cores": os.cpu_count(), "load": os.getloadavg()},
              "order": [q.id for q in order], "ways": {}}
    for way in ("cold", "single", "cache"):
        report["ways"][way] = run(engine, order, way, args.max_tokens)
    ids = {way: [r["token_ids"] for r in rows if "id" in r] for way, rows in report["ways"].items()}
    report["ids_identical"] = ids["cold"] == ids["single"] == ids["cache"]
    cold = {r["id"]: r for r in report["ways"]["cold"] if "id" in r}
    for way in ("single", "cache"):
        later = [r for r in report["ways"][way] if "id" in r][2:]  # after each agent's first
        ratios = [r["ttft_s"] / cold[r["id"]]["ttft_s"] for r in later]
        report[f"{way}_ttft_over_cold"] = {"median": statistics.median(ratios),
                                           "max": max(ratios)}
    rates = [r["prompt_tokens"] / r["prefill_s"] for r in cold.values() if r["prefill_s"] > 0]
    report["prefill_tokens_per_s"] = {"median": statistics.median(rates), "max": max(rates)}
    n = int(statistics.median(r["prompt_tokens"] for r in cold.values()))
    report["blas_reference"] = blas_prefill(engine, n)
    report["machine"]["load_after"] = os.getloadavg()
    print(json.dumps({k: v for k, v in report.items() if k != "ways"}, indent=2))
    if args.json_out:
        outputs.write_json(args.json_out, report, "the report", None,
                           "choose another --json file", indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
