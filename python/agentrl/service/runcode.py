"""SandboxFusion's ``/run_code`` on agentrl's pool: the request's limits, the compile+run,
and the verdicts in SandboxFusion's words."""

from __future__ import annotations

from typing import Any

from agentrl.sandbox.limits import MIN_MEMORY_BYTES, Limits
from agentrl.sandbox.result import ExecResult, Status
from agentrl.service.config import ServiceConfig
from agentrl.service.models import RunCodeRequest, b64decode, b64encode

__all__ = ["BadRequest", "command_result", "request_limits", "response_of"]


class BadRequest(ValueError):
    """A request the server refuses with HTTP 422 (the message names the problem)."""


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


def command_result(r: ExecResult) -> dict[str, Any]:
    """SandboxFusion's ``CommandRunResult`` of one run (plus agentrl's fields).

    ``Finished`` with the exit status, or minus the killing signal as SandboxFusion's
    asyncio subprocesses report it (a memory-limit kill is ``-9``); ``TimeLimitExceeded``
    for the wall or CPU limit; ``Error`` only for an infrastructure failure."""
    if r.status is Status.TIMEOUT:
        status, code = "TimeLimitExceeded", None
    elif r.status is Status.SANDBOX_ERROR:
        status, code = "Error", None
    else:
        status = "Finished"
        if r.exit_code is not None:
            code = r.exit_code
        elif r.signal is not None:
            code = -r.signal
        else:  # a kill by a limit that reported no signal
            code = -9
    return {
        "status": status,
        "execution_time": r.wall_time_s,
        "return_code": code,
        "stdout": _text(r.stdout),
        "stderr": _text(r.stderr) if r.error is None else _text(r.stderr) + r.error,
        "agentrl_status": r.status.value,
        "limit": r.limit,
        "stdout_truncated": r.stdout_truncated,
        "stderr_truncated": r.stderr_truncated,
        "cpu_time": r.cpu_time_s,
        "peak_memory_bytes": r.peak_memory_bytes,
    }


def _failure(r: ExecResult) -> tuple[str, str] | None:
    """``(status, message)`` when this run makes the answer not ``Success``."""
    if r.status is Status.SANDBOX_ERROR:
        return "SandboxError", f"sandbox error: {r.error or 'unknown'}"
    if r.status is Status.OK:
        return None
    if r.status is Status.OUTPUT_LIMIT:
        which = "stdout" if r.stdout_truncated else "stderr"
        return "Failed", f"{which} went past the output cap and was truncated"
    if r.status is Status.MEMORY_LIMIT:
        return "Failed", "killed by the memory limit"
    return "Failed", ""


def response_of(
    compile_r: ExecResult | None,
    run_r: ExecResult | None,
    files: dict[str, bytes],
    pod: str | None,
) -> dict[str, Any]:
    """The ``RunCodeResponse`` dict, with SandboxFusion's status rules: ``SandboxError`` for
    an infrastructure failure; ``Failed`` for a time-out, a non-zero exit (or a limit kill);
    ``Success`` otherwise. ``run_result`` is null after a failed compile."""
    status, message = "Success", ""
    for r in (compile_r, run_r):
        if r is None:
            continue
        f = _failure(r)
        if f is not None and (status == "Success" or f[0] == "SandboxError"):
            status, message = f
    return {
        "status": status,
        "message": message,
        "compile_result": None if compile_r is None else command_result(compile_r),
        "run_result": None if run_r is None else command_result(run_r),
        "executor_pod_name": pod,
        "files": {k: b64encode(v) for k, v in files.items()},
    }


def request_limits(
    req: RunCodeRequest,
    cfg: ServiceConfig,
    compile_base: Limits,
    cache: dict[tuple, tuple[Limits, Limits]] | None = None,
) -> tuple[Limits, Limits]:
    """The compile and run :class:`Limits` of a request (422 when out of the server's bounds).

    ``memory_limit_MB`` bounds the program's run; the compile keeps the language's own
    compile memory (``compile_base``: a compiler needs more than most programs) unless the
    request gives more. Both get the request's timeouts as wall and CPU time. ``cache``: a
    dict (one per server) of the answers so far (most requests repeat a few settings)."""
    key = (req.compile_timeout, req.run_timeout, req.memory_limit_MB, compile_base)
    if cache is not None:
        hit = cache.get(key)
        if hit is not None:
            return hit
    top = cfg.max_limits
    for name, v in (("compile_timeout", req.compile_timeout), ("run_timeout", req.run_timeout)):
        if v > top.wall_time_s:
            raise BadRequest(f"{name} must be at most {top.wall_time_s:g} s, got {v:g}")
    if req.memory_limit_MB == -1:
        mem = cfg.default_memory_mb << 20
    else:
        mem = req.memory_limit_MB << 20
        if mem < MIN_MEMORY_BYTES:
            raise BadRequest(
                f"memory_limit_MB must be -1 or at least {MIN_MEMORY_BYTES >> 20}, "
                f"got {req.memory_limit_MB}"
            )
        if mem > top.memory_bytes:
            raise BadRequest(
                f"memory_limit_MB must be at most {top.memory_bytes >> 20}, "
                f"got {req.memory_limit_MB}"
            )
    base = cfg.default_limits.replace(memory_bytes=mem, max_output_bytes=cfg.max_output_bytes)
    compile_limits = compile_base.replace(
        wall_time_s=req.compile_timeout,
        cpu_time_s=req.compile_timeout,
        memory_bytes=max(compile_base.memory_bytes, mem),
    )
    run_limits = base.replace(wall_time_s=req.run_timeout, cpu_time_s=req.run_timeout)
    if cache is not None:
        if len(cache) > 4096:
            cache.clear()
        cache[key] = (compile_limits, run_limits)
    return compile_limits, run_limits


def request_files(req: RunCodeRequest) -> dict[str, bytes]:
    """The request's files, decoded (a ``None`` content is skipped, as in SandboxFusion)."""
    out: dict[str, bytes] = {}
    for path, content in req.files.items():
        if content is None:
            continue
        try:
            out[path] = b64decode(content, f"files[{path!r}]")
        except ValueError as e:
            raise BadRequest(str(e)) from None
    return out
