"""Probe: load time of the bundled pair, and the verify curve (m = 1..9) on a short and a real context."""
import statistics, sys, time
from specchat.engine import blas; print(blas.preload(), flush=True)
from mlx_lm.models.cache import make_prompt_cache
from specchat.engine.events import GenerateRequest, LoadProgress, Message
from specchat.engine.measure import prefill
from specchat.library.engine_link import make_client
import mlx.core as mx

t0 = time.time()
client = make_client()
pair = client.load("bundled:qwen2.5-coder-1.5b", "bundled:qwen2.5-coder-0.5b").wait(
    on_event=lambda ev: print(f"{time.time()-t0:6.1f}s [{ev.stage}] {ev.message}", flush=True) if isinstance(ev, LoadProgress) else None)
print(f"loaded in {time.time()-t0:.1f}s", flush=True)

def curve(eng, n_ctx, reps=5):
    ids = eng.prompt_ids(GenerateRequest(messages=(Message("user", "Write a Python function that parses a CSV file of sales and returns the total per region, with type hints and a docstring. " * 8),)))[:n_ctx]
    r = eng.target_runner
    cache = make_prompt_cache(r.model)
    prefill(r.model, cache, ids)
    out = {}
    for m in (1, 2, 3, 4, 5, 9, 1):
        ts = []
        for _ in range(reps):
            t = time.perf_counter(); mx.eval(r(ids[-m:], cache, "all")); ts.append(time.perf_counter() - t)
            for c in cache: c.trim(m)
        out[m] = (min(ts), statistics.median(ts))
        print(f"ctx {n_ctx} m {m}: min {min(ts)*1000:.0f} ms median {statistics.median(ts)*1000:.0f} ms", flush=True)
    return out

for n in (48, 200):
    client.call(lambda eng: curve(eng, n)).wait()
client.close()
