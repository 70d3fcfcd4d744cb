"""The FastAPI application of ``agentrl serve`` (see :mod:`agentrl.policy.server`)."""

from __future__ import annotations

import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from agentrl.policy import lm
from agentrl.policy.chat import chat_prompt_ids
from agentrl.policy.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    HealthResponse,
    ModelList,
)
from agentrl.policy.sampling import Generation, SamplingParams
from agentrl.policy.streaming import TextStream
from agentrl.policy.wire import RequestError, error_body, sse

if TYPE_CHECKING:
    from fastapi import FastAPI

    from agentrl.policy.server import CompletionServer, _Job

__all__ = ["create_app"]

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "a bad request (the message names the field)"},
    404: {"model": ErrorResponse, "description": "an unknown model"},
}


def _validation_message(errors: Sequence[Any]) -> tuple[str, str | None]:
    parts: list[str] = []
    param = None
    for e in errors:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        if e.get("type") == "json_invalid":
            return f"request body is not JSON: {e.get('ctx', {}).get('error', e['msg'])}", None
        msg = str(e.get("msg", "")).removeprefix("Value error, ")
        if not loc:
            parts.append("request body must be a JSON object (with Content-Type: application/json)")
            continue
        if e.get("type") == "missing":
            msg = "is required"
        param = param or loc[0]
        parts.append(f"{'.'.join(loc)}: {msg}")
    return "; ".join(dict.fromkeys(parts)) or "invalid request", param


def _finish(g: Generation) -> str:
    return "length" if g.finish_reason == "length" else "stop"


def _ext(g: Generation) -> dict[str, Any]:
    return {
        "token_ids": g.token_ids,
        "prompt_token_ids": g.prompt_ids,
        "logprobs": g.logprobs,
        "finish_reason": g.finish_reason,
        "stop": g.stop,
        "policy_version": g.version,
    }


def _usage(prompt_tokens: int, gens: Sequence[Generation]) -> dict[str, int]:
    completion = sum(len(g.token_ids) for g in gens)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


class _Handlers:
    """Request parsing and response building, bound to one :class:`CompletionServer`."""

    def __init__(self, server: CompletionServer) -> None:
        self.server = server
        self.tok = server.policy.tokenizer
        self.context = lm.context_length(server.policy.model)

    # ------------------------------------------------------------------ parsing

    def _params(self, req: Any, max_tokens: int) -> SamplingParams:
        if req.model is not None and req.model != self.server.model_name:
            raise RequestError(f"model {req.model!r} does not exist", status=404, param="model")
        if not 1 <= req.n <= self.server.max_n:
            raise RequestError(f"n must be in 1..{self.server.max_n}", param="n")
        stop = req.stop if req.stop is not None else ()
        try:
            return SamplingParams(
                max_new_tokens=max_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                stop=(stop,) if isinstance(stop, str) else tuple(stop),
                seed=req.seed,
            )
        except (TypeError, ValueError) as e:
            raise RequestError(str(e)) from e

    def _check_ids(self, ids: list[list[int]]) -> None:
        vocab = self.tok.vocab_size
        for p in ids:
            if not p:
                raise RequestError("a prompt has no tokens", param="prompt")
            if any(not 0 <= t < vocab for t in p):
                raise RequestError(f"prompt token ids must be in 0..{vocab - 1}", param="prompt")
            if self.context is not None and len(p) >= self.context:
                raise RequestError(
                    f"a prompt has {len(p)} tokens, no room left in the model's context of "
                    f"{self.context}",
                    param="prompt",
                )

    def completion_rows(self, req: CompletionRequest) -> tuple[list[list[int]], SamplingParams]:
        if req.echo:
            raise RequestError("echo=true is not supported", param="echo")
        if req.suffix is not None:
            raise RequestError("suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise RequestError("best_of other than n is not supported", param="best_of")
        params = self._params(req, req.max_tokens)
        p = req.prompt
        if isinstance(p, str):
            ids = [self.tok.encode_prompt(p)]
        elif isinstance(p[0], str):
            ids = [self.tok.encode_prompt(t) for t in p]  # type: ignore[arg-type]
        elif isinstance(p[0], int):
            ids = [list(p)]  # type: ignore[arg-type]
        else:
            ids = [list(x) for x in p]  # type: ignore[union-attr]
        self._check_ids(ids)
        return [x for x in ids for _ in range(req.n)], params

    def chat_rows(self, req: ChatCompletionRequest) -> tuple[list[list[int]], SamplingParams]:
        if req.top_logprobs:
            raise RequestError(
                "top_logprobs > 0 is not supported (alternatives are not computed)",
                param="top_logprobs",
            )
        limit = req.max_completion_tokens or req.max_tokens
        params = self._params(req, self.server.chat_max_tokens if limit is None else limit)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            ids = chat_prompt_ids(self.tok, messages)
        except ValueError as e:
            raise RequestError(str(e), param="messages") from e
        self._check_ids([ids])
        return [ids] * req.n, params

    # ------------------------------------------------------------------ responses

    def _token_texts(self, ids: Sequence[int]) -> list[str]:
        return [self.tok.decode([t]) for t in ids]

    def completion_logprobs(self, ids: Sequence[int], lps: Sequence[float], at: int) -> dict:
        tokens = self._token_texts(ids)
        offsets = []
        for t in tokens:
            offsets.append(at)
            at += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": list(lps),
            "top_logprobs": None,
            "text_offset": offsets,
        }

    def chat_logprobs(self, ids: Sequence[int], lps: Sequence[float]) -> dict:
        return {
            "content": [
                {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                for t, lp in zip(self._token_texts(ids), lps, strict=True)
            ]
        }

    def completion_body(self, rows: list[list[int]], gens: list[Generation], lp: int | None):
        choices = []
        for i, g in enumerate(gens):
            choices.append(
                {
                    "index": i,
                    "text": g.text,
                    "logprobs": (
                        self.completion_logprobs(g.token_ids, g.logprobs, 0)
                        if lp is not None and lp >= 0
                        else None
                    ),
                    "finish_reason": _finish(g),
                    "stop_reason": g.stop,
                    "agentrl": _ext(g),
                }
            )
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.server.model_name,
            "choices": choices,
            "usage": _usage(sum(len(p) for p in rows), gens),
            "agentrl": {"policy_version": gens[0].version if gens else self.server.policy.version},
        }

    def chat_body(self, rows: list[list[int]], gens: list[Generation], logprobs: bool):
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": g.text},
                "logprobs": self.chat_logprobs(g.token_ids, g.logprobs) if logprobs else None,
                "finish_reason": _finish(g),
                "stop_reason": g.stop,
                "agentrl": _ext(g),
            }
            for i, g in enumerate(gens)
        ]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.server.model_name,
            "choices": choices,
            "usage": _usage(len(rows[0]), gens),
            "agentrl": {"policy_version": gens[0].version if gens else self.server.policy.version},
        }

    async def stream(
        self, job: _Job, params: SamplingParams, *, chat: bool, logprobs: bool, usage: bool
    ) -> AsyncIterator[dict[str, Any]]:
        """The chunks of a streamed completion, tokens sent as they are sampled."""
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.server.model_name,
        }
        rows = len(job.prompt_ids)
        streams = [TextStream(self.tok, params.stop) for _ in range(rows)]
        offsets = [0] * rows

        def choice(i: int, text: str, ids: Sequence[int], lps: Sequence[float]) -> dict:
            lp: dict | None = None
            if logprobs and ids:
                if chat:
                    lp = self.chat_logprobs(ids, lps)
                else:
                    lp = self.completion_logprobs(ids, lps, offsets[i])
                    offsets[i] = lp["text_offset"][-1] + len(lp["tokens"][-1])
            if chat:
                return {
                    "index": i,
                    "delta": {"content": text},
                    "logprobs": lp,
                    "finish_reason": None,
                }
            return {"index": i, "text": text, "logprobs": lp, "finish_reason": None}

        if chat:
            for i in range(rows):
                first = {"role": "assistant", "content": ""}
                yield head | {
                    "choices": [
                        {"index": i, "delta": first, "logprobs": None, "finish_reason": None}
                    ]
                }
        assert job.tokens is not None
        while (item := await job.tokens.get()) is not None:
            row, tid, lp = item
            delta = streams[row].push(tid, lp)
            if delta or logprobs:
                yield head | {"choices": [choice(row, delta, [tid], [lp])]}
        try:
            gens = await job.future
        except RequestError as e:
            yield error_body(str(e), status=e.status, param=e.param)
            return
        except Exception as e:
            yield error_body(f"{type(e).__name__}: {e}", status=500)
            return
        for i, g in enumerate(gens):
            last = choice(i, streams[i].finish(g.text), [], [])
            last |= {"finish_reason": _finish(g), "stop_reason": g.stop, "agentrl": _ext(g)}
            yield head | {"choices": [last]}
        if usage:
            prompt = len(job.prompt_ids[0]) if chat else sum(len(p) for p in job.prompt_ids)
            yield head | {"choices": [], "usage": _usage(prompt, gens)}


class _Gate:
    """ASGI middleware in front of the app: bearer-token auth of ``/v1/`` (when the server has
    an ``api_key``; constant-time comparison; ``/health`` stays open), a limit on request
    bodies (413), and POST bodies read as JSON whatever their Content-Type says (``curl -d``
    sends ``application/x-www-form-urlencoded``)."""

    def __init__(self, app: Any, *, api_key: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.token = None if api_key is None else f"Bearer {api_key}".encode()
        self.max_body_bytes = max_body_bytes
        from starlette.exceptions import HTTPException

        self._too_large = HTTPException(413, f"request body over {max_body_bytes} bytes")

    @staticmethod
    async def _reply(send: Any, status: int, message: str, headers: list | None = None) -> None:
        body = json.dumps(error_body(message, status=status)).encode()
        head = [(b"content-type", b"application/json"), *(headers or [])]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.token is not None and scope["path"].startswith("/v1/"):
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.token):
                why = "wrong API key" if given else "missing API key (Authorization: Bearer KEY)"
                await self._reply(send, 401, why, [(b"www-authenticate", b"Bearer")])
                return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await self._reply(send, 413, f"request body over {limit} bytes")
            return
        kept = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        # in place, so the route the router matches is seen by the middleware outside
        scope["headers"] = [*kept, (b"content-type", b"application/json")]
        seen = 0

        async def counted_receive() -> Any:  # a chunked body has no Content-Length
            nonlocal seen
            msg = await receive()
            seen += len(msg.get("body", b""))
            if seen > limit:
                raise self._too_large  # FastAPI passes HTTPExceptions through body parsing
            return msg

        await self.app(scope, counted_receive, send)


def create_app(server: CompletionServer) -> FastAPI:
    """The ASGI app serving ``server``'s policy (FastAPI; imported here, lazily)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException

    import agentrl

    h = _Handlers(server)
    app = FastAPI(
        title="agentrl serve",
        version=getattr(agentrl, "__version__", "0"),
        description="An agentrl policy behind OpenAI's completions and chat completions API.",
        redoc_url=None,
    )
    app.add_middleware(_Gate, api_key=server.api_key, max_body_bytes=server.max_body_bytes)
    try:  # Prometheus metrics where prometheus_client is installed (the metrics extra)
        import prometheus_client  # noqa: F401
    except ImportError:
        pass
    else:
        from agentrl.observability.metrics import MetricsMiddleware, asgi_app

        app.add_middleware(MetricsMiddleware)  # outermost: the gate's refusals count too
        app.mount("/metrics", asgi_app())

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, e: RequestError) -> JSONResponse:
        return JSONResponse(error_body(str(e), status=e.status, param=e.param), e.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        msg, param = _validation_message(e.errors())
        return JSONResponse(error_body(msg, status=400, param=param), 400)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException) -> JSONResponse:
        msg = f"{request.method} {request.url.path}: {e.detail}"
        return JSONResponse(error_body(msg, status=e.status_code), e.status_code, e.headers)

    @app.exception_handler(Exception)
    async def _crash(request: Request, e: Exception) -> JSONResponse:  # the server stays up
        return JSONResponse(error_body(f"{type(e).__name__}: {e}", status=500), 500)

    @app.get("/health", response_model=HealthResponse)
    async def health() -> Any:
        return JSONResponse({"status": "ok", "policy_version": server.policy.version})

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> Any:
        card = {
            "id": server.model_name,
            "object": "model",
            "created": server.created,
            "owned_by": "agentrl",
        }
        return JSONResponse({"object": "list", "data": [card]})

    def _sse(events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
        return StreamingResponse(
            sse(events),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.post("/v1/completions", response_model=CompletionResponse, responses=_ERRORS)
    async def completions(req: CompletionRequest) -> Any:
        rows, params = h.completion_rows(req)
        job = await server.generate(rows, params, stream=req.stream)
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            want_lp = req.logprobs is not None and req.logprobs >= 0
            return _sse(h.stream(job, params, chat=False, logprobs=want_lp, usage=usage))
        return JSONResponse(h.completion_body(rows, await job.future, req.logprobs))

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=_ERRORS)
    async def chat_completions(req: ChatCompletionRequest) -> Any:
        rows, params = h.chat_rows(req)
        job = await server.generate(rows, params, stream=req.stream)
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            return _sse(h.stream(job, params, chat=True, logprobs=req.logprobs, usage=usage))
        return JSONResponse(h.chat_body(rows, await job.future, req.logprobs))

    return app
