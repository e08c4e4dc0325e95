"""Several conversations' caches at once (engine/prompt_cache.py, issue 48):
two conversations that alternate reuse their own prefixes (counted in
tokens), the budget drops the least recently used first, a cancelled
request leaves nothing half written, and after any hit greedy ids are plain
decoding's, for every cache kind mlx-lm makes and with every drafter that
keeps state (the draft model's cache, a head's rows)."""

from __future__ import annotations

import threading

import pytest
from specchat.engine.events import DraftSettings, GenerateRequest
from specchat.engine.session import FORK_MIN, Engine
from tinymodels import ARCHS, build_eagle3

# Two conversations that share nothing, each long enough to be worth keeping.
A = tuple((7 * i + 11) % 300 + 40 for i in range(90))
B = tuple((13 * i + 5) % 300 + 40 for i in range(90))


def _engine(*paths, budget: int | None = None) -> Engine:
    e = Engine()
    e.load(*paths)
    if budget is not None:
        e.set_prompt_cache(budget)
    return e


def _gen(engine: Engine, prompt, mode="plain", k=None, max_tokens=12, **kw):
    return engine.generate(GenerateRequest(prompt_ids=tuple(prompt), max_tokens=max_tokens,
                                           draft=DraftSettings(mode=mode, k=k)), **kw)


def _turns(engine: Engine, mode="plain", k=None):
    """A, B, then each continued: (the replies, each request's reused tokens)."""
    a1 = _gen(engine, A, mode, k)
    b1 = _gen(engine, B, mode, k)
    a2_prompt = (*A, *a1.token_ids, 21, 22, 23)
    a2 = _gen(engine, a2_prompt, mode, k)
    b2_prompt = (*B, *b1.token_ids, 31, 32)
    b2 = _gen(engine, b2_prompt, mode, k)
    replies = [r.token_ids for r in (a1, b1, a2, b2)]
    return replies, [r.summary.reused_prompt_tokens for r in (a1, b1, a2, b2)]


def test_two_conversations_that_alternate_reuse_their_own_prefixes(tiny_target, tiny_draft):
    """With one cache, each turn of A after a turn of B read A from zero;
    now B's turn puts A aside and A's next turn takes it back."""
    kept = _engine(tiny_target, tiny_draft)
    replies, reused = _turns(kept)
    assert reused[2] >= len(A) + len(replies[0]) - 1  # all of A's first turn
    assert reused[3] >= len(B) + len(replies[1]) - 1
    one = _engine(tiny_target, tiny_draft, budget=0)  # one conversation at a time, as before
    plain, reused_one = _turns(one)
    assert reused_one[2] < 5 and reused_one[3] < 5
    assert replies == plain
    use = kept.prompt_cache_use()
    assert use.conversations == 1 and use.switches == 2 and 0 < use.held <= use.budget


@pytest.mark.parametrize("mode,k", [("draft", 3), ("hybrid", 3), ("ssd", 3)])
def test_the_drafters_state_goes_with_its_conversation(tiny_target, tiny_draft, mode, k):
    """The draft model's cache travels with its conversation: the turn that
    takes A back neither reads A's prompt into the draft again nor drafts
    from B's; and the ids are plain decoding's."""
    engine = _engine(tiny_target, tiny_draft)
    replies, reused = _turns(engine, mode, k)
    plain, _ = _turns(_engine(tiny_target, tiny_draft))
    assert replies == plain
    assert reused[2] >= len(A) + len(replies[0]) - 1
    # B's, taken back (the draft reads the reply's last tokens with its next block)
    assert engine.model_drafter.slot.reused >= len(B)


def test_a_heads_rows_go_with_their_conversation(tiny_dir, tiny_target):
    """A head needs the target's features of every row it has not fed: had
    its rows stayed with B, taking A back would have read A's prompt again."""
    head = build_eagle3(tiny_dir / "cache-head", tiny_target, seed=3)
    engine = _engine(tiny_target, head)
    replies, reused = _turns(engine, "draft", 3)
    plain, _ = _turns(_engine(tiny_target))
    assert replies == plain
    assert reused[2] >= len(A) + len(replies[0]) - 1
    assert reused[3] >= len(B) + len(replies[1]) - 1


def test_the_budget_drops_the_least_recently_used_first(tiny_target):
    """A budget for one conversation aside: after A, B and C, A went first
    (least recently used), so A is read again and B is not."""
    probe = _engine(tiny_target)
    _gen(probe, A)
    _gen(probe, B)
    one = probe.prompt_cache_use().held  # one conversation of this size, aside
    engine = _engine(tiny_target, budget=int(one * 1.5))
    c = tuple((17 * i + 3) % 300 + 40 for i in range(90))
    for prompt in (A, B, c):
        _gen(engine, prompt)
    assert engine.prompt_cache_use().conversations == 1
    assert _gen(engine, (*B, 5)).summary.reused_prompt_tokens >= len(B) - 1
    assert _gen(engine, (*A, 5)).summary.reused_prompt_tokens == 0
    assert engine.set_prompt_cache(0).conversations == 0  # a smaller budget drops them


def test_a_long_shared_prefix_is_kept_by_both(tiny_target):
    """A new conversation that shares a long prefix with the one held (an
    agent's system prompt and tools): the held one is kept aside as a copy
    and the new one reuses the prefix in place; both go on from their own."""
    system = tuple((3 * i + 1) % 300 + 40 for i in range(FORK_MIN + 20))
    first, second = (*system, *A[:30]), (*system, *B[:30])
    engine = _engine(tiny_target)
    r1 = _gen(engine, first)
    r2 = _gen(engine, second)
    assert r2.summary.reused_prompt_tokens >= len(system)
    again = _gen(engine, (*first, *r1.token_ids, 9))
    assert again.summary.reused_prompt_tokens >= len(first) + len(r1.token_ids) - 1
    fresh = _engine(tiny_target)
    assert r2.token_ids == _gen(fresh, second).token_ids
    assert again.token_ids == _gen(fresh, (*first, *r1.token_ids, 9)).token_ids


def test_a_cancelled_request_leaves_nothing_half_written(tiny_target, tiny_draft):
    """A's second turn cancelled after a few steps: its conversation holds
    only what was committed, and whatever is taken back after it gives
    plain decoding's ids."""
    engine = _engine(tiny_target, tiny_draft)
    a1 = _gen(engine, A, "draft", 3)
    stop, steps = threading.Event(), []

    def on_step(ev):
        steps.append(ev)
        if len(steps) == 2:
            stop.set()

    a2_prompt = (*A, *a1.token_ids, 21, 22)
    cut = _gen(engine, a2_prompt, "draft", 3, max_tokens=30, cancelled=stop, on_step=on_step)
    assert cut.summary.finish_reason == "cancelled"
    _gen(engine, B, "draft", 3)  # A goes aside as it stood
    again = _gen(engine, a2_prompt, "draft", 3, max_tokens=30)
    assert again.summary.reused_prompt_tokens >= len(a2_prompt) - 1
    assert again.token_ids == _gen(_engine(tiny_target), a2_prompt, max_tokens=30).token_ids


@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_cache_kind_is_plain_decoding_after_a_hit(arch_models, arch):
    """Recurrent state, sliding windows: what is put aside goes back as it
    was (a cache that cannot drop positions goes back to where its prompt
    ended), and the ids are a fresh engine's."""
    paths = arch_models(arch)
    replies, reused = _turns(_engine(*paths), "draft", 3)
    fresh = [_gen(_engine(*paths), p).token_ids for p in (A, B)]
    assert replies[:2] == fresh
    plain, _ = _turns(_engine(*paths))
    assert replies == plain
    assert reused[2] >= len(A) - 1 and reused[3] >= len(B) - 1
