"""A fake Hugging Face Hub on loopback, answering what huggingface_hub 2.4.0 sends, from in-memory files.

Two threaded HTTP servers: the hub (HF_ENDPOINT) and a "CDN" on another port, like huggingface.co and
its storage hosts. Routes, as the pinned client calls them:
- GET  /api/models/{repo}[/revision/{rev}][?blobs=true]  model_info / repo_info (commit sha, siblings)
- GET  /api/models/{repo}/tree/{rev}[/{path}]?recursive=  list_repo_tree (snapshot_download)
- HEAD|GET /{repo}/resolve/{rev}/{file}                   LFS files: 302 to the CDN with X-Repo-Commit,
  X-Linked-Etag (sha256), X-Linked-Size; other files: 200 with a git-sha1 ETag. Missing repo: 401
  RepoNotFound, missing revision/file: 404 RevisionNotFound/EntryNotFound, gated: 401 GatedRepo.
- HEAD|GET {cdn}/blobs/{sha256}                            the bytes; `Range: bytes=N-` answers 206.
Faults for tests: cut the next download(s) mid-body, answer the next one(s) with an error status,
serve a file's bytes corrupted (same size, same advertised sha256). Every request is recorded.

`fake_hub` (a pytest fixture, re-exported by tests/conftest.py) starts one per test and points
HF_ENDPOINT, HF_HOME (a temp dir) and HF_HUB_DISABLE_TELEMETRY at it for subprocesses. huggingface_hub
reads HF_ENDPOINT at import, so in-process callers pass `endpoint=fake_hub.url` explicitly.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".model")
_CHUNK = 64 * 1024


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob: what the hub sends as ETag for non-LFS files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubFile:
    path: str
    data: bytes
    lfs: bool
    sha256: str = field(init=False)
    oid: str = field(init=False)

    def __post_init__(self) -> None:
        self.sha256 = hashlib.sha256(self.data).hexdigest()
        self.oid = git_blob_sha1(self.data)


@dataclass
class HubRepo:
    repo_id: str
    commit: str
    files: dict[str, HubFile]
    token: str | None = None  # gated: resolve needs `Authorization: Bearer <token>`


@dataclass
class Request:
    server: str  # "hub" | "cdn"
    method: str
    path: str
    range: str | None
    authorized: bool
    status: int = 0
    body_bytes: int = 0


@dataclass
class _Faults:
    cut_after: int = 0
    cuts_left: int = 0
    fail_status: int = 0
    fails_left: int = 0
    corrupt: set[str] = field(default_factory=set)  # sha256 of files served with a flipped byte


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # clients hanging up are not news
            super().handle_error(request, client_address)


class FakeHub:
    """The two servers, the repos they serve, fault switches and the request log."""

    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.requests: list[Request] = []
        self.faults = _Faults()
        self._lock = threading.Lock()
        self._hub = self._start("hub")
        self._cdn = self._start("cdn")
        self.url = f"http://127.0.0.1:{self._hub.server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def _start(self, role: str) -> _Server:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.hub = self  # type: ignore[attr-defined]
        server.role = role  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return server

    def close(self) -> None:
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()

    def add_repo(self, repo_id: str, files: Mapping[str, bytes | Path], token: str | None = None) -> HubRepo:
        """Serve `files` (repo path -> bytes or a local file) as `repo_id` at one commit on `main`."""
        entries = {}
        for path, content in files.items():
            data = content.read_bytes() if isinstance(content, Path) else content
            entries[path] = HubFile(path, data, lfs=path.endswith(LFS_SUFFIXES))
        commit = hashlib.sha1(repo_id.encode() + b"".join(sorted(e.oid.encode() for e in entries.values())))
        repo = HubRepo(repo_id, commit.hexdigest(), entries, token)
        self.repos[repo_id] = repo
        return repo

    def cut_downloads(self, after_bytes: int, count: int = 1) -> None:
        """The next `count` file GETs send the full Content-Length but close after `after_bytes`."""
        self.faults.cut_after, self.faults.cuts_left = after_bytes, count

    def fail_downloads(self, status: int, count: int = 1) -> None:
        """The next `count` file GETs (after any cuts) answer `status` with no body."""
        self.faults.fail_status, self.faults.fails_left = status, count

    def corrupt(self, repo_id: str, path: str) -> None:
        """Serve this file with one byte flipped while still advertising the true sha256 and size."""
        self.faults.corrupt.add(self.repos[repo_id].files[path].sha256)

    def file_gets(self) -> list[Request]:
        """Recorded GETs that carry file bytes (CDN blobs and non-LFS resolves)."""
        return [
            r for r in self.requests if r.method == "GET" and (r.server == "cdn" or "/resolve/" in r.path)
        ]

    def env(self, hf_home: Path) -> dict[str, str]:
        return {
            "HF_ENDPOINT": self.url,
            "HF_HOME": str(hf_home),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_ETAG_TIMEOUT": "10",
            "HF_HUB_DOWNLOAD_TIMEOUT": "10",
        }

    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def _take_fault(self) -> tuple[str, int]:
        """("cut", n) | ("fail", status) | ("", 0): consumes one fault, in that order."""
        with self._lock:
            f = self.faults
            if f.cuts_left > 0:
                f.cuts_left -= 1
                return "cut", f.cut_after
            if f.fails_left > 0:
                f.fails_left -= 1
                return "fail", f.fail_status
        return "", 0


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
_BLOB = re.compile(r"^/blobs/(?P<sha>[0-9a-f]{64})$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:  # the test log stays quiet
        pass

    @property
    def hub(self) -> FakeHub:
        return self.server.hub  # type: ignore[no-any-return]

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        self.req = Request(
            self.server.role,
            self.command,
            self.path,
            self.headers.get("Range"),
            bool(self.headers.get("Authorization")),
        )
        self.hub._record(self.req)
        path, query = unquote(url.path), parse_qs(url.query)
        if self.server.role == "cdn":
            match = _BLOB.match(path)
            found = self._blob(match["sha"]) if match else None
            if found is None:
                return self._error(404, "EntryNotFound", "no such blob")
            return self._send_file(found)
        for pattern, route in ((_RESOLVE, self._resolve), (_TREE, self._tree), (_API, self._info)):
            match = pattern.match(path)
            if match:
                return route(match, query)
        self._error(404, "", "not found")

    do_HEAD = do_GET  # a HEAD answer carries the headers of the GET, never its body (see _send)

    # -- plumbing ---------------------------------------------------------------------------------------

    def _send(self, status: int, headers: Mapping[str, str], body: bytes = b"") -> None:
        """Headers (Content-Length: the body's unless given), then the body in chunks unless HEAD."""
        self.req.status = status
        self.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command == "HEAD":
            return
        for offset in range(0, len(body), _CHUNK):
            chunk = body[offset : offset + _CHUNK]
            self.wfile.write(chunk)
            self.req.body_bytes += len(chunk)

    def _error(self, status: int, code: str, message: str, extra: Mapping[str, str] | None = None) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message, **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, headers, json.dumps({"error": message}).encode())

    def _json(self, payload: Any) -> None:
        self._send(200, {"Content-Type": "application/json"}, json.dumps(payload).encode())

    def _repo(self, repo_id: str, rev: str | None) -> HubRepo | None:
        """The repo, or None after answering the error the hub gives."""
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        if rev not in (None, "main", repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return repo

    # -- routes -----------------------------------------------------------------------------------------

    def _info(self, match: re.Match[str], query: Mapping[str, list[str]]) -> None:
        repo = self._repo(match["repo"], match["rev"])
        if repo is None:
            return
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for f in repo.files.values():
            entry: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                entry.update(size=len(f.data), blobId=f.oid)
                if f.lfs:
                    entry["lfs"] = {"size": len(f.data), "sha256": f.sha256, "pointerSize": 134}
            siblings.append(entry)
        owner = repo.repo_id.split("/")[0]
        self._json(
            {
                "_id": repo.commit[:24],
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "author": owner,
                "sha": repo.commit,
                "lastModified": "2025-01-01T00:00:00.000Z",
                "createdAt": "2025-01-01T00:00:00.000Z",
                "private": False,
                "disabled": False,
                "gated": "manual" if repo.token else False,
                "tags": ["gguf"],
                "downloads": 0,
                "likes": 0,
                "siblings": siblings,
            }
        )

    def _tree(self, match: re.Match[str], query: Mapping[str, list[str]]) -> None:
        repo = self._repo(match["repo"], match["rev"])
        if repo is None:
            return
        base = (match["path"] or "").strip("/")
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        self._json(list(_tree_entries(repo, base, recursive)))

    def _resolve(self, match: re.Match[str], query: Mapping[str, list[str]]) -> None:
        repo = self._repo(match["repo"], match["rev"])
        if repo is None:
            return
        commit = {"X-Repo-Commit": repo.commit}
        if repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
            msg = f"Access to model {repo.repo_id} is restricted. You must be authenticated to access it."
            return self._error(401, "GatedRepo", msg, commit)
        f = repo.files.get(match["file"])
        if f is None:
            return self._error(404, "EntryNotFound", "Entry not found", commit)
        if f.lfs:
            location = f"{self.hub.cdn_url}/blobs/{f.sha256}?repo={quote(repo.repo_id, safe='')}"
            headers = {
                **commit,
                "Location": location,
                "ETag": f'"{f.oid}"',
                "X-Linked-Etag": f'"{f.sha256}"',
                "X-Linked-Size": str(len(f.data)),
            }
            return self._send(302, headers)
        self._send_file(f, extra=commit)

    def _blob(self, sha256: str) -> HubFile | None:
        for repo in self.hub.repos.values():
            for f in repo.files.values():
                if f.sha256 == sha256:
                    return f
        return None

    def _send_file(self, f: HubFile, extra: Mapping[str, str] | None = None) -> None:
        data = f.data
        if f.sha256 in self.hub.faults.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        start, status = 0, 200
        headers = {"ETag": f'"{f.sha256 if f.lfs else f.oid}"', "Accept-Ranges": "bytes", **(extra or {})}
        match = _RANGE.match(self.headers.get("Range") or "")
        if match and int(match[1]) < len(data):
            start, status = int(match[1]), 206
            end = int(match[2]) if match[2] else len(data) - 1
            data = data[: end + 1]
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(f.data)}"
        body = data[start:]
        kind, value = self.hub._take_fault() if self.command == "GET" else ("", 0)
        if kind == "fail":
            return self._error(value, "", "injected failure")
        if kind == "cut":  # announce the whole body, send part of it, hang up
            self.close_connection = True
            return self._send(status, {**headers, "Content-Length": str(len(body))}, body[:value])
        self._send(status, headers, body)


def _tree_entries(repo: HubRepo, base: str, recursive: bool) -> Iterator[dict[str, Any]]:
    """list_repo_tree entries under `base`: files, and the folders on the way."""
    prefix = f"{base}/" if base else ""
    folders: set[str] = set()
    for f in sorted(repo.files.values(), key=lambda f: f.path):
        if not f.path.startswith(prefix):
            continue
        rest = f.path[len(prefix) :].split("/")
        for depth in range(1, len(rest)):
            folder = prefix + "/".join(rest[:depth])
            if folder not in folders and (recursive or depth == 1):
                folders.add(folder)
                yield {"type": "directory", "oid": git_blob_sha1(folder.encode()), "size": 0, "path": folder}
        if recursive or len(rest) == 1:
            entry: dict[str, Any] = {"type": "file", "oid": f.oid, "size": len(f.data), "path": f.path}
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}
            yield entry


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A running FakeHub; HF_* env vars point subprocesses (and fresh imports) at it, without tokens."""
    hub = FakeHub()
    for key, value in hub.env(tmp_path / "hf-home").items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    try:
        yield hub
    finally:
        hub.close()
