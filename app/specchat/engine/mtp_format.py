"""A model's own MTP head on disk: its ``mtp.*`` weights, checked against
the model's config from the safetensors headers, without MLX.

Qwen3.5, Qwen3.6 and Qwen3-Next checkpoints carry one (mtp.py drafts with
it): a projection ``fc`` of [embedding; hidden state], two norms before it,
decoder layers of the model's own kind and a final norm. What its weights
must be is decided here, once, for the engine's loader (before it builds
the head) and the library's checks (``specchat models check T mtp``, the
model's facts), so both say the same of the same files. What only the
model's own layer class knows (each tensor inside a layer) the engine
checks besides when it builds the head (mtp.load_head), in the same words.
"""

from __future__ import annotations

import re
from pathlib import Path

from specchat.engine import folders, safetensors_file
from specchat.engine.errors import EngineError
from specchat.engine.safetensors_file import FLOAT_DTYPES, Tensor, whole
from specchat.errors import SpecChatError
from specchat.records import described

PREFIX = "mtp."  # mlx-lm's sanitize drops these: the head is read apart (mtp.py)
MAX_LAYERS = 16  # published heads have one; a name past this is not one of a head's layers
_LAYER = re.compile(r"layers\.(0|[1-9][0-9]*)\.(.+)")
_EXPERT = re.compile(r"mlp\.experts\.[0-9]+\.")
# The model's own layers, whatever the checkpoint's layout nests them under.
_MODEL_LAYER = re.compile(r"(.+\.)?layers\.(0|[1-9][0-9]*)\.(.+)")


def no_head(name: str) -> str:
    """Why a model with no MTP weights cannot draft for itself: the engine's
    and ``specchat models check T mtp``'s words."""
    return (f"{name} has no MTP head (no mtp.* weights in its folder), so it cannot draft "
            "for itself: choose a draft model, or draft from the conversation (suffix "
            "matching).")


def cannot_draft(name: str, why: str) -> str:
    """Why a model's MTP weights cannot draft, in one sentence."""
    return (f"{name}'s MTP head cannot draft ({why}): choose a draft model, or draft from the "
            "conversation (suffix matching).")


def read(folder: Path, error: type[SpecChatError] = EngineError,
         shown: Path | None = None) -> dict[str, Tensor]:
    """Every tensor of a model folder's weight files, by name, from their
    headers (each file checked as safetensors_file.read checks it)."""
    shown = shown or folder
    out: dict[str, Tensor] = {}
    for f in folders.weight_files(folder):
        out.update(safetensors_file.read(f, error, shown / f.name))
    return out


def head_tensors(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """The MTP head's tensors among a model's, by the head's own names
    (``mtp.`` left off); empty when it ships none."""
    return {k[len(PREFIX):]: t for k, t in tensors.items() if k.startswith(PREFIX)}


def problem(tensors: dict[str, Tensor], config: dict) -> str | None:
    """What is wrong with the MTP weights among a model's ``tensors``, for
    its ``config``, in words (for cannot_draft); None when they can draft
    or it ships none. The fc and the norms are as wide as its hidden
    states, its layers are numbered from 0 and there are as many as its
    config says (``mtp_num_hidden_layers``), each holds the same tensors,
    and those are the tensors of one of the model's own full-attention
    layers (the head's layer is one of them), of the same shapes."""
    head = head_tensors(tensors)
    if not head:
        return None
    cfg = folders.text_config(config)
    hidden = cfg.get("hidden_size")
    if not (whole(hidden) and hidden > 0):
        return "the model's config states no hidden_size to check it against"
    want = {"fc.weight": (hidden, 2 * hidden), "pre_fc_norm_embedding.weight": (hidden,),
            "pre_fc_norm_hidden.weight": (hidden,), "norm.weight": (hidden,)}
    layers: dict[int, dict[str, Tensor]] = {}
    for name, t in sorted(head.items()):
        m = _LAYER.fullmatch(name)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = t
        elif name not in want:
            return f"tensor {PREFIX}{name} is not part of an MTP head"
        elif t.shape != want[name]:
            return (f"tensor {PREFIX}{name} has shape {list(t.shape)} but the model's hidden "
                    f"size {hidden} implies {list(want[name])}")
        if t.dtype not in FLOAT_DTYPES:
            return f"tensor {PREFIX}{name} is of dtype {t.dtype}, not floats"
    missing = [n for n in want if n not in head]
    if missing:
        return f"its weights lack {PREFIX}{missing[0]}"
    stated = cfg.get("mtp_num_hidden_layers")
    count = len(layers)
    if not count:
        return "its weights hold no layer"
    if count > MAX_LAYERS:
        return f"its weights hold {count:,} layers, more than a head has ({MAX_LAYERS} at most)"
    if sorted(layers) != list(range(count)):
        return f"its layers are numbered {sorted(layers)}, not 0 to {count - 1}"
    if stated is not None and not whole(stated):  # a size stated is a whole number, or damage
        return (f"the model's config says it has {described(stated)} layers "
                "(mtp_num_hidden_layers), not a whole number")
    if whole(stated) and stated != count:
        return (f"the model's config says it has {stated} layer{'s' if stated != 1 else ''} "
                f"(mtp_num_hidden_layers), its weights hold {count}")
    first = {n: t.shape for n, t in layers[0].items()}
    if any(_EXPERT.match(n) for n in first):  # mlx-lm's sanitize stacks a model's, not these
        return ("its layer holds its experts one by one (the Hub's layout), which SpecChat "
                "does not stack for the head")
    for i, layer in layers.items():
        if {n: t.shape for n, t in layer.items()} != first:
            return f"its layer {i} holds other tensors than its layer 0"
    own = _full_attention_layers(tensors)
    if own and first not in own:  # the one most alike names what differs
        like = max(own, key=lambda layer: len(set(layer.items()) & set(first.items())))
        diff = sorted(set(like.items()) ^ set(first.items()))[0][0]
        return (f"its layer is not one of the model's full-attention layers (tensor "
                f"{PREFIX}layers.0.{diff} differs)")
    return None


def _full_attention_layers(tensors: dict[str, Tensor]) -> list[dict[str, tuple[int, ...]]]:
    """The tensors of each of the model's own full-attention layers (name
    within the layer -> shape), wherever the checkpoint nests them (a
    vision tower's apart); none when they are quantized (the head is not),
    so nothing is compared."""
    layers: dict[tuple[str, int], dict[str, tuple[int, ...]]] = {}
    for name, t in tensors.items():
        m = None if name.startswith(PREFIX) else _MODEL_LAYER.fullmatch(name)
        if m:
            layers.setdefault((m.group(1) or "", int(m.group(2))), {})[m.group(3)] = t.shape
    full = [layer for layer in layers.values() if "self_attn.q_proj.weight" in layer]
    if any(n.endswith((".scales", ".biases")) for layer in full for n in layer):
        return []
    return full


def verdict(folder: Path, config: dict, name: str, error: type[SpecChatError] = EngineError,
            shown: Path | None = None) -> str | None:
    """Why the model at ``folder`` cannot draft for itself with its own MTP
    head, in the engine's words; None when it can."""
    tensors = read(folder, error, shown)
    if not head_tensors(tensors):
        return no_head(name)
    why = problem(tensors, config)
    return cannot_draft(name, why) if why else None
