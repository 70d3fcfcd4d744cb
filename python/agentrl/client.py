"""A client of ``agentrl sandbox-server``: the pool's job surface over HTTP.

:class:`SandboxClient` implements the executor protocol (``submit`` / ``submit_python``
return concurrent futures, ``run`` / ``run_python`` awaitables, ``map``, ``workers``,
``stats``, ``close``) through ``POST /v1/run``, so code written for a local
:class:`~agentrl.SandboxPool` can send its runs to one or more servers instead. It also
speaks SandboxFusion's ``/run_code`` (:meth:`SandboxClient.run_code`) and agentrl's
``/v1/judge`` (:meth:`SandboxClient.judge`).

Requests go round-robin over the server URLs; a 429 or 503 is retried after the server's
``Retry-After`` (capped), a refused or dropped connection on the next URL. httpx is imported
on first use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import random
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from agentrl.errors import AgentRLError
from agentrl.sandbox.limits import Limits
from agentrl.sandbox.result import ExecResult

__all__ = ["SandboxClient", "ServiceError", "ServiceUnavailable"]

_JOB_KEYS = frozenset({"stdin", "files", "collect", "limits", "env", "cwd"})


class ServiceError(AgentRLError):
    """The server refused a request (4xx: bad token, bad arguments, too large); ``status``
    is the HTTP status and ``detail`` the server's reason."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"sandbox server answered {status}: {detail}")
        self.status = status
        self.detail = detail


class ServiceUnavailable(AgentRLError):
    """No server took the request within the retries (unreachable, or busy throughout)."""


def _b64(data: bytes | str) -> str:
    import base64

    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes or str, got {type(data).__name__}")
    return base64.b64encode(bytes(data)).decode("ascii")


def _job(argv: Any, python: bool, kw: Mapping[str, Any]) -> dict[str, Any]:
    """The ``/v1/run`` job of a ``submit``/``submit_python`` call (checked here)."""
    unknown = set(kw) - _JOB_KEYS
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
    job: dict[str, Any] = {}
    if python:
        if not isinstance(argv, str):
            raise TypeError(f"source must be a str, got {type(argv).__name__}")
        job["source"] = argv
    else:
        if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence) or not argv:
            raise TypeError("argv must be a non-empty sequence of str")
        job["argv"] = [str(a) for a in argv]
    stdin = kw.get("stdin")
    if stdin is not None:
        job["stdin_b64"] = _b64(stdin)
    files = kw.get("files")
    if files:
        if not isinstance(files, Mapping):
            raise TypeError("files must be a mapping of path to bytes")
        job["files"] = {str(k): _b64(v) for k, v in files.items()}
    collect = kw.get("collect")
    if collect:
        job["collect"] = [str(c) for c in collect]
    limits = kw.get("limits")
    if limits is not None:
        if not isinstance(limits, Limits):
            raise TypeError(f"limits must be agentrl.Limits, got {type(limits).__name__}")
        job["limits"] = dataclasses.asdict(limits)
    if kw.get("env") is not None:
        job["env"] = {str(k): str(v) for k, v in dict(kw["env"]).items()}
    if kw.get("cwd") is not None:
        job["cwd"] = str(kw["cwd"])
    return job


class SandboxClient:
    """Runs sandbox jobs on ``agentrl sandbox-server`` instances.

    * ``urls``: one base URL (``http://host:8080``) or several, used round-robin.
    * ``token``: the servers' bearer token.
    * ``max_concurrency``: most requests in flight at once (also :attr:`workers`).
    * ``retries``: attempts beyond the first for a busy (429/503) or unreachable server;
      each waits the server's ``Retry-After`` (at most ``max_retry_wait`` seconds) or a
      jittered backoff.
    * ``timeout``: seconds to wait for an answer (``None``: as long as the run takes, which
      its limits bound).

    Thread-safe. The HTTP work runs on one event loop in a daemon thread; :meth:`run` and
    :meth:`run_python` are awaitable from any event loop, :meth:`submit` returns a
    :class:`concurrent.futures.Future`. Close it (or use ``with``) to stop that thread.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        token: str | None = None,
        max_concurrency: int = 64,
        retries: int = 8,
        max_retry_wait: float = 10.0,
        timeout: float | None = None,
    ) -> None:
        if isinstance(urls, str):
            urls = [urls]
        self._urls = [u.rstrip("/") for u in urls]
        if not self._urls or not all(u.startswith(("http://", "https://")) for u in self._urls):
            raise ValueError(f"urls must be one or more http(s):// base URLs, got {urls!r}")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int):
            raise TypeError("max_concurrency must be an int")
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if retries < 0:
            raise ValueError("retries must be non-negative")
        self._token = token
        self._max_concurrency = max_concurrency
        self._retries = retries
        self._max_retry_wait = float(max_retry_wait)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._http: Any = None
        self._sem: asyncio.Semaphore | None = None
        self._next = 0
        self._closed = False
        self._stats = {"submitted": 0, "completed": 0, "failed": 0, "retries": 0, "busy": 0}
        self._per_url = dict.fromkeys(self._urls, 0)

    # --- the loop thread ---------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError("SandboxClient is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def main() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(
                    target=main, name="agentrl-sandbox-client", daemon=True
                )
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    async def _client(self) -> Any:
        if self._http is None:
            import httpx

            headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
            limits = httpx.Limits(
                max_connections=self._max_concurrency,
                max_keepalive_connections=self._max_concurrency,
            )
            self._http = httpx.AsyncClient(
                headers=headers,
                limits=limits,
                timeout=httpx.Timeout(10.0, read=self._timeout, pool=None),
            )
            self._sem = asyncio.Semaphore(self._max_concurrency)
        return self._http

    def _call(self, coro: Any) -> concurrent.futures.Future:
        try:
            loop = self._ensure_loop()
        except BaseException:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, loop)

    # --- HTTP with retries ---------------------------------------------------------------

    async def _post(self, path: str, payload: Any) -> Any:
        import httpx

        http = await self._client()
        assert self._sem is not None
        attempt = 0
        last: str = ""
        async with self._sem:
            while True:
                url = self._urls[self._next % len(self._urls)]
                self._next += 1
                try:
                    r = await http.post(url + path, json=payload)
                except (
                    httpx.ConnectError,
                    httpx.ConnectTimeout,
                    httpx.RemoteProtocolError,
                    httpx.ReadError,
                    httpx.WriteError,
                ) as e:
                    last = f"{url}: {type(e).__name__}: {e}"
                    wait = None
                else:
                    self._per_url[url] += 1
                    if r.status_code not in (429, 503):
                        if r.status_code >= 400:
                            try:
                                detail = r.json().get("detail", r.text)
                            except ValueError:
                                detail = r.text
                            raise ServiceError(r.status_code, detail)
                        return r.json()
                    self._stats["busy"] += 1
                    last = f"{url}: HTTP {r.status_code}"
                    try:
                        wait = float(r.headers.get("retry-after", ""))
                    except ValueError:
                        wait = None
                if attempt >= self._retries:
                    raise ServiceUnavailable(
                        f"no sandbox server took the request after {attempt + 1} attempts "
                        f"(last: {last})"
                    )
                attempt += 1
                self._stats["retries"] += 1
                if wait is None:
                    wait = min(0.05 * 2**attempt, 2.0)
                await asyncio.sleep(min(wait, self._max_retry_wait) * random.uniform(0.5, 1.0))

    async def _run_job(self, job: dict[str, Any]) -> ExecResult:
        from agentrl.service.models import exec_result_from_json

        try:
            body = await self._post("/v1/run", {"jobs": [job], "stream": False})
            result = exec_result_from_json(body["results"][0])
        except BaseException:
            self._stats["failed"] += 1
            raise
        self._stats["completed"] += 1
        return result

    # --- the executor protocol ---------------------------------------------------------

    @property
    def workers(self) -> int:
        """Requests in flight at most (the client's share of the servers' boxes)."""
        return self._max_concurrency

    @property
    def urls(self) -> list[str]:
        """The servers' base URLs."""
        return list(self._urls)

    def submit(self, argv: Sequence[Any], **kw: Any) -> concurrent.futures.Future[ExecResult]:
        """Runs ``argv`` on a server; a future of its :class:`ExecResult`. Keywords as
        :meth:`SandboxPool.submit`: stdin, files, collect, limits, env, cwd."""
        job = _job(argv, False, kw)
        with self._lock:
            self._stats["submitted"] += 1
        return self._call(self._run_job(job))

    def submit_python(self, source: str, **kw: Any) -> concurrent.futures.Future[ExecResult]:
        """Runs Python ``source`` on a server (the box's interpreter)."""
        job = _job(source, True, kw)
        with self._lock:
            self._stats["submitted"] += 1
        return self._call(self._run_job(job))

    def run(self, argv: Sequence[Any], **kw: Any) -> asyncio.Future[ExecResult]:
        """``await client.run(argv, ...)`` from any event loop; cancelling it abandons the
        request (the server then stops the run)."""
        return asyncio.wrap_future(self.submit(argv, **kw))

    def run_python(self, source: str, **kw: Any) -> asyncio.Future[ExecResult]:
        """:meth:`run` for Python ``source``."""
        return asyncio.wrap_future(self.submit_python(source, **kw))

    def map(
        self, jobs: Iterable[Any], *, timeout: float | None = None, **common: Any
    ) -> Iterator[ExecResult]:
        """Like :meth:`SandboxPool.map`: every job at once, results in order. A job is an argv
        sequence, Python source (a str) or a mapping with ``argv`` or ``source`` and its own
        keywords."""
        futs: list[concurrent.futures.Future] = []
        try:
            for j in jobs:
                if isinstance(j, Mapping):
                    kw = {**common, **j}
                    if ("argv" in kw) == ("source" in kw):
                        raise TypeError("a job mapping needs exactly one of 'argv' and 'source'")
                    if "source" in kw:
                        futs.append(self.submit_python(kw.pop("source"), **kw))
                    else:
                        futs.append(self.submit(kw.pop("argv"), **kw))
                elif isinstance(j, str):
                    futs.append(self.submit_python(j, **common))
                else:
                    futs.append(self.submit(j, **common))
        except BaseException:
            for f in futs:
                f.cancel()
            raise
        return self._results(futs, timeout)

    @staticmethod
    def _results(futs: list[concurrent.futures.Future], timeout: float | None) -> Iterator[Any]:
        import time

        end = None if timeout is None else time.monotonic() + timeout
        try:
            for f in futs:
                yield f.result(None if end is None else max(0.0, end - time.monotonic()))
        finally:
            for f in futs:
                f.cancel()

    def stats(self) -> dict[str, Any]:
        """Counts: submitted, completed, failed, retries, busy answers, requests per URL."""
        return {**self._stats, "workers": self.workers, "per_url": dict(self._per_url)}

    # --- SandboxFusion and judging -------------------------------------------------------

    async def arun_code(self, code: str, language: str = "python", **fields: Any) -> dict:
        """SandboxFusion's ``/run_code`` (fields as there: stdin, compile_timeout,
        run_timeout, memory_limit_MB, files, fetch_files); its response as a dict."""
        payload = {"code": code, "language": language, **fields}
        return await asyncio.wrap_future(self._call(self._post("/run_code", payload)))

    def run_code(self, code: str, language: str = "python", **fields: Any) -> dict:
        """:meth:`arun_code`, blocking."""
        payload = {"code": code, "language": language, **fields}
        return self._call(self._post("/run_code", payload)).result()

    def judge(
        self, items: Iterable[tuple[Mapping[str, Any], str]], *, timeout: float | None = None
    ) -> list[dict]:
        """Judges ``(task record, completion)`` pairs on a server (``/v1/judge``); one dict
        per pair, in order: ``{"judgement": {...}}`` or ``{"error": "..."}``."""
        payload: dict[str, Any] = {
            "items": [{"task": dict(t), "completion": c} for t, c in items],
            "stream": False,
        }
        if timeout is not None:
            payload["timeout"] = timeout
        return self._call(self._post("/v1/judge", payload)).result()["results"]

    # --- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Closes the connections and stops the client's thread (idempotent); futures of
        requests still in flight are cancelled."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None:
            return

        async def shutdown() -> None:
            # requests still in flight end cancelled: their futures resolve, none waits forever
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
            if self._http is not None:
                await self._http.aclose()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(10)
            loop.close()

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<agentrl.SandboxClient {state} urls={self._urls} workers={self.workers}>"
