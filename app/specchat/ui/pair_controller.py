"""What the pair picker knows and does, with no widget: the models to
choose from, the clusters' answers, the pair's verdict, the drafts measured
for a target, and the search for the best draft.

Why apart from the widget: each of these reads files or asks the network
(the catalog and the index, tokenizer files, recommendations.json, every
cluster rank), which the GUI thread must not wait for. Here every such read
runs in the event loop's default executor and comes back as a signal; the
widget (pair_picker.py) only draws the entries pair_choices.py makes of
what this holds, and hands it clicks.
The session owns one (``AppSession.pairs``), so a picker never has to find
its session, and this can be driven and tested without any window.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from specchat.library import recommendations as rec
from specchat.library.sources.cluster import ClusterState
from specchat.store.conversations import ConversationStore
from specchat.store.worker import Remote
from specchat.ui import library_view, pair_choices
from specchat.ui.draft_finder import DraftFinder
from specchat.ui.engine_controller import EngineController
from specchat.ui.library_view import HeadFits, ModelChoice, Verdict

CLUSTER_POLL_MS = 5000  # how often the clusters' ranks are asked whether they answer
NO_TARGET = Verdict(False, ("Choose a target model.",))


def _verdict(target: str, draft: str | None) -> Verdict:
    """The library's verdict on the pair (reads tokenizer files). Refusing
    is not enough: a refusal also says which drafts would fit the target."""
    verdict = library_view.check_pair(target, draft)
    names = [n for n in library_view.suggest_drafts(target) if n != draft][:3] \
        if verdict.compatible is False else []
    if names:
        verdict = Verdict(False, (*verdict.reasons,
                                  "drafts that fit this target: " + ", ".join(names)))
    return verdict


class PairController(QObject):
    choicesChanged = Signal()  # after each reading of the choices or poll of the clusters
    verdictChanged = Signal(object)  # the Verdict of the pair last given to ``check``
    measuredChanged = Signal()  # remembered measurements were read again
    headsChanged = Signal()  # which draft heads fit a target was worked out again

    def __init__(self, engine: EngineController, conversations: Remote[ConversationStore],
                 parent: QObject | None = None):
        """``conversations``: the history, whose recent prompts a search measures."""
        super().__init__(parent)
        self.engine = engine
        self.choices: list[ModelChoice] = []  # built-in, installed, catalog
        self.clusters: list[ClusterState] = []  # as last polled
        self.verdict: Verdict | None = None
        self.checking: asyncio.Future | None = None  # the verdict being worked out
        self._asked = 0  # counts checks: a late answer for an older pair is dropped
        self._measured: dict[str, dict[str, rec.DraftResult]] = {}  # target -> draft -> result
        # (target, its heads) -> their verdicts; what has been asked since the choices were read
        self._heads: dict[tuple, library_view.HeadFits] = {}
        self._heads_asked: set[tuple] = set()
        self._poll: asyncio.Future | None = None
        self._closed = False
        self.finder = DraftFinder(engine, conversations, self)
        self.finder.finished.connect(self._found)
        self._timer = QTimer(self)
        self._timer.setInterval(CLUSTER_POLL_MS)
        self._timer.timeout.connect(self.poll_clusters)

    def start(self) -> None:
        """With the event loop running: read the choices, ask the clusters
        now and every CLUSTER_POLL_MS."""
        self.reload_choices()
        self.poll_clusters()
        self._timer.start()

    def close(self) -> None:
        """Nothing more is asked, and answers still on their way are dropped."""
        self._closed = True
        self._timer.stop()
        self.finder.cancel()

    def _off_thread(self, fn: Callable[..., Any], *args: Any,
                    then: Callable[[Any], None]) -> asyncio.Future | None:
        """``fn(*args)`` in the default executor, its result to ``then`` on
        the GUI thread; the future is done once ``then`` ran. None when no
        event loop runs (outside the app)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None

        async def work() -> None:
            result = await loop.run_in_executor(None, fn, *args)
            if not self._closed:
                then(result)

        return asyncio.ensure_future(work())

    @property
    def loaded_target(self) -> str | None:
        """The target the engine serves now (a cluster it serves does not
        answer probes: the picker says "loaded" instead)."""
        return self.engine.target_ref if self.engine.pair is not None else None

    def listing(self) -> pair_choices.Listing:
        """What the picker's lists are made of now (pair_choices.py makes them)."""
        return pair_choices.Listing(tuple(self.choices), tuple(self.clusters), self.loaded_target)

    # -- choices -----------------------------------------------------------------
    def reload_choices(self) -> asyncio.Future | None:
        """Read the models to choose from again (after an import, a download
        or a deletion)."""
        return self._off_thread(library_view.model_choices, then=self._got_choices)

    def _got_choices(self, choices: list[ModelChoice]) -> None:
        self.choices = choices
        self._heads_asked.clear()  # a head's files may have changed: asked again when shown
        self.choicesChanged.emit()

    def poll_clusters(self) -> asyncio.Future | None:
        """Ask the clusters' ranks whether they answer (one poll at a time)."""
        if self._poll is None or self._poll.done():
            self._poll = self._off_thread(library_view.cluster_states, then=self._got_clusters)
        return self._poll

    def _got_clusters(self, states: list[ClusterState]) -> None:
        self.clusters = states
        self.choicesChanged.emit()  # every poll: the picker may have waited for a quiet moment

    # -- the verdict -------------------------------------------------------------
    def check(self, target: str | None, draft: str | None) -> asyncio.Future | None:
        """Work out whether ``draft`` can speculate for ``target`` (and, if
        not, which drafts would); ``verdictChanged`` follows, unless another
        pair is checked meanwhile. None when it is known at once."""
        self._asked += 1
        asked = self._asked
        if not target:
            self._set_verdict(asked, NO_TARGET)
            return None
        self.checking = self._off_thread(_verdict, target, draft,
                                         then=lambda verdict: self._set_verdict(asked, verdict))
        return self.checking

    def _set_verdict(self, asked: int, verdict: Verdict) -> None:
        if asked == self._asked:
            self.verdict = verdict
            self.verdictChanged.emit(verdict)

    # -- measured drafts ---------------------------------------------------------
    def measured(self, target: str | None) -> dict[str, rec.DraftResult]:
        """The drafts measured for ``target`` on this machine, by reference,
        as last read; they are read again now, and ``measuredChanged`` says
        if they differ (a terminal may have measured meanwhile)."""
        if not target:
            return {}
        self._off_thread(rec.remembered, target, then=lambda got: self._got_measured(target, got))
        return self._measured.get(target, {})

    def _got_measured(self, target: str, got: dict[str, rec.DraftResult]) -> None:
        if got != self._measured.get(target, {}):
            self._measured[target] = got
            self.measuredChanged.emit()

    # -- draft heads -------------------------------------------------------------
    def heads(self, target: str | None) -> HeadFits | None:
        """Which installed draft heads draft for ``target`` (each with its
        verdict), as last worked out. Worked out (it reads their files) once
        per target and set of heads, and again after the choices are read
        again; ``headsChanged`` says when an answer arrives."""
        heads = pair_choices.heads(self.choices)
        if not target or not heads:
            return None
        key = (target, heads)
        if key not in self._heads_asked:
            self._heads_asked.add(key)
            self._off_thread(library_view.head_fits, target, heads,
                             then=lambda got: self._got_heads(key, got))
        return self._heads.get(key)

    def _got_heads(self, key: tuple, got: HeadFits) -> None:
        if key in self._heads_asked and got != self._heads.get(key):  # else: asked before a reread
            self._heads[key] = got
            self.headsChanged.emit()

    def _found(self, outcome: rec.Recommendation) -> None:
        """What was just measured is what is remembered now."""
        self._measured.setdefault(outcome.target, {}).update(
            {r.draft: r for r in outcome.ranked})
