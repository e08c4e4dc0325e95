"""The pair picker's rules, called with no window (ui/pair_choices.py):
which targets are listed, which drafts are offered for a target, which
entries are greyed out and why, what is chosen by default and after the
lists are built again; and the widget showing exactly those entries."""

from __future__ import annotations

import subprocess
import sys

from specchat.engine import modes
from specchat.library import recommendations as rec
from specchat.library.sources.cluster import ClusterState
from specchat.ui.library_view import HeadFits, ModelChoice, Verdict
from specchat.ui.pair_choices import (
    LOOKUP_LABEL,
    OWN_HEAD_LABEL,
    Entry,
    Listing,
    heads,
    picked,
    place,
    relabelled,
)
from ui_support import NoEngine

BUILT_IN = ModelChoice("bundled:big", "Big 1.5B  (built in)", "bundled")
SMALL = ModelChoice("small", "small  (installed, 0.5B)", "installed", "hf:org/small")
CATALOG = ModelChoice("tiny-cat", "Tiny  (download 1 GB)", "catalog", "tiny-cat")
MY_HEAD = ModelChoice("my-head", "my-head", "head", "import:/heads/mine (EAGLE-3 head for big)",
                      head_for="bundled:big")
OTHER_HEAD = ModelChoice("other-head", "other-head", "head", "import:/heads/other",
                         head_for="someone-else")
CHOICES = (BUILT_IN, MY_HEAD, SMALL, OTHER_HEAD, CATALOG)
UP = ClusterState("lab", "big-model", 2, None)
DOWN = ClusterState("far", "big-model", 3, "rank 1 (10.0.0.2) does not answer: run "
                                             "`specchat cluster start far` there")


def _result(target: str, draft: str, speedup: float) -> rec.DraftResult:
    return rec.make_result(target, draft, draft, "this machine", "cpu/float32", drafted=10,
                           accepted=8, judged=10, draft_cost=0.2, verify_slope=0.05, tokens=64,
                           tokens_per_s=50.0 * speedup, plain_tokens_per_s=50.0, prompts=1)


def _by_ref(entries: list[Entry]) -> dict[str | None, Entry]:
    return {e.ref: e for e in entries}


# -- targets -------------------------------------------------------------------------


def test_targets_are_the_models_then_the_clusters_never_a_head():
    targets = Listing(CHOICES, (UP, DOWN)).targets()
    assert [e.ref for e in targets] == ["bundled:big", "small", "tiny-cat", "cluster:lab",
                                        "cluster:far"]
    small = _by_ref(targets)["small"]
    assert (small.text, small.tooltip, small.enabled) == (
        "small  (installed, 0.5B)", "small  (installed, 0.5B)\nhf:org/small", True)
    assert _by_ref(targets)["bundled:big"].tooltip == "Big 1.5B  (built in)\nbundled:big"
    lab = _by_ref(targets)["cluster:lab"]
    assert lab.text == "big-model on cluster lab  (2 ranks)" and lab.enabled


def test_a_cluster_whose_ranks_do_not_answer_is_greyed_out_with_why():
    far = _by_ref(Listing(CHOICES, (DOWN,)).targets())["cluster:far"]
    assert far.text == "big-model on cluster far  (not answering)"
    assert not far.enabled
    assert far.tooltip.endswith("run `specchat cluster start far` there")


def test_the_chosen_cluster_stays_usable_and_the_loaded_one_says_so():
    """Chosen, a cluster that stops answering stays pickable; loaded, its
    ranks serve this app and stop answering probes: it reads "(loaded)"."""
    chosen = _by_ref(Listing(CHOICES, (DOWN,)).targets("cluster:far"))["cluster:far"]
    assert chosen.enabled and chosen.text.endswith("(not answering)")
    loaded = _by_ref(Listing(CHOICES, (DOWN,), loaded="cluster:far").targets())["cluster:far"]
    assert loaded.enabled and loaded.text == "big-model on cluster far  (loaded)"
    assert "serving this window's engine" in loaded.tooltip


# -- drafts --------------------------------------------------------------------------


def test_drafts_are_suffix_matching_the_own_head_the_heads_then_the_models():
    drafts = Listing(CHOICES, (UP,)).drafts()
    assert [e.ref for e in drafts] == [None, modes.OWN_HEAD, "my-head", "other-head",
                                       "bundled:big", "small", "tiny-cat"]  # no cluster
    assert drafts[0] == Entry(None, LOOKUP_LABEL)
    assert drafts[1] == Entry(modes.OWN_HEAD, OWN_HEAD_LABEL)
    head = _by_ref(drafts)["my-head"]  # not known yet whether it fits: plain, pickable
    assert head.text == "my-head  (draft head)" and head.enabled
    assert head.tooltip == "my-head  (draft head)\nimport:/heads/mine (EAGLE-3 head for big)"


def test_a_head_for_the_target_says_so_and_one_for_another_is_greyed_out_with_why():
    fits = HeadFits("bundled:big", "Big 1.5B", {
        "my-head": Verdict(True, ("an EAGLE-3 head that reads Big's hidden states",)),
        "other-head": Verdict(False, ("other-head is an EAGLE-3 head for another model "
                                      "(someone-else)", "its vocabulary maps into 416 ids"))})
    drafts = _by_ref(Listing(CHOICES).drafts(fits))
    mine, other = drafts["my-head"], drafts["other-head"]
    assert mine.text == "my-head  (draft head for Big 1.5B)" and mine.enabled
    assert mine.tooltip.endswith("(EAGLE-3 head for big)\nan EAGLE-3 head that reads Big's "
                                 "hidden states")
    assert other.text == "other-head  (draft head for another model)"
    assert not other.enabled
    assert other.tooltip == ("other-head  (draft head for another model)\nimport:/heads/other\n"
                             "other-head is an EAGLE-3 head for another model (someone-else)\n"
                             "its vocabulary maps into 416 ids")
    unknown = _by_ref(Listing(CHOICES).drafts(HeadFits("x", "X", {
        "other-head": Verdict(None, ("Checked when the pair loads.",))})))["other-head"]
    assert unknown.text == "other-head  (draft head)" and unknown.enabled
    assert unknown.tooltip.endswith("\nChecked when the pair loads.")
    assert all(e.enabled for e in drafts.values() if e.ref != "other-head")


def test_a_draft_measured_for_the_target_shows_its_speedup():
    result = _result("bundled:big", "small", 1.6)
    drafts = _by_ref(Listing(CHOICES).drafts(measured={"small": result}))
    assert drafts["small"].text == "small  (installed, 0.5B) — 1.6× measured"
    assert drafts["small"].tooltip == (
        "small  (installed, 0.5B) — 1.6× measured\nhf:org/small\n"
        f"Measured for this target here: {result.summary()}")
    assert "measured" not in drafts["tiny-cat"].text
    head = _by_ref(Listing(CHOICES).drafts(measured={"my-head": result}))["my-head"]
    assert head.text == "my-head  (draft head) — 1.6× measured"


def test_the_heads_asked_about_are_the_heads_listed_with_their_targets():
    assert heads(CHOICES) == (("my-head", "bundled:big"), ("other-head", "someone-else"))
    assert heads((BUILT_IN, SMALL)) == ()


# -- the pick ----------------------------------------------------------------------------


def test_by_default_the_first_target_and_suffix_matching_are_chosen():
    listing = Listing(CHOICES)
    assert place(listing.targets(), None) == (listing.targets(), 0)
    assert place(listing.drafts(), None) == (listing.drafts(), 0)
    assert place([], None) == ([], -1)  # nothing read yet: nothing chosen


def test_a_reference_not_listed_is_added_as_itself_and_stays_chosen():
    targets = Listing(CHOICES).targets()
    entries, i = place(targets, "/models/my folder")
    assert entries[:-1] == targets and i == len(targets)
    assert entries[i] == Entry("/models/my folder", "/models/my folder", "/models/my folder")
    assert place(targets, "small") == (targets, 1)
    assert place(entries, "/models/my folder") == (entries, i)  # not added twice


def test_a_refresh_keeps_the_persons_pick():
    """The lists are built again (a model imported, a cluster polled): the
    pick stays chosen wherever it moved, or as itself if it left the
    library; a chosen cluster stays pickable whatever its ranks say."""
    before = Listing((BUILT_IN, SMALL), (UP,))
    entries, i = place(before.targets(), "small")
    assert entries[i].ref == "small"
    imported = ModelChoice("another", "another  (installed)", "installed")
    after = Listing((imported, BUILT_IN, SMALL), (UP,))
    chosen = picked(entries, entries[i].text)
    entries, i = place(after.targets(chosen), chosen)
    assert (entries[i].ref, i) == ("small", 2)
    gone = Listing((BUILT_IN,), ())
    entries, i = place(gone.targets("small"), "small")
    assert entries[i] == Entry("small", "small", "small")  # deleted meanwhile: still the pick
    lab_down = ClusterState("lab", "big-model", 2, "rank 1 does not answer")
    entries, i = place(Listing((BUILT_IN,), (lab_down,)).targets("cluster:lab"), "cluster:lab")
    assert entries[i].ref == "cluster:lab" and entries[i].enabled


def test_what_a_box_reads_picks_its_entry_or_the_reference_typed():
    drafts = Listing(CHOICES).drafts()
    assert picked(drafts, LOOKUP_LABEL) is None
    assert picked(drafts, "small  (installed, 0.5B)") == "small"
    assert picked(drafts, "  hf:org/other  ") == "hf:org/other"
    assert picked(drafts, "") is None


def test_relabelling_for_another_target_keeps_a_reference_added_as_itself():
    shown, _ = place(Listing(CHOICES).drafts(), "/heads/typed")
    fresh = Listing(CHOICES).drafts(measured={"small": _result("bundled:big", "small", 1.2)})
    again = relabelled(shown, fresh)
    assert [e.ref for e in again] == [e.ref for e in shown]
    assert _by_ref(again)["small"].text.endswith("1.2× measured")
    assert again[-1] == Entry("/heads/typed", "/heads/typed", "/heads/typed")


def test_the_rules_load_no_qt():
    """The rules are called without a window: importing them loads no Qt."""
    code = ("import sys, specchat.ui.pair_choices; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('PySide6', 'shiboken6', 'qasync', 'pyqtgraph')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# -- the widget shows them ---------------------------------------------------------------


def test_the_picker_shows_exactly_the_entries_and_keeps_the_pick_on_a_refresh(qtbot, aloop,
                                                                               home):
    """Each box's items are the model's entries (text, data, tooltip,
    enabled), in order; when the controller's choices change the lists are
    built again and the person's pick stays chosen."""
    from PySide6.QtCore import Qt
    from specchat.ui.pair_picker import PairPicker
    from specchat.ui.session import AppSession

    def items(box) -> list[Entry]:
        return [Entry(box.itemData(i), box.itemText(i),
                      box.itemData(i, Qt.ItemDataRole.ToolTipRole) or "",
                      box.model().item(i).isEnabled()) for i in range(box.count())]

    session = AppSession(NoEngine(), home / "c.sqlite3")
    pairs = session.pairs
    picker = PairPicker(pairs)
    qtbot.addWidget(picker)
    pairs.choices, pairs.clusters = list(CHOICES), [DOWN]
    pairs.choicesChanged.emit()
    assert items(picker.target) == Listing(CHOICES, (DOWN,)).targets()
    assert items(picker.draft) == Listing(CHOICES, (DOWN,)).drafts()
    assert picker.selection() == ("bundled:big", None)  # the default

    picker.set_pair("small", "/heads/typed", check=False)
    assert picker.selection() == ("small", "/heads/typed")
    assert items(picker.draft)[-1] == Entry("/heads/typed", "/heads/typed", "/heads/typed")
    imported = ModelChoice("another", "another  (installed)", "installed")
    pairs.choices = [imported, *CHOICES]
    pairs.choicesChanged.emit()
    assert [e.ref for e in items(picker.target)][:2] == ["another", "bundled:big"]
    assert picker.selection() == ("small", "/heads/typed")
    assert picker.target.currentText() == "small  (installed, 0.5B)"
    session.close()
