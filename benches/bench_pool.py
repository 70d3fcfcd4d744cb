"""Scheduler benchmarks (issue 4): no-op job round trips from Python, and the overlap of a
simulated generator with real sandbox jobs under the RolloutScheduler.

Plain script (prints Markdown tables; ``--write`` appends them to ``benches/results_pool.md``)::

    python benches/bench_pool.py                 # everything, a few minutes on 2 cores
    python benches/bench_pool.py --only noop     # or overlap, workers

and pytest-benchmark tests for the no-op round trips::

    python -m pytest benches/bench_pool.py --benchmark-enable --benchmark-only

No-op jobs measure scheduling overhead, not sandboxes: they run on ``_core._TestPool``, the
same Rust scheduler with a fake executor whose job returns its argument.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import uvloop
from agentrl import RolloutScheduler, SandboxPool, SchedulerConfig, _core
from agentrl.pool.testing import _TestPool

CORES = os.cpu_count() or 1


def noop(x: int) -> int:
    return x


def _rate(n: int, fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t)


def _best(repeat: int, n: int, fn: Callable[[], None]) -> float:
    return max(_rate(n, fn) for _ in range(repeat))


# ---- no-op round trips


def core_batches(core: Any, n: int, batch: int) -> None:
    """Rust pool, batch calls: submit ``batch`` no-ops, collect them all, repeat."""
    items = list(range(batch))
    for _ in range(n // batch):
        core.submit_many(items)
        got = 0
        while got < batch:
            got += len(core.collect(None, 1.0))


def pool_batches(pool: _TestPool, n: int, batch: int) -> None:
    """The Python pool's ``submit_many``/``collect`` (ids, routing, JobOutcome records)."""
    items = list(range(batch))
    for _ in range(n // batch):
        pool.submit_many(items)
        got = 0
        while got < batch:
            got += len(pool.collect(timeout=1.0))


def pool_futures(pool: _TestPool, n: int) -> None:
    futs = [pool.submit(_TestPool.NOOP, i) for i in range(n)]
    for f in futs:
        f.result()


def pool_asyncio(pool: _TestPool, n: int, use_uvloop: bool) -> None:
    async def main() -> None:
        await asyncio.gather(*(pool.run(_TestPool.NOOP, i) for i in range(n)))

    loop = uvloop.new_event_loop() if use_uvloop else asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def threadpool(ex: ThreadPoolExecutor, n: int) -> None:
    futs = [ex.submit(noop, i) for i in range(n)]
    for f in futs:
        f.result()


def asyncio_queue(n: int, workers: int) -> None:
    async def main() -> None:
        q: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def worker() -> None:
            while True:
                x, fut = await q.get()
                fut.set_result(noop(x))

        ws = [asyncio.ensure_future(worker()) for _ in range(workers)]
        futs = []
        for i in range(n):
            fut = loop.create_future()
            q.put_nowait((i, fut))
            futs.append(fut)
        await asyncio.gather(*futs)
        for w in ws:
            w.cancel()
        await asyncio.gather(*ws, return_exceptions=True)

    asyncio.run(main())


def mp_pool(pool: Any, n: int) -> None:
    pool.map(noop, range(n))


def bench_noop(n: int, repeat: int) -> list[tuple[str, float]]:
    rows: list[tuple[str, float]] = []
    core = _core._TestPool(0, 1 << 17, 0)
    for batch in (1024, 8192, 32768):
        rows.append(
            (
                f"agentrl Rust pool, batch calls ({batch}/call)",
                _best(repeat, n, lambda b=batch: core_batches(core, n, b)),
            )
        )
    core.close(True)
    with _TestPool(workers=CORES, capacity=1 << 16) as p:
        rows.append(
            (
                "agentrl SandboxPool layer, submit_many/collect (8192/call)",
                _best(repeat, n, lambda: pool_batches(p, n, 8192)),
            )
        )
        m = n // 10
        rows.append(
            ("agentrl futures, submit() per job", _best(repeat, m, lambda: pool_futures(p, m)))
        )
        for uv in (False, True):
            name = "uvloop" if uv else "asyncio"
            rows.append(
                (
                    f"agentrl `await pool.run()` ({name})",
                    _best(repeat, m, lambda u=uv: pool_asyncio(p, m, u)),
                )
            )
    m = n // 10
    with ThreadPoolExecutor(CORES) as ex:
        rows.append((f"ThreadPoolExecutor({CORES})", _best(repeat, m, lambda: threadpool(ex, m))))
    rows.append(
        (f"asyncio.Queue + {CORES} workers", _best(repeat, m, lambda: asyncio_queue(m, CORES)))
    )
    with multiprocessing.get_context("fork").Pool(CORES) as mp:
        rows.append(
            (f"multiprocessing.Pool({CORES}).map", _best(repeat, m, lambda: mp_pool(mp, m)))
        )
    return rows


# ---- sandbox throughput by worker count


JOB = "print(sum(i * i for i in range(2000)))"


def pool_rate(pool: SandboxPool, n: int) -> float:
    def go() -> None:
        pool.submit_many([JOB] * n)
        got = 0
        while got < n:
            got += len(pool.collect(timeout=30))

    go_warm = min(n, 4 * pool.workers)
    pool.submit_many([JOB] * go_warm)
    got = 0
    while got < go_warm:
        got += len(pool.collect(timeout=30))
    return _rate(n, go)


def bench_workers(n: int) -> list[tuple[str, float]]:
    rows = []
    for w in sorted({1, CORES, 2 * CORES, 4 * CORES}):
        with SandboxPool(workers=w) as p:
            rows.append((f"workers={w}", pool_rate(p, n)))
    return rows


# ---- overlap


def bench_overlap(batch: int, turns: int, episodes: int, use_uvloop: bool) -> dict[str, float]:
    """Each episode: ``turns`` x (generation, then one sandbox Python job). The generator
    costs a fixed ``latency`` per call (``time.sleep`` in a thread: releases the GIL), with
    ``latency = batch / env_rate`` so that generation and execution take equally long."""
    out: dict[str, float] = {}
    with SandboxPool() as pool:
        env_rate = max(pool_rate(pool, 400), pool_rate(pool, 400))
        latency = batch / env_rate
        out.update(workers=pool.workers, env_rate=env_rate, latency_ms=latency * 1e3)
        ideal = min(batch / latency, env_rate)

        # Synchronous loop: generate a batch, execute it, reward, generate again.
        rounds = max(1, episodes * turns // batch)
        t = time.perf_counter()
        for _ in range(rounds):
            time.sleep(latency)  # generate
            pool.submit_many([JOB] * batch)  # execute
            got = []
            while len(got) < batch:
                got += pool.collect(timeout=30)
            sum(o.result.ok for o in got)  # reward
        sync_rate = rounds * batch / (time.perf_counter() - t)

        def generate(eps: list[Any]) -> list[str]:
            time.sleep(latency)
            return [JOB] * len(eps)

        class Env:
            def __init__(self, task: int) -> None:
                self.t = 0

            async def reset(self, task: int) -> int:
                return 0

            async def step(self, code: str) -> tuple:
                r = await pool.run_python(code)
                self.t += 1
                return r.stdout, float(r.ok), self.t >= turns, None

        async def main() -> tuple[float, dict]:
            cfg = SchedulerConfig(
                max_batch=batch,
                batch_wait_s=0.001,
                max_inflight=4 * batch,
                max_staleness=None,
                output_capacity=episodes,
            )
            async with RolloutScheduler(generate, Env, pool=pool, config=cfg) as s:
                t0 = time.perf_counter()
                s.feed(range(episodes))
                n = 0
                async for g in s.groups():
                    n += sum(len(e.turns) for e in g.episodes)
                return n / (time.perf_counter() - t0), s.stats()

        loop = uvloop.new_event_loop() if use_uvloop else asyncio.new_event_loop()
        try:
            sched_rate, stats = loop.run_until_complete(main())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()
    out.update(
        ideal=ideal,
        sync=sync_rate,
        scheduler=sched_rate,
        of_ideal=sched_rate / ideal,
        vs_sync=sched_rate / sync_rate,
        gen_idle=stats["generator_idle_fraction"],
        mean_batch=stats["mean_generate_batch"],
        utilisation=stats["worker_utilisation"],
    )
    return out


# ---- report


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["noop", "workers", "overlap"], action="append")
    ap.add_argument("--noop-jobs", type=int, default=327_680)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="generation batch (overlap)")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    ap.add_argument("--write", action="store_true", help="append to benches/results_pool.md")
    a = ap.parse_args(argv)
    only = set(a.only or ["noop", "workers", "overlap"])
    lines = [f"## bench_pool.py, {time.strftime('%Y-%m-%d %H:%M')}, {CORES} cores", ""]
    lines.append(f"load average before: {_load()}")
    if "noop" in only:
        rows = bench_noop(a.noop_jobs, a.repeat)
        tpe = next(r for n, r in rows if n.startswith("ThreadPoolExecutor"))
        lines += ["", "| no-op jobs, round trip from Python | jobs/s | x ThreadPoolExecutor |"]
        lines += ["|---|---:|---:|"]
        lines += [f"| {n} | {r:,.0f} | {r / tpe:.1f} |" for n, r in rows]
    if "workers" in only:
        lines += ["", "| SandboxPool, warm Python jobs | jobs/s |", "|---|---:|"]
        lines += [f"| {n} | {r:,.0f} |" for n, r in bench_workers(400)]
    if "overlap" in only:
        o = bench_overlap(a.batch, a.turns, a.episodes, a.loop == "uvloop")
        lines += [
            "",
            f"Overlap: {a.episodes} episodes x {a.turns} turns, generation batch {a.batch}, "
            f"{o['latency_ms']:.1f} ms per generate call, {int(o['workers'])} workers, "
            f"{a.loop}; environment alone {o['env_rate']:.0f} jobs/s.",
            "",
            "| | turns/s | of ideal | x sync |",
            "|---|---:|---:|---:|",
            f"| ideal bound min(batch/latency, env rate) | {o['ideal']:.0f} | 100% | |",
            f"| synchronous generate → execute → reward loop | {o['sync']:.0f} "
            f"| {o['sync'] / o['ideal']:.0%} | 1.0 |",
            f"| RolloutScheduler | {o['scheduler']:.0f} | {o['of_ideal']:.0%} "
            f"| {o['vs_sync']:.2f} |",
            "",
            f"generator idle {o['gen_idle']:.1%}, mean generate batch {o['mean_batch']:.1f}, "
            f"worker utilisation {o['utilisation']:.0%}",
        ]
    lines += ["", f"load average after: {_load()}", ""]
    text = "\n".join(lines)
    print(text)
    if a.write:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_pool.md")
        with open(path, "a") as f:
            f.write(text + "\n")


# ---- pytest-benchmark


def test_noop_rust_pool_batches(benchmark: Any) -> None:
    core = _core._TestPool(0, 1 << 15, 0)
    try:
        benchmark(core_batches, core, 8192, 8192)
    finally:
        core.close(True)


def test_noop_pool_submit_many(benchmark: Any) -> None:
    with _TestPool(workers=CORES, capacity=1 << 14) as p:
        benchmark(pool_batches, p, 8192, 8192)


def test_noop_threadpool(benchmark: Any) -> None:
    with ThreadPoolExecutor(CORES) as ex:
        benchmark(threadpool, ex, 8192)


if __name__ == "__main__":
    main(sys.argv[1:])
