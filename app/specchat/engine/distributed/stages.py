"""Which layers a rank holds: mlx-lm's pipeline split, for every
architecture whose inner model has mlx-lm's ``pipeline`` (qwen2, qwen3 and
others in mlx-lm 0.32), plus llama, which mlx-lm 0.32 can only split by
tensor parallelism: ``PipelinedLlama`` gives it the pipeline on mlx-lm's
own pattern (``mlx_lm/models/pipeline.py`` and qwen2's ``__call__``).

Pipeline, not tensor parallelism, because it keeps greedy output identical
to one process: each layer runs whole on one rank, so every sum is taken in
the same order as on one machine, while tensor parallelism adds up partial
matrix products across ranks (on the tiny test models its logits differ
from one process's by ~2e-6, enough to flip a near-tie). Ranks are stages
in reverse: the highest rank runs the first layers, rank 0 the last ones
and the head, which is where the app needs the logits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import llama
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.pipeline import PipelineMixin
from mlx_lm.utils import _get_classes

from specchat.engine.errors import EngineError


class PipelinedLlamaModel(llama.LlamaModel):
    """llama's inner model with mlx-lm's pipeline: receive the hidden state
    from the rank holding the layers before ours, run ours, send it on, and
    gather the last stage's output on every rank (as qwen2 does)."""

    pipeline = PipelineMixin.pipeline
    pipeline_layers = PipelineMixin.pipeline_layers

    def __init__(self, args: llama.ModelArgs):
        super().__init__(args)
        self.pipeline_rank = 0
        self.pipeline_size = 1
        self.start_idx = 0
        self.end_idx = None

    def __call__(self, inputs: mx.array, cache=None, input_embeddings: mx.array | None = None):
        if self.swa_idx is not None and self.pipeline_size > 1:
            raise ValueError("sliding-window llama models cannot be split into stages")
        h = input_embeddings if input_embeddings is not None else self.embed_tokens(inputs)
        layers = self.pipeline_layers
        if cache is None:
            cache = [None] * len(layers)
        mask = create_attention_mask(h, cache[0])
        rank, size = self.pipeline_rank, self.pipeline_size
        if rank < size - 1:
            h = mx.distributed.recv_like(h, rank + 1)
        for layer, c in zip(layers, cache, strict=True):
            h = layer(h, mask, cache=c)
        if rank != 0:
            h = mx.distributed.send(h, (rank - 1) % size)
            if cache[-1] is not None:
                cache[-1].keys = mx.depends(cache[-1].keys, h)
        if size > 1:
            h = mx.distributed.all_gather(h)[: h.shape[0]]
        return self.norm(h)


class PipelinedLlama(llama.Model):
    def __init__(self, args: llama.ModelArgs):
        super().__init__(args)
        self.model = PipelinedLlamaModel(args)

    @property
    def layers(self):
        # The caches a rank makes are for its own layers only.
        return self.model.pipeline_layers


def model_classes(config: dict):
    """mlx-lm's classes for ``config``, with llama's pipelined one."""
    model_cls, args_cls = _get_classes(config)
    if model_cls is llama.Model:
        return PipelinedLlama, args_cls
    return model_cls, args_cls


def pipeline_stage(group, rank: int, split: Sequence[int] | None) -> Callable[[nn.Module], None]:
    """What ``load_folder`` does to the lazily loaded model before reading
    any weight: keep this rank's layers (the others are never read from
    disk). Ranks other than 0 never compute logits, so they drop an untied
    output head too."""

    def shard(model: nn.Module) -> None:
        inner = getattr(model, "model", None)
        kind = getattr(model, "model_type", type(model).__module__.rsplit(".", 1)[-1])
        if inner is None or not hasattr(inner, "pipeline"):
            raise EngineError(f"mlx-lm cannot split {kind} models into pipeline stages, so "
                              "they cannot run on a cluster.")
        if getattr(inner, "swa_idx", None) is not None:
            raise EngineError(f"This {kind} model uses sliding-window attention, which "
                              "SpecChat cannot split across a cluster.")
        try:
            inner.pipeline(group, list(split) if split else None)
        except ValueError as exc:
            raise EngineError(f"The cluster's layer split does not fit the model: {exc}.") from None
        if rank > 0 and "lm_head" in model:
            model.pop("lm_head")

    return shard


def layer_sizes(model: nn.Module) -> tuple[int, int]:
    """(parameters, bytes) of the layers this rank holds."""
    values = [v for layer in model.model.pipeline_layers for _, v in tree_flatten(layer.parameters())]
    return sum(v.size for v in values), sum(v.nbytes for v in values)
