"""The thinking switch's rules: what it offers for the loaded model, what a
conversation's choice asks the engine for, and why it is off. No Qt (the
options bar only shows them; tests call them without a window).

A conversation keeps one word (``Conversation.reasoning_effort``): "" for
the model's default, or one of the engine's reasoning efforts
(``chat_rules.EFFORTS``). The engine maps an effort onto the template's
own switch (``chat_rules.template_variables``): an on/off switch
(``enable_thinking``: Qwen3 and most thinking models) is off for "none",
a level switch (gpt-oss's ``reasoning_effort``) takes low, medium or high.
So the same conversation, opened on another model, asks it for the
nearest thing it has: off becomes the lowest level, a level becomes on.
"""

from __future__ import annotations

from dataclasses import dataclass

from specchat.engine import chat_rules
from specchat.engine.events import ChatFormat

OFF = "none"
NO_MODEL = "Load a model first: whether it can think, and be told not to, is the model's."
ALWAYS = ("This model always thinks before it answers: its chat template has no switch to "
          "turn that off or down.")
NEVER = ("This model does not think before it answers (neither its tokenizer's markers nor "
         "its chat template say it does), so there is nothing to switch.")


@dataclass(frozen=True)
class Choice:
    label: str
    effort: str  # what the conversation keeps when it is chosen
    tip: str


def choices(fmt: ChatFormat | None) -> list[Choice]:
    """What the switch offers for a model (empty: it has no switch)."""
    if fmt is None or not fmt.effort:
        return []
    if fmt.effort in chat_rules.ON_OFF_SWITCHES:
        return [Choice("Thinking on", "", "The model reasons before it answers (its default)"),
                Choice("Thinking off", OFF, f"The model answers at once: its template's "
                                            f"{fmt.effort} is false")]
    levels = [Choice(f"Thinking: {level}", level, f"The model's {fmt.effort} is {level}")
              for level in chat_rules.EFFORT_LEVELS]
    return [Choice("Thinking: default", "", "The level the model's template chooses"), *levels]


def unavailable(fmt: ChatFormat | None) -> str:
    """Why the switch is off for this model, in words; "" when it has one."""
    if fmt is None:
        return NO_MODEL
    if fmt.effort:
        return ""
    return ALWAYS if fmt.reasoning else NEVER


def request_effort(fmt: ChatFormat | None, kept: str) -> str:
    """What a conversation that keeps ``kept`` asks this model for (the
    request's ``reasoning_effort``): "" for its default and for a model
    without a switch, which would refuse any other."""
    if fmt is None or not fmt.effort or not kept:
        return ""
    off = kept in chat_rules.EFFORT_OFF
    if fmt.effort in chat_rules.ON_OFF_SWITCHES:
        return OFF if off else ""
    if off:
        return chat_rules.EFFORT_LEVELS[0]  # as little as it can
    return kept if kept in chat_rules.EFFORT_LEVELS else ""


def chosen(fmt: ChatFormat | None, kept: str) -> int:
    """The index among ``choices(fmt)`` that shows what ``kept`` asks for."""
    wanted = request_effort(fmt, kept)
    offered = [c.effort for c in choices(fmt)]
    return offered.index(wanted) if wanted in offered else 0


def keeps(kept: str) -> bool:
    """Whether a word read back from the history is one a conversation may keep."""
    return kept == "" or kept in chat_rules.EFFORTS
