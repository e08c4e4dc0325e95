"""Plain vs speculative on the same prompt, side by side.

The runs are CompareRunner's (compare_runner.py); this dialog asks for them
and shows both replies as they stream, their speeds, and whether the texts
are identical (with greedy sampling they must be), both speeds over time on
one chart, and in words why speculation won or lost (``speed_explanation``).
Steps are coalesced as in the chat (reply.FLUSH_S), so a fast engine cannot
flood the window. Cancel, or closing the dialog, stops the run going on and
skips the rest.

A reply that reasons shows its reasoning as the chat does: in a Thinking
section above its answer (plain text, appended as it streams, folded once
the answer starts), and each run's numbers per part, so the two runs'
reasoning and answers compare apart.
"""

from __future__ import annotations

import asyncio

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import (
    QDialog,
    QGridLayout,
    QLabel,
    QPlainTextEdit,
    QTextBrowser,
    QWidget,
)

from specchat.engine import modes
from specchat.engine.events import ANSWER, REASONING, GenerationResult, StepEvent, Summary
from specchat.engine.part_stats import PartCounter
from specchat.errors import SpecChatError
from specchat.store.summary import PART_NAMES, PartNumbers, ReplySummary
from specchat.ui import links, theme
from specchat.ui import thinking_header as words
from specchat.ui.charts import SpeedChart
from specchat.ui.chat_view import ThinkingToggle
from specchat.ui.compare_runner import CompareOutcome, CompareRunner
from specchat.ui.markdown import DocColors, build_document
from specchat.ui.reply import FLUSH_S
from specchat.ui.requests import reply_summary
from specchat.ui.stats import SpeedTrace, part_numbers
from specchat.ui.widgets import button, hbox, label, vbox

HIGH_ACCEPTANCE = 0.6  # above it, a slow speculative run is the steps' cost, not rejections
EVEN = 0.03  # within 3% of plain: "about as fast"


def speed_explanation(plain: Summary, spec: Summary) -> str:
    """Why speculation was faster or slower than plain, in words, from the
    two runs' measured costs: a speculative step must take less than
    (tokens it keeps) x (one plain token's time) to pay. Empty when a run
    has too little to say it from."""
    if plain.tokens_per_s <= 0 or spec.tokens_per_s <= 0 or spec.steps <= 0:
        return ""
    plain_ms = 1000 / plain.tokens_per_s
    step_ms = 1000 * spec.new_tokens / spec.tokens_per_s / spec.steps
    per_step = spec.new_tokens / spec.steps
    spec_ms = step_ms / per_step
    even_ms = per_step * plain_ms
    speedup = spec.tokens_per_s / plain.tokens_per_s
    costs = (f"each speculative step took {step_ms:.0f} ms for {per_step:.2f} tokens "
             f"({spec_ms:.0f} ms a token) vs {plain_ms:.0f} ms per plain token")
    if spec.drafted == 0:
        return (f"Nothing was drafted (nothing in the context matched), so every step kept one "
                f"token: {costs}.")
    if speedup < 1 - EVEN:
        why = (f"acceptance was high ({spec.acceptance_rate:.0%}), so the cost is the steps "
               "themselves: drafting and verifying took longer than usual (a busy machine, "
               "or a draft too large for this target)"
               if spec.acceptance_rate >= HIGH_ACCEPTANCE else
               f"only {spec.acceptance_rate:.0%} of drafted tokens were accepted, so most "
               "steps paid for drafts they threw away")
        return (f"The draft costs more than it saves here: {costs}. A step would have to take "
                f"under {even_ms:.0f} ms to break even; {why}.")
    if speedup <= 1 + EVEN:
        return f"About as fast as plain: {costs}; the draft's cost and savings cancel out."
    return (f"Speculation pays here: {costs}, at {spec.acceptance_rate:.0%} acceptance "
            f"(a step pays while it takes under {even_ms:.0f} ms).")


def parts_headline(plain: ReplySummary, spec: ReplySummary) -> str:
    """ "thinking 30.1 → 45.2 tok/s · answer 31.0 → 50.3 tok/s": each part's
    speed in both runs, for replies that reasoned; "" otherwise."""
    out = []
    for part, name in PART_NAMES.items():
        a, b = plain.part(part), spec.part(part)
        if a is not None and b is not None and (plain.reasoned or spec.reasoned):
            out.append(f"{name} {a.tokens_per_s:.1f} → {b.tokens_per_s:.1f} tok/s")
    return " · ".join(out)


class ThinkingPane(QWidget):
    """A run's reasoning above its answer: the toggle (with its length and
    time) and the text, appended as it streams; open while the reasoning
    streams, folded when the answer starts, unless the person chose."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.toggle = ThinkingToggle()
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setMaximumHeight(120)
        self.text.setAccessibleName("Thinking")
        vbox(self.toggle, self.text, parent=self, margins=0, spacing=2)
        self.toggle.toggled.connect(self._toggled)
        self.reset()

    def reset(self) -> None:
        self.reasoning = ""
        self.answering = False
        self.chosen: bool | None = None
        self.text.clear()
        self.hide()

    def _toggled(self, on: bool) -> None:
        self.chosen = on
        self.text.setVisible(on)

    def add(self, text: str) -> None:
        """More reasoning: appended, not set again."""
        self.reasoning += text
        cursor = self.text.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text)

    def show_numbers(self, numbers: PartNumbers | None, streaming: bool,
                     unfinished: bool = False) -> None:
        if not self.reasoning.strip():
            self.hide()
            return
        shown = self.chosen if self.chosen is not None else streaming and not self.answering
        self.toggle.show_state(words.toggle_text(numbers, streaming and not self.answering,
                                                 shown, unfinished),
                               words.toggle_tip(numbers, shown),
                               words.description(numbers, shown), shown)
        self.text.setVisible(shown)
        self.show()


class CompareDialog(QDialog):
    finished_run = Signal(object)  # CompareOutcome or None

    def __init__(self, runner: CompareRunner, prompt: str = "", parent=None):
        super().__init__(parent)
        self.setWindowTitle("Compare plain and speculative — SpecChat")
        self.resize(980, 620)
        self.runner = runner
        self.prompt = QPlainTextEdit(prompt)
        self.prompt.setPlaceholderText("A prompt to run twice")
        self.prompt.setFixedHeight(70)
        self.run_button = button("Run both", name="SendButton", clicked=self.start)
        self.cancel_button = button("Cancel", "Stop the run going on now and skip the rest",
                                    clicked=self.cancel)
        self.cancel_button.setEnabled(False)
        self.status = label("Runs the prompt plain, then speculative, with the current settings.",
                            wrap=True)
        self.headline = label(name="GaugeValue", selectable=True)
        self.explanation = label(wrap=True, selectable=True)
        self.chart = SpeedChart(legend=True)
        self.chart.setFixedHeight(150)
        self.chart.setToolTip("Tokens per second over time (the last 2 seconds at each step), "
                              "plain and speculative on the same prompt")
        self.traces: dict[str, SpeedTrace] = {}
        self.plain_text = self._reply_view()
        self.spec_text = self._reply_view()
        self.plain_thinking = ThinkingPane()
        self.spec_thinking = ThinkingPane()
        self._thinking = {self.plain_text: self.plain_thinking,
                          self.spec_text: self.spec_thinking}
        self._parts: dict[QTextBrowser, PartCounter] = {}
        self._blocks: dict[QTextBrowser, list[str]] = {}  # each view's copyable code blocks
        self.plain_stats = label(name="GaugeLabel", wrap=True)
        self.spec_stats = label(name="GaugeLabel", wrap=True)
        self.spec_title = QLabel("<b>Speculative</b>")
        self.parts_headline = label(name="GaugeLabel", selectable=True)
        grid = QGridLayout()  # a column each: title, thinking, reply, numbers
        for column, widgets in enumerate((
                (QLabel("<b>Plain</b> (target only)"), self.plain_thinking, self.plain_text,
                 self.plain_stats),
                (self.spec_title, self.spec_thinking, self.spec_text, self.spec_stats))):
            for row, widget in enumerate(widgets):
                grid.addWidget(widget, row, column, Qt.AlignmentFlag.AlignTop if row == 1
                               else Qt.AlignmentFlag(0))
        grid.setRowStretch(2, 1)
        vbox(hbox((self.prompt, 1), vbox(self.run_button, self.cancel_button)), self.status,
             self.headline, self.parts_headline, self.explanation, (grid, 1), self.chart,
             parent=self)
        self.task: asyncio.Future | None = None
        self.outcome: CompareOutcome | None = None
        self._streamed: dict[QTextBrowser, str] = {}  # each pane's text so far
        self._dirty: set[QTextBrowser] = set()
        self._flush_scheduled = False

    def _reply_view(self) -> QTextBrowser:
        """A read-only view of a model's reply: the browser follows no link
        itself (``_link`` decides), so nothing but http(s) ever opens."""
        view = QTextBrowser()
        view.setOpenLinks(False)
        view.setOpenExternalLinks(False)
        view.anchorClicked.connect(lambda url, v=view: self._link(v, url))
        return view

    def _link(self, view: QTextBrowser, url: QUrl) -> None:
        said = links.follow(url.toString(), self._blocks.get(view, []))
        if said:
            self.status.setText(said)

    def start(self) -> None:
        text = self.prompt.toPlainText().strip()
        if not text or (self.task and not self.task.done()):
            return
        if self.runner.busy:
            self.status.setText("A reply is still being written or a model loading; try again "
                                "when it is done.")
            return
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.traces = {"plain": SpeedTrace(), "speculative": SpeedTrace()}
        self.chart.clear_series()
        self.outcome = None
        self._streamed = {self.plain_text: "", self.spec_text: ""}
        self._parts = {self.plain_text: PartCounter(), self.spec_text: PartCounter()}
        self._dirty.clear()
        for view in (self.plain_text, self.spec_text):
            view.clear()
            self._blocks[view] = []
            self._thinking[view].reset()
        for line in (self.headline, self.parts_headline, self.explanation, self.plain_stats,
                     self.spec_stats):
            line.clear()
        self.task = asyncio.ensure_future(
            self._run(self.runner.start(text, self._phase, self._step)))

    @property
    def idle(self) -> bool:
        """No run and no redraw still due (the dialog may be deleted)."""
        return (self.task is None or self.task.done()) and not self._flush_scheduled

    def cancel(self) -> None:
        """Stop the run going on now and skip the rest (the runs end with a
        "Compare cancelled" status)."""
        if self.task is not None and not self.task.done():
            self.status.setText("Cancelling…")
            self.cancel_button.setEnabled(False)
            self.runner.cancel()

    def done(self, result: int) -> None:
        """Closing the dialog (its close button, Esc) cancels its runs: the
        engine is free for the chat at once."""
        self.cancel()
        super().done(result)

    def _phase(self, mode: modes.Mode) -> None:
        self.status.setText(f"Running {mode.name}…")
        if mode.speculative:
            self.spec_title.setText(f"<b>Speculative</b> ({mode.name})")

    def _step(self, mode: modes.Mode, ev: StepEvent) -> None:
        view = self.spec_text if mode.speculative else self.plain_text
        pane = self._thinking[view]
        for part, text in ev.segments or ((ANSWER, ev.text),):
            if part == REASONING:
                pane.add(text if pane.reasoning else text.lstrip())
            elif part == ANSWER:
                shown = self._streamed.get(view, "")
                self._streamed[view] = shown + (text if shown else text.lstrip())
                pane.answering = pane.answering or bool(self._streamed[view])
        self._parts.setdefault(view, PartCounter()).add(ev)
        self._dirty.add(view)
        name = "speculative" if mode.speculative else "plain"
        trace = self.traces.setdefault(name, SpeedTrace())
        if ev.token_ids:  # a verify step (not the end-of-reply text flush)
            trace.add(ev.elapsed_s, ev.total_tokens)
            self.chart.set_series(name, trace.points)  # redrawn a few times a second
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_later(FLUSH_S, self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        for view in self._dirty:
            self._render(view, self._streamed[view])
            self._thinking[view].show_numbers(part_numbers(self._parts[view]).get(REASONING),
                                              streaming=True)
        self._dirty.clear()

    async def _run(self, runs: asyncio.Future) -> None:
        outcome = None
        try:
            outcome = await runs
        except SpecChatError as exc:  # EngineError, or CompareCancelled saying what stopped
            self._flush()  # what streamed before it stopped stays shown
            self.status.setText(str(exc))
        else:
            self._dirty.clear()
            self.show_outcome(outcome)
        finally:
            self.run_button.setEnabled(True)
            self.cancel_button.setEnabled(False)
            self.outcome = outcome
            self.finished_run.emit(outcome)

    def _render(self, view: QTextBrowser, text: str) -> None:
        # The chat's rendering (ui/markdown.py), not QTextBrowser.setMarkdown,
        # which passes the reply's raw HTML through and loads its images.
        doc, blocks = build_document(text, view.font(), DocColors.of(theme.current()))
        doc.setDocumentMargin(4)
        old = view.document()
        mine = old.parent() is view  # made here (the view deletes its own first one)
        doc.setParent(view)  # the view does not own a document it did not make
        view.setDocument(doc)
        if mine:
            old.deleteLater()  # streaming makes one per flush: do not keep them all
        self._blocks[view] = blocks

    def _fill(self, view: QTextBrowser, stats: QLabel, result: GenerationResult) -> None:
        summary = reply_summary(result.summary)
        self._render(view, result.answer.lstrip() or (words.no_answer(summary)
                                                      if result.reasoning.strip() else ""))
        pane = self._thinking[view]
        if result.reasoning.lstrip() != pane.reasoning:  # what the run wrote, as it ended
            pane.reset()
            pane.add(result.reasoning.lstrip())
        pane.answering = True
        pane.show_numbers(summary.part(REASONING), streaming=False,
                          unfinished=summary.ended_in_reasoning)
        stats.setText("\n".join(line for line in (summary.line(), summary.parts_line()) if line))

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
        self.parts_headline.setText(parts_headline(reply_summary(o.plain.summary),
                                                   reply_summary(o.speculative.summary)))
        self.status.setText(
            f"Acceptance {o.speculative.summary.acceptance_rate:.0%}, "
            f"{o.speculative.summary.tokens_per_step:.2f} tokens per step.")
        self.explanation.setText(speed_explanation(o.plain.summary, o.speculative.summary))
        self.chart.changed(now=True)
