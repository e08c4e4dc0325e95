"""Plain vs speculative on the same prompt, side by side.

The runs are CompareRunner's (compare_runner.py); this dialog asks for them
and shows both replies, their speeds, and whether the texts are identical
(with greedy sampling they must be).
"""

from __future__ import annotations

import asyncio

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
)

from specchat.engine import modes
from specchat.engine.errors import EngineError
from specchat.engine.events import GenerationResult
from specchat.ui import links, theme
from specchat.ui.compare_runner import CompareOutcome, CompareRunner
from specchat.ui.markdown import COPY_SCHEME, DocColors, build_document
from specchat.ui.requests import reply_summary


class CompareDialog(QDialog):
    finished_run = Signal(object)  # CompareOutcome or None

    def __init__(self, runner: CompareRunner, prompt: str = "", parent=None):
        super().__init__(parent)
        self.setWindowTitle("SpecChat — compare plain and speculative")
        self.resize(980, 620)
        self.runner = runner
        self.prompt = QPlainTextEdit(prompt)
        self.prompt.setPlaceholderText("A prompt to run twice")
        self.prompt.setFixedHeight(70)
        self.run_button = QPushButton("Run both")
        self.run_button.setObjectName("SendButton")
        self.status = QLabel("Runs the prompt plain, then speculative, with the current settings.")
        self.status.setWordWrap(True)
        self.headline = QLabel("")
        self.headline.setObjectName("GaugeValue")
        self.headline.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.plain_text = self._reply_view()
        self.spec_text = self._reply_view()
        self._blocks: dict[QTextBrowser, list[str]] = {}  # each view's copyable code blocks
        self.plain_stats = QLabel("")
        self.spec_stats = QLabel("")
        for lab in (self.plain_stats, self.spec_stats):
            lab.setWordWrap(True)
            lab.setObjectName("GaugeLabel")
        grid = QGridLayout()
        grid.addWidget(QLabel("<b>Plain</b> (target only)"), 0, 0)
        self.spec_title = QLabel("<b>Speculative</b>")
        grid.addWidget(self.spec_title, 0, 1)
        grid.addWidget(self.plain_text, 1, 0)
        grid.addWidget(self.spec_text, 1, 1)
        grid.addWidget(self.plain_stats, 2, 0)
        grid.addWidget(self.spec_stats, 2, 1)
        top = QHBoxLayout()
        top.addWidget(self.prompt, 1)
        top.addWidget(self.run_button)
        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(self.status)
        lay.addWidget(self.headline)
        lay.addLayout(grid, 1)
        self.run_button.clicked.connect(self.start)
        self.task: asyncio.Future | None = None
        self.outcome: CompareOutcome | None = None

    def _reply_view(self) -> QTextBrowser:
        """A read-only view of a model's reply: the browser follows no link
        itself (``_link`` decides), so nothing but http(s) ever opens."""
        view = QTextBrowser()
        view.setOpenLinks(False)
        view.setOpenExternalLinks(False)
        view.anchorClicked.connect(lambda url, v=view: self._link(v, url))
        return view

    def _link(self, view: QTextBrowser, url: QUrl) -> None:
        href = url.toString()
        if href.startswith(COPY_SCHEME):
            blocks = self._blocks.get(view, [])
            n = href[len(COPY_SCHEME):]
            if n.isdigit() and int(n) < len(blocks):
                QGuiApplication.clipboard().setText(blocks[int(n)])
                self.status.setText("Code copied to the clipboard")
            return
        self.status.setText(links.open_link(href))

    def start(self) -> None:
        text = self.prompt.toPlainText().strip()
        if not text or (self.task and not self.task.done()):
            return
        if self.runner.busy:
            self.status.setText("A reply is still being written; try again when it is done.")
            return
        self.run_button.setEnabled(False)
        self.headline.setText("")
        self.plain_text.clear()
        self.spec_text.clear()
        self.plain_stats.clear()
        self.spec_stats.clear()
        self.task = asyncio.ensure_future(self._run(text))

    def _phase(self, mode: modes.Mode) -> None:
        self.status.setText(f"Running {mode.name}…")

    async def _run(self, text: str) -> None:
        outcome = None
        try:
            outcome = await self.runner.run(text, self._phase)
        except EngineError as exc:
            self.status.setText(str(exc))
        else:
            self.show_outcome(outcome)
        finally:
            self.run_button.setEnabled(True)
            self.outcome = outcome
            self.finished_run.emit(outcome)

    def _fill(self, view: QTextBrowser, stats: QLabel, result: GenerationResult) -> None:
        # The chat's rendering (ui/markdown.py), not QTextBrowser.setMarkdown,
        # which passes the reply's raw HTML through and loads its images.
        c = theme.current()
        doc, blocks = build_document(result.text, view.font(),
                                     DocColors(text=c.text, code_bg=c.code_bg,
                                               code_header=c.code_header, link=c.link))
        doc.setParent(view)  # the view does not own a document it did not make
        doc.setDocumentMargin(4)
        view.setDocument(doc)
        self._blocks[view] = blocks
        stats.setText(reply_summary(result.summary).line())

    def show_outcome(self, o: CompareOutcome) -> None:
        self._fill(self.plain_text, self.plain_stats, o.plain)
        self._fill(self.spec_text, self.spec_stats, o.speculative)
        self.spec_title.setText(f"<b>Speculative</b> ({o.speculative.summary.mode})")
        p, s = o.plain.summary.tokens_per_s, o.speculative.summary.tokens_per_s
        same = ("identical texts" if o.identical else "different texts")
        if o.greedy:
            same += " (greedy: they should be identical)" if not o.identical else " ✓"
        else:
            same += " (sampling with temperature: texts may differ)"
        self.headline.setText(f"{p:.1f} → {s:.1f} tok/s   speedup ×{o.speedup:.2f}   ·   {same}")
        self.status.setText(
            f"Acceptance {o.speculative.summary.acceptance_rate:.0%}, "
            f"{o.speculative.summary.tokens_per_step:.2f} tokens per step.")
