import time
from specchat.engine import blas; blas.preload()
from specchat.engine.events import LoadProgress
from specchat.library.engine_link import make_client
t0 = time.time()
client = make_client()
pair = client.load("bundled:qwen2.5-coder-1.5b", "bundled:qwen2.5-coder-0.5b").wait(
    on_event=lambda ev: print(f"{time.time()-t0:6.1f}s [{ev.stage}] {ev.message}", flush=True) if isinstance(ev, LoadProgress) else None)
print(f"loaded in {time.time()-t0:.1f}s", flush=True)
print(client.call(lambda eng: (eng.verify_seconds, eng.cost_for.__self__._timed_cost)).wait(), flush=True)
client.close()
