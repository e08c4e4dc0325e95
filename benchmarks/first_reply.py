"""Time to the first reply's first token after a pair loads, against later
replies' (issue 47: 6.6 s for the first, 0.7 s later). Each reply is a new
conversation (no prefix to reuse but the system prompt's), greedy, a few
tokens; the pair is loaded in this process first, as the app loads it.

    python benchmarks/first_reply.py --target bundled:qwen2.5-coder-1.5b \\
        --draft bundled:qwen2.5-coder-0.5b --json docs/bench/i47-first-reply.json

Run it on two checkouts (PYTHONPATH=<checkout>/app) to compare them: it uses
only what both have (Engine.load, Engine.generate).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

PROMPTS = ["Write a binary search in Python.", "Explain what a mutex is.",
           "Reverse a linked list in Rust.", "What does HTTP 304 mean?"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--mode", default="hybrid")
    p.add_argument("--json", dest="json_out")
    args = p.parse_args()
    # Never over a file already there. Not specchat.outputs: this script
    # also runs on checkouts from before it.
    if args.json_out and os.path.lexists(args.json_out):
        sys.exit(f"first_reply: {args.json_out} is already there; choose another --json file")

    from specchat import startup

    startup.prepare()
    from specchat.engine.events import DraftSettings, GenerateRequest, Message
    from specchat.engine.session import Engine
    from specchat.library.refs import resolve

    load_avg = os.getloadavg()
    engine = Engine()
    t0 = time.perf_counter()
    engine.load(resolve(args.target), resolve(args.draft))
    load_s = time.perf_counter() - t0
    rows = []
    for text in PROMPTS:
        first = []
        start = time.perf_counter()
        r = engine.generate(GenerateRequest(messages=(Message("user", text),), max_tokens=4,
                                            draft=DraftSettings(mode=args.mode)),
                            on_step=lambda ev, first=first: first or first.append(
                                time.perf_counter()))
        rows.append({"prompt": text, "first_token_s": first[0] - start,
                     "engine_ttft_s": r.summary.ttft_s, "prompt_tokens": r.summary.prompt_tokens,
                     "reused": getattr(r.summary, "reused_prompt_tokens", None)})
        print(f"{text[:34]:<36} first token {rows[-1]['first_token_s']:.2f} s "
              f"({r.summary.prompt_tokens} prompt tokens, {rows[-1]['reused']} reused)",
              flush=True)
    report = {"load_s": load_s, "replies": rows, "load_before": load_avg,
              "load_after": os.getloadavg(), "mode": args.mode}
    print(json.dumps({"load_s": round(load_s, 1),
                      "first": round(rows[0]["first_token_s"], 2),
                      "later": [round(r["first_token_s"], 2) for r in rows[1:]]}))
    if args.json_out:
        with open(args.json_out, "x", encoding="utf-8") as f:  # "x": never over a file
            f.write(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
