"""``agentrl serve``: a local policy behind an OpenAI-compatible HTTP API.

Endpoints: ``POST /v1/completions`` (``prompt`` as a string, a list of strings, token ids
or lists of token ids; ``max_tokens``, ``temperature``, ``top_p``, ``stop``, ``n``,
``logprobs``, ``seed``), ``GET /v1/models``, ``GET /health``. Every choice carries an
``agentrl`` extension object: ``token_ids``, ``prompt_token_ids``, ``logprobs`` (one per
token), ``finish_reason`` (``stop``/``eos``/``length``), ``stop`` and ``policy_version``.
``logprobs.top_logprobs`` is always null (alternatives are not computed).

Concurrent requests are batched: while the policy generates one batch (in a worker thread),
new requests queue up and go together into the next one. Requests with a ``seed`` run in
a batch of their own, so their results do not depend on other traffic. The server runs on
uvloop where it is installed (``agentrl[uvloop]``; asyncio's own loop otherwise) and shuts down
cleanly on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import signal
import sys
import threading
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from agentrl.policy.httpio import HTTPError, Request, read_request, write_response
from agentrl.policy.policy import Policy
from agentrl.policy.sampling import Generation, SamplingParams

__all__ = ["CompletionServer", "ServerThread", "add_parser", "run", "run_loop"]

_T = TypeVar("_T")


def run_loop(main: Coroutine[Any, Any, _T]) -> _T:
    """Runs ``main`` to completion on uvloop where it is installed, else on asyncio's loop."""
    try:
        import uvloop
    except ModuleNotFoundError:
        return asyncio.run(main)
    return uvloop.run(main)


class RequestError(ValueError):
    """A client error: answered with HTTP ``status`` and an OpenAI-style error object."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


@dataclass
class _Job:
    prompt_ids: list[list[int]]
    params: SamplingParams
    future: asyncio.Future[list[Generation]] = field(repr=False)


def _error(message: str, *, status: int, param: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 404:
        kind = "not_found_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _number(body: dict[str, Any], name: str, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RequestError(f"{name} must be a number", param=name)
    return float(v)


def _int(body: dict[str, Any], name: str, default: int | None) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(f"{name} must be an integer", param=name)
    return v


class CompletionServer:
    """Serves ``policy`` over HTTP on the running event loop."""

    def __init__(
        self,
        policy: Policy,
        *,
        model_name: str = "agentrl",
        max_batch: int = 64,
        batch_wait_s: float = 0.002,
        max_n: int = 128,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"CompletionServer: max_batch must be >= 1, got {max_batch}")
        self.policy = policy
        self.model_name = model_name
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.max_n = max_n
        self.created = int(time.time())
        self.batches = 0
        """Number of generate calls so far (a batch holds one or more requests)."""
        self._queue: asyncio.Queue[_Job] | None = None
        self._server: asyncio.Server | None = None
        self._batcher: asyncio.Task[None] | None = None
        self._conns: set[asyncio.Task[Any]] = set()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "agentrl-serve")

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        """Starts listening; returns the bound ``(host, port)`` (port 0 picks a free one)."""
        self._queue = asyncio.Queue()
        self._batcher = asyncio.create_task(self._batch_loop(), name="agentrl-serve-batcher")
        self._server = await asyncio.start_server(self._connection, host, port)
        addr = self._server.sockets[0].getsockname()
        return addr[0], addr[1]

    async def close(self) -> None:
        """Stops listening, drops the connections, fails queued requests, ends the worker."""
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)
        if self._batcher is not None:
            self._batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._batcher
        if self._queue is not None:
            while not self._queue.empty():
                job = self._queue.get_nowait()
                if not job.future.done():
                    job.future.cancel()
        if self._server is not None:
            await self._server.wait_closed()
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)

    # ------------------------------------------------------------------ HTTP

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            while True:
                try:
                    req = await read_request(reader)
                except (HTTPError, ValueError) as e:
                    write_response(writer, 400, _error(str(e), status=400), keep_alive=False)
                    await writer.drain()
                    return
                if req is None:
                    return
                status, payload = await self._dispatch(req)
                write_response(writer, status, payload, keep_alive=req.keep_alive)
                await writer.drain()
                if not req.keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._conns.discard(task)
            writer.close()

    async def _dispatch(self, req: Request) -> tuple[int, Any]:
        routes = {
            "/health": ("GET", self._health),
            "/v1/models": ("GET", self._models),
            "/v1/completions": ("POST", self._completions),
        }
        route = routes.get(req.path.rstrip("/") or "/")
        if route is None:
            return 404, _error(f"no route {req.method} {req.path}", status=404)
        if req.method != route[0]:
            return 405, _error(f"{req.path} takes {route[0]}, not {req.method}", status=405)
        try:
            return 200, await route[1](req)
        except RequestError as e:
            return e.status, _error(str(e), status=e.status, param=e.param)
        except Exception as e:  # the server stays up; the client sees the cause
            return 500, _error(f"{type(e).__name__}: {e}", status=500)

    async def _health(self, req: Request) -> dict[str, Any]:
        return {"status": "ok", "policy_version": self.policy.version}

    async def _models(self, req: Request) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "agentrl",
                }
            ],
        }

    # ------------------------------------------------------------------ completions

    def _parse(self, req: Request) -> tuple[list[list[int]], SamplingParams, int]:
        try:
            body = json.loads(req.body or b"null")
        except ValueError as e:
            raise RequestError(f"request body is not JSON: {e}") from e
        if not isinstance(body, dict):
            raise RequestError("request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise RequestError(f"model {model!r} does not exist", status=404, param="model")
        for flag in ("stream", "echo"):
            if body.get(flag):
                raise RequestError(f"{flag}=true is not supported", param=flag)
        if body.get("suffix") is not None:
            raise RequestError("suffix is not supported", param="suffix")
        n = _int(body, "n", 1)
        assert n is not None
        if not 1 <= n <= self.max_n:
            raise RequestError(f"n must be in 1..{self.max_n}", param="n")
        best_of = _int(body, "best_of", None)
        if best_of is not None and best_of != n:
            raise RequestError("best_of other than n is not supported", param="best_of")
        prompt = body.get("prompt")
        texts: list[str] | None = None
        tok = self.policy.tokenizer
        if isinstance(prompt, str):
            texts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            texts = list(prompt)
        if texts is not None:
            ids = [tok.encode_prompt(t) for t in texts]
        elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            ids = [list(prompt)]
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(p, list) and all(type(t) is int for t in p) for p in prompt)
        ):
            ids = [list(p) for p in prompt]
        else:
            raise RequestError(
                "prompt must be a string, a list of strings, token ids or lists of token ids",
                param="prompt",
            )
        vocab = tok.vocab_size
        for p in ids:
            if not p:
                raise RequestError("a prompt has no tokens", param="prompt")
            if any(not 0 <= t < vocab for t in p):
                raise RequestError(f"prompt token ids must be in 0..{vocab - 1}", param="prompt")
        stop = body.get("stop")
        if stop is None:
            stop = ()
        elif isinstance(stop, str):
            stop = (stop,)
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            stop = tuple(stop)
        else:
            raise RequestError("stop must be a string or a list of strings", param="stop")
        try:
            params = SamplingParams(
                max_new_tokens=_int(body, "max_tokens", 16),  # type: ignore[arg-type]
                temperature=_number(body, "temperature", 1.0),
                top_p=_number(body, "top_p", 1.0),
                stop=stop,
                seed=_int(body, "seed", None),
            )
        except (TypeError, ValueError) as e:
            raise RequestError(str(e)) from e
        logprobs = body.get("logprobs")
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)):
            raise RequestError("logprobs must be an integer or null", param="logprobs")
        rows = [p for p in ids for _ in range(n)]
        return rows, params, (-1 if logprobs is None else logprobs)

    async def _completions(self, req: Request) -> dict[str, Any]:
        rows, params, logprobs = self._parse(req)
        assert self._queue is not None
        future: asyncio.Future[list[Generation]] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Job(rows, params, future))
        gens = await future
        choices = []
        tok = self.policy.tokenizer
        for i, g in enumerate(gens):
            choice: dict[str, Any] = {
                "index": i,
                "text": g.text,
                "logprobs": None,
                "finish_reason": "length" if g.finish_reason == "length" else "stop",
                "agentrl": {
                    "token_ids": g.token_ids,
                    "prompt_token_ids": g.prompt_ids,
                    "logprobs": g.logprobs,
                    "finish_reason": g.finish_reason,
                    "stop": g.stop,
                    "policy_version": g.version,
                },
            }
            if logprobs >= 0:
                tokens = [tok.decode([t]) for t in g.token_ids]
                offsets, at = [], 0
                for t in tokens:
                    offsets.append(at)
                    at += len(t)
                choice["logprobs"] = {
                    "tokens": tokens,
                    "token_logprobs": g.logprobs,
                    "top_logprobs": None,
                    "text_offset": offsets,
                }
            choices.append(choice)
        prompt_tokens = sum(len(p) for p in rows)
        completion_tokens = sum(len(g.token_ids) for g in gens)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "agentrl": {"policy_version": gens[0].version if gens else self.policy.version},
        }

    # ------------------------------------------------------------------ batching

    async def _batch_loop(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        held: _Job | None = None
        while True:
            first = held or await self._queue.get()
            held = None
            batch = [first]
            if first.params.seed is None:  # seeded requests run alone
                rows = len(first.prompt_ids)
                deadline = loop.time() + self.batch_wait_s
                while rows < self.max_batch:
                    try:
                        timeout = max(0.0, deadline - loop.time())
                        job = await asyncio.wait_for(self._queue.get(), timeout)
                    except asyncio.TimeoutError:  # builtin TimeoutError from 3.11 on
                        break
                    if job.params.seed is not None or rows + len(job.prompt_ids) > self.max_batch:
                        held = job
                        break
                    batch.append(job)
                    rows += len(job.prompt_ids)
            batch = [j for j in batch if not j.future.done()]  # the client went away
            if batch:
                await self._run(batch)

    async def _run(self, batch: list[_Job]) -> None:
        loop = asyncio.get_running_loop()
        ids = [p for j in batch for p in j.prompt_ids]
        params = [j.params for j in batch for _ in j.prompt_ids]
        self.batches += 1
        try:
            gens = await loop.run_in_executor(self._executor, self.policy.generate_ids, ids, params)
        except ValueError as e:
            if len(batch) > 1:  # find the request at fault; the others still succeed
                for job in batch:
                    await self._run([job])
                return
            _fail(batch[0], RequestError(str(e)))
            return
        except Exception as e:
            for job in batch:
                _fail(job, e)
            return
        at = 0
        for job in batch:
            k = len(job.prompt_ids)
            if not job.future.done():
                job.future.set_result(gens[at : at + k])
            at += k


def _fail(job: _Job, exc: BaseException) -> None:
    if not job.future.done():
        job.future.set_exception(exc)


class ServerThread:
    """A :class:`CompletionServer` in a daemon thread, on its own loop (see :func:`run_loop`).

    ``with ServerThread(policy) as srv: ... srv.url ...`` (``url`` has no ``/v1``).
    """

    def __init__(
        self, policy: Policy, *, host: str = "127.0.0.1", port: int = 0, **server_kw: Any
    ) -> None:
        self.server = CompletionServer(policy, **server_kw)
        self._host, self._port = host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.address: tuple[str, int] | None = None
        self._thread = threading.Thread(target=self._main, name="agentrl-serve", daemon=True)

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server."""
        if self.address is None:
            raise RuntimeError("ServerThread: not started")
        return f"http://{self.address[0]}:{self.address[1]}"

    def start(self) -> ServerThread:
        """Starts the thread and waits until the server listens."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise RuntimeError(f"ServerThread: the server failed to start: {self._error!r}")
        return self

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                self.address = await self.server.start(self._host, self._port)
            except BaseException as e:
                self._error = e
                self._ready.set()
                raise
            self._ready.set()
            await self._stop.wait()
            await self.server.close()

        with contextlib.suppress(BaseException):
            run_loop(main())
        self._ready.set()

    def close(self) -> None:
        """Shuts the server down and joins the thread."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------- command line


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``agentrl serve`` on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "serve",
        help="serve a policy over an OpenAI-compatible HTTP API",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "--policy",
        metavar="DIR",
        help="checkpoint directory (Policy.save) or Hugging Face model directory; "
        "default: a fresh built-in model",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if present)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16")
    p.add_argument("--model-name", default=None, help="model id in the API")
    p.add_argument("--max-batch", type=int, default=64, help="most sequences per batch")
    p.add_argument("--batch-wait-ms", type=float, default=2.0, help="wait to fill a batch")
    p.add_argument("--seed", type=int, default=0, help="init seed of the default model")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Runs ``agentrl serve`` until SIGINT or SIGTERM; returns the exit status."""
    try:
        if args.policy:
            policy = Policy.load(args.policy, device=args.device, dtype=args.dtype)
        else:
            policy = Policy.builtin(device=args.device, dtype=args.dtype, seed=args.seed)
    except (ValueError, TypeError, OSError) as e:
        print(f"agentrl serve: {e}", file=sys.stderr)
        return 2
    name = args.model_name or (Path(args.policy).name if args.policy else "agentrl-builtin")
    server = CompletionServer(
        policy,
        model_name=name,
        max_batch=args.max_batch,
        batch_wait_s=args.batch_wait_ms / 1000.0,
    )

    async def main() -> int:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            host, port = await server.start(args.host, args.port)
        except OSError as e:
            print(f"agentrl serve: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
            return 1
        print(
            f"agentrl serve: listening on http://{host}:{port} (model {name}, {policy!r})",
            flush=True,
        )
        await stop.wait()
        await server.close()
        print("agentrl serve: stopped", flush=True)
        return 0

    return run_loop(main())
