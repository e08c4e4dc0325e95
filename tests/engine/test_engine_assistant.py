"""Gemma 4 assistant drafters (engine/assistant.py): a tiny Gemma 4 target
in Google's layout (mlx-lm's gemma4 wrapping gemma4_text, full-attention
layers of their own head width, a sliding window of 8) and tiny random
assistants for it, loaded as the draft. Replies are plain decoding's; each
block is what the assistant computes from the target's hidden state and
the keys and values of committed positions only, its sliding layer's after
rejected blocks too; samples follow the target; a wrong assistant is
refused in words."""

from __future__ import annotations

import json
from dataclasses import replace

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache
from sampling_checks import check_distribution
from specchat.engine.assistant_format import FULL, SLIDING
from specchat.engine.errors import EngineError
from specchat.engine.events import DraftSettings, GenerateRequest, SamplingParams
from specchat.engine.session import Engine
from specchat.engine.window_kv import WindowKVCache
from tinymodels import build_gemma4, build_gemma4_assistant

PROMPT = (275, 364, 311, 78, 161, 53, 376, 40) * 3  # 24 tokens: past the window of 8


@pytest.fixture(scope="module")
def gemma4(tiny_dir, tiny_tokenizer):
    """A target that mostly reads its last token, so an assistant that reads
    that token drafts its next one often, not always."""
    return build_gemma4(tiny_dir / "gemma4-target", tiny_tokenizer, layers=0.1)


@pytest.fixture(scope="module", params=["tied", "centroids"])
def pair(request, tiny_dir, gemma4):
    """An assistant with its tied output layer (the 26B's and the 31B's)
    and one routed through centroids (the E2B's and the E4B's), loaded."""
    ordered = request.param == "centroids"
    folder = build_gemma4_assistant(tiny_dir / f"gemma4-assistant-{request.param}", gemma4,
                                    ordered=ordered, mimic=0.1)
    e = Engine()
    loaded = e.load(gemma4, folder)
    assert loaded.draft.model_type == "assistant" and loaded.speculative_ok
    assert loaded.draft_is_head
    return e


def _gen(engine, mode, k=None, prompt=PROMPT, max_tokens=48, **kw):
    return engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=max_tokens,
                                           draft=DraftSettings(mode=mode, k=k)), **kw)


def test_an_assistant_drafts_and_the_reply_is_plain_decoding(pair):
    plain = _gen(pair, "plain").token_ids
    for mode, k in [("draft", 3), ("draft", None), ("hybrid", None), ("hybrid", 2)]:
        r = _gen(pair, mode, k)
        assert r.token_ids == plain, (mode, k)
        got = r.summary.drafted_by.get("assistant", {})
        assert got.get("drafted", 0) > 0, (mode, k)
        assert r.summary.tokens_by_origin.get("assistant", 0) == got["accepted"]
        if (mode, k) == ("draft", 3):  # blocks were kept and blocks were cut short
            assert 0 < r.summary.accepted < r.summary.drafted, r.summary


def reference_block(engine, context, k: int) -> tuple[list[int], list[float]]:
    """The assistant's greedy block for ``context`` and each token's
    probability, from inputs computed here, apart from the engine: the
    target (mlx-lm's own call) over the committed tokens (all but the last)
    in plain caches that keep every position, its final hidden state at
    the last of them, the keys and values of its last full-attention layer
    (every committed position) and of its last sliding layer (those a query
    at the next position sees through its window), queries at that
    position."""
    lm = engine.target.model.language_model
    cache = [KVCache() for _ in lm.make_cache()]
    hidden = lm.model(mx.array(context[:-1])[None], cache=cache)[0]
    m, window, kinds = len(context) - 1, lm.args.sliding_window, lm.args.layer_types
    last = {kind: max(i for i, x in enumerate(kinds) if x == kind) for kind in (FULL, SLIDING)}
    first = {FULL: 0, SLIDING: max(0, m - window + 1)}
    kv = {kind: (cache[i].keys[..., first[kind]:m, :], cache[i].values[..., first[kind]:m, :])
          for kind, i in last.items()}
    assistant, state, token = engine.draft.model, hidden[-1:], context[-1]
    tokens, probs = [], []
    for _ in range(k):
        embeds = lm.model.embed_tokens(mx.array([token])) * lm.model.embed_scale
        state, logits = assistant.step(embeds, state, kv, m)
        p = mx.softmax(logits.astype(mx.float32), axis=-1)[0]
        token = int(mx.argmax(p).item())
        tokens.append(token)
        probs.append(float(p[token].item()))
    return tokens, probs


def test_each_block_reads_committed_positions_only_after_rejected_blocks(pair):
    """Every block of a reply whose blocks are cut short, its sliding
    window wrapped: the rejected tokens' keys and hidden states were in the
    target's cache (its sliding layers' too) until the rewind, and the next
    block is what the assistant computes from the committed tokens alone."""
    engine = pair
    drafter, seen = engine.model_drafter, []
    propose = drafter.propose

    def watch(ctx, ctl):  # K = 3, each token's probability read back
        seen.append((tuple(ctx), propose(ctx, replace(ctl, lazy=False))))
        return seen[-1][1]

    drafter.propose = watch
    steps = []
    try:
        engine.reset_cache()
        _gen(engine, "draft", 3, on_step=steps.append)
    finally:
        del drafter.propose
    cut = [i for i, ev in enumerate(steps[:-1]) if ev.accepted < ev.drafted]
    assert cut, "no block was rejected"
    windows = [c for c in engine.target_cache.cache if isinstance(c, WindowKVCache)]
    assert windows and all(c.start > 0 for c in windows)  # past the window: old positions gone
    after_cut = [i for i, (_, p) in enumerate(seen) if p.tokens and i - 1 in cut]
    assert len(after_cut) >= 3, (cut, [len(p.tokens) for _, p in seen])
    for i, (context, proposal) in enumerate(seen):
        if not proposal.tokens:
            continue  # the policy drafted nothing this step
        tokens, probs = reference_block(engine, context, len(proposal.tokens))
        assert proposal.tokens == tokens, (i, i - 1 in cut)
        assert proposal.confidences == pytest.approx(probs, rel=1e-4, abs=1e-6), i


def test_a_regenerated_reply_reuses_the_whole_prompt_and_drafts_at_once(pair):
    """The same prompt again (a regenerated reply): the target goes back to
    where the prompt ended and the assistant drafts its first block from
    the hidden state it kept there, not from one computed again."""
    first = _gen(pair, "draft", 3, max_tokens=30)
    steps = []
    again = _gen(pair, "draft", 3, max_tokens=30, on_step=steps.append)
    assert again.token_ids == first.token_ids
    assert again.summary.reused_prompt_tokens == len(PROMPT) - 1
    assert steps[0].drafted > 0
    follow = (*PROMPT, *first.token_ids, 11, 12, 13)
    more = _gen(pair, "hybrid", None, prompt=follow, max_tokens=30)
    assert more.summary.reused_prompt_tokens >= len(PROMPT) + len(first.token_ids) - 1
    assert more.token_ids == _gen(pair, "plain", prompt=follow, max_tokens=30).token_ids


def test_its_state_goes_with_its_conversation(pair):
    """Two conversations that alternate (engine/prompt_cache.py): the turn
    that takes A back reuses all of A and the assistant drafts its first
    block at once from the hidden state it kept with A, not from B's; the
    ids are plain decoding's."""
    a = tuple((7 * i + 11) % 300 + 40 for i in range(40))
    b = tuple((13 * i + 5) % 300 + 40 for i in range(40))
    replies = {}
    for mode in ("draft", "plain"):
        pair.reset_cache()
        a1, b1 = _gen(pair, mode, 3, prompt=a, max_tokens=12), _gen(pair, mode, 3, prompt=b,
                                                                       max_tokens=12)
        steps = []
        a2 = _gen(pair, mode, 3, prompt=(*a, *a1.token_ids), max_tokens=12,
                  on_step=steps.append)
        replies[mode] = (a1.token_ids, b1.token_ids, a2.token_ids)
        if mode == "draft":
            assert a2.summary.reused_prompt_tokens == len(a) + len(a1.token_ids) - 1
            assert steps[0].drafted > 0
    assert replies["draft"] == replies["plain"]


def test_the_centroid_layer_scores_only_its_best_clusters_ids(pair):
    """Routed through centroids, a step's logits are the output layer's for
    the ids of its best 2 of 8 clusters, and the lowest of those less 1
    for every other id (the reference's); tied, every id's."""
    module = pair.draft.model
    x = mx.random.normal((1, module.config.hidden_size), key=mx.random.key(2))
    got = module.logits(x)[0]
    full = (x @ module.model.embed_tokens.weight.T)[0]
    if not module.config.ordered:  # its tied output layer scores every id
        assert mx.allclose(got, full, atol=1e-5)
        return
    scores = module.masked_embedding.centroids(x)[0]
    best = mx.argsort(-scores)[:2].tolist()
    ordering = module.masked_embedding.token_ordering.reshape(8, -1)
    ids = sorted(ordering[best].reshape(-1).tolist())
    assert mx.allclose(got[mx.array(ids)], full[mx.array(ids)], atol=1e-5)
    rest = sorted(set(range(got.shape[0])) - set(ids))
    floor = float(mx.min(full[mx.array(ids)]).item()) - 1
    assert mx.allclose(got[mx.array(rest)], mx.full((len(rest),), floor), atol=1e-5)


def test_the_draft_recommendation_times_an_assistant_chosen_as_the_draft(pair):
    """measure.forward_costs times one drafted token of whatever the draft
    is: for an assistant, one step on the target's keys of the context
    (``step_seconds``), not a draft model's forward it does not have."""
    from specchat.engine.measure import forward_costs

    costs = forward_costs(pair, list(PROMPT), reps=1)
    assert costs.draft_s > 0 and costs.target_s > 0 and costs.draft_cost > 0


@pytest.mark.slow  # a long chi-square or training run: CI's slow step
def test_assistant_samples_follow_the_target(pair):
    """K = 2, three tokens: after a block cut short the next step drafts
    from the cache rewound (its sliding window included). (Not four: the
    target may end its reply at the fourth, which the counts would not
    show as a token.)"""
    check_distribution(pair, PROMPT, "draft", 2, SamplingParams(temperature=1.0, top_k=3),
                       length=3, n=2000)


def test_an_assistant_for_another_target_is_refused_in_words(tiny_dir, gemma4, tiny_target):
    folder = build_gemma4_assistant(tiny_dir / "gemma4-assistant-plain", gemma4)
    with pytest.raises(EngineError, match="gemma4-assistant-plain is a Gemma 4 assistant and "
                                          "drafts only for the Gemma 4 it was made for; "
                                          "target-llama is a llama"):
        Engine().load(tiny_target, folder)
    other = build_gemma4_assistant(tiny_dir / "gemma4-assistant-other", gemma4,
                                   extra={"global_head_dim": 16})
    with pytest.raises(EngineError) as err:
        Engine().load(gemma4, other)
    assert str(err.value) == (
        "gemma4-assistant-other is a Gemma 4 assistant for another model and cannot draft for "
        "gemma4-target: its full-attention queries are 16 wide, gemma4-target's keys there 32")


def _edited(folder, config=None, weights=None):
    """``folder``'s config.json and weights changed in place."""
    if config is not None:
        data = json.loads((folder / "config.json").read_text())
        config(data)
        (folder / "config.json").write_text(json.dumps(data))
    if weights is not None:
        tensors = dict(mx.load(str(folder / "model.safetensors")))
        weights(tensors)
        mx.save_safetensors(str(folder / "model.safetensors"), tensors)
    return folder


def test_an_assistants_files_are_checked_before_it_loads(tiny_dir, gemma4):
    """Per-layer inputs it would not read, a layer's weights missing, a
    token ordering that names an id past its vocabulary (it indexes the
    output layer): each refused in words naming the file, before anything
    is built."""
    def build(name, **kw):
        return build_gemma4_assistant(tiny_dir / name, gemma4, **kw)

    per_layer = _edited(build("gemma4-assistant-ple"), config=lambda c: c["text_config"].update(
        hidden_size_per_layer_input=16))
    with pytest.raises(EngineError, match="gemma4-assistant-ple/config.json: "
                                          "text_config.hidden_size_per_layer_input must be 0: "
                                          "an assistant's layers read no per-layer inputs"):
        Engine().load(gemma4, per_layer)
    cut = _edited(build("gemma4-assistant-cut"),
                  weights=lambda w: w.pop("model.layers.1.mlp.down_proj.weight"))
    with pytest.raises(EngineError, match="gemma4-assistant-cut is incomplete: its weights lack "
                                          "model.layers.1.mlp.down_proj.weight"):
        Engine().load(gemma4, cut)

    def past(w):
        w["masked_embedding.token_ordering"][7] = 400

    far = _edited(build("gemma4-assistant-far", ordered=True), weights=past)
    with pytest.raises(EngineError, match="its token ordering names the id 400, outside its 400 "
                                          "ids"):
        Engine().load(gemma4, far)


def test_an_assistant_chosen_as_the_target_is_refused_in_words(tiny_dir, gemma4):
    folder = build_gemma4_assistant(tiny_dir / "gemma4-assistant-as-target", gemma4)
    with pytest.raises(EngineError, match="gemma4-assistant-as-target is a Gemma 4 assistant "
                                          "draft head: a head drafts for a target and cannot "
                                          "be one"):
        Engine().load(folder)
