"""The window and the drafters that read the target: a Qwen3.5-style target
that ships an MTP head is offered "The model's own MTP head" as its draft,
told so in the verdict, and replies with it, its tokens named and tinted as
the head's own; a target without one is refused in words; an EAGLE-3 head
loads as the draft and is named. The heads that reply are right part of
the time (tinymodels), and their replies are accepted in part."""

from __future__ import annotations

import dataclasses
import json

import pytest
from specchat.engine import modes
from specchat.library import importing
from specchat.ui import library_view, theme
from tinymodels import build_eagle3, build_partial_eagle3, build_partial_mtp_target
from ui_support import load, send_and_wait, wait_until


@pytest.fixture(scope="module")
def mtp_target(tiny_dir, tiny_tokenizer):
    return build_partial_mtp_target(tiny_dir / "ui-qwen3_5-mtp", tiny_tokenizer)


def _send_partly_right(qtbot, window, kind: str):
    """A reply the head drafted, accepted in part (no system prompt, and no
    break-even auto-off, which reads the clock: the same blocks every run)."""
    window.session.update_settings(system_prompt="", auto_off=False)
    msg = send_and_wait(qtbot, window, "Hello, world! Hello, world!")
    got = msg.summary.drafted_by.get(kind, {})
    assert 0 < got.get("accepted", 0) < got.get("drafted", 0), msg.summary.drafted_by
    return msg


def test_the_picker_offers_the_models_own_head_and_a_reply_drafts_with_it(qtbot, window,
                                                                          mtp_target):
    picker = window.picker
    wait_until(lambda: picker.draft.count() > 1)
    assert picker.draft.itemText(1) == "The model's own MTP head"
    assert picker.draft.itemData(1) == modes.OWN_HEAD
    picker.set_pair(str(mtp_target), modes.OWN_HEAD)
    wait_until(lambda: window.session.pairs.verdict is not None
               and window.session.pairs.verdict.compatible is not None)
    assert window.session.pairs.verdict.compatible is True
    assert "drafts for itself with its own MTP head" in window.session.pairs.verdict.text
    pair = load(qtbot, window, mtp_target, modes.OWN_HEAD)
    assert pair.own_head and pair.draft is None
    assert window.windowTitle().startswith("ui-qwen3_5-mtp + its own MTP head")
    msg = _send_partly_right(qtbot, window, "mtp")
    assert msg.summary.mode == modes.MTP_HYBRID.name
    assert theme.origin_color(theme.LIGHT, "mtp") is not None  # its own tint


def test_a_target_without_a_head_is_refused_in_words(tiny_target):
    verdict = library_view.check_pair(str(tiny_target), modes.OWN_HEAD)
    assert verdict.compatible is False
    assert verdict.text.startswith("target-llama has no MTP head (no mtp.* weights in its "
                                   "folder), so it cannot draft for itself")


def test_an_eagle3_head_loads_as_the_draft_and_is_named(qtbot, window, tiny_dir, tiny_target):
    head = build_partial_eagle3(tiny_dir / "ui-eagle3", tiny_target)
    verdict = library_view.check_pair(str(tiny_target), str(head))
    assert verdict.compatible is True and "an EAGLE-3 head that reads" in verdict.text
    pair = load(qtbot, window, tiny_target, head)
    assert pair.draft.model_type == "eagle3"
    _send_partly_right(qtbot, window, "eagle3")


def test_a_head_is_listed_under_its_target(home, tiny_dir, tiny_target, tiny_draft):
    target = importing.import_path(tiny_target, name="my-target")
    head = build_eagle3(tiny_dir / "ui-eagle3-listed", tiny_target)
    config = json.loads((head / "config.json").read_text())
    config["speculators_config"] = {"verifier": {"name_or_path": "my-target"}}
    (head / "config.json").write_text(json.dumps(config))
    other = importing.import_path(tiny_draft, name="another")
    listed = importing.import_path(head, name="my-head")
    order = library_view.heads_under_targets([listed, other, target])
    assert [m.name for m in order] == ["another", "my-target", "my-head"]
    assert library_view.source_text(listed).endswith("(EAGLE-3 head for my-target)")
    # A head that names its target's Hub repository finds it under any
    # revision of it, as the pair picker does (one rule for both).
    pulled = dataclasses.replace(target, name="pulled", source="hf:test-org/tiny@0123abc")
    by_repo = dataclasses.replace(listed, head={**listed.head, "for": "test-org/tiny"})
    assert [m.name for m in library_view.heads_under_targets([by_repo, other, pulled])] == [
        "another", "pulled", "my-head"]
    assert library_view.nested_heads([by_repo, other, pulled]) == [by_repo]


def _head_for(folder, target, made_for, **kw):
    """A tiny EAGLE-3 head for ``target`` whose config names ``made_for``."""
    head = build_eagle3(folder, target, layout="speculators", **kw)
    config = json.loads((head / "config.json").read_text())
    config["speculators_config"] = {"verifier": {"name_or_path": made_for}}
    (head / "config.json").write_text(json.dumps(config))
    return head


def test_the_picker_offers_a_targets_heads_as_its_drafts_and_never_as_targets(
        qtbot, window, tiny_dir, tiny_target, tiny_draft, tiny_qwen_target):
    """Issue 46: a head is a draft for the target it was made for. It is
    never a target choice; in the draft list the chosen target's heads are
    "draft head for <target>", another target's are greyed out with why;
    choosing the head and Load loads that pair."""
    importing.import_path(tiny_target, name="my-target")
    importing.import_path(tiny_draft, name="my-draft")
    importing.import_path(tiny_qwen_target, name="qwen-target")
    importing.import_path(_head_for(tiny_dir / "picker-eagle3", tiny_target, "my-target"),
                          name="my-head")
    importing.import_path(_head_for(tiny_dir / "picker-eagle3-qwen", tiny_qwen_target,
                                    "qwen-target", layer_ids=[1, 1, 2]), name="qwen-head")
    picker, pairs = window.picker, window.session.pairs
    wait_until(pairs.reload_choices().done)
    wait_until(lambda: picker.target.findData("my-target") >= 0)

    targets = [picker.target.itemData(i) for i in range(picker.target.count())]
    assert {"my-target", "my-draft", "qwen-target"} <= set(targets)
    assert "my-head" not in targets and "qwen-head" not in targets
    drafts = [picker.draft.itemData(i) for i in range(picker.draft.count())]
    assert drafts[:4] == [None, modes.OWN_HEAD, "my-head", "qwen-head"]  # heads first
    assert {"my-draft", "my-target", "qwen-target"} <= set(drafts)

    def entry(ref):
        i = picker.draft.findData(ref)
        item = picker.draft.model().item(i)
        return picker.draft.itemText(i), item.isEnabled(), item.toolTip()

    picker.set_pair("my-target", None)
    wait_until(lambda: entry("qwen-head")[0].endswith("(draft head for another model)"))
    text, enabled, tip = entry("my-head")
    assert text == "my-head  (draft head for my-target)" and enabled
    assert "an EAGLE-3 head that reads my-target's hidden states" in tip
    text, enabled, tip = entry("qwen-head")
    assert text == "qwen-head  (draft head for another model)" and not enabled
    assert "qwen-head is an EAGLE-3 head for another model (qwen-target)" in tip
    assert "vocabulary maps into 416 ids" in tip
    assert entry("my-draft")[1]  # a draft model is listed as before

    picker.set_pair("qwen-target", None)  # the other target: the other way round
    wait_until(lambda: entry("qwen-head")[0] == "qwen-head  (draft head for qwen-target)")
    assert entry("qwen-head")[1] and not entry("my-head")[1]
    assert entry("my-head")[0] == "my-head  (draft head for another model)"

    picker.set_pair("my-target", None)
    wait_until(lambda: entry("my-head")[1])
    picker.draft.setCurrentIndex(picker.draft.findData("my-head"))  # as a click in the list
    assert picker.selection() == ("my-target", "my-head")
    wait_until(lambda: "EAGLE-3" in pairs.verdict.text)  # this pair's, not the last one's
    assert pairs.verdict.compatible is True
    assert "an EAGLE-3 head that reads my-target's" in pairs.verdict.text
    assert picker.load_button.isEnabled()
    picker.load_button.click()
    wait_until(lambda: window.session.engine.pair is not None
               and not window.session.engine.loading, timeout=60_000)
    pair = window.session.engine.pair
    assert (window.session.engine.target_ref, pair.draft.model_type) == ("my-target", "eagle3")
    assert pair.draft.name == "my-head" and "head" in pair.loaded()


def test_a_head_fits_a_target_not_downloaded_by_what_it_records(home, tiny_dir, tiny_target):
    """The built-in SmolLM2, not prepared yet, has no files to check a head
    against: a head whose config names it fits; any other is unknown (a
    conversion may go by another name), never offered as its head."""
    folder = tiny_dir / "catalog-eagle3"
    target = "bundled:smollm2-135m"
    mine = library_view.head_verdict(
        target, str(_head_for(folder, tiny_target, "mlx-community/SmolLM2-135M-Instruct")),
        "mlx-community/SmolLM2-135M-Instruct")
    assert mine.compatible is True
    assert mine.reasons[0] == ("catalog-eagle3 is an EAGLE-3 head made for "
                               "mlx-community/SmolLM2-135M-Instruct")
    other = library_view.head_verdict(target, str(folder), "my-target")
    assert other.compatible is None and other.reasons[0].endswith("made for my-target")
    fits = library_view.head_fits(target, ((str(folder), "my-target"),))
    assert fits.name == "smollm2-135m" and fits.verdicts[str(folder)] == other


def test_the_manager_points_a_heads_arrow_only_at_a_listed_target(qtbot, home, tiny_dir,
                                                                  tiny_target):
    """A head is shown under its target's row ("↳"); a head whose target
    is not in the library (trained for a target loaded from a folder) has
    no row to point at: no arrow, and its source says its target is not
    in the library."""
    from specchat.ui.model_manager import ModelManager

    importing.import_path(tiny_target, name="my-target")
    importing.import_path(_head_for(tiny_dir / "manager-eagle3", tiny_target, "my-target"),
                          name="my-head")
    importing.import_path(_head_for(tiny_dir / "manager-eagle3-orphan", tiny_target,
                                    "target-on-a-path"), name="orphan-head")
    dlg = ModelManager()
    qtbot.addWidget(dlg)
    rows = [(dlg.installed.item(i, 0).text(), dlg.installed.item(i, 1).text())
            for i in range(dlg.installed.rowCount())]
    names = [name for name, _ in rows]
    assert names.index("↳ my-head") == names.index("my-target") + 1
    assert "orphan-head" in names and "↳ orphan-head" not in names
    source = dict(rows)["orphan-head"]
    assert source.endswith("(EAGLE-3 head for target-on-a-path, which is not in the library)")
    assert dict(rows)["↳ my-head"].endswith("(EAGLE-3 head for my-target)")
