"""Replay greedy speculative decoding offline, to compare drafting policies.

With greedy decoding, what any drafting policy gets accepted is fixed by two
sequences per prompt: the target's greedy reply, and the draft's argmax (and
confidence) at every position of that reply. Recording them once lets any
policy be replayed in milliseconds against measured forward-pass costs,
instead of re-running the models for every idea.

    # record (runs the models once; MLX)
    python benchmarks/policy_replay.py record --target bundled:qwen2.5-coder-1.5b \\
        --draft bundled:qwen2.5-coder-0.5b --prompts benchmarks/prompts.jsonl --out rec.json
    # replay SpecChat's policies and mlx-lm-style fixed K (pure Python)
    python benchmarks/policy_replay.py replay rec.json --t1 0.2766 --slope 0.0855 --draft-s 0.0817

The replay uses the engine's own DraftPolicy and LookupDrafter, so what it
ranks is what the engine does. It leaves out host overheads (0.1% of a step
in the bench) and the draft's catch-up forwards over tokens it did not
propose, so its speedups run 10 to 20% above the bench's (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from specchat.engine import draft_policy as dp  # noqa: E402
from specchat.engine import modes  # noqa: E402
from specchat.engine.drafter_kinds import DRAFT_MODEL, LOOKUP  # noqa: E402
from specchat.engine.drafters import DraftControl, LookupDrafter  # noqa: E402


def record(args) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from specchat.engine.events import DraftSettings, GenerateRequest
    from specchat.engine.session import Engine
    from specchat.library.refs import resolve
    from specchat.tools.prompts import load_prompts

    engine = Engine()
    engine.load(resolve(args.target), resolve(args.draft))
    drafter = engine.model_drafter
    out = []
    for p in load_prompts(args.prompts):
        ids = engine.prompt_ids(GenerateRequest(messages=p.messages))
        engine.reset_cache()
        reply = engine.generate(GenerateRequest(messages=p.messages, max_tokens=args.max_tokens,
                                                draft=DraftSettings(mode="draft", k=4)))
        target = list(reply.token_ids)
        seq = ids + target
        h = drafter.runner.hidden(seq, make_prompt_cache(drafter.loaded.model))
        h = h[len(ids) - 1:len(seq) - 1]
        if drafter.head is not None:
            # The engine adds the prompt's rare ids to the pruned head at once
            # and the reply's as they appear; covering the prompt only slightly
            # understates what the draft can propose.
            drafter.head.cover(ids)
        logits = drafter.head_logits(h).astype(mx.float32)
        tok = drafter._to_token(mx.argmax(logits, axis=-1))
        conf = mx.max(mx.softmax(logits, axis=-1), axis=-1)
        mx.eval(tok, conf)
        out.append({"id": p.id, "kind": p.kind, "prompt": ids, "target": target,
                    "draft": tok.tolist(), "conf": conf.tolist()})
        print(p.id, len(target), file=sys.stderr, flush=True)
    Path(args.out).write_text(json.dumps(out))


def replay_one(rec: dict, mode: str, fixed_k: int | None, costs, draft_s: float) -> float:
    """Speedup over plain decoding for one recorded prompt: the mode's
    drafters in order (lookup, then the recorded draft model)."""
    t1, slope = costs
    drafters = modes.get(mode).drafters
    use_lookup, use_model = LOOKUP.name in drafters, DRAFT_MODEL.name in drafters

    def verify(m: int) -> float:
        return t1 * (1 + slope * (m - 1))

    prompt, target, draft, conf = rec["prompt"], rec["target"], rec["draft"], rec["conf"]
    n_tok = len(target)
    policy = dp.DraftPolicy(fixed_k, dp.CostModel(draft=draft_s / t1, slope=slope))
    lookup = LookupDrafter()
    i, seconds = 0, 0.0
    while i < n_tok:
        remaining = n_tok - i
        context = prompt + target[:i]
        ctl = DraftControl(sampling=None, keys=None, vocab=0, fallback=use_model,
                           cap=lambda kind, key=None, r=remaining: min(policy.cap(kind, key), r - 1))
        proposal, kind, key, confs = [], None, None, []
        if remaining > 1 and use_lookup:
            p = lookup.propose(context, ctl)
            proposal, kind, key = p.tokens, p.source, p.key
        if not proposal and remaining > 1 and use_model:
            k = ctl.cap(DRAFT_MODEL.name)
            while len(proposal) < k:
                pos = min(i + len(proposal), n_tok - 1)
                proposal.append(draft[pos])
                confs.append(conf[pos])
                seconds += draft_s
                if len(proposal) >= k or not policy.keep_going(confs):
                    break
            kind = key = DRAFT_MODEL.name if proposal else None
        k = len(proposal)
        n = 0
        while n < k and proposal[n] == target[i + n]:
            n += 1
        seconds += verify(k + 1)
        policy.observe(kind if k else None, key, k, n, confs)
        i += n + 1
    return n_tok * verify(1) / seconds


def oracle_one(rec: dict, costs, draft_s: float, cap: int = DRAFT_MODEL.cap) -> float:
    """Speedup of a draft-model policy that knows in advance how many draft
    tokens the target will accept: it drafts exactly those (when that pays)
    and never wastes a draft forward. No real policy can do better with this
    draft, so it bounds what smarter draft lengths could gain."""
    t1, slope = costs
    target, draft = rec["target"], rec["draft"]
    n_tok, i, seconds = len(target), 0, 0.0
    while i < n_tok:
        run = 0
        while i + run < n_tok - 1 and run < cap and draft[i + run] == target[i + run]:
            run += 1
        step = run * draft_s + t1 * (1 + slope * run)
        if run and step / (run + 1) < t1:
            seconds, i = seconds + step, i + run + 1
        else:
            seconds, i = seconds + t1, i + 1
    return n_tok * t1 / seconds


def replay(args) -> None:
    data = json.loads(Path(args.recording).read_text())
    costs = (args.t1, args.slope)
    runs = [("spec (hybrid, adaptive)", "hybrid", None, args.draft_s),
            ("draft model, adaptive", "draft", None, args.draft_s),
            ("lookup, adaptive", "lookup", None, args.draft_s)]
    runs += [(f"draft model, K={k}", "draft", k, args.draft_s) for k in (2, 3, 4, 6)]
    runs += [("draft model, oracle", "oracle", None, args.draft_s)]
    for name, mode, k, ds in runs:
        if mode == "oracle":
            sp = [oracle_one(r, costs, ds) for r in data]
        else:
            sp = [replay_one(r, mode, k, costs, ds) for r in data]
        by: dict[str, list[float]] = {}
        for r, s in zip(data, sp, strict=True):
            by.setdefault(r["kind"], []).append(s)
        kinds = "  ".join(f"{kind} {statistics.median(v):.2f}x" for kind, v in by.items())
        print(f"{name:<26} median {statistics.median(sp):.2f}x  {kinds}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--target", required=True)
    r.add_argument("--draft", required=True)
    r.add_argument("--prompts", required=True)
    r.add_argument("--max-tokens", type=int, default=128)
    r.add_argument("--out", required=True)
    p = sub.add_parser("replay")
    p.add_argument("recording")
    p.add_argument("--t1", type=float, required=True, help="seconds per one-token target forward")
    p.add_argument("--slope", type=float, required=True, help="extra verify cost per token / t1")
    p.add_argument("--draft-s", type=float, required=True, help="seconds per draft forward")
    args = ap.parse_args()
    record(args) if args.cmd == "record" else replay(args)


if __name__ == "__main__":
    main()
