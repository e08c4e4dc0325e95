"""EAGLE-3 draft heads (engine/eagle3.py) for the tiny target in both
published layouts, loaded as the draft: random ones, whose drafts are
checked against what the head computes from the target's hidden states,
and ones right part of the time (tinymodels.build_partial_eagle3), whose
blocks are accepted in part and rolled back after each rejection (checked
at every step, head_checks.py). Replies are plain decoding's, and a head
made for another model is refused in words."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from head_checks import PROMPT, accepted_in_part, generate_checked
from head_checks import steady_generate as _gen
from head_checks import steady_request as _request
from mlx_lm.models.cache import KVCache
from sampling_checks import ALPHA, chi_square_p, exact_joint, sample_counts
from specchat.engine.errors import EngineError
from specchat.engine.events import DraftSettings, GenerateRequest, SamplingParams
from specchat.engine.session import Engine
from specchat.library import refs
from tinymodels import build_eagle3, build_partial_eagle3


@pytest.fixture(scope="module", params=["eagle3", "speculators"])
def head_engine(request, tiny_dir, tiny_target):
    head = build_eagle3(tiny_dir / f"eagle3-{request.param}", tiny_target, layout=request.param)
    e = Engine()
    pair = e.load(tiny_target, head)
    assert pair.draft.model_type == "eagle3" and pair.speculative_ok
    return e


@pytest.fixture(scope="module", params=["eagle3", "speculators"])
def partial_engine(request, tiny_dir, tiny_target):
    """The tiny target with a head that is right part of the time as its draft."""
    head = build_partial_eagle3(tiny_dir / f"eagle3-partial-{request.param}", tiny_target,
                                layout=request.param)
    e = Engine()
    assert e.load(tiny_target, head).draft.model_type == "eagle3"
    return e




def _partly_right(engine, mode, k=None, max_tokens=48):
    """A reply the head drafted, accepted in part, with only committed rows
    in the caches after every step; its tokens."""
    r, check = generate_checked(engine, "eagle3", _request(mode, k, max_tokens))
    accepted_in_part(r, check, "eagle3")
    return r.token_ids


def test_a_head_drafts_and_the_reply_is_plain_decoding(partial_engine):
    """In every mode and K: some drafts accepted, some not, the caches back
    to the committed rows after each rejection, the reply plain decoding's,
    and the accepted drafts counted as the head's tokens."""
    plain = _gen(partial_engine, "plain").token_ids
    for mode, k in [("draft", 3), ("draft", None), ("hybrid", None), ("hybrid", 2)]:
        r, check = generate_checked(partial_engine, "eagle3", _request(mode, k))
        assert r.token_ids == plain, (mode, k)
        got = accepted_in_part(r, check, "eagle3")
        assert r.summary.tokens_by_origin.get("head", 0) == got["accepted"], (mode, k)


def test_the_first_draft_is_the_heads_prediction_from_three_target_layers(head_engine):
    """Row p: fc of the outputs of the target's layers 1, 2, 2 (ids 2, 3, 3
    of its 6) after token p, with the embedding of token p + 1; the draft
    id maps to the target's through d2t. The head reads a prompt longer than
    a few rows only after the reply's first token has gone out (as the
    draft model does), so its first draft follows that token."""
    engine = head_engine
    model, head = engine.target.model, engine.draft.model
    assert len(PROMPT) - 1 > type(engine.model_drafter).READY_ROWS
    first = _gen(engine, "plain", max_tokens=1).token_ids[0]
    context = (*PROMPT, first)
    ids = mx.array(context)[None]
    h, outs = model.model.embed_tokens(ids), {}
    for i, layer in enumerate(model.model.layers):
        h = layer(h, mask="causal", cache=None)
        outs[i] = h[0]
    feats = mx.concatenate([outs[i] for i in head.config.read_layers(6)], axis=-1)[:-1]
    out = head(mx.array(context[1:]), feats, [KVCache() for _ in head.layers], fed=True)
    want = int(head.rows()[mx.argmax(head.logits(out[-1:]), axis=-1)].item())
    drafter = engine.model_drafter
    seen = []
    propose = drafter.propose
    contexts, rows = [], []

    def watch(ctx, ctl):
        contexts.append(tuple(ctx))
        rows.append(drafter.rows)
        seen.append(propose(ctx, ctl))
        return seen[-1]

    drafter.propose = watch
    try:
        engine.reset_cache()
        events = []
        _gen(engine, "draft", 3, max_tokens=4, on_step=events.append)
    finally:
        del drafter.propose
    assert events[0].drafted == 0 and events[0].token_ids == (first,)
    assert contexts[0] == context
    assert rows[0] == len(context) - 1  # the prompt was read before, not in the draft's time
    assert seen and seen[0].tokens[0] == want
    assert all(t % 2 == 0 for p in seen for t in p.tokens)  # its vocabulary: even ids


def _first_proposal(engine, prompt: tuple[int, ...]):
    """The head's first proposal in a short request on ``prompt`` (adaptive
    K: its confidences are read back)."""
    drafter, seen = engine.model_drafter, []
    propose = drafter.propose
    drafter.propose = lambda ctx, ctl: seen.append(propose(ctx, ctl)) or seen[-1]
    try:
        engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=8,
                                        draft=DraftSettings(mode="draft")))
    finally:
        del drafter.propose
    return seen[0]


def test_a_head_never_drafts_from_another_conversations_rows(head_engine):
    """The target's cache follows every request, the head's rows only those
    it drafted in. After a head request on one prompt and a plain one on
    another, a head request that continues the second drafts exactly as a
    head that never saw the first."""
    engine = head_engine
    other = tuple(reversed(PROMPT))
    engine.reset_cache()
    _gen(engine, "draft", max_tokens=48)
    reply = engine.generate(GenerateRequest(prompt_ids=other, max_tokens=40,
                                            draft=DraftSettings(mode="plain"))).token_ids
    follow_up = (*other, *reply, *PROMPT[:5])
    after_plain = _first_proposal(engine, follow_up)
    engine.reset_cache()
    fresh = _first_proposal(engine, follow_up)
    assert after_plain.tokens == fresh.tokens
    assert after_plain.confidences == pytest.approx(fresh.confidences, rel=1e-5)


@pytest.mark.slow  # a long chi-square or training run: CI's slow step
@pytest.mark.parametrize("repo", ["test-org/tiny-eagle3", "test-org/tiny-eagle3-midlayer"])
def test_head_samples_follow_the_target(hub_heads, tiny_target, repo):
    """A head in each published layout, pulled through hf: from the local
    Hub as a person would, drafts samples that follow the target's own
    distribution."""
    engine = Engine()
    pair = engine.load(tiny_target, refs.resolve(f"hf:{repo}"))
    assert pair.draft.model_type == "eagle3" and pair.speculative_ok
    sampling = SamplingParams(temperature=1.0, top_k=3)
    joint = exact_joint(engine.target.model, sampling, PROMPT, 4)
    counts, drafted, _, _ = sample_counts(engine, PROMPT, "draft", 2, sampling, 4, 1500)
    assert drafted > 1500
    assert chi_square_p(counts, joint) > ALPHA


def test_a_head_for_another_target_is_refused_in_words(tiny_dir, tiny_target):
    narrow = build_eagle3(tiny_dir / "eagle3-narrow", tiny_target, hidden=32)
    far = build_eagle3(tiny_dir / "eagle3-deep", tiny_target, layer_ids=[2, 12, 21])
    engine = Engine()
    with pytest.raises(EngineError, match="eagle3-narrow is an EAGLE-3 head for another model "
                                          "and cannot draft for target-llama: it reads hidden "
                                          "states of width 32, target-llama has 64"):
        engine.load(tiny_target, narrow)
    with pytest.raises(EngineError, match="it reads layers \\[2, 12, 21\\], target-llama has 6"):
        engine.load(tiny_target, far)


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def test_a_heads_rope_scaling_is_built_as_mlx_lm_builds_it(tiny_dir, tiny_target):
    """A Llama 3.1 head's "llama3" rope scaling: the loaded head's rotary
    embedding gives what mlx-lm's own Llama attention gives for the same
    config (and not what unscaled frequencies would), and it still drafts
    plain decoding's reply (a head right part of the time, its positions
    now scaled)."""
    from mlx_lm.models import llama

    folder = build_partial_eagle3(tiny_dir / "eagle3-llama3-rope", tiny_target)
    layer = json.loads((folder / "config.json").read_text())
    layer["rope_scaling"] = LLAMA3_SCALING
    (folder / "config.json").write_text(json.dumps(layer))
    args = llama.ModelArgs.from_dict({**layer, "model_type": "llama", "num_hidden_layers": 1})
    theirs = llama.Attention(args).rope
    e = Engine()
    e.load(tiny_target, folder)
    ours = e.draft.model.layers[0].self_attn.rope
    assert type(ours) is type(theirs)
    x = mx.random.normal((1, 4, 5, 16), key=mx.random.key(3))
    for offset in (1, 40, 300):
        assert mx.allclose(ours(x, offset=offset), theirs(x, offset=offset), atol=1e-5)
    unscaled = mx.fast.rope(x, 16, traditional=False, base=10000.0, scale=1.0, offset=300)
    assert not mx.allclose(ours(x, offset=300), unscaled, atol=1e-3)
    plain = _gen(e, "plain", max_tokens=24).token_ids
    assert _partly_right(e, "draft", 3, max_tokens=24) == plain


def test_a_rope_scaling_mlx_lm_cannot_build_is_refused_in_words(tiny_dir, tiny_target):
    folder = build_eagle3(tiny_dir / "eagle3-odd-rope", tiny_target)
    config = json.loads((folder / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "wobbly", "factor": 2.0}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineError, match='eagle3-odd-rope is an EAGLE-3 head with a rope '
                                          'scaling of type "wobbly", which mlx-lm cannot build '
                                          r"\(mlx-lm knows no such type\); it would draft "
                                          "with the wrong positions"):
        Engine().load(tiny_target, folder)
    config["rope_scaling"] = {"rope_type": "llama3"}  # no factor
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineError, match="type \"llama3\", which mlx-lm cannot build "
                                          "\\(it lacks 'factor'\\)"):
        Engine().load(tiny_target, folder)
    # Built, but failing once applied: dynamic scaling with no length to scale from.
    config["rope_scaling"] = {"rope_type": "dynamic", "factor": 2.0}
    del config["max_position_embeddings"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineError, match='type "dynamic", which mlx-lm cannot build'):
        Engine().load(tiny_target, folder)


def test_a_head_whose_map_points_past_the_targets_vocabulary_is_refused_in_words(
        tiny_dir, tiny_target):
    """Draft ids 200..255 map to target ids 400..510, past the tiny target's
    400: refused at load with the numbers, not an IndexError while drafting."""
    folder = build_eagle3(tiny_dir / "eagle3-past", tiny_target, wrap=False)
    with pytest.raises(EngineError) as err:
        Engine().load(tiny_target, folder)
    assert str(err.value) == (
        "eagle3-past's vocabulary map does not fit target-llama: its d2t maps 56 draft ids "
        "outside target-llama's 400 ids (draft id 255 to target id 510); its t2d marks 56 "
        "target ids past target-llama's 400 (up to 510)")


def test_a_head_whose_config_misstates_its_head_width_loads_by_its_weights(
        tiny_dir, tiny_target):
    """AngelSlim's Qwen3-4B head states head_dim 80 (hidden size over heads)
    while its q_proj holds heads of 128: the weights decide, and the head
    drafts as its weights say (one right part of the time, stating 32 for
    its heads of 16); a q_proj that is no whole number of heads is refused
    in words."""
    folder = build_partial_eagle3(tiny_dir / "eagle3-wide-heads", tiny_target)
    config = json.loads((folder / "config.json").read_text())
    config["head_dim"] = 32  # its q_proj holds heads of 16
    (folder / "config.json").write_text(json.dumps(config))
    e = Engine()
    e.load(tiny_target, folder)
    assert e.draft.model.config.head_dim == 16
    assert _partly_right(e, "draft", 3) == _gen(e, "plain").token_ids
    odd = build_eagle3(tiny_dir / "eagle3-odd-heads", tiny_target, head_dim=32,
                       stated_head_dim=24)
    config = json.loads((odd / "config.json").read_text())
    config["num_attention_heads"], config["num_key_value_heads"] = 3, 1
    (odd / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineError, match="its q_proj has 128 rows, not a whole number of "
                                          "its 3 attention heads"):
        Engine().load(tiny_target, odd)


def test_a_head_beside_a_draft_model_drafts_in_its_own_modes(tiny_dir, tiny_target, tiny_draft):
    """Loaded beside a draft model, a head drafts in ``head`` and
    ``head+suffix`` while ``draft`` keeps the draft model; loading another
    head as the draft then drops the side head, not the new draft."""
    side = build_partial_eagle3(tiny_dir / "eagle3-side", tiny_target)
    e = Engine()
    pair = e.load(tiny_target, tiny_draft, head=side)
    assert pair.head is not None and pair.draft.model_type != "eagle3"
    plain = _gen(e, "plain").token_ids
    for mode in ("head", "head+suffix"):
        r, check = generate_checked(e, "eagle3", _request(mode))
        assert r.token_ids == plain, mode
        accepted_in_part(r, check, "eagle3")
        assert "draft" not in r.summary.drafted_by, mode
    r = _gen(e, "draft", 3)
    assert r.token_ids == plain and r.summary.drafted_by["draft"]["drafted"] > 0
    assert "eagle3" not in r.summary.drafted_by

    other = build_partial_eagle3(tiny_dir / "eagle3-other", tiny_target, layout="speculators")
    pair = e.load(tiny_target, other)
    assert pair.head is None and pair.draft.model_type == "eagle3"
    assert _partly_right(e, "draft", 3) == plain
    e.load(tiny_target, tiny_draft)
    with pytest.raises(EngineError, match="drafts with an EAGLE-3 head loaded beside"):
        _gen(e, "head")


def test_the_bench_times_a_head_and_leaves_the_targets_tap_as_it_was(head_engine):
    """The bench's cost of a head draft runs the target once with its tap
    on (Runner.tapped_forward); afterwards the tap is off and nothing tapped
    is kept, so the next reply is plain decoding's as before."""
    from specchat.tools.forward_timing import measure_costs

    runner = head_engine.target_runner
    before = _gen(head_engine, "plain", max_tokens=16).token_ids
    costs = measure_costs(head_engine, list(PROMPT), reps=1)
    assert costs["draft"] > 0 and set(costs["target"]) == {1, 3, 5, 9}
    assert runner.tap is False and runner.tapped is None
    assert _gen(head_engine, "draft", 3, max_tokens=16).token_ids == before


def test_the_rope_table_is_what_mlx_lm_builds():
    """rope_rules.ROPE_TYPES (which the library's check reads, without
    MLX) says which rope scalings mlx-lm builds and the keys each needs:
    each builds and applies with them and fails without any one of them, so
    an mlx-lm that changes this fails here rather than while drafting."""
    from mlx_lm.models.rope_utils import initialize_rope
    from specchat.engine.rope_rules import ROPE_NEEDS_LENGTH, ROPE_TYPES

    values = {"factor": 2.0, "original_max_position_embeddings": 64,
              "short_factor": [1.0] * 8, "long_factor": [1.0] * 8, "mrope_section": [2, 3, 3]}

    def applies(scaling: dict, positions: int | None = 2048) -> bool:
        try:
            rope = initialize_rope(16, 10000.0, False, scaling, positions)
            mx.eval(rope(mx.zeros((1, 1, 2, 16)), offset=1))
        except (ValueError, KeyError, TypeError, AssertionError, ArithmeticError):
            return False
        return True

    for kind, keys in ROPE_TYPES.items():
        scaling = {"rope_type": kind, **{k: values[k] for k in keys}}
        assert applies(scaling), kind
        for key in keys:
            assert not applies({k: v for k, v in scaling.items() if k != key}), (kind, key)
        assert applies(scaling, None) == (kind not in ROPE_NEEDS_LENGTH), kind
    assert not applies({"rope_type": "wobbly", "factor": 2.0})


def test_the_draft_recommendation_times_a_head_chosen_as_the_draft(head_engine):
    """measure.forward_costs (the draft recommendation's) times one drafted
    token of whatever the draft is, as the bench does: a head's chained
    forward (it once asked a head for a draft model's forward and failed)."""
    from specchat.engine.measure import forward_costs

    costs = forward_costs(head_engine, list(PROMPT), reps=1)
    assert costs.draft_s > 0 and costs.target_s > 0 and costs.draft_cost > 0
