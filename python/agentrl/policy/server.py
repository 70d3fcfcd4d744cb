"""``agentrl serve``: a local policy behind an OpenAI-compatible HTTP API.

FastAPI on uvicorn (uvloop and httptools where installed: ``agentrl[serve]``), request and
response models in :mod:`agentrl.policy.protocol`. Endpoints:

- ``POST /v1/completions``: ``prompt`` as a string, a list of strings, token ids or lists of
  token ids; ``max_tokens`` (16), ``temperature``, ``top_p``, ``stop``, ``n``, ``logprobs``,
  ``seed``, ``stream``, ``stream_options.include_usage``.
- ``POST /v1/chat/completions``: ``messages`` rendered with the model's chat template where
  it has one, else the simple template of :mod:`agentrl.policy.chat`; ``max_tokens`` /
  ``max_completion_tokens``, ``logprobs`` (bool), the same sampling fields and streaming.
- ``GET /v1/models``, ``GET /health``; the OpenAPI document at ``/openapi.json``.

Every choice carries an ``agentrl`` extension object: ``token_ids``, ``prompt_token_ids``,
``logprobs`` (one per token), ``finish_reason`` (``stop``/``eos``/``length``), ``stop`` and
``policy_version``; top log-probs (alternatives) are not computed.

``stream=true`` answers with server-sent events as vLLM and SGLang send them: ``data: {chunk}``
events (``text_completion`` chunks with a ``text`` delta, or ``chat.completion.chunk`` with a
``delta``: first ``{"role": "assistant", "content": ""}``, then content), tokens sent as the
model samples them; each choice's last chunk has its ``finish_reason`` and the ``agentrl``
object; then an optional usage chunk and ``data: [DONE]``.

Concurrent requests are batched: while the policy generates one batch (in a worker thread),
new requests queue up and go together into the next one. Requests with a ``seed`` run in a
batch of their own, so their results do not depend on other traffic. Bad requests get HTTP
400 with an OpenAI error object naming the problem (404 for an unknown model or route, 405
for a wrong method). SIGINT/SIGTERM stop accepting connections, let the requests in flight
finish, then exit.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import signal
import socket
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agentrl.policy.policy import Policy
from agentrl.policy.sampling import Generation, SamplingParams
from agentrl.policy.wire import RequestError

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["CompletionServer", "RequestError", "ServerThread", "add_parser", "run", "run_loop"]

_T = TypeVar("_T")


def run_loop(main: Coroutine[Any, Any, _T]) -> _T:
    """Runs ``main`` to completion on uvloop where it is installed, else on asyncio's loop."""
    try:
        import uvloop
    except ModuleNotFoundError:
        return asyncio.run(main)
    return uvloop.run(main)


@dataclass
class _Job:
    prompt_ids: list[list[int]]
    params: SamplingParams
    future: asyncio.Future[list[Generation]] = field(repr=False)
    tokens: asyncio.Queue[tuple[int, int, float] | None] | None = field(default=None, repr=False)
    """Streaming jobs: ``(row, token id, logprob)`` as sampled, then None when done."""


class CompletionServer:
    """Serves ``policy`` over HTTP (FastAPI on uvicorn) on the running event loop.

    ``chat_max_tokens`` is the default ``max_tokens`` of chat completions (still capped by the
    model's context); ``drain_timeout_s`` bounds how long :meth:`close` waits for requests in
    flight (then they are cancelled). With ``api_key``, ``/v1/`` requests need
    ``Authorization: Bearer <api_key>`` (401 otherwise); bodies over ``max_body_bytes`` get 413.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        model_name: str = "agentrl",
        max_batch: int = 64,
        batch_wait_s: float = 0.002,
        max_n: int = 128,
        chat_max_tokens: int = 512,
        drain_timeout_s: float = 30.0,
        api_key: str | None = None,
        max_body_bytes: int = 64 << 20,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"CompletionServer: max_batch must be >= 1, got {max_batch}")
        if chat_max_tokens < 1:
            raise ValueError(
                f"CompletionServer: chat_max_tokens must be >= 1, got {chat_max_tokens}"
            )
        self.policy = policy
        self.model_name = model_name
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.max_n = max_n
        self.chat_max_tokens = chat_max_tokens
        self.drain_timeout_s = drain_timeout_s
        if api_key is not None and not api_key:
            raise ValueError("CompletionServer: api_key must be a non-empty string or None")
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.created = int(time.time())
        self.batches = 0
        """Number of generate calls so far (a batch holds one or more requests)."""
        self._queue: asyncio.Queue[_Job] | None = None
        self._batcher: asyncio.Task[None] | None = None
        self._uvicorn: Any = None
        self._serving: asyncio.Task[None] | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "agentrl-serve")
        self._app: FastAPI | None = None

    @property
    def app(self) -> FastAPI:
        """The ASGI application (built on first use)."""
        if self._app is None:
            from agentrl.policy.app import create_app

            self._app = create_app(self)
        return self._app

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        """Starts listening; returns the bound ``(host, port)`` (port 0 picks a free one)."""
        import uvicorn

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(2048)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        addr = sock.getsockname()
        self._queue = asyncio.Queue()
        self._batcher = asyncio.create_task(self._batch_loop(), name="agentrl-serve-batcher")
        config = uvicorn.Config(
            self.app,
            loop="none",  # the running loop (uvloop under run_loop)
            http=_http_impl(),
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_keep_alive=30,
            timeout_graceful_shutdown=self.drain_timeout_s,
        )
        self._uvicorn = _uvicorn_class()(config)
        self._serving = asyncio.create_task(self._uvicorn.serve(sockets=[sock]), name="uvicorn")
        while not self._uvicorn.started:
            if self._serving.done():
                self._serving.result()  # raises the startup error
                raise RuntimeError("CompletionServer: uvicorn exited during startup")
            await asyncio.sleep(0.005)
        return addr[0], addr[1]

    async def close(self) -> None:
        """Stops listening, lets the requests in flight finish (up to ``drain_timeout_s``),
        fails the queued ones that are left, ends the worker."""
        if self._uvicorn is not None and self._serving is not None:
            self._uvicorn.should_exit = True
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._serving
        if self._batcher is not None:
            self._batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._batcher
        if self._queue is not None:
            while not self._queue.empty():
                job = self._queue.get_nowait()
                _fail(job, RuntimeError("the server shut down before this request ran"))
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)

    # ------------------------------------------------------------------ generation

    async def generate(
        self, rows: list[list[int]], params: SamplingParams, *, stream: bool = False
    ) -> _Job:
        """Queues ``rows`` for the batcher; the job's future gets one Generation per row."""
        if self._queue is None:
            raise RuntimeError("CompletionServer: not started")
        future: asyncio.Future[list[Generation]] = asyncio.get_running_loop().create_future()
        job = _Job(rows, params, future, asyncio.Queue() if stream else None)
        await self._queue.put(job)
        return job

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
        on_token = None
        if any(j.tokens is not None for j in batch):
            owner = [(j, r) for j in batch for r in range(len(j.prompt_ids))]

            def on_token(i: int, tid: int, lp: float) -> None:  # the generating thread
                job, row = owner[i]
                if job.tokens is not None:
                    loop.call_soon_threadsafe(job.tokens.put_nowait, (row, tid, lp))

        self.batches += 1
        try:
            gens = await loop.run_in_executor(
                self._executor,
                lambda: self.policy.generate_ids(ids, params, on_token=on_token),
            )
        except ValueError as e:
            # Raised by the up-front checks (before any token): find the request at fault;
            # the others still succeed.
            if len(batch) > 1:
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
            if job.tokens is not None:
                job.tokens.put_nowait(None)
            at += k


def _fail(job: _Job, exc: BaseException) -> None:
    if not job.future.done():
        job.future.set_exception(exc)
    if job.tokens is not None:
        job.tokens.put_nowait(None)


def _http_impl() -> str:
    try:
        import httptools  # noqa: F401
    except ModuleNotFoundError:
        return "h11"
    return "httptools"


def _uvicorn_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server without its signal handlers: the owner of the loop decides."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Server


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
        """Shuts the server down (requests in flight finish) and joins the thread."""
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
    p.add_argument(
        "--chat-max-tokens", type=int, default=512, help="default max_tokens of chat requests"
    )
    p.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="require 'Authorization: Bearer <the file's first line>' on /v1/ requests",
    )
    p.add_argument("--seed", type=int, default=0, help="init seed of the default model")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Runs ``agentrl serve`` until SIGINT or SIGTERM; returns the exit status."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError as e:
        print(f"agentrl serve needs {e.name}: pip install 'agentrl[serve]'", file=sys.stderr)
        return 2
    try:
        api_key = None
        if args.api_key_file:
            api_key = Path(args.api_key_file).read_text().strip() or None
            if api_key is None:
                raise ValueError(f"--api-key-file {args.api_key_file}: the file is empty")
        if args.policy:
            policy = Policy.load(args.policy, device=args.device, dtype=args.dtype)
        else:
            policy = Policy.builtin(device=args.device, dtype=args.dtype, seed=args.seed)
        name = args.model_name or (Path(args.policy).name if args.policy else "agentrl-builtin")
        server = CompletionServer(
            policy,
            model_name=name,
            max_batch=args.max_batch,
            batch_wait_s=args.batch_wait_ms / 1000.0,
            chat_max_tokens=args.chat_max_tokens,
            api_key=api_key,
        )
    except (ValueError, TypeError, OSError) as e:
        print(f"agentrl serve: {e}", file=sys.stderr)
        return 2

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
        shown = f"[{host}]" if ":" in host else host
        print(
            f"agentrl serve: listening on http://{shown}:{port} (model {name}, {policy!r})",
            flush=True,
        )
        await stop.wait()
        await server.close()
        print("agentrl serve: stopped", flush=True)
        return 0

    return run_loop(main())
