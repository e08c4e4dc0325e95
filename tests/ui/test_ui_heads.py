"""The window and the drafters that read the target: a Qwen3.5-style target
that ships an MTP head is offered "The model's own MTP head" as its draft,
told so in the verdict, and replies with it, its tokens named and tinted as
the head's own; a target without one is refused in words; an EAGLE-3 head
loads as the draft and is named."""

from __future__ import annotations

import json

import pytest
from specchat.engine import modes
from specchat.library import importing
from specchat.ui import library_view, theme
from tinymodels import add_mtp, build_arch, build_eagle3
from ui_support import load, send_and_wait, wait_until


@pytest.fixture(scope="module")
def mtp_target(tiny_dir, tiny_tokenizer):
    return add_mtp(build_arch(tiny_dir / "ui-qwen3_5-mtp", tiny_tokenizer, "qwen3_5", seed=8))


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
    msg = send_and_wait(qtbot, window, "Hello, world! Hello, world!")
    assert msg.summary.mode == modes.MTP_HYBRID.name
    assert msg.summary.drafted_by.get("mtp", {}).get("drafted", 0) > 0
    assert theme.origin_color(theme.LIGHT, "mtp") is not None  # its own tint


def test_a_target_without_a_head_is_refused_in_words(tiny_target):
    verdict = library_view.check_pair(str(tiny_target), modes.OWN_HEAD)
    assert verdict.compatible is False
    assert verdict.text.startswith("target-llama ships no MTP head")


def test_an_eagle3_head_loads_as_the_draft_and_is_named(qtbot, window, tiny_dir, tiny_target):
    head = build_eagle3(tiny_dir / "ui-eagle3", tiny_target)
    verdict = library_view.check_pair(str(tiny_target), str(head))
    assert verdict.compatible is True and "an EAGLE-3 head that reads" in verdict.text
    pair = load(qtbot, window, tiny_target, head)
    assert pair.draft.model_type == "eagle3"
    msg = send_and_wait(qtbot, window, "Hello, world! Hello, world!")
    assert msg.summary.drafted_by.get("eagle3", {}).get("drafted", 0) > 0


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
