"""Greedy speculative output must equal plain greedy decoding, token for token,
for every drafter, every fixed K from 1 to 8, and adaptive K."""

from __future__ import annotations

import random

import pytest
from specchat.engine import attention
from specchat.engine.events import DraftSettings, GenerateRequest, Message
from specchat.engine.session import Engine
from tinymodels import prune_draft_head

SPEC_MODES = [("draft", k) for k in [None, *range(1, 9)]] + [
    ("suffix", None), ("suffix", 3), ("hybrid", None), ("hybrid", 2), ("hybrid", 5),
    ("ssd", None), ("ssd", 3)]


def _prompts(n_special: int, vocab: int) -> list[tuple[int, ...]]:
    rng = random.Random(1234)
    prompts = []
    for length in (1, 2, 5, 17, 40, 90):
        prompts.append(tuple(rng.randrange(n_special, vocab) for _ in range(length)))
    # Repetitive prompts give prompt lookup long matches.
    base = [rng.randrange(n_special, vocab) for _ in range(12)]
    prompts.append(tuple(base * 4))
    return prompts


@pytest.fixture(scope="module", params=["llama", "qwen2", "llama-pruned-head"])
def pair_engine(request, tiny_target, tiny_draft, tiny_qwen_target, tiny_qwen_draft):
    engine = Engine()
    if request.param == "qwen2":  # padded-vocab target, unrelated unpadded draft
        engine.load(tiny_qwen_target, tiny_qwen_draft)
    else:
        engine.load(tiny_target, tiny_draft)
    if request.param == "llama-pruned-head":
        prune_draft_head(engine, keep=64)
    engine.related_draft = request.param != "qwen2"
    return engine


def _run(engine, prompt, max_tokens, mode="plain", k=None, stop_ids=()):
    req = GenerateRequest(prompt_ids=prompt, max_tokens=max_tokens,
                          draft=DraftSettings(mode=mode, k=k), stop_token_ids=stop_ids)
    return engine.generate(req)


def test_every_mode_and_k_matches_plain(pair_engine):
    engine = pair_engine
    checked = 0
    for i, prompt in enumerate(_prompts(3, 400)):
        max_tokens = [1, 2, 7, 33, 64, 64, 48][i]
        plain = _run(engine, prompt, max_tokens)
        assert len(plain.token_ids) == max_tokens  # random models rarely stop on their own
        for mode, k in SPEC_MODES:
            spec = _run(engine, prompt, max_tokens, mode, k)
            assert spec.token_ids == plain.token_ids, (mode, k, i)
            assert spec.text == plain.text
            assert spec.summary.new_tokens == max_tokens
            checked += 1
    assert checked == 7 * len(SPEC_MODES)


def test_speculation_really_happens(pair_engine):
    """The identity above must not come from never drafting."""
    prompt = _prompts(3, 400)[-1]
    r = _run(pair_engine, prompt, 64, "draft", 4)
    assert r.summary.drafted > 0
    if pair_engine.related_draft:
        assert r.summary.accepted > 0
        assert r.summary.steps < 64
    lk = _run(pair_engine, prompt, 64, "suffix", None)
    assert lk.summary.drafted > 0


def test_max_tokens_inside_a_block(pair_engine):
    """Budgets that end mid-block: the block is cut, the count is exact."""
    prompt = _prompts(3, 400)[3]
    for max_tokens in range(1, 12):
        plain = _run(pair_engine, prompt, max_tokens)
        for k in (3, 8):
            spec = _run(pair_engine, prompt, max_tokens, "draft", k)
            assert spec.token_ids == plain.token_ids
            assert len(spec.token_ids) == max_tokens
            assert spec.summary.finish_reason == "length"


def test_eos_inside_a_draft_block(pair_engine):
    """Make a token the target emits mid-sequence an end token: every mode
    must stop exactly before it, also when it arrives inside a draft block."""
    prompt = _prompts(3, 400)[-1]
    plain = _run(pair_engine, prompt, 40)
    stopped_inside_block = 0
    for pos in (3, 9, 17, 26):
        eos = plain.token_ids[pos]
        first = plain.token_ids.index(eos)
        ref = _run(pair_engine, prompt, 40, stop_ids=(eos,))
        assert ref.token_ids == plain.token_ids[:first]
        assert ref.summary.finish_reason == "stop"
        for mode, k in SPEC_MODES:
            events = []
            spec = pair_engine.generate(
                GenerateRequest(prompt_ids=prompt, max_tokens=40, stop_token_ids=(eos,),
                                draft=DraftSettings(mode=mode, k=k)),
                on_step=events.append)
            assert spec.token_ids == ref.token_ids, (mode, k, pos)
            assert spec.summary.finish_reason == "stop"
            last = events[-1]
            if last.accepted > len(last.token_ids) - 1 or (last.drafted and last.accepted == last.drafted):
                stopped_inside_block += 1
    assert stopped_inside_block > 0


def test_chat_prompts_match_plain(pair_engine):
    msgs = [
        (Message("user", "Write a fibonacci function in Python."),),
        (Message("system", "You are terse."), Message("user", "Explain recursion.")),
        (Message("user", "Rewrite: the quick brown fox jumps over the lazy dog."),),
    ]
    for m in msgs:
        plain = pair_engine.generate(GenerateRequest(messages=m, max_tokens=40,
                                                     draft=DraftSettings(mode="plain")))
        for mode, k in [("hybrid", None), ("draft", 4), ("suffix", None)]:
            spec = pair_engine.generate(GenerateRequest(messages=m, max_tokens=40,
                                                        draft=DraftSettings(mode=mode, k=k)))
            assert spec.token_ids == plain.token_ids


def test_step_events_add_up(pair_engine):
    prompt = _prompts(3, 400)[4]
    events = []
    r = pair_engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=50,
                                             draft=DraftSettings(mode="hybrid")),
                             on_step=events.append)
    steps = [e for e in events if e.token_ids or e.drafted]
    assert sum(len(e.token_ids) for e in events) == r.summary.new_tokens == 50
    assert "".join(e.text for e in events) == r.text
    assert sum(e.drafted for e in steps) == r.summary.drafted
    assert sum(e.accepted for e in steps) == r.summary.accepted
    assert len(steps) == r.summary.steps
    for e in steps:
        assert e.accepted <= e.drafted == e.k
        assert len(e.origins) == len(e.token_ids)
        if e.token_ids:
            assert len(e.pieces) == len(e.token_ids) and "".join(e.pieces) == e.text
        drafted = [o for o in e.origins if o != "target"]
        assert len(drafted) == min(e.accepted, len(e.token_ids))
        assert set(drafted) <= {"draft", "conversation", "history"}
    s = r.summary
    assert s.tokens_per_step == pytest.approx(50 / s.steps)
    assert s.acceptance_rate == pytest.approx(s.accepted / s.drafted)
    assert 0 < s.ttft_s <= s.wall_s
    assert s.tokens_per_s > 0


@pytest.mark.parametrize("which", ["llama", "qwen2"])
def test_plain_decoding_matches_mlx_lm_generate_step(which, tiny_target, tiny_qwen_target):
    """An independent decoder on the same weights: mlx-lm loads the folder
    itself and decodes greedily with its own generate_step."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load

    path = tiny_target if which == "llama" else tiny_qwen_target
    engine = Engine()
    engine.load(path)
    model, _ = load(str(path))
    for prompt in _prompts(3, 400)[2:6]:
        ours = _run(engine, prompt, 64).token_ids
        with attention.stock():  # mlx-lm's own attention, not the engine's (attention.py)
            theirs = [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=64)]
        assert len(ours) == 64 or theirs[len(ours)] in engine.end_ids
        assert list(ours) == theirs[:len(ours)], (which, prompt)
