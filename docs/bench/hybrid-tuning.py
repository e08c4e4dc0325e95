"""Tune the suffix hybrid in one process: the bundled pair loaded once, each
config patched in, spec run on a few multiturn prompts (history off)."""
import json, sys, time
sys.path.insert(0, "/work/main/app")
from specchat import startup
startup.prepare()
from dataclasses import replace
from specchat.library.engine_link import make_client
from specchat.tools.prompts import load_prompts
from specchat.tools.variants import VARIANTS
from specchat.tools.bench_runs import run_variant
from specchat.engine.events import SamplingParams
import specchat.engine.suffix as sfx
import specchat.engine.drafter_kinds as dk
import numpy as np
import specchat.engine.hybrid as hy
ORIG_CHOOSE = hy.HybridDrafter.choose

def win_choose(policy, s):
    best, k = ORIG_CHOOSE(policy, s)
    if s.key and s.key.startswith("suffix:conversation:") and int(s.key.rsplit(":", 1)[1]) >= 4:
        return "suffix", k
    return best, k

IDS = sys.argv[1].split(",")
CONFIGS = sys.argv[2].split(",")
prompts = [p for p in load_prompts("/work/main/benchmarks/prompts.jsonl") if p.id in IDS]
orig = dict(SPEC_FACTOR=sfx.SPEC_FACTOR, SPEC_OFFSET=sfx.SPEC_OFFSET, MIN_MATCH=sfx.MIN_MATCH,
            PRIORS=dict(dk.SUFFIX_PRIORS), best=sfx._best, cand=sfx.SuffixDrafter.candidates, choose=ORIG_CHOOSE)

def recent_candidates(self, context, limit):
    out = []
    found = self.conv.matches(context, sfx.MIN_MATCH)
    if found:
        m, pos = found[0]
        last = np.asarray([pos.max()])
        cap = min(limit, int(sfx.SPEC_FACTOR * m) + sfx.SPEC_OFFSET)
        cont = sfx.continuation(self.conv.buf, self.conv.n, last, m, cap, sfx.MIN_PROB)
        if cont.tokens:
            out.append((sfx.CONVERSATION, cont))
    return out

def apply(cfg):
    sfx.SPEC_FACTOR, sfx.SPEC_OFFSET, sfx.MIN_MATCH = orig["SPEC_FACTOR"], orig["SPEC_OFFSET"], orig["MIN_MATCH"]
    dk.SUFFIX_PRIORS.clear(); dk.SUFFIX_PRIORS.update(orig["PRIORS"])
    sfx.SuffixDrafter.candidates = orig["cand"]
    hy.HybridDrafter.choose = staticmethod(orig["choose"])
    for part in cfg.split("+"):
        if part in ("base", "lookup"):
            continue
        if part.startswith("F"):
            sfx.SPEC_FACTOR = float(part[1:])
        elif part.startswith("M"):
            sfx.MIN_MATCH = int(part[1:])
        elif part == "recent":
            sfx.SuffixDrafter.candidates = recent_candidates
        elif part == "hi":
            dk.SUFFIX_PRIORS.update({2: 0.5, 3: 0.65, 4: 0.75, 8: 0.9, 16: 0.95})
        elif part == "hi2":
            dk.SUFFIX_PRIORS.update({2: 0.5, 3: 0.7, 4: 0.85, 8: 0.93, 16: 0.97})
        elif part == "win":
            hy.HybridDrafter.choose = staticmethod(win_choose)
        else:
            raise SystemExit(f"unknown {part}")

client = make_client()
client.load("bundled:qwen2.5-coder-1.5b", "bundled:qwen2.5-coder-0.5b").wait()
sampling = SamplingParams(temperature=0.0, seed=0)

def work(engine):
    engine.history.enabled = False
    out = {}
    from specchat.tools.prompts import Prompt
    from specchat.engine.events import Message
    run_variant(engine, VARIANTS["spec"], Prompt("w", "code", (Message("user", "Say hi."),)), 4, sampling)
    for p in prompts:
        for cfg in CONFIGS:
            apply(cfg)
            v = replace(VARIANTS["spec-lookup" if cfg == "lookup" else "spec"], history=False)
            r = run_variant(engine, v, p, 128, sampling)
            model = sum(1 for _ in [])  # placeholder
            units = r.steps + 0.06 * r.drafted
            out.setdefault(cfg, []).append(dict(p=p.id, tps=r.tokens_per_s, n=len(r.token_ids),
                steps=r.steps, drafted=r.drafted, acc=r.accepted, origins=r.origins, ids=r.token_ids[:128]))
            print(f"{p.id:<24} {cfg:<16} {r.tokens_per_s:5.2f} tok/s steps {r.steps:3d} "
                  f"acc {r.accepted}/{r.drafted} {r.origins}", flush=True)
    apply("base")
    return out

out = client.call(work).wait()
for cfg, rows in out.items():
    print(cfg, "median", float(np.median([r["tps"] for r in rows])), "mean", float(np.mean([r["tps"] for r in rows])),
          "steps", sum(r["steps"] for r in rows))
json.dump(out, open(f"/tmp/run/tune-{int(time.time())}.json", "w"))
client.close()
