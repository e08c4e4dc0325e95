"""engine/simple_api.py: the LLM(...).generate(prompts, SamplingParams(...))
shape known from SSD's ports, on SpecChat's engine."""

from __future__ import annotations

from specchat.engine.simple_api import LLM, SamplingParams


def test_llm_generate_speculates_in_ssd_and_matches_plain(tiny_target, tiny_draft):
    llm = LLM(model=tiny_target, draft=tiny_draft, speculate=True, speculate_k=3)
    assert llm.mode.name == "ssd"
    prompts = ["The quick brown fox", "def fibonacci(n):"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=16))
    plain = LLM(model=tiny_target, speculate=False).generate(prompts, SamplingParams(max_tokens=16))
    assert [o.prompt for o in outs] == prompts
    for o, p in zip(outs, plain, strict=True):
        assert o.token_ids == p.token_ids and o.token_ids  # greedy: the target's own tokens
        assert o["text"] == o.text == p.text and o.text
        assert o.summary.mode == "ssd" and p.summary.mode == "plain"
        assert o.finish_reason == p.finish_reason in ("length", "stop")


def test_llm_takes_token_ids_seeds_and_stops(tiny_target, tiny_draft):
    llm = LLM(model=tiny_target, draft=tiny_draft)
    ids = [45, 120, 33, 250, 91]
    params = SamplingParams(temperature=0.8, top_k=5, max_tokens=12, seed=7)
    a, = llm.generate(ids, params)
    b, = llm.generate([ids], params)
    assert a.prompt == tuple(ids) and a.token_ids == b.token_ids
    first = a.token_ids[3]
    stopped, = llm.generate(ids, SamplingParams(temperature=0.8, top_k=5, max_tokens=12, seed=7,
                                                stop_token_ids=(first,)))
    assert stopped.token_ids == a.token_ids[:a.token_ids.index(first)]
    assert stopped.finish_reason == "stop"
