"""The routing machinery shared by the scheduler pools (:mod:`agentrl.pool.pool`).

Jobs run on the Rust scheduler's worker threads (no GIL). Results come back through an
eventfd: an asyncio loop watches it with ``loop.add_reader`` (default loop and uvloop alike),
and ``concurrent.futures`` users get a dispatcher thread that sleeps in ``poll(2)`` on it. No
thread polls on a timer and nothing spins. :class:`agentrl.SandboxPool` is the public pool.

This module is long because routing, the futures, the asyncio bridge and the observers'
hooks all work on one lock-protected table of jobs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import select
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from agentrl.pool.jobs import (
    JobOutcome,
    JobStatus,
    PoolClosed,
    PoolFull,
    PoolFuture,
    _exception,
)
from agentrl.sandbox import closing

if TYPE_CHECKING:  # asyncio is imported where a coroutine needs it (a cold start skips it)
    import asyncio

__all__: list[str] = []

_LATENCY_WINDOW = 10_000
_READER_BATCH = 4096
"""Most results one wake-up of an asyncio loop's reader handles (the rest re-arm the fd)."""


def _log_observer_error(observer: Any, what: str) -> None:
    import logging

    logging.getLogger("agentrl.pool").exception(
        "pool observer %r failed in %s (ignored)", observer, what
    )


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


def percentiles(values: Iterable[float]) -> dict[str, float | int | None]:
    xs = sorted(values)
    if not xs:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "mean": None}

    def q(p: float) -> float:
        return xs[min(len(xs) - 1, int(p * len(xs)))]

    return {"n": len(xs), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "mean": sum(xs) / len(xs)}


def _running_loop() -> asyncio.AbstractEventLoop | None:
    # asyncio is imported on first use (~50 ms of a cold start): where it is not loaded yet,
    # no event loop can be running.
    aio = sys.modules.get("asyncio")
    if aio is None:
        return None
    try:
        return aio.get_running_loop()
    except RuntimeError:
        return None


def _call_in_loop(
    loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any, running: Any = False
) -> None:
    """Runs ``fn`` in ``loop``: now if this thread runs it, else through the loop's queue.
    ``running``: this thread's running loop, if the caller knows it."""
    if running is False:
        running = _running_loop()
    if running is loop:
        fn(*args)
    else:
        # A closed loop raises RuntimeError: nobody is waiting there any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(fn, *args)


def _fail(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _settle_async(fut: asyncio.Future, cb: Any, status: JobStatus, value: Any) -> None:
    if fut.done():
        return
    fut.remove_done_callback(cb)  # only there to cancel the job if the future is cancelled
    if status is JobStatus.COMPLETED:
        fut.set_result(value)
    elif status is JobStatus.CANCELLED:
        fut.cancel()
    else:
        fut.set_exception(_exception(status, value))


def _settle(handler: Any, o: JobOutcome, running: Any = False) -> None:
    status = o[1]
    value = o[3] if status is JobStatus.FAILED else o[2]
    if isinstance(handler, tuple):
        loop, fut, cb = handler
        _call_in_loop(loop, _settle_async, fut, cb, status, value, running=running)
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
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._handlers: dict[int, Any] = {}
        self._early: dict[int, JobOutcome] = {}
        self._registering = 0
        self._converts = type(self)._convert is not _JobPool._convert
        self._ready: deque[JobOutcome] = deque()
        self._batch_pending = 0
        self._inflight = 0
        self._closed = False
        self._close_lock = threading.Lock()
        self._loops: dict[int, asyncio.AbstractEventLoop] = {}
        self._outbox: dict[asyncio.AbstractEventLoop, list[list]] = {}
        self._room_queue: deque[tuple[asyncio.AbstractEventLoop, list]] = deque()
        self._dispatcher: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None
        self._latencies: deque[float] = deque(maxlen=_LATENCY_WINDOW)
        # Observers of submissions and outcomes (metrics, traces): see `add_observer`.
        self._observers: tuple[Any, ...] = ()
        # Written once by `close`: wakes threads waiting in `_wait` on the completion fd.
        self._kick = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        weakref.finalize(self, _close_fds, *self._kick)
        # A child made with fork() gets a copy of this object but not the worker threads.
        self._pid = os.getpid()
        closing.track(self)

    # ---- what a subclass provides
    def _convert(self, value: Any) -> Any:
        """The user-facing result of a completed job."""
        return value

    # ---- admission
    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise PoolClosed(
                f"this pool belongs to process {self._pid}: a child made with fork() cannot "
                "use it (its workers stayed in the parent); create a new pool in the child"
            )

    def _admit(self, n: int) -> None:
        self._check_process()
        if n > self._capacity:
            raise ValueError(f"a batch of {n} jobs is larger than the pool's capacity")
        deadline = None if self._block_timeout is None else time.monotonic() + self._block_timeout
        while True:
            with self._lock:
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

    def _release(self, n: int) -> list[tuple[asyncio.AbstractEventLoop, list]]:
        """Frees room for ``n`` jobs (lock held) and admits asyncio jobs waiting for room, in
        order; returns them for :meth:`_wake_waiters`."""
        self._inflight -= n
        admitted = []
        queue = self._room_queue
        while queue and self._inflight < self._capacity:
            loop, slot = queue.popleft()
            if slot[2] == 0 and not slot[1].done():
                slot[2] = -1
                self._inflight += 1
                admitted.append((loop, slot))
        return admitted

    def _wake_waiters(self, admitted: list[tuple[asyncio.AbstractEventLoop, list]]) -> None:
        for loop, slot in admitted:
            _call_in_loop(loop, self._enqueue, loop, slot)

    # ---- submission
    def _submit(self, items: list, handlers: list | None) -> list[int]:
        """Submits admitted ``items``; ``handlers`` (one per item) receive the outcomes, or
        they go to :meth:`collect` if None. Un-admits what is refused.

        Only handlers are registered by id. A result drained while a handler submission is
        between the core's ``submit_many`` and its registration waits in ``_early``; once no
        such submission is in progress, whatever is left there belongs to ``collect``."""
        n = len(items)
        with self._lock:
            if handlers is None:
                self._batch_pending += n
            else:
                self._registering += 1
        accepted: list[int] = []
        try:
            accepted = ids = self._core.submit_many(items)
            if self._observers:
                self._notify("submitted", ids, items)
            return ids
        except (PoolFull, PoolClosed) as e:
            accepted = list(e.args[1]) if len(e.args) > 1 else []
            err = type(e)(e.args[0])
            err.accepted = len(accepted)
            raise err from None
        finally:
            self._registered(accepted, n, handlers)

    def _registered(self, ids: list[int], n: int, handlers: list | None) -> None:
        late, batch = [], []
        with self._lock:
            if handlers is None:
                self._batch_pending -= n - len(ids)
            else:
                early = self._early
                for jid, h in zip(ids, handlers, strict=False):  # ids may be a prefix
                    if jid in early:
                        late.append((h, early.pop(jid)))
                    else:
                        self._handlers[jid] = h
                self._registering -= 1
                if not self._registering and early:
                    batch, self._early = list(early.values()), {}
            waiters = self._release(n - len(ids)) if len(ids) < n else []
            if late:
                waiters += self._release(len(late))
            if batch:
                self._batch_pending -= len(batch)
                self._ready.extend(batch)
                self._cond.notify_all()
        self._wake_waiters(waiters)
        for h, o in late:
            _settle(h, o)

    # ---- outcomes
    def _drain(self, max_n: int | None = None) -> int:
        raw = self._core.collect(max_n, 0.0)
        if raw:
            self._route(raw)
        return len(raw)

    def _route(self, raw: list[JobOutcome]) -> None:
        """Hands each outcome to its future, or to :meth:`collect`."""
        if self._converts:
            conv, done = self._convert, JobStatus.COMPLETED
            raw = [o if o[1] is not done else o._replace(result=conv(o[2])) for o in raw]
        if self._observers:
            self._notify("finished", raw)
        deliver = []
        with self._lock:
            if self._handlers or self._registering:
                pop, early, ready = self._handlers.pop, self._early, self._ready
                for o in raw:
                    h = pop(o[0], None)
                    if h is not None:
                        deliver.append((h, o))
                    elif self._registering:
                        early[o[0]] = o
                    else:
                        self._batch_pending -= 1
                        ready.append(o)
            else:
                self._batch_pending -= len(raw)
                self._ready.extend(raw)
            waiters = self._release(len(deliver)) if deliver else []
            self._cond.notify_all()
        self._wake_waiters(waiters)
        running = _running_loop()
        for h, o in deliver:
            _settle(h, o, running)

    def _wait(self, pred: Callable[[], bool], deadline: float | None) -> bool:
        """Waits until ``pred()`` (checked under the lock) or the deadline; drains the
        completion fd itself unless the dispatcher thread does."""
        poller = None
        while True:
            with self._lock:
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

    def _start_async(self, item: Any) -> asyncio.Future:
        """A future of the job, on the running loop. Jobs started during one iteration of the
        loop are submitted together; with ``backpressure="block"`` a job waits for room
        without blocking the loop. Cancelling the future cancels the job."""
        import asyncio

        loop = asyncio.get_running_loop()
        self._check_process()
        if self._closed:
            raise PoolClosed("the pool is closed")
        self._attach(loop)
        fut = loop.create_future()
        # slot[2]: 0 waiting for room, -1 admitted, -2 gave up, or the job id
        slot = [item, fut, 0, None]
        slot[3] = cb = functools.partial(self._async_done, slot)
        with self._lock:
            if self._inflight < self._capacity:
                self._inflight += 1
                slot[2] = -1
            elif not self._block:
                raise PoolFull(f"the pool holds {self._inflight} of {self._capacity} jobs")
            else:
                self._room_queue.append((loop, slot))
        fut.add_done_callback(cb)
        if slot[2] == -1:
            self._enqueue(loop, slot)
        elif self._block_timeout is not None:
            loop.call_later(self._block_timeout, self._room_timeout, slot)
        return fut

    def _async_done(self, slot: list, fut: asyncio.Future) -> None:
        if fut.cancelled() and slot[2] > 0:
            self._core.cancel(slot[2])

    def _room_timeout(self, slot: list) -> None:
        with self._lock:
            if slot[2] != 0:
                return
            slot[2] = -2
        if not slot[1].done():
            slot[1].set_exception(PoolFull(f"no room within {self._block_timeout} s"))

    def _enqueue(self, loop: asyncio.AbstractEventLoop, slot: list) -> None:
        box = self._outbox.get(loop)
        if box is None:
            box = self._outbox[loop] = []
            loop.call_soon(self._flush, loop)
        box.append(slot)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Submits the jobs queued on ``loop`` in one crossing. If the batch is refused as
        invalid, each job is retried alone so that only the bad ones raise."""
        box = self._outbox.pop(loop, [])
        live = [s for s in box if not s[1].done()]
        if len(live) < len(box):
            with self._lock:
                admitted = self._release(len(box) - len(live))
            self._wake_waiters(admitted)
        if live and not self._submit_slots(loop, live):
            for slot in live:
                with self._lock:
                    self._inflight += 1  # `_submit` un-admitted the refused batch
                self._submit_slots(loop, [slot])

    def _submit_slots(self, loop: asyncio.AbstractEventLoop, slots: list[list]) -> bool:
        """False if a batch of several jobs was refused as invalid (nothing submitted)."""
        try:
            ids = self._submit([s[0] for s in slots], [(loop, s[1], s[3]) for s in slots])
        except (ValueError, TypeError) as e:
            if len(slots) > 1:
                return False
            slots[0][1].set_exception(e)
        except BaseException as e:  # closed or full: the jobs not taken fail with it
            for s in slots[getattr(e, "accepted", 0) :]:
                if not s[1].done():
                    s[1].set_exception(e)
        else:
            for s, jid in zip(slots, ids, strict=True):
                s[2] = jid
        return True

    # ---- concurrent.futures
    def _ensure_dispatcher(self) -> None:
        if self._dispatcher is not None:
            return
        with self._lock:
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
        self._check_process()
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
        with self._lock:
            ready = self._ready
            if max is None or max >= len(ready):
                out, n = list(ready), len(ready)
                ready.clear()
            else:
                out, n = [ready.popleft() for _ in range(max)], max
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

    def _notify(self, what: str, *args: Any) -> None:
        """Calls every observer's ``what``; an observer that raises loses its own record,
        never a job's outcome."""
        for ob in self._observers:
            try:
                getattr(ob, what)(*args)
            except Exception:
                _log_observer_error(ob, what)

    def add_observer(self, observer: Any) -> None:
        """Adds an observer of this pool's jobs (:mod:`agentrl.observability`): its
        ``submitted(ids, items)`` is called with the ids and items of each accepted batch, its
        ``finished(outcomes)`` with each batch of :class:`JobOutcome` as they are routed (an
        outcome may come before its submission is reported). Both run on the pool's own
        threads and must be cheap and must not raise."""
        if not callable(getattr(observer, "submitted", None)) or not callable(
            getattr(observer, "finished", None)
        ):
            raise TypeError("an observer needs submitted(ids, items) and finished(outcomes)")
        with self._lock:
            if observer not in self._observers:
                self._observers = (*self._observers, observer)

    def remove_observer(self, observer: Any) -> None:
        """Removes an observer added with :meth:`add_observer` (no error if absent)."""
        with self._lock:
            self._observers = tuple(o for o in self._observers if o is not observer)

    def stats(self) -> dict[str, Any]:
        """Queue depths per priority, running jobs, worker utilisation, jobs per second,
        outcome counts, jobs waiting in futures or for :meth:`collect`, and the percentiles of
        the completed jobs' wall time (``latency_s``, the last 10 000 jobs)."""
        s = self._core.stats()
        with self._lock:
            s["capacity"] = self._capacity
            s["inflight"] = self._inflight
            s["futures"] = len(self._handlers)
            s["uncollected"] = len(self._ready)
            s["closed"] = self._closed
        s["latency_s"] = percentiles(list(self._latencies))
        return s

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, drain: bool = True) -> None:
        """Stops the pool and loses nothing: with ``drain`` every accepted job still runs;
        without, queued and running jobs end ``cancelled``. Every future is resolved when this
        returns; outcomes of ``submit_many`` jobs stay available to :meth:`collect`.
        Idempotent; blocks until the workers stop (use :meth:`aclose` in a coroutine)."""
        if not isinstance(drain, bool):  # "no" must not drain, nor 0 cancel, by accident
            raise TypeError(f"drain must be True or False, got {drain!r}")
        if os.getpid() != self._pid:
            self._closed = True  # the parent's workers are not ours to stop
            return
        with self._close_lock:
            with self._lock:
                self._closed = True
                waiting = [(lp, sl) for lp, sl in self._room_queue if sl[2] == 0]
                for _, sl in waiting:
                    sl[2] = -2
                self._room_queue.clear()
                self._cond.notify_all()
            for lp, sl in waiting:
                _call_in_loop(lp, _fail, sl[1], PoolClosed("the pool is closed"))
            os.write(self._kick[1], b"x")
            self._core.close(drain)
            while self._drain():
                pass
            self._stop_dispatcher()
            for loop in list(self._loops.values()):
                if not loop.is_closed():
                    _call_in_loop(loop, loop.remove_reader, self._fd)
            self._loops.clear()
            self._after_close()
            closing.untrack(self)

    def _close_at_exit(self) -> None:
        self.close(drain=False)

    def _stop_dispatcher(self) -> None:
        t, wake = self._dispatcher, self._wake
        if t is None or wake is None:
            return
        os.write(wake[1], b"x")
        if t is not threading.current_thread():
            t.join()
        os.close(wake[0])
        os.close(wake[1])
        with self._lock:
            self._wake = None
            self._dispatcher = None
            self._cond.notify_all()

    def _after_close(self) -> None:
        pass

    async def aclose(self, drain: bool = True) -> None:
        """:meth:`close` without blocking the running event loop."""
        import asyncio

        await asyncio.get_running_loop().run_in_executor(None, self.close, drain)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(drain=exc_type is None)

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        await self.aclose(drain=exc_type is None)
