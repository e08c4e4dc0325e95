"""Would mlx-lm load this model? Answered from the small files and the
safetensors headers only, before a model is copied or listed.

mlx-lm builds the model class from config.json, reads every
``model*.safetensors``, drops what ``sanitize`` drops and calls
``load_weights(strict=True)``: any missing tensor, extra tensor or wrong shape
fails there, after seconds or minutes of loading. The tokenizer config and
the chat template fail later still, on the first message. Everything here
reads headers and JSON (milliseconds, no tensor data), so an import, a Hub
pull and a listing can refuse such a model up front, in words that name the
user's own files.

Expected tensor names and shapes are derived from config.json for the
architectures whose layout is known here (llama and its remaps, qwen2,
qwen3), including MLX-quantized folders (``.scales``/``.biases`` beside a
packed ``uint32`` weight). Other architectures get the file, shard and
config checks (every shard the index or the ``-of-N`` names promise is
there, holding what the index says); their tensor names are left to mlx-lm.
Chat templates are compiled by the engine's own compile_template (on its
syntax-only environment, which imports no transformers), so the import
check and the engine accept exactly the same templates.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specchat import records
from specchat.engine import folders, rope_rules, safetensors_file
from specchat.engine.folders import text_config
from specchat.engine.safetensors_file import Tensor
from specchat.engine.safetensors_file import whole as _whole
from specchat.engine.template import TemplateError, compile_template
from specchat.library.disk import stamp
from specchat.library.errors import LibraryError

# config.json numbers that must be whole and positive when present, and
# numbers that must be positive.
POSITIVE_INTS = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings")
POSITIVE_NUMBERS = ("rms_norm_eps", "rope_theta")
# config.json keys that are objects when present, and token ids.
_OBJECTS = ("text_config", "quantization", "quantization_config")
_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")

# mlx-lm's MODEL_REMAPPING entries that land on a layout known here.
_REMAP = {"mistral": "llama", "iquestcoder": "llama", "xverse": "llama"}
# Keys each known architecture's ModelArgs requires (no default).
_LLAMA_REQUIRED = ("hidden_size", "num_hidden_layers", "intermediate_size",
                   "num_attention_heads", "rms_norm_eps", "vocab_size")
_REQUIRED = {
    "llama": _LLAMA_REQUIRED,
    "qwen2": (*_LLAMA_REQUIRED, "num_key_value_heads"),
    "qwen3": (*_LLAMA_REQUIRED, "num_key_value_heads", "max_position_embeddings", "head_dim",
              "tie_word_embeddings"),
}
_PACKED_BITS = (1, 2, 3, 4, 5, 6, 8)
# A layer index as a tensor name writes it: ASCII digits, no leading zero
# (str.isdigit() also accepts "²", which int() then refuses).
LAYER_INDEX = re.compile(r"0|[1-9][0-9]*")
_LAYER_NAME = re.compile(r"model\.layers\.(0|[1-9][0-9]*)\.")
INDEX_FILE = "model.safetensors.index.json"
# ``model-00001-of-00002.safetensors``: Transformers' and mlx-lm's shard names.
_SHARD_NAME = re.compile(r"(?P<stem>.+)-(?P<i>[0-9]{5})-of-(?P<n>[0-9]{5})\.safetensors")
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
                   "mask_token")


# -- safetensors files ---------------------------------------------------------
def read_safetensors(path: Path, shown: Path | None = None) -> dict[str, Tensor]:
    """Every tensor of one safetensors file, checked as the format requires
    (engine.safetensors_file.read: the one reader, which the engine's
    loader uses too), refused as a LibraryError naming ``shown``."""
    return safetensors_file.read(path, LibraryError, shown)


# -- config.json ---------------------------------------------------------------
def check_config(config: dict, where: Path) -> None:
    """The numbers mlx-lm builds the model from are numbers, and positive;
    a known architecture has every key its ModelArgs requires. ``where`` is
    the config.json to name."""
    cfg = text_config(config)
    model_type = config.get("model_type", cfg.get("model_type"))
    if not isinstance(model_type, str) or not model_type.strip():
        if model_type is None:
            raise LibraryError(f"{where} lacks 'model_type', so no model class can be chosen")
        raise LibraryError(f"{where}: model_type must be a name; got {_shown(model_type)}")
    arch = _REMAP.get(model_type, model_type)
    for key in _REQUIRED.get(arch, ()):
        if config.get(key) is None:
            raise LibraryError(f"{where} lacks {key!r}, which a {model_type} model needs")
    for key in POSITIVE_INTS:
        v = cfg.get(key)
        if v is not None and not (_whole(v) and v > 0):
            raise LibraryError(f"{where}: {key} must be a whole number above 0; got {_shown(v)}")
    for key in POSITIVE_NUMBERS:
        v = cfg.get(key)
        if v is not None and not (isinstance(v, int | float) and not isinstance(v, bool)
                                  and v > 0 and v == v and v != float("inf")):
            raise LibraryError(f"{where}: {key} must be a number above 0; got {_shown(v)}")
    tie = cfg.get("tie_word_embeddings")
    if tie is not None and not isinstance(tie, bool):
        raise LibraryError(f"{where}: tie_word_embeddings must be true or false; got {_shown(tie)}")
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise LibraryError(f"{where}: num_attention_heads ({heads}) must be a multiple of "
                           f"num_key_value_heads ({kv})")
    # What mlx-lm and transformers read as objects or token ids, of those
    # kinds: else the model passed here and failed only when it was built,
    # in Python's words ("'list' object has no attribute 'get'") or
    # transformers' (a validation error over several lines).
    for key in _OBJECTS:
        v = config.get(key)
        if v is not None and not isinstance(v, dict):
            raise LibraryError(f"{where}: {key} must be an object; got {_shown(v)}")
    for key in _TOKEN_IDS:
        v = cfg.get(key)
        if v is not None and not (_whole(v) or (isinstance(v, list)
                                                and all(_whole(i) for i in v))):
            raise LibraryError(f"{where}: {key} must be a token id (a whole number) or a list of "
                               f"them; got {_shown(v)}")
    found = rope_rules.problem(cfg.get("rope_scaling"), cfg.get("max_position_embeddings"),
                               known=arch in _REQUIRED, needs=rope_rules.MODEL_NEEDS)
    if found is not None:
        kind, why = found
        if kind is None:
            raise LibraryError(f"{where}: its rope scaling's type must be a name; got {why}")
        of = f' of type "{kind}"' if kind else ""
        raise LibraryError(f"{where}: its rope scaling{of} is one mlx-lm cannot build ({why})")


def _shown(v: object) -> str:
    text = json.dumps(v) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


# -- expected tensors ----------------------------------------------------------
@dataclass(frozen=True)
class Module:
    """One weight-holding module of the model: ``kind`` is "linear",
    "embedding" (both quantizable) or "norm"; ``shape`` the float weight's."""

    kind: str
    shape: tuple[int, ...]
    bias: bool = False


def expected_modules(config: dict) -> dict[str, Module] | None:
    """Module path -> Module for the architectures known here, as mlx-lm
    builds them from ``config`` (after check_config); None for others."""
    model_type = str(config.get("model_type"))
    arch = _REMAP.get(model_type, model_type)
    if arch not in _REQUIRED:
        return None
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    inter, heads = config["intermediate_size"], config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    vocab = config["vocab_size"]
    head_dim = (config.get("head_dim") if arch != "qwen2" else None) or hidden // heads
    qkv_bias = {"llama": bool(config.get("attention_bias")), "qwen2": True, "qwen3": False}[arch]
    o_bias = arch == "llama" and bool(config.get("attention_bias"))
    mlp_bias = arch == "llama" and bool(config.get("mlp_bias"))
    out: dict[str, Module] = {
        "model.embed_tokens": Module("embedding", (vocab, hidden)),
        "model.norm": Module("norm", (hidden,)),
    }
    if not config.get("tie_word_embeddings", True):
        out["lm_head"] = Module("linear", (vocab, hidden))
    for i in range(layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm"] = Module("norm", (hidden,))
        out[p + "post_attention_layernorm"] = Module("norm", (hidden,))
        out[p + "self_attn.q_proj"] = Module("linear", (heads * head_dim, hidden), qkv_bias)
        out[p + "self_attn.k_proj"] = Module("linear", (kv * head_dim, hidden), qkv_bias)
        out[p + "self_attn.v_proj"] = Module("linear", (kv * head_dim, hidden), qkv_bias)
        out[p + "self_attn.o_proj"] = Module("linear", (hidden, heads * head_dim), o_bias)
        if arch == "qwen3":
            out[p + "self_attn.q_norm"] = Module("norm", (head_dim,))
            out[p + "self_attn.k_norm"] = Module("norm", (head_dim,))
        out[p + "mlp.gate_proj"] = Module("linear", (inter, hidden), mlp_bias)
        out[p + "mlp.up_proj"] = Module("linear", (inter, hidden), mlp_bias)
        out[p + "mlp.down_proj"] = Module("linear", (hidden, inter), mlp_bias)
    return out


def first_missing_layer(present: set[int] | dict[int, object], count: int) -> int | None:
    """The lowest layer index below ``count`` that ``present`` lacks, or None.

    Takes time in the number of layers present, never in ``count``: a
    config.json or GGUF header may claim 10**9 layers, and counting up to
    that (or building each layer's expected tensors) would hang an import,
    a pull or a listing beyond the reach of Cancel. When ``count`` exceeds
    what is present, a gap lies among the first ``len(present) + 1``."""
    for i in range(min(count, len(present) + 1)):
        if i not in present:
            return i
    return None


def check_tensors(tensors: dict[str, Tensor], config: dict, shown: Path,
                  source: str = "config.json",
                  label: Callable[[str], str] | None = None) -> None:
    """The tensors are exactly those ``load_weights(strict=True)`` wants,
    with its shapes: nothing missing, nothing extra, quantized modules
    packed consistently. ``source`` names what the expectation comes from
    in messages ("config.json", "its metadata"); ``label`` turns a tensor
    name into the name the user's file uses (a GGUF's ``blk.N...``)."""
    name = label or (lambda n: n)
    model_type = str(config.get("model_type"))
    if _REMAP.get(model_type, model_type) not in _REQUIRED:
        return  # a layout not known here: left to mlx-lm
    layers = config["num_hidden_layers"]
    present = {int(m.group(1)) for m in map(_LAYER_NAME.match, tensors) if m}
    if layers > len(present):  # before expanding a (maybe absurd) layer count
        gap = first_missing_layer(present, layers)
        raise LibraryError(
            f"{shown} is incomplete: {source} describes {layers} layers, but tensor "
            f"{name(f'model.layers.{gap}.input_layernorm.weight')} is missing: the weights hold "
            f"{len(present)} layers (a weights file missing or cut short, or a config that does "
            "not belong to these weights)")
    modules = expected_modules(config)
    if modules is None:
        return
    if "quantization_config" in config and "quantization" not in config:
        return  # quantized by another tool; mlx-lm converts these in ways not modelled here
    have = {n: t for n, t in tensors.items() if "self_attn.rotary_emb.inv_freq" not in n}
    if config.get("tie_word_embeddings", True):
        have.pop("lm_head.weight", None)  # what sanitize drops
    quant = config.get("quantization") if isinstance(config.get("quantization"), dict) else None
    missing: list[str] = []
    used: set[str] = set()
    for path, module in modules.items():
        weight = have.get(f"{path}.weight")
        if weight is None:
            missing.append(f"{path}.weight")
            continue
        used.add(weight.name)
        packed = quant is not None and module.kind != "norm" and f"{path}.scales" in have \
            and quant.get(path) is not False
        if packed:
            used.update(_check_packed(path, module, have, shown, missing))
        elif weight.shape != module.shape:
            raise LibraryError(
                f"{shown}: tensor {name(weight.name)} has shape {list(weight.shape)} (in "
                f"{weight.file}) but {source} implies {list(module.shape)}")
        if module.bias:
            bias = have.get(f"{path}.bias")
            if bias is None:
                missing.append(f"{path}.bias")
            else:
                used.add(bias.name)
                if bias.shape != module.shape[:1]:
                    raise LibraryError(
                        f"{shown}: tensor {name(bias.name)} has shape {list(bias.shape)} (in "
                        f"{bias.file}) but {source} implies {list(module.shape[:1])}")
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise LibraryError(
            f"{shown} is incomplete: {source} describes {layers} layers, but tensor "
            f"{name(missing[0])}{more} is missing from the weights (a weights file missing or "
            "cut short, or a config that does not belong to these weights)")
    extra = sorted(set(have) - used)
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise LibraryError(
            f"{shown} does not fit together: tensor {name(extra[0])}{more} is not part of "
            f"the {layers}-layer model {source} describes")


def _check_packed(path: str, module: Module, have: dict[str, Tensor], shown: Path,
                  missing: list[str]) -> list[str]:
    """A quantized module as mlx-lm infers it (utils.infer_quant_config):
    a uint32 weight of ``in * bits / 32`` columns, scales of ``in / group``
    columns, and (affine mode, scales not uint8) biases shaped like scales."""
    weight, scales = have[f"{path}.weight"], have[f"{path}.scales"]
    rows, cols = module.shape
    fits = (weight.dtype == "U32" and len(weight.shape) == 2 and weight.shape[0] == rows
            and len(scales.shape) == 2 and scales.shape[0] == rows and scales.shape[1] > 0
            and cols % scales.shape[1] == 0 and (weight.shape[1] * 32) % cols == 0
            and (weight.shape[1] * 32) // cols in _PACKED_BITS)
    if not fits:
        raise LibraryError(
            f"{shown}: quantized tensor {weight.name} ({weight.dtype} {list(weight.shape)}, "
            f"scales {list(scales.shape)}, in {weight.file}) does not pack a "
            f"{list(module.shape)} weight")
    used = [scales.name]
    if scales.dtype != "U8":  # affine: biases beside the scales
        biases = have.get(f"{path}.biases")
        if biases is None:
            missing.append(f"{path}.biases")
        elif biases.shape != scales.shape:
            raise LibraryError(f"{shown}: tensor {biases.name} has shape {list(biases.shape)} "
                               f"but its scales have {list(scales.shape)}")
        else:
            used.append(biases.name)
    return used


# -- shards ----------------------------------------------------------------------
def check_shards(folder: Path, by_file: dict[str, dict[str, Tensor]], shown: Path) -> None:
    """Every shard is there, for any architecture (the tensor check above
    knows only some layouts). With model.safetensors.index.json, each file
    its weight_map names must be a weights file mlx-lm loads and hold the
    tensors the map puts in it; files the map does not name are not
    required. Without one, shards named ``<stem>-0000i-of-0000N`` must all
    be there. ``by_file``: shard file name -> its tensors."""
    index = folder / INDEX_FILE
    if index.exists():
        _check_index(index, by_file, shown)
        return
    series: dict[tuple[str, int], str] = {}
    for fname in sorted(by_file):
        m = _SHARD_NAME.fullmatch(fname)
        if m:
            series.setdefault((m["stem"], int(m["n"])), fname)
    for (stem, n), some in series.items():
        for i in range(1, n + 1):
            want = f"{stem}-{i:05d}-of-{n:05d}.safetensors"
            if want not in by_file:
                raise LibraryError(
                    f"{shown} is incomplete: it has {some} but not {want} (the weights come in "
                    f"{n} files). The download or copy was probably cut short; get it again")


def _read_json(path: Path, where: Path) -> dict:
    """A small JSON object of the folder (folders.read_json_object: only a
    regular file, bounded, nesting checked); ``where`` names it."""
    return folders.read_json_object(path, LibraryError, where)


def _check_index(index: Path, by_file: dict[str, dict[str, Tensor]], shown: Path) -> None:
    where = shown / index.name
    data = _read_json(index, where)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) and v and "/" not in v and "\\" not in v and v not in (".", "..")
            for v in weight_map.values()):
        raise LibraryError(f"{where} is broken: it needs a weight_map of tensor names to file "
                           "names in the model folder")
    for fname in sorted(set(weight_map.values())):
        if fname in by_file:
            continue
        if (index.parent / fname).exists():
            raise LibraryError(f"{where} puts tensors in {fname}, which is not a "
                               "model*.safetensors file mlx-lm loads")
        raise LibraryError(
            f"{shown} is incomplete: {index.name} lists {fname}, which is missing. The download "
            "or copy was probably cut short; get it again")
    for tensor, fname in weight_map.items():
        if tensor not in by_file[fname]:
            raise LibraryError(
                f"{shown / fname} is incomplete: {index.name} puts tensor {tensor!r} in it, but "
                "it is not there (a damaged file, or one from another version of the model)")


# -- tokenizer config and chat template -----------------------------------------
def check_tokenizer_config(folder: Path, shown: Path) -> None:
    """tokenizer_config.json is a JSON object with fields of the right types,
    and every chat template the folder carries compiles."""
    path = folder / "tokenizer_config.json"
    where = shown / "tokenizer_config.json"
    if path.exists():
        data = _read_json(path, where)
        _check_tokenizer_fields(data, where)
        template = data.get("chat_template")
        if isinstance(template, str):
            check_chat_template(template, where)
        elif isinstance(template, list):
            for item in template:
                check_chat_template(item["template"], where, item["name"])
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        try:
            text = records.read_file(jinja, records.MAX_JSON_BYTES).decode("utf-8")
        except (OSError, ValueError) as exc:  # records.BadRecord and UnicodeDecodeError included
            raise LibraryError(f"{shown / jinja.name} is broken: "
                               f"{getattr(exc, 'strerror', None) or exc}") from None
        check_chat_template(text, shown / jinja.name)
    extra = folder / "chat_template.json"
    if extra.exists():
        data = _read_json(extra, shown / extra.name)
        template = data.get("chat_template")
        if not isinstance(template, str):
            raise LibraryError(f"{shown / extra.name}: chat_template must be text; got "
                               f"{_shown(template)}")
        check_chat_template(template, shown / extra.name)


def _check_tokenizer_fields(data: dict, where: Path) -> None:
    def wrong(key: str, want: str) -> LibraryError:
        return LibraryError(f"{where} is broken: {key} must be {want}; got {_shown(data[key])}")

    template = data.get("chat_template")
    if template is not None and not isinstance(template, str):
        if not (isinstance(template, list) and all(
                isinstance(t, dict) and isinstance(t.get("name"), str)
                and isinstance(t.get("template"), str) for t in template)):
            raise wrong("chat_template", "text or a list of {name, template}")
    for key in _SPECIAL_TOKENS:
        v = data.get(key)
        if v is not None and not isinstance(v, str) and not (
                isinstance(v, dict) and isinstance(v.get("content"), str)):
            raise wrong(key, "a token (text)")
    decoder = data.get("added_tokens_decoder")
    if decoder is not None:
        if not isinstance(decoder, dict) or not all(
                k.isascii() and k.isdigit() and isinstance(v, dict) and isinstance(v.get("content"), str)
                for k, v in decoder.items()):
            raise wrong("added_tokens_decoder", "an object of token ids to {content: text}")
    for key in ("add_bos_token", "add_eos_token", "clean_up_tokenization_spaces"):
        v = data.get(key)
        if v is not None and not isinstance(v, bool):
            raise wrong(key, "true or false")
    length = data.get("model_max_length")
    if length is not None and (isinstance(length, bool) or not isinstance(length, int | float)):
        raise wrong("model_max_length", "a number")
    extra = data.get("additional_special_tokens")
    if extra is not None and not (isinstance(extra, list) and all(
            isinstance(t, str) or (isinstance(t, dict) and isinstance(t.get("content"), str))
            for t in extra)):
        raise wrong("additional_special_tokens", "a list of tokens")


# What the engine's TemplateError says before its reason (engine/template.py).
_ENGINE_SAYS = "The model's chat template is broken: "


def check_chat_template(template: str, where: Path | str, name: str | None = None) -> None:
    """Compile (never render) a chat template exactly as the engine will
    (engine.template.compile_template, syntax only: transformers'
    extensions, filter and test names, never transformers itself, which
    must not be imported on the window's threads), so a template passes
    here if and only if the
    engine can use it; any failure (bad syntax with its line, nesting too
    deep for Python's compiler, ...) is said naming the file it came from."""
    try:
        compile_template(template, syntax_only=True)
    except TemplateError as exc:
        which = f"chat template {name!r}" if name else "chat template"
        text = str(exc)
        why = text.removeprefix(_ENGINE_SAYS) if text.startswith(_ENGINE_SAYS) else text
        raise LibraryError(f"{where}: the {which} is broken, {why}") from None


# -- the whole folder ------------------------------------------------------------
def check_folder(folder: Path, config: dict, weight_files: list[Path],
                 shown: Path | None = None) -> dict[str, Tensor]:
    """Everything above for one MLX folder (config.json already read);
    returns the tensors of all shards. Raises LibraryError naming ``shown``
    (the folder the user gave) rather than ``folder`` (maybe a copy)."""
    shown = shown or folder
    check_config(config, shown / "config.json")
    by_file = {shard.name: read_safetensors(shard, shown / shard.name) for shard in weight_files}
    check_shards(folder, by_file, shown)
    tensors: dict[str, Tensor] = {}
    for found in by_file.values():
        tensors.update(found)
    check_tensors(tensors, config, shown)
    small = ("config.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json")
    _tokenizer_config_passed(folder, shown, *(stamp(folder / n) for n in small))
    return tensors


@functools.lru_cache(maxsize=64)
def _tokenizer_config_passed(folder: Path, shown: Path, *_stamps: object) -> None:
    """check_tokenizer_config, remembered (only when it passes) until one of
    the small files changes."""
    check_tokenizer_config(folder, shown)
