"""Drafters: who proposes the tokens the target verifies, and what the loop
tells them.

A drafter proposes a block for the committed context (``propose``); after
the target has judged it, the loop says how much of context + block the
target kept (``kept``), so a drafter with a cache rewinds it by arithmetic
instead of comparing ids. What the policy needs to know about a kind of
drafter (its cost, prior, longest block, origin) is declared in
drafter_kinds.py, under the drafter's ``name``. The draft model's drafter is
draft_model.py; the suffix drafter suffix.py; hybrid.py asks one of them,
or both, per step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from specchat.engine import drafter_kinds
from specchat.engine.errors import EngineError
from specchat.engine.events import SamplingParams
from specchat.engine.kv import HiddenTap
from specchat.engine.sampling import KeyStream


@dataclass(frozen=True)
class Part:
    """A run of a proposal's tokens drafted by one drafter kind (a chained
    proposal has several: a suffix match, then the draft model)."""

    source: str  # drafter kind
    key: str  # statistics key
    k: int
    confidences: tuple[float, ...] = ()


@dataclass
class Proposal:
    tokens: list[int]
    source: str  # the drafter kind's name (drafter_kinds.py); "" when nothing is drafted
    key: str = ""  # what the policy keeps statistics under (defaults to source)
    q: mx.array | None = None  # [k, V] processed draft probs (sampling only)
    confidences: list[float] = field(default_factory=list)
    draft_s: float = 0.0  # seconds spent in draft forwards (catching up included)
    forwards: int = 0  # draft forward passes behind draft_s
    # Per token, where it came from (specchat/origins.py); by default the
    # origin the drafter's kind declares.
    origins: list[str] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)  # per drafter kind, in order

    def __post_init__(self) -> None:
        self.key = self.key or self.source
        if not self.origins and self.tokens:
            self.origins = [drafter_kinds.get(self.source).origin] * len(self.tokens)
        if not self.parts and self.tokens:
            self.parts = [Part(self.source, self.key, len(self.tokens), tuple(self.confidences))]

    @property
    def k(self) -> int:
        return len(self.tokens)

    def judged(self, n: int) -> Iterator[tuple[Part, int]]:
        """Each part the target judged when ``n`` tokens were accepted, with
        how many of its tokens it kept. A part after the first rejection
        was never judged (its first token starts past n)."""
        offset = 0
        for part in self.parts:
            if offset > n:
                return
            yield part, min(n - offset, part.k)
            offset += part.k


NO_DRAFT = Proposal(tokens=[], source="")


@dataclass(frozen=True)
class Reading:
    """What a drafter answers as a request starts (``Drafter.prepare``):
    how far the target may reuse its cached prompt for it, and whether it
    has more of the prompt to read than one draft step reads."""

    # Positions of the target's cached prefix it can follow (a head needs the
    # target's features of every row it has not fed); None: all of them.
    reuse: int | None = None
    # The rest of the prompt is more than a draft step reads: ``catch_up``
    # reads it, as prompt processing, after the reply's first token has gone
    # out (``first_token_first``; ssd: before the first step).
    behind: bool = False
    first_token_first: bool = True
    # How many ids the rest is, and which drafter kind reads them: what
    # reading it costs, for the policy's choice of whether it pays
    # (DraftPolicy.worth_reading); 0 and "" when nothing is left to read.
    unread: int = 0
    reader: str = ""
    # It drafts before the rest is read (hybrid.py: suffix matches), so
    # steps go on drafting while the reading waits.
    drafts_behind: bool = False


@dataclass
class Build:
    """What a drafter kind's ``make`` builds its drafter from: what the
    engine has loaded, and what was chosen for the kind's need."""

    target: Any  # loading.LoadedModel: the target as loaded
    cache: Any  # kv.CacheSlot: the target's cache (a head reads its hidden states)
    compute: Any  # events.ComputeInfo: the policy models are loaded with
    history: Any  # history.History: the user's earlier conversations
    end_ids: set[int] = field(default_factory=set)  # ids that end a reply
    folder: Any = None  # pathlib.Path chosen for the need (a draft model's, a head's)
    files: Any = None  # that folder as the kind's format module read and checked it
    base: Any = None  # Drafter of the need it builds on (ssd: the draft model's)
    say: Callable[[str], None] = lambda _message: None  # loading progress, in words


class Absent(EngineError):
    """A kind's ``make`` found nothing to build (the target ships no MTP
    head that drafts): the engine keeps the words for a mode that asks."""


@dataclass
class DraftControl:
    """What the loop tells a drafter for one step."""

    sampling: SamplingParams
    keys: KeyStream
    vocab: int  # target logits width; q rows are padded/cut to it
    # Max draft length this step for a drafter kind (statistics under an
    # optional finer key): cap(kind, key=None).
    cap: Callable[..., int]
    # After a drafter of a kind drafted tokens of these confidences, one more?
    # keep_going(kind, confidences): the policy's early stop, priced by the kind.
    keep_going: Callable[[str, list[float]], bool] = lambda kind, confs: True
    # Fixed K: no early stop, so the draft tokens can stay on the device
    # until the block is done (one host sync per block instead of per token).
    lazy: bool = False
    # Another drafter drafts when this one proposes nothing (hybrid.py), so
    # weak proposals may be left to it.
    fallback: bool = False
    # The request's draft policy (draft_policy.DraftPolicy), for drafters that
    # weigh options by measured acceptance and cost (hybrid.py).
    policy: Any = None


class Drafter:
    """What the loop asks of a drafter. Only ``propose`` is required; the
    rest have do-nothing defaults for drafters that keep no state. Its
    kind's ``make`` builds it from a ``Build``; a drafter that needs none of
    it may be its own ``make`` (the class, which takes and ignores it)."""

    name: str  # its kind in drafter_kinds.py
    # Whether it drafts only under its own kind's cap, so that a cap of 0
    # means it proposes nothing whatever the context: then the loop can tell,
    # before reading a step back, that the next one drafts nothing, and queue
    # it early (decoding._next_is_plain). The promise: ``propose`` calls
    # ``ctl.cap(self.name)`` (no key) once, first, and when it is 0 returns
    # an empty proposal at once, drawing no random key.
    own_cap_only: bool = False

    # The folder it was loaded from, as loaded (loading.LoadedModel: a draft
    # model, a head); None for a drafter made on what others loaded.
    loaded: Any = None

    def __init__(self, build: Build | None = None):
        pass

    def prepare(self, prompt: Sequence[int], request: Any = None) -> Reading:
        """A request (events.GenerateRequest) starts, before the target's
        prefill: keep what an earlier request left where it is a prefix of
        ``prompt`` (cheap work only), and say what is left to read."""
        return Reading()

    @property
    def hidden_tap(self) -> HiddenTap | None:
        """What it reads of the target's forwards, tapped for the length of
        a request (kv.CacheSlot.tapped; head_drafter.py)."""
        return None

    def propose(self, context: Sequence[int], ctl: DraftControl) -> Proposal:
        raise NotImplementedError

    def propose_after(self, context: Sequence[int], given: Sequence[int],
                      ctl: DraftControl) -> Proposal:
        """Draft on from past ``given``: another drafter's tokens after the
        committed ``context``, not yet verified (hybrid.py's chained
        proposal). A drafter that reads its own text reads them like any
        context; one that reads the target's hidden states has none for
        them and overrides this."""
        return self.propose([*context, *given], ctl)

    def kept(self, length: int) -> None:
        """The target judged the last proposal (whoever made it): the first
        ``length`` tokens of the context it was made for, followed by the
        proposal, are the target's own now; anything a drafter fed past them
        is dropped. (The target's next token is not among them: it arrives
        in the next context.)"""

    def catch_up(self, context: Sequence[int]) -> None:
        """Bring any state up to ``context`` now, outside the draft timing:
        the prompt, when ``prepare`` said it is behind; and mid-request,
        before break-even auto-off probes speculation."""

    def finish(self, context: Sequence[int]) -> None:
        """The request ended with ``context`` committed."""

    def reset(self) -> None:
        """Forget everything (the cache was dropped)."""

    # The attributes that hold what it keeps of a conversation, which ``save``
    # moves out and ``restore`` puts back (``reset`` makes them anew); none for
    # a drafter that keeps nothing between requests.
    _STATE: tuple[str, ...] = ()

    def save(self) -> Saved | None:
        """What this drafter holds of the conversation the target's cache
        holds, moved out (the drafter starts empty), for when the engine
        puts that conversation aside (prompt_cache.py); None for a drafter
        that keeps nothing between requests."""
        state = {k: getattr(self, k) for k in self._STATE}
        nbytes = self.state_bytes()
        self.reset()
        return Saved(state, nbytes) if state else None

    def restore(self, saved: Saved | None) -> None:
        """Hold again what ``save`` moved out (None: start empty)."""
        self.reset()
        if saved is not None:
            for k, v in saved.state.items():
                setattr(self, k, v)

    def state_bytes(self) -> int:
        """The bytes of what ``_STATE`` holds."""
        return 0

    def stats(self) -> dict:
        """This request's own counts, for Summary.drafter_stats under the
        drafter's name (ssd/: hits, misses, overlap); empty for most."""
        return {}

    def bytes_per_token(self) -> int | None:
        """Weight bytes one drafted token reads (the engine prices a drafter
        with weights of its own by them); None: none."""
        return None

    def step_seconds(self, runner: Any, ids: list[int], reps: int) -> float | None:
        """Seconds one drafted token takes on the context ``ids`` (the
        target's ``runner`` at hand), for the draft recommendation
        (measure.forward_times), from a drafter that times itself
        (assistant.py); None: measure.py times it (a draft model, a head)."""
        return None


@dataclass
class Saved:
    """A drafter's state moved out of it (``Drafter.save``): its own, and
    the bytes it holds."""

    state: Any
    nbytes: int
