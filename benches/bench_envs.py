"""Environment and adapter throughput: what the env layer adds on top of the Evaluator.

    python benches/bench_envs.py [--group 4] [--workers N] [--repeats 3]

Prints a markdown table: ShellEnv reset/step latency; HumanEval canonical solutions judged
directly (``Evaluator.judge_many``), as CodeEnv episodes driven by the RolloutScheduler, and
through the TRL reward functions (sync and async). Medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from agentrl import Limits, RolloutScheduler, Sandbox, SchedulerConfig
from agentrl.envs import CodeEnv, ShellEnv, ShellEnvConfig, ShellTask
from agentrl.evaluation import Evaluator, load_humaneval
from agentrl.integrations.trl import AsyncCodeReward, CodeReward


def _median_s(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def shell_rows(repeats: int) -> list[tuple[str, str]]:
    files = {f"src/f{i}.txt": "x" * 10_000 for i in range(200)}
    task = ShellTask("edit", files=files)
    cfg = ShellEnvConfig(max_steps=1000)
    with Sandbox(Limits(wall_time_s=5, cpu_time_s=2)) as sb, ShellEnv(sb, cfg) as env:
        t_new = _median_s(lambda: (env.close(), env.reset(task)), repeats)
        env.reset(task)
        env.step("rm -r src; echo y > new.txt")
        t_reset = _median_s(lambda: env.reset(task), max(repeats, 20))
        t_step = _median_s(lambda: env.step("true"), max(repeats, 20))
    return [
        ("ShellEnv reset, new session (200 files, 2 MB)", f"{t_new * 1e3:.1f} ms"),
        ("ShellEnv reset, same task (overlay reset)", f"{t_reset * 1e3:.2f} ms"),
        ("ShellEnv step (`true`)", f"{t_step * 1e3:.1f} ms"),
    ]


def code_rows(ev: Evaluator, group: int, repeats: int) -> list[tuple[str, str]]:
    tasks = load_humaneval()
    sols = {t.task_id: t.canonical_solution or "" for t in tasks}
    pairs = [(t, sols[t.task_id]) for t in tasks for _ in range(group)]
    n = len(pairs)

    def direct() -> None:
        js = ev.judge_many(pairs)
        assert all(j.passed for j in js)

    async def episodes() -> None:
        async def generate(eps: list[Any]) -> list[str]:
            return [sols[e.task.task_id] for e in eps]

        cfg = SchedulerConfig(batch_size=64, max_staleness=None, max_inflight=256)
        async with RolloutScheduler(
            generate, lambda t: CodeEnv(ev).for_scheduler(), pool=ev.pool, config=cfg
        ) as sched:
            sched.feed(tasks, group_size=group)
            done = 0
            async for g in sched.groups():
                assert all(e.total_reward == 1.0 for e in g.episodes), g.failed
                done += len(g.episodes)
        assert done == n

    cols = {"test": [t.test for t, _ in pairs], "entry_point": [t.entry_point for t, _ in pairs]}
    prompts = [t.prompt for t, _ in pairs]
    comps = [c for _, c in pairs]
    sync_f, async_f = CodeReward(ev), AsyncCodeReward(ev)

    def trl_sync() -> None:
        assert all(r == 1.0 for r in sync_f(prompts=prompts, completions=comps, **cols))

    def trl_async() -> None:
        out = asyncio.run(async_f(prompts=prompts, completions=comps, **cols))
        assert all(r == 1.0 for r in out)

    rows = []
    for name, fn in (
        ("Evaluator.judge_many (direct)", direct),
        ("CodeEnv episodes via RolloutScheduler", lambda: asyncio.run(episodes())),
        ("TRL CodeReward (sync, judge_many)", trl_sync),
        ("TRL AsyncCodeReward (asyncio, ajudge)", trl_async),
    ):
        s = _median_s(fn, repeats)
        rows.append((f"{name}, {n} HumanEval canonical", f"{n / s:.0f} /s ({s:.2f} s)"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--group", type=int, default=2, help="completions per HumanEval problem")
    ap.add_argument("--workers", type=int, default=2 * (os.cpu_count() or 1))
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    rows = shell_rows(a.repeats)
    with Evaluator(workers=a.workers) as ev:
        ev.judge_many([(t, t.canonical_solution or "") for t in load_humaneval()[:8]])  # warm
        rows += code_rows(ev, a.group, a.repeats)
    print(f"| measure ({os.cpu_count()} cores, {a.workers} workers) | median |")
    print("|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")


if __name__ == "__main__":
    main()
