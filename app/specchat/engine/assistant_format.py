"""Gemma 4 assistant drafters on disk: their format, read and checked
without MLX.

Google publishes one assistant per Gemma 4 size (``google/gemma-4-31B-it``
has ``google/gemma-4-31B-it-assistant``): a folder of its own,
``config.json`` (``Gemma4AssistantForCausalLM``, model type
``gemma4_assistant``: ``backbone_hidden_size``, the width of its target's
hidden states; ``text_config``, a small Gemma 4 text stack whose every
layer is KV-shared, so it has no key or value projections; for the small
sizes ``use_ordered_embeddings`` with ``num_centroids`` and
``centroid_intermediate_top_k``) and safetensors weights under
transformers' names (``model.layers.N.``, ``pre_projection``,
``post_projection``, ``masked_embedding.centroids``,
``masked_embedding.token_ordering``). assistant.py drafts with it.

Everything its files must be is decided here, once, for the engine's
loader (assistant.py, session.py) and the library's checks (facts.py,
compatibility.py): its config as a checked dataclass (every field typed
and bounded, refused in words), its weights' shapes against it (from the
safetensors headers, never the tensors), its token ordering's ids (within
its vocabulary: they index its output layer), and whether it fits a
target: a Gemma 4 whose hidden states are as wide as it reads, whose
vocabulary is its own, and whose last full-attention and sliding-window
layers have the key width and heads its layers attend with. It imports no
MLX, so the library may import it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from specchat.engine import folders, safetensors_file
from specchat.engine.config_fields import Fields
from specchat.engine.errors import EngineError
from specchat.engine.safetensors_file import FLOAT_DTYPES, WHOLE_DTYPES, Tensor, whole
from specchat.errors import SpecChatError
from specchat.records import described

NAME = "assistant"  # drafter_kinds.ASSISTANT's name, and an assistant's model type in the library
LABEL = "Gemma 4 assistant"  # what people call the format: "a Gemma 4 assistant head"
MODEL_TYPE = "gemma4_assistant"  # its config's model_type
TARGET_TYPES = ("gemma4", "gemma4_text")  # the model types of the targets it drafts for
FULL, SLIDING = "full_attention", "sliding_attention"  # Gemma 4's layer types

# What an assistant's config may state, as (least, most) of each whole
# number. Published assistants have 4 layers about a thousand wide; the most
# here are far past any, and stop a damaged or hostile config before
# anything is built from it.
SIZES: dict[str, tuple[int, int]] = {
    "backbone_hidden_size": (1, 1 << 16),
    "hidden_size": (1, 1 << 16),
    "intermediate_size": (1, 1 << 18),
    "num_hidden_layers": (1, 16),
    "num_attention_heads": (1, 1024),
    "head_dim": (1, 4096),
    "global_head_dim": (1, 4096),
    "vocab_size": (1, 1 << 22),
    "sliding_window": (1, 1 << 24),
    "sliding_window_pattern": (1, 64),
    "num_centroids": (1, 1 << 16),
    "centroid_intermediate_top_k": (1, 1 << 16),
    "max_position_embeddings": (1, 1 << 28),
    "num_key_value_heads": (1, 1024),
    "num_global_key_value_heads": (1, 1024),
}
# mlx-lm's gemma4_text defaults (ModelArgs, transformers' too), for what a
# config leaves out (transformers writes a nested config's fields that
# differ from its defaults): the engine builds the layers with mlx-lm's
# classes, which read them so.
DEFAULTS = {"head_dim": 256, "global_head_dim": 512, "sliding_window": 512,
            "sliding_window_pattern": 5, "num_key_value_heads": 1, "num_kv_shared_layers": 20,
            "vocab_size": 262144, "hidden_size_per_layer_input": 256,
            "use_double_wide_mlp": True, "rms_norm_eps": 1e-6}


def recognizes(config: dict) -> bool:
    """Whether a folder's config.json is a Gemma 4 assistant's."""
    archs = config.get("architectures")
    archs = " ".join(str(a) for a in archs) if isinstance(archs, list) else str(archs or "")
    return config.get("model_type") == MODEL_TYPE or "Gemma4Assistant" in archs


def made_for(config: dict) -> str:
    """The model an assistant's config says it drafts for: none says
    (Google names it after its target: the target's repository plus
    ``-assistant``)."""
    return ""


def _layer_types(block: dict, layers: int, pattern: int, where: Path | str,
                 prefix: str, error: type[SpecChatError]) -> tuple[str, ...]:
    """Each layer's kind, as stated or as mlx-lm makes them from the
    pattern (sliding layers, then one full-attention layer)."""
    stated = block.get("layer_types")
    if stated is None:
        cycle = [SLIDING] * (pattern - 1) + [FULL]
        return tuple((cycle * (layers // len(cycle) + 1))[:layers])
    if not (isinstance(stated, list) and all(t in (FULL, SLIDING) for t in stated)):
        raise error(f"{where}: {prefix}layer_types must list {FULL!r} or {SLIDING!r} for each "
                    f"layer; got {described(stated)}")
    if len(stated) < layers:
        raise error(f"{where}: {prefix}layer_types names {len(stated)} layers, fewer than its "
                    f"{layers} (num_hidden_layers)")
    return tuple(stated[:layers])


@dataclass(frozen=True)
class AssistantConfig:
    """An assistant's config.json, checked. ``text`` is its text stack's
    config as mlx-lm's gemma4_text reads it, every layer KV-shared."""

    backbone_hidden_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    head_dim: int  # a sliding layer's query width per head
    global_head_dim: int  # a full-attention layer's
    vocab_size: int
    layer_types: tuple[str, ...]
    sliding_window: int
    tie_word_embeddings: bool
    ordered: bool  # use_ordered_embeddings: a centroid-routed output layer
    num_centroids: int
    top_k: int  # centroid_intermediate_top_k: the clusters whose tokens it scores
    double_wide_mlp: bool
    text: dict = field(repr=False, default_factory=dict)

    def width(self, kind: str) -> int:
        """The query width per head of a layer of ``kind``."""
        return self.global_head_dim if kind == FULL else self.head_dim

    @property
    def reads(self) -> tuple[str, ...]:
        """The kinds of its target's layers whose keys and values it reads."""
        return tuple(sorted(set(self.layer_types)))

    @classmethod
    def from_config(cls, config: dict, shown: Path | None = None,
                    error: type[SpecChatError] = EngineError) -> AssistantConfig:
        """The checked config, or ``error`` naming the field and the file
        (in ``shown``, the folder as the person gave it), in words."""
        where = shown / "config.json" if shown is not None else "config.json"
        read = Fields(where, error, SIZES, "a Gemma 4 assistant's")
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise error(f"{where}: text_config must be an object (the config of the "
                        f"assistant's layers); got {described(text)}")
        p = "text_config."
        layers = read.size(text, "num_hidden_layers", p)
        hidden = read.size(text, "hidden_size", p)
        heads = read.size(text, "num_attention_heads", p)
        vocab = read.size(text, "vocab_size", p,
                          read.size(config, "vocab_size", "", DEFAULTS["vocab_size"]))
        ordered = read.flag(config, "use_ordered_embeddings", False)
        centroids = read.size(config, "num_centroids", "", 2048)
        top_k = read.size(config, "centroid_intermediate_top_k", "", 32)
        _check_layout(text, layers, vocab, centroids, top_k if ordered else 0, where, error)
        pattern = read.size(text, "sliding_window_pattern", p, DEFAULTS["sliding_window_pattern"])
        head_dim = read.size(text, "head_dim", p, DEFAULTS["head_dim"])
        # mlx-lm gives full attention heads of global_head_dim (512 unless
        # stated), or of head_dim where it is stated empty.
        global_dim = (read.size(text, "global_head_dim", p) if text.get("global_head_dim")
                      else head_dim if "global_head_dim" in text else DEFAULTS["global_head_dim"])
        kinds = _layer_types(text, layers, pattern, where, p, error)
        window = read.size(text, "sliding_window", p, DEFAULTS["sliding_window"])
        double = read.flag(text, "use_double_wide_mlp", DEFAULTS["use_double_wide_mlp"], p)
        # What only mlx-lm reads, checked as it would need it.
        read.number(text, "rms_norm_eps", p, DEFAULTS["rms_norm_eps"])
        read.size(text, "max_position_embeddings", p, None)
        read.flag(text, "rope_traditional", False, p)
        read.mapping(text, "rope_parameters", p)
        return cls(
            backbone_hidden_size=read.size(config, "backbone_hidden_size"),
            hidden_size=hidden, intermediate_size=read.size(text, "intermediate_size", p),
            num_layers=layers, num_heads=heads, head_dim=head_dim, global_head_dim=global_dim,
            vocab_size=vocab, layer_types=kinds, sliding_window=window,
            tie_word_embeddings=read.flag(config, "tie_word_embeddings", True),
            ordered=ordered, num_centroids=centroids, top_k=top_k, double_wide_mlp=double,
            text={**text, "model_type": "gemma4_text", "num_kv_shared_layers": layers,
                  "hidden_size_per_layer_input": 0, "enable_moe_block": False,
                  "use_double_wide_mlp": double, "layer_types": list(kinds),
                  "head_dim": head_dim, "global_head_dim": global_dim,
                  "sliding_window": window})


def _check_layout(text: dict, layers: int, vocab: int, centroids: int, top_k: int,
                  where, error: type[SpecChatError]) -> None:
    """What a config may state that no assistant has: a vocabulary its
    centroids do not split evenly (``top_k`` 0: no centroids), per-layer
    inputs, experts, or layers that do not all read the target's cache."""
    p = "text_config."
    if top_k and vocab % centroids:
        raise error(f"{where}: its vocabulary ({vocab:,} ids) must split evenly into its "
                    f"{centroids:,} centroids (num_centroids)")
    if top_k > centroids:
        raise error(f"{where}: centroid_intermediate_top_k ({top_k:,}) must be at most "
                    f"its {centroids:,} centroids")
    for key, want, why in (("hidden_size_per_layer_input", 0, "read no per-layer inputs"),
                           ("enable_moe_block", False, "have no experts")):
        if text.get(key, DEFAULTS.get(key)):
            got = described(text[key]) if key in text else f"{DEFAULTS[key]}, by leaving it out"
            raise error(f"{where}: {p}{key} must be {json.dumps(want)}: an assistant's "
                        f"layers {why}; got {got}")
    shared = text.get("num_kv_shared_layers")
    if shared not in (None, 0, layers):
        raise error(f"{where}: {p}num_kv_shared_layers must be its {layers} layers (or 0, "
                    f"which means all): every layer reads its target's cache; got "
                    f"{described(shared)}")


# -- its weights -------------------------------------------------------------------------

# Published tensors the module does not hold: what a KV-shared layer would
# project if it were not shared (mlx-lm's gemma4_text sanitize drops them
# too), and rotary tables.
_UNREAD = (".self_attn.k_proj.", ".self_attn.v_proj.", ".self_attn.k_norm.",
           ".self_attn.v_norm.", "rotary_emb.")
ORDERING = "masked_embedding.token_ordering"


def rename(key: str) -> str | None:
    """A published weight name as assistant.py's module names it (None:
    not read)."""
    if any(part in key for part in _UNREAD):
        return None
    return key


def expected_shapes(c: AssistantConfig) -> dict[str, tuple[int, ...]]:
    """Each weight the module is built with, by name, with its shape
    (lm_head apart: a tied assistant may leave it out)."""
    h, b, inter = c.hidden_size, c.backbone_hidden_size, c.intermediate_size
    inter *= 2 if c.double_wide_mlp else 1
    out = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,),
           "pre_projection.weight": (h, 2 * b), "post_projection.weight": (b, h)}
    if c.ordered:
        out["masked_embedding.centroids.weight"] = (c.num_centroids, h)
        out[ORDERING] = (c.vocab_size,)
    for i, kind in enumerate(c.layer_types):
        p, q = f"model.layers.{i}.", c.num_heads * c.width(kind)
        out.update({p + "self_attn.q_proj.weight": (q, h), p + "self_attn.o_proj.weight": (h, q),
                    p + "self_attn.q_norm.weight": (c.width(kind),),
                    p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                    p + "mlp.down_proj.weight": (h, inter), p + "layer_scalar": (1,)})
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            out[f"{p}{norm}.weight"] = (h,)
    return out


def check_weights(c: AssistantConfig, tensors: dict[str, Tensor], shown: Path,
                  error: type[SpecChatError] = EngineError) -> None:
    """The weights (by name, with their shapes from the headers) are
    exactly those its config describes: nothing missing, nothing extra,
    every shape its config implies, floats but for the token ordering."""
    want = expected_shapes(c)
    lm_head = (c.vocab_size, c.hidden_size)
    if not c.tie_word_embeddings:
        want["lm_head.weight"] = lm_head
    missing = [n for n in want if n not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise error(f"{shown} is incomplete: its weights lack {missing[0]}{more}, which its "
                    "config describes (a weights file missing or cut short, or a config that "
                    "does not belong to these weights)")
    for n, t in tensors.items():
        shape = want.get(n) or (lm_head if n == "lm_head.weight" else None)
        if shape is None:
            raise error(f"{shown} does not fit together: tensor {n} (in {t.file}) is not part "
                        "of the assistant its config describes")
        if t.shape != shape:
            raise error(f"{shown}: tensor {n} has shape {list(t.shape)} (in {t.file}) but its "
                        f"config implies {list(shape)}")
        kinds = WHOLE_DTYPES - {"BOOL"} if n == ORDERING else FLOAT_DTYPES
        if t.dtype not in kinds:
            raise error(f"{shown}: tensor {n} is of dtype {t.dtype} (in {t.file}); "
                        + ("its token ordering holds ids" if n == ORDERING else
                           "an assistant's weights are floats (SpecChat loads no quantized "
                           "assistant)"))


# -- the folder --------------------------------------------------------------------------


@dataclass(frozen=True)
class Assistant:
    """An assistant's folder, read and checked (``read``): what the engine
    builds it from and the library lists and checks it by."""

    folder: Path
    config: AssistantConfig
    files: tuple[Path, ...]  # its weight files
    tensors: dict[str, Tensor] = field(repr=False)  # by the module's names
    made_for: str = ""

    def facts(self) -> dict:
        """What a target must be for it, as the library's index keeps it
        (and ``fit_problem`` reads it): the hidden width it reads, the
        vocabulary it drafts over, the model it was made for ("": its
        config does not say), its own width, and for each kind of layer
        whose cache it reads, the key width its queries have."""
        c = self.config
        return {"reads_width": c.backbone_hidden_size, "vocab": c.vocab_size,
                "for": self.made_for, "width": c.hidden_size,
                "reads": {kind: c.width(kind) for kind in c.reads}, "heads": c.num_heads,
                "window": c.sliding_window, "ordered": c.ordered}


def read(folder: Path, error: type[SpecChatError] = EngineError,
         shown: Path | None = None) -> Assistant:
    """An assistant's folder, every file of it checked before anything is
    built or loaded: its files can be read (folders.check_files), its
    config (AssistantConfig.from_config), its weights' shapes against it
    (check_weights) and its token ordering's ids. Messages name ``shown``
    (the folder the person gave)."""
    shown = shown or folder
    folders.check_files(folder, error, shown)
    config = folders.read_config(folder, error, shown)
    if not recognizes(config):
        raise error(f"{shown} is not a Gemma 4 assistant (its config.json names no "
                    f"{MODEL_TYPE} model type)")
    c = AssistantConfig.from_config(config, shown, error)
    files = folders.head_weight_files(folder, error, shown)
    tensors, _, where = safetensors_file.read_renamed(files, rename, error, shown)
    check_weights(c, tensors, shown, error)
    if c.ordered:
        t = tensors[ORDERING]
        ids = safetensors_file.read_values(where[ORDERING], [t], error,
                                           shown / where[ORDERING].name)[ORDERING]
        bad = next((i for i in ids if not 0 <= i < c.vocab_size), None)
        if bad is not None:
            raise error(f"{shown / t.file}: its token ordering names the id {bad:,}, outside "
                        f"its {c.vocab_size:,} ids")
    return Assistant(folder=folder, config=c, files=tuple(files), tensors=tensors,
                     made_for=made_for(config))


# -- against a target --------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What an assistant must fit of a target: its name as people know it,
    its model type, the width of its hidden states, its vocabulary, and for
    each kind of layer it has, (key width, key heads); its sliding window."""

    name: str
    model_type: str
    hidden_size: int
    vocab_size: int
    layers: dict[str, tuple[int, int]]
    window: int


def target_facts(name: str, config: dict) -> Target | None:
    """What an assistant must fit of the target whose config.json is
    ``config`` (a Gemma 4's numbers read as mlx-lm's gemma4_text reads
    them; None where it does not state its width, layers and vocabulary as
    whole numbers)."""
    cfg = folders.text_config(config)
    model_type = str(config.get("model_type") or cfg.get("model_type") or "")
    sizes = [cfg.get(k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")]
    if not all(whole(v) and v > 0 for v in sizes):
        return None
    hidden, layers, vocab = sizes

    def size(key: str, default: int) -> int:
        v = cfg.get(key)
        return v if whole(v) and v > 0 else default

    pattern = size("sliding_window_pattern", DEFAULTS["sliding_window_pattern"])
    try:
        kinds = _layer_types(cfg, layers, pattern, "config.json", "", EngineError)
    except EngineError:
        return None
    shared = cfg.get("num_kv_shared_layers", DEFAULTS["num_kv_shared_layers"])
    shared = shared if whole(shared) and 0 <= shared < layers else 0
    kinds = kinds[:layers - shared]  # the layers with a cache of their own
    kv = size("num_key_value_heads", DEFAULTS["num_key_value_heads"])
    full_kv = size("num_global_key_value_heads", kv) if cfg.get("attention_k_eq_v") else kv
    head_dim = size("head_dim", DEFAULTS["head_dim"])
    global_dim = cfg.get("global_head_dim", DEFAULTS["global_head_dim"])
    heads = {SLIDING: (head_dim, kv),
             FULL: (global_dim if whole(global_dim) and global_dim > 0 else head_dim, full_kv)}
    return Target(name, model_type, hidden, vocab, {k: heads[k] for k in set(kinds)},
                  size("sliding_window", DEFAULTS["sliding_window"]))


def fits(head: dict, target: Target) -> str:
    """What makes an assistant that fits (``fit_problem``) draft for
    ``target``, in words."""
    return (f"a Gemma 4 assistant that reads {target.name}'s final hidden states (width "
            f"{target.hidden_size}) and the keys and values of its last full-attention and "
            f"sliding-window layers, and drafts over its {target.vocab_size:,} ids")


def fit_problem(head: dict, target: Target, name: str) -> str | None:
    """Why the assistant ``name`` (its ``Assistant.facts``, or the
    library's record of them) cannot draft for ``target``, in words; None
    when it fits. It reads the target's final hidden states and embeds
    with the target's embedding, so both must be as wide as it expects; it
    attends with its own queries over the target's keys of each kind of
    layer it reads, so those layers must be there with keys as wide as its
    queries and a number of key heads its heads divide into; and it drafts
    over the target's vocabulary."""
    if target.model_type not in TARGET_TYPES:
        return (f"{name} is a Gemma 4 assistant and drafts only for the Gemma 4 it was made "
                f"for; {target.name} is a {target.model_type or 'model of another kind'}")
    problems = []
    if head["reads_width"] != target.hidden_size:
        problems.append(f"it reads hidden states of width {head['reads_width']}, {target.name} "
                        f"has {target.hidden_size}")
    if head["vocab"] != target.vocab_size:
        problems.append(f"it drafts over {head['vocab']:,} ids, {target.name} has "
                        f"{target.vocab_size:,}")
    for kind, width in sorted(head["reads"].items()):
        words = kind.replace("_attention", "")
        have = target.layers.get(kind)
        if have is None:
            problems.append(f"it reads a {words}-attention layer's cache, {target.name} has "
                            "none")
        elif have[0] != width:
            problems.append(f"its {words}-attention queries are {width} wide, {target.name}'s "
                            f"keys there {have[0]}")
        elif head["heads"] % have[1]:
            problems.append(f"its {head['heads']} heads do not share {target.name}'s "
                            f"{have[1]} {words}-attention key heads evenly")
    if not problems:
        return None
    made_for = f" ({head['for']})" if head.get("for") else ""
    return (f"{name} is a Gemma 4 assistant for another model{made_for} and cannot draft for "
            f"{target.name}: " + "; ".join(problems))


def map_problem(files: Assistant, target: Target, name: str) -> str | None:
    """An assistant drafts over its target's own ids: no map to check
    (``read`` checked its token ordering against its vocabulary, which
    ``fit_problem`` checks against the target's)."""
    return None
