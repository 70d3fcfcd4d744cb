"""Rollout scheduling: many concurrent episodes, batched generation, overlapped environment.

Each episode alternates a *generation step* (the policy produces an action for the latest
observation) and an *environment step* (``env.step(action)``, typically sandbox jobs on a
:class:`agentrl.SandboxPool`). The scheduler batches the episodes waiting for generation,
so the generator (an inference server, a model in this process) sees full batches while the
environment steps of other episodes run on the pool: generation and execution overlap.

Usage::

    async def generate(episodes):           # or a plain function: it runs in a thread
        return [policy(ep.observation) for ep in episodes]

    class CodeEnv:
        def __init__(self, task, pool): ...
        async def reset(self, task): return task.prompt
        async def step(self, action):
            r = await self.pool.run_python(action)
            return r.stdout, float(r.ok), True, {"status": r.status}

    async with SandboxPool() as pool, RolloutScheduler(
        generate, lambda task: CodeEnv(task, pool), pool=pool,
        config=SchedulerConfig(batch_size=64, max_staleness=1),
    ) as sched:
        sched.feed(tasks, group_size=8)
        async for group in sched.groups():
            train(group)
            sched.set_policy_version(sched.version + 1)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import itertools
import logging
import time
import traceback
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from typing import Any

from agentrl.observability.context import job_context
from agentrl.pool.engine import percentiles
from agentrl.rollout.config import SchedulerConfig
from agentrl.rollout.episode import Episode, EpisodeGroup, EpisodeStatus, Turn
from agentrl.sandbox.args import check_int

__all__ = [
    "Episode",
    "EpisodeGroup",
    "EpisodeStatus",
    "RolloutScheduler",
    "SchedulerConfig",
    "Turn",
]

log = logging.getLogger("agentrl.scheduler")  # the logger name from before the move


_END = object()


class _EpisodeCancelled(Exception):
    """A sandbox job of the episode was cancelled by someone else (not an abort)."""


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - callable objects with an async __call__
    )


class RolloutScheduler:
    """Runs episodes concurrently; see the module docs and :class:`SchedulerConfig`.

    ``generate(episodes) -> actions``: one action per episode, in order (an exception
    instance in place of an action fails that episode only); a coroutine function is
    awaited on the loop, a plain function runs in a thread. ``env_factory(task)`` makes the
    environment of one episode: ``reset(task) -> observation`` and ``step(action) ->
    (observation, reward, done[, info])``, async or plain (a reward of None is *masked*: no
    trustworthy signal, e.g. the sandbox failed; the episode is delivered with
    :attr:`Episode.masked` set and ``info["masked"]`` as its reason, never scored 0); its
    optional ``close()`` is called at the end. ``pool``: the executor the environments use (a :class:`SandboxPool`, a
    :class:`agentrl.distributed.RayPool`, any :class:`agentrl.pool.Executor`), for stats.

    Use it inside a running loop (``async with``), feed tasks with :meth:`submit_group` or
    :meth:`feed`, consume :meth:`groups`. Only the loop thread may call its methods.
    """

    def __init__(
        self,
        generate: Callable[[list[Episode]], Any],
        env_factory: Callable[[Any], Any],
        *,
        pool: Any = None,
        config: SchedulerConfig | None = None,
        version: int = 0,
    ) -> None:
        if not callable(generate):
            raise TypeError(f"generate must be callable, got {type(generate).__name__}")
        if not callable(env_factory):
            raise TypeError(f"env_factory must be callable, got {type(env_factory).__name__}")
        if config is not None and not isinstance(config, SchedulerConfig):
            raise TypeError(f"config must be a SchedulerConfig, got {type(config).__name__}")
        check_int("version", version, 0, None)
        self.config = config or SchedulerConfig()
        self.pool = pool
        self._generate = generate
        self._gen_async = _is_async(generate)
        self._env_factory = env_factory
        self._version = version
        self._ids = itertools.count(1)
        self._group_ids = itertools.count(1)
        self._pending: deque[Episode] = deque()
        self._groups: dict[int, tuple[EpisodeGroup, list[int]]] = {}
        self._tasks: dict[int, tuple[Episode, asyncio.Task]] = {}
        self._abort: set[int] = set()
        self._ready: deque[tuple[Episode, asyncio.Future]] = deque()
        self._ready_event: asyncio.Event | None = None
        self._full_event: asyncio.Event | None = None
        self._want_tasks: asyncio.Event | None = None
        self._output: asyncio.Queue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bg: set[asyncio.Task] = set()
        self._feeders = 0
        self._input_ended = False
        self._exhausted = False
        self._closed = False
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # Counters.
        self._started = 0
        self._inflight = 0
        self._in_generation = 0
        self._in_env = 0
        self._delivering = 0
        self._n = dict.fromkeys(
            (
                "episodes",
                "failed",
                "truncated",
                "masked",
                "aborted",
                "groups",
                "gen_calls",
                "gen_items",
            ),
            0,
        )
        self._idle_s = 0.0
        self._t0 = time.monotonic()
        self._env_latency: deque[float] = deque(maxlen=10_000)

    # ---- lifecycle
    async def start(self) -> RolloutScheduler:
        """Starts the generation workers on the running loop (``async with`` does this)."""
        if self._loop is not None:
            return self
        self._loop = asyncio.get_running_loop()
        self._ready_event, self._full_event = asyncio.Event(), asyncio.Event()
        self._want_tasks = asyncio.Event()
        self._output = asyncio.Queue(self.config.output_capacity)
        if not self._gen_async:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                self.config.generate_concurrency, thread_name_prefix="agentrl-generate"
            )
        self._t0 = time.monotonic()
        for _ in range(self.config.generate_concurrency):
            self._spawn(self._generation_worker())
        self._admit()
        return self

    async def __aenter__(self) -> RolloutScheduler:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stops everything: unfinished episodes are dropped (their sandbox jobs cancelled),
        groups already delivered stay readable from :meth:`groups`. Idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks = [t for _, t in self._tasks.values()] + list(self._bg)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        if self._executor is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)
        self._exhausted = True
        if self._output is not None and not self._output.full():
            self._output.put_nowait(_END)  # wakes a consumer blocked in `groups`

    def _spawn(self, coro: Any) -> asyncio.Task:
        assert self._loop is not None
        t = self._loop.create_task(coro)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)
        return t

    # ---- input
    def submit_group(self, task: Any, n: int = 1) -> int:
        """Queues ``n`` episodes of ``task`` that leave together as one group; returns its id."""
        if self._input_ended:
            raise RuntimeError("the scheduler takes no more tasks")
        return self._submit_group(task, n)

    def _submit_group(self, task: Any, n: int) -> int:
        if self._closed:
            raise RuntimeError("the scheduler is closed")
        c = self.config
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        if c.max_staleness is not None and n > (c.max_staleness + 1) * c.batch_size:
            raise ValueError(f"a group of {n} exceeds the staleness window of one version")
        gid = next(self._group_ids)
        eps = [Episode(next(self._ids), gid, i, task) for i in range(n)]
        self._groups[gid] = (EpisodeGroup(gid, task, eps), [0])
        self._pending.extend(eps)
        self._admit()
        return gid

    def feed(
        self, tasks: Iterable[Any] | AsyncIterable[Any], group_size: int = 1, *, last: bool = True
    ) -> asyncio.Task:
        """Submits a group per task, pulling the next task only when admission needs one (an
        endless iterator is fine). With ``last``, the input ends after it (see :meth:`groups`)."""
        if self._loop is None:
            raise RuntimeError("start the scheduler first")
        if self._input_ended:
            raise RuntimeError("the scheduler takes no more tasks")
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive int, got {group_size!r}")
        self._feeders += 1
        return self._spawn(self._feed(tasks, group_size, last))

    async def _feed(self, tasks: Any, n: int, last: bool) -> None:
        assert self._want_tasks is not None
        try:
            it = tasks.__aiter__() if isinstance(tasks, AsyncIterable) else iter(tasks)
            while True:
                while len(self._pending) >= max(self.config.max_batch, n):
                    self._want_tasks.clear()
                    await self._want_tasks.wait()
                try:
                    task = await it.__anext__() if hasattr(it, "__anext__") else next(it)
                except (StopIteration, StopAsyncIteration):
                    break
                self._submit_group(task, n)
        finally:
            self._feeders -= 1
            if last:
                self.end_input()

    def end_input(self) -> None:
        """No more tasks: :meth:`groups` ends once every queued episode is delivered."""
        self._input_ended = True
        self._maybe_end()

    # ---- admission
    def _bound(self) -> int | None:
        c = self.config
        if c.max_staleness is None:
            return None
        return (c.max_staleness + self._version + 1) * c.batch_size

    def _admit(self) -> None:
        if self._loop is None or self._closed:
            return
        bound = self._bound()
        while self._pending and self._inflight < self.config.max_inflight:
            ep = self._pending[0]
            if ep.admitted_as < 0:
                if bound is not None and self._started >= bound:
                    break
                self._started += 1
                ep.admitted_as = self._started
            self._pending.popleft()
            self._inflight += 1
            ep.status, ep.start_version = EpisodeStatus.RUNNING, self._version
            task = self._loop.create_task(self._episode(ep))
            task.add_done_callback(functools.partial(self._episode_done, ep))
            self._tasks[ep.id] = (ep, task)
        if self._want_tasks is not None and len(self._pending) < self.config.max_batch:
            self._want_tasks.set()

    def set_policy_version(self, version: int) -> None:
        """The trainer has new weights: widens the staleness window and, with
        ``on_policy_update="abort"``, aborts and re-queues the unfinished episodes."""
        if version < self._version:
            raise ValueError(f"policy versions only grow ({self._version} -> {version})")
        old, self._version = self._version, int(version)
        if self.config.on_policy_update == "abort" and version > old:
            for ep, t in list(self._tasks.values()):
                if ep.status is EpisodeStatus.RUNNING and ep.id not in self._abort:
                    self._abort.add(ep.id)
                    t.cancel()
        self._admit()

    @property
    def version(self) -> int:
        """The current policy version."""
        return self._version

    # ---- episodes
    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if _is_async(fn):
            return await fn(*args)
        if self.config.sync_env_in_thread:  # in this context (job_context), as async steps
            call = functools.partial(contextvars.copy_context().run, fn, *args)
            return await asyncio.get_running_loop().run_in_executor(None, call)
        r = fn(*args)
        return await r if inspect.isawaitable(r) else r

    async def _episode(self, ep: Episode) -> bool:
        """Runs one attempt of ``ep``; true if it was aborted by a policy update."""
        env = None
        try:
            env = self._env_factory(ep.task)
            ep.observation = await self._guard(ep, self._call(env.reset, ep.task))
            limit = self.config.max_turns
            while True:
                if limit is not None and len(ep.turns) >= limit:
                    ep.status = EpisodeStatus.TRUNCATED
                    break
                action, version = await self._guard(ep, self._request_generation(ep))
                t0 = time.monotonic()
                self._in_env += 1
                try:
                    # the step's sandbox jobs carry the episode's ids (traces, metrics)
                    with job_context(episode=ep.id, group=ep.group_id, policy_version=version):
                        out = await self._guard(ep, self._call(env.step, action))
                finally:
                    self._in_env -= 1
                self._env_latency.append(time.monotonic() - t0)
                obs, reward, done, *rest = out
                # None is a masked reward (no trustworthy signal), kept as None, never 0.
                reward = None if reward is None else float(reward)
                ep.turns.append(Turn(ep.observation, action, version, reward, *rest[:1]))
                ep.observation = obs
                if done:
                    ep.status = EpisodeStatus.DONE
                    break
        except asyncio.CancelledError:
            if ep.id not in self._abort or self._closed:
                raise
            task = asyncio.current_task()
            if task is not None and hasattr(task, "uncancel"):
                task.uncancel()
            return True
        except Exception as e:
            ep.status, ep.error = EpisodeStatus.FAILED, e
            ep.traceback = traceback.format_exc()
            log.warning("episode %d (group %d) failed: %r", ep.id, ep.group_id, e)
        finally:
            if env is not None and hasattr(env, "close"):
                with contextlib.suppress(Exception):
                    await self._call(env.close)
        return False

    def _episode_done(self, ep: Episode, task: asyncio.Task) -> None:
        """Done callback of an episode's task (also of one cancelled before it ran)."""
        self._tasks.pop(ep.id, None)
        aborting = ep.id in self._abort
        self._abort.discard(ep.id)
        if self._closed:
            return
        if task.cancelled():
            aborted = aborting
        elif task.exception() is not None:  # a BaseException the episode did not catch
            ep.status, ep.error, aborted = EpisodeStatus.FAILED, task.exception(), False
        else:
            aborted = task.result()
        self._inflight -= 1
        if aborted:
            ep.turns, ep.observation, ep.status = [], None, EpisodeStatus.PENDING
            ep.restarts += 1
            self._n["aborted"] += 1
            self._pending.appendleft(ep)
        else:
            self._finished(ep)
        self._admit()

    async def _guard(self, ep: Episode, aw: Any) -> Any:
        """Awaits ``aw``. The scheduler cancels an episode only to abort it or to close; any
        other cancellation (a sandbox job cancelled through the pool) fails the episode."""
        try:
            return await aw
        except asyncio.CancelledError:
            if self._closed or ep.id in self._abort:
                raise
            raise _EpisodeCancelled("a job of the episode was cancelled") from None

    def _finished(self, ep: Episode) -> None:
        self._n["episodes"] += 1
        if ep.status is EpisodeStatus.FAILED:
            self._n["failed"] += 1
        elif ep.status is EpisodeStatus.TRUNCATED:
            self._n["truncated"] += 1
        if ep.masked:
            self._n["masked"] += 1
        group, left = self._groups[ep.group_id]
        left[0] += 1
        if left[0] == len(group.episodes):
            del self._groups[ep.group_id]
            n = len(group.episodes)
            self._inflight += n  # held until the group is on the output queue
            self._delivering += 1
            self._spawn(self._deliver(group, n))

    async def _deliver(self, group: EpisodeGroup, n: int) -> None:
        assert self._output is not None
        try:
            await self._output.put(group)
            self._n["groups"] += 1
        finally:
            self._delivering -= 1
            self._inflight -= n
        self._admit()
        self._maybe_end()

    def _maybe_end(self) -> None:
        if (
            self._input_ended
            and self._feeders == 0
            and not self._pending
            and self._inflight == 0
            and not self._groups
            and not self._exhausted
            and not self._closed
            and self._output is not None
        ):
            self._exhausted = True
            self._spawn(self._output.put(_END))

    async def groups(self) -> AsyncIterator[EpisodeGroup]:
        """Finished groups, as they finish. Ends after :meth:`end_input` (or a ``feed`` with
        ``last=True``) once everything has been delivered, or after :meth:`aclose`."""
        if self._output is None:
            raise RuntimeError("start the scheduler first")
        while True:
            if self._closed and self._output.empty():
                return
            item = await self._output.get()
            if item is _END:
                return
            yield item

    # ---- generation
    async def _request_generation(self, ep: Episode) -> tuple[Any, int]:
        assert self._loop is not None and self._ready_event is not None
        fut = self._loop.create_future()
        self._ready.append((ep, fut))
        self._ready_event.set()
        if len(self._ready) >= self.config.max_batch and self._full_event is not None:
            self._full_event.set()
        return await fut

    async def _generation_worker(self) -> None:
        assert self._ready_event is not None and self._full_event is not None
        c = self.config
        while True:
            if not self._ready:
                self._ready_event.clear()
                t0 = time.monotonic()
                await self._ready_event.wait()
                self._idle_s += time.monotonic() - t0
            if len(self._ready) < c.max_batch and c.batch_wait_s > 0:
                self._full_event.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._full_event.wait(), c.batch_wait_s)
            batch = []
            while self._ready and len(batch) < c.max_batch:
                ep, fut = self._ready.popleft()
                if not fut.done():
                    batch.append((ep, fut))
            if batch:
                await self._run_generation(batch)

    async def _generate_call(self, episodes: list[Episode]) -> list[Any]:
        if self._gen_async:
            out = await self._generate(episodes)
        else:
            loop = asyncio.get_running_loop()
            out = await loop.run_in_executor(self._executor, self._generate, episodes)
        out = list(out)
        if len(out) != len(episodes):
            raise ValueError(f"generate returned {len(out)} actions for {len(episodes)} episodes")
        return out

    async def _run_generation(self, batch: list[tuple[Episode, asyncio.Future]]) -> None:
        version = self._version
        self._in_generation += len(batch)
        self._n["gen_calls"] += 1
        self._n["gen_items"] += len(batch)
        try:
            try:
                results = await self._generate_call([ep for ep, _ in batch])
            except Exception as e:
                if not self.config.isolate_generation_errors or len(batch) == 1:
                    results = [e] * len(batch)
                else:
                    singles = [self._generate_call([ep]) for ep, _ in batch]
                    outs = await asyncio.gather(*singles, return_exceptions=True)
                    results = [o if isinstance(o, BaseException) else o[0] for o in outs]
        finally:
            self._in_generation -= len(batch)
        for (_, fut), r in zip(batch, results, strict=True):
            if fut.done():  # aborted meanwhile
                continue
            if isinstance(r, BaseException):
                fut.set_exception(r)
            else:
                fut.set_result((r, version))

    # ---- metrics
    def stats(self) -> dict[str, Any]:
        """Queue depths, generator idle fraction, environment step latency, episodes and
        groups per second, staleness accounting, and the pool's stats (``pool``)."""
        elapsed = max(1e-9, time.monotonic() - self._t0)
        n = self._n
        s: dict[str, Any] = {
            "version": self._version,
            "pending": len(self._pending),
            "inflight": self._inflight,
            "waiting_generation": len(self._ready),
            "in_generation": self._in_generation,
            "in_env": self._in_env,
            "delivering": self._delivering,
            "output_queue": 0 if self._output is None else self._output.qsize(),
            "started": self._started,
            "staleness_bound": self._bound(),
            "episodes_finished": n["episodes"],
            "episodes_failed": n["failed"],
            "episodes_truncated": n["truncated"],
            "episodes_masked": n["masked"],
            "episodes_aborted": n["aborted"],
            "groups_delivered": n["groups"],
            "generate_calls": n["gen_calls"],
            "mean_generate_batch": n["gen_items"] / n["gen_calls"] if n["gen_calls"] else 0.0,
            "generator_idle_fraction": min(
                1.0, self._idle_s / (elapsed * self.config.generate_concurrency)
            ),
            "episodes_per_sec": n["episodes"] / elapsed,
            "groups_per_sec": n["groups"] / elapsed,
            "env_step_latency_s": percentiles(list(self._env_latency)),
            "elapsed_s": elapsed,
        }
        if self.pool is not None:
            ps = self.pool.stats()
            s["pool"] = ps
            s["jobs_per_sec"] = ps.get("jobs_per_sec")  # any Executor: these may be missing
            s["worker_utilisation"] = ps.get("utilisation")
        return s
