"""The words of a reply's Thinking section, for the chat and for Compare:
its toggle's text, tooltip and accessible description, and the note that
stands where an answer never came. No Qt."""

from __future__ import annotations

from specchat.store.summary import PART_NAMES, REASONING, PartNumbers, ReplySummary

OPEN, FOLDED = "▾", "▸"


def numbers_text(numbers: PartNumbers | None) -> str:
    """ "412 tokens · 9.3 s" (nothing before the first count)."""
    return numbers.counts() if numbers is not None and numbers.tokens else ""


def toggle_text(numbers: PartNumbers | None, thinking: bool, shown: bool,
                unfinished: bool = False) -> str:
    """ "▸ Thinking · 412 tokens · 9.3 s": "Thinking…" while the reasoning
    streams, "(unfinished)" for one the reply ended inside."""
    name = "Thinking…" if thinking else "Thinking (unfinished)" if unfinished else "Thinking"
    counts = numbers_text(numbers)
    return f"{OPEN if shown else FOLDED} {name}" + (f" · {counts}" if counts else "")


def toggle_tip(numbers: PartNumbers | None, shown: bool) -> str:
    """How the reasoning was decoded, and what a click does."""
    what = ("Hide what the model reasoned before its answer" if shown
            else "Show what the model reasoned before its answer")
    return what + (f"\n{numbers.text(PART_NAMES[REASONING])}" if numbers is not None else "")


def description(numbers: PartNumbers | None, shown: bool) -> str:
    """For a screen reader: what the section holds, and whether it is open."""
    counts = numbers_text(numbers).replace(" · ", ", ").replace(" s", " seconds")
    return (f"The model's reasoning{', ' + counts if counts else ''}; "
            f"{'shown' if shown else 'folded'}. Space {'folds' if shown else 'shows'} it.")


def no_answer(summary: ReplySummary | None) -> str:
    """What stands in a reply that reasoned and gave no answer."""
    if summary is None:  # it failed, or the app closed, while it thought
        return "No answer: the reply ended while thinking."
    if summary.cut_off():
        return f"No answer: the reply {summary.cut_off()}."
    return "No answer: the model wrote none after its reasoning."
