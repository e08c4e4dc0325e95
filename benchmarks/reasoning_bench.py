"""A reasoning workload on a pair that cannot think: the reasoning's and
the answer's speed apart, plain, SpecChat's speculation and mlx-lm's fixed K.

    python benchmarks/reasoning_bench.py --target bundled:qwen2.5-coder-1.5b \\
        --draft bundled:qwen2.5-coder-0.5b --json docs/bench/i49-reasoning.json

What it stands for (issue 49): the bundled Qwen2.5-Coder pair has no
thinking markers, so benchmarks/prompts-reasoning.jsonl asks it to reason
step by step between <think> and </think> before answering, as a thinking
model's template makes it do; the reply's reasoning is what comes before
"</think>" in its text, the answer what comes after. A real thinking model
marks them with tokens the engine splits on (engine/reply_parts.py); here
the split is the text's, done after decoding, so it cannot change what is
decoded. Each part's rate is its tokens over the time from the step that
began it to the step that ended it (the first token's prefill is left out,
as the bench leaves prefill out), greedy, idle, from empty caches.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app"))
END = "</think>"


def split_rates(stamps: list[tuple[float, int, str]]) -> dict:
    """Per part (reasoning, answer): tokens and tokens/s, from (time, tokens
    so far, text so far) after each step; the reasoning ends at the step
    whose text first holds END."""
    end = next((i for i, (_, _, text) in enumerate(stamps) if END in text), None)
    t0, n0 = stamps[0][0], stamps[0][1]
    out = {}
    if end is None:
        out["reasoning"] = _rate(stamps[-1][0] - t0, stamps[-1][1] - n0)
        return out
    out["reasoning"] = _rate(stamps[end][0] - t0, stamps[end][1] - n0)
    out["answer"] = _rate(stamps[-1][0] - stamps[end][0], stamps[-1][1] - stamps[end][1])
    return out


def _rate(seconds: float, tokens: int) -> dict:
    return {"tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds > 0 else None}


def ours(engine, prompt, mode: str, max_tokens: int) -> dict:
    from specchat.engine.events import DraftSettings

    engine.reset_cache()
    stamps: list[tuple[float, int, str]] = []
    steps: list[tuple[int, int]] = []  # (drafted, accepted) per step
    text: list[str] = []
    count = [0]

    def on_step(ev) -> None:
        text.append(ev.text)
        count[0] += len(ev.token_ids)
        stamps.append((time.perf_counter(), count[0], "".join(text)))
        steps.append((ev.drafted, ev.accepted))

    r = engine.generate(prompt.request(max_tokens=max_tokens, draft=DraftSettings(mode=mode)),
                        on_step=on_step)
    s = r.summary
    parts = split_rates(stamps)
    end = next((i for i, (_, _, t) in enumerate(stamps) if END in t), len(stamps) - 1)
    for part, span in (("reasoning", steps[:end + 1]), ("answer", steps[end + 1:])):
        if part in parts:
            drafted, accepted = sum(d for d, _ in span), sum(a for _, a in span)
            parts[part].update(drafted=drafted, accepted=accepted)
    return {"token_ids": list(r.token_ids), "parts": parts, "drafted": s.drafted,
            "accepted": s.accepted}


def mlx_lm(engine, prompt, k: int, max_tokens: int) -> dict:
    from specchat.engine.events import SamplingParams
    from specchat.tools.bench_runs import mlx_lm_tokens

    ids = engine.prompt_ids(prompt.request())
    tok = engine.target.tokenizer
    stamps, out = [], []
    gen = mlx_lm_tokens(engine, k, ids, max_tokens, SamplingParams())
    for t, _lp, _fd in gen:
        t = int(t)
        if t in engine.end_ids:
            break
        out.append(t)
        stamps.append((time.perf_counter(), len(out), tok.decode(out)))
        if len(out) >= max_tokens:
            break
    return {"token_ids": out, "parts": split_rates(stamps)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", default=str(ROOT / "benchmarks" / "prompts-reasoning.jsonl"))
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--ks", nargs="+", type=int, default=[2, 3, 4])
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

    prompts = load_prompts(args.prompts)
    engine = Engine()
    engine.load(resolve(args.target), resolve(args.draft))
    report = {"load_before": os.getloadavg(), "max_tokens": args.max_tokens, "runs": []}
    ways = [("plain", None), ("spec", None), *((f"mlx-lm-k{k}", k) for k in args.ks)]
    for prompt in prompts:
        for name, k in ways:
            run = (ours(engine, prompt, "plain" if name == "plain" else "hybrid",
                        args.max_tokens) if k is None else
                   mlx_lm(engine, prompt, k, args.max_tokens))
            run.update(prompt=prompt.id, way=name)
            report["runs"].append(run)
            parts = " ".join(f"{part} {v['tokens']} tok {v['tokens_per_s'] or 0:.2f} tok/s"
                             for part, v in run["parts"].items())
            print(f"{prompt.id:<18} {name:<10} {parts}", flush=True)
    report["load_after"] = os.getloadavg()
    plain_ids = {r["prompt"]: r["token_ids"] for r in report["runs"] if r["way"] == "plain"}
    report["ids_identical"] = {name: all(r["token_ids"] == plain_ids[r["prompt"]]
                                         for r in report["runs"] if r["way"] == name)
                               for name, _ in ways}
    summary = {}
    for name, _ in ways:
        for part in ("reasoning", "answer"):
            rates = [r["parts"][part]["tokens_per_s"] for r in report["runs"]
                     if r["way"] == name and part in r["parts"]
                     and r["parts"][part]["tokens_per_s"]]
            if rates:
                summary.setdefault(name, {})[part] = statistics.median(rates)
    report["median_tokens_per_s"] = summary
    print(json.dumps({"median_tokens_per_s": summary, "ids_identical": report["ids_identical"]},
                     indent=1))
    if args.json_out:
        outputs.write_json(args.json_out, report, "the report", None,
                           "choose another --json file", indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
