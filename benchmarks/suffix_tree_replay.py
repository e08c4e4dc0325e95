"""Would a tree of suffix continuations pay? Replayed offline on the target's
own greedy replies.

    .venv/bin/python benchmarks/suffix_tree_replay.py --target REF --prompts FILE \
        [--max-tokens 128] [--json OUT]

Greedy verification keeps a draft token exactly when it equals the target's
greedy token, so the target's greedy reply decides what any proposal would
have kept, without running a model again. For each prompt (in file order,
the history growing with every earlier prompt and reply, as in
``specchat bench --history session``), at every step of the reply this
replays the suffix drafter's proposal (the single path SpecChat verifies)
and a tree with one alternative branch per position (the second most
frequent continuation, as SuffixDecoding's speculation tree would add), and
counts the tokens each would have had accepted and the tokens each would
have sent to the target. With the measured verify slope s (each extra
verified token costs s of a one-token forward), the tree pays only if its
extra accepted tokens per step outweigh s times its extra verified tokens.
Tree attention itself is not needed to answer that.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from specchat import startup  # noqa: E402

startup.prepare()

from specchat.engine.events import DraftSettings, GenerateRequest  # noqa: E402
from specchat.engine.history import History  # noqa: E402
from specchat.engine.suffix import SuffixDrafter  # noqa: E402
from specchat.engine.suffix_index import SEP  # noqa: E402
from specchat.tools.prompts import load_prompts  # noqa: E402


def alternatives(drafter: SuffixDrafter, context: list[int], path: list[int]) -> list[int | None]:
    """For each position of ``path``, the second most frequent token the
    occurrences continue with there (None when there is none)."""
    out: list[int | None] = []
    for j in range(len(path)):
        ctx = [*context, *path[:j]]
        best = None
        for idx, end in ((drafter.conv, drafter.conv.n), (drafter.history.index, None)):
            if idx is None:
                continue
            found = idx.matches(ctx, 2)
            if not found:
                continue
            _m, pos = found[0]
            at = pos.astype(np.int64)
            nxt = idx.buf[np.minimum(at, idx.buf.size - 1)]
            if end is not None:
                nxt = np.where(at < end, nxt, SEP)
            vals, counts = np.unique(nxt[nxt != SEP], return_counts=True)
            order = np.argsort(-counts)
            cands = [int(vals[i]) for i in order if int(vals[i]) != path[j]]
            if cands:
                best = cands[0]
                break
        out.append(best)
    return out


def replay(drafter: SuffixDrafter, prompt: list[int], reply: list[int], cap: int) -> dict:
    """Step through the reply as speculation would, with the single path."""
    pos = 0
    stats = {"steps": 0, "path_accepted": 0, "path_verified": 0, "tree_accepted": 0,
             "tree_verified": 0}
    while pos < len(reply):
        ctx = [*prompt, *reply[:pos]]
        drafter.prepare(ctx)
        cands = drafter.candidates(ctx, cap)
        stats["steps"] += 1
        if not cands:
            pos += 1
            continue
        _origin, cont = max(cands, key=lambda c: c[1].score)
        path = cont.tokens
        truth = reply[pos:pos + len(path) + cap]
        n = 0
        while n < len(path) and n < len(truth) and path[n] == truth[n]:
            n += 1
        stats["path_accepted"] += n
        stats["path_verified"] += len(path)
        alts = alternatives(drafter, ctx, path)
        stats["tree_verified"] += len(path) + sum(a is not None for a in alts)
        extra = 0
        if n < len(path) and n < len(truth) and alts[n] == truth[n]:
            # The branch at the first rejection is right: one more token, and the
            # drafter's path from there would be verified next time anyway.
            extra = 1
        stats["tree_accepted"] += n + extra
        pos += n + extra + 1
    return stats


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--slope", type=float, default=0.11)
    ap.add_argument("--json")
    args = ap.parse_args()
    from specchat.library.engine_link import make_client

    client = make_client()
    client.load(args.target).wait()
    prompts = load_prompts(args.prompts)

    def work(engine):
        history = History()
        total: dict = {}
        for p in prompts:
            req = GenerateRequest(messages=p.messages, max_tokens=args.max_tokens,
                                  draft=DraftSettings(mode="plain"))
            ids = engine.prompt_ids(req)
            reply = list(engine.generate(req).token_ids)
            s = replay(SuffixDrafter(history=history), ids, reply, 24)
            print(p.id, s, file=sys.stderr, flush=True)
            for k, v in s.items():
                total[k] = total.get(k, 0) + v
            history.put(p.id, [*ids, *reply])
        return total

    total = client.call(work).wait()
    s = args.slope
    steps = total["steps"]
    path_rate = (total["path_accepted"] + steps) / (steps + s * total["path_verified"])
    tree_rate = (total["tree_accepted"] + steps) / (steps + s * total["tree_verified"])
    total["path_tokens_per_unit"] = path_rate
    total["tree_tokens_per_unit"] = tree_rate
    print(json.dumps(total, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(total, indent=2))
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
