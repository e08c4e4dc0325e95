"""Plain values that leave the engine thread.

Everything here is a frozen dataclass of ints, floats, strings and tuples, so
the UI (and any thread) can hold them without touching MLX.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from specchat import values

FinishReason = Literal["stop", "length", "stop_string", "cancelled", "error", "tool_calls"]

# The parts a reply is split into (engine/reply_parts.py): the model's
# reasoning, its answer, and the tool calls it writes. Each token of a reply
# is labelled with one of them, each piece of its text belongs to one.
REASONING, ANSWER, TOOL = "reasoning", "answer", "tool"
PARTS = (REASONING, ANSWER, TOOL)


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
    model; suffix: suffix matches, no draft model; hybrid: per step, a
    suffix match, the draft model or both). k: None for adaptive, or a
    fixed draft length.
    """

    mode: str = "hybrid"  # modes.HYBRID (a test keeps them the same)
    k: int | None = None
    acceptance: Literal["rejection", "equality"] = "rejection"
    # Break-even auto-off (auto_off.BreakEven): decode plainly while
    # speculating is measured slower than plain decoding here. It stands
    # aside for a fixed K and for seeded sampling (which stays reproducible).
    auto_off: bool = True


@dataclass(frozen=True)
class ToolCall:
    """A call of one of a request's tools: made in an earlier assistant
    turn, or read from a reply. ``arguments`` is JSON text of an object, as
    OpenAI's API carries it (plain text crosses threads; the chat template
    gets it parsed)."""

    id: str
    name: str
    arguments: str = "{}"


@dataclass(frozen=True)
class Message:
    """One turn of a conversation. Beside its text, an assistant turn may
    carry the reasoning it wrote before its answer and the tool calls it
    made; a ``tool`` turn is the result of the call ``tool_call_id`` names.
    The defaults are a plain turn, as every caller made them before tools."""

    role: str
    content: str
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""


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
    # Tools the model may call: JSON text of a list of tools in OpenAI's
    # shape ({"type": "function", "function": {"name", "description",
    # "parameters"}}), "" for none; rendered by the model's chat template.
    tools: str = ""
    # "auto" (the model decides), "none" (the tools are not offered, and a
    # call the model writes anyway is returned as text), "required" (the
    # reply starts with a call: of ``tool_name`` if one is named).
    tool_choice: Literal["auto", "none", "required"] = "auto"
    tool_name: str = ""
    # False: the reply ends after its first tool call.
    parallel_tool_calls: bool = True
    # Variables for the chat template that switch what it writes
    # (transformers' and mlx-lm's ``chat_template_kwargs``): (name, JSON
    # scalar) pairs, each one a variable the template reads.
    template_switches: tuple[tuple[str, bool | int | float | str | None], ...] = ()
    # OpenAI's reasoning_effort ("none", "minimal", "low", "medium", "high",
    # "xhigh"), mapped onto the template's own switch (ChatFormat.effort); ""
    # leaves the template's default.
    reasoning_effort: str = ""


@dataclass(frozen=True)
class StepEvent:
    """One verify step: what the target kept and how the draft did.

    origins has one entry per new token: "target" for the token the target
    itself chose (correction or bonus), otherwise the source of the accepted
    draft token by the origin its drafter names (specchat/origins.py:
    "draft", "conversation", "history", ...).
    pieces has the text each token released (""-joined it is ``text``); a
    token that ends inside a multi-byte character, a possible stop string
    or a possible marker releases nothing, and the token that completes it
    releases it all.
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
    # The reply's tokens per origin so far, this step's included: the
    # engine counts them, the gauges show them.
    origin_totals: tuple[tuple[str, int], ...] = ()
    # ``text`` split into the reply's parts, in order: (part, text) with
    # part one of PARTS, marker tokens (``<think>``, ``<tool_call>``) left
    # out. A tool call's raw text streams as TOOL; the call itself arrives
    # in ``tool_calls`` of the step that completes it, or, if it cannot be
    # read, as ANSWER text of that step.
    segments: tuple[tuple[str, str], ...] = ()
    # The part of each token in ``token_ids`` (a marker token belongs to
    # the part it opens or closes), to count speed and acceptance per part.
    parts: tuple[str, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()


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
    # what auto-off measured (auto_off.BreakEven.report); empty when it was off
    auto_off: dict = field(default_factory=dict)
    # A drafter's own counts for this request, by drafter kind (ssd/'s
    # hits, misses and overlap); each drafter names its fields (Drafter.stats).
    drafter_stats: dict = field(default_factory=dict)
    # How each part of the reply was decoded (engine/part_stats.py), by part
    # (REASONING, ANSWER, TOOL): {"tokens", "seconds", "drafted", "accepted",
    # "first_s", "tokens_by_origin"}; only the parts it had.
    by_part: dict = field(default_factory=dict)
    # The reply ended inside its reasoning (cut off, stopped, or the model
    # ended it there): it has no answer after it.
    ended_in_reasoning: bool = False

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
    """A whole reply. ``text`` is everything it wrote, markers included;
    ``answer``, ``reasoning`` and ``tool_calls`` are its parts
    (engine/reply_parts.py). ``notes`` says in words what did not go as
    asked (a tool call that could not be read, a required call the model
    did not make). ``stop_string``: the stop string that ended the reply,
    if one did."""

    text: str
    token_ids: tuple[int, ...]
    summary: Summary
    answer: str | None = None  # None: the reply was not split, its answer is ``text``
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    notes: tuple[str, ...] = ()
    parts: tuple[str, ...] = ()  # each token's part, aligned with token_ids
    stop_string: str = ""

    def __post_init__(self):
        if self.answer is None:
            object.__setattr__(self, "answer", self.text)

    def to_json(self) -> dict:
        return {
            "text": self.text,
            "answer": self.answer,
            "reasoning": self.reasoning,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                           for c in self.tool_calls],
            "notes": list(self.notes),
            "token_ids": list(self.token_ids),
            "mode": self.summary.mode,
            "finish_reason": self.summary.finish_reason,
            "stats": self.summary.stats_dict(),
            # each part's tokens, seconds and acceptance (engine/part_stats.py)
            "by_part": self.summary.by_part,
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
    # "blocks": attention over 2+ rows by engine/attention.py (the CPU); "mlx": MLX's own
    attention: str = "mlx"


@dataclass(frozen=True)
class ChatFormat:
    """What the target's chat template and tokenizer do with tools and
    reasoning (engine/chat_format.py reads it at load), so that a request
    can be checked, and refused in words, before it waits for its turn.

    tools: the template reads ``tools``. tool_format: how replies write a
    call: one of mlx-lm's tool parsers ("json_tools", "qwen3_coder", ...),
    "harmony" (gpt-oss's channels), or "" (none SpecChat can read).
    reasoning: "markers" (a thinking start and end, mlx-lm's
    ``has_thinking``), "harmony", or "". reasoning_key: the message key
    the template reads an earlier turn's reasoning from ("" if it reads
    none). switches: the variables a request may set (those the template
    reads that are not the conversation itself). effort: the switch
    reasoning_effort maps onto ("" if none)."""

    template: bool = False
    tools: bool = False
    tool_format: str = ""
    reasoning: str = ""
    reasoning_key: str = ""
    switches: tuple[str, ...] = ()
    effort: str = ""

    @property
    def calls_tools(self) -> bool:
        """Tools reach the model and its calls can be read back."""
        return self.tools and bool(self.tool_format)


@dataclass(frozen=True)
class LoadedPair:
    target: ModelInfo
    draft: ModelInfo | None
    compute: ComputeInfo
    speculative_ok: bool
    reason: str | None  # why speculative decoding with the draft is unavailable
    mtp: bool = False  # the target ships an MTP head that can draft for it (modes.MTP)
    own_head: bool = False  # the draft chosen is that head (``--draft mtp``): no draft model
    # A draft head loaded beside a draft model (``specchat bench --head``);
    # a head chosen as the draft is ``draft``, and ``draft_is_head``.
    head: ModelInfo | None = None
    chat: ChatFormat = ChatFormat()  # the target's tools and reasoning
    draft_is_head: bool = False

    def loaded(self) -> set[str]:
        """What drafters can use (drafter_kinds.DrafterKind.needs): "draft"
        for the pair's draft, "head" for a draft head (the draft or one
        beside it), "mtp" for the target's own head when it was chosen."""
        have = set()
        if self.draft is not None:
            have.add("draft")
        if self.head is not None or self.draft_is_head:
            have.add("head")
        if self.own_head:
            have.add("mtp")
        return have


@dataclass(frozen=True)
class LoadProgress:
    stage: str  # "target", "draft"
    message: str
    fraction: float | None = None


TRAINING_STATE = "specchat-training.json"  # beside a head being trained: where a run resumes
TRAINING_OPTIMIZER = "optimizer.safetensors"  # beside it: the optimizer's state, to resume
# A training checkpoint's files beside a head's own: for resuming, not part
# of the head (its size and parameters leave them out: library/facts.py).
CHECKPOINT_FILES = (TRAINING_STATE, TRAINING_OPTIMIZER)


@dataclass(frozen=True)
class TrainPlan:
    """What ``EngineClient.train_head`` trains (engine/head_training.py)."""

    samples: tuple[tuple[Message, ...], ...]  # chats to label and learn from
    out: str  # the head's folder
    minutes: float = 60.0
    seq_len: int = 512  # tokens the target labels in one forward
    train_len: int = 128  # tokens one update learns from (a window of a labelled piece)
    passes: float = 4.0  # updates per labelled token, on average (labelling is the cost)
    buffer_tokens: int = 200_000  # labelled tokens kept for those updates (oldest go first)
    draft_vocab: int = 8192
    intermediate: int = 0  # the head's MLP width (0: twice the target's hidden size)
    steps: int = 3  # draft positions trained (training-time test depth)
    lr: float = 5e-4
    warmup: int = 30  # updates over which the learning rate rises from 0
    clip: float = 1.0  # gradients clipped to this norm (a bad window cannot undo the rest)
    seed: int = 0
    checkpoint_s: float = 120.0
    held_out: float = 0.1  # share of samples kept out for the acceptance report
    max_steps: int | None = None  # stop after this many updates in all, too (a reproducible run)
    held_pieces: int = 16  # held-out pieces the acceptance is measured on
    # requests the target answers itself (each ends in a user turn), and its longest reply
    requests: tuple[tuple[Message, ...], ...] = ()
    reply_tokens: int = 192
    # Start over in ``out`` instead of going on from the checkpoint there
    # (a damaged one, or one for another target), and how the caller says
    # so to a person ("to start over, ..."): the command line's option, the
    # window's checkbox.
    restart: bool = False
    restart_how: str = "train again with TrainPlan.restart set"

    def __post_init__(self) -> None:
        """The values a person types, checked (``values.BadValue``), so the
        command line, the window and any other caller are refused in the
        same words before anything is read or written."""
        for name, limit in TRAIN_VALUES.items():
            object.__setattr__(self, name, values.check(limit, getattr(self, name)))


# TrainPlan's fields that a person types: the entry of specchat.values each is checked by.
TRAIN_VALUES = {"minutes": "minutes", "max_steps": "updates", "checkpoint_s": "checkpoint seconds",
                "held_pieces": "held-out pieces", "draft_vocab": "draft vocabulary",
                "reply_tokens": "reply tokens"}


@dataclass(frozen=True)
class TrainProgress:
    """Emitted by a head-training job as it goes."""

    # "preparing", "measuring" (the held-out pieces labelled, before the
    # budget starts), "labelling" (a piece done), "training", "checkpoint", "done"
    stage: str
    step: int
    tokens: int  # tokens labelled by the target in all (a resumed run's included)
    elapsed_s: float  # this run's time
    budget_s: float  # this run's budget
    loss: float | None = None
    accept: tuple[float, ...] = ()  # held-out greedy acceptance of draft positions 1..steps
    resumed: bool = False
    message: str = ""
