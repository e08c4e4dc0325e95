"""The CPU's attention over blocks of rows (engine/attention.py): the same
values as MLX's, taken only where it applies, off for mlx-lm's own runs and
under SPECCHAT_ATTENTION=mlx, and greedy decoding still plain's, token for
token."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from specchat.engine import attention, compute
from specchat.engine.events import DraftSettings, GenerateRequest
from specchat.engine.session import Engine
from specchat.values import BadValue

cpu_only = pytest.mark.skipif(compute.gpu_available(), reason="the block path is the CPU's")


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (12, 2)])
@pytest.mark.parametrize("rows,keys", [(2, 2), (2, 7), (5, 40), (9, 300), (64, 64)])
@pytest.mark.parametrize("mask", ["causal", None])
def test_block_attention_equals_mlx(heads, kv_heads, rows, keys, mask):
    mx.random.seed(rows * 1000 + keys + heads)
    with mx.stream(mx.cpu):  # MLX's CPU attention is what the block path replaces
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


@pytest.mark.parametrize("dtype,tol", [(mx.float32, 1e-5), (mx.float16, 2e-3)])
def test_block_attention_in_the_layouts_models_pass(dtype, tol):
    """Two sequences, values narrower than keys (as MLA-style models have),
    and queries transposed from [B, L, H, D] as every mlx-lm model makes them."""
    mx.random.seed(7)
    with mx.stream(mx.cpu):
        q = mx.random.normal((2, 3, 8, 32)).astype(dtype).transpose(0, 2, 1, 3)  # [2, 8, 3, 32]
        k = mx.random.normal((2, 2, 11, 32)).astype(dtype)
        v = mx.random.normal((2, 11, 2, 24)).astype(dtype).transpose(0, 2, 1, 3)  # [2, 2, 11, 24]
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.17, mask="causal")
        got = attention.block_attention(q, k, v, 0.17, causal=True)
        assert got.shape == (2, 8, 3, 24) and got.dtype == dtype
        np.testing.assert_allclose(np.array(got.astype(mx.float32)),
                                   np.array(want.astype(mx.float32)), rtol=tol, atol=tol)


class _QuantizedCache:
    bits, group_size = 4, 64


def test_only_what_the_block_path_computes_exactly_goes_there(monkeypatch):
    """Everything else reaches mlx-lm's function with its arguments as given."""
    seen = []
    wrapped = attention.wrap(lambda *a, **kw: seen.append((a, kw)) or "base")
    blocks = []
    monkeypatch.setattr(attention, "block_attention", lambda *a, **kw: blocks.append(kw) or "blocks")
    q2, k, v = mx.zeros((1, 4, 2, 8)), mx.zeros((1, 2, 6, 8)), mx.zeros((1, 2, 6, 8))
    window = mx.ones((2, 6), dtype=mx.bool_)  # a sliding window's mask is an array
    cases = [
        dict(queries=mx.zeros((1, 4, 1, 8)), mask=None),  # one row: MLX's kernel
        dict(queries=q2, mask=window),
        dict(queries=q2, mask="causal", sinks=mx.zeros((4,))),
        dict(queries=q2, mask="causal", cache=_QuantizedCache()),
        dict(queries=q2.astype(mx.float16), mask="causal"),  # the fallback casts; we do not
        dict(queries=mx.zeros((1, 4, 8, 8)), mask="causal"),  # more rows than keys
        dict(queries=mx.zeros((1, 3, 2, 8)), mask=None),  # heads not a multiple of key heads
    ]
    for case in cases:
        args = {"cache": None, "sinks": None, **case}
        out = wrapped(args.pop("queries"), k, v, args.pop("cache"), 0.5, args.pop("mask"),
                      sinks=args.pop("sinks"))
        assert out == "base", case
    assert len(seen) == len(cases) and not blocks
    assert seen[1][1]["mask"] is window and seen[2][1]["sinks"] is not None
    for mask in ("causal", None):
        assert wrapped(q2, k, v, None, 0.5, mask) == "blocks"
    assert blocks == [{"causal": True}, {"causal": False}]
    with attention.stock():
        assert wrapped(q2, k, v, None, 0.5, "causal") == "base"
    assert len(blocks) == 2


@cpu_only
def test_loaded_model_takes_blocks_not_single_rows(tiny_qwen_target, monkeypatch, block_rows):
    monkeypatch.delenv("SPECCHAT_ATTENTION", raising=False)
    target = Engine()
    target.load(tiny_qwen_target, None)
    assert target.compute.attention == "blocks"  # the CPU's policy
    seen = block_rows
    seen.clear()  # what loading ran (its warm-up) is not the point
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
    assert seen and all(n >= 2 for n in seen)  # the prompt's rows; each new token is one row


@cpu_only
def test_greedy_ids_identical_with_and_without_blocks(tiny_target, tiny_draft, monkeypatch,
                                                       block_rows):
    """The verify forwards take the block path, plain decoding's one-row
    forwards MLX's; with it on or off, the same ids."""
    req = GenerateRequest(prompt_ids=tuple(range(10, 60)), max_tokens=40,
                          draft=DraftSettings(mode="draft", k=4))
    outs = {}
    for choice in ("blocks", "mlx"):
        monkeypatch.setenv("SPECCHAT_ATTENTION", choice)
        engine = Engine()
        engine.load(tiny_target, tiny_draft)
        assert engine.compute.attention == choice
        block_rows.clear()
        spec = engine.generate(req).token_ids
        verified = sorted(set(block_rows))
        plain = engine.generate(GenerateRequest(prompt_ids=req.prompt_ids, max_tokens=40)).token_ids
        outs[choice] = (spec, plain)
        # Verify steps of 2 to K + 1 = 5 rows went the block path, or none did.
        assert ({2, 3, 4, 5} & set(verified)) if choice == "blocks" else verified == []
    assert outs["blocks"][0] == outs["blocks"][1] == outs["mlx"][1] == outs["mlx"][0]
    assert len(outs["blocks"][0]) == 40


def test_environment_choice_checked(monkeypatch):
    monkeypatch.setenv("SPECCHAT_ATTENTION", "mlx")
    assert compute.detect().attention == "mlx"
    monkeypatch.setenv("SPECCHAT_ATTENTION", "fast")
    with pytest.raises(BadValue, match="SPECCHAT_ATTENTION must be blocks or mlx; got"):
        compute.detect()
    monkeypatch.setenv("SPECCHAT_ATTENTION", "blocks")
    assert compute.detect().attention == ("mlx" if compute.gpu_available() else "blocks")
    monkeypatch.delenv("SPECCHAT_ATTENTION")
    assert compute.detect().attention == ("mlx" if compute.gpu_available() else "blocks")
