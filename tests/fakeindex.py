"""A fake Python package index on loopback for `outpost pull`'s package-index source.

Wheels are built here (`build_wheel`: real zip files with the dist-info pip reads), served either from
a find-links directory or by `FakeIndex`, a PEP 503 simple index over HTTP that records each request
and can cut wheel downloads mid-body (the Content-Length promises more than is sent). `pip_env` is the
environment that points pip at one of them and away from this machine's pip.conf and PIP_* variables,
so no test ever reaches the real index.
"""

from __future__ import annotations

import base64
import hashlib
import html
import os
import threading
import zipfile
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest


def build_wheel(
    directory: Path, project: str, version: str, files: Mapping[str, bytes | Path], *, stored: bool = False
) -> Path:
    """A py3-none-any wheel of `project`==`version` holding `files` (path in the wheel -> bytes or a
    file's contents); `stored`: uncompressed, quick for big real models."""
    dist = project.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    contents = {
        **{name: data.read_bytes() if isinstance(data, Path) else data for name, data in files.items()},
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: outpost-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED) as archive:
        for name, data in contents.items():
            archive.writestr(name, data)
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def pip_env(*, find_links: Path | None = None, index_url: str | None = None) -> dict[str, str]:
    """os.environ for a subprocess whose pip sees only `find_links` and/or `index_url` (neither: no
    index at all), no pip.conf, no cache and no network retries."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update({"PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1", "PIP_RETRIES": "0"})
    if find_links is not None:
        env["PIP_FIND_LINKS"] = str(find_links)
    if index_url is not None:
        env["PIP_INDEX_URL"] = index_url
    else:
        env["PIP_NO_INDEX"] = "1"
    return env


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    index: FakeIndex


class FakeIndex:
    """/simple/<project>/ lists the wheels of `root`; /files/<wheel> serves them (cut when told)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        self.cut_after: int | None = None  # bytes of a wheel sent before hanging up
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.index = self
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/simple"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def page(self, project: str) -> bytes | None:
        dist = project.replace("-", "_").lower()
        wheels = [w for w in sorted(self.root.glob("*.whl")) if w.name.lower().startswith(dist + "-")]
        if not wheels:
            return None
        links = "".join(
            f'<a href="../../files/{html.escape(w.name)}#sha256={_sha256(w)}">{html.escape(w.name)}</a>\n'
            for w in wheels
        )
        return f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # the test's output, not the server's
        pass

    def do_GET(self) -> None:
        index = self.server.index
        index.requests.append(self.path)
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        if len(parts) == 2 and parts[0] == "simple":
            body = index.page(parts[1])
            if body is None:
                self.send_error(404)
            else:
                self._send(body, "text/html")
        elif len(parts) == 2 and parts[0] == "files" and (index.root / parts[1]).is_file():
            self._send((index.root / parts[1]).read_bytes(), "application/octet-stream", index.cut_after)
        else:
            self.send_error(404)

    def _send(self, body: bytes, content_type: str, cut_after: int | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body if cut_after is None else body[:cut_after])
        if cut_after is not None:
            self.close_connection = True


@pytest.fixture
def fake_index(tmp_path: Path) -> Iterator[FakeIndex]:
    index = FakeIndex(tmp_path / "index-files")
    index.root.mkdir()
    try:
        yield index
    finally:
        index.close()
