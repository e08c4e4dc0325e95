"""A Hugging Face Hub look-alike on 127.0.0.1 for download tests.

It serves the endpoints the real ``huggingface_hub`` client calls for
``model_info``, ``list_repo_tree``, ``hf_hub_download`` and
``snapshot_download``, with the headers the client checks:

* ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}``:
  ``sha`` and ``siblings`` (with ``?blobs=true`` sizes, blob ids and LFS info).
* ``GET /api/models/{repo}/tree/{rev}``: the file list.
* ``HEAD``/``GET /{repo}/resolve/{rev}/{file}``: small files answer 200 with
  ``ETag`` (git blob id), ``X-Repo-Commit`` and ``Content-Length``; LFS
  files (safetensors, anything large) answer 302 to a "CDN" URL on another
  origin (``localhost`` instead of ``127.0.0.1``, so the client does not
  follow it on HEAD and strips the token, as with the real CDN), with
  ``X-Linked-Etag`` (sha256) and ``X-Linked-Size``.
* ``GET /cdn/{sha256}``: the bytes, honouring ``Range`` (206 + Content-Range).
* Errors carry ``X-Error-Code`` (RepoNotFound, RevisionNotFound,
  EntryNotFound) like the Hub.

Test hooks: every request is recorded (method, path, headers) and the body
bytes sent per file are counted (``sent``). Faults, each as a real network
or a broken server would show it:

* ``drop_after``: the next N downloads of a file hang up after some bytes.
* ``tamper``: a file's bytes differ from the sha256 / blob id the API and
  the headers advertise (a tampered CDN or a corrupting proxy).
* ``stall``: accept the connection and never answer, on the model info
  (``"info"``), on ``/resolve`` (HEAD and GET, before any header) or in the
  middle of a file's body (to time out, cancel or kill a client mid-file at
  an exact byte); stalled handlers are released by ``released.set()`` or
  ``stop``.
* ``fail``: answer the model info (``"info"``) or a file with any status,
  content type and body: a 500, or a captive portal's HTML page with 200.
* ``oversize``: a file's body is longer than the size the API advertises
  (with a matching Content-Length, as a bad mirror would send it).
* ``endless``: the model info (``"info"``) or a file's body never ends (no
  Content-Length; bytes until the client hangs up or ``stop``).
* ``info_fields``: fields of the model info answer replaced, e.g. a ``sha``
  that is not a commit id (a hostile or broken endpoint).
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_MIN = 1024  # files at least this big (and all safetensors) are LFS


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    repo_id: str
    files: dict[str, bytes]
    gated: bool = False
    sha: str = ""
    history: dict[str, dict[str, bytes]] = field(default_factory=dict)

    def __post_init__(self):
        self.commit()

    def commit(self) -> str:
        h = hashlib.sha1(self.repo_id.encode())
        for name in sorted(self.files):
            h.update(name.encode() + b"\0" + hashlib.sha256(self.files[name]).digest())
        self.sha = h.hexdigest()
        self.history[self.sha] = dict(self.files)
        return self.sha

    def files_at(self, rev: str) -> dict[str, bytes] | None:
        if rev in ("main", self.sha):
            return self.files
        return self.history.get(rev)

    def sha_for(self, rev: str) -> str | None:
        if rev == "main":
            return self.sha
        return rev if rev in self.history else None


def is_lfs(name: str, data: bytes) -> bool:
    return name.endswith((".safetensors", ".bin", ".gguf")) or len(data) >= LFS_MIN


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    status: int | None = None  # what the server answered


class HubServer:
    """Start with ``with HubServer() as hub:``; ``hub.url`` is the endpoint."""

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.blobs: dict[str, bytes] = {}
        self._drops: dict[str, list[int]] = {}
        self.tampered: dict[str, bytes] = {}
        self.stalls: dict[str, int] = {}
        self.failures: dict[str, tuple[int, str, bytes]] = {}
        self.extra: dict[str, int] = {}  # file name -> bytes sent beyond its real size
        self.endless_at: set[str] = set()
        self.info_override: dict = {}
        self.sent: dict[str, int] = {}
        self.released = threading.Event()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- setup --------------------------------------------------------------------

    def add_repo(self, repo_id: str, folder: Path | None = None,
                 files: dict[str, bytes] | None = None, gated: bool = False,
                 extras: bool = True) -> Repo:
        content: dict[str, bytes] = {}
        if folder is not None:
            for f in sorted(Path(folder).iterdir()):
                if f.is_file():
                    content[f.name] = f.read_bytes()
        content.update(files or {})
        if extras:  # what real repos carry and SpecChat must not download
            content.setdefault("README.md", b"# test model\n")
            content.setdefault(".gitattributes", b"*.safetensors filter=lfs\n")
        repo = Repo(repo_id, content, gated=gated)
        with self._lock:
            self.repos[repo_id] = repo
            for data in content.values():
                self.blobs[hashlib.sha256(data).hexdigest()] = data
        return repo

    def update_file(self, repo_id: str, name: str, data: bytes) -> str:
        """A new commit on main that changes one file."""
        with self._lock:
            repo = self.repos[repo_id]
            repo.files = {**repo.files, name: data}
            self.blobs[hashlib.sha256(data).hexdigest()] = data
            return repo.commit()

    def drop_after(self, filename: str, n_bytes: int, times: int = 1) -> None:
        """Close the connection after ``n_bytes`` of the body for the next
        ``times`` downloads of ``filename``."""
        with self._lock:
            self._drops.setdefault(filename, []).extend([n_bytes] * times)

    def tamper(self, filename: str, data: bytes | None = None) -> bytes:
        """Serve other bytes for ``filename`` than its advertised sha256 and
        blob id; by default the same length with one byte flipped in the
        middle, so the size (and a safetensors header) still look right."""
        original = next(r.files[filename] for r in self.repos.values() if filename in r.files)
        if data is None:
            mid = len(original) // 2
            data = original[:mid] + bytes([original[mid] ^ 0xFF]) + original[mid + 1:]
        with self._lock:
            self.tampered[filename] = data
        return data

    def stall(self, where: str, after_bytes: int = 0) -> None:
        """Accept and never answer: ``"info"`` (model info), ``"resolve"``
        (any /resolve request, before the headers), or a file name (its body,
        after ``after_bytes``)."""
        with self._lock:
            self.stalls[where] = after_bytes

    def fail(self, where: str, status: int, body: bytes | str = b"",
             content_type: str = "text/html; charset=utf-8") -> None:
        """Answer ``"info"`` or a file's download with this status and body."""
        data = body.encode() if isinstance(body, str) else body
        with self._lock:
            self.failures[where] = (status, content_type, data)

    def oversize(self, filename: str, extra_bytes: int) -> None:
        """Send ``extra_bytes`` more than the file has after its real bytes."""
        with self._lock:
            self.extra[filename] = extra_bytes

    def endless(self, where: str) -> None:
        """``"info"`` or a file name: the body never ends (the file's own bytes
        first, then zeros; for the info, a JSON list that keeps growing)."""
        with self._lock:
            self.endless_at.add(where)

    def info_fields(self, **fields) -> None:
        """Replace fields of every model info answer (e.g. ``sha="../x"``)."""
        with self._lock:
            self.info_override.update(fields)

    def clear_faults(self) -> None:
        with self._lock:
            self._drops.clear()
            self.tampered.clear()
            self.stalls.clear()
            self.failures.clear()
            self.extra.clear()
            self.endless_at.clear()
            self.info_override.clear()

    def wait_released(self) -> None:
        """Where a stalled handler sleeps: until ``stop`` (or a test) sets ``released``."""
        self.released.wait()

    # -- inspection ---------------------------------------------------------------

    def count(self, method: str, path_suffix: str) -> int:
        with self._lock:
            return sum(1 for r in self.requests
                       if r.method == method and urlsplit(r.path).path.endswith(path_suffix))

    def downloads(self, filename: str) -> int:
        """GETs of a file's bytes (through /resolve or the CDN; a redirect
        to the CDN is not one)."""
        with self._lock:
            n = 0
            for r in self.requests:
                p = urlsplit(r.path)
                if r.method != "GET" or r.status == 302:
                    continue
                if p.path.endswith("/" + filename) and "/resolve/" in p.path:
                    n += 1
                elif p.path.startswith("/cdn/") and parse_qs(p.query).get("file") == [filename]:
                    n += 1
            return n

    # -- lifecycle ----------------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def cdn(self) -> str:
        return f"http://localhost:{self.port}"

    def start(self) -> HubServer:
        hub = self

        class Handler(_Handler):
            server_state = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _take_drop(self, filename: str) -> int | None:
        with self._lock:
            pending = self._drops.get(filename)
            return pending.pop(0) if pending else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_state: HubServer

    def log_message(self, *args) -> None:  # quiet
        pass

    # -- plumbing -----------------------------------------------------------------

    def _record(self) -> None:
        self._request = Request(self.command, self.path,
                                {k.lower(): v for k, v in self.headers.items()})
        with self.server_state._lock:
            self.server_state.requests.append(self._request)

    def send_response(self, code: int, message: str | None = None) -> None:
        request = getattr(self, "_request", None)
        if request is not None:
            request.status = code
        super().send_response(code, message)

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None,
              length: int | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, data, status: int = 200, headers: dict | None = None) -> None:
        self._send(status, json.dumps(data).encode(),
                   {"Content-Type": "application/json", **(headers or {})})

    def _error(self, status: int, code: str, message: str, headers: dict | None = None) -> None:
        self._json({"error": message}, status,
                   {"X-Error-Code": code, "X-Error-Message": message, **(headers or {})})

    def do_HEAD(self) -> None:
        self._record()
        self._route()

    def do_GET(self) -> None:
        self._record()
        self._route()

    def _route(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        query = parse_qs(url.query)
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self._api(parts[2] + "/" + parts[3], parts[4:], query)
        if parts and parts[0] == "cdn" and len(parts) == 2:
            return self._cdn(parts[1], query)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]))
        self._error(404, "NotFound", f"no route for {url.path}")

    def _repo(self, repo_id: str) -> Repo | None:
        repo = self.server_state.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if repo.gated and not self.headers.get("Authorization"):
            self._error(403, "GatedRepo", "Access to this repo is restricted")
            return None
        return repo

    # -- /api/models --------------------------------------------------------------

    def _fault(self, where: str) -> bool:
        """Apply a stall or a failure set for ``where``; True if it answered."""
        state = self.server_state
        if where in state.stalls and state.stalls[where] == 0:
            state.wait_released()
            self.close_connection = True
            return True
        failure = state.failures.get(where)
        if failure is not None:
            status, content_type, body = failure
            self._send(status, body, {"Content-Type": content_type})
            return True
        return False

    def _endless(self, headers: dict, first: bytes, more: bytes) -> None:
        """200 with no Content-Length: ``first``, then ``more`` again and
        again until the client hangs up or the server stops."""
        state = self.server_state
        self.send_response(200)
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            self.wfile.write(first)
            while not state.released.is_set():
                self.wfile.write(more)
        except OSError:  # the client went away
            pass

    def _api(self, repo_id: str, rest: list[str], query: dict) -> None:
        if rest[:1] != ["tree"] and self._fault("info"):
            return
        if rest[:1] != ["tree"] and "info" in self.server_state.endless_at:
            return self._endless({"Content-Type": "application/json"},
                                 b'{"id": "x", "siblings": [', b'{"rfilename": "x.json"}, ' * 512)
        repo = self._repo(repo_id)
        if repo is None:
            return
        rev = "main"
        if rest[:1] == ["revision"] and len(rest) >= 2:
            rev = rest[1]
        elif rest[:1] == ["tree"] and len(rest) >= 2:
            rev = rest[1]
        sha = repo.sha_for(rev)
        files = repo.files_at(rev)
        if sha is None or files is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if rest[:1] == ["tree"]:
            return self._json([self._tree_entry(n, d) for n, d in sorted(files.items())])
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for name, data in sorted(files.items()):
            s: dict = {"rfilename": name}
            if blobs:
                s["size"] = len(data)
                s["blobId"] = git_blob_id(data)
                if is_lfs(name, data):
                    s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                                "pointerSize": 134}
            siblings.append(s)
        self._json({
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24], "id": repo_id,
            "modelId": repo_id, "sha": sha, "private": False, "gated": repo.gated,
            "disabled": False, "downloads": 0, "likes": 0, "tags": ["mlx", "safetensors"],
            "library_name": "mlx", "lastModified": "2025-01-01T00:00:00.000Z",
            "createdAt": "2025-01-01T00:00:00.000Z", "siblings": siblings,
            **self.server_state.info_override,
        })

    @staticmethod
    def _tree_entry(name: str, data: bytes) -> dict:
        entry = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": name}
        if is_lfs(name, data):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                            "pointerSize": 134}
        return entry

    # -- /{repo}/resolve ------------------------------------------------------------

    def _resolve(self, repo_id: str, rev: str, filename: str) -> None:
        if self._fault("resolve") or self._fault(filename):
            return
        repo = self._repo(repo_id)
        if repo is None:
            return
        sha = repo.sha_for(rev)
        files = repo.files_at(rev)
        if sha is None or files is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        data = files.get(filename)
        if data is None:
            return self._error(404, "EntryNotFound", f"{filename} does not exist",
                               {"X-Repo-Commit": sha})
        common = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
        if is_lfs(filename, data):
            digest = hashlib.sha256(data).hexdigest()
            location = f"{self.server_state.cdn}/cdn/{digest}?file={filename}"
            return self._send(302, b"", {**common, "Location": location,
                                         "ETag": f'"{git_blob_id(data)}"',
                                         "X-Linked-Etag": f'"{digest}"',
                                         "X-Linked-Size": len(data)})
        self._body(data, filename, {**common, "ETag": f'"{git_blob_id(data)}"'})

    def _cdn(self, digest: str, query: dict) -> None:
        data = self.server_state.blobs.get(digest)
        if data is None:
            return self._error(404, "NotFound", "no such blob")
        filename = query.get("file", [digest])[0]
        self._body(data, filename, {"ETag": f'"{digest}"', "Accept-Ranges": "bytes",
                                    "Content-Type": "application/octet-stream"})

    def _body(self, data: bytes, filename: str, headers: dict) -> None:
        data = self.server_state.tampered.get(filename, data)
        if filename in self.server_state.endless_at:
            return self._endless(headers, data, b"\0" * 65536)
        data = data + b"\0" * self.server_state.extra.get(filename, 0)
        start = 0
        rng = self.headers.get("Range")
        status = 200
        if rng and rng.startswith("bytes="):
            first = rng[6:].split("-", 1)[0]
            start = int(first) if first else 0
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
        body = data[start:]
        if self.command == "HEAD":
            return self._send(status, b"", headers, length=len(body))
        state = self.server_state
        cut = state._take_drop(filename)
        stall = state.stalls.get(filename)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))  # always the whole body
        self.end_headers()
        limit = len(body)
        if cut is not None:
            limit = min(limit, cut)
        if stall is not None:
            limit = min(limit, stall)
        try:
            self._write_counted(body[:limit], filename)
        except OSError:  # the client went away
            self.close_connection = True
            return
        if stall is not None and stall < len(body) and (cut is None or stall <= cut):
            state.wait_released()
            self.close_connection = True
            return
        if cut is not None and cut < len(body):  # hang up mid-body
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _write_counted(self, data: bytes, filename: str) -> None:
        state = self.server_state
        self.wfile.write(data)
        self.wfile.flush()
        with state._lock:
            state.sent[filename] = state.sent.get(filename, 0) + len(data)
