"""A small HTTP/1.1 client and request parser over asyncio streams (JSON APIs only).

Enough HTTP for an OpenAI-compatible completion API without a third-party dependency:
keep-alive connections pooled per host, ``Content-Length`` and chunked response bodies,
TLS through :mod:`ssl`. It runs on whatever event loop is running (uvloop included).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = ["HTTPClient", "HTTPError", "Request", "Response", "read_request", "write_response"]

MAX_HEADER_BYTES = 64 << 10
MAX_BODY_BYTES = 64 << 20
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Payload Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class HTTPError(Exception):
    """A transport failure or a response that is not HTTP (not an error status)."""


@dataclass
class Response:
    """An HTTP response."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


@dataclass
class Request:
    """An HTTP request as the server reads it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool = True
    query: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


async def _read_headers(reader: asyncio.StreamReader) -> list[str]:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError as e:
        raise HTTPError("HTTP header block too large") from e
    if len(raw) > MAX_HEADER_BYTES:
        raise HTTPError("HTTP header block too large")
    return raw.decode("latin-1").split("\r\n")[:-2]


def _parse_headers(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise HTTPError(f"malformed HTTP header line {line!r}")
        headers[name.strip().lower()] = value.strip()
    return headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes | None:
    """The body by Content-Length or chunked encoding; None when neither is given."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts, total = [], 0
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # trailers are not supported: an empty line
                return b"".join(parts)
            total += size
            if total > MAX_BODY_BYTES:
                raise HTTPError("HTTP body too large")
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    if "content-length" in headers:
        try:
            n = int(headers["content-length"])
        except ValueError as e:
            raise HTTPError(f"bad Content-Length {headers['content-length']!r}") from e
        if n < 0 or n > MAX_BODY_BYTES:
            raise HTTPError(f"Content-Length {n} out of range")
        return await reader.readexactly(n)
    return None


class HTTPClient:
    """HTTP/1.1 client with a keep-alive connection pool, bound to the running loop.

    Create and use it inside one event loop; :meth:`close` closes the idle connections.
    """

    def __init__(self, *, timeout_s: float = 600.0, max_idle_per_host: int = 32) -> None:
        self.timeout_s = timeout_s
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple[str, str, int], list[tuple[Any, Any]]] = {}
        self._ssl: ssl.SSLContext | None = None

    async def request(
        self,
        method: str,
        url: str,
        *,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Response:
        """Sends one request and reads the whole response. A pooled connection that the
        server closed meanwhile is replaced transparently (once)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"HTTPClient: unsupported URL {url!r} (http:// or https:// only)")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        key = (parts.scheme, parts.hostname, port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        body = b"" if json_body is None else json.dumps(json_body).encode()
        head = [
            f"{method} {target} HTTP/1.1",
            f"Host: {parts.hostname}:{port}",
            "Connection: keep-alive",
            "Accept: application/json",
            f"Content-Length: {len(body)}",
        ]
        if json_body is not None:
            head.append("Content-Type: application/json")
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        payload = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        timeout = self.timeout_s if timeout_s is None else timeout_s
        for attempt in range(2):
            reused = bool(self._idle.get(key))
            reader, writer = await self._connect(key)
            try:
                return await asyncio.wait_for(self._exchange(key, reader, writer, payload), timeout)
            except (ConnectionError, asyncio.IncompleteReadError, HTTPError) as e:
                writer.close()
                if not reused or attempt == 1 or isinstance(e, HTTPError):
                    raise HTTPError(f"{method} {url}: {e!r}") from e
            except BaseException:
                writer.close()
                raise
        raise AssertionError("unreachable")

    async def _connect(self, key: tuple[str, str, int]) -> tuple[Any, Any]:
        idle = self._idle.get(key)
        while idle:
            reader, writer = idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer
            writer.close()
        scheme, host, port = key
        ctx = None
        if scheme == "https":
            ctx = self._ssl = self._ssl or ssl.create_default_context()
        try:
            return await asyncio.open_connection(host, port, ssl=ctx, limit=MAX_HEADER_BYTES)
        except OSError as e:
            raise HTTPError(f"cannot connect to {host}:{port}: {e}") from e

    async def _exchange(
        self, key: tuple[str, str, int], reader: Any, writer: Any, payload: bytes
    ) -> Response:
        writer.write(payload)
        await writer.drain()
        lines = await _read_headers(reader)
        status_line = lines[0].split(" ", 2) if lines else []
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/1."):
            raise HTTPError(f"not an HTTP response: {lines[:1]!r}")
        status = int(status_line[1])
        headers = _parse_headers(lines[1:])
        body = await _read_body(reader, headers)
        closes = headers.get("connection", "").lower() == "close"
        if body is None:  # no length: the body runs until the server closes
            body = await reader.read()
            closes = True
        if closes:
            writer.close()
        else:
            pool = self._idle.setdefault(key, [])
            if len(pool) < self.max_idle_per_host:
                pool.append((reader, writer))
            else:
                writer.close()
        return Response(status, headers, body)

    async def close(self) -> None:
        """Closes the idle connections."""
        for pool in self._idle.values():
            for _reader, writer in pool:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
        self._idle.clear()


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request on a server connection; None at a clean end of the connection."""
    try:
        lines = await _read_headers(reader)
    except asyncio.IncompleteReadError as e:
        if e.partial.strip():
            raise HTTPError("connection closed inside a request") from e
        return None
    parts = lines[0].split(" ") if lines else []
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HTTPError(f"malformed request line {lines[:1]!r}")
    method, target, version = parts
    headers = _parse_headers(lines[1:])
    body = await _read_body(reader, headers)
    conn = headers.get("connection", "").lower()
    keep_alive = conn != "close" if version == "HTTP/1.1" else conn == "keep-alive"
    path, _, query = target.partition("?")
    return Request(method.upper(), path, headers, body or b"", keep_alive, query)


def write_response(
    writer: asyncio.StreamWriter, status: int, payload: Any, *, keep_alive: bool = True
) -> None:
    """Writes a JSON response (``payload`` serialised with :func:`json.dumps`)."""
    body = json.dumps(payload).encode()
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)
