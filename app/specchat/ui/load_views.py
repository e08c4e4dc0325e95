"""Views over the engine's loading: the progress banner (with Cancel) and
the pair in the status bar. Each follows EngineController's load signals
itself, so the window only decides what a finished or failed load means."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel

from specchat.engine import modes
from specchat.engine.events import LoadedPair
from specchat.ui.banner import Banner
from specchat.ui.engine_controller import EngineController

NO_PAIR = "No model loaded"


class LoadBanner(Banner):
    def __init__(self, engine: EngineController, parent=None):
        super().__init__("Banner", closable=False, parent=parent)
        self._models = 1  # in the pair being loaded: 2 with a draft model
        engine.loadStarted.connect(self._started)
        engine.loadProgress.connect(self._progress)
        engine.loaded.connect(self.hide)
        engine.loadFailed.connect(self.hide)
        self.button.clicked.connect(engine.cancel_load)

    def _started(self, target: str, draft: str | None) -> None:
        self._models = 2 if draft and draft != modes.OWN_HEAD else 1
        what = target + ({None: " (suffix matching)", modes.OWN_HEAD: " + its own MTP head"}
                         .get(draft, f" + {draft}"))
        self.show_message(f"Loading {what}…", None, progress=True)

    def _progress(self, stage: str, message: str, fraction: float | None) -> None:
        self.show_message(progress_line(stage, message, fraction, self._models), fraction,
                          progress=True)


def progress_line(stage: str, message: str, fraction: float | None, models: int) -> str:
    """What the library says, which of the pair's models it is about (the
    engine loads the target, then the draft) and how far along: "Preparing
    the built-in model X: converting — 40% (model 1 of 2)"."""
    parts = [message[:1].upper() + message[1:]]
    if fraction is not None:
        parts.append(f"{max(0.0, min(1.0, fraction)):.0%}")
    line = " — ".join(parts)
    if models > 1:
        line += f" (model {2 if stage == 'draft' else 1} of {models})"
    return line


def pair_name(pair: LoadedPair) -> str:
    if pair.own_head:
        return f"{pair.target.name} + its own MTP head"
    return f"{pair.target.name} + {pair.draft.name if pair.draft else 'suffix matching'}"


class PairStatus(QLabel):
    """The loaded pair and where it runs (device, dtype, BLAS)."""

    def __init__(self, engine: EngineController, parent=None):
        super().__init__(NO_PAIR, parent)
        self._engine = engine
        engine.loadStarted.connect(self._started)
        engine.loaded.connect(self._loaded)
        engine.loadFailed.connect(self._failed)

    def _started(self, *_args) -> None:
        self.setText("Loading…")

    def _loaded(self, pair: LoadedPair) -> None:
        c = pair.compute
        self.setText(f"{pair_name(pair)}  ·  {c.device} · {c.dtype} · {c.blas}")

    def _failed(self, _message: str) -> None:
        if self._engine.pair is None:
            self.setText(NO_PAIR)
