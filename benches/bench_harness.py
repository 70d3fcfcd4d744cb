"""The judging harness's call round trip: what one call of the candidate costs.

    python -m pytest benches/bench_harness.py --benchmark-enable --benchmark-only -p no:cacheprovider

A function task's tests call the candidate, which runs in its own process inside the box; each
call crosses two pipes both ways. Two judgements of the same task are timed, one whose tests
call the candidate once and one whose tests call it ``1 + CALLS`` times: the difference of
their medians over ``CALLS`` is the cost of one call (the rest of a judgement, the box and the
two processes, is the same in both). The per-call figure is printed after the tables.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from _harness import NOTES
from agentrl.evaluation import Evaluator, FunctionTask

CALLS = 200
ROUNDS = int(os.environ.get("AGENTRL_BENCH_ROUNDS", "30"))
GROUP = f"harness: one judgement, 1 call vs {1 + CALLS} calls"
MEDIANS: dict[int, float] = {}


def _task(calls: int) -> FunctionTask:
    test = (
        "def check(candidate):\n"
        f"    for i in range({calls}):\n"
        "        assert candidate([5, 3, 1, 4, 2, i], 3) == sorted([5, 3, 1, 4, 2, i])[:3]\n"
    )
    return FunctionTask(f"calls-{calls}", "def f(xs, k):\n", test, "f")


SOLUTION = "    return sorted(xs)[:k]\n"


@pytest.fixture(scope="module")
def ev() -> Iterator[Evaluator]:
    with Evaluator(workers=1, timeout=10.0) as e:
        e.judge(_task(1), SOLUTION)  # start the warm interpreter
        yield e


@pytest.mark.benchmark(group=GROUP)
@pytest.mark.parametrize("calls", [1, 1 + CALLS])
def test_judgement_with_calls(benchmark, ev: Evaluator, calls: int) -> None:
    task = _task(calls)

    def judge() -> None:
        j = ev.judge(task, SOLUTION)
        if not j.passed:
            raise RuntimeError(j.feedback)

    benchmark.pedantic(judge, rounds=ROUNDS, iterations=1, warmup_rounds=2)
    MEDIANS[calls] = benchmark.stats.stats.median


@pytest.fixture(scope="module", autouse=True)
def _per_call() -> Iterator[None]:
    yield
    if 1 in MEDIANS and 1 + CALLS in MEDIANS:
        per_call = (MEDIANS[1 + CALLS] - MEDIANS[1]) / CALLS
        NOTES.append(
            f"harness call round trip: {per_call * 1e6:.1f} us per call (medians "
            f"{MEDIANS[1] * 1e3:.2f} ms with 1 call, {MEDIANS[1 + CALLS] * 1e3:.2f} ms with "
            f"{1 + CALLS})"
        )
