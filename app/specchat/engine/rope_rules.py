"""The rope scalings mlx-lm builds, and what each needs: one rule for a
model's ``config.json`` (the library's check, which every import, pull and
``models check`` runs, and every load of the command line and the window,
through the memory preflight) and for a draft head's (``eagle3_format``,
the engine's own check). No MLX.

A scaling is an object naming its type (``type`` or ``rope_type``) with the
keys that type reads; mlx-lm's ``initialize_rope`` builds each of
``ROPE_TYPES`` (tests/engine/test_engine_eagle3.py builds each as mlx-lm
does, so a new mlx-lm that drops one is found). A scaling of another shape
failed only when the model was built, in Python's words ("'list' object has
no attribute 'get'", "division by zero" for a factor of 0), after
``models check`` and ``models import`` had taken it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from specchat.records import described

# Each type mlx-lm builds, with the keys it reads that have no default;
# "dynamic" and "longrope" also scale from the config's max_position_embeddings.
ROPE_TYPES: dict[str, tuple[str, ...]] = {
    "default": (), "linear": ("factor",), "dynamic": ("factor",), "llama3": ("factor",),
    "yarn": ("factor",), "deepseek_yarn": ("factor",), "telechat3-yarn": ("factor",),
    "longrope": ("original_max_position_embeddings", "short_factor", "long_factor"),
    "proportional": (), "mrope": ("mrope_section",),
}
ROPE_NEEDS_LENGTH = frozenset({"dynamic", "longrope"})
# What a model's config needs besides: transformers checks a model's config
# when its tokenizer loads, and refuses a llama3 scaling without these
# (mlx-lm's own class has defaults for them; a head's config is never given
# to transformers).
MODEL_NEEDS: dict[str, tuple[str, ...]] = {"llama3": ("low_freq_factor", "high_freq_factor")}
# Numbers a scaling may state, each above 0 where given.
_NUMBERS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
            "beta_fast", "beta_slow", "partial_rotary_factor")
_LISTS = ("short_factor", "long_factor")


def problem(scaling: object, max_position_embeddings: object = None, *, known: bool = True,
            needs: Mapping[str, tuple[str, ...]] | None = None) -> tuple[str | None, str] | None:
    """None when mlx-lm can build ``scaling`` (or there is none); else
    (its type, or None when the type is no name; what is wrong, in words).
    ``known``: the model builds its rope with mlx-lm's ``initialize_rope``,
    so a type that is not one of ``ROPE_TYPES`` is wrong too (a model class
    of its own may read types of its own); ``needs``: keys a type needs
    besides mlx-lm's (``MODEL_NEEDS`` for a model's config)."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        return "", f"it is {described(scaling)}, not an object"
    kind = scaling.get("type") or scaling.get("rope_type") or "default"
    if not isinstance(kind, str):
        return None, described(kind)
    if kind not in ROPE_TYPES:
        return (kind, "mlx-lm knows no such type") if known else None
    needed = (*ROPE_TYPES[kind], *(needs or {}).get(kind, ()))
    if missing := [k for k in needed if scaling.get(k) is None]:
        return kind, f"it lacks '{missing[0]}'"
    if kind in ROPE_NEEDS_LENGTH and max_position_embeddings is None:
        return kind, "it scales from a max_position_embeddings the config does not state"
    for key in _NUMBERS:
        v = scaling.get(key)
        if v is not None and not (isinstance(v, int | float) and not isinstance(v, bool)
                                  and 0 < v < math.inf):
            return kind, f"its {key} is {described(v)}, not a number above 0"
    for key in _LISTS:
        v = scaling.get(key)
        if v is not None and not (isinstance(v, list) and all(
                isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                for x in v)):
            return kind, f"its {key} is {described(v)}, not a list of numbers"
    sections = scaling.get("mrope_section")
    if kind == "mrope" and not (isinstance(sections, list) and len(sections) == 3):
        return kind, f"its mrope_section is {described(sections)}, not 3 sections"
    return None
