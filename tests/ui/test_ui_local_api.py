"""Settings' "Local server" in a real window: the openai client talks to the
pair the window loaded, on the window's own engine thread; what it does
shows in the status bar's API line, never in the chat; and it takes its
turn with the chat and with Compare instead of fighting them."""

from __future__ import annotations

import socket
import threading

from openai import OpenAI
from specchat.store.settings import AppSettings
from specchat.ui.settings import SettingsDialog
from ui_support import load, wait_until


def ask(api, model: str, max_tokens: int = 12) -> dict:
    """One chat request on a thread of its own (the window keeps running):
    the dict gets "reply" or "error" when it ends."""
    out: dict = {}

    def run() -> None:
        try:
            with OpenAI(base_url=api.url, api_key="unused", max_retries=0, timeout=120) as c:
                out["reply"] = c.chat.completions.create(
                    model=model, temperature=0, max_tokens=max_tokens,
                    messages=[{"role": "user", "content": "Hello, world!"}])
        except Exception as exc:  # noqa: BLE001 - reported by answer()
            out["error"] = exc

    threading.Thread(target=run, daemon=True).start()
    return out


def answer(out: dict):
    assert "reply" in out, out.get("error")
    return out["reply"]


def serve(window) -> None:
    window.session.update_settings(local_server=True, server_port=0)
    assert window.session.api.running


def test_local_server_switch_serves_the_window_pair(qtbot, window, tiny_target, tiny_draft):
    """Settings' "Local server" on: the openai client gets a reply from the
    pair the window loaded, the status line shows the request while it
    runs, and the user's chats are untouched."""
    load(qtbot, window, tiny_target, tiny_draft)
    api = window.session.api
    assert not api.running and window.api_activity.isHidden()
    chats = window.session.conversations.blocking.list()
    seen: list[str] = []
    api.activityChanged.connect(seen.append)

    dlg = SettingsDialog(window.session.settings, window)
    qtbot.addWidget(dlg)
    assert not dlg.local_server.isChecked() and dlg.port.value() == AppSettings.server_port
    dlg.local_server.setChecked(True)
    dlg.port.setValue(0)  # any free port
    window.session.update_settings(**dlg.edited())  # what the dialog's OK does
    assert api.running and window.api_activity.text() == "API: idle"
    assert window.api_activity.isVisible() and api.url.startswith("http://127.0.0.1:")

    out = ask(api, tiny_target.name)
    wait_until(lambda: out and window.api_activity.text() == "API: idle")
    reply = answer(out)
    n = reply.usage.completion_tokens
    assert f"API: generating for {tiny_target.name} · {n} tokens" in seen
    assert reply.model_extra["speculative"]["mode"] == window.session.next_mode().name
    # Nothing of it in the chat or the history.
    assert window.chat_model.messages == []
    assert window.session.conversations.blocking.list() == chats

    window.session.update_settings(local_server=False)
    assert not api.running and window.api_activity.isHidden()
    assert window.session.store.settings.blocking.load().local_server is False


def test_a_port_in_use_turns_the_switch_back_off(qtbot, window, tiny_target):
    load(qtbot, window, tiny_target)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    errors: list[str] = []
    window.session.failed.connect(errors.append)
    try:
        port = taken.getsockname()[1]
        window.session.update_settings(local_server=True, server_port=port)
    finally:
        taken.close()
    assert errors == [f"The local server did not start: Port {port} on 127.0.0.1 is in use "
                      "by another program: choose another port."]
    assert not window.session.api.running and window.session.settings.local_server is False



def test_a_request_waits_for_the_chat_reply_and_for_compare(qtbot, window, tiny_target,
                                                            tiny_draft):
    """An API request made while the chat is replying is answered as well
    (the one engine thread runs both, in turn), and one made while Compare
    holds the engine waits until Compare lets go; neither the chat nor the
    API is refused, and the API's greedy text is what it is alone."""
    load(qtbot, window, tiny_target, tiny_draft)
    serve(window)
    api = window.session.api
    alone = answer(wait_for(ask(api, tiny_target.name)))

    window.session.update_settings(max_tokens=200)
    window.composer.edit.setPlainText("Tell me about speculative decoding.")
    window.composer.send_button.click()
    assert window.conversation.busy
    out = ask(api, tiny_target.name)
    wait_until(lambda: out and not window.conversation.busy)
    assert answer(out).choices[0].message.content == alone.choices[0].message.content
    assert window.chat_model.messages[-1].summary is not None  # the chat reply finished
    assert not window.error_banner.isVisible()

    seen: list[str] = []
    api.activityChanged.connect(seen.append)
    window.session.engine.hold("Compare")
    out = ask(api, tiny_target.name)
    wait_until(lambda: "API: 1 waiting for the engine" in seen)
    assert not out  # it waits while Compare holds the engine
    window.session.engine.release("Compare")
    wait_for(out)
    assert answer(out).choices[0].message.content == alone.choices[0].message.content


def wait_for(out: dict) -> dict:
    wait_until(lambda: bool(out))
    return out


def test_the_window_server_answers_only_its_own_and_listed_origins(qtbot, window, tiny_target):
    """Settings' allowed origins reach the running server (it restarts with
    them); a page of another origin and a foreign Host are refused."""
    import http.client

    load(qtbot, window, tiny_target)
    serve(window)
    api = window.session.api

    def preflight(origin: str, host: str | None = None) -> tuple[int, str | None]:
        conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=30)
        conn.request("OPTIONS", "/v1/chat/completions", headers={
            "Host": host or f"127.0.0.1:{api.port}", "Origin": origin,
            "Access-Control-Request-Method": "POST"})
        r = conn.getresponse()
        r.read()
        conn.close()
        return r.status, r.getheader("access-control-allow-origin")

    assert preflight("http://app.example:5173") == (403, None)
    dlg = SettingsDialog(window.session.settings, window)
    qtbot.addWidget(dlg)
    assert dlg.cors_origins.text() == ""
    dlg.cors_origins.setText("http://app.example:5173  https://Other.example/")
    assert dlg.problem() == ""
    window.session.update_settings(**dlg.edited())
    assert window.session.settings.server_cors_origins == ("http://app.example:5173",
                                                           "https://other.example")
    assert api.running
    assert preflight("http://app.example:5173") == (200, "http://app.example:5173")
    assert preflight("https://other.example") == (200, "https://other.example")
    assert preflight("http://evil.example") == (403, None)
    assert preflight("http://app.example:5173", host=f"evil.example:{api.port}")[0] == 421
    dlg.cors_origins.setText("app.example")
    assert dlg.problem().startswith("an allowed origin must be scheme://host[:port]")
    assert not dlg.buttons.button(dlg.buttons.StandardButton.Ok).isEnabled()
