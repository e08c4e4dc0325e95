"""Draft heads read back on the target's own replies.

For each prompt, the target writes its greedy reply (decoded with suffix
matching: the same ids as plain decoding); one target forward over prompt
and reply then gives the features the heads read and the target's own
choice at every position, and each head predicts every reply token from
the rows before it, as its first draft would (teacher-forced: the rows are
the target's real ones). The share it gets right is what its first draft's
acceptance would be if the head drafted at every position of those replies.
It tells a head that drafts badly from a drafter that is wired wrongly: on
the same replies, generation and read-back should agree.

    python benchmarks/head_readback.py --prompts benchmarks/prompts-unseen.jsonl \\
        --kinds code explain --max-tokens 128 HEAD [HEAD ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from specchat import startup  # noqa: E402

startup.prepare()  # the system BLAS before anything imports MLX


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("heads", nargs="+", help="EAGLE-3 head folders made for the target")
    p.add_argument("--target", default="bundled:qwen2.5-coder-1.5b")
    p.add_argument("--prompts", required=True, type=Path)
    p.add_argument("--kinds", nargs="+", default=["code", "explain"])
    p.add_argument("--max-tokens", type=int, default=128)
    args = p.parse_args()

    import mlx.core as mx
    from mlx_lm.models.cache import KVCache
    from specchat.engine import chat, eagle3, eagle3_format
    from specchat.engine.events import DraftSettings, GenerateRequest, Message
    from specchat.engine.session import Engine
    from specchat.library.refs import resolve

    engine = Engine()
    engine.load(resolve(args.target))
    runner = engine.target_runner
    layers = len(runner.trunk.layers)
    heads = {h: eagle3.load_head(eagle3_format.read(Path(h)), engine.target.model,
                                 engine.compute, Path(h).name, args.target)
             for h in args.heads}
    read = sorted({i for h in heads.values() for i in h.config.read_layers(layers)})
    totals = {h: [0, 0] for h in heads}
    for line in args.prompts.read_text(encoding="utf-8").splitlines():
        prompt = json.loads(line)
        if prompt["kind"] not in args.kinds:
            continue
        ids = chat.render(engine.target.tokenizer,
                          [Message(m["role"], m["content"]) for m in prompt["messages"]])
        t0 = time.time()
        reply = engine.generate(GenerateRequest(prompt_ids=tuple(ids), max_tokens=args.max_tokens,
                                                draft=DraftSettings(mode="hybrid"))).token_ids
        seq, n = [*ids, *reply], len(ids)
        logits, tapped = runner.tapped_forward(seq, None, layers=read)
        choice = mx.argmax(logits, axis=-1)
        rows = len(seq) - 1
        record = {"id": prompt["id"], "reply_tokens": len(reply),
                  "gen_s": round(time.time() - t0, 1)}
        for name, head in heads.items():
            feats = mx.concatenate([tapped[i] for i in head.config.read_layers(layers)], axis=-1)
            out = head(mx.array(seq[1:]), feats[:rows], [KVCache() for _ in head.layers], fed=True)
            drafts = head.rows()[mx.argmax(head.logits(out), axis=-1)]
            # Row p predicts the token after p + 1. The reply's first token
            # comes from the target's prefill, never from a draft: rows n - 1 on.
            hits = (drafts[:rows - 1] == choice[1:rows]).tolist()[n - 1:]
            totals[name][0] += sum(hits)
            totals[name][1] += len(hits)
            record[name] = round(sum(hits) / max(len(hits), 1), 4)
        print(json.dumps(record), flush=True)
    print(json.dumps({"total": {h: [a, b, round(a / max(b, 1), 4)]
                                for h, (a, b) in totals.items()}}), flush=True)


if __name__ == "__main__":
    main()
