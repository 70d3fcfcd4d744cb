"""The sandbox actor: one :class:`agentrl.SandboxPool` on one node, driven in batches.

The driver (:class:`agentrl.distributed.RayPool`) sends jobs with :meth:`SandboxActor.submit`
(one Ray call per batch) and keeps one long :meth:`SandboxActor.poll` outstanding per actor,
which returns every outcome finished since the last one: results stream back in bursts, and
Ray's per-call round trip is paid per batch, not per job. The actor is asynchronous (its
methods run on one event loop) and its pool's jobs run on the Rust worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import Any

__all__ = ["SandboxActor", "WireJob"]

WireJob = tuple[int, bool, Any, dict[str, Any]]
"""One job as it travels: ``(job id, python?, argv or source, keywords)``."""

WireOutcome = tuple[int, str, Any]
"""One outcome as it travels back: ``(job id, status, ExecResult or failure reason)``;
status is a :class:`agentrl.JobStatus` value."""


class SandboxActor:
    """Owns a :class:`SandboxPool` on its node (see the module's docstring)."""

    def __init__(self, pool_args: dict[str, Any]) -> None:
        from agentrl.pool import SandboxPool

        self._pool = SandboxPool(**pool_args)
        self._tasks: dict[int, asyncio.Future] = {}
        self._done: list[WireOutcome] = []
        self._event: asyncio.Event | None = None
        self._submitted = 0

    def info(self) -> dict[str, Any]:
        """Where the actor runs: node id, host, pid, workers."""
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "workers": self._pool.workers,
            "cpus": os.cpu_count(),
        }

    def _wake(self) -> asyncio.Event:
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    async def submit(self, jobs: list[WireJob]) -> int:
        """Starts ``jobs`` on the pool (they cross to Rust in one batch); returns how many."""
        from agentrl.pool import JobExpired, JobFailed

        pool, done, tasks, event = self._pool, self._done, self._tasks, self._wake()

        def finished(jid: int, fut: asyncio.Future) -> None:
            tasks.pop(jid, None)
            if fut.cancelled():
                done.append((jid, "cancelled", None))
            else:
                exc = fut.exception()
                if exc is None:
                    done.append((jid, "completed", fut.result()))
                elif isinstance(exc, JobExpired):
                    done.append((jid, "expired", str(exc)))
                elif isinstance(exc, JobFailed):
                    done.append((jid, "failed", exc.reason))
                elif isinstance(exc, asyncio.CancelledError):
                    done.append((jid, "cancelled", None))
                else:
                    done.append((jid, "failed", f"{type(exc).__name__}: {exc}"))
            event.set()

        for jid, python, main, kw in jobs:
            try:
                fut = pool.run_python(main, **kw) if python else pool.run(main, **kw)
            except Exception as e:  # the driver checked it; a node-specific refusal
                done.append((jid, "failed", f"{type(e).__name__}: {e}"))
                event.set()
                continue
            tasks[jid] = fut
            fut.add_done_callback(lambda f, jid=jid: finished(jid, f))
        self._submitted += len(jobs)
        return len(jobs)

    async def poll(self, wait_s: float, linger_s: float = 0.0) -> list[WireOutcome]:
        """The outcomes finished since the last call; waits up to ``wait_s`` for one, then
        up to ``linger_s`` more, until half of the jobs it holds have finished, so that one
        reply carries a burst
        (a Ray call costs about as much CPU as a warm run: replies of one outcome each would
        double the cost of a job)."""
        event = self._wake()
        if not self._done:
            event.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), wait_s)
        # Linger for a burst: until half of what the actor holds has finished, or linger_s.
        target = (len(self._tasks) + len(self._done)) // 2
        end = asyncio.get_running_loop().time() + linger_s
        while self._done and self._tasks and len(self._done) < target:
            left = end - asyncio.get_running_loop().time()
            if left <= 0:
                break
            event.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), left)
        out = list(self._done)
        self._done.clear()  # in place: the jobs' callbacks hold this list
        return out

    async def cancel_jobs(self, job_ids: list[int]) -> int:
        """Cancels these jobs (queued ones never start, running ones are killed)."""
        n = 0
        for jid in job_ids:
            fut = self._tasks.get(jid)
            if fut is not None and fut.cancel():
                n += 1
        return n

    async def cancel_group(self, group: int) -> int:
        """Cancels every job of ``group`` on this node."""
        return self._pool.cancel(group)

    async def stats(self) -> dict[str, Any]:
        """The pool's stats, with the jobs this actor accepted."""
        s = self._pool.stats()
        s["accepted"] = self._submitted
        s["outstanding"] = len(self._tasks)
        return s

    async def shutdown(self) -> None:
        """Closes the pool, cancelling what is left."""
        await self._pool.aclose(drain=False)
