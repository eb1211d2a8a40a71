"""A Hugging Face Hub on loopback, for tests: the part of the Hub API that ``huggingface_hub`` uses to create a
repository and commit a folder to it (``create_repo`` + ``upload_folder``), storing what it receives.

What huggingface_hub 2.x sends (hf_api.py, _commit_api.py, _upload_pipeline.py):

- ``POST /api/repos/create`` ``{"name", "organization", "visibility"?, "type"?}``: 200 ``{"url"}``, or 409 with the
  same ``url`` when it exists (``exist_ok=True`` returns that);
- ``POST /api/validate-yaml`` ``{"content", "repoType"}`` when the folder holds a README.md (its metadata block);
- ``POST /api/{type}s/{repo}/preupload/{revision}`` ``{"files": [{"path", "sample", "size"}]}``: the server says how
  each file travels. This one answers ``regular`` for every file: its bytes then come base64-encoded inside the
  commit. (The real Hub answers ``lfs`` for large and binary files, which huggingface_hub then uploads through Xet
  storage, a separate content-addressed service that is not imitated here);
- ``POST /api/{type}s/{repo}/commit/{revision}``: ndjson, a ``header`` line then one ``file`` / ``lfsFile`` /
  ``deletedFile`` / ``deletedFolder`` line each: 200 ``{"commitUrl", "commitOid"}``;
- ``GET /api/{type}s/{repo}[/revision/{revision}]``: the repository's info (``repo_info``);
- for a download (``snapshot_download`` / ``hf_hub_download``): ``GET /api/{type}s/{repo}/tree/{revision}`` (the
  files, ``list_repo_tree(recursive=True)``), then ``HEAD`` and ``GET /{type}s/{repo}/resolve/{revision}/{path}``
  (a file's metadata in ``X-Repo-Commit``, ``ETag`` and ``Content-Length``, then its bytes). As on the Hub, a public
  repository's info, tree and files are read without a token. :meth:`HubServer.add` seeds a repository (a dataset
  to download).

Authentication is as on the Hub: a request must carry ``Authorization: Bearer <token>`` with a token the server
knows, or it gets 401 "Invalid credentials in Authorization header". :meth:`HubServer.fail` makes an endpoint answer
an error instead, for the failure paths.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

USER = "tester"  # the account every valid token belongs to: a repo id without a namespace goes there
REPO_ROUTE = re.compile(
    r"^/api/(?P<type>models|datasets|spaces)/(?P<repo>[^/]+(?:/[^/]+)?)"
    r"(?:/(?P<action>preupload|commit|revision|tree)/(?P<revision>[^/]+)(?:/.*)?)?$"
)
FILE_ROUTE = re.compile(
    r"^/(?P<type>datasets|spaces)?/?(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<file>.+)$"
)
READS = ("info", "tree", "download")  # what anyone may ask of a public repository


@dataclass
class Request:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    private: bool | None
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[dict[str, Any]] = field(default_factory=list)

    @property
    def sha(self) -> str:
        return self.commits[-1]["oid"] if self.commits else "0" * 40


class HubServer:
    """``with HubServer(tokens={"hf_x"}) as hub:`` serves on 127.0.0.1 at ``hub.url`` until the block ends."""

    def __init__(self, tokens: set[str] | None = None) -> None:
        self.tokens = set(tokens or ())
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.failures: dict[str, tuple[int, str]] = {}
        self.delays: dict[str, float] = {}
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="hub-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def fail(self, endpoint: str, status: int, message: str = "injected failure") -> None:
        """Answer ``status`` on ``endpoint`` (create, validate-yaml, preupload, commit, info) from now on."""
        self.failures[endpoint] = (status, message)

    def delay(self, endpoint: str, seconds: float) -> None:
        """Answer ``endpoint`` only after ``seconds`` from now on (a large upload on a slow link)."""
        self.delays[endpoint] = seconds

    def reset(self) -> None:
        """Forget repos, requests, failures and delays (the tokens stay)."""
        with self.lock:
            self.repos.clear()
            self.requests.clear()
            self.failures.clear()
            self.delays.clear()

    def add(self, repo_id: str, repo_type: str, files: dict[str, bytes]) -> Repo:
        """A public repository holding ``files`` in one commit, as if someone had pushed them."""
        repo = Repo(repo_id, repo_type, False, dict(files))
        oid = hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest()
        repo.commits.append({"oid": oid, "revision": "main", "summary": "seeded", "paths": sorted(files)})
        with self.lock:
            self.repos[repo_id] = repo
        return repo

    def requests_to(self, endpoint: str) -> list[Request]:
        return [r for r in self.requests if _endpoint(r.method, r.path) == endpoint]

    def api_requests(self) -> list[Request]:
        """The requests to the endpoints above (huggingface_hub also asks, unauthenticated, for things such as
        /api/agent-harnesses that have nothing to do with a push; they get 404)."""
        return [r for r in self.requests if _endpoint(r.method, r.path) is not None]


def _endpoint(method: str, path: str) -> str | None:
    if method == "POST" and path == "/api/repos/create":
        return "create"
    if method == "POST" and path == "/api/validate-yaml":
        return "validate-yaml"
    if method in ("GET", "HEAD") and FILE_ROUTE.match(path):
        return "download"
    route = REPO_ROUTE.match(path)
    if route is None:
        return None
    action = route.group("action")
    if method == "GET" and action == "tree":
        return "tree"
    if method == "POST" and action in ("preupload", "commit"):
        return action
    if method == "GET" and action in (None, "revision"):
        return "info"
    return None


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            return  # quiet: tests read hub.requests instead

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        self.rfile.readline()
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"error": message}, {"X-Error-Message": message})

        def _handle(self) -> None:
            path = unquote(urlsplit(self.path).path)
            body = self._body() if self.command == "POST" else b""
            request = Request(self.command, path, {k.lower(): v for k, v in self.headers.items()}, body)
            with hub.lock:
                hub.requests.append(request)
            endpoint = _endpoint(self.command, path)
            if endpoint is None:
                self._error(404, f"no such endpoint: {self.command} {path}")
                return
            token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
            if token not in hub.tokens and not (endpoint in READS and self._public(path)):
                self._error(401, "Invalid credentials in Authorization header")
                return
            if endpoint in hub.delays:
                time.sleep(hub.delays[endpoint])
            if endpoint in hub.failures:
                self._error(*hub.failures[endpoint])
                return
            with hub.lock:
                getattr(self, "_" + endpoint.replace("-", "_"))(path, body)

        do_GET = do_POST = do_HEAD = _handle

        def _public(self, path: str) -> bool:
            route = FILE_ROUTE.match(path) or REPO_ROUTE.match(path)
            repo = hub.repos.get(route.group("repo")) if route else None
            return repo is not None and not repo.private

        def _tree(self, path: str, body: bytes) -> None:
            repo, _ = self._repo(path)
            if repo is None:
                return
            entries = [
                {"type": "file", "oid": _git_oid(data), "size": len(data), "path": name}
                for name, data in sorted(repo.files.items())
            ]
            self._send(200, entries)

        def _download(self, path: str, body: bytes) -> None:
            route = FILE_ROUTE.match(path)
            assert route is not None
            repo = hub.repos.get(route.group("repo"))
            data = repo.files.get(route.group("file")) if repo else None
            if repo is None or data is None:
                self._send(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("ETag", f'"{_git_oid(data)}"')
            self.send_header("X-Repo-Commit", repo.sha)
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(data)

        def _create(self, path: str, body: bytes) -> None:
            payload = json.loads(body)
            repo_id = f"{payload.get('organization') or USER}/{payload['name']}"
            if repo_id in hub.repos:  # the Hub's 409 names the repo's URL: create_repo(exist_ok=True) returns it
                message = "You already created this model repo"
                self._send(409, {"error": message, "url": f"{hub.url}/{repo_id}"}, {"X-Error-Message": message})
                return
            visibility = payload.get("visibility")
            private = None if visibility is None else visibility == "private"
            hub.repos[repo_id] = Repo(repo_id, payload.get("type") or "model", private)
            self._send(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id})

        def _validate_yaml(self, path: str, body: bytes) -> None:
            self._send(200, {"errors": [], "warnings": []})

        def _repo(self, path: str) -> tuple[Repo | None, str]:
            route = REPO_ROUTE.match(path)
            assert route is not None
            repo = hub.repos.get(route.group("repo"))
            if repo is None:
                self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            return repo, route.group("revision") or "main"

        def _preupload(self, path: str, body: bytes) -> None:
            repo, _ = self._repo(path)
            if repo is None:
                return
            files = []
            for entry in json.loads(body)["files"]:
                known = repo.files.get(entry["path"])
                oid = _git_oid(known) if known is not None else None
                files.append({"path": entry["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": oid})
            self._send(200, {"files": files, "commitOid": repo.sha})

        def _commit(self, path: str, body: bytes) -> None:
            repo, revision = self._repo(path)
            if repo is None:
                return
            lines = [json.loads(line) for line in body.splitlines() if line.strip()]
            header = next(line["value"] for line in lines if line["key"] == "header")
            changed = []
            for line in lines:
                key, value = line["key"], line["value"]
                if key == "file":
                    repo.files[value["path"]] = base64.b64decode(value["content"])
                elif key == "deletedFile":
                    repo.files.pop(value["path"], None)
                elif key == "deletedFolder":
                    prefix = value["path"].rstrip("/") + "/"
                    for name in [n for n in repo.files if n.startswith(prefix)]:
                        del repo.files[name]
                elif key == "lfsFile":
                    self._error(400, "this test hub takes regular files only (it never asks for LFS)")
                    return
                else:
                    continue
                changed.append(value["path"])
            oid = hashlib.sha1(f"{repo.sha}{body!r}".encode()).hexdigest()
            repo.commits.append({"oid": oid, "revision": revision, "summary": header["summary"], "paths": changed})
            url = f"{hub.url}/{repo.repo_id}/commit/{oid}"
            self._send(200, {"commitUrl": url, "commitOid": oid, "pullRequestUrl": None, "success": True})

        def _info(self, path: str, body: bytes) -> None:
            repo, _ = self._repo(path)
            if repo is None:
                return
            siblings = [{"rfilename": name} for name in sorted(repo.files)]
            self._send(200, {"id": repo.repo_id, "sha": repo.sha, "private": bool(repo.private), "siblings": siblings})

    return Handler


def _git_oid(content: bytes) -> str:
    """The git blob id of ``content`` (what the Hub reports as a regular file's oid)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()
