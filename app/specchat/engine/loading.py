"""Load an MLX model folder with mlx-lm and apply the compute policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_model, load_tokenizer

from specchat.engine import attention, compute, drafter_kinds, rollback
from specchat.engine.errors import EngineError
from specchat.engine.events import ComputeInfo, ModelInfo
from specchat.engine.folders import model_name, read_config, validate_folder


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: TokenizerWrapper
    config: dict
    info: ModelInfo
    # Gives back what loading changed of the model's modules (attention.use):
    # the engine calls it when it unloads the model.
    unload: Callable[[], None] = field(default=lambda: None, repr=False)

    @property
    def max_context(self) -> int | None:
        for key in ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length"):
            v = self.config.get(key) or self.config.get("text_config", {}).get(key)
            if isinstance(v, int) and v > 0:
                return v
        return None


def untrimmable_reason(model: nn.Module) -> str | None:
    """Why this model's cache cannot go back after rejected drafts, if so:
    only a kind of cache entry rollback.py does not know. Sliding windows
    and recurrent state can (rollback.py says how)."""
    bad = rollback.unsupported(rollback.prepare(make_prompt_cache(model)))
    if bad:
        return f"its cache ({', '.join(bad)}) cannot be rewound after rejected draft tokens"
    return None


def load_folder(
    path: str | Path,
    policy: ComputeInfo,
    progress: Callable[[str], None] | None = None,
    *,
    model_classes: Callable[[dict], tuple] | None = None,
    shard: Callable[[nn.Module], None] | None = None,
) -> LoadedModel:
    """Load weights lazily, then convert tensor by tensor to the policy dtype.

    A cluster rank passes mlx-lm the classes to build (``model_classes``)
    and a ``shard`` that keeps its own layers before any weight is read
    (engine/distributed/stages.py)."""
    path = Path(path).expanduser().resolve()
    say = progress or (lambda _m: None)
    config = validate_folder(path, refuse=_not_a_head)
    say(f"reading {path.name}")
    try:
        if model_classes is not None:
            model, config = load_model(path, lazy=True, get_model_classes=model_classes)
        else:
            model, config = load_model(path, lazy=True)
    except ValueError as exc:
        msg = str(exc)
        if "not supported" in msg.lower():
            raise EngineError(
                f"{path.name}: model type {config.get('model_type')!r} is not supported by mlx-lm"
            ) from exc
        raise EngineError(f"{path.name}: the weights do not fit the config ({msg})") from exc
    except Exception as exc:  # noqa: BLE001 - safetensors/MLX raise assorted types
        raise EngineError(f"{path.name}: could not read the weights ({exc})") from exc
    if shard is not None:
        shard(model)
    say(f"converting {path.name} to {policy.dtype}")
    try:
        compute.apply(model, policy)
    except Exception as exc:  # noqa: BLE001 - a truncated file fails here, when read
        raise EngineError(
            f"{path.name}: the weights file is corrupt or incomplete ({exc}); "
            "re-import or re-download the model"
        ) from exc
    unload = attention.use(model, policy.attention == "blocks")
    say(f"loading the tokenizer of {path.name}")
    try:
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except Exception as exc:  # noqa: BLE001
        raise EngineError(f"{path.name}: could not load the tokenizer ({exc})") from exc
    reason = untrimmable_reason(model)
    info = ModelInfo(
        name=model_name(path),
        path=str(path),
        model_type=str(config.get("model_type", "?")),
        n_params=count_params(model),
        weight_bytes=compute.param_bytes(model),
        dtype=compute.weight_dtype(model),
        vocab_size=len(tokenizer),
        trimmable=reason is None,
        untrimmable_reason=reason,
    )
    return LoadedModel(model=model, tokenizer=tokenizer, config=config, info=info, unload=unload)


def _not_a_head(folder: Path, config: dict) -> str | None:
    """A draft head's folder has no tokenizer of its own: it cannot be
    loaded as a model (drafter_kinds.not_a_target says why)."""
    head = drafter_kinds.of_folder(config)
    return None if head is None else drafter_kinds.not_a_target(folder, head,
                                                                 head.folder.made_for(config))


def load_renamed(files: Sequence[Path], folder: Path,
                 rename: Callable[[str], str | None]) -> dict[str, mx.array]:
    """A draft head's weights from its checked files, by the names its
    module gives them (``rename``; None: one it does not read). A file that
    changed since it was checked is refused in words."""
    weights: dict[str, mx.array] = {}
    for f in files:
        try:
            loaded = mx.load(str(f))
        except (OSError, ValueError, RuntimeError) as exc:  # changed since it was checked
            raise EngineError(f"{folder}: {f.name} could not be read ({exc})") from exc
        for k, v in loaded.items():
            n = rename(k)
            if n is not None:
                weights[n] = v
    return weights


def loaded_head(module: nn.Module, folder: Path, kind: str, weight_bytes: int, vocab: int,
                tokenizer: TokenizerWrapper) -> LoadedModel:
    """A draft head's module (an EAGLE-3 head, a Gemma 4 assistant) as a
    loaded model: its ``ModelInfo``'s model type its kind's name, the
    target's tokenizer (it has none of its own)."""
    info = ModelInfo(name=model_name(folder), path=str(folder), model_type=kind,
                     n_params=count_params(module), weight_bytes=weight_bytes,
                     dtype=compute.weight_dtype(module), vocab_size=vocab, trimmable=True,
                     untrimmable_reason=None)
    return LoadedModel(model=module, tokenizer=tokenizer, config=read_config(folder), info=info)


def count_params(model: nn.Module) -> int:
    """Logical parameter count, with quantized weights counted unpacked."""
    total = 0
    for m in model.modules():
        quant = isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding)
        for name, v in m.items():
            if not isinstance(v, mx.array) or (quant and name in ("scales", "biases")):
                continue
            total += v.size * 32 // m.bits if (quant and name == "weight") else v.size
    return total
