"""Request and response models of the sandbox service (pydantic)."""

from __future__ import annotations

import base64
import binascii
import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentrl.sandbox.result import ExecResult

__all__ = [
    "CommandRunResult",
    "CommandRunStatus",
    "ExecResultModel",
    "JudgeItem",
    "JudgeRequest",
    "LimitsModel",
    "RunCodeRequest",
    "RunCodeResponse",
    "RunJob",
    "RunRequest",
    "RunStatus",
    "b64decode",
    "b64encode",
]


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode(text: str, where: str) -> bytes:
    """Strict base64, a ``ValueError`` naming ``where`` otherwise."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: not valid base64") from None


# --- SandboxFusion's /run_code ---------------------------------------------------------------


class RunCodeRequest(BaseModel):
    """SandboxFusion's ``RunCodeRequest``, field for field (unknown fields are ignored, as
    there: ROLL sends ``expected_stdout``)."""

    model_config = ConfigDict(extra="ignore")

    compile_timeout: float = Field(10, gt=0, description="compile time limit, seconds")
    run_timeout: float = Field(10, gt=0, description="run time limit, seconds")
    memory_limit_MB: int = Field(
        -1, ge=-1, description="memory limit of compile and run, MiB; -1: the server's default"
    )
    code: str = Field(..., description="the program's source")
    stdin: str | None = Field(None, description="text fed to the program's stdin")
    language: str = Field(..., examples=["python"], description="SandboxFusion language name")
    files: dict[str, str | None] = Field(
        {}, description="path (relative to the work dir) -> base64 content"
    )
    fetch_files: list[str] = Field([], description="paths to hand back after the run")


class RunStatus(str, enum.Enum):
    Success = "Success"
    Failed = "Failed"
    SandboxError = "SandboxError"


class CommandRunStatus(str, enum.Enum):
    Finished = "Finished"
    Error = "Error"
    TimeLimitExceeded = "TimeLimitExceeded"


class CommandRunResult(BaseModel):
    """SandboxFusion's ``CommandRunResult`` plus agentrl's own fields (which its clients
    ignore): ``agentrl_status``, ``limit``, ``stdout_truncated``/``stderr_truncated``,
    ``cpu_time``, ``peak_memory_bytes``."""

    status: CommandRunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None
    agentrl_status: str | None = None
    limit: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    cpu_time: float | None = None
    peak_memory_bytes: int | None = None


class RunCodeResponse(BaseModel):
    status: RunStatus
    message: str
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = {}


# --- agentrl's own API -----------------------------------------------------------------------


class LimitsModel(BaseModel):
    """Any :class:`agentrl.Limits` fields; the rest are the server's defaults."""

    model_config = ConfigDict(extra="forbid")

    wall_time_s: float | None = Field(None, gt=0)
    cpu_time_s: float | None = Field(None, gt=0)
    memory_bytes: int | None = Field(None, gt=0)
    max_pids: int | None = Field(None, gt=0)
    max_output_bytes: int | None = Field(None, gt=0)
    max_file_bytes: int | None = Field(None, gt=0)
    max_open_files: int | None = Field(None, gt=0)
    tmpfs_bytes: int | None = Field(None, gt=0)


class RunJob(BaseModel):
    """One run: ``argv`` or Python ``source`` (exactly one)."""

    model_config = ConfigDict(extra="forbid")

    argv: list[str] | None = Field(None, min_length=1, description="command and arguments")
    source: str | None = Field(None, description="Python source, run by the box's interpreter")
    stdin: str | None = Field(None, description="stdin as text")
    stdin_b64: str | None = Field(None, description="stdin as base64 (instead of stdin)")
    files: dict[str, str] = Field({}, description="path -> base64 content, put in the work dir")
    collect: list[str] = Field([], description="work-dir paths to hand back")
    limits: LimitsModel | None = None
    env: dict[str, str] | None = None
    cwd: str | None = Field(None, description="working directory (argv jobs only)")


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jobs: list[RunJob] = Field(..., min_length=1)
    stream: bool = Field(
        True, description="NDJSON lines as jobs finish (else one JSON object, in order)"
    )


class ExecResultModel(BaseModel):
    """An :class:`agentrl.ExecResult`; byte fields as base64."""

    status: str
    exit_code: int | None = None
    signal: int | None = None
    stdout_b64: str = ""
    stderr_b64: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_time_s: float = 0.0
    cpu_time_s: float = 0.0
    peak_memory_bytes: int | None = None
    peak_memory_exact: bool = False
    limit: str | None = None
    denied_syscalls: list[str] = []
    files_b64: dict[str, str] = {}
    truncated_files: list[str] = []
    error: str | None = None

    @classmethod
    def of(cls, r: ExecResult) -> dict[str, Any]:
        """The JSON-ready dict of ``r`` (no model instance: this is the hot path)."""
        return {
            "status": r.status.value,
            "exit_code": r.exit_code,
            "signal": r.signal,
            "stdout_b64": b64encode(r.stdout),
            "stderr_b64": b64encode(r.stderr),
            "stdout_truncated": r.stdout_truncated,
            "stderr_truncated": r.stderr_truncated,
            "wall_time_s": r.wall_time_s,
            "cpu_time_s": r.cpu_time_s,
            "peak_memory_bytes": r.peak_memory_bytes,
            "peak_memory_exact": r.peak_memory_exact,
            "limit": r.limit,
            "denied_syscalls": list(r.denied_syscalls),
            "files_b64": {k: b64encode(v) for k, v in r.files.items()},
            "truncated_files": list(r.truncated_files),
            "error": r.error,
        }


def exec_result_from_json(d: dict[str, Any]) -> ExecResult:
    """The :class:`ExecResult` of an :class:`ExecResultModel` dict (the client's side)."""
    from agentrl.sandbox.result import Status

    return ExecResult(
        status=Status(d["status"]),
        exit_code=d.get("exit_code"),
        signal=d.get("signal"),
        stdout=base64.b64decode(d.get("stdout_b64", "")),
        stderr=base64.b64decode(d.get("stderr_b64", "")),
        stdout_truncated=bool(d.get("stdout_truncated")),
        stderr_truncated=bool(d.get("stderr_truncated")),
        wall_time_s=float(d.get("wall_time_s", 0.0)),
        cpu_time_s=float(d.get("cpu_time_s", 0.0)),
        peak_memory_bytes=d.get("peak_memory_bytes"),
        peak_memory_exact=bool(d.get("peak_memory_exact")),
        limit=d.get("limit"),
        denied_syscalls=tuple(d.get("denied_syscalls", ())),
        files={k: base64.b64decode(v) for k, v in (d.get("files_b64") or {}).items()},
        truncated_files=tuple(d.get("truncated_files", ())),
        error=d.get("error"),
    )


class JudgeItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: dict[str, Any] = Field(
        ...,
        description="a task record: human-eval (prompt, test, entry_point), MBPP (text, "
        "code, test_list) or stdin/stdout (cases or inputs/outputs, compare, float_tol)",
    )
    completion: str


class JudgeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[JudgeItem] = Field(..., min_length=1)
    timeout: float | None = Field(None, gt=0, description="seconds per test run")
    stream: bool = True
