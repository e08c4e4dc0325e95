"""What the engine changes of mlx-lm's models at run time, and for how long:
the target's layers that record their outputs for a head (runner.py), only
for the request that drafts with it, however it ends; the attention of a
model loaded with the CPU's block path (attention.py), only for that model
and only until it unloads. Another model in the process, even one built
from the same classes, is never touched."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.utils import load_model
from specchat.engine import compute
from specchat.engine.events import DraftSettings, GenerateRequest
from specchat.engine.session import Engine
from tinymodels import build_eagle3

PROMPT = (275, 364, 311, 78, 161, 53, 376, 40) * 3


def _classes(layers) -> list[type]:
    return [type(layer) for layer in layers]


def test_the_tap_lasts_one_request_and_touches_no_other_model(tiny_dir, tiny_target,
                                                              tiny_draft, monkeypatch):
    engine = Engine()
    engine.load(tiny_target, tiny_draft,
                head=build_eagle3(tiny_dir / "eagle3-patches", tiny_target))
    target, draft = engine.target.model.model.layers, engine.draft.model.model.layers
    own, draft_own = _classes(target), _classes(draft)
    assert all(t.__module__ == "mlx_lm.models.llama" for t in own + draft_own)
    seen = []
    engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=8,
                                    draft=DraftSettings(mode="head")),
                    on_step=lambda _e: seen.append((_classes(target), _classes(draft),
                                                    engine.target_cache.on_hidden)))
    during, draft_during, collect = seen[0]
    read = set(engine.drafter("eagle3").tap_layers)
    assert {i for i, t in enumerate(during) if t is not own[i]} == read and collect is not None
    assert draft_during == draft_own  # the draft model: the same classes, untouched
    assert _classes(target) == own and engine.target_cache.on_hidden is None

    def fails(*_args, **_kwargs):
        raise RuntimeError("the prompt could not be read")

    monkeypatch.setattr(engine.target_cache, "prefill", fails)
    with pytest.raises(RuntimeError, match="could not be read"):
        engine.generate(GenerateRequest(prompt_ids=tuple(reversed(PROMPT)), max_tokens=8,
                                        draft=DraftSettings(mode="head")))
    assert _classes(target) == own and engine.target_cache.on_hidden is None
    monkeypatch.undo()
    engine.load(tiny_target, tiny_draft)  # the head unloads
    assert _classes(target) == own


@pytest.mark.skipif(compute.gpu_available(), reason="the block path is the CPU's")
def test_the_block_path_is_its_models_until_it_unloads(tiny_qwen_target, tiny_target,
                                                       monkeypatch, block_rows):
    monkeypatch.delenv("SPECCHAT_ATTENTION", raising=False)
    engine = Engine()
    engine.load(tiny_qwen_target)
    assert engine.compute.attention == "blocks"
    monkeypatch.setenv("SPECCHAT_ATTENTION", "mlx")
    other = Engine()  # the same model, loaded the other way, beside it
    other.load(tiny_qwen_target)
    plain_mlx_lm, _ = load_model(tiny_qwen_target)  # and as mlx-lm loads it
    seen = block_rows
    seen.clear()  # what loading ran (its warm-up) is not the point
    ids = mx.array([[5, 9, 13, 17, 21]])
    mx.eval(other.target.model(ids), plain_mlx_lm(ids))
    assert seen == []  # neither takes the block path
    loaded = engine.target.model
    mx.eval(loaded(ids))
    assert seen == [5, 5]  # the engine's model still does: one call per layer
    attn = loaded.model.layers[0].self_attn
    assert type(attn) is not type(plain_mlx_lm.model.layers[0].self_attn)
    engine.load(tiny_target)  # another target: this one unloads
    assert type(attn) is type(plain_mlx_lm.model.layers[0].self_attn)
    seen.clear()
    mx.eval(loaded(ids))
    assert seen == []
