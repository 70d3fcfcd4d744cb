"""Job outcomes, futures and the routing machinery shared by the scheduler pools.

Jobs run on the Rust scheduler's worker threads (no GIL). Results come back through an
eventfd: an asyncio loop watches it with ``loop.add_reader`` (default loop and uvloop alike),
and ``concurrent.futures`` users get a dispatcher thread that sleeps in ``poll(2)`` on it. No
thread polls on a timer and nothing spins. :class:`agentrl.SandboxPool` is the public pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import os
import select
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from agentrl import _core
from agentrl.errors import AgentRLError

__all__ = [
    "JobExpired",
    "JobFailed",
    "JobOutcome",
    "JobStatus",
    "PoolClosed",
    "PoolFull",
    "PoolFuture",
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


_STATUS = {s.value: s for s in JobStatus}


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


_BATCH = object()
"""Handler of a job whose outcome goes to :meth:`collect`."""
_LATENCY_WINDOW = 10_000
_READER_BATCH = 4096
"""Most results one wake-up of an asyncio loop's reader handles (the rest re-arm the fd)."""


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


def _percentiles(values: Iterable[float]) -> dict[str, float | int | None]:
    xs = sorted(values)
    if not xs:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "mean": None}

    def q(p: float) -> float:
        return xs[min(len(xs) - 1, int(p * len(xs)))]

    return {"n": len(xs), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "mean": sum(xs) / len(xs)}


def _call_in_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """Runs ``fn`` in ``loop``: now if this thread runs it, else through the loop's queue."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        fn(*args)
    else:
        # A closed loop raises RuntimeError: nobody is waiting there any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(fn, *args)


def _settle_async(fut: asyncio.Future, status: JobStatus, value: Any) -> None:
    if fut.done():
        return
    if status is JobStatus.COMPLETED:
        fut.set_result(value)
    elif status is JobStatus.CANCELLED:
        fut.cancel()
    else:
        fut.set_exception(_exception(status, value))


def _settle(handler: Any, status: JobStatus, value: Any) -> None:
    if isinstance(handler, tuple):
        _call_in_loop(handler[0], _settle_async, handler[1], status, value)
        return
    try:
        if status is JobStatus.COMPLETED:
            handler.set_result(value)
        elif status is JobStatus.CANCELLED:
            concurrent.futures.Future.cancel(handler)
        else:
            handler.set_exception(_exception(status, value))
    except concurrent.futures.InvalidStateError:  # cancelled by its owner meanwhile
        pass


class _JobPool:
    """Routing of outcomes to futures and to :meth:`collect`, admission (``capacity``),
    asyncio readers and the dispatcher thread; independent of what a job is."""

    def __init__(
        self, core: Any, capacity: int, backpressure: str, block_timeout: float | None
    ) -> None:
        self._core = core
        self._fd: int = core.completion_fd()
        self._capacity = capacity
        self._block = backpressure == "block"
        self._block_timeout = block_timeout
        self._cond = threading.Condition(threading.Lock())
        self._handlers: dict[int, Any] = {}
        self._early: dict[int, tuple[str, Any]] = {}
        self._ready: deque[JobOutcome] = deque()
        self._batch_pending = 0
        self._inflight = 0
        self._closed = False
        self._close_lock = threading.Lock()
        self._loops: dict[int, asyncio.AbstractEventLoop] = {}
        self._room_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._dispatcher: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None
        self._latencies: deque[float] = deque(maxlen=_LATENCY_WINDOW)
        # Written once by `close`: wakes threads waiting in `_wait` on the completion fd.
        self._kick = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        weakref.finalize(self, _close_fds, *self._kick)

    # ---- what a subclass provides
    def _convert(self, value: Any) -> Any:
        """The user-facing result of a completed job."""
        return value

    # ---- admission
    def _admit(self, n: int) -> None:
        if n > self._capacity:
            raise ValueError(f"a batch of {n} jobs is larger than the pool's capacity")
        deadline = None if self._block_timeout is None else time.monotonic() + self._block_timeout
        while True:
            with self._cond:
                if self._closed:
                    raise PoolClosed("the pool is closed")
                if self._inflight + n <= self._capacity:
                    self._inflight += n
                    return
                if not self._block:
                    raise PoolFull(f"the pool holds {self._inflight} of {self._capacity} jobs")
            if not self._wait(
                lambda: self._closed or self._inflight + n <= self._capacity, deadline
            ):
                raise PoolFull(f"no room for {n} job(s) within {self._block_timeout} s")

    async def _admit_async(self, n: int) -> None:
        if n > self._capacity:
            raise ValueError(f"a batch of {n} jobs is larger than the pool's capacity")
        loop = asyncio.get_running_loop()
        deadline = None if self._block_timeout is None else loop.time() + self._block_timeout
        while True:
            with self._cond:
                if self._closed:
                    raise PoolClosed("the pool is closed")
                if self._inflight + n <= self._capacity:
                    self._inflight += n
                    return
                if not self._block:
                    raise PoolFull(f"the pool holds {self._inflight} of {self._capacity} jobs")
                fut = loop.create_future()
                self._room_waiters.append((loop, fut))
            timeout = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                await asyncio.wait_for(fut, timeout)
            except asyncio.TimeoutError:
                raise PoolFull(f"no room for {n} job(s) within {self._block_timeout} s") from None

    def _release(self, n: int) -> list[tuple[asyncio.AbstractEventLoop, asyncio.Future]]:
        """Frees room (lock held); returns the asyncio waiters to wake."""
        self._inflight -= n
        waiters, self._room_waiters = self._room_waiters, []
        return waiters

    @staticmethod
    def _wake_waiters(waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]]) -> None:
        for loop, fut in waiters:
            _call_in_loop(loop, lambda f: f.done() or f.set_result(None), fut)

    # ---- submission
    def _submit(self, items: list, handlers: list | None) -> list[int]:
        """Submits admitted ``items``; ``handlers`` (one per item) receive the outcomes, or
        they go to :meth:`collect` if None. Un-admits what is refused."""
        try:
            ids = self._core.submit_many(items)
        except (PoolFull, PoolClosed) as e:
            accepted = list(e.args[1]) if len(e.args) > 1 else []
            self._register(accepted, handlers)
            with self._cond:
                waiters = self._release(len(items) - len(accepted))
            self._wake_waiters(waiters)
            raise type(e)(e.args[0]) from None
        except BaseException:
            with self._cond:
                waiters = self._release(len(items))
            self._wake_waiters(waiters)
            raise
        self._register(ids, handlers)
        return ids

    def _register(self, ids: list[int], handlers: list | None) -> None:
        late = []
        with self._cond:
            early = self._early
            if handlers is None:
                self._batch_pending += len(ids)
                for jid in ids:
                    self._handlers[jid] = _BATCH
            else:
                for jid, h in zip(ids, handlers, strict=False):  # ids may be a prefix
                    self._handlers[jid] = h
            if early:
                for jid in ids:
                    if jid in early:
                        late.append((jid, *early.pop(jid)))
        if late:
            self._route(late, converted=True)

    # ---- outcomes
    def _drain(self, max_n: int | None = None) -> int:
        raw = self._core.collect(max_n, 0.0)
        if raw:
            self._route(raw)
        return len(raw)

    def _route(self, raw: list, converted: bool = False) -> None:
        if not converted:
            conv = self._convert
            raw = [(j, k, conv(v)) if k == "completed" else (j, k, v) for j, k, v in raw]
        deliver = []
        freed = 0
        with self._cond:
            handlers, ready = self._handlers, self._ready
            for jid, kind, value in raw:
                h = handlers.pop(jid, None)
                if h is None:  # submitted, not registered yet: `_register` picks it up
                    self._early[jid] = (kind, value)
                elif h is _BATCH:
                    self._batch_pending -= 1
                    status = _STATUS[kind]
                    if status is JobStatus.FAILED:
                        ready.append(JobOutcome(jid, status, None, value))
                    else:
                        ready.append(JobOutcome(jid, status, value))
                else:
                    deliver.append((h, _STATUS[kind], value))
                    freed += 1
            waiters = self._release(freed) if freed else []
            self._cond.notify_all()
        self._wake_waiters(waiters)
        for h, status, value in deliver:
            _settle(h, status, value)

    def _wait(self, pred: Callable[[], bool], deadline: float | None) -> bool:
        """Waits until ``pred()`` (checked under the lock) or the deadline; drains the
        completion fd itself unless the dispatcher thread does."""
        poller = None
        while True:
            with self._cond:
                if pred():
                    return True
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if self._dispatcher is not None or self._closed:
                    # The dispatcher, or `close`, drains and notifies.
                    self._cond.wait(remaining)
                    continue
                shared = bool(self._loops)
            if poller is None:
                poller = select.poll()
                poller.register(self._fd, select.POLLIN)
                poller.register(self._kick[0], select.POLLIN)
            # Another drainer (an asyncio loop) may take the fd's event: wake now and then.
            chunk = remaining if not shared else min(remaining or 0.05, 0.05)
            poller.poll(None if chunk is None else max(1, int(chunk * 1000 + 0.999)))
            self._drain()

    # ---- asyncio
    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        key = id(loop)
        if self._loops.get(key) is loop:
            return
        for k, other in list(self._loops.items()):
            if other.is_closed():
                del self._loops[k]
        loop.add_reader(self._fd, self._drain, _READER_BATCH)
        self._loops[key] = loop

    async def _run_async(self, item: Any) -> Any:
        loop = asyncio.get_running_loop()
        if self._closed:
            raise PoolClosed("the pool is closed")
        self._attach(loop)
        await self._admit_async(1)
        fut = loop.create_future()
        jid = self._submit([item], [(loop, fut)])[0]
        try:
            return await fut
        except asyncio.CancelledError:
            self._core.cancel(jid)
            raise

    # ---- concurrent.futures
    def _ensure_dispatcher(self) -> None:
        if self._dispatcher is not None:
            return
        with self._cond:
            if self._dispatcher is not None or self._closed:
                return
            r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._wake = (r, w)
            t = threading.Thread(target=self._dispatch, name="agentrl-pool-dispatch", daemon=True)
            self._dispatcher = t
        t.start()

    def _dispatch(self) -> None:
        assert self._wake is not None
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake[0], select.POLLIN)
        while True:
            events = poller.poll()
            if any(fd == self._wake[0] for fd, _ in events):
                return
            self._drain()

    def _submit_futures(self, items: list) -> list[PoolFuture]:
        self._ensure_dispatcher()
        self._admit(len(items))
        futs = [PoolFuture(self._core) for _ in items]
        ids = self._submit(items, futs)
        for f, jid in zip(futs, ids, strict=True):
            f.job_id = jid
        return futs

    # ---- public
    def collect(self, max: int | None = None, timeout: float = 0.0) -> list[JobOutcome]:
        """Outcomes of jobs submitted with ``submit_many``: up to ``max`` (all that are ready if
        None), waiting up to ``timeout`` seconds for the first. Returns ``[]`` at once when no
        such job is outstanding. One call drains every finished job in one crossing."""
        if max is not None and max < 1:
            raise ValueError(f"max must be positive, got {max}")
        if timeout < 0:
            raise ValueError(f"timeout must be non-negative, got {timeout}")
        if not self._ready:
            self._drain()
            if not self._ready and timeout > 0:
                self._wait(
                    lambda: bool(self._ready) or self._batch_pending == 0,
                    time.monotonic() + timeout,
                )
        with self._cond:
            n = len(self._ready) if max is None else min(max, len(self._ready))
            out = [self._ready.popleft() for _ in range(n)]
            waiters = self._release(n) if n else []
            if n:
                self._cond.notify_all()
        self._wake_waiters(waiters)
        return out

    def cancel(self, group: int) -> int:
        """Cancels every queued or running job of ``group``: queued ones never start, running
        ones have their box killed. Returns how many jobs this call cancelled."""
        if isinstance(group, bool) or not isinstance(group, int) or not 0 <= group < 1 << 64:
            raise TypeError(f"group must be an int in [0, 2**64), got {group!r}")
        return self._core.cancel_group(group)

    def cancel_job(self, job_id: int) -> bool:
        """Cancels one job by id; true iff its outcome will be ``cancelled``."""
        return self._core.cancel(job_id)

    def stats(self) -> dict[str, Any]:
        """Queue depths per priority, running jobs, worker utilisation, jobs per second,
        outcome counts, jobs waiting in futures or for :meth:`collect`, and the percentiles of
        the completed jobs' wall time (``latency_s``, the last 10 000 jobs)."""
        s = self._core.stats()
        with self._cond:
            s["capacity"] = self._capacity
            s["inflight"] = self._inflight
            s["futures"] = len(self._handlers) - self._batch_pending
            s["uncollected"] = len(self._ready)
            s["closed"] = self._closed
        s["latency_s"] = _percentiles(list(self._latencies))
        return s

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, drain: bool = True) -> None:
        """Stops the pool and loses nothing: with ``drain`` every accepted job still runs;
        without, queued and running jobs end ``cancelled``. Every future is resolved when this
        returns; outcomes of ``submit_many`` jobs stay available to :meth:`collect`.
        Idempotent; blocks until the workers stop (use :meth:`aclose` in a coroutine)."""
        with self._close_lock:
            with self._cond:
                self._closed = True
                waiters = self._release(0)
                self._cond.notify_all()
            self._wake_waiters(waiters)
            os.write(self._kick[1], b"x")
            self._core.close(bool(drain))
            while self._drain():
                pass
            self._stop_dispatcher()
            for loop in list(self._loops.values()):
                if not loop.is_closed():
                    _call_in_loop(loop, loop.remove_reader, self._fd)
            self._loops.clear()
            self._after_close()

    def _stop_dispatcher(self) -> None:
        t, wake = self._dispatcher, self._wake
        if t is None or wake is None:
            return
        os.write(wake[1], b"x")
        if t is not threading.current_thread():
            t.join()
        os.close(wake[0])
        os.close(wake[1])
        with self._cond:
            self._wake = None
            self._dispatcher = None
            self._cond.notify_all()

    def _after_close(self) -> None:
        pass

    async def aclose(self, drain: bool = True) -> None:
        """:meth:`close` without blocking the running event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.close, drain)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(drain=exc_type is None)

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        await self.aclose(drain=exc_type is None)


def _check_int(name: str, v: object, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be between {lo} and {hi}, got {v}")
    return v


def _schedule(
    group: int = 0,
    priority: int = 0,
    deadline: float | None = None,
    deadline_at: float | None = None,
) -> tuple[int, int, float | None]:
    """Checks the scheduling keywords; the deadline becomes seconds from now."""
    _check_int("group", group, 0, (1 << 64) - 1)
    _check_int("priority", priority, -(1 << 31), (1 << 31) - 1)
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


_SCHED_KEYS = frozenset({"group", "priority", "deadline", "deadline_at"})


class _TestPool(_JobPool):
    """A pool of fake jobs (tests and benchmarks): ``(op, arg)`` with the ops below."""

    NOOP, SLEEP, INFRA, FLAKY, PANIC = range(5)

    def __init__(
        self,
        workers: int = 2,
        capacity: int = 4096,
        retries: int = 2,
        backpressure: str = "block",
        block_timeout: float | None = None,
    ) -> None:
        core = _core._TestPool(
            workers, 2 * capacity + 64, retries, 1.0 if backpressure == "block" else None
        )
        super().__init__(core, capacity, backpressure, block_timeout)

    def _item(self, op: int, arg: int, kw: Mapping[str, Any]) -> tuple:
        return (op, arg, *_schedule(**kw))

    def submit(self, op: int, arg: int = 0, **kw: Any) -> PoolFuture:
        return self._submit_futures([self._item(op, arg, kw)])[0]

    async def run(self, op: int, arg: int = 0, **kw: Any) -> Any:
        return await self._run_async(self._item(op, arg, kw))

    def submit_many(self, jobs: list) -> list[int]:
        """Jobs are ints (no-ops returning the int) or ``(op, arg, group, priority, deadline)``."""
        if not jobs:
            return []
        self._admit(len(jobs))
        return self._submit(jobs, None)
