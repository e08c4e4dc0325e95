"""The compute policy: which device, which weight dtype, which BLAS.

On Apple GPUs decoding is bandwidth-bound and MLX's 4-bit kernels are fast,
so weights are quantized to 4 bits. On CPU, MLX's bf16/quantized kernels are
slow while float32 goes through BLAS (BLIS or OpenBLAS when present), so float32 is
the fast path there. The choice is made at run time from what MLX reports;
SPECCHAT_DTYPE (float32, float16, bfloat16, q4: ``specchat.values.CHOICES``)
overrides it for experiments.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

# The entry point (specchat.startup.prepare) has loaded the system BLAS before this MLX import.
from specchat import values
from specchat.engine import blas
from specchat.engine.events import ComputeInfo

_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
DTYPES = values.CHOICES["SPECCHAT_DTYPE"].words  # what ComputeInfo.dtype may be


def gpu_available() -> bool:
    try:
        return bool(mx.metal.is_available())
    except Exception:  # noqa: BLE001 - older MLX without mx.metal on Linux
        return False


def detect() -> ComputeInfo:
    """The policy here. A bad SPECCHAT_DTYPE, SPECCHAT_BLAS or
    SPECCHAT_ATTENTION is a ``BadValue`` (a SpecChatError: the engine thread
    reports its one line)."""
    device = "gpu" if gpu_available() else "cpu"
    dtype = values.environment("SPECCHAT_DTYPE") or ("q4" if device == "gpu" else "float32")
    # On a GPU MLX's attention is a fused kernel: the block path is for the CPU only.
    attention = (values.environment("SPECCHAT_ATTENTION") or "blocks") if device == "cpu" else "mlx"
    st = blas.status()
    return ComputeInfo(device=device, dtype=dtype, blas=st.name, note=st.note, attention=attention)


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding) for m in model.modules())


def apply(model: nn.Module, info: ComputeInfo) -> None:
    """Bring a lazily loaded model to the policy's dtype, one tensor at a time.

    Evaluating tensor by tensor keeps the peak near the final size instead of
    holding the on-disk copy and the converted copy of every weight at once.
    """
    if info.dtype == "q4":
        if not is_quantized(model):
            _materialize(model, mx.float16)
            nn.quantize(model, group_size=64, bits=4)
        _materialize(model, None)
        return
    if is_quantized(model):
        from mlx_lm.utils import dequantize_model

        _materialize(model, None)
        dequantize_model(model)
    _materialize(model, _DTYPES[info.dtype])


def _materialize(model: nn.Module, dtype) -> None:
    items = tree_flatten(model.parameters())
    items.reverse()
    while items:
        # Pop, so this list holds no reference to tensors already converted.
        name, value = items.pop()
        if dtype is not None and mx.issubdtype(value.dtype, mx.floating) and value.dtype != dtype:
            value = value.astype(dtype)
        mx.eval(value)
        # Swap it in at once so the source tensor can be freed before the next.
        model.update(tree_unflatten([(name, value)]))
        del value


def param_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters (what reading all its weights costs)."""
    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))


def weight_dtype(model: nn.Module) -> str:
    if is_quantized(model):
        bits = {m.bits for m in model.modules() if isinstance(m, nn.QuantizedLinear)}
        return "q" + "/".join(str(b) for b in sorted(bits))
    for _, v in tree_flatten(model.parameters()):
        if mx.issubdtype(v.dtype, mx.floating):
            return str(v.dtype).replace("mlx.core.", "")
    return "unknown"
