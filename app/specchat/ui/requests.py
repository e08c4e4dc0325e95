"""Between the app's settings and the engine's values: which mode the next
reply runs in, the request that asks for it, and the summary that comes back
in the form the history keeps.

Modes come from the engine's registry (specchat.engine.modes, no MLX): the
window never compares mode names itself.
"""

from __future__ import annotations

from specchat.engine import modes
from specchat.engine.events import (
    DraftSettings,
    GenerateRequest,
    LoadedPair,
    Message,
    SamplingParams,
    Summary,
)
from specchat.store.settings import AppSettings
from specchat.store.summary import ReplySummary


def reply_mode(settings: AppSettings, pair: LoadedPair | None,
               speculative: bool | None = None) -> modes.Mode:
    """The mode a reply runs in with these settings on this pair
    (``speculative`` overrides the setting, as Compare does)."""
    on = settings.speculative if speculative is None else speculative
    has_draft = pair is not None and pair.draft is not None
    auto = modes.for_pair(on, has_draft, pair is not None and pair.speculative_ok,
                          mtp=pair is not None and pair.own_head)
    chosen = modes.MODES.get(settings.spec_mode or "")
    if auto is modes.PLAIN or chosen is None or not chosen.speculative:
        return auto
    have = pair.loaded() if pair is not None else set()
    if not chosen.needs <= have:
        # The engine would run it on its other drafters, or refuse it.
        return chosen.runs_with(have) or auto
    return chosen


def build_request(settings: AppSettings, history: list[Message],
                  mode: modes.Mode, reasoning_effort: str = "") -> GenerateRequest:
    """``reasoning_effort``: what the conversation's thinking switch asks
    the model for (ui/thinking.py), "" for its default."""
    messages = []
    if settings.system_prompt.strip():
        messages.append(Message("system", settings.system_prompt.strip()))
    messages.extend(history)
    return GenerateRequest(
        messages=tuple(messages),
        max_tokens=settings.max_tokens,
        sampling=SamplingParams(settings.temperature, settings.top_p, settings.top_k,
                                settings.seed),
        draft=DraftSettings(mode=mode.name, k=settings.k, auto_off=settings.auto_off),
        reasoning_effort=reasoning_effort,
    )


def reply_summary(summary: Summary) -> ReplySummary:
    """The engine's summary of a run, as the history saves it."""
    return ReplySummary.of(summary)
