"""The target's own multi-token-prediction head as a drafter (engine/mtp.py):
a tiny Qwen3.5 whose folder carries ``mtp.*`` weights, loaded through the
normal path. A random head's drafts are exactly what its module predicts
from the target's own hidden states; a head right part of the time
(tinymodels.build_partial_mtp_target) has its blocks accepted in part and
rolled back after each rejection, the caches checked at every step
(head_checks.py); every reply is plain decoding's."""

from __future__ import annotations

import mlx.core as mx
import pytest
from head_checks import PROMPT, accepted_in_part, generate_checked
from head_checks import steady_generate as _gen
from head_checks import steady_request as _request
from mlx_lm.models.cache import KVCache
from sampling_checks import ALPHA, chi_square_p, exact_joint, sample_counts
from specchat.engine import modes
from specchat.engine.errors import EngineError
from specchat.engine.events import SamplingParams
from specchat.engine.session import Engine
from tinymodels import add_mtp, build_arch, build_partial_mtp_target


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


@pytest.fixture(scope="module")
def partial_target(tiny_dir, tiny_tokenizer):
    return build_partial_mtp_target(tiny_dir / "qwen3_5-mtp-partial", tiny_tokenizer)


@pytest.fixture(scope="module")
def partial_engine(partial_target):
    e = Engine()
    assert e.load(partial_target).mtp
    return e




def test_the_mtp_head_drafts_and_the_reply_is_plain_decoding(partial_engine):
    """In every mode and K: some drafts accepted, some not, the caches (the
    target's recurrent state too) back to the committed context after each
    rejection, the reply plain decoding's, and the accepted drafts counted
    as the head's tokens."""
    plain = _gen(partial_engine, "plain").token_ids
    for mode, k in [("mtp", 3), ("mtp", 1), ("mtp", None), ("mtp+suffix", None),
                    ("mtp+suffix", 2)]:
        r, check = generate_checked(partial_engine, "mtp", _request(mode, k))
        assert r.token_ids == plain, (mode, k)
        got = accepted_in_part(r, check, "mtp")
        assert r.summary.tokens_by_origin.get("mtp", 0) == got["accepted"], (mode, k)


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


def test_mtp_and_a_separate_draft_model_both_speculate_exactly(partial_target, tiny_dir,
                                                              tiny_tokenizer):
    """Each drafts in its own modes, right part of the time, and each reply
    is plain decoding's."""
    draft = build_arch(tiny_dir / "qwen3_5-mtp-draft", tiny_tokenizer, "qwen3_5", seed=9,
                       noise_from=partial_target, noise=0.1)
    engine = Engine()
    pair = engine.load(partial_target, draft)
    assert pair.mtp and pair.draft is not None
    plain = _gen(engine, "plain").token_ids
    for mode, k, kind in [("mtp", 3, "mtp"), ("draft", 3, "draft"), ("hybrid", None, "draft"),
                          ("mtp+suffix", None, "mtp")]:
        r = _gen(engine, mode, k)
        got = r.summary.drafted_by.get(kind, {})
        assert r.token_ids == plain and 0 < got["accepted"] < got["drafted"], (mode, k)


def test_a_target_without_an_mtp_head_says_so(tiny_dir, tiny_tokenizer):
    folder = build_arch(tiny_dir / "qwen3_5-plain", tiny_tokenizer, "qwen3_5", seed=8)
    engine = Engine()
    assert not engine.load(folder).mtp
    with pytest.raises(EngineError, match="qwen3_5-plain has no MTP head"):
        _gen(engine, "mtp", 3)
    # The hybrid of the head and suffix matching runs on suffix matching alone.
    assert _gen(engine, "mtp+suffix").summary.mode == modes.SUFFIX.name


@pytest.mark.slow  # a long chi-square or training run: CI's slow step
def test_mtp_samples_follow_the_target(partial_engine):
    """At T > 0 the head's q rows go to rejection sampling like any draft's:
    four tokens (two K = 2 steps) follow the target, with a head right part
    of the time, so both its acceptances and its rejections (and the
    rollback of the target's recurrent state after them) are sampled."""
    sampling = SamplingParams(temperature=1.0, top_k=3)
    joint = exact_joint(partial_engine.target.model, sampling, PROMPT, 4)
    counts, drafted, accepted, _ = sample_counts(partial_engine, PROMPT, "mtp", 2, sampling, 4,
                                                 1500)
    assert drafted > 1500 and 0 < accepted < drafted
    assert chi_square_p(counts, joint) > ALPHA


def test_the_command_line_drafts_with_the_models_own_head(partial_target):
    """``--draft mtp``: the model's own head drafts (K = 2, so that the
    blocks do not depend on the clock), right part of the time."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "specchat", "generate", "--target",
                          str(partial_target), "--draft", "mtp", "--k", "2", "--prompt",
                          "Hello, world! Hello, world!", "--max-tokens", "24", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["mode"] == "mtp+suffix" and got["models"]["draft"] is None
    assert 0 < got["stats"]["accepted"] < got["stats"]["drafted"]
