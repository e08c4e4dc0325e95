"""EAGLE-3 draft heads on disk: their format, read and checked without MLX.

A head is a folder of its own (eagle3.py drafts with it): ``config.json``
and safetensors, in EAGLE-3's own layout (``LlamaForCausalLMEagle3``: a flat
Llama config with ``draft_vocab_size``, the layer's weights under
``midlayer.``) or vLLM's ``speculators`` (the layer's config under
``transformer_layer_config``, its weights under ``layers.0.``, the target's
layers in ``eagle_aux_hidden_state_layer_ids``).

Everything a head's files must be is decided here, once: its config as a
checked dataclass (every field typed and bounded, refused in words), the
target layers it reads by default (2, n/2 and n - 3 of n), its weights'
shapes against its config (from the safetensors headers, never the
tensors, so a config that states a million layers is refused in
milliseconds rather than built), its vocabulary map, and whether it fits a
target. The engine's loader (eagle3.py, session.py), the library's checks
(facts.py, compatibility.py) and the trainer (head_training.py: the config
it publishes) all call it, so their rules and their words cannot drift
apart. It imports no MLX, so the library may import it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from specchat.engine import folders, rope_rules, safetensors_file
from specchat.engine.config_fields import Fields
from specchat.engine.errors import EngineError
from specchat.engine.safetensors_file import FLOAT_DTYPES, WHOLE_DTYPES, Tensor, whole
from specchat.errors import SpecChatError
from specchat.records import described

NAME = "eagle3"  # drafter_kinds.EAGLE3's name, and a head's model type in the library
LABEL = "EAGLE-3"  # what people call the format: "an EAGLE-3 head"

# A vocabulary's most ids: a head's d2t has one entry per draft id and its
# t2d one per target id, and the largest vocabularies are a few hundred
# thousand. A map past this is refused before it is read (a file may claim
# any size).
MAX_IDS = 1 << 22
# What a head's config may state, as (least, most) of each whole number. A
# published head has one layer a few thousand wide; the most here are far
# past any, and stop a damaged or hostile config before anything is built
# from it (its weights' shapes are checked against it besides).
SIZES: dict[str, tuple[int, int]] = {
    "hidden_size": (1, 1 << 16),
    "intermediate_size": (1, 1 << 18),
    "num_hidden_layers": (1, 16),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "head_dim": (1, 4096),
    "vocab_size": (1, MAX_IDS),
    "draft_vocab_size": (1, MAX_IDS),
    "target_hidden_size": (1, 1 << 16),
    "max_position_embeddings": (1, 1 << 28),
}
READS = 3  # the target layers a head reads (its fc takes their hidden states side by side)
MAX_LAYER_ID = 1 << 16  # the largest target layer id a config may name (negative: as many)

_LAYER = re.compile(r"layers\.(0|[1-9][0-9]*)\.")


def recognizes(config: dict) -> bool:
    """Whether a folder's config.json is an EAGLE-3 draft head's rather
    than a model's: EAGLE-3's own layout or vLLM's ``speculators``."""
    archs = config.get("architectures")
    archs = " ".join(str(a) for a in archs) if isinstance(archs, list) else str(archs or "")
    return ("eagle3" in archs.lower() or config.get("speculators_model_type") == "eagle3"
            or config.get("model_type") == "eagle3")


def made_for(config: dict) -> str:
    """The model a head's config says it drafts for (vLLM's
    ``speculators_config.verifier.name_or_path``), or "" where it says none."""
    spec = config.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, dict) else None
    name = verifier.get("name_or_path") if isinstance(verifier, dict) else None
    return name if isinstance(name, str) else ""


def default_layer_ids(target_layers: int) -> tuple[int, int, int]:
    """The hidden states a head reads when its config names none (EAGLE-3's
    choice: 2, n/2 and n - 3 of the target's n layers), none past the last
    layer's output (id n): a target of one layer has no id 2, and training
    a head for one ended on an internal error (IndexError)."""
    return min(2, target_layers), target_layers // 2, target_layers - 3


@dataclass(frozen=True)
class HeadConfig:
    """A head's config.json, checked. ``head_dim`` is its weights' once
    ``read`` has seen them (a published config may state another)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_hidden_size: int
    layer_ids: tuple[int, ...] | None  # the target's layers it reads (None: default_layer_ids)
    norm_before_residual: bool
    tie_word_embeddings: bool
    rope_scaling: dict | None = None  # as mlx-lm's models read it (rope_utils.initialize_rope)
    rope_traditional: bool = False
    max_position_embeddings: int | None = None

    @classmethod
    def from_config(cls, config: dict, shown: Path | None = None,
                    error: type[SpecChatError] = EngineError) -> HeadConfig:
        """The checked config, or ``error`` naming the field and the file
        (in ``shown``, the head's folder as the person gave it), in words."""
        where = shown / "config.json" if shown is not None else "config.json"
        read = Fields(where, error, SIZES, "an EAGLE-3 head's")
        layer, prefix = config, ""
        if config.get("transformer_layer_config") is not None:
            layer, prefix = config["transformer_layer_config"], "transformer_layer_config."
            if not isinstance(layer, dict):
                raise error(f"{where}: transformer_layer_config must be an object (the config "
                            f"of the head's layer); got {described(layer)}")
        hidden = read.size(layer, "hidden_size", prefix)
        heads = read.size(layer, "num_attention_heads", prefix)
        kv_heads = read.size(layer, "num_key_value_heads", prefix, heads)
        if heads % kv_heads:
            raise error(f"{where}: {prefix}num_attention_heads ({heads}) must be a multiple "
                        f"of num_key_value_heads ({kv_heads})")
        vocab = (read.size(layer, "vocab_size", prefix) if layer.get("vocab_size") is not None
                 else read.size(config, "vocab_size"))
        draft_vocab = read.size(config, "draft_vocab_size", "", vocab)
        if draft_vocab > vocab:
            raise error(f"{where}: draft_vocab_size ({draft_vocab:,}) must be at most its "
                        f"target's vocab_size ({vocab:,}): it drafts a subset of its ids")
        parameters = read.mapping(layer, "rope_parameters", prefix)
        scaling = read.mapping(layer, "rope_scaling", prefix) or parameters
        positions = read.size(layer, "max_position_embeddings", prefix, None)
        c = cls(
            hidden_size=hidden,
            intermediate_size=read.size(layer, "intermediate_size", prefix),
            num_layers=read.size(layer, "num_hidden_layers", prefix, 1),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=read.size(layer, "head_dim", prefix, None) or max(hidden // heads, 1),
            rms_norm_eps=read.number(layer, "rms_norm_eps", prefix, 1e-6),
            rope_theta=read.number(parameters or layer, "rope_theta",
                                   prefix + "rope_parameters." if parameters else prefix,
                                   read.number(layer, "rope_theta", prefix, 1e4)),
            vocab_size=vocab,
            draft_vocab_size=draft_vocab,
            target_hidden_size=read.size(config, "target_hidden_size", "", hidden),
            layer_ids=_layer_ids(config, where, error),
            norm_before_residual=read.flag(config, "norm_before_residual", False),
            tie_word_embeddings=read.flag(config, "tie_word_embeddings", False),
            rope_scaling=scaling,
            rope_traditional=read.flag(layer, "rope_traditional", False, prefix),
            max_position_embeddings=positions,
        )
        _check_rope(c, shown if shown is not None else "the head", error)
        return c

    def read_layers(self, target_layers: int) -> tuple[int, ...]:
        """The target layers whose outputs it reads: the published ids name
        hidden states (id i: the input of layer i, the output of layer
        i - 1; an id below 1 reads the first layer's output)."""
        ids = self.layer_ids or default_layer_ids(target_layers)
        return tuple(max(i - 1, 0) for i in ids)


def _layer_ids(config: dict, where: Path | str, error: type[SpecChatError]) -> tuple[int, ...] | None:
    """The target layers a config names (either layout's key), checked."""
    key = next((k for k in ("eagle_aux_hidden_state_layer_ids", "target_layer_ids")
                if config.get(k) is not None), None)
    if key is None:
        return None
    ids = config[key]
    if not (isinstance(ids, list) and len(ids) == READS and all(
            whole(i) and -MAX_LAYER_ID <= i <= MAX_LAYER_ID for i in ids)):
        raise error(f"{where}: {key} must name the {READS} target layers it reads "
                    f"(whole numbers); got {described(ids)}")
    return tuple(ids)


def _check_rope(c: HeadConfig, head: Path | str, error: type[SpecChatError]) -> None:
    """Refuse, in words, a rope scaling mlx-lm cannot build (rope_rules):
    drafting with other frequencies than the head was trained with would
    draft noise. eagle3.check_rope builds it besides, for what only
    building shows."""
    found = rope_rules.problem(c.rope_scaling, c.max_position_embeddings)
    if found is None:
        return
    kind, why = found
    if kind is None:
        raise error(f"{head}/config.json: its rope scaling's type must be a name; got {why}")
    raise error(rope_refusal(head, kind, why))


def rope_refusal(head: Path | str, kind: str, why: str) -> str:
    """The one sentence for a rope scaling mlx-lm cannot build."""
    return (f'{head} is an EAGLE-3 head with a rope scaling of type "{kind}", which mlx-lm '
            f"cannot build ({why}); it would draft with the wrong positions")


# -- its weights -------------------------------------------------------------------------


def rename(key: str) -> str | None:
    """A published weight name as eagle3.py's module names it (None: not
    read: vLLM's verifier copies and rotary tables)."""
    if key.startswith("verifier_") or "rotary_emb.inv_freq" in key:
        return None
    return key.replace("midlayer.", "layers.0.", 1)


def expected_shapes(c: HeadConfig) -> dict[str, tuple[int, ...]]:
    """Each weight the module is built with (eagle3.Eagle3Head), by name,
    with its shape; embed_tokens, lm_head and the maps are checked apart,
    since a head may leave them out."""
    h, q, kv = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    out = {"fc.weight": (h, READS * c.target_hidden_size), "norm.weight": (h,)}
    for i in range(c.num_layers):
        p, width = f"layers.{i}.", (2 * h if i == 0 else h)  # the first reads [embedding; hidden]
        if i == 0:
            out[p + "hidden_norm.weight"] = (h,)
        out.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                    p + "self_attn.q_proj.weight": (q, width),
                    p + "self_attn.k_proj.weight": (kv, width),
                    p + "self_attn.v_proj.weight": (kv, width),
                    p + "self_attn.o_proj.weight": (h, q),
                    p + "mlp.gate_proj.weight": (c.intermediate_size, h),
                    p + "mlp.up_proj.weight": (c.intermediate_size, h),
                    p + "mlp.down_proj.weight": (h, c.intermediate_size)})
    return out


def check_weights(c: HeadConfig, tensors: dict[str, Tensor], shown: Path,
                  error: type[SpecChatError] = EngineError,
                  names: dict[str, str] | None = None) -> HeadConfig:
    """The weights (by the module's names, with their shapes from the
    headers) are exactly those its config describes: nothing missing,
    nothing extra, every shape its config implies. Returns the config with
    the head width its weights have (a published config may state another:
    AngelSlim's Qwen3-4B head says ``head_dim`` 80, its hidden size over
    its heads, while its q_proj holds 32 heads of 128, as Qwen3's do;
    SafeAILab/EAGLE issue 315). ``names``: each name as its file writes it."""
    said = names or {}

    def name(n: str) -> str:
        return said.get(n, n)

    layers = {int(m.group(1)) for m in map(_LAYER.match, tensors) if m}
    if len(layers) != c.num_layers:
        raise error(f"{shown} does not fit together: its config describes {c.num_layers:,} "
                    f"layer{'s' if c.num_layers != 1 else ''}, but its weights hold "
                    f"{len(layers):,}")
    q = tensors.get("layers.0.self_attn.q_proj.weight")
    if q is not None and len(q.shape) == 2 and q.shape[0] != c.num_heads * c.head_dim:
        if q.shape[0] % c.num_heads:
            raise error(f"{shown}: its q_proj has {q.shape[0]} rows, not a whole number of its "
                        f"{c.num_heads} attention heads")
        c = replace(c, head_dim=q.shape[0] // c.num_heads)
    want = expected_shapes(c)
    if c.draft_vocab_size != c.vocab_size or not c.tie_word_embeddings:
        want["lm_head.weight"] = (c.draft_vocab_size, c.hidden_size)
    optional = {"embed_tokens.weight": (c.vocab_size, c.hidden_size),
                "lm_head.weight": (c.draft_vocab_size, c.hidden_size)}
    missing = [n for n in want if n not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise error(f"{shown} is incomplete: its weights lack {name(missing[0])}{more}, which "
                    "its config describes (a weights file missing or cut short, or a config "
                    "that does not belong to these weights)")
    for n, t in tensors.items():
        if n in ("d2t", "t2d"):
            continue
        shape = want.get(n) or optional.get(n)
        if shape is None:
            raise error(f"{shown} does not fit together: tensor {name(n)} (in {t.file}) is not "
                        "part of the head its config describes")
        if t.shape != shape:
            raise error(f"{shown}: tensor {name(n)} has shape {list(t.shape)} (in {t.file}) but "
                        f"its config implies {list(shape)}")
        if t.dtype not in FLOAT_DTYPES:
            raise error(f"{shown}: tensor {name(n)} is of dtype {t.dtype} (in {t.file}); a "
                        "head's weights are floats (SpecChat loads no quantized head)")
    _check_map_tensors(c, tensors, shown, error)
    return c


def _check_map_tensors(c: HeadConfig, tensors: dict[str, Tensor], shown: Path,
                       error: type[SpecChatError]) -> None:
    """d2t (one offset per draft id) and t2d (a mark per target id) are
    lists of numbers no longer than any vocabulary; d2t may be left out
    only by a head that drafts over the whole vocabulary."""
    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    if d2t is None and c.draft_vocab_size != c.vocab_size:
        raise error(f"{shown} drafts over {c.draft_vocab_size:,} ids but ships no d2t to map "
                    f"them into its target's {c.vocab_size:,}")
    for t, kinds in ((d2t, (WHOLE_DTYPES - {"BOOL"}) | FLOAT_DTYPES), (t2d, WHOLE_DTYPES)):
        if t is None:
            continue
        ids = math.prod(t.shape)
        if ids > MAX_IDS:
            raise error(f"{shown / t.file}: the head's {t.name} holds {ids:,} ids, more than "
                        f"any vocabulary ({MAX_IDS:,} at most)")
        if t.dtype not in kinds:
            raise error(f"{shown / t.file}: the head's {t.name} is of dtype {t.dtype}, not "
                        "numbers of ids")
        if len(t.shape) != 1:
            raise error(f"{shown / t.file}: the head's {t.name} has shape {list(t.shape)}, not "
                        "a list of ids")
    if d2t is not None and d2t.shape != (c.draft_vocab_size,):
        raise error(f"{shown / d2t.file}: the head's d2t maps {d2t.shape[0]:,} draft ids, but "
                    f"it drafts over {c.draft_vocab_size:,} (its draft_vocab_size)")


# -- the folder --------------------------------------------------------------------------


@dataclass(frozen=True)
class Head:
    """A head's folder, read and checked (``read``): what the engine builds
    it from and the library lists and checks it by."""

    folder: Path
    config: HeadConfig
    files: tuple[Path, ...]  # its weight files (folders.head_weight_files)
    tensors: dict[str, Tensor] = field(repr=False)  # by the module's names, d2t and t2d too
    d2t: tuple[int, ...] | None = field(repr=False)
    t2d: tuple[int, ...] | None = field(repr=False)
    made_for: str = ""

    @property
    def own_embedding(self) -> bool:
        """Whether it ships an embedding (else it shares its target's)."""
        return "embed_tokens.weight" in self.tensors

    def facts(self) -> dict:
        """What a target must be for it, as the library's index keeps it
        (and ``fit_problem`` reads it): the hidden width it reads, the ids
        of the hidden states it reads (None: default_layer_ids), the
        vocabulary it maps into, its own draft vocabulary, the model it was
        made for ("" where it does not say), its own width and whether it
        ships an embedding."""
        c = self.config
        return {"reads_width": c.target_hidden_size,
                "reads_layers": list(c.layer_ids) if c.layer_ids else None,
                "vocab": c.vocab_size, "draft_vocab": c.draft_vocab_size, "for": self.made_for,
                "width": c.hidden_size, "own_embedding": self.own_embedding}


def read(folder: Path, error: type[SpecChatError] = EngineError,
         shown: Path | None = None) -> Head:
    """A head's folder, every file of it checked before anything is built
    or loaded: its files can be read (folders.check_files), its config
    (HeadConfig.from_config), its weights' shapes against it
    (check_weights) and its vocabulary map's values (whole numbers).
    Messages name ``shown`` (the folder the person gave)."""
    shown = shown or folder
    folders.check_files(folder, error, shown)
    config = folders.read_config(folder, error, shown)
    if not recognizes(config):
        raise error(f"{shown} is not an EAGLE-3 draft head (its config.json names no eagle3 "
                    "architecture)")
    c = HeadConfig.from_config(config, shown, error)
    files = folders.head_weight_files(folder, error, shown)
    tensors, names, where = safetensors_file.read_renamed(files, rename, error, shown)
    c = check_weights(c, tensors, shown, error, names)
    maps = {}
    for n in ("d2t", "t2d"):
        if n in tensors:
            values = safetensors_file.read_values(where[n], [tensors[n]], error,
                                                  shown / where[n].name)[n]
            if any(v != int(v) for v in values if not isinstance(v, int)):
                raise error(f"{shown / where[n].name}: the head's {n} holds numbers that are "
                            "not whole, not ids")
            maps[n] = tuple(int(v) for v in values)
    return Head(folder=folder, config=c, files=tuple(files), tensors=tensors,
                d2t=maps.get("d2t"), t2d=maps.get("t2d"), made_for=made_for(config))


# -- against a target --------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What a head must fit of a target: its name as people know it, the
    width of its hidden states, its layers and its vocabulary (the rows of
    its embedding)."""

    name: str
    hidden_size: int
    num_layers: int
    vocab_size: int


def target_facts(name: str, config: dict) -> Target | None:
    """What a head must fit of the target whose config.json is ``config``
    (None where it does not state them as whole numbers)."""
    cfg = folders.text_config(config)
    sizes = [cfg.get(k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
        return None
    return Target(name, *sizes)


def fits(head: dict, target: Target) -> str:
    """What makes a head that fits (``fit_problem``) draft for ``target``,
    in words."""
    ids = head["reads_layers"] or list(default_layer_ids(target.num_layers))
    return (f"an EAGLE-3 head that reads {target.name}'s hidden states at layers {ids} (width "
            f"{target.hidden_size}) and drafts over {head['draft_vocab']:,} of its "
            f"{target.vocab_size:,} ids")


def fit_problem(head: dict, target: Target, name: str) -> str | None:
    """Why the head ``name`` (its ``Head.facts``, or the library's record
    of them) cannot draft for ``target``, in words; None when it fits. It
    reads the target's hidden states, so they must be as wide as it expects,
    the layers it reads must exist and its vocabulary must map into the
    target's ids; a head with no embedding of its own embeds with the
    target's, which must be as wide as its layer."""
    problems = []
    if head["reads_width"] != target.hidden_size:
        problems.append(f"it reads hidden states of width {head['reads_width']}, {target.name} "
                        f"has {target.hidden_size}")
    ids = head["reads_layers"] or list(default_layer_ids(target.num_layers))
    if any(not max(i - 1, 0) < target.num_layers for i in ids):
        problems.append(f"it reads layers {list(ids)}, {target.name} has {target.num_layers}")
    if head["vocab"] != target.vocab_size:
        problems.append(f"its vocabulary maps into {head['vocab']:,} ids, {target.name}'s has "
                        f"{target.vocab_size:,}")
    width = head.get("width")  # None in records from before it was kept
    said = width == head["reads_width"] != target.hidden_size  # the first problem says it
    if head.get("own_embedding") is False and width not in (None, target.hidden_size) \
            and not said:
        problems.append(f"it has no embedding of its own and {target.name}'s is "
                        f"{target.hidden_size} wide, not its {width}")
    if not problems:
        return None
    made_for = f" ({head['for']})" if head.get("for") else ""
    return (f"{name} is an EAGLE-3 head for another model{made_for} and cannot draft for "
            f"{target.name}: " + "; ".join(problems))


def map_problem(head: Head, target: Target, name: str) -> str | None:
    """Why the head's vocabulary map does not fit ``target``, in words;
    None when it does. A head that ships no d2t drafts over the whole
    vocabulary, in order."""
    d2t = head.d2t if head.d2t is not None else [0] * head.config.draft_vocab_size
    problems = vocab_map_problems(d2t, head.t2d, head.config.draft_vocab_size,
                                  target.vocab_size, target.name)
    if not problems:
        return None
    return f"{name}'s vocabulary map does not fit {target.name}: " + "; ".join(problems)


def vocab_map_problems(d2t: Sequence[int], t2d: Sequence[int] | None,
                       draft_vocab: int, target_vocab: int, target: str) -> list[str]:
    """What is wrong, in words, with a head's map from its draft vocabulary
    to a target's ids (draft id i is target id i + d2t[i]; ``t2d``, where
    shipped, marks the target ids it drafts): d2t must have one entry per
    draft id, every id either names must be one of the target's
    ``target_vocab``, and both must name the same ids."""
    problems = []
    if len(d2t) != draft_vocab:
        problems.append(f"its d2t maps {len(d2t):,} draft ids, but it drafts over "
                        f"{draft_vocab:,} (its draft_vocab_size)")
    mapped = [i + int(offset) for i, offset in enumerate(d2t)]
    outside = [(i, t) for i, t in enumerate(mapped) if not 0 <= t < target_vocab]
    if outside:
        i, t = max(outside, key=lambda it: abs(it[1]))
        problems.append(f"its d2t maps {len(outside):,} draft ids outside {target}'s "
                        f"{target_vocab:,} ids (draft id {i:,} to target id {t:,})")
    if t2d is not None:
        marked = [j for j, v in enumerate(t2d) if v]
        past = [j for j in marked if j >= target_vocab]
        if past:
            problems.append(f"its t2d marks {len(past):,} target ids past {target}'s "
                            f"{target_vocab:,} (up to {past[-1]:,})")
        if set(marked) != set(mapped):
            problems.append(f"its t2d marks {len(marked):,} target ids and its d2t maps to "
                            f"{len(set(mapped)):,}, not the same ones")
    return problems


# -- what the trainer writes -------------------------------------------------------------


def published_config(c: HeadConfig, target_layers: int, target_name: str) -> dict:
    """config.json in vLLM's ``speculators`` layout, as ``read`` reads it
    (head_training.py writes it beside the weights it trains)."""
    ids = list(c.layer_ids or default_layer_ids(target_layers))
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "transformer_layer_config": {
            "model_type": "llama", "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
            "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": c.rope_theta, "vocab_size": c.vocab_size},
        "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": ids, "norm_before_residual": c.norm_before_residual,
        "speculators_config": {"verifier": {"name_or_path": target_name}},
    }
