"""RolloutScheduler: batched generation, groups leaving as units, failures confined to their
episode, the staleness bound under random version bumps (continue and abort), real sandbox
environments on the default loop and on uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

import pytest
import uvloop
from agentrl import (
    Episode,
    EpisodeStatus,
    RolloutScheduler,
    Sandbox,
    SandboxPool,
    SchedulerConfig,
)
from hypothesis import given, settings
from hypothesis import strategies as st


def _run(coro: Any, use_uvloop: bool = False) -> Any:
    loop = uvloop.new_event_loop() if use_uvloop else asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


class CountEnv:
    """Ends after ``turns`` steps; reward 1 per step; raises on the action "boom"."""

    def __init__(self, task: Any, turns: int = 3, delay: float = 0.0) -> None:
        self.turns, self.delay, self.t = turns, delay, 0

    async def reset(self, task: Any) -> int:
        return 0

    async def step(self, action: Any) -> tuple[int, float, bool, dict]:
        if self.delay:
            await asyncio.sleep(self.delay)
        if action == "boom":
            raise RuntimeError("env boom")
        self.t += 1
        return self.t, 1.0, self.t >= self.turns, {"t": self.t}


async def _collect(sched: RolloutScheduler, bump: Any = None) -> list:
    out = []
    async for g in sched.groups():
        out.append(g)
        if bump is not None:
            bump(sched, g)
    return out


def test_groups_leave_together_and_batches_fill() -> None:
    calls: list[int] = []

    def generate(eps: list[Episode]) -> list[str]:  # plain function: runs in a thread
        calls.append(len(eps))
        time.sleep(0.003)
        return ["a"] * len(eps)

    async def main() -> None:
        cfg = SchedulerConfig(batch_size=8, max_staleness=None, max_batch=8, batch_wait_s=0.01)
        async with RolloutScheduler(generate, CountEnv, config=cfg) as s:
            s.feed(range(12), group_size=4)
            groups = await _collect(s)
            st_ = s.stats()
        assert sorted(g.task for g in groups) == list(range(12))
        for g in groups:
            assert [e.index for e in g.episodes] == [0, 1, 2, 3]
            assert all(e.status is EpisodeStatus.DONE and len(e.turns) == 3 for e in g.episodes)
            assert all(e.total_reward == 3.0 and e.turns[0].info == {"t": 1} for e in g.episodes)
        assert max(calls) == 8 and sum(calls) == 12 * 4 * 3
        assert st_["mean_generate_batch"] > 4
        assert st_["episodes_finished"] == 48 and st_["groups_delivered"] == 12
        assert 0.0 <= st_["generator_idle_fraction"] <= 1.0
        assert st_["env_step_latency_s"]["n"] == 144 and st_["episodes_per_sec"] > 0
        assert st_["inflight"] == st_["pending"] == st_["waiting_generation"] == 0

    _run(main())


def test_generation_error_fails_only_its_episode() -> None:
    async def generate(eps: list[Episode]) -> list[Any]:
        if any(e.task == "bad" and e.index == 1 for e in eps):
            raise ValueError("generator broke")
        return ["a"] * len(eps)

    async def main() -> None:
        cfg = SchedulerConfig(max_batch=16, batch_wait_s=0.005)
        async with RolloutScheduler(generate, CountEnv, config=cfg) as s:
            for t in ("x", "bad", "y"):
                s.submit_group(t, 3)
            s.end_input()
            groups = {g.task: g for g in await _collect(s)}
        assert groups["x"].ok and groups["y"].ok
        bad = groups["bad"]
        assert [e.index for e in bad.failed] == [1]
        e = bad.failed[0]
        assert isinstance(e.error, ValueError) and "generator broke" in e.traceback
        assert all(x.status is EpisodeStatus.DONE for x in bad.episodes if x.index != 1)
        assert s.stats()["episodes_failed"] == 1

    _run(main())


def test_per_episode_exception_values_and_env_errors() -> None:
    def generate(eps: list[Episode]) -> list[Any]:
        return [
            KeyError("no tokens")
            if e.task == "k"
            else ("boom" if e.task == "e" and e.index == 0 else "a")
            for e in eps
        ]

    async def main() -> None:
        async with RolloutScheduler(generate, CountEnv, config=SchedulerConfig()) as s:
            for t in ("k", "e", "ok"):
                s.submit_group(t, 2)
            s.end_input()
            groups = {g.task: g for g in await _collect(s)}
        assert len(groups["k"].failed) == 2
        assert isinstance(groups["k"].failed[0].error, KeyError)
        assert [e.index for e in groups["e"].failed] == [0]
        assert str(groups["e"].failed[0].error) == "env boom"
        assert groups["ok"].ok

    _run(main())


def test_masked_reward_is_kept_as_none_not_zero() -> None:
    class FlakyEnv(CountEnv):
        async def step(self, action: Any) -> tuple[int, float | None, bool, dict]:
            if action == "infra":  # the environment could not judge this step
                return 0, None, True, {"masked": "sandbox_error: slot died"}
            return await super().step(action)

    def generate(eps: list[Episode]) -> list[str]:
        return ["infra" if e.index == 1 else "a" for e in eps]

    async def main() -> None:
        cfg = SchedulerConfig(batch_size=4, max_staleness=None)
        async with RolloutScheduler(generate, lambda t: FlakyEnv(t, turns=2), config=cfg) as s:
            s.feed(range(2), group_size=3)
            groups = await _collect(s)
            stats = s.stats()
        assert stats["episodes_masked"] == 2 and stats["episodes_failed"] == 0
        for g in groups:
            masked = g.episodes[1]
            assert masked.status is EpisodeStatus.DONE and masked.masked
            assert masked.total_reward is None and masked.turns[-1].reward is None
            assert masked.mask_reason == "sandbox_error: slot died"
            assert [e.index for e in g.usable] == [0, 2]
            assert all(e.total_reward == 2.0 and not e.masked for e in g.usable)

    _run(main())


def test_max_turns_truncates_and_sync_env_runs_in_thread() -> None:
    import threading

    main_thread = threading.get_ident()

    class SyncEnv:
        def __init__(self, task: Any) -> None:
            pass

        def reset(self, task: Any) -> str:
            return "start"

        def step(self, action: Any) -> tuple[str, float, bool]:
            assert threading.get_ident() != main_thread
            return "obs", 0.5, False

    async def main() -> None:
        cfg = SchedulerConfig(max_turns=4)
        async with RolloutScheduler(lambda eps: [1] * len(eps), SyncEnv, config=cfg) as s:
            s.submit_group("t", 2)
            s.end_input()
            (g,) = await _collect(s)
        assert all(e.status is EpisodeStatus.TRUNCATED and len(e.turns) == 4 for e in g.episodes)
        assert g.episodes[0].turns[0].observation == "start" and g.episodes[0].total_reward == 2.0

    _run(main())


@settings(max_examples=80, deadline=None)
@given(
    staleness=st.integers(0, 2),
    batch=st.sampled_from([2, 4, 8]),
    group=st.sampled_from([1, 2]),
    mode=st.sampled_from(["continue", "abort"]),
    seed=st.integers(0, 2**16),
)
def test_staleness_bound_under_random_version_bumps(
    staleness: int, batch: int, group: int, mode: str, seed: int
) -> None:
    rng = random.Random(seed)
    n_tasks = 6 * batch // group
    observed: list[tuple[int, int | None]] = []

    async def generate(eps: list[Episode]) -> list[str]:
        await asyncio.sleep(rng.random() * 0.002)
        return ["a"] * len(eps)

    def env(task: Any) -> CountEnv:
        return CountEnv(task, turns=rng.randint(1, 3), delay=rng.random() * 0.002)

    consumed = [0]

    def bump(s: RolloutScheduler, g: Any) -> None:
        # A trainer steps after each batch of episodes; extra random bumps on top.
        consumed[0] += len(g.episodes)
        if consumed[0] >= batch or rng.random() < 0.3:
            consumed[0] = max(0, consumed[0] - batch)
            s.set_policy_version(s.version + rng.randint(1, 2))

    async def main() -> list:
        cfg = SchedulerConfig(
            batch_size=batch,
            max_staleness=staleness,
            max_batch=4,
            batch_wait_s=0.0005,
            max_inflight=64,
            on_policy_update=mode,
        )
        async with RolloutScheduler(generate, env, config=cfg) as s:
            s.feed(range(n_tasks), group_size=group)

            async def watch() -> None:
                while True:
                    st_ = s.stats()
                    observed.append((st_["started"], st_["staleness_bound"]))
                    await asyncio.sleep(0.0005)

            w = asyncio.ensure_future(watch())
            try:
                return await asyncio.wait_for(_collect(s, bump), 30)
            finally:
                w.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await w

    groups = _run(main())
    eps = [e for g in groups for e in g.episodes]
    assert len(eps) == n_tasks * group and all(e.status is EpisodeStatus.DONE for e in eps)
    assert sorted(e.admitted_as for e in eps) == list(range(1, len(eps) + 1))
    for e in eps:  # AReaL's rule, for every admission
        assert e.admitted_as <= (staleness + e.start_version + 1) * batch
        versions = [t.version for t in e.turns]
        assert versions == sorted(versions) and versions[0] >= e.start_version
        if mode == "abort":
            assert set(versions) == {e.start_version}  # an update aborts mixed episodes
    assert all(started <= bound for started, bound in observed if bound is not None)


def test_abort_requeues_and_cancels_sandbox_jobs(sb: Sandbox) -> None:
    async def main() -> None:
        async with SandboxPool(sandbox=sb, workers=2) as pool:

            class SleepEnv:
                def __init__(self, task: Any) -> None:
                    pass

                async def reset(self, task: Any) -> int:
                    return 0

                async def step(self, action: Any) -> tuple:
                    r = await pool.run(["/bin/sleep", action])
                    return r.status, 1.0, True, None

            def generate(eps: list[Episode]) -> list[str]:
                return ["30" if e.restarts == 0 else "0" for e in eps]

            cfg = SchedulerConfig(on_policy_update="abort", max_staleness=None)
            async with RolloutScheduler(generate, SleepEnv, pool=pool, config=cfg) as s:
                s.submit_group("t", 2)
                s.end_input()
                while pool.stats()["running"] < 2:
                    await asyncio.sleep(0.01)
                t0 = time.monotonic()
                s.set_policy_version(1)  # kills the 30 s boxes; the episodes start again
                (g,) = await asyncio.wait_for(_collect(s), 20)
                assert time.monotonic() - t0 < 5
                assert all(e.restarts == 1 and e.start_version == 1 for e in g.episodes)
                assert [t.action for t in g.episodes[0].turns] == ["0"]
                st_ = s.stats()
                assert st_["episodes_aborted"] == 2 and st_["pool"]["cancelled"] == 2
                assert "worker_utilisation" in st_ and "jobs_per_sec" in st_

    _run(main())


@pytest.mark.parametrize("use_uvloop", [False, True])
def test_sandbox_environment_overlaps_generation(sb: Sandbox, use_uvloop: bool) -> None:
    async def main() -> None:
        async with SandboxPool(sandbox=sb, workers=4) as pool:

            class PyEnv:
                def __init__(self, task: int) -> None:
                    self.task = task

                async def reset(self, task: int) -> str:
                    return f"compute {task}*2"

                async def step(self, code: str) -> tuple:
                    r = await pool.run_python(code)
                    ok = r.ok and r.stdout.strip() == str(self.task * 2).encode()
                    return r.stdout, float(ok), True, {"status": r.status}

            async def generate(eps: list[Episode]) -> list[str]:
                await asyncio.sleep(0.005)
                return [f"print({e.task} * 2)" for e in eps]

            cfg = SchedulerConfig(batch_size=8, max_batch=8)
            async with RolloutScheduler(generate, PyEnv, pool=pool, config=cfg) as s:
                s.feed(range(8), group_size=2)
                groups = await asyncio.wait_for(_collect(s), 60)
                st_ = s.stats()
        assert len(groups) == 8
        assert all(e.total_reward == 1.0 for g in groups for e in g.episodes)
        assert st_["pool"]["completed"] >= 16 and st_["pool"]["latency_s"]["n"] >= 16

    _run(main(), use_uvloop)


def test_job_cancelled_through_pool_fails_the_episode(sb: Sandbox) -> None:
    async def main() -> None:
        async with SandboxPool(sandbox=sb, workers=2) as pool:

            class Env:
                def __init__(self, task: Any) -> None:
                    self.task = task

                async def reset(self, task: Any) -> int:
                    return 0

                async def step(self, action: Any) -> tuple:
                    await pool.run(["/bin/sleep", action], group=self.task)
                    return 0, 1.0, True, None

            async with RolloutScheduler(
                lambda eps: ["30" if e.task == 5 else "0" for e in eps], Env
            ) as s:
                s.submit_group(5, 1)
                s.submit_group(6, 1)
                s.end_input()
                while pool.stats()["running"] < 1:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.05)
                assert pool.cancel(5) == 1
                groups = {g.task: g for g in await asyncio.wait_for(_collect(s), 20)}
        assert groups[6].ok and not groups[5].ok
        assert "cancelled" in str(groups[5].failed[0].error)

    _run(main())


def test_close_mid_run_does_not_hang() -> None:
    async def main() -> None:
        async def generate(eps: list[Episode]) -> list[str]:
            await asyncio.sleep(0.001)
            return ["a"] * len(eps)

        s = RolloutScheduler(generate, lambda t: CountEnv(t, turns=10**6))
        await s.start()
        s.feed(iter(int, 1), group_size=2)  # endless
        await asyncio.sleep(0.05)
        await asyncio.wait_for(s.aclose(), 5)
        assert [g async for g in s.groups()] == []
        with pytest.raises(RuntimeError):
            s.submit_group("x")

    _run(main())


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        SchedulerConfig(max_batch=0)
    with pytest.raises(ValueError):
        SchedulerConfig(on_policy_update="restart")
    with pytest.raises(ValueError):
        SchedulerConfig(max_staleness=-1)
    for args, kw, says in (
        ((5, CountEnv), {}, "generate"),
        ((lambda e: e, None), {}, "env_factory"),
        ((lambda e: e, CountEnv), {"config": {"batch_size": 2}}, "config"),
        ((lambda e: e, CountEnv), {"version": -1}, "version"),
        ((lambda e: e, CountEnv), {"version": "3"}, "version"),
    ):
        with pytest.raises((TypeError, ValueError), match=says):
            RolloutScheduler(*args, **kw)

    async def main() -> None:
        cfg = SchedulerConfig(batch_size=2, max_staleness=0)
        async with RolloutScheduler(lambda e: e, CountEnv, config=cfg) as s:
            with pytest.raises(ValueError):
                s.submit_group("t", 3)  # can never be admitted by one version
            with pytest.raises(ValueError):
                s.set_policy_version(-1)

    _run(main())
