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

Test hooks: every request is recorded (method, path, headers); ``drop_after``
cuts the next N downloads of a file after some bytes by closing the socket
mid-body, as a flaky network would.
"""

from __future__ import annotations

import hashlib
import json
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


class HubServer:
    """Start with ``with HubServer() as hub:``; ``hub.url`` is the endpoint."""

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.blobs: dict[str, bytes] = {}
        self._drops: dict[str, list[int]] = {}
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

    # -- inspection ---------------------------------------------------------------

    def count(self, method: str, path_suffix: str) -> int:
        with self._lock:
            return sum(1 for r in self.requests
                       if r.method == method and urlsplit(r.path).path.endswith(path_suffix))

    def downloads(self, filename: str) -> int:
        """GETs of a file's bytes (through /resolve or the CDN)."""
        with self._lock:
            n = 0
            for r in self.requests:
                p = urlsplit(r.path)
                if r.method != "GET":
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
        with self.server_state._lock:
            self.server_state.requests.append(
                Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))

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

    def _api(self, repo_id: str, rest: list[str], query: dict) -> None:
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
        self._body(data, filename, {"ETag": f'"{digest}"', "Accept-Ranges": "bytes"})

    def _body(self, data: bytes, filename: str, headers: dict) -> None:
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
        cut = self.server_state._take_drop(filename)
        if cut is None:
            return self._send(status, body, headers)
        # Promise the whole body, send part of it, hang up.
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[:cut])
        self.wfile.flush()
        self.close_connection = True
        import socket

        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
