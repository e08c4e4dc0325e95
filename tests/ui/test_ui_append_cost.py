"""Appending a streamed token costs the same at message 1 and message 500:
one document build, a constant number of size measurements, and paints
bounded by what is visible, never by the conversation's length."""

from __future__ import annotations

import statistics
import time

from specchat.ui.chat_model import ChatMessage, ChatModel
from ui_support import make_view

APPENDS = 40


def _history(n: int) -> list[ChatMessage]:
    msgs = []
    for i in range(n - 1):
        if i % 2:
            msgs.append(ChatMessage("user", f"question {i}: how do I sort a list?"))
        else:
            msgs.append(ChatMessage("assistant", f"Answer {i} with **bold**, `code` and\n\n"
                                    f"```python\nsorted(xs)  # {i}\n```\n\nDone."))
    msgs.append(ChatMessage("assistant", "", streaming=True))
    return msgs


def _measure(qtbot, qapp, n: int) -> dict:
    model, view = make_view(qtbot, 800, 600)
    model.set_messages(_history(n))
    for _ in range(5):
        qapp.processEvents()
    d = view.delegate
    d.builds = d.size_hints = d.paints = 0
    times = []
    for k in range(APPENDS):
        t0 = time.perf_counter()
        model.append_text(n - 1, f"token{k} ", ("draft", "target"))
        qapp.processEvents()
        times.append(time.perf_counter() - t0)
    assert view.verticalScrollBar().value() == view.verticalScrollBar().maximum()
    return {"builds": d.builds / APPENDS, "size_hints": d.size_hints / APPENDS,
            "paints": d.paints / APPENDS, "median_ms": 1000 * statistics.median(times)}


def test_append_cost_independent_of_length(qtbot, qapp):
    small = _measure(qtbot, qapp, 1)
    large = _measure(qtbot, qapp, 500)
    print(f"\nper append at 1 message: {small}\nper append at 500 messages: {large}")
    # Exactly the streaming message is rebuilt, once per append.
    assert small["builds"] == 1 and large["builds"] == 1
    # Rows are measured a constant number of times (no relayout of 500 rows).
    assert large["size_hints"] <= small["size_hints"] + 1
    # Paints are bounded by the visible rows (a 600 px viewport shows a few).
    assert large["paints"] <= 8


def test_only_the_last_row_changes(qapp):
    model = ChatModel()
    model.set_messages(_history(500))
    changed = []
    model.dataChanged.connect(lambda a, b, *_: changed.append((a.row(), b.row())))
    model.append_text(499, "x")
    model.append_steps(499, [("y", ("draft",), ("y",)), ("z", ("target",), ("z",))])
    assert changed == [(499, 499), (499, 499)]
    assert model.message(499).text == "xyz"


def test_long_reply_rebuilds_only_its_last_chunk(qtbot, qapp):
    model, view = make_view(qtbot, 800, 600, show=False)
    para = "Some **prose** with `code` that runs on for a while, " * 4
    block = "```python\n" + "def f(x):\n    return x * 2\n" * 10 + "```"
    text = "\n\n".join(para if i % 4 else block for i in range(120))  # ~20 KB
    model.set_messages([ChatMessage("assistant", text, streaming=True)])
    d = view.delegate
    first = d.rendered(model.message(0))
    chunks_before = list(first.chunks)
    assert len(chunks_before) == 120
    d.builds = 0
    t0 = time.perf_counter()
    model.append_text(0, " and one more token")
    after = d.rendered(model.message(0))
    elapsed = time.perf_counter() - t0
    assert d.builds == 1
    assert all(a is b for a, b in zip(after.chunks[:-1], chunks_before[:-1], strict=True))
    assert after.chunks[-1] is not chunks_before[-1]
    # Re-rendering the whole 20 KB reply takes tens of ms; one chunk takes ~1 ms.
    assert elapsed < 0.03, elapsed


def test_a_long_reasoning_streams_for_one_paragraph_per_update(qtbot, qapp):
    """The Thinking section open while 1,000 tokens of reasoning stream in
    (a paragraph every ten): each update builds one document, the last
    paragraph's, and the paragraphs before it stay the same objects."""
    from specchat.engine.events import REASONING, StepEvent

    model, view = make_view(qtbot, 800, 600)
    model.set_messages([ChatMessage("user", "think"), ChatMessage("assistant", "", streaming=True)])
    for _ in range(3):
        qapp.processEvents()
    d = view.delegate
    d.builds = 0
    msg = model.message(1)
    for k in range(1000):
        piece = f" thought{k}" + (".\n\n" if k % 10 == 9 else "")
        model.append_events(1, [StepEvent(k, (k,), piece, ("target",), 0, 0, 0, None, 0.0,
                                          k / 100, k + 1, (piece,), segments=((REASONING, piece),),
                                          parts=(REASONING,))])
        first = d.rendered(msg).chunks[0] if k >= 10 else None
        qapp.processEvents()
        if first is not None:
            assert d.rendered(msg).chunks[0] is first
    assert msg.thinking_open and len(d.rendered(msg).chunks) == 100
    assert d.builds == 1000  # one per update: the open paragraph's
