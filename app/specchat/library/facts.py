"""What the library needs to know about an MLX model folder, read from its
small files only.

Parameter counts come from the safetensors headers (a few KB per shard),
the cache kind from config.json, the tokenizer fingerprint from
tokenizer.json. Nothing here imports MLX or transformers, so listing,
checking and suggesting stay fast and work before any weights are loaded.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from specchat.engine import drafter_kinds, folders, mtp_format
from specchat.engine.compat import facts_from_tokenizer_json
from specchat.engine.events import CHECKPOINT_FILES
from specchat.engine.folders import text_config
from specchat.library.checks import Tensor, check_folder
from specchat.library.disk import stamp
from specchat.library.errors import LibraryError

# mlx-lm model types whose caches are recurrent (ArraysCache / MambaCache) in
# at least some layers.
RECURRENT_TYPES = frozenset({
    "mamba", "mamba2", "falcon_mamba", "jamba", "falcon_h1", "granitemoehybrid", "lfm2",
    "lfm2_moe", "nemotron_h", "plamo2", "qwen3_next", "qwen3_5", "recurrent_gemma", "rwkv7",
    "kimi_linear", "baichuan_m1", "bailing_moe_linear", "bailing_hybrid", "olmo_hybrid", "zamba",
    "zamba2", "bamba",
})
# mlx-lm model types that always build rotating (sliding-window) caches for
# some layers, whatever the config says. Others (llama, ministral3, ...) do so
# only when config.json lists "sliding_attention" in layer_types.
SLIDING_TYPES = frozenset({
    "gemma3", "gemma3_text", "gemma3n", "gemma4", "gemma4_text", "cohere2", "gpt_oss", "olmo3",
    "exaone4", "afmoe", "mimo_v2_flash", "step3p5", "plamo3",
})
_RECURRENT_LAYER_WORDS = ("linear", "mamba", "conv", "recurrent", "ssm", "rwkv")

_QUANT_LABELS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


@dataclass(frozen=True, kw_only=True)
class ModelFacts:
    """Facts about one model folder; everything is a plain value so it can be
    stored in the index as JSON. (The field order is the order in which
    ``specchat models list --json`` prints them, after the index's own fields.)
    The facts a draft head has none of default to None."""

    size_bytes: int  # bytes on disk of the model's files
    params: int | None  # logical parameters (quantized weights counted unpacked)
    quantization: str | None  # "q4", "q8", "bfloat16", "float16", "float32"
    tokenizer_fingerprint: str | None = None
    model_type: str | None
    vocab_size: int | None  # tokenizer size (what speculation compares)
    attention: str  # "full", "sliding" or "recurrent"
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    max_context: int | None = None
    # It ships its own MTP head (mtp.* weights) that passes mtp_format's
    # check: it can draft for itself.
    mtp: bool | None
    hidden_size: int | None  # the width of its hidden states (what a draft head reads)
    # For a draft head (an EAGLE-3 head: engine/eagle3.py; a Gemma 4
    # assistant: engine/assistant.py), what it needs of a target (its
    # format's facts(): engine.eagle3_format, engine.assistant_format); None
    # for a model.
    head: dict | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ModelFacts:
        names = cls.__dataclass_fields__
        return cls(**{k: data.get(k) for k in names})

    def kv_elements_per_token(self) -> int | None:
        """Keys and values stored per token over all layers (None if unknown)."""
        if not (self.num_layers and self.num_kv_heads and self.head_dim):
            return None
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim


def validate_folder(folder: Path, shown: Path | None = None) -> dict:
    """Refuse what the engine would refuse, with the same message, and what
    mlx-lm would fail to load (checks.check_folder: safetensors headers
    against their files, the tensors config.json implies, config numbers,
    tokenizer config, chat template), before anything is copied or listed.
    Messages name ``shown`` (the folder the user gave), not a staging copy.
    A draft head's folder is checked as a head's (read_head). Returns
    config.json."""
    folder = Path(folder)
    head = _head_config(folder)
    if head is not None:
        read_head(folder, shown)
        return head
    return _validate(folder, shown)[0]


def _head_config(folder: Path) -> dict | None:
    """config.json of a draft head's folder (one a head format recognizes:
    drafter_kinds.of_folder); None for anything else."""
    try:
        config = folders.read_config(folder, LibraryError) if folder.is_dir() else None
    except LibraryError:
        return None  # validate_folder says what is wrong, in its words
    return config if config is not None and drafter_kinds.of_folder(config) else None


def _validate(folder: Path, shown: Path | None) -> tuple[dict, dict[str, Tensor]]:
    config = folders.validate_folder(folder, LibraryError, shown)
    return config, check_folder(folder, config, folders.weight_files(folder), shown)


def cache_kind(config: dict) -> str:
    """"full", "sliding" or "recurrent", predicted from config.json the way
    mlx-lm will build the model's cache. Each can be speculated on (the engine
    rolls back sliding windows and recurrent state: engine/rollback.py); a
    cache the engine cannot rewind is refused when it loads the model
    (engine.loading.untrimmable_reason), never from a stored verdict, which
    an older build may have written for a kind it could not rewind then.

    ``use_sliding_window: false`` (Qwen2.5, Qwen3) means full attention even
    when ``sliding_window`` is set; ``layer_types`` names each layer's kind.
    """
    cfg = text_config(config)
    model_type = str(config.get("model_type") or cfg.get("model_type") or "")
    layer_types = [str(t).lower() for t in (cfg.get("layer_types") or []) if t is not None]
    if model_type in RECURRENT_TYPES or any(
            w in t for t in layer_types for w in _RECURRENT_LAYER_WORDS):
        return "recurrent"
    if model_type in SLIDING_TYPES or any("sliding" in t or "local" in t for t in layer_types):
        return "sliding"
    if cfg.get("use_sliding_window") is True and cfg.get("sliding_window"):
        window = cfg.get("sliding_window")
        longest = cfg.get("max_position_embeddings")
        if not (isinstance(window, int) and isinstance(longest, int) and window >= longest):
            return "sliding"
    return "full"


def count_params(config: dict, tensors: dict[str, Tensor]) -> tuple[int, str | None]:
    """(logical parameter count, storage label) from the safetensors headers
    (``tensors`` as checks.read_safetensors read them while checking the
    folder: the one safetensors reader).

    Quantized weights (uint32 words with ``.scales``/``.biases`` beside them)
    count as ``words * 32 / bits`` parameters; scales and biases are not
    parameters of the model, just of its packing.
    """
    quant = config.get("quantization") or config.get("quantization_config") or {}
    bits = quant.get("bits") if isinstance(quant, dict) else None
    if not isinstance(bits, int) or isinstance(bits, bool) or bits <= 0:
        bits = None
    dtype_bytes: dict[str, int] = {}
    total = 0
    for name, t in tensors.items():
        n = math.prod(t.shape)
        base = name.rsplit(".", 1)[0]
        if name.endswith((".scales", ".biases")) and f"{base}.weight" in tensors:
            continue
        if bits and t.dtype == "U32" and f"{base}.scales" in tensors:
            n = n * 32 // int(bits)
        else:
            dtype_bytes[t.dtype] = dtype_bytes.get(t.dtype, 0) + n
        total += n
    if bits:
        label = f"q{int(bits)}"
    elif dtype_bytes:
        top = max(dtype_bytes, key=dtype_bytes.get)
        label = _QUANT_LABELS.get(top, top.lower())
    else:
        label = None
    return total, label


def folder_size(folder: Path, leave_out: tuple[str, ...] = ()) -> int:
    """Bytes of the files in a model folder, following the Hub snapshot's
    symlinks to the blobs they name; files named in ``leave_out`` are not
    the model's (a head's training checkpoint)."""
    total = 0
    for entry in folder.iterdir():
        try:
            if entry.name not in leave_out and entry.is_file():
                total += entry.stat().st_size
        except OSError:
            continue
    return total


def max_context(config: dict) -> int | None:
    cfg = text_config(config)
    for key in ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length"):
        v = cfg.get(key)
        if isinstance(v, int) and v > 0:
            return v
    return None


def kv_shape(config: dict) -> tuple[int | None, int | None, int | None]:
    """(layers, kv heads, head dim) for the KV-cache estimate."""
    cfg = text_config(config)
    layers = cfg.get("num_hidden_layers") or cfg.get("n_layer") or cfg.get("num_layers")
    heads = cfg.get("num_attention_heads") or cfg.get("n_head")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = _pos_int(cfg.get("head_dim"))
    hidden = _pos_int(cfg.get("hidden_size") or cfg.get("n_embd"))
    heads = _pos_int(heads)
    if not head_dim and hidden and heads:
        head_dim = hidden // heads
    return _pos_int(layers), _pos_int(kv_heads), head_dim


def _pos_int(v) -> int | None:
    """A positive number as an int; anything else (a string, 0, -4, true)
    is unknown rather than an error, since the numbers are only estimates."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 or v != v:
        return None
    return int(v) if v != float("inf") else None


def tokenizer_facts(folder: Path, shown: Path | None = None):
    """TokenizerFacts from tokenizer.json, or None when the folder has only a
    sentencepiece model (then compatibility cannot be checked without loading).
    Cached until either tokenizer file changes; callers must not mutate it.
    Errors name ``shown`` (the user's folder) instead of ``folder``."""
    if not (folder / "tokenizer.json").exists():
        return None
    try:
        return _parsed_tokenizer(folder.resolve(), stamp(folder / "tokenizer.json"),
                                 stamp(folder / "tokenizer_config.json"))
    except (OSError, ValueError) as exc:  # records.BadRecord says what, in words
        where = (shown or folder) / "tokenizer.json"
        raise LibraryError(f"{where} is broken: {getattr(exc, 'strerror', None) or exc}") from None


# Parsed tokenizer facts by (folder, file stamps). Parsing a 7 MB tokenizer.json
# is one C call that holds the GIL for about 200 ms, which stalls the GUI thread
# whenever a worker thread re-checks a pair it has already checked.
@functools.lru_cache(maxsize=16)
def _parsed_tokenizer(folder: Path, *_stamps: object):
    return facts_from_tokenizer_json(folder)


def read_head(folder: Path, shown: Path | None = None) -> ModelFacts:
    """The facts of a draft head's folder (no tokenizer of its own: it
    drafts with the target's), after the engine's own check of its files by
    its format (eagle3_format.read, assistant_format.read: its config, its
    weights' shapes against it, its vocabulary map or token ordering), so
    the library and the engine refuse the same heads in the same words. A head trained here keeps its training
    checkpoint beside it (events.CHECKPOINT_FILES: the optimizer's state, as
    big as the head twice over): for resuming, not the head, so neither its
    size nor its parameters count it."""
    kind = drafter_kinds.of_folder(folders.read_config(folder, LibraryError, shown))
    head = kind.folder.read(folder, LibraryError, shown)
    params, label = count_params({}, head.tensors)
    facts = head.facts()
    return ModelFacts(size_bytes=folder_size(folder, CHECKPOINT_FILES), params=params or None,
                      quantization=label, model_type=kind.name,
                      vocab_size=facts["vocab"], attention="full", mtp=False,
                      hidden_size=facts["reads_width"], head=facts)


def read_folder(folder: str | os.PathLike, shown: str | os.PathLike | None = None) -> ModelFacts:
    """All facts about an MLX model folder, after the full check that mlx-lm
    would load it (validate_folder), or a draft head's (read_head); every
    import, Hub pull and bundled model is listed through here. Messages name
    ``shown`` if given."""
    folder = Path(folder)
    shown = Path(shown) if shown is not None else None
    if _head_config(folder) is not None:
        return read_head(folder, shown)
    config, tensors = _validate(folder, shown)
    params, label = count_params(config, tensors)
    tok = tokenizer_facts(folder, shown)
    kind = cache_kind(config)
    layers, kv_heads, head_dim = kv_shape(config)
    return ModelFacts(
        model_type=str(config.get("model_type")) if config.get("model_type") else None,
        params=params or None,
        quantization=label,
        size_bytes=folder_size(folder),
        tokenizer_fingerprint=tok.fingerprint() if tok else None,
        vocab_size=tok.size if tok else None,
        attention=kind,
        num_layers=layers,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        max_context=max_context(config),
        mtp=bool(mtp_format.head_tensors(tensors)) and mtp_format.problem(tensors, config) is None,
        hidden_size=_pos_int(text_config(config).get("hidden_size")),
    )
