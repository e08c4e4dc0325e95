"""The local API inside the app: Settings' "Local server" switch.

When the switch is on and a pair is loaded, the OpenAI-compatible server
(``specchat.server``) listens on 127.0.0.1 at the chosen port (answering
the web pages of the origins listed in Settings, and no other), on a thread
and asyncio loop of its own, and submits its requests to the window's own
``EngineClient``: one set of loaded models, one engine thread running jobs
in order. So a request from an editor while a chat reply is generating
waits for it (and a chat message sent during an API request waits too);
neither refuses the other. While the pair changes or Compare holds the
engine, API requests wait (``ApiService.pause``); they answer with the
pair loaded when their turn comes. What the API does is reported here as
one line of text for the window's activity label, never in the chat.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Signal, Slot

from specchat.errors import SpecChatError
from specchat.server.service import ApiService, Served
from specchat.store.settings import AppSettings

log = logging.getLogger("specchat.ui")


def activity_text(activity) -> str:
    """The status line for a ``server.service.Activity``: a running
    request's model, tokens, the tool call it made last (as it is made)
    and the requests waiting behind it."""
    if activity.state == "generating":
        line = f"API: generating for {activity.model} · {activity.tokens} tokens"
        line += f" · calling {activity.tool}" if activity.tool else ""
        return line + (f" · {activity.waiting} waiting" if activity.waiting else "")
    if activity.state == "waiting":
        return f"API: {activity.waiting} waiting for the engine"
    return "API: idle"


class LocalApi(QObject):
    activityChanged = Signal(str)  # the status line ("" when the server is off)
    failed = Signal(str)  # the server could not start (a port in use)
    requestEnded = Signal()  # a request ended (Settings' prompt cache line looks again)
    _reported = Signal(object)  # an Activity, from the server's thread

    def __init__(self, session, parent=None):
        """``session``: the AppSession whose engine and settings it follows."""
        super().__init__(parent)
        self.session = session
        self._server = None
        self._service = None
        self._port: int | None = None  # the port the switch asked for
        self._origins: tuple[str, ...] = ()  # the web origins it allows (CORS)
        self.text = ""
        self._reported.connect(self._show)  # queued: delivered on the GUI thread
        engine = session.engine
        for signal in (engine.loadStarted, engine.loaded, engine.loadFailed, engine.heldChanged,
                       session.settingsChanged):
            signal.connect(self._sync)

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def url(self) -> str | None:
        """Where clients connect (``base_url``), while the server runs."""
        return self._server.url if self._server is not None else None

    @property
    def port(self) -> int | None:
        return self._server.port if self._server is not None else None

    def _sync(self, *_args) -> None:
        """Follow the switch, the port, the loaded pair and the engine's holder."""
        settings: AppSettings = self.session.settings
        engine = self.session.engine
        wanted = settings.local_server and (engine.pair is not None or self.running)
        if self.running and (not settings.local_server or settings.server_port != self._port
                             or settings.server_cors_origins != self._origins):
            self.stop()
        if wanted and not self.running and not self._start(settings):
            return
        if self._service is None:
            return
        self._service.serve(self._served())
        if engine.loading or engine.held_by is not None:
            self._service.pause()
        else:
            self._service.resume()

    def _served(self) -> Served | None:
        engine = self.session.engine
        if engine.pair is None:
            return None
        return Served.of(engine.pair, self.session.next_mode().name, self.session.settings.k,
                         engine.target_ref)

    def _start(self, settings: AppSettings) -> bool:
        from specchat.server.listener import LocalServer  # uvicorn: only once it is switched on

        self._port, self._origins = settings.server_port, settings.server_cors_origins
        service = ApiService(self.session.engine.client, self._served(),
                             on_activity=self._reported.emit)
        try:
            server = LocalServer(service, port=self._port, cors_origins=self._origins)
        except SpecChatError as exc:
            self.failed.emit(f"The local server did not start: {exc}")
            self.session.update_settings(local_server=False)  # the switch says what runs
            return False
        server.start()
        self._server, self._service = server, service
        log.info("Local API on %s", server.url)
        self._show(None)
        return True

    def stop(self) -> None:
        """Stop the server (its requests' engine jobs are cancelled)."""
        if self._server is None:
            return
        server, self._server, self._service = self._server, None, None
        server.stop()
        self._set_text("")

    @Slot(object)
    def _show(self, activity) -> None:
        if self._server is None:
            return  # a report that crossed the stop
        self._set_text("API: idle" if activity is None else activity_text(activity))
        if activity is not None and activity.finished is not None:
            self.requestEnded.emit()

    def _set_text(self, text: str) -> None:
        if text != self.text:
            self.text = text
            self.activityChanged.emit(text)
