"""A minimal HTTP/1.1 client on asyncio streams, for benchmarks/cluster/'s scenario (f).

(f) measures the gateway alone, and the load generator shares a core with the broker and the fake
workers: httpx spent 1.5x the gateway's own CPU on the same streams (26% vs 18% of a core at 200
streams), so it would have been the bottleneck. This client does only what the gateway needs:
POST with Content-Length, keep-alive, a response body by Content-Length or chunked transfer
encoding, and server-sent events fed line by line to cluster_stream's parser.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from benchmarks.cluster.stream import StreamRecord, on_event

LIMIT = 1 << 20  # the longest line the reader takes
# What a request on a dead or garbled connection raises (ConnectionError is an OSError).
NET_ERRORS = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError)


class HttpConnection:
    """One keep-alive connection to `url` (http only), opened on first use."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(
        self, path: str, body: bytes, on_chunk: Callable[[bytes], None] | None = None
    ) -> tuple[int, bytes]:
        """(status, body); with `on_chunk` a 200's body goes there piece by piece as it arrives."""
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=LIMIT)
        head = f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
        self._writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        status_line = await self._reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split()[1])
        headers = await self._headers(self._reader)
        on_chunk = on_chunk if status == 200 else None
        if headers.get("transfer-encoding", "").lower() == "chunked":
            data = await self._chunked(self._reader, on_chunk)
        else:
            data = await self._reader.readexactly(int(headers.get("content-length", "0")))
            if on_chunk is not None and data:
                on_chunk(data)
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, data

    @staticmethod
    async def _headers(reader: asyncio.StreamReader) -> dict[str, str]:
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                return headers
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()

    @staticmethod
    async def _chunked(reader: asyncio.StreamReader, on_chunk: Callable[[bytes], None] | None) -> bytes:
        data = bytearray()
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):  # trailers, if any
                    pass
                return bytes(data)
            piece = (await reader.readexactly(size + 2))[:-2]  # the chunk and its CRLF
            if on_chunk is None:
                data += piece
            else:
                on_chunk(piece)

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()


async def stream(url: str, body: dict[str, object], record: StreamRecord, timeout: float) -> None:
    """POST a streamed chat request on its own connection and fill `record` (as cluster_stream.stream)."""
    conn = HttpConnection(url)
    pending = bytearray()
    t0 = time.perf_counter()

    def on_chunk(piece: bytes) -> None:
        pending.extend(piece)
        while (end := pending.find(b"\n")) >= 0:
            line = bytes(pending[:end]).strip()
            del pending[: end + 1]
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                record.done += 1
            else:
                on_event(json.loads(payload), record, time.perf_counter() - t0)

    try:
        status, data = await asyncio.wait_for(
            conn.post("/v1/chat/completions", json.dumps(body).encode(), on_chunk), timeout
        )
        record.status = status
        if status != 200:
            record.error, record.error_detail = str(status), data[:200].decode(errors="replace")
    except Exception as exc:  # counted, never a crash
        record.error = record.error or type(exc).__name__
        record.error_detail = str(exc)[:200]
    finally:
        await conn.close()
        record.end_s = record.start_s + (time.perf_counter() - t0)
