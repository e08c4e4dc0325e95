"""The CPU's attention over blocks of rows (engine/attention.py): the same
values as MLX's, taken only where it applies, off for mlx-lm's own runs, and
greedy decoding still token-for-token plain's."""

from __future__ import annotations

from contextlib import nullcontext

import mlx.core as mx
import numpy as np
import pytest
from specchat.engine import attention, compute
from specchat.engine.events import DraftSettings, GenerateRequest
from specchat.engine.session import Engine
from specchat.values import BadValue


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (12, 2)])
@pytest.mark.parametrize("rows,keys", [(2, 2), (2, 7), (5, 40), (9, 300), (64, 64)])
@pytest.mark.parametrize("mask", ["causal", None])
def test_block_attention_equals_mlx(heads, kv_heads, rows, keys, mask):
    mx.random.seed(rows * 1000 + keys + heads)
    q = mx.random.normal((1, heads, rows, 16))
    k = mx.random.normal((1, kv_heads, keys, 16))
    v = mx.random.normal((1, kv_heads, keys, 16))
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    got = attention.block_attention(q, k, v, 0.25, causal=mask == "causal")
    assert got.shape == want.shape
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
    if mask == "causal" and keys == rows:
        # The first row sees only the first key: its output is that value row.
        np.testing.assert_allclose(np.array(got[0, :, 0]),
                                   np.array(mx.repeat(v[0, :, 0], heads // kv_heads, axis=0)),
                                   rtol=1e-6, atol=1e-6)


@pytest.fixture
def target(tiny_qwen_target):
    engine = Engine()
    engine.load(tiny_qwen_target, None)
    return engine


def _calls(monkeypatch) -> list[int]:
    seen: list[int] = []
    real = attention.block_attention

    def spy(q, *args, **kwargs):
        seen.append(q.shape[2])
        return real(q, *args, **kwargs)

    monkeypatch.setattr(attention, "block_attention", spy)
    return seen


def test_loaded_model_takes_blocks_not_single_rows(target, monkeypatch):
    assert target.compute.attention == "blocks"  # the CPU's policy
    seen = _calls(monkeypatch)
    model = target.target.model
    ids = mx.array([[5, 9, 13, 17, 21]])
    with attention.stock():
        stock = model(ids)
    assert seen == []  # stock(): mlx-lm's own attention throughout
    blocks = model(ids)
    assert seen == [5, 5]  # one call per layer, five rows each
    np.testing.assert_allclose(np.array(blocks), np.array(stock), rtol=1e-4, atol=1e-4)
    seen.clear()
    target.generate(GenerateRequest(prompt_ids=(5, 9, 13), max_tokens=3))
    assert all(n >= 2 for n in seen)  # the prompt's rows; each decoded token is one row
    assert 2 in seen


def test_greedy_ids_identical_with_and_without_blocks(tiny_target, tiny_draft, monkeypatch):
    """The verify forwards take the block path, plain decoding's one-row
    forwards MLX's; with it on or off the ids are the same."""
    req = GenerateRequest(prompt_ids=tuple(range(10, 60)), max_tokens=40,
                          draft=DraftSettings(mode="draft", k=4))
    outs = {}
    for choice in ("blocks", "mlx"):
        monkeypatch.setenv("SPECCHAT_ATTENTION", choice)
        engine = Engine()
        engine.load(tiny_target, tiny_draft)
        assert engine.compute.attention == choice
        # Installed once, the wrapper stays in mlx-lm's module for the process;
        # a process started with SPECCHAT_ATTENTION=mlx never installs it.
        with attention.stock() if choice == "mlx" else nullcontext():
            outs[choice] = (engine.generate(req).token_ids,
                            engine.generate(GenerateRequest(prompt_ids=req.prompt_ids,
                                                            max_tokens=40)).token_ids)
    assert outs["blocks"][0] == outs["blocks"][1] == outs["mlx"][1] == outs["mlx"][0]
    assert len(outs["blocks"][0]) == 40


def test_environment_choice_checked(monkeypatch):
    monkeypatch.setenv("SPECCHAT_ATTENTION", "mlx")
    assert compute.detect().attention == "mlx"
    monkeypatch.setenv("SPECCHAT_ATTENTION", "fast")
    with pytest.raises(BadValue, match="SPECCHAT_ATTENTION must be blocks or mlx; got"):
        compute.detect()
    monkeypatch.delenv("SPECCHAT_ATTENTION")
    assert compute.detect().attention == "blocks"  # this machine has no GPU
