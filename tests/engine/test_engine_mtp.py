"""The target's own multi-token-prediction head as a drafter (engine/mtp.py):
a tiny Qwen3.5 whose folder carries ``mtp.*`` weights, loaded through the
normal path. Its drafts are exactly what its module predicts from the
target's own hidden states, and every reply is plain decoding's."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache
from sampling_checks import ALPHA, chi_square_p, exact_joint, sample_counts
from specchat.engine import modes
from specchat.engine.errors import EngineError
from specchat.engine.events import DraftSettings, GenerateRequest, SamplingParams
from specchat.engine.session import Engine
from tinymodels import add_mtp, build_arch

PROMPT = (275, 364, 311, 78, 161, 53, 376, 40) * 3


@pytest.fixture(scope="module")
def mtp_target(tiny_dir, tiny_tokenizer):
    folder = build_arch(tiny_dir / "qwen3_5-mtp", tiny_tokenizer, "qwen3_5", seed=8)
    return add_mtp(folder)


@pytest.fixture(scope="module")
def mtp_engine(mtp_target):
    e = Engine()
    pair = e.load(mtp_target)
    assert pair.mtp and pair.speculative_ok
    return e


def _gen(engine, mode, k=None, prompt=PROMPT, max_tokens=48, **kw):
    return engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=max_tokens,
                                           draft=DraftSettings(mode=mode, k=k)), **kw)


def test_the_mtp_head_drafts_and_the_reply_is_plain_decoding(mtp_engine):
    plain = _gen(mtp_engine, "plain").token_ids
    for mode, k in [("mtp", 3), ("mtp", 1), ("mtp", None), ("mtp+suffix", None),
                    ("mtp+suffix", 2)]:
        steps = []
        r = _gen(mtp_engine, mode, k, on_step=steps.append)
        assert r.token_ids == plain, (mode, k)
        assert r.summary.drafted_by.get("mtp", {}).get("drafted", 0) > 0, (mode, k)
        assert r.summary.tokens_by_origin.get("mtp", 0) == \
            r.summary.drafted_by["mtp"]["accepted"]


def test_the_first_draft_is_the_heads_prediction_from_the_targets_hidden_states(mtp_engine):
    """Row p of the head pairs the target's hidden state after token p with
    token p + 1; the last row's prediction is the first draft token. Here it
    is computed directly, from one forward of the target over the prompt and
    the reply's first token, which goes out before the head reads a prompt
    longer than a few rows."""
    engine = mtp_engine
    lm = engine.target.model.language_model
    head = engine.drafter("mtp").head
    first = _gen(engine, "plain", max_tokens=1).token_ids[0]
    context = (*PROMPT, first)
    ids = mx.array(context)[None]
    hidden = lm.model(ids)  # [1, L, H]: the target's final hidden states
    out = head(lm.model.embed_tokens(ids[:, 1:]), hidden[:, :-1],
               [KVCache() for _ in head.layers])
    want = int(mx.argmax(lm.lm_head(out[0, -1]), axis=-1).item())
    drafter = engine.drafter("mtp")
    seen, contexts = [], []
    propose = drafter.propose

    def watch(ctx, ctl):
        contexts.append(tuple(ctx))
        seen.append(propose(ctx, ctl))
        return seen[-1]

    drafter.propose = watch
    try:
        engine.reset_cache()
        events = []
        _gen(engine, "mtp", 3, max_tokens=4, on_step=events.append)
    finally:
        del drafter.propose
    assert events[0].drafted == 0 and events[0].token_ids == (first,)
    assert contexts[0] == context
    assert seen and seen[0].tokens[0] == want


def test_mtp_and_a_separate_draft_model_both_speculate_exactly(mtp_target, tiny_dir,
                                                              tiny_tokenizer):
    draft = build_arch(tiny_dir / "qwen3_5-mtp-draft", tiny_tokenizer, "qwen3_5", seed=9,
                       noise_from=mtp_target, noise=0.05)
    engine = Engine()
    pair = engine.load(mtp_target, draft)
    assert pair.mtp and pair.draft is not None
    plain = _gen(engine, "plain").token_ids
    for mode, k in [("mtp", 3), ("draft", 3), ("hybrid", None), ("mtp+suffix", None)]:
        r = _gen(engine, mode, k)
        assert r.token_ids == plain and r.summary.drafted > 0, (mode, k)


def test_a_target_without_an_mtp_head_says_so(tiny_dir, tiny_tokenizer):
    folder = build_arch(tiny_dir / "qwen3_5-plain", tiny_tokenizer, "qwen3_5", seed=8)
    engine = Engine()
    assert not engine.load(folder).mtp
    with pytest.raises(EngineError, match="qwen3_5-plain has no MTP head"):
        _gen(engine, "mtp", 3)
    # The hybrid of the head and suffix matching runs on suffix matching alone.
    assert _gen(engine, "mtp+suffix").summary.mode == modes.SUFFIX.name


@pytest.mark.slow  # a long chi-square or training run: CI's slow step
def test_mtp_samples_follow_the_target(mtp_engine):
    """At T > 0 the head's q rows go to rejection sampling like any draft's:
    four tokens (two K = 2 steps) follow the target. The random head is
    rarely right, so this checks the rejections and the rollback after them
    (acceptance itself is the draft model's path, tested there)."""
    sampling = SamplingParams(temperature=1.0, top_k=3)
    joint = exact_joint(mtp_engine.target.model, sampling, PROMPT, 4)
    counts, drafted, _, _ = sample_counts(mtp_engine, PROMPT, "mtp", 2, sampling, 4, 1500)
    assert drafted > 1500
    assert chi_square_p(counts, joint) > ALPHA


def test_the_command_line_drafts_with_the_models_own_head(mtp_target):
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "specchat", "generate", "--target", str(mtp_target),
                          "--draft", "mtp", "--prompt", "Hello, world! Hello, world!",
                          "--max-tokens", "24", "--json"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["mode"] == "mtp+suffix" and got["models"]["draft"] is None
    assert got["stats"]["drafted"] > 0
