"""Reasoning models in the window (issue 49): a reply's reasoning streams
into a Thinking section above its answer and never into the answer, with
scripted Qwen3-style and gpt-oss-style models on a real window; Copy and the
code blocks are the answer's; the thinking switch changes the prompt exactly
as the model's template says and is remembered with the conversation; the
history and the export keep both parts; a reply that stops inside its
reasoning says so."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtTest import QTest
from specchat.ui import links
from tinymodels import HARMONY_ANSWER, HARMONY_THOUGHTS, REASONER_ANSWER, REASONER_THOUGHTS
from transformers import PreTrainedTokenizerFast
from ui_support import load, send_and_wait, wait_until

MARKERS = ("<think>", "</think>", "<|channel|>", "<|message|>", "<|end|>", "<|start|>")
QWEN = ("".join(REASONER_THOUGHTS).lstrip(), "".join(REASONER_ANSWER))
HARMONY = ("".join(HARMONY_THOUGHTS), "".join(HARMONY_ANSWER))


def spy_requests(monkeypatch, w) -> list:
    """Every request the window sends, as it goes to the engine (which runs it)."""
    seen = []
    run = w.session.engine.run

    async def recorded(request, on_step=None):
        seen.append(request)
        return await run(request, on_step)

    monkeypatch.setattr(w.session.engine, "run", recorded)
    return seen


def prompt_of(w, request) -> list[int]:
    """The prompt the engine renders for ``request``."""
    return w.session.engine.client.call(lambda engine: engine.prompt_ids(request)).wait()


def as_template_reads(request, key: str) -> list[dict]:
    """The request's turns as transformers passes them to a template."""
    return [{"role": m.role, "content": m.content, **({key: m.reasoning} if m.reasoning else {})}
            for m in request.messages]


def chunk_kinds(w, msg) -> list[str]:
    return [c.key[0] for c in w.chat_view.delegate.rendered(msg).chunks]


def export(w) -> str:
    return w.session.conversations.blocking.export_markdown(w.conversation.conversation_id)


@pytest.mark.parametrize("model, expected", [("reasoner", QWEN), ("special_reasoner", QWEN),
                                             ("harmony_reasoner", HARMONY)])
def test_a_reasoning_reply_shows_its_reasoning_apart_and_copies_its_answer(
        request, qtbot, window, model, expected):
    """Qwen3's markers (ordinary added tokens, as Qwen3 has them, or special
    ones) and gpt-oss's channels: the reasoning in the Thinking section,
    folded once the answer came, the answer alone as Markdown; the toggle
    is a button Tab reaches, with a name, that Space opens; Copy and the
    code block's Copy are the answer's; the history and the export keep
    both parts."""
    load(qtbot, window, request.getfixturevalue(model))
    msg = send_and_wait(qtbot, window, "Hello there!")
    reasoning, answer = expected
    assert (msg.reasoning, msg.text) == (reasoning, answer)
    assert not any(m in msg.text + msg.reasoning for m in MARKERS)
    assert msg.summary.reasoned and not msg.summary.ended_in_reasoning
    assert "thinking" in window.chat_view.delegate.footer(msg)  # the per-part line
    assert window.gauges.parts.isVisible() and "answer" in window.gauges.parts.full

    row = len(window.chat_model.messages) - 1
    toggle = window.chat_view.thinking_toggle(row)
    assert toggle is not None and toggle.isVisible()
    assert toggle.accessibleName() == "Thinking" and "folded" in toggle.accessibleDescription()
    assert toggle.text().startswith("▸ Thinking ·") and "tokens" in toggle.text()
    assert toggle.focusPolicy() & Qt.FocusPolicy.TabFocus and toggle.isEnabled()
    chain, widget = [], window.composer.send_button.nextInFocusChain()
    while widget is not window.composer.send_button and len(chain) < 500:
        chain.append(widget)
        widget = widget.nextInFocusChain()
    assert toggle in chain  # where Tab goes
    assert not msg.thinking_open and "reasoning" not in chunk_kinds(window, msg)
    folded = window.chat_view.visualRect(window.chat_model.index(row)).height()
    toggle.setFocus()
    QTest.keyClick(toggle, Qt.Key.Key_Space)
    assert msg.thinking_open and toggle.isChecked() and "shown" in toggle.accessibleDescription()
    assert chunk_kinds(window, msg)[0] == "reasoning"
    wait_until(lambda: window.chat_view.visualRect(window.chat_model.index(row)).height() > folded)
    shown = "\n".join(c.doc.toPlainText() for c in window.chat_view.delegate.rendered(msg).chunks
                    if c.key[0] == "reasoning")
    assert shown.split() == reasoning.split()  # as plain text: no Markdown made of it
    toggle.click()
    assert not msg.thinking_open

    # Copy: the answer alone; a code block's Copy link copies its code.
    assert [t for _label, t, _said in window.chat_view.copy_actions(msg)] == [answer, reasoning]
    blocks = [b for c in window.chat_view.delegate.rendered(msg).chunks for b in c.code_blocks]
    if "```" in answer:
        links.follow("copy:0", blocks)
        assert QGuiApplication.clipboard().text() == "print('hi')"

    text = export(window)
    assert "<details>" in text and reasoning.strip().splitlines()[0] in text
    assert text.index("</details>") < text.index(answer.splitlines()[0])
    assert "*thinking " in text  # each part's numbers

    # The history reloads both parts, and the toggle with them.
    cid = window.conversation.conversation_id
    window.open_conversation(None)
    window.open_conversation(cid)
    wait_until(lambda: not window.conversation.opening and len(window.chat_model.messages) == 2)
    back = window.chat_model.messages[-1]
    assert (back.reasoning, back.text) == (reasoning, answer)
    assert back.summary.part("reasoning").tokens == msg.summary.part("reasoning").tokens
    assert window.chat_view.thinking_toggle(1) is not None


def test_reasoning_streams_into_the_thinking_section_and_never_into_the_answer(
        qtbot, window, long_reasoner):
    """Seen at every update of the row: while the reasoning streams, the
    answer is empty and the section open; once the answer starts it folds;
    no marker ever shows; the toggle counts the reasoning as it grows."""
    load(qtbot, window, long_reasoner)
    window.session.update_settings(max_tokens=400)
    seen = []

    def look(*_args) -> None:
        m = window.chat_model.messages[-1]
        if m.role == "assistant":
            toggle = window.chat_view.thinking_toggle(len(window.chat_model.messages) - 1)
            seen.append((m.reasoning, m.text, m.thinking_open, m.streaming,
                         toggle.text() if toggle is not None else ""))

    window.chat_model.dataChanged.connect(look)
    msg = send_and_wait(qtbot, window)
    assert msg.reasoning.startswith("thought0 thought1") and msg.text.startswith("word0")
    thinking = [s for s in seen if s[3] and s[0] and not s[1]]
    assert len({len(s[0]) for s in thinking}) >= 2  # it grew over several updates
    assert all(s[2] and s[4].startswith("▾ Thinking…") for s in thinking)
    assert any(s[1] for s in seen if s[3]) and all(not s[2] for s in seen if s[1])
    assert all("word" not in s[0] and "thought" not in s[1] for s in seen)
    assert not any(m in s[0] + s[1] for s in seen for m in MARKERS)


def test_the_thinking_switch_renders_the_prompt_as_the_template_says_and_stays_with_the_chat(
        qtbot, window, monkeypatch, reasoner):
    """Off: the request asks for it, the prompt is exactly what Qwen3's
    template renders with enable_thinking false, and the model answers at
    once; the conversation keeps the choice; earlier reasoning reaches the
    template once, under its own key, and Qwen3's template drops it."""
    load(qtbot, window, reasoner)
    sent = spy_requests(monkeypatch, window)
    box = window.options.thinking_box
    assert box.isEnabled() and [box.itemText(i) for i in range(box.count())] == [
        "Thinking on", "Thinking off"]
    fast = PreTrainedTokenizerFast.from_pretrained(str(reasoner))

    first = send_and_wait(qtbot, window, "Hello there!")
    assert first.reasoning and sent[-1].reasoning_effort == ""
    expected = fast.apply_chat_template(as_template_reads(sent[-1], "reasoning_content"),
                                        add_generation_prompt=True, tokenize=False)
    assert prompt_of(window, sent[-1]) == fast.encode(expected, add_special_tokens=False)

    box.setCurrentIndex(1)
    box.activated.emit(1)
    assert window.conversation.reasoning_effort == "none"
    second = send_and_wait(qtbot, window, "And now without thinking?")
    assert (second.reasoning, second.text) == ("", QWEN[1])
    assert window.chat_view.thinking_toggle(3) is None
    request = sent[-1]
    assert request.reasoning_effort == "none"
    turns = as_template_reads(request, "reasoning_content")
    assert turns[-2]["reasoning_content"] == first.reasoning and turns[-2]["content"] == QWEN[1]
    expected = fast.apply_chat_template(turns, add_generation_prompt=True, tokenize=False,
                                        enable_thinking=False)
    ids = prompt_of(window, request)
    assert ids == fast.encode(expected, add_special_tokens=False)
    text = fast.decode(ids)
    assert text.endswith("<think>\n\n</think>\n\n") and REASONER_THOUGHTS[1] not in text

    cid = window.conversation.conversation_id
    window.open_conversation(None)
    assert window.conversation.reasoning_effort == "" and box.currentIndex() == 0
    window.open_conversation(cid)
    wait_until(lambda: not window.conversation.opening)
    assert window.conversation.reasoning_effort == "none" and box.currentText() == "Thinking off"


def test_harmony_reasoning_effort_and_earlier_reasoning_reach_the_template_once(
        qtbot, window, monkeypatch, harmony_reasoner):
    load(qtbot, window, harmony_reasoner)
    sent = spy_requests(monkeypatch, window)
    box = window.options.thinking_box
    assert [box.itemText(i) for i in range(box.count())] == [
        "Thinking: default", "Thinking: low", "Thinking: medium", "Thinking: high"]
    box.setCurrentIndex(1)
    box.activated.emit(1)
    send_and_wait(qtbot, window, "Hello there!")
    send_and_wait(qtbot, window, "And again?")
    request = sent[-1]
    assert request.reasoning_effort == "low"
    fast = PreTrainedTokenizerFast.from_pretrained(str(harmony_reasoner))
    expected = fast.apply_chat_template(as_template_reads(request, "thinking"),
                                        add_generation_prompt=True, tokenize=False,
                                        reasoning_effort="low")
    text = fast.decode(prompt_of(window, request))
    assert text == expected and "Reasoning: low" in text
    assert text.count(HARMONY[0]) == 1  # the earlier turn's analysis, once


def test_the_switch_is_off_with_its_reason_for_a_model_without_one(qtbot, window, tiny_target):
    box = window.options.thinking_box
    assert not box.isEnabled() and "Load a model" in box.toolTip()
    load(qtbot, window, tiny_target)
    assert not box.isEnabled() and "does not think" in box.toolTip()
    msg = send_and_wait(qtbot, window)
    assert not msg.reasoning and window.chat_view.thinking_toggle(1) is None
    assert not window.gauges.parts.isVisible()


@pytest.mark.parametrize("model", ["reasoner", "special_reasoner"])
def test_markers_the_user_types_are_text(request, qtbot, window, monkeypatch, model):
    """A </think> typed into a message is text: shown and kept as typed,
    reaching the model as plain text, not the marker (whether the model's
    markers are special tokens or not); the reply still comes apart."""
    folder = request.getfixturevalue(model)
    load(qtbot, window, folder)
    sent = spy_requests(monkeypatch, window)
    typed = "What does </think> do? And <think>?"
    msg = send_and_wait(qtbot, window, typed)
    assert window.chat_model.messages[0].text == typed
    assert (msg.reasoning, msg.text) == QWEN
    fast = PreTrainedTokenizerFast.from_pretrained(str(folder))
    ids = prompt_of(window, sent[-1])
    marks = {fast.convert_tokens_to_ids(t) for t in ("<think>", "</think>")}
    assert not marks & set(ids) and typed in fast.decode(ids)
    cid = window.conversation.conversation_id
    window.open_conversation(None)
    window.open_conversation(cid)
    wait_until(lambda: len(window.chat_model.messages) == 2)
    assert window.chat_model.messages[0].text == typed


def test_a_reasoning_that_never_closes_says_so(qtbot, window, unclosed_reasoner):
    load(qtbot, window, unclosed_reasoner)
    msg = send_and_wait(qtbot, window)
    assert msg.reasoning == QWEN[0] and msg.text == ""
    assert msg.summary.ended_in_reasoning and msg.summary.finish_reason == "stop"
    assert msg.thinking_open  # no answer: the reasoning is what there is
    toggle = window.chat_view.thinking_toggle(1)
    assert "(unfinished)" in toggle.text()
    note = window.chat_view.delegate.rendered(msg).chunks[-1]
    assert note.key[0] == "note" and "the model ended it there" in note.doc.toPlainText()
    assert "ended while thinking" in export(window)


def test_a_reply_cut_off_or_stopped_inside_its_reasoning_says_so(
        qtbot, window, reasoner, long_reasoner):
    load(qtbot, window, reasoner)
    window.session.update_settings(max_tokens=4)
    msg = send_and_wait(qtbot, window)
    assert msg.summary.finish_reason == "length" and msg.summary.ended_in_reasoning
    assert msg.text == "" and msg.reasoning
    assert "max tokens reached" in window.chat_view.delegate.rendered(msg).chunks[-1].key[1]

    load(qtbot, window, long_reasoner)
    window.session.update_settings(max_tokens=400)
    window.composer.edit.setPlainText("Think hard")
    window.composer.send_button.click()
    wait_until(lambda: window.chat_model.messages[-1].reasoning)
    window.composer.stop_button.click()
    wait_until(lambda: not window.conversation.busy)
    msg = window.chat_model.messages[-1]
    assert msg.summary.finish_reason == "cancelled" and msg.summary.ended_in_reasoning
    assert msg.text == "" and "stopped" in window.chat_view.delegate.rendered(msg).chunks[-1].key[1]
    cid = window.conversation.conversation_id
    window.open_conversation(None)
    window.open_conversation(cid)
    wait_until(lambda: len(window.chat_model.messages) == 4)
    back = window.chat_model.messages[-1]
    assert back.reasoning == msg.reasoning and back.summary.ended_in_reasoning


def test_compare_shows_and_compares_both_parts(qtbot, window, reasoner):
    from ui_support import run_compare

    load(qtbot, window, reasoner)
    dlg = run_compare(qtbot, window, "Hello there!")
    for pane, view in ((dlg.plain_thinking, dlg.plain_text), (dlg.spec_thinking, dlg.spec_text)):
        assert pane.isVisible() and pane.reasoning == QWEN[0]
        assert not pane.text.isVisible() and pane.toggle.text().startswith("▸ Thinking")
        assert view.toPlainText().startswith("Hello! Here is an example")
        assert not any(m in view.toPlainText() for m in MARKERS)
    assert "thinking" in dlg.parts_headline.text() and "answer" in dlg.parts_headline.text()
    assert "thinking" in dlg.plain_stats.text() and "answer" in dlg.spec_stats.text()
    dlg.close()


@pytest.mark.parametrize("model, drafted", [("reasoner", "answer"),
                                             ("harmony_reasoner", "reasoning")])
def test_toggles_stay_on_their_bubbles_and_colours_follow_each_part(
        request, qtbot, window, model, drafted):
    """The second reply drafts from the first (suffix matching; Qwen3's
    template keeps the first answer in the prompt, gpt-oss's its reasoning
    too): each part's colouring covers exactly its own text, with the
    origins the engine counted for that part. Opening the first reply's
    section moves the second reply down, its toggle with it."""
    load(qtbot, window, request.getfixturevalue(model))
    window.session.update_settings(auto_off=False, k=4)  # drafts whatever the timing
    send_and_wait(qtbot, window, "Hello there!")
    msg = send_and_wait(qtbot, window, "And again?")
    for m in window.chat_model.messages[1::2]:
        for part, runs, text in (("answer", m.runs, m.text),
                                 ("reasoning", m.reasoning_runs, m.reasoning)):
            assert "".join(t for _o, t in runs) == text
            counted = m.summary.part(part).tokens_by_origin
            assert {o for o, _t in runs} - {"target"} <= {o for o, n in counted.items() if n}
    runs = msg.runs if drafted == "answer" else msg.reasoning_runs
    assert {o for o, _t in runs} - {"target"}

    view = window.chat_view
    view.scrollToTop()
    below = view.thinking_toggle(3)
    before = below.geometry().top()
    view.thinking_toggle(1).click()
    wait_until(lambda: below.geometry().top() > before)
    bubble = view.delegate.bubble_rect(msg, view.visualRect(window.chat_model.index(3)))
    # In the bubble's first row, the toggle's own height (its header's).
    assert bubble.top() <= below.geometry().top() <= bubble.top() + below.geometry().height()


def test_the_switch_offers_what_the_model_has_and_maps_a_kept_choice_onto_it():
    """ui/thinking.py, no window: on/off for an on/off switch, levels for a
    level switch, nothing (and why) for none; a conversation's word asks
    another model for the nearest thing it has."""
    from specchat.engine.events import ChatFormat
    from specchat.ui import thinking

    on_off = ChatFormat(template=True, reasoning="markers", switches=("enable_thinking",),
                        effort="enable_thinking")
    levels = ChatFormat(template=True, reasoning="harmony", switches=("reasoning_effort",),
                        effort="reasoning_effort")
    always = ChatFormat(template=True, reasoning="markers")
    assert [c.effort for c in thinking.choices(on_off)] == ["", "none"]
    assert [c.effort for c in thinking.choices(levels)] == ["", "low", "medium", "high"]
    assert thinking.choices(always) == [] and thinking.choices(None) == []
    assert thinking.unavailable(on_off) == "" and "always thinks" in thinking.unavailable(always)
    assert "does not think" in thinking.unavailable(ChatFormat(template=True))
    assert "Load a model" in thinking.unavailable(None)
    expect = {("", on_off): "", ("none", on_off): "none", ("high", on_off): "",
              ("none", levels): "low", ("medium", levels): "medium", ("xhigh", levels): "",
              ("none", always): "", ("high", always): "", ("none", None): ""}
    for (kept, fmt), effort in expect.items():
        assert thinking.request_effort(fmt, kept) == effort, (kept, fmt)
    assert thinking.chosen(levels, "none") == 1 and thinking.chosen(on_off, "none") == 1
    assert thinking.keeps("none") and thinking.keeps("") and not thinking.keeps("loud")


def test_colour_tokens_legend_makes_room_for_the_switch(qtbot, window, reasoner):
    """The options bar with the switch and Colour tokens' legend: the
    legend's words where there is room, its tinted squares where there is
    not (the words on hover), so the bar's controls keep theirs."""
    load(qtbot, window, reasoner)
    window.session.update_settings(color_tokens=True)
    legend, box = window.options.legend, window.options.thinking_box
    window.resize(1700, 760)
    wait_until(lambda: window.options.width() > 1400)
    assert legend.isVisible() and not legend.compact
    assert box.width() >= box.sizeHint().width()
    window.resize(1100, 760)
    wait_until(lambda: window.options.width() < 900)
    assert legend.isVisible() and legend.compact
    assert all(s.toolTip() for s, _o in legend.swatches)
