"""Compare's engine side: one prompt, plain then speculative, same settings.

Both runs go one after the other through the engine thread, so the only
difference between them is the decoding mode; with greedy sampling the two
texts must be identical. The dialog (compare.py) only shows the outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specchat.engine import modes
from specchat.engine.errors import EngineError
from specchat.engine.events import GenerationResult, Message
from specchat.ui.conversation import ConversationController
from specchat.ui.requests import build_request, reply_summary
from specchat.ui.session import AppSession

NO_SPECULATION = ("This pair cannot decode speculatively, so there is nothing to compare.")


@dataclass(frozen=True)
class CompareOutcome:
    prompt: str
    plain: GenerationResult
    speculative: GenerationResult
    greedy: bool

    @property
    def speedup(self) -> float:
        base = self.plain.summary.tokens_per_s
        return self.speculative.summary.tokens_per_s / base if base else 0.0

    @property
    def identical(self) -> bool:
        return self.plain.token_ids == self.speculative.token_ids


class CompareRunner:
    def __init__(self, session: AppSession, conversation: ConversationController):
        """``conversation``: the window's, whose reply must not be running."""
        self.session = session
        self.conversation = conversation

    @property
    def busy(self) -> bool:
        return self.conversation.busy

    async def run(self, prompt: str,
                  on_phase: Callable[[modes.Mode], None] | None = None) -> CompareOutcome:
        """The same prompt, plain then speculative; ``on_phase`` hears
        each mode as its run starts. Raises EngineError."""
        engine, settings = self.session.engine, self.session.settings
        spec_mode = self.session.next_mode(speculative=True)
        if not spec_mode.speculative:
            raise EngineError(engine.pair.reason if engine.pair and engine.pair.reason
                              else NO_SPECULATION)
        history = [Message("user", prompt.strip())]
        results = []
        for mode in (self.session.next_mode(speculative=False), spec_mode):
            if on_phase is not None:
                on_phase(mode)
            results.append(await engine.run(build_request(settings, history, mode)))
        self.session.plain_speeds.note(engine.pair_key, reply_summary(results[0].summary))
        return CompareOutcome(prompt, results[0], results[1], settings.temperature <= 0)
