"""The sandbox pool: jobs on the Rust scheduler's worker threads, off the GIL.

* ``pool``: :class:`SandboxPool`, runs and Python programs as jobs on one :class:`~agentrl.Sandbox`.
* ``jobs``: what a job hands back (:class:`PoolFuture`, :class:`JobOutcome`,
  :class:`JobStatus`) and how it fails (:class:`JobFailed`, :class:`JobExpired`,
  :class:`PoolFull`, :class:`PoolClosed`).
* ``executor``: :class:`Executor`, the protocol every job runner satisfies (this pool,
  :class:`agentrl.distributed.RayPool`, the sandbox service's client).
* ``engine``: the job table every pool shares: submission, the completion reader that settles
  futures and asyncio awaitables, cancellation, statistics.
"""

from agentrl.pool.executor import Executor
from agentrl.pool.jobs import (
    JobExpired,
    JobFailed,
    JobOutcome,
    JobStatus,
    PoolClosed,
    PoolFull,
    PoolFuture,
)
from agentrl.pool.pool import SandboxPool

__all__ = [
    "Executor",
    "JobExpired",
    "JobFailed",
    "JobOutcome",
    "JobStatus",
    "PoolClosed",
    "PoolFull",
    "PoolFuture",
    "SandboxPool",
]
