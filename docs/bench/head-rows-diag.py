"""One prompt, four runs in a row on one loaded engine (spec-cold, spec,
spec-cold, spec), history empty, auto-off off: with the history empty the
two modes must draft alike, so any difference comes from state an earlier
request left behind (the draft head's context rows, before 2026-11-24).
Prints (mode, drafted, accepted, steps, origins, suffix keys, first 30 K).

    .venv/bin/python docs/bench/head-rows-diag.py
"""

from specchat import startup

startup.prepare()  # the system BLAS, before MLX is imported

from dataclasses import replace  # noqa: E402

from specchat.engine.events import SamplingParams  # noqa: E402
from specchat.library.engine_link import make_client  # noqa: E402
from specchat.tools.bench_runs import run_variant  # noqa: E402
from specchat.tools.prompts import load_prompts  # noqa: E402
from specchat.tools.variants import VARIANTS  # noqa: E402

prompt = load_prompts("benchmarks/prompts-history.jsonl")[0]  # h-palindrome
spec = replace(VARIANTS["spec"], auto_off=False)
cold = spec.cold()
client = make_client()
client.load("bundled:qwen2.5-coder-1.5b", "bundled:qwen2.5-coder-0.5b").wait()


def body(eng):
    eng.history.clear()
    out = []
    for v in (cold, spec, cold, spec):
        r = run_variant(eng, v, prompt, 128, SamplingParams())
        out.append((v.name, r.drafted, r.accepted, r.steps, r.origins, r.by_key, r.k_used[:30]))
    return out


for row in client.call(body).wait():
    print(row)
client.close()
