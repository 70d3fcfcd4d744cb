"""The cost of observing a saturated warm pool: jobs per second of one SandboxPool running
short Python programs (``print(i)``, warm runs) with no observer, with a :class:`Tracer`
recording every job (JSONL, the default sink; and SQLite), with the per-result metrics
(:func:`agentrl.observability.metrics.instrument`), and with both.

The same pool runs every variant (observers are added and removed between rounds), rounds
alternate the variants (A/B/A/B...), and the report gives each variant's median jobs/s and
its ratio to the unobserved median of the same run. The issue's bar: tracing every job costs
at most 5% (ratio >= 0.95)::

    python benches/bench_tracing.py                  # ~1 min on 2 cores
    python benches/bench_tracing.py --jobs 4000 --rounds 7 --workers 4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from agentrl import SandboxPool
from agentrl.observability import metrics
from agentrl.observability.traces import Tracer


def _round(pool: SandboxPool, n: int, observers: list[Any]) -> float:
    for o in observers:
        pool.add_observer(o)
    try:
        sources = [f"print({i})" for i in range(n)]
        t = time.perf_counter()
        for r in pool.map(sources):
            if not r.ok:
                raise RuntimeError(f"a job failed: {r.summary()}")
        return n / (time.perf_counter() - t)
    finally:
        for o in observers:
            pool.remove_observer(o)


def _observer_cpu(pool: SandboxPool, make: Any, n: int) -> float:
    """CPU seconds per job an observer costs this process (its hooks on the pool's threads
    and its writer thread, all threads counted by ``time.process_time``), on ``n`` replays of
    real outcomes of this pool: no sandbox runs in the measured span."""
    from agentrl.pool.jobs import JobOutcome, JobStatus

    futs = [pool.submit_python(f"print({i})") for i in range(64)]
    for f in futs:
        f.result()
    # items as the pool makes them when observed (with a tag), outcomes as it routes them
    probe = metrics.JobMetrics("probe")
    pool.add_observer(probe)
    items = [pool._item(f"print({i})", True, {}) for i in range(64)]
    pool.remove_observer(probe)
    results = [f.result() for f in futs]
    obs = make()
    t = time.process_time()
    for start in range(0, n, 64):
        ids = list(range(start, start + 64))
        obs.submitted(ids, items)
        obs.finished(
            [JobOutcome(i, JobStatus.COMPLETED, r) for i, r in zip(ids, results, strict=True)]
        )
    if hasattr(obs, "flush"):
        obs.flush(120)
    cpu = time.process_time() - t
    if hasattr(obs, "close"):
        obs.close()
    return cpu / (n // 64 * 64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2000, help="jobs per round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of each variant")
    ap.add_argument("--workers", type=int, default=None, help="pool workers (default: 2/core)")
    ap.add_argument("--replay", type=int, default=20000, help="outcomes replayed for the CPU cost")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, SandboxPool(workers=a.workers) as pool:
        jsonl = Tracer(f"{d}/jsonl")
        sqlite = Tracer(f"{d}/sqlite", sink="sqlite")
        jm = metrics.JobMetrics("bench")
        variants: dict[str, list[Any]] = {
            "none": [],
            "trace jsonl": [jsonl],
            "trace sqlite": [sqlite],
            "metrics": [jm],
            "trace jsonl + metrics": [jsonl, jm],
        }
        _round(pool, min(a.jobs, 500), [])  # warm up the warm interpreters
        rates: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(a.rounds):
            for name, obs in variants.items():
                rates[name].append(_round(pool, a.jobs, obs))
                for t in (jsonl, sqlite):
                    t.flush(60)  # the writer's backlog does not spill into the next round
        jsonl.close()
        sqlite.close()
        base = statistics.median(rates["none"])
        print(f"pool: {pool.workers} workers, {a.jobs} jobs x {a.rounds} rounds, warm python")
        print("| variant | median jobs/s | min | max | ratio to none |")
        print("|---|---:|---:|---:|---:|")
        for name, rs in rates.items():
            med = statistics.median(rs)
            print(f"| {name} | {med:.0f} | {min(rs):.0f} | {max(rs):.0f} | {med / base:.3f} |")
        print()
        print("CPU per job of each observer (replayed outcomes; no runs in the span), and the")
        print("throughput share it takes of a pool at the unobserved rate on this machine's cores:")
        print("| observer | CPU µs/job | share at the measured rate |")
        print("|---|---:|---:|")
        import os

        cores = os.cpu_count() or 1
        for name, make in (
            ("trace jsonl", lambda: Tracer(f"{d}/cpu-jsonl")),
            ("trace sqlite", lambda: Tracer(f"{d}/cpu-sqlite", sink="sqlite")),
            ("metrics", lambda: metrics.JobMetrics("cpu")),
        ):
            per = _observer_cpu(pool, make, a.replay)
            print(f"| {name} | {per * 1e6:.1f} | {per * base / cores:.2%} |")
        print(f"trace records written: jsonl {jsonl.stats()['written']} "
              f"(dropped {jsonl.stats()['dropped']}), sqlite {sqlite.stats()['written']} "
              f"(dropped {sqlite.stats()['dropped']})")  # fmt: skip


if __name__ == "__main__":
    main()
