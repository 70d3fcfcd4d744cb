"""A pool of sandbox jobs on the Rust scheduler, for threads and for asyncio.

See :class:`SandboxPool`; the outcome types and the routing machinery are in
``agentrl.pool.engine``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentrl import _core
from agentrl.pool.engine import _JobPool
from agentrl.pool.jobs import (
    _OUTCOME,
    SCHED_KEYS,
    JobExpired,
    JobFailed,
    JobOutcome,
    JobStatus,
    PoolClosed,
    PoolFull,
    PoolFuture,
    PoolJob,
    schedule_args,
    split_job_entry,
)
from agentrl.sandbox.args import (
    check_int,
    check_pass_fds,
    env_pairs,
    file_list,
    python_argv,
    python_files,
    run_args,
)
from agentrl.sandbox.backend import RunRequest
from agentrl.sandbox.box import Sandbox
from agentrl.sandbox.layout import relocate_argv0
from agentrl.sandbox.limits import Limits
from agentrl.sandbox.result import ExecResult

if TYPE_CHECKING:  # asyncio is imported where a coroutine needs it (a cold start skips it)
    import asyncio

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

_RUN_KEYS = frozenset({"stdin", "files", "collect", "limits", "cwd", "env", "pass_fds"})


def default_workers() -> int:
    """A pool's workers when none are given: two per core of this machine."""
    return 2 * (os.cpu_count() or 1)


class SandboxPool(_JobPool):
    """Runs many sandbox jobs at once on the Rust scheduler's worker threads.

    * ``workers``: worker threads, i.e. boxes running at once. ``None``: two per core. A run
      is latency-bound (much of it is the kernel setting up and tearing down namespaces,
      mounts and cgroups, and waiting on the box), so one worker per core leaves the CPUs
      partly idle: on 2 cores, 4 workers ran 20-50% more jobs per second than 2, and 8 only a
      little more than 4 (``benches/bench_pool.py --only workers``; ``benches/README.md``).
    * ``limits``: default :class:`Limits` of each job (default: the sandbox's).
    * ``capacity``: most jobs in the pool at once, counting queued, running and finished jobs
      whose outcome has not been handed over (a resolved future, or :meth:`collect`).
    * ``retries``: extra attempts of a job whose run ends in ``sandbox_error`` (an
      infrastructure failure); a program's own failure is never retried.
    * ``backpressure``: when full, ``"block"`` waits for room (up to ``block_timeout`` seconds,
      forever if None; ``await`` waits without blocking the loop), ``"error"`` raises
      :class:`PoolFull` at once.
    * ``sandbox``: a :class:`Sandbox` to run on (not closed by the pool), or a mapping of
      :class:`Sandbox` keyword arguments for one the pool creates and closes.
    * ``tracer``: an :class:`agentrl.observability.traces.Tracer` that records every job
      (added with :meth:`add_observer`; metrics use
      :func:`agentrl.observability.metrics.instrument`).

    Each job ends with exactly one outcome: ``completed`` (its :class:`ExecResult`),
    ``cancelled``, ``expired`` (its deadline passed before it started) or ``failed``. Job
    keywords are those of :meth:`Sandbox.run` / :meth:`Sandbox.run_python` plus ``group``
    (an int, for :meth:`cancel`), ``priority`` (higher first, FIFO within one; -3..3 have
    their own lanes, others are clamped), and ``deadline`` (seconds from now) or
    ``deadline_at`` (a :func:`time.monotonic` time): a job that has not started by then
    expires; a running job is bounded by its limits. Bad arguments raise at submission.

    Close the pool (or use ``with`` / ``async with``): :meth:`close` stops the workers, the
    dispatcher thread of :meth:`submit` futures and the asyncio readers.
    """

    def __init__(
        self,
        workers: int | None = None,
        limits: Limits | None = None,
        capacity: int = 4096,
        retries: int = 2,
        backpressure: str = "block",
        block_timeout: float | None = None,
        sandbox: Sandbox | Mapping[str, Any] | None = None,
        tracer: Any = None,
    ) -> None:
        if workers is None:
            workers = default_workers()
        check_int("workers", workers, 1, 4096)
        check_int("capacity", capacity, 1, 1 << 30)
        check_int("retries", retries, 0, 1000)
        if backpressure not in ("block", "error"):
            raise ValueError(f'backpressure must be "block" or "error", got {backpressure!r}')
        if block_timeout is not None:
            if isinstance(block_timeout, bool) or not isinstance(block_timeout, (int, float)):
                raise TypeError(
                    f"block_timeout must be a number of seconds or None, got {block_timeout!r}"
                )
            if not block_timeout >= 0:
                raise ValueError(f"block_timeout must be non-negative, got {block_timeout}")
        if limits is not None and not isinstance(limits, Limits):
            raise TypeError(f"limits must be agentrl.Limits, got {type(limits).__name__}")
        if sandbox is not None and not isinstance(sandbox, (Sandbox, Mapping)):
            raise TypeError(
                "sandbox must be a Sandbox or a mapping of Sandbox arguments, "
                f"got {type(sandbox).__name__}"
            )
        if isinstance(sandbox, Sandbox):
            self._sandbox, self._owns_sandbox = sandbox, False
        else:
            kw = dict(sandbox or {})
            kw.setdefault("max_concurrency", workers)
            if limits is not None:
                kw.setdefault("limits", limits)
            self._sandbox, self._owns_sandbox = Sandbox(**kw), True
        self._limits = limits
        # Scheduler slots beyond `capacity`: a job cancelled while queued keeps its slot until
        # a worker skips it, after its outcome has freed the room here.
        try:
            core = _core.Pool(
                self._sandbox._inner,
                workers,
                2 * capacity + 64,
                retries,
                1.0 if backpressure == "block" else None,
                _OUTCOME,
            )
        except BaseException:
            if self._owns_sandbox:
                self._sandbox.close()
            raise
        super().__init__(core, capacity, backpressure, block_timeout)
        if tracer is not None:
            self.add_observer(tracer)

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox the jobs run on."""
        return self._sandbox

    @property
    def workers(self) -> int:
        return self._core.workers

    def _convert(self, value: Any) -> ExecResult:
        r = ExecResult._from_core(value)
        self._latencies.append(r.wall_time_s)
        return r

    def _item(self, argv: Any, python: bool, kw: Mapping[str, Any]) -> PoolJob:
        unknown = set(kw) - _RUN_KEYS - SCHED_KEYS
        if python and "cwd" in kw:
            unknown.add("cwd")
        if not python and "pass_fds" in kw:
            unknown.add("pass_fds")
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        files = kw.get("files")
        env = env_pairs("env", kw.get("env"))
        warm = False
        if python:
            files = python_files(argv, files)
            argv = python_argv(self._sandbox.python)
            fds = check_pass_fds(kw.get("pass_fds", ()), self._sandbox.warm)
            warm = self._sandbox._warm_for(env, bool(fds))
        else:
            fds = check_pass_fds(kw.get("pass_fds", ()), False)
        limits = kw.get("limits") or self._limits
        cwd = kw.get("cwd")
        args, data, names = run_args(argv, kw.get("stdin"), kw.get("collect", ()), limits, cwd)
        relocate_argv0(args, getattr(self._sandbox, "_relocated", ()))
        group, priority, deadline = schedule_args(**{k: kw[k] for k in SCHED_KEYS if k in kw})
        request = RunRequest(
            args, data, file_list(files), names, limits, cwd, env, warm=warm, pass_fds=fds
        )
        if not self._observers:
            return PoolJob(request, group, priority, deadline)
        from agentrl.observability.context import job_tag

        return PoolJob(request, group, priority, deadline, job_tag(python, argv))

    def _job(self, job: Any, common: Mapping[str, Any]) -> PoolJob:
        """A ``submit_many``/``map`` entry: argv, Python source (str) or a mapping."""
        return self._item(*split_job_entry(job, common))

    def submit(self, argv: Sequence[Any], **kw: Any) -> PoolFuture:
        """Submits ``argv`` (see :meth:`Sandbox.run`); a future of its :class:`ExecResult`."""
        return self._submit_futures([self._item(argv, False, kw)])[0]

    def submit_python(self, source: str, **kw: Any) -> PoolFuture:
        """Submits Python ``source`` (see :meth:`Sandbox.run_python`)."""
        return self._submit_futures([self._item(source, True, kw)])[0]

    def run(self, argv: Sequence[Any], **kw: Any) -> asyncio.Future[ExecResult]:
        """``await pool.run(argv, ...)`` from a coroutine: an asyncio future of the result,
        resolved from the loop's reader on the completion fd (default loop or uvloop).
        Cancelling it (or the task awaiting it) cancels the job and kills its box;
        ``cancelled``/``expired``/``failed`` jobs raise ``CancelledError``/:class:`JobExpired`/
        :class:`JobFailed`. Jobs started in one loop iteration cross to Rust in one batch."""
        return self._start_async(self._item(argv, False, kw))

    def run_python(self, source: str, **kw: Any) -> asyncio.Future[ExecResult]:
        """:meth:`run` for Python ``source``."""
        return self._start_async(self._item(source, True, kw))

    def submit_many(self, jobs: Iterable[Any], **common: Any) -> list[int]:
        """Submits a batch in one crossing; outcomes come from :meth:`collect`. Each job is an
        argv sequence, Python source (a str), or a mapping with ``argv`` or ``source`` and
        per-job keywords; ``common`` keywords apply to every job. Returns the job ids. A bad
        job raises (``ValueError``/``TypeError`` naming it as ``job N``) before any is
        submitted."""
        items = []
        for i, j in enumerate(jobs):
            try:
                items.append(self._job(j, common))
            except (ValueError, TypeError) as e:
                raise type(e)(f"job {i}: {e}") from None
        if not items:
            return []
        self._admit(len(items))
        return self._submit(items, None)

    def map(
        self, jobs: Iterable[Any], *, timeout: float | None = None, **common: Any
    ) -> Iterator[ExecResult]:
        """Like :meth:`concurrent.futures.Executor.map`: submits every job at once (entries
        as in :meth:`submit_many`) and yields the results in order; a job that did not
        complete raises there. Closing the iterator early cancels the rest."""
        items = [self._job(j, common) for j in jobs]
        futs: list[PoolFuture] = []
        step = max(1, min(self._capacity, 1024))
        try:
            for i in range(0, len(items), step):
                futs.extend(self._submit_futures(items[i : i + step]))
        except BaseException:
            for f in futs:
                f.cancel()
            raise
        end = None if timeout is None else time.monotonic() + timeout
        return self._results(futs, end)

    @staticmethod
    def _results(futs: list[PoolFuture], end: float | None) -> Iterator[ExecResult]:
        try:
            for f in futs:
                yield f.result(None if end is None else max(0.0, end - time.monotonic()))
        finally:
            for f in futs:
                f.cancel()

    def _after_close(self) -> None:
        if self._owns_sandbox:
            self._sandbox.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<agentrl.SandboxPool {state} workers={self.workers} capacity={self._capacity}>"
