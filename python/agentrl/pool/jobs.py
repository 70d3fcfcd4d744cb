"""Job outcomes and futures of the scheduler pools (:class:`agentrl.SandboxPool`).

Every job ends with exactly one :class:`JobOutcome`, whose :class:`JobStatus` is
``completed``, ``cancelled``, ``expired`` or ``failed``. A future of a job resolves to the
result, is cancelled, or raises :class:`JobExpired` / :class:`JobFailed`.
"""

from __future__ import annotations

import concurrent.futures
import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from agentrl import _core
from agentrl.errors import AgentRLError
from agentrl.sandbox.args import check_int
from agentrl.sandbox.backend import RunRequest

__all__ = [
    "JobExpired",
    "JobFailed",
    "JobOutcome",
    "JobStatus",
    "PoolClosed",
    "PoolFull",
    "PoolFuture",
    "PoolJob",
]

PoolFull = _core.PoolFull
PoolClosed = _core.PoolClosed


class JobExpired(AgentRLError):
    """The job's deadline passed before it could start; it never ran."""


class JobFailed(AgentRLError):
    """The job could not be run: the sandbox kept failing until the retries ran out, or the
    executor crashed. ``reason`` says which. A program's own failure is never this: it is a
    completed job whose :class:`ExecResult` says how the program ended."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class JobStatus(str, enum.Enum):
    """The terminal state of a job; every job reaches exactly one."""

    COMPLETED = "completed"
    """It ran; ``result`` holds its result (whatever the program did)."""
    CANCELLED = "cancelled"
    """Cancelled before it started, or while it ran (its box was killed)."""
    EXPIRED = "expired"
    """Its deadline passed before it started."""
    FAILED = "failed"
    """Infrastructure failure after every retry, or an executor crash; see ``reason``."""


class JobOutcome(NamedTuple):
    """One job's terminal result, as :meth:`SandboxPool.collect` returns it."""

    job_id: int
    status: JobStatus
    result: Any = None
    """The :class:`ExecResult` of a completed job."""
    reason: str | None = None
    """Why a job failed."""

    @property
    def ok(self) -> bool:
        """The job completed (the program itself may still have failed)."""
        return self.status is JobStatus.COMPLETED

    def unwrap(self) -> Any:
        """The result, or the exception a future of this job would raise."""
        if self.status is JobStatus.COMPLETED:
            return self.result
        raise _exception(self.status, self.reason)


def _exception(status: JobStatus, reason: str | None) -> BaseException:
    if status is JobStatus.CANCELLED:
        return concurrent.futures.CancelledError()
    if status is JobStatus.EXPIRED:
        return JobExpired("the job's deadline passed before it started")
    return JobFailed(reason or "failed")


class PoolFuture(concurrent.futures.Future):
    """A :class:`concurrent.futures.Future` of one job. :meth:`cancel` cancels the job
    itself: a queued job never starts and a running one has its box killed."""

    def __init__(self, core: Any) -> None:
        super().__init__()
        self._core = core
        self.job_id = 0
        """The pool's id of the job."""

    def cancel(self) -> bool:
        """Cancels the job; false if it has already finished (or is finishing)."""
        if self.done():
            return self.cancelled()
        if not self._core.cancel(self.job_id):
            return self.cancelled()
        return super().cancel()


_OUTCOME = (
    JobOutcome,
    (JobStatus.COMPLETED, JobStatus.CANCELLED, JobStatus.EXPIRED, JobStatus.FAILED),
)
"""What the Rust core builds ``collect`` results as."""


_NO_SCHEDULE = (0, 0, None)


@dataclass(frozen=True, slots=True)
class PoolJob:
    """One sandbox job as it crosses into the Rust scheduler (``_core.Pool.submit_many``),
    where it is read by field name."""

    request: RunRequest
    """The run."""
    group: int = 0
    """The job's group (``cancel_group``)."""
    priority: int = 0
    """Higher runs first."""
    deadline: float | None = None
    """Seconds from now by which the job must have started, or None."""
    tag: Any = None
    """What observers of the pool know of the job (language, trace context); only set when
    the pool has observers, never read by the core."""


def schedule_args(
    group: int = 0,
    priority: int = 0,
    deadline: float | None = None,
    deadline_at: float | None = None,
) -> tuple[int, int, float | None]:
    """Checks the scheduling keywords; the deadline becomes seconds from now."""
    if (
        deadline is None is deadline_at
        and type(group) is int is type(priority)
        and not group | priority
    ):
        return _NO_SCHEDULE
    check_int("group", group, 0, (1 << 64) - 1)
    check_int("priority", priority, -(1 << 31), (1 << 31) - 1)
    if deadline is not None and deadline_at is not None:
        raise TypeError(
            "give deadline (seconds from now) or deadline_at (time.monotonic()), not both"
        )
    rel = None
    for name, v in (("deadline", deadline), ("deadline_at", deadline_at)):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            raise TypeError(f"{name} must be a number of seconds, got {v!r}")
        rel = float(v) if name == "deadline" else float(v) - time.monotonic()
    return group, priority, rel


SCHED_KEYS = frozenset({"group", "priority", "deadline", "deadline_at"})


def split_job_entry(job: Any, common: Mapping[str, Any]) -> tuple[Any, bool, Mapping[str, Any]]:
    """A ``submit_many``/``map`` entry (argv, Python source as a str, or a mapping with one of
    ``argv``/``source``) as ``(argv or source, is_python, keywords)``."""
    if isinstance(job, Mapping):
        kw = {**common, **job}
        if ("argv" in kw) == ("source" in kw):
            raise TypeError("a job mapping needs exactly one of 'argv' and 'source'")
        python = "source" in kw
        main = kw.pop("source") if python else kw.pop("argv")
        return main, python, kw
    return job, isinstance(job, str), common
