""":class:`RayPool`: sandbox jobs on a Ray cluster, one :class:`SandboxPool` actor per node.

The driver keeps the job table. Jobs leave in batches (one ``submit`` call per batch and
actor) and outcomes come back in bursts through one long ``poll`` call kept outstanding per
actor (see :mod:`agentrl.distributed.actor`), so Ray's round trip is paid per batch, not per
job. The calls are awaited on one event loop in a driver thread.

Faults: when an actor's call fails (the actor or its node died) the jobs it held go back to the
front of the queue and run elsewhere: an infrastructure retry, counted in ``stats()``. A job's
outcome is settled once, under a lock, so each job gets exactly one terminal result even when
a dead actor's work is redone. A program's own failure (timeout, memory limit, nonzero exit)
is a completed job and is never retried. A replacement actor is started for each lost one and
joins when Ray can place it.

This module is long because the driver settles every job exactly once under one lock:
batching, the long polls, re-runs of a lost actor's jobs and replacements all change that
one state, and keeping them together keeps the invariant readable.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.distributed.actor import SandboxActor, WireJob, inflight_for
from agentrl.pool.engine import percentiles
from agentrl.pool.jobs import (
    SCHED_KEYS,
    JobExpired,
    JobFailed,
    JobOutcome,
    JobStatus,
    PoolClosed,
    PoolFull,
    schedule_args,
    split_job_entry,
)
from agentrl.sandbox.args import check_int, env_pairs, file_list, python_files, run_args
from agentrl.sandbox.limits import Limits
from agentrl.sandbox.result import ExecResult

__all__ = ["RayPool", "RayPoolFuture", "ray_init_options"]

_RUN_KEYS = frozenset({"stdin", "files", "collect", "limits", "cwd", "env"})
_STATUS = {s.value: s for s in JobStatus}
POLL_WAIT_S = 1.0
"""Longest a ``poll`` call waits for an outcome before it returns empty (and is reissued)."""
STATS_EVERY_S = 1.0
"""How often the driver refreshes the actors' own stats (``stats()["nodes"]``)."""


def ray_init_options(**overrides: Any) -> dict[str, Any]:
    """Light ``ray.init`` keywords for a driver: no dashboard, no log forwarding."""
    opts: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "configure_logging": False,
    }
    opts.update(overrides)
    return opts


class RayPoolFuture(concurrent.futures.Future):
    """A future of one :class:`RayPool` job; :meth:`cancel` cancels the job itself (a queued
    job never starts, a running one has its box killed on its node)."""

    def __init__(self, pool: RayPool) -> None:
        super().__init__()
        self._pool = pool
        self.job_id = 0
        """The pool's id of the job."""

    def cancel(self) -> bool:
        if self.done():
            return self.cancelled()
        if not self._pool.cancel_job(self.job_id):
            return self.cancelled()
        return True


@dataclass(eq=False)
class _Job:
    jid: int
    python: bool
    main: Any
    kw: dict[str, Any]
    deadline_at: float | None
    future: RayPoolFuture | None
    attempts: int = 0
    actor: _Actor | None = None
    done: bool = False


@dataclass(eq=False)
class _Actor:
    handle: Any
    index: int
    info: dict[str, Any] = field(default_factory=dict)
    assigned: dict[int, _Job] = field(default_factory=dict)
    alive: bool = True
    completed: int = 0
    stats: dict[str, Any] = field(default_factory=dict)


class RayPool:
    """Runs sandbox jobs on the actors of a Ray cluster; the API of :class:`SandboxPool`.

    * ``num_actors``: how many sandbox actors. ``None``: one per alive node (per node that
      has the custom resource ``agentrl_sandbox``, when any node has it), or
      ``cores_per_actor`` apart; each pinned to its node (node affinity). A number: that many,
      spread over the cluster (``SPREAD``).
    * ``workers_per_actor``: boxes at once per actor (``None``: the node's default, two per
      core of that node).
    * ``resources``: extra Ray resources each actor holds (e.g. ``{"agentrl_sandbox": 1}``);
      ``num_cpus``: CPUs each actor reserves (default 1: the actor's own threads).
    * ``limits``: default :class:`Limits` of a job; ``sandbox``: :class:`Sandbox` keyword
      arguments for each actor's sandbox; ``pool_options``: other :class:`SandboxPool`
      arguments of each actor's pool (``retries``, ...).
    * ``batch_size``: most jobs in one call to an actor; ``max_inflight_per_actor``: most
      jobs held by one actor at once (default 32 per worker: enough that a poll's burst and
      the next batch carry dozens of jobs each); a slow node is not buried, the rest wait in
      the driver's queue.
    * ``capacity``: most jobs in the pool (queued, running, outcomes not handed over);
      ``backpressure`` ``"block"`` or ``"error"`` (:class:`PoolFull`) when full.
    * ``max_infra_retries``: how many times a job is re-run after the actor holding it died;
      past that it fails (``JobFailed``). ``replace_timeout``: seconds a replacement actor
      may take to start.
    * ``linger_s``: how long an actor holding running jobs may wait after the first finished
      one (until half of its jobs are done) before it replies, to send a burst of outcomes
      in one Ray call: a Ray call costs about as much CPU as a warm run. Adds at most this
      much latency to a job, and only while the actor is busy (an actor holding one or two
      jobs replies at once); 0: reply at once.
    * ``address``: the cluster for ``ray.init`` when Ray is not initialised yet (``None``: a
      local one); the pool then shuts Ray down on :meth:`close`.

    Jobs take the keywords of :meth:`SandboxPool.submit` except ``pass_fds`` (descriptors do
    not cross machines). ``priority`` orders jobs within each node.
    """

    def __init__(
        self,
        num_actors: int | None = None,
        workers_per_actor: int | None = None,
        resources: Mapping[str, float] | None = None,
        limits: Limits | None = None,
        *,
        num_cpus: float = 1,
        cores_per_actor: int | None = None,
        sandbox: Mapping[str, Any] | None = None,
        pool_options: Mapping[str, Any] | None = None,
        batch_size: int = 256,
        max_inflight_per_actor: int | None = None,
        capacity: int = 1 << 16,
        backpressure: str = "block",
        block_timeout: float | None = None,
        max_infra_retries: int = 3,
        replace_timeout: float = 60.0,
        linger_s: float = 0.1,
        address: str | None = None,
        ray_options: Mapping[str, Any] | None = None,
    ) -> None:
        import ray

        if num_actors is not None:
            check_int("num_actors", num_actors, 1, 1 << 16)
        if workers_per_actor is not None:
            check_int("workers_per_actor", workers_per_actor, 1, 4096)
        if cores_per_actor is not None:
            check_int("cores_per_actor", cores_per_actor, 1, 1 << 16)
        check_int("batch_size", batch_size, 1, 1 << 20)
        check_int("capacity", capacity, 1, 1 << 30)
        check_int("max_infra_retries", max_infra_retries, 0, 1000)
        if max_inflight_per_actor is not None:
            check_int("max_inflight_per_actor", max_inflight_per_actor, 1, 1 << 20)
        if backpressure not in ("block", "error"):
            raise ValueError(f'backpressure must be "block" or "error", got {backpressure!r}')
        if limits is not None and not isinstance(limits, Limits):
            raise TypeError(f"limits must be agentrl.Limits, got {type(limits).__name__}")
        if resources is not None and not isinstance(resources, Mapping):
            raise TypeError("resources must be a mapping of Ray resource name to amount")
        if isinstance(num_cpus, bool) or not isinstance(num_cpus, (int, float)) or num_cpus < 0:
            raise ValueError(f"num_cpus must be a non-negative number, got {num_cpus!r}")
        if sandbox is not None and not isinstance(sandbox, Mapping):
            raise TypeError("sandbox must be a mapping of Sandbox arguments")
        self._owns_ray = False
        if not ray.is_initialized():
            ray.init(address=address, **ray_init_options(**(ray_options or {})))
            self._owns_ray = True
        self._limits = limits
        self._batch = batch_size
        self._capacity = capacity
        self._backpressure = backpressure
        self._block_timeout = block_timeout
        self._max_infra = max_infra_retries
        self._replace_timeout = replace_timeout
        self._linger = float(linger_s)
        self._resources = dict(resources or {})
        self._num_cpus = num_cpus
        args: dict[str, Any] = dict(pool_options or {})
        if workers_per_actor is not None:
            args["workers"] = workers_per_actor
        if limits is not None:
            args["limits"] = limits
        if sandbox is not None:
            args["sandbox"] = dict(sandbox)
        self._inflight_cap = max_inflight_per_actor
        self._pool_args = args

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self._jobs: dict[int, _Job] = {}
        self._pending: deque[_Job] = deque()
        self._ready: deque[JobOutcome] = deque()
        self._batch_pending = 0  # submit_many jobs without a collected outcome
        self._inflight = 0  # jobs counted against capacity
        self._counts = dict.fromkeys(("completed", "cancelled", "expired", "failed"), 0)
        self._submitted = 0
        self._infra_retries = 0
        self._lost = 0
        self._replaced = 0
        self._replacing = 0
        self._latencies: deque[float] = deque(maxlen=10_000)
        self._actors: list[_Actor] = []
        self._closed = False
        self._kicked = False
        self._pid = os.getpid()
        self._started = time.monotonic()

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="agentrl-raypool", daemon=True
        )
        self._thread.start()
        try:
            self._start_actors(num_actors, cores_per_actor)
            self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._refresher()))
        except BaseException:
            self._stop_loop()
            if self._owns_ray:
                ray.shutdown()
            raise

    # ---- actors
    def _actor_options(self) -> dict[str, Any]:
        return {
            "num_cpus": self._num_cpus,
            "resources": self._resources or None,
            "max_restarts": 0,
            "max_concurrency": 8,  # threads: submit, poll, cancel, stats at once
        }

    def _placements(self, num_actors: int | None, cores_per_actor: int | None) -> list[Any]:
        """One scheduling strategy per actor to start."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if num_actors is not None:
            return ["SPREAD"] * num_actors
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        wanted = set(self._resources)
        if not wanted and any("agentrl_sandbox" in n.get("Resources", {}) for n in nodes):
            self._resources["agentrl_sandbox"] = 1
            wanted = {"agentrl_sandbox"}
        nodes = [n for n in nodes if wanted <= set(n.get("Resources", {}))]
        if not nodes:
            raise RuntimeError(f"no alive Ray node has the resources {sorted(wanted)}")
        out = []
        for n in nodes:
            per = 1
            if cores_per_actor is not None:
                per = max(1, int(n["Resources"].get("CPU", 1)) // cores_per_actor)
            out += [NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)] * per
        return out

    def _new_actor(self, strategy: Any) -> Any:
        import ray

        cls = ray.remote(SandboxActor)
        return cls.options(**self._actor_options(), scheduling_strategy=strategy).remote(
            self._pool_args, self._inflight_cap, self._batch
        )

    def _start_actors(self, num_actors: int | None, cores_per_actor: int | None) -> None:
        import ray

        handles = [self._new_actor(s) for s in self._placements(num_actors, cores_per_actor)]
        try:
            infos = ray.get([h.info.remote() for h in handles], timeout=self._replace_timeout)
        except BaseException as e:
            for h in handles:
                ray.kill(h)
            if isinstance(e, ray.exceptions.GetTimeoutError):
                raise RuntimeError(
                    f"{len(handles)} sandbox actors did not start within {self._replace_timeout}"
                    f" s: the cluster lacks the resources (num_cpus={self._num_cpus}, "
                    f"{self._resources or 'no custom resources'}) or is busy"
                ) from None
            raise
        for i, (h, info) in enumerate(zip(handles, infos, strict=True)):
            a = _Actor(h, i, info)
            self._actors.append(a)
            self._loop.call_soon_threadsafe(self._start_poller, a)

    def _room(self, a: _Actor) -> int:
        return inflight_for(self._inflight_cap, int(a.info.get("workers", 1))) - len(a.assigned)

    def _start_poller(self, a: _Actor) -> None:
        self._loop.create_task(self._poller(a))

    async def _poller(self, a: _Actor) -> None:
        while a.alive and not (self._closed and not self._jobs):
            try:
                outs = await a.handle.poll.remote(POLL_WAIT_S, self._linger)
            except Exception as e:
                self._actor_lost(a, e)
                return
            if outs:
                self._deliver(a, outs)
                self._dispatch()

    async def _send(self, a: _Actor, wire: list[WireJob]) -> None:
        try:
            await a.handle.submit.remote(wire)
        except Exception as e:
            self._actor_lost(a, e)

    def _actor_lost(self, a: _Actor, err: BaseException) -> None:
        import ray

        failed: list[tuple[_Job, str]] = []
        with self._lock:
            if not a.alive:
                return
            a.alive = False
            self._lost += 1
            jobs = [j for j in a.assigned.values() if not j.done]
            a.assigned.clear()
            for j in reversed(jobs):
                j.actor = None
                j.attempts += 1
                if j.attempts > self._max_infra:
                    failed.append((j, f"the sandbox actor died {j.attempts} times: {err!r}"))
                else:
                    self._infra_retries += 1
                    self._pending.appendleft(j)
            closing = self._closed
            if not closing:
                self._replacing += 1
            elif not any(x.alive for x in self._actors) and not self._replacing:
                # Closing with no actor left to run them: they fail rather than hang close().
                failed += [(j, f"the sandbox actor died while the pool closed: {err!r}")
                           for j in self._pending if not j.done]  # fmt: skip
                self._pending.clear()
        for j, why in failed:
            self._settle(j, JobStatus.FAILED, why)
        with contextlib.suppress(Exception):
            ray.kill(a.handle)
        if not closing:
            self._loop.create_task(self._replace(a))
        self._dispatch()

    async def _replace(self, old: _Actor) -> None:
        import ray

        handle = None
        try:
            handle = self._new_actor("SPREAD")
            info = await asyncio.wait_for(handle.info.remote(), self._replace_timeout)
        except BaseException as e:
            if handle is not None:
                with contextlib.suppress(Exception):
                    ray.kill(handle)
            with self._lock:
                self._replacing -= 1
                stranded = not any(a.alive for a in self._actors) and not self._replacing
                jobs = list(self._pending) if stranded else []
                if stranded:
                    self._pending.clear()
            for j in jobs:
                self._settle(j, JobStatus.FAILED, "no sandbox actor is alive or could be placed")
            if not isinstance(e, Exception):
                raise  # cancelled by close()
            return
        with self._lock:
            self._replacing -= 1
            if self._closed:
                ray.kill(handle)
                return
            a = _Actor(handle, len(self._actors), info)
            self._actors.append(a)
            self._replaced += 1
        self._start_poller(a)
        self._dispatch()

    # ---- the driver loop's side
    def _kick(self) -> None:
        """Wakes the loop to dispatch (one wake-up per burst of submissions)."""
        with self._lock:
            if self._kicked:
                return
            self._kicked = True
        self._loop.call_soon_threadsafe(self._dispatch)

    def _dispatch(self) -> None:
        """Hands queued jobs to the actors with room, in batches (on the loop)."""
        sends: list[tuple[_Actor, list[WireJob]]] = []
        now = time.monotonic()
        with self._lock:
            self._kicked = False
            pending = self._pending
            while pending:
                live = [a for a in self._actors if a.alive and self._room(a) > 0]
                if not live:
                    break
                progressed = False
                for a in sorted(live, key=lambda a: len(a.assigned)):
                    n = min(self._room(a), self._batch)
                    wire: list[WireJob] = []
                    while pending and len(wire) < n:
                        j = pending.popleft()
                        if j.done:
                            continue
                        kw = j.kw
                        if j.deadline_at is not None:
                            kw = {**kw, "deadline": j.deadline_at - now}
                        j.actor = a
                        a.assigned[j.jid] = j
                        wire.append((j.jid, j.python, j.main, kw))
                    if wire:
                        sends.append((a, wire))
                        progressed = True
                    if not pending:
                        break
                if not progressed:
                    break
        for a, wire in sends:
            self._loop.create_task(self._send(a, wire))

    def _deliver(self, a: _Actor, outs: list[tuple[int, str, Any]]) -> None:
        settle = []
        with self._lock:
            for jid, status, payload in outs:
                j = a.assigned.pop(jid, None)
                if j is not None:
                    a.completed += 1
                    settle.append((j, _STATUS[status], payload))
        for j, st, payload in settle:
            self._settle(j, st, payload)

    def _settle(self, j: _Job, status: JobStatus, payload: Any) -> bool:
        """Gives job ``j`` its one terminal outcome; false if it already had one."""
        with self._lock:
            if j.done:
                return False
            j.done = True
            self._jobs.pop(j.jid, None)
            self._counts[status.value] += 1
            if status is JobStatus.COMPLETED:
                self._latencies.append(payload.wall_time_s)
            fut = j.future
            if fut is None:
                result = payload if status is JobStatus.COMPLETED else None
                reason = payload if status is JobStatus.FAILED else None
                self._ready.append(JobOutcome(j.jid, status, result, reason))
            else:
                self._inflight -= 1
            self._cond.notify_all()
        if fut is not None:
            if status is JobStatus.COMPLETED:
                fut.set_result(payload)
            elif status is JobStatus.CANCELLED:
                concurrent.futures.Future.cancel(fut)
            elif status is JobStatus.EXPIRED:
                fut.set_exception(JobExpired("the job's deadline passed before it started"))
            else:
                fut.set_exception(JobFailed(str(payload)))
        return True

    def _stop_loop(self) -> None:
        async def cancel_all() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(cancel_all(), self._loop).result(30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    # ---- submission
    def _check(self) -> None:
        if self._closed:
            raise PoolClosed("the pool is closed")
        if os.getpid() != self._pid:
            raise PoolClosed("the pool belongs to the parent process")

    def _make(self, main: Any, python: bool, kw: Mapping[str, Any]) -> _Job:
        unknown = set(kw) - _RUN_KEYS - SCHED_KEYS
        if python and "cwd" in kw:
            unknown.add("cwd")
        if unknown:
            extra = " (file descriptors do not cross machines)" if "pass_fds" in unknown else ""
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}{extra}")
        if python:
            python_files(main, kw.get("files"))
            argv: Any = ["python"]
        else:
            argv = main
        file_list(kw.get("files"))
        env_pairs("env", kw.get("env"))
        run_args(argv, kw.get("stdin"), kw.get("collect", ()), kw.get("limits"), kw.get("cwd"))
        group, priority, rel = schedule_args(**{k: kw[k] for k in SCHED_KEYS if k in kw})
        run_kw = {k: v for k, v in kw.items() if k in _RUN_KEYS and v is not None}
        if group:
            run_kw["group"] = group
        if priority:
            run_kw["priority"] = priority
        deadline_at = None if rel is None else time.monotonic() + rel
        return _Job(0, python, main, run_kw, deadline_at, None)

    def _entry(self, job: Any, common: Mapping[str, Any]) -> _Job:
        return self._make(*split_job_entry(job, common))

    def _admit(self, n: int) -> None:
        end = None if self._block_timeout is None else time.monotonic() + self._block_timeout
        with self._lock:
            while True:
                self._check()
                if self._inflight + n <= self._capacity or (
                    n > self._capacity and not self._inflight
                ):
                    self._inflight += n
                    return
                if self._backpressure == "error":
                    raise PoolFull(f"the pool is full ({self._capacity} jobs)")
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise PoolFull(f"the pool stayed full for {self._block_timeout} s")
                self._cond.wait(left)

    def _enqueue(self, jobs: list[_Job], futures: bool) -> None:
        self._admit(len(jobs))
        with self._lock:
            for j in jobs:
                j.jid = next(self._ids)
                if futures:
                    j.future = RayPoolFuture(self)
                    j.future.job_id = j.jid
                self._jobs[j.jid] = j
                self._pending.append(j)
            self._submitted += len(jobs)
            if not futures:
                self._batch_pending += len(jobs)
        self._kick()

    def submit(self, argv: Sequence[Any], **kw: Any) -> RayPoolFuture:
        """Submits ``argv`` (see :meth:`Sandbox.run`); a future of its :class:`ExecResult`."""
        self._check()
        j = self._make(argv, False, kw)
        self._enqueue([j], True)
        assert j.future is not None
        return j.future

    def submit_python(self, source: str, **kw: Any) -> RayPoolFuture:
        """Submits Python ``source`` (see :meth:`Sandbox.run_python`)."""
        self._check()
        j = self._make(source, True, kw)
        self._enqueue([j], True)
        assert j.future is not None
        return j.future

    def run(self, argv: Sequence[Any], **kw: Any) -> asyncio.Future[ExecResult]:
        """``await pool.run(argv, ...)``: an asyncio future of the result; cancelling it
        cancels the job."""
        return asyncio.wrap_future(self.submit(argv, **kw))

    def run_python(self, source: str, **kw: Any) -> asyncio.Future[ExecResult]:
        """:meth:`run` for Python ``source``."""
        return asyncio.wrap_future(self.submit_python(source, **kw))

    def submit_many(self, jobs: Iterable[Any], **common: Any) -> list[int]:
        """Submits a batch (entries as in :meth:`SandboxPool.submit_many`); outcomes come
        from :meth:`collect`. A bad job raises, naming it, before any is submitted."""
        self._check()
        items = []
        for i, job in enumerate(jobs):
            try:
                items.append(self._entry(job, common))
            except (ValueError, TypeError) as e:
                raise type(e)(f"job {i}: {e}") from None
        if not items:
            return []
        self._enqueue(items, False)
        return [j.jid for j in items]

    def collect(self, max: int | None = None, timeout: float = 0.0) -> list[JobOutcome]:
        """Outcomes of :meth:`submit_many` jobs: up to ``max`` (all ready if None), waiting
        up to ``timeout`` seconds for the first; ``[]`` when none is outstanding."""
        if max is not None and max < 1:
            raise ValueError(f"max must be positive, got {max}")
        if timeout < 0:
            raise ValueError(f"timeout must be non-negative, got {timeout}")
        end = time.monotonic() + timeout
        with self._lock:
            while not self._ready and self._batch_pending and timeout > 0:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            n = len(self._ready) if max is None else min(max, len(self._ready))
            out = [self._ready.popleft() for _ in range(n)]
            self._batch_pending -= n
            self._inflight -= n
            if n:
                self._cond.notify_all()
        return out

    def map(
        self, jobs: Iterable[Any], *, timeout: float | None = None, **common: Any
    ) -> Iterator[ExecResult]:
        """Submits every job at once and yields the results in order (as
        :meth:`SandboxPool.map`); closing the iterator early cancels the rest."""
        self._check()
        items = [self._entry(j, common) for j in jobs]
        self._enqueue(items, True)
        futs = [j.future for j in items]
        end = None if timeout is None else time.monotonic() + timeout
        return self._results(futs, end)  # type: ignore[arg-type]

    @staticmethod
    def _results(futs: list[RayPoolFuture], end: float | None) -> Iterator[ExecResult]:
        try:
            for f in futs:
                yield f.result(None if end is None else max(0.0, end - time.monotonic()))
        finally:
            for f in futs:
                f.cancel()

    # ---- cancellation
    def cancel_job(self, job_id: int) -> bool:
        """Cancels one job by id; true iff its outcome is ``cancelled``."""
        with self._lock:
            j = self._jobs.get(job_id)
            if j is None or j.done:
                return False
            a = j.actor
        if not self._settle(j, JobStatus.CANCELLED, None):
            return False
        if a is not None and a.alive:
            self._loop.call_soon_threadsafe(
                lambda: self._loop.create_task(self._quiet(a.handle.cancel_jobs.remote([job_id])))
            )
        return True

    @staticmethod
    async def _quiet(ref: Any) -> None:
        with contextlib.suppress(Exception):  # a dead actor's jobs are gone with it
            await ref

    def cancel(self, group: int) -> int:
        """Cancels every queued or running job of ``group`` on every node; returns how many
        this call cancelled."""
        import ray

        if isinstance(group, bool) or not isinstance(group, int) or not 0 <= group < 1 << 64:
            raise TypeError(f"group must be an int in [0, 2**64), got {group!r}")
        with self._lock:
            queued = [j for j in self._pending if not j.done and j.kw.get("group") == group]
            actors = [a for a in self._actors if a.alive]
        n = sum(self._settle(j, JobStatus.CANCELLED, None) for j in queued)
        refs = [a.handle.cancel_group.remote(group) for a in actors]
        for ref in refs:
            # A dead actor's jobs are re-run elsewhere (their group then cancelled there).
            with contextlib.suppress(Exception):
                n += ray.get(ref, timeout=30)
        return n

    # ---- introspection
    @property
    def workers(self) -> int:
        """Boxes at once over every live actor."""
        return sum(int(a.info.get("workers", 0)) for a in self._actors if a.alive)

    @property
    def closed(self) -> bool:
        return self._closed

    async def _refresh(self) -> None:
        """Fetches every live actor's own pool stats (one call each, concurrently)."""
        live = [a for a in self._actors if a.alive]
        got = await asyncio.gather(*(a.handle.stats.remote() for a in live), return_exceptions=True)
        for a, st in zip(live, got, strict=True):
            a.stats = st if isinstance(st, dict) else {"error": repr(st)}

    async def _refresher(self) -> None:
        while not self._closed:
            await asyncio.sleep(STATS_EVERY_S)
            with contextlib.suppress(Exception):
                await self._refresh()

    def stats(self, refresh: bool = False) -> dict[str, Any]:
        """Outcome counts, queue and in-flight jobs, jobs per second, infrastructure retries,
        actors lost and replaced, and per node (``nodes``) the actors' own pool stats summed.
        The per-node part is refreshed in the background every second (this call does not
        block on the cluster); ``refresh=True`` fetches it now."""
        if refresh and not self._closed:
            asyncio.run_coroutine_threadsafe(self._refresh(), self._loop).result(60)
        with self._lock:
            live = [a for a in self._actors if a.alive]
            elapsed = time.monotonic() - self._started
            finished = sum(self._counts.values())
            s: dict[str, Any] = {
                "workers": sum(int(a.info.get("workers", 0)) for a in live),
                "actors": len(live),
                "submitted": self._submitted,
                **self._counts,
                "finished": finished,
                "queued": sum(1 for j in self._pending if not j.done),
                "running": sum(len(a.assigned) for a in live),
                "infra_retries": self._infra_retries,
                "actors_lost": self._lost,
                "actors_replaced": self._replaced,
                "capacity": self._capacity,
                "inflight": self._inflight,
                "uncollected": len(self._ready),
                "closed": self._closed,
                "elapsed_s": elapsed,
                "jobs_per_sec": finished / elapsed if elapsed > 0 else 0.0,
            }
            lat = list(self._latencies)
        s["latency_s"] = percentiles(lat)
        nodes: dict[str, dict[str, Any]] = {}
        for a in live:
            node = nodes.setdefault(
                a.info.get("node_id", "?"),
                {"host": a.info.get("host"), "actors": 0, "delivered": 0},
            )
            node["actors"] += 1
            node["delivered"] += a.completed
            for k, v in a.stats.items():
                if k == "error":
                    node["error"] = v
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    node[k] = node.get(k, 0) + v
        util = [n["utilisation"] / n["actors"] for n in nodes.values() if "utilisation" in n]
        s["utilisation"] = sum(util) / len(util) if util else 0.0
        s["nodes"] = nodes
        return s

    # ---- closing
    def close(self, drain: bool = True) -> None:
        """Stops the pool: with ``drain`` every accepted job still runs; without, the rest
        end ``cancelled``. Every future is resolved when this returns; ``submit_many``
        outcomes stay for :meth:`collect`. Kills the actors; idempotent."""
        import ray

        if not isinstance(drain, bool):
            raise TypeError(f"drain must be True or False, got {drain!r}")
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if os.getpid() != self._pid:
            return
        if not drain:
            with self._lock:
                left = list(self._jobs.values())
            for j in left:
                self._settle(j, JobStatus.CANCELLED, None)
        with self._lock:
            while self._jobs:
                self._cond.wait(1.0)
            actors = [a for a in self._actors if a.alive]
            for a in self._actors:
                a.alive = False
        with contextlib.suppress(Exception):
            ray.get([a.handle.shutdown.remote() for a in actors], timeout=30)
        for a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a.handle)
        self._stop_loop()
        if self._owns_ray:
            ray.shutdown()

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(drain=exc_type is None)

    async def __aenter__(self) -> RayPool:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close, exc_type is None)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<agentrl.distributed.RayPool {state} actors={len(self._actors)}>"
