"""What the API tests share: raw HTTP requests to a server on loopback
(``post``, ``call``), the error object of an answer, and ``specchat serve``
run as a person runs it (``Serving``)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading


def post(server, path: str, body, headers: dict | None = None) -> tuple[int, dict, str]:
    """A raw HTTP POST (``body``: bytes, or an iterable of chunks, sent
    chunked with no length): (status, headers, body text)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("POST", "/v1" + path, body,
                     {"Content-Type": "application/json", **(headers or {})},
                     encode_chunked=not isinstance(body, bytes))
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read().decode()
    finally:
        conn.close()


def call(port: int, method: str, path: str, body: bytes | None = None,
         headers: dict | None = None, host: str = "127.0.0.1") -> tuple[int, dict, str]:
    """One raw request to ``/v1<path>`` with exactly these headers over
    the defaults (a loopback Host with the port, a JSON body); a header
    given as None is not sent. (status, lower-cased headers, body text)."""
    defaults = {"Host": f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"}
    if body is not None:
        defaults["Content-Type"] = "application/json"
    sent = {k: v for k, v in {**defaults, **(headers or {})}.items() if v is not None}
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request(method, "/v1" + path, body, sent)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
    finally:
        conn.close()


def error(text: str) -> dict:
    return json.loads(text)["error"]


class Serving:
    """``specchat serve`` in a process of its own, as a person runs it; its
    stderr is read as it comes (``lines``)."""

    def __init__(self, args: list[str], home, env: dict | None = None):
        self.proc = subprocess.Popen([sys.executable, "-m", "specchat", "serve", *args],
                                     env={**os.environ, "SPECCHAT_HOME": str(home), **(env or {})},
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.url = None
        for line in self.proc.stderr:
            self.lines.append(line)
            found = re.search(r"SpecChat API on (http://\S+/v1)", line)
            if found:
                self.url = found.group(1)
                break
        assert self.url, "".join(self.lines)
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr),
                                        daemon=True)
        self._reader.start()

    def stop(self) -> str:
        """Ctrl+C; everything it wrote to stderr."""
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(60) == 0, "".join(self.lines)
        self._reader.join(10)
        return "".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
