"""The sandbox actor: one :class:`agentrl.SandboxPool` on one node, driven in batches.

The driver (:class:`agentrl.distributed.RayPool`) sends jobs with :meth:`SandboxActor.submit`
(one Ray call per batch) and keeps one long :meth:`SandboxActor.poll` outstanding per actor,
which returns every outcome finished since the last one: results stream back in bursts, and
Ray's per-call round trip is paid per batch, not per job. The actor is threaded (Ray runs
its methods on a few threads) and uses its pool's batch API: a batch crosses to Rust in one
``submit_many`` and a poll drains every finished job in one ``collect``, with no per-job
future or callback; the jobs run on the Rust worker threads.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from agentrl.pool.jobs import JobStatus

__all__ = ["INFLIGHT_PER_WORKER", "SandboxActor", "WireJob", "inflight_for"]

WireJob = tuple[int, bool, Any, dict[str, Any]]
"""One job as it travels: ``(job id, python?, argv or source, keywords)``."""

WireOutcome = tuple[int, str, Any]
"""One outcome as it travels back: ``(job id, status, ExecResult or failure reason)``;
status is a :class:`agentrl.JobStatus` value."""

INFLIGHT_PER_WORKER = 32
"""Default most jobs an actor holds, per worker of its pool (``max_inflight_per_actor``)."""


def inflight_for(cap: int | None, workers: int) -> int:
    """Most jobs an actor whose pool has ``workers`` workers holds at once; ``cap`` is the
    RayPool's ``max_inflight_per_actor`` (``None``: :data:`INFLIGHT_PER_WORKER` per worker).
    The driver bounds what it sends by it, the actor sizes its pool's capacity by it."""
    return cap or INFLIGHT_PER_WORKER * workers


class SandboxActor:
    """Owns a :class:`SandboxPool` on its node (see the module's docstring)."""

    def __init__(
        self, pool_args: dict[str, Any], max_inflight: int | None = None, batch_size: int = 0
    ) -> None:
        from agentrl.pool.pool import SandboxPool, default_workers

        args = dict(pool_args)
        if "capacity" not in args:
            # Sized on this node: without `workers`, its pool has two per core of this node,
            # which the driver (often on a smaller head node) cannot know.
            inflight = inflight_for(max_inflight, args.get("workers") or default_workers())
            args["capacity"] = 2 * inflight + batch_size + 64
        self._pool = SandboxPool(**args)
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # jobs submitted (wakes an idle poll)
        self._jid: dict[int, int] = {}  # pool job id -> driver job id, for jobs held
        self._pid: dict[int, int] = {}  # driver job id -> pool job id
        self._early: list[WireOutcome] = []  # refused at submission, for the next poll
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

    def submit(self, jobs: list[WireJob]) -> int:
        """Starts ``jobs`` on the pool in one crossing to Rust; returns how many. A job the
        pool refuses (the driver checked it; a node-specific refusal) fails alone."""
        entries = [_entry(python, main, kw) for _, python, main, kw in jobs]
        with self._lock:
            try:
                self._register(jobs, self._pool.submit_many(entries))
            except (ValueError, TypeError):  # find the bad ones: each job alone
                for job, entry in zip(jobs, entries, strict=True):
                    try:
                        self._register([job], self._pool.submit_many([entry]))
                    except Exception as e:
                        self._early.append((job[0], "failed", f"{type(e).__name__}: {e}"))
            except Exception as e:  # the pool is closed or full: the batch fails
                why = f"{type(e).__name__}: {e}"
                self._early += [(jid, "failed", why) for jid, *_ in jobs]
            self._submitted += len(jobs)
            self._arrived.notify_all()
        return len(jobs)

    def _register(self, jobs: list[WireJob], ids: list[int]) -> None:
        for (jid, *_), pid in zip(jobs, ids, strict=True):
            self._jid[pid] = jid
            self._pid[jid] = pid

    def _take(self, wait_s: float) -> list[WireOutcome]:
        """What finished, waiting up to ``wait_s`` for the first (none held: for a submit)."""
        with self._lock:
            if not self._jid and not self._early:
                self._arrived.wait(wait_s)
            out, self._early = self._early, []
            if not self._jid:
                return out
        raw = self._pool.collect(timeout=0.0 if out else wait_s)
        with self._lock:  # submit registers under this lock: every id here is known
            for o in raw:
                jid = self._jid.pop(o.job_id, None)
                if jid is None:  # a job of a batch that failed as a whole (already answered)
                    continue
                del self._pid[jid]
                if o.status is JobStatus.COMPLETED:
                    out.append((jid, "completed", o.result))
                elif o.status is JobStatus.FAILED:
                    out.append((jid, "failed", o.reason))
                else:
                    out.append((jid, o.status.value, None))
        return out

    def poll(self, wait_s: float, linger_s: float = 0.0) -> list[WireOutcome]:
        """The outcomes finished since the last call; waits up to ``wait_s`` for one, then
        up to ``linger_s`` more, until half of the jobs it holds have finished, so that one
        reply carries a burst (a Ray call costs about as much CPU as a warm run: replies of
        one outcome each would double the cost of a job)."""
        out = self._take(wait_s)
        if not out:
            return out
        target = (len(self._jid) + len(out)) // 2
        end = time.monotonic() + linger_s
        while self._jid and len(out) < target:
            left = end - time.monotonic()
            if left <= 0:
                break
            out += self._take(left)
        return out

    def cancel_jobs(self, job_ids: list[int]) -> int:
        """Cancels these jobs (queued ones never start, running ones are killed)."""
        with self._lock:
            ids = [self._pid[j] for j in job_ids if j in self._pid]
        return sum(self._pool.cancel_job(i) for i in ids)

    def cancel_group(self, group: int) -> int:
        """Cancels every job of ``group`` on this node."""
        return self._pool.cancel(group)

    def stats(self) -> dict[str, Any]:
        """The pool's stats, with the jobs this actor accepted."""
        s = self._pool.stats()
        s["accepted"] = self._submitted
        s["outstanding"] = len(self._jid)
        return s

    def shutdown(self) -> None:
        """Closes the pool, cancelling what is left."""
        self._pool.close(drain=False)


def _entry(python: bool, main: Any, kw: dict[str, Any]) -> dict[str, Any]:
    """A :meth:`SandboxPool.submit_many` entry of a wire job."""
    return {"source" if python else "argv": main, **kw}
