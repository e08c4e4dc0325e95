"""Choosing a pair: the verdict next to the boxes, refusing an incompatible
pair with its reason, the engine's own refusal, and cancelling a load."""

from __future__ import annotations

from ui_support import NoEngine, load, wait_until


def _verdict(w):
    pairs = w.session.pairs  # the picker's controller works the verdict out
    wait_until(lambda: pairs.checking is None or pairs.checking.done(), timeout=30_000)
    return pairs.verdict


def _listed(w):
    """The picker's lists, once the choices are read (off the GUI thread)."""
    wait_until(lambda: w.session.pairs.choices and w.picker.target.count() > 1)
    return w.picker


def test_incompatible_pair_refused_with_reason(qtbot, window, tiny_target, mismatched_draft):
    window.picker.set_pair(str(tiny_target), str(mismatched_draft))
    verdict = _verdict(window)
    assert verdict.compatible is False
    assert "vocabulary size differs" in verdict.text
    label = window.picker.verdict_label
    # One line, led by the reason; the whole reasoning on hover (and on a click).
    assert label.text().startswith("✗ incompatible:") and "\n" not in label.text()
    assert "vocabulary size differs" in label.headline()
    assert "vocabulary size differs" in label.toolTip().lower()
    assert not label.wordWrap()
    assert not window.picker.load_button.isEnabled()
    window.picker.load_button.click()  # refused: nothing starts
    assert not window.session.engine.loading


def test_engine_refusal_is_shown(qtbot, window, tiny_target, mismatched_draft):
    # Even if the pair gets past the picker, the engine refuses it on load.
    window.load_pair(str(tiny_target), str(mismatched_draft))
    wait_until(lambda: not window.session.engine.loading, timeout=60_000)
    assert window.session.engine.pair is None
    assert window.error_banner.isVisible()
    text = window.error_banner.label.text()
    assert "cannot draft for" in text
    label = window.picker.verdict_label
    assert label.text().startswith("✗ could not load:") and "\n" not in label.text()
    assert "cannot draft for" in label.headline() and "cannot draft for" in label.toolTip().lower()
    assert not window.composer.send_button.isEnabled()


def test_lookup_choice_is_compatible(qtbot, window, tiny_target):
    window.picker.set_pair(str(tiny_target), None)
    assert window.picker.draft.currentText() == "No draft: suffix matching"
    assert window.picker.selection() == (str(tiny_target), None)
    assert _verdict(window).compatible is True
    assert window.picker.load_button.isEnabled()


def test_picker_lists_bundled_and_catalog(window):
    picker = _listed(window)
    refs = [picker.target.itemData(i) for i in range(picker.target.count())]
    assert "bundled:smollm2-135m" in refs
    assert "bundled:qwen2.5-coder-1.5b" in refs
    assert window.picker.draft.itemData(0) is None  # suffix matching first


def test_a_built_in_model_the_app_does_not_carry_is_not_offered(monkeypatch):
    """Issue 33: the packaged app carries the default pair but not SmolLM2
    (its package depends on llama-cpp-python), yet listed "SmolLM2 135M
    (built in)", which could only fail with a hint to run ./dev. A built-in
    model is offered only when its packages are installed."""
    from specchat.library import bundled
    from specchat.library.bundled import BundledModel
    from specchat.ui import library_view

    absent = BundledModel("smollm2-135m", "SmolLM2 135M Instruct", "135M", "llama", "Q4_1",
                          "0" * 64, (("specchat-no-such-dist", "x/*.gguf"),))
    monkeypatch.setitem(bundled.BUNDLED, "smollm2-135m", absent)
    bundled.shipped.cache_clear()
    try:
        refs = [c.ref for c in library_view.model_choices() if c.group == "bundled"]
    finally:
        bundled.shipped.cache_clear()
    assert refs == ["bundled:qwen2.5-coder-1.5b", "bundled:qwen2.5-coder-0.5b"]


def test_load_progress_shown_and_cancellable(qtbot, window, tiny_target, tiny_draft):
    window.load_pair(str(tiny_target), str(tiny_draft))
    assert window.load_banner.isVisible()
    assert window.load_banner.button.text() == "Cancel"
    pair = load(qtbot, window, tiny_target, tiny_draft)
    assert pair.target.name == "target-llama"
    assert not window.load_banner.isVisible()
    assert window.windowTitle().startswith("target-llama")


def test_cancel_loading(qtbot, window, tiny_target, tiny_draft):
    window.load_pair(str(tiny_target), str(tiny_draft))
    window.load_banner.button.click()  # Cancel
    wait_until(lambda: not window.session.engine.loading, timeout=60_000)
    assert window.session.engine.pair is None  # Cancel takes effect at the next progress step
    assert "cancelled" in window.statusBar().currentMessage()
    assert not window.error_banner.isVisible()
    assert "could not load" not in window.picker.verdict_label.full_text()
    assert not window.load_banner.isVisible()
    # A new load after a cancelled one works.
    assert load(qtbot, window, tiny_target, tiny_draft) is not None


def test_model_manager_opens_and_lists(qtbot, window, tiny_target):
    dlg = window.open_model_manager()
    qtbot.addWidget(dlg)
    assert "Models are stored in" in dlg.where.text()
    assert dlg.catalog.rowCount() >= 1  # the catalog ships with the app
    fut = dlg.import_path(str(tiny_target), "tiny-imported")
    wait_until(fut.done, timeout=60_000)
    fut.result()
    names = [dlg.installed.item(r, 0).text() for r in range(dlg.installed.rowCount())]
    assert "tiny-imported" in names, dlg.tasks.itemAt(0).widget().detail.text()
    box = window.picker.target
    wait_until(lambda: box.findData("tiny-imported") >= 0)  # read again off the GUI thread
    refs = [box.itemData(i) for i in range(box.count())]
    assert "tiny-imported" in refs
    dlg.installed.selectRow(names.index("tiny-imported"))
    deleting = dlg.delete_selected(confirm=False)
    wait_until(deleting.done, timeout=30_000)
    assert dlg.tasks.itemAt(dlg.tasks.count() - 1).widget().detail.text() == "Deleted."
    assert "tiny-imported" not in [dlg.installed.item(r, 0).text()
                                   for r in range(dlg.installed.rowCount())]


def test_the_model_managers_delete_button_asks_first(qtbot, window, tiny_target, monkeypatch):
    """Delete… asks before it removes a model from disk, and No keeps it.
    Before, Qt handed the button's ``checked`` (False) to
    ``delete_selected``'s ``confirm``: a click deleted at once."""
    from PySide6.QtWidgets import QMessageBox

    asked: list[str] = []
    monkeypatch.setattr(QMessageBox, "question", staticmethod(
        lambda _parent, _title, text, *_a: asked.append(text) or QMessageBox.StandardButton.No))
    dlg = window.open_model_manager()
    qtbot.addWidget(dlg)
    fut = dlg.import_path(str(tiny_target), "tiny-kept")
    wait_until(fut.done, timeout=60_000)
    fut.result()
    names = [dlg.installed.item(r, 0).text() for r in range(dlg.installed.rowCount())]
    dlg.installed.selectRow(names.index("tiny-kept"))
    tasks = dlg.tasks.count()
    dlg.delete_button.click()
    assert len(asked) == 1 and asked[0].startswith("Delete tiny-kept (")
    assert dlg.tasks.count() == tasks  # nothing started
    assert "tiny-kept" in [dlg.installed.item(r, 0).text() for r in range(dlg.installed.rowCount())]


def test_refusal_suggests_drafts_that_fit(qtbot, window):
    # Judged from the catalog: nothing is converted or downloaded for this.
    window.picker.set_pair("bundled:qwen2.5-coder-1.5b",
                           "hf:mlx-community/Llama-3.2-1B-Instruct-4bit")
    verdict = _verdict(window)
    assert verdict.compatible is False
    assert "different tokenizers" in verdict.text
    assert "drafts that fit this target" in verdict.text
    assert "qwen2.5-coder-0.5b" in verdict.text
    assert not window.picker.load_button.isEnabled()


def test_same_tokenizer_from_catalog_is_compatible(qtbot, window):
    window.picker.set_pair("bundled:qwen2.5-coder-1.5b", "bundled:qwen2.5-coder-0.5b")
    verdict = _verdict(window)
    assert verdict.compatible is True and "Qwen2.5 tokenizer" in verdict.text
    assert window.picker.verdict_label.text().startswith("✓")


def test_the_verdict_is_a_headline_with_the_reasoning_on_hover_and_click(qtbot, window):
    from PySide6.QtCore import Qt
    from specchat.ui.library_view import Verdict
    from specchat.ui.pair_lines import verdict_headline

    reasons = ("same tokenizer (151,665 tokens, identical ids and special tokens), so every "
               "draft token means the same to the target",
               "the draft is 2.8x smaller (494M vs 1.5B parameters)",
               "both caches can be rewound after rejected draft tokens")
    assert verdict_headline(Verdict(True, reasons)) == "✓ compatible · draft 2.8× smaller"
    assert verdict_headline(Verdict(False, ("vocabulary size differs", "x"))) == \
        "✗ incompatible: vocabulary size differs"
    assert verdict_headline(Verdict(None, ())) == "? checked when the pair loads"

    window.picker.show_verdict(Verdict(True, reasons))
    label = window.picker.verdict_label
    assert label.text() == "✓ compatible · draft 2.8× smaller"
    assert "Same tokenizer (151,665 tokens" in label.toolTip()
    assert label.height() < 2 * label.fontMetrics().height() + 8  # one line in the bar
    qtbot.mouseClick(label, Qt.MouseButton.LeftButton)  # unfolds the reasoning
    assert label.expanded and "2.8x smaller (494M vs 1.5B" in label.text()
    qtbot.mouseClick(label, Qt.MouseButton.LeftButton)
    assert label.text() == "✓ compatible · draft 2.8× smaller"

    long_reason = "the draft's tokenizer differs from the target's " * 8
    window.picker.show_verdict(Verdict(False, (long_reason,)))
    assert label.text().endswith("…") and "\n" not in label.text()  # one elided line
    assert label.fontMetrics().horizontalAdvance(label.text()) <= label.width()
    assert long_reason.strip()[1:] in label.toolTip()


def test_a_cluster_is_a_target_once_its_ranks_answer(qtbot, window, tiny_target, tiny_draft):
    """A cluster defined with ``specchat cluster create`` is listed as
    "<model> on cluster <name>", greyed out with the reason until rank 1
    (a real ``specchat cluster rank`` process) waits on its port."""
    import select
    import socket
    import subprocess
    import sys

    from specchat.engine.distributed import hostfile
    from specchat.library.sources.cluster import clusters_dir

    with socket.socket() as s:  # a free control port for rank 1
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = hostfile.plan("lab", tiny_target, ["127.0.0.1", "127.0.0.1"], port - 3)
    hostfile.write(clusters_dir() / "lab", spec)
    picker = _listed(window)
    pairs = window.session.pairs

    def poll() -> None:
        """One poll from now on, waited for (not the timer's, begun earlier)."""
        wait_until(pairs.poll_clusters().done, timeout=10_000)
        wait_until(pairs.poll_clusters().done, timeout=10_000)

    def entry():
        i = picker.target.findData("cluster:lab")
        return None if i < 0 else (picker.target.itemText(i), picker.target.model().item(i))

    poll()
    text, item = entry()
    assert text == f"{tiny_target.name} on cluster lab  (not answering)"
    assert not item.isEnabled()
    assert "specchat cluster start lab" in item.toolTip()
    assert picker.draft.findData("cluster:lab") < 0  # the draft runs here, never on a cluster

    with (clusters_dir() / "lab" / "secret").open("rb") as key:  # as `cluster start` hands it
        rank = subprocess.Popen([sys.executable, "-m", "specchat", "cluster", "rank", "--rank",
                                 "1", "--listen", f"127.0.0.1:{spec.ranks[1].control_port}"],
                                stdin=key, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    try:
        assert select.select([rank.stdout], [], [], 60)[0], "rank 1 did not start"
        assert "waiting for rank 0" in rank.stdout.readline()
        poll()
        assert entry()[1].isEnabled()
        assert entry()[0] == f"{tiny_target.name} on cluster lab  (2 ranks)"
        picker.set_pair("cluster:lab", str(tiny_draft))
        assert picker.selection() == ("cluster:lab", str(tiny_draft))
        assert _verdict(window).compatible is True  # the folder reads as its target
        assert rank.poll() is None  # being asked costs the rank nothing: it still waits
    finally:
        rank.kill()
        rank.wait(10)
        rank.stdout.close()
    poll()
    assert "not answering" in entry()[0]
    assert entry()[1].isEnabled()  # chosen: it stays pickable


def test_the_pair_controller_answers_without_a_window_and_reads_off_the_gui_thread(
        qtbot, aloop, home, tiny_target, mismatched_draft, monkeypatch):
    """The picker's work is the session's PairController's: with no window
    it lists the choices, works out a verdict (and the drafts that would
    fit), polls the clusters and reads the drafts measured here, each read
    on an executor thread, never the GUI thread; a picker widget given it
    shows the same with no window to find a session in. Before, the widget
    did all of this itself, reading the library on the GUI thread, and
    found its session through ``self.window()``."""
    import threading

    from specchat.library import recommendations as rec
    from specchat.ui import library_view
    from specchat.ui.pair_picker import PairPicker
    from specchat.ui.session import AppSession

    on_gui: list[str] = []

    def watched(module, name: str) -> None:
        real = getattr(module, name)

        def call(*args, **kwargs):
            if threading.current_thread() is threading.main_thread():
                on_gui.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, call)

    for name in ("model_choices", "check_pair", "suggest_drafts", "cluster_states"):
        watched(library_view, name)
    watched(rec, "remembered")
    target, other = str(tiny_target), str(mismatched_draft)
    measured = rec.make_result(target, "hf:some/draft", "some draft", rec.machine(), "cpu/float32",
                               drafted=10, accepted=8, judged=10, draft_cost=0.2,
                               verify_slope=0.05, tokens=64, tokens_per_s=80.0,
                               plain_tokens_per_s=50.0, prompts=1)
    rec.remember(measured)

    session = AppSession(NoEngine(), home / "c.sqlite3")
    pairs = session.pairs
    wait_until(pairs.reload_choices().done)
    assert "bundled:smollm2-135m" in [c.ref for c in pairs.choices]
    wait_until(pairs.poll_clusters().done)
    assert pairs.clusters == []  # none defined here
    verdicts: list = []
    pairs.verdictChanged.connect(verdicts.append)
    wait_until(pairs.check(target, other).done, timeout=30_000)
    assert verdicts == [pairs.verdict] and pairs.verdict.compatible is False
    assert "vocabulary size differs" in pairs.verdict.text
    assert pairs.measured(target) == {}  # not read yet: read now, said when in
    wait_until(lambda: pairs.measured(target) == {"hf:some/draft": measured})

    picker = PairPicker(pairs)  # no window around it
    qtbot.addWidget(picker)
    assert picker.target.findData("bundled:smollm2-135m") >= 0
    picker.set_pair(target, other)
    wait_until(lambda: picker.verdict_label.text().startswith("✗ incompatible:"),
               timeout=30_000)
    assert not picker.load_button.isEnabled()
    assert on_gui == []
    session.close()


def test_the_picker_widget_reads_and_asks_nothing_itself():
    """The widget module draws and forwards: it imports nothing from the
    library at run time and calls nothing that reads files, probes ranks or
    runs work in an executor, nor looks its session up in its window."""
    import ast
    from pathlib import Path

    from specchat.ui import pair_picker

    tree = ast.parse(Path(pair_picker.__file__).read_text(encoding="utf-8"))
    checked_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                    and getattr(node.test, "id", "") == "TYPE_CHECKING"
                    for n in ast.walk(node)}
    imported = {node.module for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and id(node) not in checked_only}
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for a in node.names}
    assert not [m for m in imported if m.startswith("specchat.library") or m in (
        "asyncio", "os", "pathlib", "socket", "subprocess")], imported
    called = {n.attr if isinstance(n, ast.Attribute) else n.id for node in ast.walk(tree)
              if isinstance(node, ast.Call) for n in [node.func]
              if isinstance(n, ast.Attribute | ast.Name)}
    readers = {"model_choices", "check_pair", "suggest_drafts", "cluster_states", "remembered",
               "head_fits", "head_verdict",
               "run_in_executor", "ensure_future", "window", "open", "read_text"}
    assert called & readers == set()
