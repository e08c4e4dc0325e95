"""What going back after a rejected block costs a model with recurrent state.

A Gated DeltaNet layer (Qwen3.5, Qwen3-Next) keeps no positions to drop, so
after a verify of K + 1 tokens of which n + 1 are kept there are three ways
back to the kept position:

- re-feed: restore the checkpoint taken before the verify and feed the n + 1
  kept tokens again in a forward of their own;
- deferred re-feed (what SpecChat does, kv.py): restore it and feed them
  with the next forward, which runs anyway (the next verify: K + 1 + n + 1
  tokens instead of K + 1);
- per-position states (what mlx-vlm does for Qwen3.5): keep the recurrent
  state after every position of the verify and pick the kept one; no
  forward, but the recurrence's states of every position are kept.

This times each on a random Qwen3.5-shaped model (mlx-lm's own class) on
this machine's device, at the context length given, and prints the memory
the per-position states cost per drafted token. Run it on an idle machine:

    python benchmarks/rollback_costs.py [--hidden 1024 --layers 8 --context 512 --k 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from specchat import startup  # noqa: E402

startup.prepare()

import mlx.core as mx  # noqa: E402
import mlx_lm.models.qwen3_5 as qwen3_5  # noqa: E402
from mlx_lm.models import gated_delta  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from mlx_lm.utils import _get_classes  # noqa: E402
from specchat.engine import rollback  # noqa: E402


def build(hidden: int, layers: int) -> object:
    config = {"model_type": "qwen3_5", "hidden_size": hidden, "num_hidden_layers": layers,
              "intermediate_size": hidden * 3, "num_attention_heads": hidden // 64,
              "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 32000,
              "linear_num_value_heads": hidden // 64, "linear_num_key_heads": hidden // 128,
              "linear_key_head_dim": 64, "linear_value_head_dim": 64,
              "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": False, "max_position_embeddings": 8192}
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    mx.eval(model.parameters())
    return model


def timed(fn, repeat: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--k", type=int, default=4)
    args = p.parse_args()
    model = build(args.hidden, args.layers)
    ids = mx.random.randint(0, 32000, (args.context,))
    cache = make_prompt_cache(model)
    mx.eval(model(ids[None], cache=cache))
    block = mx.random.randint(0, 32000, (args.k + 1,))
    kept = (args.k + 1) // 2  # n + 1: the kept part of a block cut half way

    def forward(tokens, capture: bool = False):
        mark = rollback.checkpoint(cache, 0)
        out = model(tokens[None], cache=cache)
        mx.eval(out, rollback.state_arrays(cache))
        rollback.restore(cache, mark)  # back for the next repeat
        return out

    verify = timed(lambda: forward(block))
    verify_more = timed(lambda: forward(mx.concatenate([block, block[:kept]])))
    refeed = timed(lambda: forward(block[:kept]))

    # Per-position states: the recurrence run with every position's state kept.
    original = qwen3_5.gated_delta_update

    def keeping(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, **kw):
        beta = mx.sigmoid(b)
        g = gated_delta.compute_g(A_log, a, dt_bias)
        if state is None:
            state = mx.zeros((q.shape[0], v.shape[-2], v.shape[-1], q.shape[-1]), mx.float32)
        ys, states = [], []
        r = v.shape[-2] // q.shape[-2]
        qq, kk = mx.repeat(q, r, -2), mx.repeat(k, r, -2)
        for t in range(q.shape[1]):
            y, state = gated_delta._gated_delta_step_ops(qq[:, t], kk[:, t], v[:, t], g[:, t],
                                                         beta[:, t], state)
            ys.append(y)
            states.append(state)
        keeping.states = mx.stack(states, axis=1)
        mx.eval(keeping.states)
        return mx.stack(ys, axis=1), state

    qwen3_5.gated_delta_update = keeping
    try:
        capture = timed(lambda: forward(block))
    finally:
        qwen3_5.gated_delta_update = original
    gdn = sum(1 for layer in model.layers if layer.is_linear)
    state_bytes = keeping.states[:, 0].nbytes * gdn
    print(f"qwen3_5 hidden {args.hidden}, {args.layers} layers ({gdn} Gated DeltaNet), "
          f"context {args.context}, K = {args.k}, {kept} kept, device {mx.default_device()}")
    print(f"verify of {args.k + 1} tokens: {verify * 1e3:.1f} ms")
    print(f"re-feed (a forward of {kept}): +{refeed * 1e3:.1f} ms "
          f"({refeed / verify:.2f} of a verify)")
    print(f"deferred re-feed ({kept} more in the next verify): "
          f"+{(verify_more - verify) * 1e3:.1f} ms ({(verify_more - verify) / verify:.2f})")
    print(f"per-position states in the verify: +{(capture - verify) * 1e3:.1f} ms "
          f"({(capture - verify) / verify:.2f}); {state_bytes / 2**20:.2f} MiB kept per "
          "drafted token")


if __name__ == "__main__":
    main()
