"""The sandbox pool: jobs on the Rust scheduler's worker threads, off the GIL.

* ``pool``: :class:`SandboxPool`, runs and Python programs as jobs on one :class:`~agentrl.Sandbox`.
* ``jobs``: what a job hands back (:class:`PoolFuture`, :class:`JobOutcome`,
  :class:`JobStatus`) and how it fails (:class:`JobFailed`, :class:`JobExpired`,
  :class:`PoolFull`, :class:`PoolClosed`).
* ``engine``: the job table every pool shares: submission, the completion reader that settles
  futures and asyncio awaitables, cancellation, statistics.
"""

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
    "JobExpired",
    "JobFailed",
    "JobOutcome",
    "JobStatus",
    "PoolClosed",
    "PoolFull",
    "PoolFuture",
    "SandboxPool",
]
