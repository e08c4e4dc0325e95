"""Speculation on the caches mlx-lm makes for the models people run now:
hybrids with recurrent state (Gated DeltaNet in Qwen3.5 and Qwen3-Next,
Mamba 2 in Falcon-H1 and Nemotron-H, LFM2's short convolutions) and sliding
windows (Gemma 3) shorter than the context. Tiny random models of each,
built from mlx-lm's own classes and loaded through the normal path; each
target's draft is the same architecture with noise, so blocks are both
accepted and rejected, and the draft's own cache rolls back too."""

from __future__ import annotations

import importlib
import pkgutil
import threading

import mlx_lm.models
import pytest
from mlx_lm.models.cache import ArraysCache, make_prompt_cache
from mlx_lm.utils import _get_classes
from sampling_checks import check_distribution
from specchat.engine import rollback
from specchat.engine.events import DraftSettings, GenerateRequest, SamplingParams
from specchat.engine.session import Engine
from specchat.engine.window_kv import WindowKVCache
from tinymodels import ARCHS

PROMPT = (275, 364, 311, 78, 161, 53, 376, 40) * 3  # 24 tokens: past gemma's window of 8
MODES = [("draft", 3), ("draft", None), ("hybrid", None), ("hybrid", 2), ("suffix", None),
         ("ssd", 3)]
RECURRENT = {"qwen3_5", "qwen3_next", "falcon_h1", "nemotron_h", "lfm2"}


def _engine(paths) -> Engine:
    e = Engine()
    e.load(*paths)
    assert e.pair.speculative_ok, e.pair.reason
    return e


def _gen(engine: Engine, prompt, mode="plain", k=None, max_tokens=60, **kw):
    return engine.generate(GenerateRequest(prompt_ids=tuple(prompt), max_tokens=max_tokens,
                                           draft=DraftSettings(mode=mode, k=k)), **kw)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_mode_is_plain_decoding(arch_models, arch):
    engine = _engine(arch_models(arch))
    plain = _gen(engine, PROMPT).token_ids
    for mode, k in MODES:
        r = _gen(engine, PROMPT, mode, k)
        assert r.token_ids == plain, (arch, mode, k)
        if (mode, k) == ("draft", 3):  # blocks were kept and blocks were cut short
            assert 0 < r.summary.accepted < r.summary.drafted, r.summary


def test_a_sliding_window_wraps_while_blocks_are_rejected(arch_models):
    engine = _engine(arch_models("gemma3_text"))
    plain = _gen(engine, PROMPT, max_tokens=80).token_ids
    r = _gen(engine, PROMPT, "draft", 3, max_tokens=80)
    assert r.token_ids == plain and r.summary.accepted < r.summary.drafted
    windows = [c for c in engine.target_cache.cache if isinstance(c, WindowKVCache)]
    assert windows and all(c.start > 0 for c in windows)  # past the window: old positions gone
    assert all(c.window == 8 for c in windows)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_prefix_reuse_across_turns(arch_models, arch):
    """A follow-up reuses the cache of the turn before; a regenerated reply
    (the same prompt again) reuses the prompt, recurrent state included
    (the slot keeps a checkpoint where the prompt ended). Both give the
    tokens a fresh engine gives."""
    paths = arch_models(arch)
    engine, fresh = _engine(paths), _engine(paths)
    first = _gen(engine, PROMPT, "draft", 3, max_tokens=30)
    follow = (*PROMPT, *first.token_ids, 11, 12, 13)
    second = _gen(engine, follow, "draft", 3, max_tokens=30)
    assert second.token_ids == _gen(fresh, follow, max_tokens=30).token_ids
    assert second.summary.reused_prompt_tokens >= len(PROMPT) + len(first.token_ids) - 1
    again = _gen(engine, follow, "hybrid", None, max_tokens=30)
    assert again.token_ids == second.token_ids
    assert again.summary.reused_prompt_tokens == len(follow) - 1
    assert engine.model_drafter.slot.reused == len(follow) - 1  # the draft's too


@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_reply_cancelled_mid_block_leaves_a_cache_the_next_request_can_use(arch_models, arch):
    paths = arch_models(arch)
    engine = _engine(paths)
    want = _gen(_engine(paths), PROMPT, max_tokens=40).token_ids
    stop = threading.Event()
    steps = []

    def on_step(ev):
        steps.append(ev)
        if len(steps) == 3:
            stop.set()

    cut = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=40,
                                          draft=DraftSettings(mode="draft", k=3)),
                          cancelled=stop, on_step=on_step)
    assert cut.summary.finish_reason == "cancelled" and len(cut.token_ids) < 40
    assert _gen(engine, PROMPT, "draft", 3, max_tokens=40).token_ids == want
    assert _gen(engine, PROMPT, "plain", max_tokens=40).token_ids == want


@pytest.mark.slow  # a long chi-square or training run: CI's slow step
@pytest.mark.parametrize("arch", ["qwen3_5", "gemma3_text"])
def test_samples_follow_the_target(arch_models, arch):
    """Rejection sampling stays exact when the second step starts from a
    rolled-back recurrent state or window (K = 2, four tokens)."""
    engine = _engine(arch_models(arch))
    check_distribution(engine, PROMPT, "draft", 2, SamplingParams(temperature=1.0, top_k=3),
                       length=4, n=1500)


# -- mlx-lm's model list ------------------------------------------------------------------

GENERIC = {"hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 64,
           "rms_norm_eps": 1e-5, "max_position_embeddings": 256, "rope_theta": 10000.0,
           "tie_word_embeddings": False, "sliding_window": 8}


def _tiny_cache(model_type: str):
    """The cache mlx-lm makes for a tiny model of ``model_type`` (prepared
    as the engine prepares it), or None where a generic tiny config does
    not build that class (it needs fields of its own)."""
    config = {**GENERIC, "model_type": model_type}
    for arch in ARCHS.values():
        if arch["model_type"] == model_type:
            config.update(arch["extra_config"])
    try:
        model_cls, args_cls = _get_classes(config)
        return rollback.prepare(make_prompt_cache(model_cls(args_cls.from_dict(config))))
    except Exception:  # noqa: BLE001 - any class that needs more than a generic config
        return None


def _kinds(cache) -> set[str]:
    out = set()
    for c in cache:
        out |= _kinds(c.caches) if hasattr(c, "caches") else {type(c).__name__}
    return out


def test_every_cache_kind_in_mlx_lms_model_list_can_go_back():
    """Walks mlx-lm's model modules: every one a generic tiny config builds
    makes a cache whose every entry can go back after a rejected block, and
    together they cover the kinds this module's exactness tests run."""
    covered: dict[str, set[str]] = {}
    for info in pkgutil.iter_modules(mlx_lm.models.__path__):
        try:  # some import packages that are not installed (olmo exits when it is missing)
            module = importlib.import_module(f"mlx_lm.models.{info.name}")
        except (Exception, SystemExit):  # noqa: BLE001
            continue
        if not hasattr(module, "Model") or not hasattr(module, "ModelArgs"):
            continue
        cache = _tiny_cache(info.name)
        if cache is None:
            continue
        assert rollback.unsupported(cache) == [], info.name
        for kind in _kinds(cache):
            covered.setdefault(kind, set()).add(info.name)
    print({k: len(v) for k, v in covered.items()})  # the kinds, and how many models make each
    assert {"KVCache", "WindowKVCache", "ArraysCache"} <= set(covered)
    assert len(set().union(*covered.values())) >= 40
    for arch in ARCHS:  # the architectures tested above are among them
        assert any(arch in models for models in covered.values()), arch
    assert isinstance(next(c for c in _tiny_cache("qwen3_5") if not hasattr(c, "keys")),
                      ArraysCache)
