"""A loaded model's first forwards, run at load instead of in the first reply.

The first forward of a freshly loaded model costs far more than any later
one of the same size: MLX's allocator has no buffers of those sizes yet (on
the CPU every new buffer is fresh pages the kernel faults in and zeroes),
and the BLAS threads start. Measured here on the bundled pair, the first
reply after a load waited 6.6 s for its first token where later ones
waited under 1 s (issue 47). So the engine thread runs the forwards a reply
runs (a prompt's prefill, a verify block, one decode step) once at load, on
a cache of its own that is dropped after: the buffers stay in MLX's cache
for the first reply to reuse, and the load, which shows progress and can
take seconds more, pays the cost instead of the first token.

Nothing here changes a model or its caches, so what a reply decodes is the
same with or without it.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from specchat.engine.runner import Runner

# A short chat's prompt (prefilled without logits), a verify block of the
# longest usual draft plus one, one decoding step: the shapes a first reply runs.
PROMPT_TOKENS = 64
BLOCK_TOKENS = 6


def warm(runner: Runner, token: int = 0) -> None:
    """Run ``runner``'s model over a prompt, a block and a step of ``token``
    on a throwaway cache (an id every vocabulary has: 0 by default)."""
    cache = make_prompt_cache(runner.model)
    mx.eval(runner([token] * PROMPT_TOKENS, cache, "none"))
    mx.eval(runner([token] * BLOCK_TOKENS, cache, "all"))
    mx.eval(runner([token], cache, "last"))
    del cache
