"""The ASGI layer in front of the routes: bearer-token auth, the request-size bound and one
structured access-log line per request. Pure ASGI (no per-request middleware objects)."""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["ACCESS_LOG", "Gate"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ACCESS_LOG = logging.getLogger("agentrl.service.access")
"""One JSON object per request (method, path, status, duration_ms, client, bytes_in)."""

OPEN_PATHS = frozenset({"/health"})
"""Paths served without a token (a load balancer's health check)."""


async def _reply(send: Send, status: int, detail: str, headers: list | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Gate:
    """Wraps the app: auth (``Authorization: Bearer TOKEN``, compared in constant time, or a
    ``/t/TOKEN/`` path prefix for clients that cannot set headers, such as verl's), the body
    bound (413; the body is read here, so a chunked upload is bounded too) and the access log."""

    def __init__(
        self,
        app: Any,
        token: str | None,
        max_body_bytes: int,
        fast: dict[str, Callable[[Scope, bytes, Send], Awaitable[None]]] | None = None,
        trusted_networks: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.trusted = [ipaddress.ip_network(n, strict=False) for n in trusted_networks]
        self.fast = fast or {}
        self.token = None if token is None else token.encode()
        self.max_body = max_body_bytes

    def _trusted(self, scope: Scope) -> bool:
        client = scope.get("client")
        if not self.trusted or not client:
            return False
        try:
            ip = ipaddress.ip_address(client[0])
        except ValueError:
            return False
        return any(ip in net for net in self.trusted)

    def _token_ok(self, given: bytes) -> bool:
        assert self.token is not None
        return hmac.compare_digest(given, self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        path: str = scope["path"]
        shown = path
        status = [0]
        bytes_in = [0]

        async def send_logged(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self._handle(scope, receive, send_logged, path, bytes_in)
        finally:
            if path.startswith("/t/"):
                shown = "/t/***/" + path[3:].partition("/")[2]
            if ACCESS_LOG.isEnabledFor(logging.INFO):
                client = scope.get("client")
                ACCESS_LOG.info(
                    json.dumps(
                        {
                            "event": "access",
                            "method": scope["method"],
                            "path": shown,
                            "status": status[0] or 499,  # 499: the client went away first
                            "duration_ms": round((time.perf_counter() - t0) * 1e3, 3),
                            "client": f"{client[0]}:{client[1]}" if client else None,
                            "bytes_in": bytes_in[0],
                        }
                    )
                )

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, path: str, bytes_in: list[int]
    ) -> None:
        authorized = self.token is None or path in OPEN_PATHS or self._trusted(scope)
        if path.startswith("/t/"):
            given, _, rest = path[3:].partition("/")
            if self.token is None or not self._token_ok(given.encode()):
                await _reply(send, 401, "invalid token in the path")
                return
            authorized = True
            path = "/" + rest
            scope["path"], scope["raw_path"] = path, path.encode()  # in place: see the route
        if not authorized:
            auth = b""
            for k, v in scope["headers"]:
                if k == b"authorization":
                    auth = v
                    break
            scheme, _, given = auth.partition(b" ")
            if not auth:
                await _reply(send, 401, "missing bearer token", [(b"www-authenticate", b"Bearer")])
                return
            if scheme.lower() != b"bearer" or not self._token_ok(given.strip()):
                await _reply(
                    send,
                    401,
                    "invalid bearer token",
                    [(b"www-authenticate", b'Bearer error="invalid_token"')],
                )
                return
        for k, v in scope["headers"]:
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    await _reply(send, 400, "bad Content-Length")
                    return
                if n > self.max_body:
                    await _reply(send, 413, f"request body over {self.max_body} bytes")
                    return
                break
        if scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            bytes_in[0] += len(chunk)
            if bytes_in[0] > self.max_body:
                await _reply(send, 413, f"request body over {self.max_body} bytes")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        fast = self.fast.get(path) if scope["method"] == "POST" else None
        if fast is not None:
            scope["route"] = _FastRoute(path)  # what a metrics middleware outside labels by
            await fast(scope, body, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class _FastRoute:
    """The ``scope["route"]`` of a path served by a fast handler (not FastAPI's router)."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path
