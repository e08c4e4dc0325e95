"""Plain values that leave the engine thread.

Everything here is a frozen dataclass of ints, floats, strings and tuples, so
the UI (and any thread) can hold them without touching MLX.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from specchat.engine.modes import HYBRID

FinishReason = Literal["stop", "length", "stop_string", "cancelled", "error"]

# Where each token of a reply came from (StepEvent.origins, Summary.tokens_by_origin):
# the target's own choice, or an accepted draft token by the source that drafted it.
TARGET = "target"
DRAFT_MODEL = "draft"  # the small draft model
CONVERSATION = "conversation"  # copied from this conversation (prompt lookup, suffix match)
HISTORY = "history"  # copied from the user's earlier conversations (suffix match)
ORIGIN_LABELS = {
    TARGET: "target",
    DRAFT_MODEL: "draft model",
    CONVERSATION: "this conversation",
    HISTORY: "your history",
}


@dataclass(frozen=True)
class SamplingParams:
    """The sampling settings; the *processed* distribution (top-p, then top-k,
    then temperature, as in mlx-lm's sampler) is what acceptance compares."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class DraftSettings:
    """How speculation runs for one request.

    mode: a name in modes.MODES (plain: the target only; draft: the draft
    model; lookup: prompt lookup, no draft model; hybrid: lookup when the
    context has a match, the draft model otherwise). k: None for adaptive,
    or a fixed draft length.
    """

    mode: str = HYBRID.name
    k: int | None = None
    acceptance: Literal["rejection", "equality"] = "rejection"
    # Break-even auto-off (draft_policy.BreakEven): decode plainly while
    # speculating is measured slower than plain decoding here. It stands
    # aside for a fixed K and for seeded sampling (which stays reproducible).
    auto_off: bool = True


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class GenerateRequest:
    """One reply to produce. Either ``messages`` (rendered with the chat
    template) or ``prompt_ids`` (used as they are)."""

    messages: tuple[Message, ...] = ()
    prompt_ids: tuple[int, ...] | None = None
    max_tokens: int = 512
    sampling: SamplingParams = SamplingParams()
    draft: DraftSettings = DraftSettings()
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()  # extra end tokens besides EOS/end-of-turn
    # The conversation this reply belongs to (the caller's key, e.g. the
    # store's id): the history index leaves it out of history matches (it is
    # the conversation itself) and, when the reply ends, stores it under it.
    history_key: str | None = None


@dataclass(frozen=True)
class StepEvent:
    """One verify step: what the target kept and how the draft did.

    origins has one entry per new token: "target" for the token the target
    itself chose (correction or bonus), otherwise the source of the accepted
    draft token: "draft" (the draft model), "conversation" or "history" (see
    ORIGIN_LABELS).
    pieces has the text each token released (""-joined it is ``text``); a
    token that ends inside a multi-byte character or a possible stop string
    releases nothing, and the token that completes it releases it all.
    """

    index: int
    token_ids: tuple[int, ...]
    text: str
    origins: tuple[str, ...]
    drafted: int
    accepted: int
    k: int
    drafter: str | None
    step_s: float
    elapsed_s: float
    total_tokens: int
    pieces: tuple[str, ...] = ()
    # Auto-off had speculation paused: this step decoded plainly (K = 0)
    # because speculating was measured slower than plain decoding here.
    paused: bool = False
    # A step that speculated while paused, to see whether it pays again
    # (speculation stays paused unless it did).
    probe: bool = False


@dataclass(frozen=True)
class Summary:
    mode: str
    finish_reason: str
    new_tokens: int
    steps: int
    drafted: int
    accepted: int
    acceptance_rate: float
    tokens_per_step: float
    tokens_per_s: float
    ttft_s: float
    wall_s: float
    prompt_tokens: int
    reused_prompt_tokens: int
    prefill_s: float
    forward_s: float
    overhead_s: float
    drafted_by: dict = field(default_factory=dict)
    # emitted tokens per origin ("target", "draft", "conversation", "history")
    tokens_by_origin: dict = field(default_factory=dict)
    # steps (and prefill chunks) run at each BLAS thread count (engine/threads.py)
    blas_threads: dict = field(default_factory=dict)
    # steps decoded plainly because auto-off had paused speculation
    paused_steps: int = 0
    # what auto-off measured (draft_policy.BreakEven.report); empty when it was off
    auto_off: dict = field(default_factory=dict)
    # Speculative speculative decoding (ssd.py; zero in other modes): steps
    # whose block was drafted while the last one was verified (hits), drafted
    # the ordinary way after a wrong guess (misses) or with nothing speculated
    # (fallbacks); draft forward seconds hidden behind verification, of all
    # draft seconds behind the verified blocks (overlap = hidden / draft);
    # the worker's forward seconds, used or not.
    ssd_hits: int = 0
    ssd_misses: int = 0
    ssd_fallbacks: int = 0
    ssd_overlap: float = 0.0
    ssd_hidden_s: float = 0.0
    ssd_draft_s: float = 0.0
    ssd_spec_s: float = 0.0

    def stats_dict(self) -> dict:
        keys = (
            "new_tokens",
            "steps",
            "drafted",
            "accepted",
            "acceptance_rate",
            "tokens_per_step",
            "tokens_per_s",
            "ttft_s",
            "wall_s",
        )
        return {k: getattr(self, k) for k in keys}


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: tuple[int, ...]
    summary: Summary

    def to_json(self) -> dict:
        return {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "mode": self.summary.mode,
            "finish_reason": self.summary.finish_reason,
            "stats": self.summary.stats_dict(),
        }


@dataclass(frozen=True)
class ModelInfo:
    """What the UI and CLI need to know about a loaded model."""

    name: str
    path: str
    model_type: str
    n_params: int
    weight_bytes: int
    dtype: str
    vocab_size: int
    trimmable: bool
    untrimmable_reason: str | None


@dataclass(frozen=True)
class ComputeInfo:
    device: str  # "gpu" or "cpu"
    dtype: str  # "float32", "float16", "bfloat16" or "q4"
    blas: str  # "blis", "openblas", "accelerate", "bundled", or a library path
    note: str = ""


@dataclass(frozen=True)
class LoadedPair:
    target: ModelInfo
    draft: ModelInfo | None
    compute: ComputeInfo
    speculative_ok: bool
    reason: str | None  # why speculative decoding with the draft is unavailable


@dataclass(frozen=True)
class LoadProgress:
    stage: str  # "target", "draft"
    message: str
    fraction: float | None = None

