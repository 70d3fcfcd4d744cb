"""What ``agentrl serve`` puts on the wire besides its models: OpenAI's error object and
server-sent events (no third-party import, so :mod:`agentrl.policy.server` stays light)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["RequestError", "error_body", "sse"]


class RequestError(ValueError):
    """A client error: answered with HTTP ``status`` and an OpenAI-style error object."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


def error_body(message: str, *, status: int, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object for HTTP ``status``."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 404:
        kind = "not_found_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


async def sse(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """Server-sent events: ``data: {json}\\n\\n`` per event, then ``data: [DONE]\\n\\n``."""
    async for ev in events:
        yield b"data: " + json.dumps(ev, separators=(",", ":")).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"
