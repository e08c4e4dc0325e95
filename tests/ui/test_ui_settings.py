"""The settings dialog: presets, sampling values, system prompt; and that a
reply uses them."""

from __future__ import annotations

from specchat.engine import modes
from specchat.store.settings import AppSettings
from specchat.ui.requests import build_request, reply_mode
from specchat.ui.settings import SettingsDialog
from ui_support import load, send_and_wait


def test_settings_dialog_presets_and_values(qtbot):
    dlg = SettingsDialog(AppSettings())
    qtbot.addWidget(dlg)
    assert dlg.preset.currentText() == "Greedy"
    dlg.preset.setCurrentText("Balanced")
    dlg.preset.activated.emit(dlg.preset.currentIndex())
    v = dlg.values()
    assert (v.temperature, v.top_p, v.top_k) == (0.7, 0.9, 40)
    dlg.temperature.setValue(0.33)
    assert dlg.preset.currentText() == "Custom"
    dlg.system.setPlainText("Answer in French.")
    dlg.max_tokens.setValue(100)
    dlg.seed.setValue(7)
    v = dlg.values()
    assert v.system_prompt == "Answer in French." and v.max_tokens == 100 and v.seed == 7


def test_request_follows_settings():
    from specchat.engine.events import Message

    s = AppSettings(system_prompt="Be brief.", temperature=0.5, top_p=0.8, top_k=20,
                    max_tokens=64, k=4)
    r = build_request(s, [Message("user", "hi")], modes.get("hybrid"))
    assert r.messages[0] == Message("system", "Be brief.") and r.messages[1].content == "hi"
    assert (r.sampling.temperature, r.sampling.top_p, r.sampling.top_k) == (0.5, 0.8, 20)
    assert r.max_tokens == 64 and r.draft.k == 4 and r.draft.mode == "hybrid"
    assert reply_mode(AppSettings(speculative=False), None).name == "plain"


def test_settings_saved_and_used(qtbot, window, tiny_target, tiny_draft):
    load(qtbot, window, tiny_target, tiny_draft)
    window.session.update_settings(max_tokens=7, temperature=0.0)
    msg = send_and_wait(qtbot, window)
    assert msg.summary.new_tokens <= 7
    assert window.session.store.settings.blocking.load().max_tokens == 7


def test_stored_port_is_checked():
    from specchat.server.listener import DEFAULT_PORT
    from specchat.store.settings import checked_changes, from_stored

    assert AppSettings().server_port == DEFAULT_PORT  # the app and `specchat serve` agree
    settings, bad = from_stored({"server_port": 70000, "local_server": "yes", "top_k": 3})
    assert (settings.server_port, settings.local_server, settings.top_k) == (
        DEFAULT_PORT, False, 3)
    assert bad == ["local server", "port"]
    good, refused = checked_changes({"server_port": -1})
    assert good == {} and refused[0].startswith("port must be a whole number from 0 to 65535")


def test_stored_cors_origins_are_checked():
    from specchat.store.settings import checked_changes, from_stored

    assert AppSettings().server_cors_origins == ()  # CORS off until the user lists an origin
    settings, bad = from_stored({"server_cors_origins": ["http://App.example:5173/"]})
    assert settings.server_cors_origins == ("http://app.example:5173",) and bad == []
    for stored in (["*"], "http://app.example", [1], ["http://a.example", "null"]):
        settings, bad = from_stored({"server_cors_origins": stored, "top_k": 3})
        assert settings.server_cors_origins == () and settings.top_k == 3
        assert bad == ["allowed origins"]
    good, refused = checked_changes({"server_cors_origins": ("http://a.example", "b")})
    assert good == {} and refused[0].startswith("an allowed origin must be")
