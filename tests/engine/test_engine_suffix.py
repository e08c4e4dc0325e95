"""Suffix drafting: the index answers exactly what a brute-force search
would, drafts from the conversation and the history keep greedy output
identical to plain decoding and sampled output distributed as the target's,
and the history index follows the store (saved, reloaded, rebuilt when its
file is damaged, forgetting deleted conversations)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from sampling_checks import check_distribution
from specchat.engine.events import DraftSettings, GenerateRequest, Message, SamplingParams
from specchat.engine.history import History
from specchat.engine.hybrid import HybridDrafter
from specchat.engine.suffix_index import SEP, SuffixIndex, continuation


def _hybrid() -> HybridDrafter:
    """A hybrid of the suffix drafter and a draft-model kind, to ask what it would choose."""
    from specchat.engine.drafters import Drafter
    from specchat.engine.suffix import SuffixDrafter

    class Draft(Drafter):
        name = "draft"

    return HybridDrafter(SuffixDrafter(), Draft())


def brute_matches(idx: SuffixIndex, ctx: list[int], exclude=None) -> dict[int, list[int]]:
    buf, c = idx.buf[:idx.n], ctx[-idx.depth:]
    out = {}
    for m in range(1, len(c) + 1):
        ps = [p for p in range(idx.depth, idx.n)
              if buf[p - 1] != SEP and all(buf[p - 1 - j] == c[-1 - j] for j in range(m))
              and not (exclude and exclude[0] <= p < exclude[1])
              and not (idx.dead is not None and idx.dead[p])]
        if ps:
            out[m] = ps
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_index_finds_every_occurrence_a_brute_force_search_finds(seed):
    """Random documents over a tiny alphabet (many repeats), appended in
    random pieces so that the tail, sealed segments and merges all take
    part; some documents removed, some spans excluded."""
    rng = random.Random(seed)
    for _ in range(25):
        idx = SuffixIndex(depth=8, tail=rng.choice([3, 16, 64]))
        spans = []
        for _doc in range(rng.randint(1, 5)):
            start = idx.new_document()
            toks = [rng.randint(0, 3) for _ in range(rng.randint(1, 150))]
            i = 0
            while i < len(toks):
                step = rng.randint(1, 12)
                idx.extend(toks[i:i + step])
                i += step
            spans.append((start, idx.n))
        if rng.random() < 0.3:
            idx.remove(*rng.choice(spans))
        if rng.random() < 0.3:
            idx.compact()
        exclude = rng.choice(spans) if rng.random() < 0.3 else None
        ctx = [rng.randint(0, 3) for _ in range(rng.randint(1, 12))]
        got = {m: sorted(p.tolist()) for m, p in idx.matches(ctx, 1, exclude=exclude)}
        assert got == brute_matches(idx, ctx, exclude)


def test_the_continuation_is_what_most_occurrences_continued_with():
    idx = SuffixIndex(depth=8)
    a, b, c, d = 10, 11, 12, 13
    idx.extend([a, b, c, a, 7, a, b, d, a, b, c, a, 5])
    (m, pos), *_ = idx.matches([a, b], 2)
    assert m == 2 and sorted(pos.tolist()) == [idx.depth + 2, idx.depth + 7, idx.depth + 10]
    cont = continuation(idx.buf, idx.n, pos, m, limit=3, min_prob=0.1)
    # two of three said c, then both went on with a; then a tie: the latest (5) wins
    assert cont.tokens == [c, a, 5]
    assert cont.probs == pytest.approx([2 / 3, 2 / 3, 1 / 3])


def test_a_repeat_reaching_the_end_continues_itself():
    """A list that repeats with period 3 is proposed on past the end of the
    text, by reading back the proposal itself (an overlapping copy)."""
    idx = SuffixIndex(depth=8)
    idx.extend([1, 2, 3, 1, 2, 3, 1, 2])
    (m, pos), *_ = idx.matches([1, 2, 3, 1, 2, 3, 1, 2], 2)
    cont = continuation(idx.buf, idx.n, pos, m, limit=6, min_prob=0.1)
    assert cont.tokens == [3, 1, 2, 3, 1, 2]


@pytest.mark.parametrize("seed", range(4))
def test_the_history_holds_what_was_put_through_edits_removals_and_compactions(seed):
    """Random puts (new, grown, edited) and removals against a plain dict:
    every conversation reads back exactly, removed ones never answer a
    query, and matches agree with a brute-force search over the live
    conversations (compaction happens along the way)."""
    rng = random.Random(seed)
    h, model = History(), {}
    for step in range(300):
        op = rng.random()
        key = f"k{rng.randint(0, 7)}"
        if op < 0.5:
            if key in model and rng.random() < 0.6:
                toks = model[key] + [rng.randint(0, 5) for _ in range(rng.randint(0, 20))]
            else:
                toks = [rng.randint(0, 5) for _ in range(rng.randint(1, 40))]
            h.put(key, toks)
            model[key] = toks
        elif op < 0.7 and key in model:
            h.remove(key)
            del model[key]
        assert set(h.docs) == set(model)
        for k, toks in model.items():
            a, b = h.span(k)
            assert h.index.buf[a:b].tolist() == toks, (step, k)
        ctx = [rng.randint(0, 5) for _ in range(4)]
        got = {m: sorted(p.tolist()) for m, p in h.index.matches(ctx, 1)}
        assert got == brute_matches(h.index, ctx), step
        live = {p for ps in got.values() for p in ps}
        spans = [h.span(k) for k in model]
        assert all(any(a <= p <= b for a, b in spans) for p in live)


def test_the_draft_is_as_long_as_its_match_and_the_agreement_allow():
    """SuffixDecoding's speculation length, not a fixed K: a short match
    drafts a short block and a long one a long block (SPEC_FACTOR tokens per
    matched token, plus SPEC_OFFSET), and a block ends where too few of the
    occurrences still agree (MIN_PROB), however long the match allows."""
    from specchat.engine.suffix import MIN_PROB, SPEC_FACTOR, SPEC_OFFSET, SuffixDrafter

    def draft(context: list[int]):
        d = SuffixDrafter()
        d.prepare(context)
        (_origin, cont), = d.candidates(context, limit=64)
        return cont

    text = list(range(1, 41))  # 40 distinct tokens; the context then quotes their start
    for m in (2, 5, 9):
        cont = draft([*text, 99, *text[:m]])
        assert cont.match == m
        assert cont.tokens == text[m:m + int(SPEC_FACTOR * m) + SPEC_OFFSET]

    # [50, 51] was followed by 52 every time, then by a different token each
    # time: fewer than MIN_PROB agree on the second token, so one is drafted.
    n = int(1 / MIN_PROB) + 1
    seen = [t for i in range(n) for t in (200 + i, 50, 51, 52, 100 + i)]
    assert draft([*seen, 99, 50, 51]).tokens == [52]
    # When they all go on alike, the same match drafts as far as its length allows.
    same = [t for i in range(n) for t in (200 + i, 50, 51, 52, 53, 54, 55, 56)]
    assert draft([*same, 99, 50, 51]).tokens == [52, 53, 54, 55, 56][:int(SPEC_FACTOR * 2) + SPEC_OFFSET]


# -- end to end on the tiny pair ------------------------------------------------------

PROMPT = (45, 120, 33, 250, 91, 17, 88, 4)


def plain_ids(engine, prompt, n=40):
    return list(engine.generate(GenerateRequest(prompt_ids=prompt, max_tokens=n,
                                                draft=DraftSettings(mode="plain"))).token_ids)


@pytest.mark.parametrize("mode", ["suffix", "hybrid"])
def test_greedy_with_a_warm_history_is_plain_decoding(engine, mode):
    """The user asked the same thing before: the earlier reply is in the
    history (with a few tokens changed, so some drafts are rejected), and
    the drafts it gives are accepted, yet the ids are exactly plain's."""
    expected = plain_ids(engine, PROMPT)
    old = list(expected)
    old[10] = (old[10] + 1) % 300
    old[25] = (old[25] + 7) % 300
    engine.history.clear()
    engine.history.put("earlier", [*PROMPT, *old])
    r = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=40,
                                        draft=DraftSettings(mode=mode)))
    assert list(r.token_ids) == expected
    by = r.summary.tokens_by_origin
    assert by.get("history", 0) > 10, by
    assert sum(by.values()) == 40
    suffix = r.summary.drafted_by["suffix"]
    assert suffix["accepted"] < suffix["drafted"]  # the changed tokens were rejected
    assert any(k.startswith("suffix:history:") for k in suffix["by_key"])
    # Without the history (the bench's cold run) the same request drafts none from it.
    engine.history.enabled = False
    try:
        cold = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=40,
                                               draft=DraftSettings(mode=mode)))
    finally:
        engine.history.enabled = True
    assert list(cold.token_ids) == expected
    assert "history" not in cold.summary.tokens_by_origin


def test_the_conversation_being_answered_is_not_its_own_history(engine):
    """History matches leave out the conversation the reply belongs to (its
    text is already the conversation corpus); when the reply ends it is
    stored under its key, and a deleted conversation leaves the index."""
    expected = plain_ids(engine, PROMPT)
    engine.history.clear()
    engine.history.put("c1", [*PROMPT, *expected])
    own = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=40, history_key="c1",
                                          draft=DraftSettings(mode="suffix")))
    assert list(own.token_ids) == expected
    assert "history" not in own.summary.tokens_by_origin
    engine.history.remove("c1")
    assert engine.history.span("c1") is None
    gone = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=40,
                                           draft=DraftSettings(mode="suffix")))
    assert "history" not in gone.summary.tokens_by_origin
    # A reply joins the history when it ends, under its conversation's key.
    engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=40, history_key="c2",
                                    draft=DraftSettings(mode="plain")))
    start, end = engine.history.span("c2")
    assert engine.history.index.buf[start:end].tolist() == [*PROMPT, *expected]
    again = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=40, history_key="c3",
                                            draft=DraftSettings(mode="suffix")))
    assert list(again.token_ids) == expected
    assert again.summary.tokens_by_origin.get("history", 0) > 10


@pytest.mark.slow  # a long chi-square or training run: CI's slow step
def test_sampled_suffix_drafts_from_history_follow_the_target(engine, monkeypatch):
    """A suffix draft is a deterministic proposal (one-hot q): acceptance is
    p(x), and what comes out follows the target's distribution. (The runs
    are seeded, to be repeatable; seeded requests normally leave the history
    out, see the next test, so here it is let in.)"""
    from specchat.engine import suffix

    monkeypatch.setattr(suffix, "history_applies", lambda sampling: True)
    s = PROMPT[:5]
    g = plain_ids(engine, s, 6)
    engine.history.clear()
    engine.history.put("h", [*s, *g])
    check_distribution(engine, s, "suffix", 3, SamplingParams(temperature=0.9, top_k=4),
                       length=3, n=2000)


@pytest.mark.slow  # a long chi-square or training run: CI's slow step
def test_chained_suffix_and_model_drafts_follow_the_target(engine, monkeypatch):
    """A chained block: the suffix match's tokens (one-hot q), then the draft
    model's (its own q), verified as one block, jointly exact."""
    from specchat.engine import suffix

    monkeypatch.setattr(suffix, "history_applies", lambda sampling: True)
    s = PROMPT[:5]
    g = plain_ids(engine, s, 6)
    engine.history.clear()
    engine.history.put("h", [*s, *g[:1]])  # a one-token match, so the model goes on
    monkeypatch.setattr(HybridDrafter, "choose", staticmethod(lambda policy, p: ("chained", 2)))
    first = check_distribution(engine, s, "hybrid", None,
                               SamplingParams(temperature=1.0, top_k=4), length=3, n=2000)
    assert max(k for k, _ in first) >= 2  # the suffix token, then the model's
    r = engine.generate(GenerateRequest(prompt_ids=s, max_tokens=3, sampling=SamplingParams(
        temperature=1.0, top_k=4, seed=0), draft=DraftSettings(mode="hybrid")))
    assert r.summary.drafted_by["suffix"]["steps"] >= 1 and r.summary.drafted_by["draft"]["steps"] >= 1


def test_the_history_follows_the_store_and_its_file_is_never_trusted(engine, tmp_path):
    convs = [
        ("1", "a", (Message("user", "Write a function that adds two numbers."),
                    Message("assistant", "def add(a, b):\n    return a + b\n"))),
        ("2", "b", (Message("user", "Now write one that multiplies them."),)),
    ]
    rep = engine.sync_history(convs, tmp_path)
    assert (rep.conversations, rep.reused, rep.rendered) == (2, 0, 2)
    files = list(tmp_path.glob("history-*.npz"))
    assert len(files) == 1
    tokens = engine.history.tokens
    assert tokens > 20
    # Unchanged stamps: the saved ids are reused; a changed stamp is rendered again.
    rep = engine.sync_history([convs[0], ("2", "b2", convs[1][2])], tmp_path)
    assert (rep.reused, rep.rendered) == (1, 1)
    assert engine.history.tokens == tokens
    # A damaged file is rebuilt from the conversations, not read.
    data = bytearray(files[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    files[0].write_bytes(bytes(data))
    rep = engine.sync_history(convs, tmp_path)
    assert (rep.reused, rep.rendered) == (0, 2) and "rebuilt" in rep.file_note
    assert engine.history.tokens == tokens
    # Same length, other ids: the checksum catches it.
    with np.load(files[0]) as z:
        meta, toks, digest = str(z["meta"]), z["tokens"].copy(), str(z["digest"])
    toks[3] += 1
    np.savez(files[0], meta=np.array(meta), tokens=toks, digest=np.array(digest))
    rep = engine.sync_history(convs, tmp_path)
    assert rep.reused == 0 and "checksum" in rep.file_note
    # A conversation gone from the store is gone from the index.
    rep = engine.sync_history(convs[:1], tmp_path)
    assert set(engine.history.docs) == {"1"} and rep.reused == 1


def test_greedy_chained_blocks_are_plain_decoding(engine, monkeypatch):
    expected = plain_ids(engine, PROMPT)
    engine.history.clear()
    engine.history.put("h", [*PROMPT, *expected[:3], 999 % 300, *expected[4:12]])
    monkeypatch.setattr(HybridDrafter, "choose", staticmethod(lambda policy, p: ("chained", 3)))
    r = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=40,
                                        draft=DraftSettings(mode="hybrid")))
    assert list(r.token_ids) == expected
    assert r.summary.drafted_by["suffix"]["steps"] > 0 and r.summary.drafted_by["draft"]["steps"] > 0


def test_a_seeded_sampled_request_ignores_the_history(engine):
    """Same seed, same tokens, even though a reply joined the history in
    between: with a seed, history drafts would change which random draws
    are used, so a seeded sampled request leaves the history out."""
    engine.history.clear()
    req = GenerateRequest(prompt_ids=PROMPT, max_tokens=24, history_key="s",
                          sampling=SamplingParams(temperature=1.0, seed=7),
                          draft=DraftSettings(mode="hybrid"))
    first = engine.generate(req)
    assert engine.history.span("s") is not None  # the reply joined the history
    again = engine.generate(GenerateRequest(prompt_ids=PROMPT, max_tokens=24,
                                            sampling=SamplingParams(temperature=1.0, seed=7),
                                            draft=DraftSettings(mode="hybrid")))
    assert again.token_ids == first.token_ids
    assert "history" not in again.summary.tokens_by_origin


def test_a_long_conversation_match_drafts_outright_until_it_is_measured_weak():
    """A copy in progress (a conversation match of TRUST_MATCH tokens or more)
    drafts without weighing the model against it, while its bucket's
    measured acceptance holds; a short match, or a history match, is weighed."""
    from specchat.engine.costs import CostModel
    from specchat.engine.draft_policy import DraftPolicy
    from specchat.engine.drafters import Proposal
    from specchat.engine.hybrid import TRUST_ACCEPT, TRUST_MATCH
    from specchat.engine.suffix import stats_key

    def proposal(origin: str, m: int, k: int = 3) -> Proposal:
        return Proposal(tokens=list(range(k)), source="suffix", key=stats_key(origin, m),
                        origins=[origin] * k)

    # A cheap draft model that is always right: by the rates it beats any suffix.
    policy = DraftPolicy(cost=CostModel(draft=0.01, slope=0.3))
    policy.stats("draft").accept = 0.99
    assert _hybrid().choose(policy, proposal("conversation", TRUST_MATCH - 1))[0] != "suffix"
    assert _hybrid().choose(policy, proposal("history", 16))[0] != "suffix"
    # History matches start from their own measured acceptance, far below a copy's.
    assert policy.stats("suffix", stats_key("history", 8)).accept == 0.25
    assert policy.stats("suffix", stats_key("conversation", 8)).accept == 0.93
    long_copy = proposal("conversation", TRUST_MATCH)
    assert _hybrid().choose(policy, long_copy)[0] == "suffix"
    # Copies of that length keep failing in this request: the rates decide again.
    stats = policy.stats("suffix", long_copy.key)
    while stats.accept >= TRUST_ACCEPT:
        stats.observe(3, 0)
    assert _hybrid().choose(policy, long_copy)[0] != "suffix"


def test_the_hybrid_picks_the_draft_with_the_most_tokens_per_unit_of_cost():
    """Away from the copy rule, each option is priced by what the request
    measured: a reliable history match beats a poor model, a weak one loses
    to a good model, and a short reliable match is chained with the model
    only when the model's forwards are cheap (at the bundled pair's c = 0.3
    the free suffix step alone pays more)."""
    from specchat.engine.costs import CostModel
    from specchat.engine.draft_policy import DraftPolicy
    from specchat.engine.drafters import Proposal
    from specchat.engine.suffix import stats_key

    def pick(a_suffix: float, k: int, a_model: float, c: float) -> str:
        policy = DraftPolicy(cost=CostModel(draft=c, slope=0.07))
        s = Proposal(tokens=list(range(k)), source="suffix", key=stats_key("history", 16),
                     origins=["history"] * k)
        policy.stats("suffix", s.key).accept = a_suffix
        policy.stats("draft").accept = a_model
        return _hybrid().choose(policy, s)[0]

    assert pick(0.9, 8, a_model=0.3, c=0.3) == "suffix"
    assert pick(0.25, 4, a_model=0.87, c=0.3) == "model"
    assert pick(0.95, 2, a_model=0.9, c=0.02) == "chained"
    assert pick(0.95, 2, a_model=0.9, c=0.3) == "suffix"
    assert pick(0.95, 2, a_model=0.9, c=0.0) != "chained"  # no cost known: never chain blindly


def test_a_saved_history_of_another_tokenizer_or_version_is_rendered_again(tmp_path):
    """Ids mean something only to the tokenizer (and template) that made
    them: a file saved under another fingerprint, or in another format, is
    not reused, even with a valid checksum."""
    import json

    from specchat.engine import history as history_mod

    path = tmp_path / "history.npz"
    convs = [("1", "s1", "one"), ("2", "s2", "two")]
    rendered: list[str] = []

    def render(text: str) -> list[int]:
        rendered.append(text)
        return [len(text), 7, 8]

    first = History().sync("tok-A", convs, render, path)
    assert (first.rendered, first.reused) == (2, 0) and path.exists()
    same = History().sync("tok-A", convs, render, path)
    assert (same.rendered, same.reused) == (0, 2) and "reused" in same.file_note

    other = History()
    rep = other.sync("tok-B", convs, render, path)
    assert (rep.rendered, rep.reused) == (2, 0) and "another tokenizer" in rep.file_note
    assert other.index.buf[slice(*other.span("1"))].tolist() == [3, 7, 8]

    # The file is now tok-B's; rewrite it as another format version, validly signed.
    with np.load(path) as z:
        meta, tokens = json.loads(str(z["meta"])), np.asarray(z["tokens"])
    meta["format"] = history_mod.FORMAT + 1
    blob = json.dumps(meta, sort_keys=True)
    np.savez(path, meta=np.array(blob), tokens=tokens,
             digest=np.array(history_mod.checksum(blob, tokens)))
    rep = History().sync("tok-B", convs, render, path)
    assert (rep.rendered, rep.reused) == (2, 0) and "another version" in rep.file_note
    assert len(rendered) == 6
