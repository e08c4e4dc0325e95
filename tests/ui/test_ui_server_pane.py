"""Settings → Local server in a real window (issue 48 item 7): the endpoints
it lists are the server's own routes, copyable; the prompt cache's budget
reaches the engine, is saved and kept, and a bad one is refused in
``specchat.values``' words; its use line follows two conversations that a
real ``openai`` client alternates; and the status line names a tool call as
the model makes it. The Settings pane is saved as
docs/screenshots/ci-settings-local-server.png (CI keeps it)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from openai import OpenAI
from PySide6.QtGui import QGuiApplication
from specchat import values
from specchat.server.app import build_app
from specchat.server.service import ApiService
from specchat.store.settings import AppSettings, checked_changes, from_stored
from specchat.ui.settings import SettingsDialog
from tinymodels import AGENT_TOOLS
from ui_support import load, make_window, wait_until

SHOT = Path(__file__).resolve().parents[2] / "docs" / "screenshots" / \
    "ci-settings-local-server.png"


def settings_of(window) -> SettingsDialog:
    """Settings as the window opens it (its session: the running server, the engine)."""
    dlg = SettingsDialog(window.session.settings, window, window.session)
    dlg.resize(dlg.sizeHint())
    dlg.show()
    return dlg


def cache_use(window):
    """The engine's CacheUse, asked as the pane asks it (an awaited job)."""
    task = asyncio.ensure_future(window.session.engine.prompt_cache())
    wait_until(task.done)
    return task.result()


def in_thread(fn) -> dict:
    """``fn()`` on a thread of its own (the window keeps running): the dict
    gets "out" or "error" when it ends."""
    box: dict = {}

    def run() -> None:
        try:
            box["out"] = fn()
        except Exception as exc:  # noqa: BLE001 - reported by result()
            box["error"] = exc

    threading.Thread(target=run, daemon=True).start()
    return box


def result(box: dict):
    wait_until(lambda: bool(box))
    assert "out" in box, box.get("error")
    return box["out"]


def serve(window) -> None:
    window.session.update_settings(local_server=True, server_port=0)
    assert window.session.api.running


def test_the_pane_lists_exactly_the_servers_routes_and_copies_their_urls(qtbot):
    """The endpoints shown are the Starlette app's routes, each with what
    it is; Copy gives their full URLs under the base URL shown."""
    routes = [(sorted(r.methods - {"HEAD"}), r.path) for r in build_app(ApiService(None)).routes]
    dlg = SettingsDialog(AppSettings(server_port=8400))
    qtbot.addWidget(dlg)
    rows = dlg.endpoints.rows()
    assert [([method], path) for method, path, _ in rows] == routes
    assert all(what for _, _, what in rows) and len({w for _, _, w in rows}) == len(rows)
    assert dict((path, what) for _, path, what in rows)["/v1/messages"] == "Anthropic Messages"

    assert dlg.base_url.text() == "http://127.0.0.1:8400/v1"
    dlg.copy_base.click()
    assert QGuiApplication.clipboard().text() == "http://127.0.0.1:8400/v1"
    dlg.endpoints.selectRow(1)
    dlg.endpoints.copy()
    assert QGuiApplication.clipboard().text() == "http://127.0.0.1:8400/v1/chat/completions"
    dlg.port.setValue(9000)  # the URL follows the port typed
    dlg.endpoints.clearSelection()
    dlg.endpoints.copy()  # none selected: every endpoint
    assert QGuiApplication.clipboard().text().splitlines() == [
        f"http://127.0.0.1:9000{path}" for _, path in routes]


def test_a_bad_prompt_cache_is_refused_in_values_words(qtbot, window):
    """Typed, stored or handed to the session: the one line of values'
    "prompt cache" limit, and nothing changes."""
    dlg = settings_of(window)
    qtbot.addWidget(dlg)
    ok = dlg.buttons.button(dlg.buttons.StandardButton.Ok)
    assert dlg.prompt_cache_gb.text() == f"{values.PROMPT_CACHE_GB:g}" and ok.isEnabled()
    for typed in ("-1", "2000", "nan", "lots", ""):
        dlg.prompt_cache_gb.setText(typed)
        try:
            values.check("prompt cache", typed)
        except values.BadValue as exc:
            line = str(exc)
        assert line.startswith("prompt cache must be a number from 0 to 1024 (GB for "
                               "conversations put aside; 0 = one at a time)")
        assert dlg.problem() == line and dlg.error.text() == line and not ok.isEnabled()
    dlg.prompt_cache_gb.setText("0")  # one conversation at a time: allowed
    assert dlg.problem() == "" and ok.isEnabled() and dlg.edited()["prompt_cache_gb"] == 0.0

    settings, bad = from_stored({"prompt_cache_gb": -1, "top_k": 3})
    assert (settings.prompt_cache_gb, settings.top_k, bad) == (values.PROMPT_CACHE_GB, 3,
                                                                ["prompt cache"])
    errors: list[str] = []
    window.session.failed.connect(errors.append)
    window.session.update_settings(prompt_cache_gb=float("inf"))
    assert errors == ["prompt cache must be a number from 0 to 1024 (GB for conversations put "
                      "aside; 0 = one at a time); got inf; not changed."]
    assert window.session.settings.prompt_cache_gb == values.PROMPT_CACHE_GB
    assert checked_changes({"prompt_cache_gb": "1.5"})[0] == {"prompt_cache_gb": 1.5}


def test_the_prompt_cache_budget_reaches_the_engine_and_is_kept(qtbot, aloop, home,
                                                                tiny_target):
    """Set in Settings, the budget is the engine's at once and is saved; a
    new window (the app started again) shows it and gives it to its engine
    when its pair loads."""
    w = make_window(qtbot)
    load(qtbot, w, tiny_target)
    assert cache_use(w).budget == int(values.PROMPT_CACHE_GB * values.GB)
    dlg = settings_of(w)
    qtbot.addWidget(dlg)
    dlg.prompt_cache_gb.setText("0.25")
    w.session.update_settings(**dlg.edited())  # what the dialog's OK does
    assert cache_use(w).budget == values.GB // 4
    assert w.session.store.settings.blocking.load().prompt_cache_gb == 0.25
    w.close()

    again = make_window(qtbot)
    try:
        reopened = settings_of(again)
        qtbot.addWidget(reopened)
        assert reopened.prompt_cache_gb.text() == "0.25"
        load(qtbot, again, tiny_target)
        assert cache_use(again).budget == values.GB // 4
        again.session.update_settings(prompt_cache_gb=0.0)  # one conversation at a time
        assert cache_use(again).budget == 0
    finally:
        again.close()


def chat(api, model: str, text: str, previous: tuple = ()) -> tuple:
    """One turn of a conversation over the real ``openai`` client, on a
    thread of its own: the conversation so far, the reply's turn included."""
    messages = [*previous, {"role": "user", "content": text}]

    def ask():
        with OpenAI(base_url=api.url, api_key="unused", max_retries=0, timeout=120) as c:
            reply = c.chat.completions.create(model=model, temperature=0, max_tokens=8,
                                              messages=messages)
        return (*messages, {"role": "assistant", "content": reply.choices[0].message.content})

    return result(in_thread(ask))


# Two conversations that share only the template's opening, each well over
# what the engine keeps aside (engine/session.py KEEP_MIN: 32 tokens).
FIRST = "Please review this function for me: " + " ".join(
    f"alpha{i} beta{i} gamma{i}" for i in range(20))
SECOND = "Tell me a story about a quiet harbour: " + " ".join(
    f"delta{i} omega{i} sigma{i}" for i in range(20))


def test_the_use_line_follows_two_conversations_served(qtbot, window, tiny_target, tiny_draft):
    """Two conversations that alternate through the window's server: the
    second puts the first aside, the first's next turn takes it back and
    puts the second aside; the open Settings pane says so after each
    request, without being asked."""
    load(qtbot, window, tiny_target, tiny_draft)
    serve(window)
    api, model = window.session.api, tiny_target.name
    dlg = settings_of(window)
    qtbot.addWidget(dlg)
    assert dlg.base_url.text() == api.url  # where the running server is
    wait_until(lambda: dlg.cache_use.text() == "holds 0 conversations aside, 0.0 MB of 2 GB")

    first = chat(api, model, FIRST)
    second = chat(api, model, SECOND)
    wait_until(lambda: dlg.cache_use.text().startswith("holds 1 conversation aside, "))
    held = cache_use(window)
    assert (held.conversations, held.switches) == (1, 0) and held.held > 0
    assert dlg.cache_use.text() == (f"holds 1 conversation aside, "
                                    f"{held.held / 2 ** 20:.1f} MB of 2 GB")

    chat(api, model, "And now?", first)  # the first conversation again: taken back
    wait_until(lambda: cache_use(window).switches == 1)
    wait_until(lambda: dlg.cache_use.text().startswith("holds 1 conversation aside, "))
    chat(api, model, "Go on.", second)
    assert cache_use(window).switches == 2

    SHOT.parent.mkdir(parents=True, exist_ok=True)
    assert dlg.grab().save(str(SHOT))


def test_the_status_line_names_a_tool_call_as_it_is_made(qtbot, window, agent_target,
                                                        agent_draft):
    """The scripted agent model reasons, then calls get_weather and
    get_time: the API line names each call from the step that completes it
    until the reply ends."""
    load(qtbot, window, agent_target, agent_draft)
    serve(window)
    api = window.session.api
    seen: list[str] = []
    api.activityChanged.connect(seen.append)

    def ask():
        with OpenAI(base_url=api.url, api_key="unused", max_retries=0, timeout=120) as c:
            return c.chat.completions.create(
                model=agent_target.name, temperature=0, max_tokens=40, tools=AGENT_TOOLS,
                messages=[{"role": "user", "content": "What's the weather in Paris?"}])

    reply = result(in_thread(ask))
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == [
        "get_weather", "get_time"]
    wait_until(lambda: seen and seen[-1] == "API: idle")
    prefix = f"API: generating for {agent_target.name} · "
    generating = [s for s in seen if s.startswith(prefix)]
    named = [s.rpartition(" · calling ")[2] if " · calling " in s else None for s in generating]
    # No name before the first call, then each call's name from its step on, in order.
    assert named[0] is None and "get_weather" in named and named[-1] == "get_time"
    firsts = [n for i, n in enumerate(named) if n is not None and (i == 0 or named[i - 1] != n)]
    assert firsts == ["get_weather", "get_time"]
    assert all(s.endswith(" tokens") or " tokens · calling " in s for s in generating)
