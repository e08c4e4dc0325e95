"""What the tests of a drafter that reads the target (an EAGLE-3 head, the
target's MTP head) check of every step, through the engine's public views:
``Engine.drafter(kind)`` (the head's drafter: its committed ``rows`` and
its KV ``cache``), ``Engine.target_cache`` (how many positions the
target's cache stands for) and each step's StepEvent.

Used with the heads of tinymodels.py that are right part of the time
(``build_partial_eagle3``, ``build_partial_mtp_target``): their blocks are
accepted in part, so the rollback after a rejection really runs."""

from __future__ import annotations

from specchat.engine.events import DraftSettings, GenerateRequest, GenerationResult, StepEvent


class CommittedOnly:
    """An ``on_step`` for ``Engine.generate``: after every step the caches
    hold the committed context only. After a step that drafted, the
    target's cache stands for the context but its last token (the target's
    own, fed with the next verify): the accepted drafts stay, the rejected
    ones went (after one that did not, the next plain step's forward may be
    queued already, verifier.Verifier: that token too). The head's
    KV caches hold exactly its ``rows`` (none of the rows it fed its own
    chained drafts, or another drafter's tokens), at most one per committed
    token but the last (row p pairs the target's features after token p
    with token p + 1), and after a block it drafted, every one of those.

    ``prompt``: the request's prompt length. ``cut`` counts the steps whose
    block was rejected in part (the ones that roll back)."""

    def __init__(self, engine, kind: str, prompt: int):
        self.engine, self.kind, self.prompt = engine, kind, prompt
        self.cut = 0

    def __call__(self, event: StepEvent) -> None:
        before = self.prompt + event.total_tokens - len(event.token_ids)  # committed, at its start
        where = f"step {event.index}: {event.accepted} of {event.drafted} accepted"
        fed = self.engine.target_cache.length
        if event.drafted:
            assert fed == before + event.accepted, where
        else:  # nothing to roll back; a plain step after it may be queued already
            assert before <= fed <= before + 1, where
        head = self.engine.drafter(self.kind)
        assert [c.offset for c in head.cache] == [head.rows] * len(head.cache), where
        assert head.rows <= before - 1, where
        if event.drafter == self.kind and event.drafted:
            assert head.rows == before - 1, where
        self.cut += event.accepted < event.drafted


def generate_checked(engine, kind: str, request: GenerateRequest
                     ) -> tuple[GenerationResult, CommittedOnly]:
    """``request`` on ``engine``, each step checked (``CommittedOnly``)."""
    check = CommittedOnly(engine, kind, len(engine.prompt_ids(request)))
    return engine.generate(request, on_step=check), check


def accepted_in_part(result: GenerationResult, check: CommittedOnly, kind: str) -> dict:
    """The head's counts of a reply it drafted and was right about in part:
    some drafts accepted, some rejected, so that ``check`` saw the caches
    after rollbacks (its ``cut`` steps)."""
    got = result.summary.drafted_by.get(kind, {})
    assert 0 < got.get("accepted", 0) < got.get("drafted", 0), result.summary.drafted_by
    assert check.cut > 0  # the head's rejections among them
    return got


# The prompt the head tests draft on: a repeating run the tiny targets settle into.
PROMPT = (275, 364, 311, 78, 161, 53, 376, 40) * 3


def steady_request(mode: str, k: int | None = None, max_tokens: int = 48) -> GenerateRequest:
    """Adaptive K without break-even auto-off, which reads the clock: the
    same blocks every run."""
    return GenerateRequest(prompt_ids=PROMPT, max_tokens=max_tokens,
                           draft=DraftSettings(mode=mode, k=k, auto_off=False))


def steady_generate(engine, mode: str, k: int | None = None, max_tokens: int = 48, **kw):
    return engine.generate(steady_request(mode, k, max_tokens), **kw)

