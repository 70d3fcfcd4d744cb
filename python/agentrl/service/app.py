"""The FastAPI app of the sandbox service: SandboxFusion's ``/run_code`` and ``/v1/ping``,
agentrl's ``/v1/run`` and ``/v1/judge`` (batches, NDJSON as results finish), ``/health``
and, where ``agentrl.observability`` is installed, ``/metrics``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from agentrl._core import __version__
from agentrl.errors import AgentRLError
from agentrl.pool.jobs import JobExpired, JobFailed, PoolClosed
from agentrl.pool.pool import SandboxPool
from agentrl.sandbox.limits import Limits
from agentrl.service.config import ServiceConfig
from agentrl.service.gate import Gate
from agentrl.service.models import (
    ExecResultModel,
    JudgeRequest,
    RunCodeRequest,
    RunCodeResponse,
    RunJob,
    RunRequest,
    b64decode,
)
from agentrl.service.runcode import BadRequest, request_files, request_limits, response_of

__all__ = ["Admission", "create_app"]

log = logging.getLogger("agentrl.service")


class Admission:
    """The count of sandbox runs accepted and not yet finished, bounded by ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.inflight = 0
        self.accepted = 0
        self.refused = 0

    def try_acquire(self, n: int) -> bool:
        if self.inflight + n > self.limit:
            self.refused += 1
            return False
        self.inflight += n
        self.accepted += n
        return True

    def release(self, n: int = 1) -> None:
        self.inflight -= n


def _busy(cfg: ServiceConfig, adm: Admission) -> JSONResponse:
    return JSONResponse(
        {"detail": f"server busy: {adm.inflight} runs in flight (limit {adm.limit}); retry"},
        status_code=429,
        headers={"Retry-After": str(cfg.retry_after_s)},
    )


async def _no_receive() -> dict[str, Any]:
    """The receive of a fast-path response (the body was read already; a plain response
    does not listen for a disconnect)."""
    return {"type": "http.disconnect"}


def _unprocessable(detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=422)


def _check_limits(model: Any, cfg: ServiceConfig) -> Limits:
    """The job's :class:`Limits`: the server's defaults with what it sets, each within
    ``cfg.max_limits`` (a ``BadRequest`` naming the field otherwise)."""
    if model is None:
        return cfg.default_limits
    changes = {k: v for k, v in model.model_dump().items() if v is not None}
    for k, v in changes.items():
        top = getattr(cfg.max_limits, k)
        if v > top:
            raise BadRequest(f"limits.{k} must be at most {top}, got {v}")
    try:
        return cfg.default_limits.replace(**changes)
    except (ValueError, TypeError) as e:
        raise BadRequest(str(e)) from None


def check_rel_path(where: str, path: str) -> None:
    """A work-dir path a request names: relative, no ``..``, no NUL (a ``BadRequest``)."""
    if not path or "\0" in path:
        raise BadRequest(f"{where}: {path!r} is not a path")
    if path.startswith("/"):
        raise BadRequest(f"{where}: {path!r} is absolute; give a path relative to the work dir")
    if ".." in path.split("/"):
        raise BadRequest(f"{where}: {path!r} leaves the work dir")


def _job_args(job: RunJob, cfg: ServiceConfig) -> tuple[bool, Any, dict[str, Any]]:
    """``(python, argv or source, keywords)`` of one ``/v1/run`` job."""
    if (job.argv is None) == (job.source is None):
        raise BadRequest("a job needs exactly one of 'argv' and 'source'")
    if job.stdin is not None and job.stdin_b64 is not None:
        raise BadRequest("give stdin or stdin_b64, not both")
    kw: dict[str, Any] = {"limits": _check_limits(job.limits, cfg)}
    if job.stdin is not None:
        kw["stdin"] = job.stdin.encode()
    elif job.stdin_b64 is not None:
        kw["stdin"] = b64decode(job.stdin_b64, "stdin_b64")
    if job.files:
        for k in job.files:
            check_rel_path("files", k)
        kw["files"] = {k: b64decode(v, f"files[{k!r}]") for k, v in job.files.items()}
    if job.collect:
        for k in job.collect:
            check_rel_path("collect", k)
        kw["collect"] = list(job.collect)
    if job.env is not None:
        kw["env"] = job.env
    if job.cwd is not None:
        if job.source is not None:
            raise BadRequest("cwd applies to argv jobs only")
        kw["cwd"] = job.cwd
    if job.source is not None:
        return True, job.source, kw
    return False, list(job.argv or ()), kw


def _outcome_json(index: int, fut: asyncio.Future) -> dict[str, Any]:
    """The NDJSON record of one finished job: its verdict, or a ``sandbox_error`` saying why
    the pool could not run it (every accepted job gets exactly one record)."""
    if fut.cancelled():
        return {"index": index, "result": {"status": "sandbox_error", "error": "cancelled"}}
    e = fut.exception()
    if e is None:
        return {"index": index, "result": ExecResultModel.of(fut.result())}
    if isinstance(e, (ValueError, TypeError)):  # refused by the core at submission
        return {"index": index, "result": {"status": "sandbox_error", "error": f"refused: {e}"}}
    return {"index": index, "result": {"status": "sandbox_error", "error": f"{e}"}}


async def _wait_all(futs: Sequence[asyncio.Future], request: Request) -> bool:
    """Waits for every future; ``False`` (the rest cancelled, their runs killed) if the client
    went away first."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    everything = asyncio.ensure_future(asyncio.wait(futs))
    try:
        await asyncio.wait({watch, everything}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if everything.done():
        return True
    everything.cancel()
    for f in futs:
        f.cancel()
    return False


async def _as_finished(
    futs: Sequence[asyncio.Future], record: Callable[[int, asyncio.Future], dict[str, Any]]
) -> AsyncIterator[bytes]:
    """NDJSON lines, one per future, as they finish; unfinished ones are cancelled if the
    client goes away."""
    index = {f: i for i, f in enumerate(futs)}
    pending = set(futs)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            lines = [json.dumps(record(index[f], f)) for f in done]
            yield ("\n".join(lines) + "\n").encode()
    finally:
        for f in pending:
            f.cancel()


def create_app(
    config: ServiceConfig | None = None,
    *,
    pool: SandboxPool | None = None,
) -> Any:
    """The ASGI app (a FastAPI app behind the auth/size/log gate).

    ``pool``: the :class:`SandboxPool` to serve (kept open); by default the app makes one at
    startup (``config.workers``, the network per ``config.allow_network``) and closes it at
    shutdown, after every accepted request has been answered."""
    cfg = config or ServiceConfig()
    adm = Admission(cfg.inflight_limit)
    state: dict[str, Any] = {"pool": pool, "evaluator": None, "draining": False}
    import agentrl.languages as langs

    limits_cache: dict[tuple, tuple[Limits, Limits]] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = state["pool"] is None
        if owned:
            n = cfg.pool_workers
            state["pool"] = SandboxPool(
                workers=n,
                capacity=4 * adm.limit + 64,
                sandbox={"network": cfg.allow_network, "max_concurrency": 2 * n},
            )
        tracer = _observe(state["pool"], cfg)
        log.info(
            json.dumps(
                {
                    "event": "start",
                    "workers": state["pool"].workers,
                    "max_inflight": adm.limit,
                    "network": cfg.allow_network,
                    "auth": cfg.token is not None,
                    "pid": os.getpid(),
                }
            )
        )
        try:
            yield
        finally:
            state["draining"] = True
            if state["evaluator"] is not None:
                state["evaluator"].close()
            if owned:
                state["pool"].close()
            if tracer is not None:
                tracer.close()
            log.info(json.dumps({"event": "stop", "accepted": adm.accepted}))

    api = FastAPI(
        title="agentrl sandbox service",
        version=__version__,
        lifespan=lifespan,
        description="SandboxFusion-compatible /run_code plus agentrl's /v1/run and /v1/judge.",
    )
    api.state.service = state
    api.state.admission = adm

    @api.get("/health")
    async def health() -> JSONResponse:
        """Liveness and load: 200 while serving, 503 while draining."""
        body = {
            "status": "draining" if state["draining"] else "ok",
            "inflight": adm.inflight,
            "max_inflight": adm.limit,
            "workers": state["pool"].workers if state["pool"] is not None else None,
            "version": __version__,
        }
        return JSONResponse(body, status_code=503 if state["draining"] else 200)

    @api.get("/v1/ping")
    async def ping() -> str:
        """SandboxFusion's liveness probe."""
        return "pong"

    @api.get("/v1/languages")
    async def languages() -> JSONResponse:
        """Each language: its SandboxFusion names, whether this host can run it (and if not,
        what is missing)."""
        out = {}
        for name, lang in langs.LANGUAGES.items():
            try:
                langs.resolve_language(name)
                entry: dict[str, Any] = {"available": True}
            except langs.ToolchainMissing as e:
                entry = {"available": False, "missing": list(e.missing), "detail": str(e)}
            entry["aliases"] = list(getattr(lang, "aliases", ()))
            out[name] = entry
        return JSONResponse(out)

    async def run_code_core(req: RunCodeRequest) -> Response:
        try:
            lang = langs.resolve_language(req.language)
        except (langs.UnknownLanguage, langs.ToolchainMissing) as e:
            return _unprocessable(str(e))
        try:
            compile_limits, run_limits = request_limits(req, cfg, lang.compile_limits, limits_cache)
            files = request_files(req)
            for k in files:
                check_rel_path("files", k)
            for k in req.fetch_files:
                check_rel_path("fetch_files", k)
        except BadRequest as e:
            return _unprocessable(str(e))
        if not adm.try_acquire(1):
            return _busy(cfg, adm)
        try:
            cr = await langs.arun_code(
                state["pool"],
                req.language,
                req.code,
                stdin=(req.stdin or "").encode(),
                files=files,
                fetch_files=req.fetch_files,
                compile_limits=compile_limits,
                run_limits=run_limits,
            )
            body = response_of(cr.compile, cr.run, cr.files, cfg.pod_name)
        except (ValueError, TypeError, langs.ToolchainMissing) as e:  # a bad path, ...
            return _unprocessable(str(e))
        except (JobFailed, JobExpired, PoolClosed, AgentRLError) as e:
            body = response_of(None, None, {}, cfg.pod_name)
            body.update(status="SandboxError", message=f"sandbox error: {e}")
        finally:
            adm.release(1)
        return JSONResponse(body)

    @api.post(
        "/run_code",
        response_model=RunCodeResponse,
        responses={422: {"description": "unknown language, missing toolchain, bad limits"}},
    )
    async def run_code(req: RunCodeRequest) -> Response:
        """SandboxFusion's ``/run_code``: compile (where the language has a compile step) and
        run ``code`` once."""
        return await run_code_core(req)

    async def run_code_fast(scope: Any, body: bytes, send: Any) -> None:
        """``POST /run_code`` without FastAPI's per-request machinery (the hot path of RL
        reward calls): the same model, the same handler, FastAPI's 422 shape."""
        try:
            req = RunCodeRequest.model_validate_json(body)
        except ValidationError as e:
            detail = [
                {"type": x["type"], "loc": ["body", *x["loc"]], "msg": x["msg"]}
                for x in e.errors(include_url=False)
            ]
            resp: Response = JSONResponse({"detail": detail}, status_code=422)
        else:
            resp = await run_code_core(req)
        await resp(scope, _no_receive, send)

    @api.post(
        "/v1/run",
        responses={
            200: {
                "description": "NDJSON, one {index, result} line per job as it finishes "
                "(stream=false: one JSON object {results: [...]} in order)",
                "content": {"application/x-ndjson": {}},
            }
        },
    )
    async def run(req: RunRequest, request: Request) -> Response:
        """Runs a batch of argv or Python jobs; each result is a full verdict."""
        n = len(req.jobs)
        if n > cfg.max_batch or n > adm.limit:
            return _unprocessable(f"at most {min(cfg.max_batch, adm.limit)} jobs per request")
        try:
            prepared = []
            for i, job in enumerate(req.jobs):
                try:
                    prepared.append(_job_args(job, cfg))
                except (BadRequest, ValueError) as e:
                    raise BadRequest(f"job {i}: {e}") from None
        except BadRequest as e:
            return _unprocessable(str(e))
        if not adm.try_acquire(n):
            return _busy(cfg, adm)
        pool_ = state["pool"]
        futs: list[asyncio.Future] = []
        try:
            for i, (python, main, kw) in enumerate(prepared):
                try:
                    f = pool_.run_python(main, **kw) if python else pool_.run(main, **kw)
                except (ValueError, TypeError) as e:
                    raise BadRequest(f"job {i}: {e}") from None
                f.add_done_callback(lambda _f: adm.release(1))
                futs.append(f)
        except BadRequest as e:
            for f in futs:
                f.cancel()
            adm.release(n - len(futs))
            return _unprocessable(str(e))
        except BaseException:
            for f in futs:
                f.cancel()
            adm.release(n - len(futs))
            raise
        if not req.stream:
            if not await _wait_all(futs, request):
                return Response(status_code=499)  # nobody is left to read it
            return JSONResponse(
                {"results": [_outcome_json(i, f)["result"] for i, f in enumerate(futs)]}
            )
        return StreamingResponse(
            _as_finished(futs, _outcome_json), media_type="application/x-ndjson"
        )

    @api.post(
        "/v1/judge",
        responses={
            200: {
                "description": "NDJSON, one {index, judgement} (or {index, error}) line per "
                "item as it is judged",
                "content": {"application/x-ndjson": {}},
            }
        },
    )
    async def judge(req: JudgeRequest, request: Request) -> Response:
        """Judges completions of tasks: partial credit (``fraction``) and error classes."""
        from agentrl.evaluation import Evaluator
        from agentrl.evaluation.tasks import IOTask, task_from_dict

        if len(req.items) > cfg.max_batch:
            return _unprocessable(f"at most {cfg.max_batch} items per request")
        if req.timeout is not None and req.timeout > cfg.max_limits.wall_time_s:
            return _unprocessable(f"timeout must be at most {cfg.max_limits.wall_time_s:g} s")
        tasks = []
        for i, item in enumerate(req.items):
            try:
                tasks.append(task_from_dict(item.task, where=f"items[{i}].task"))
            except Exception as e:  # the record's own mistake, whatever the loader raised
                return _unprocessable(f"items[{i}].task: {type(e).__name__}: {e}")
        runs = sum(len(t.cases) if isinstance(t, IOTask) else 1 for t in tasks)
        if runs > adm.limit:
            return _unprocessable(f"the request needs {runs} runs, more than {adm.limit}")
        if not adm.try_acquire(runs):
            return _busy(cfg, adm)
        if state["evaluator"] is None:
            state["evaluator"] = Evaluator(state["pool"])
        ev = state["evaluator"]
        futs = []
        for t, item in zip(tasks, req.items, strict=True):
            f = asyncio.ensure_future(ev.ajudge(t, item.completion, timeout=req.timeout))
            k = len(t.cases) if isinstance(t, IOTask) else 1
            f.add_done_callback(lambda _f, k=k: adm.release(k))
            futs.append(f)

        def record(i: int, f: asyncio.Future) -> dict[str, Any]:
            if f.cancelled():
                return {"index": i, "error": "cancelled"}
            e = f.exception()
            if e is not None:
                return {"index": i, "error": f"{type(e).__name__}: {e}"}
            return {"index": i, "judgement": f.result().to_dict()}

        if not req.stream:
            if not await _wait_all(futs, request):
                return Response(status_code=499)
            return JSONResponse({"results": [record(i, f) for i, f in enumerate(futs)]})
        return StreamingResponse(_as_finished(futs, record), media_type="application/x-ndjson")

    try:  # Prometheus metrics where agentrl.observability is installed
        from agentrl.observability.metrics import asgi_app
    except ImportError:
        pass
    else:
        api.mount("/metrics", asgi_app())

    @api.exception_handler(HTTPException)
    async def _http_error(_req: Any, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    gate = Gate(
        api,
        cfg.token,
        cfg.max_body_bytes,
        fast={"/run_code": run_code_fast},
        trusted_networks=cfg.trusted_networks,
    )
    gate.fastapi = api  # type: ignore[attr-defined]
    try:  # HTTP requests counted by route and status, the gate's refusals included
        from agentrl.observability.metrics import MetricsMiddleware
    except ImportError:
        return gate
    outer = MetricsMiddleware(gate)
    outer.fastapi = api  # type: ignore[attr-defined]
    return outer


def _observe(pool: SandboxPool, cfg: ServiceConfig) -> Any:
    """Exposes the pool's metrics (where ``prometheus_client`` is installed) and records its
    jobs' traces in ``cfg.traces``; returns the tracer to close after the pool, or None."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        metrics = False
    else:
        metrics = True
    if not metrics and cfg.traces is None:
        return None
    from agentrl.observability import observe_pool

    return observe_pool(
        pool, name="sandbox-server", metrics=metrics, traces=cfg.traces, sink=cfg.trace_sink
    )
