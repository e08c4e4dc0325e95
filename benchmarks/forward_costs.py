"""Where a decoding step's time goes: forward passes of the loaded pair over
m tokens (whole model, and trunk without the vocabulary projection), and
float32 matmuls of the shapes decoding uses, through whatever BLAS MLX has
(see SPECCHAT_BLAS in docs/engine.md to compare libraries).

    python benchmarks/forward_costs.py --target bundled:qwen2.5-coder-1.5b \\
        --draft bundled:qwen2.5-coder-0.5b
    SPECCHAT_BLAS=openblas python benchmarks/forward_costs.py --matmul-only
    python benchmarks/forward_costs.py --thread-sizes
    python benchmarks/forward_costs.py --target bundled:qwen2.5-coder-1.5b --parts
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from specchat import startup  # noqa: E402

startup.prepare()  # the system BLAS before anything imports MLX
from specchat.engine import blas  # noqa: E402


def median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def forward_costs(target: str, draft: str | None, reps: int) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from specchat.engine.session import Engine
    from specchat.library.refs import resolve
    from specchat.tools.forward_timing import prefill, step_time

    engine = Engine()
    engine.load(resolve(target), resolve(draft) if draft else None)
    cost = engine.cost_model  # what the drafting policy assumes (bytes, not timers)
    print(f"policy costs: draft/target bytes per token c = {cost.draft:.3f}, "
          f"verify slope s = {cost.slope:.3f}")
    ids = list(range(1000, 1200))  # a 200-token context
    models = [("target", engine.target.model)]
    if engine.draft is not None:
        models.append(("draft", engine.draft.model))
    for name, model in models:
        cache = make_prompt_cache(model)
        prefill(model, cache, ids)
        for m in (1, 2, 5, 9, 13):
            full = step_time(lambda x, c, model=model: model(mx.array(x)[None], cache=c),
                             ids, m, cache, reps)
            trunk = step_time(lambda x, c, model=model: model.model(mx.array(x)[None], c),
                              ids, m, cache, reps)
            print(f"{name} {m} token(s): {full * 1000:6.0f} ms  "
                  f"(trunk {trunk * 1000:.0f} ms, vocabulary projection {(full - trunk) * 1000:.0f} ms)")


def matmul_costs(reps: int) -> None:
    import mlx.core as mx

    vocab, hidden, inter = 151936, 1536, 8960
    for name, rows in (("vocabulary projection", vocab), ("MLP projection", inter)):
        w = mx.random.normal((rows, hidden))
        mx.eval(w)
        for m in (1, 2, 5, 9):
            x = mx.random.normal((m, hidden))
            mx.eval(x)
            t = median_time(lambda x=x, w=w: mx.eval(x @ w.T), reps)
            print(f"{name} [{m} x {hidden}] @ [{hidden} x {rows}]: {t * 1000:7.2f} ms, "
                  f"{w.nbytes / t / 1e9:5.1f} GB/s of weights")


PART_TOKENS = (1, 2, 3, 5, 9)  # the one-to-two jump, then the block sizes drafting uses


def part_costs(target: str, reps: int) -> None:
    """Where the extra cost of a forward over m > 1 tokens goes: the
    attention blocks and MLPs timed inside the whole forward (each evaluated
    on its own, so the parts' total is not the plain forward's), then the
    first layer's MLP and the attention kernel alone on the same shapes.
    On the development machine one token to two costs half a forward more,
    about a third of it in the attention kernel, which is eight times dearer
    over two rows than over one (docs/benchmarks.md)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from specchat.engine.session import Engine
    from specchat.library.refs import resolve
    from specchat.tools.forward_timing import prefill, step_time

    engine = Engine()
    engine.load(resolve(target), None)
    model = engine.target_runner.model
    layers = model.model.layers
    ids = list(range(1000, 1200))  # a 200-token context
    cache = make_prompt_cache(model)
    prefill(model, cache, ids)
    spent: dict[str, float] = {}

    def timed_call(cls, name):
        original = cls.__call__

        def call(self, *args, **kwargs):
            mx.eval(*[a for a in args if isinstance(a, mx.array)])
            t0 = time.perf_counter()
            out = original(self, *args, **kwargs)
            mx.eval(out)
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
            return out

        cls.__call__ = call
        return original

    def trunk(x, c):
        return model.model(mx.array(x)[None], c)

    plain = {m: step_time(trunk, ids, m, cache, reps) for m in PART_TOKENS}
    attn_cls, mlp_cls = type(layers[0].self_attn), type(layers[0].mlp)
    originals = timed_call(attn_cls, "attention"), timed_call(mlp_cls, "mlp")
    try:
        for m in PART_TOKENS:
            spent.clear()
            inside = step_time(trunk, ids, m, cache, reps)
            print(f"trunk over {m} token(s): {plain[m] * 1e3:4.0f} ms; timed in parts "
                  f"{inside * 1e3:4.0f} ms, of which attention {spent['attention'] / reps * 1e3:4.0f} ms "
                  f"and MLP {spent['mlp'] / reps * 1e3:4.0f} ms ({len(layers)} layers)")
    finally:
        attn_cls.__call__, mlp_cls.__call__ = originals
    mlp, attn = layers[0].mlp, layers[0].self_attn
    heads, kv_heads = attn.n_heads, attn.n_kv_heads
    dim = model.args.hidden_size
    head_dim = dim // heads
    keys = mx.random.normal((1, kv_heads, len(ids), head_dim))
    values = mx.random.normal((1, kv_heads, len(ids), head_dim))
    mx.eval(keys, values)
    for m in PART_TOKENS:
        x = mx.random.normal((1, m, dim))
        q = mx.random.normal((1, heads, m, head_dim))
        mx.eval(x, q)
        alone = median_time(lambda x=x: mx.eval(mlp(x)), max(reps, 11))
        kernel = median_time(lambda q=q: mx.eval(mx.fast.scaled_dot_product_attention(
            q, keys, values, scale=head_dim ** -0.5, mask=None if q.shape[2] == 1 else "causal")),
            max(reps, 11))
        print(f"alone, {m} row(s): layer 0's MLP {alone * 1e3:5.2f} ms, attention kernel over "
              f"{len(ids)} keys {kernel * 1e3:5.2f} ms")


def thread_costs(reps: int) -> None:
    """Does a second BLAS thread pay, by matrix size? [m x hidden] @ [hidden x
    inner] for MLP shapes from the tiny test models to Qwen2.5-1.5B, on one and
    on every core (what engine/threads.py's PARALLEL_MIN_WEIGHTS rests on)."""
    import mlx.core as mx

    cores = blas.cores()
    for hidden, inner in ((64, 128), (256, 1024), (512, 2048), (896, 4864), (1536, 8960)):
        w = mx.random.normal((inner, hidden))
        mx.eval(w)
        for m in (5, 13):
            x = mx.random.normal((m, hidden))
            mx.eval(x)
            times = {}
            for n in (1, cores):
                if not blas.set_threads(n):
                    print("this BLAS cannot be told its thread count")
                    return
                for _ in range(5):
                    mx.eval(x @ w.T)
                times[n] = median_time(lambda x=x, w=w: mx.eval(x @ w.T), reps)
            print(f"[{m:2d} x {hidden:4d}] @ [{hidden:4d} x {inner:4d}] ({hidden * inner / 1e6:5.2f}M "
                  f"weights): 1 thread {times[1] * 1e3:7.3f} ms, {cores} threads "
                  f"{times[cores] * 1e3:7.3f} ms")
    blas.set_threads(cores)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--matmul-only", action="store_true")
    ap.add_argument("--parts", action="store_true",
                    help="only: the target's attention and MLPs over 1 to 9 tokens, inside "
                         "the forward and alone")
    ap.add_argument("--thread-sizes", action="store_true",
                    help="only: one thread against every core, by matrix size")
    args = ap.parse_args()
    st = blas.status()
    print(f"BLAS: {st.name} ({st.path or st.note})")
    if args.thread_sizes:
        thread_costs(max(args.reps, 51))
        return
    if args.parts:
        if not args.target:
            ap.error("--parts needs --target")
        part_costs(args.target, args.reps)
        return
    matmul_costs(max(args.reps, 7))
    if not args.matmul_only:
        if not args.target:
            ap.error("--target is needed unless --matmul-only")
        forward_costs(args.target, args.draft, args.reps)


if __name__ == "__main__":
    main()
