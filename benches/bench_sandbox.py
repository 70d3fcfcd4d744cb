"""Per-run cost of an agentrl box, side by side with unshare, bwrap and nsjail.

Run (the project's pytest config skips benchmarks by default)::

    python -m pytest benches/bench_sandbox.py --benchmark-enable --benchmark-only \\
        -p no:cacheprovider

Groups: ``latency /bin/true`` and ``latency python -c pass`` (seconds per run, one run per
round), ``throughput /bin/true 8x100`` (seconds per batch of 8 threads x 100 runs; the
``runs_per_s`` extra column and the summary at the end give runs/s), and for the warm path
``latency python print(1)`` (``run_python`` against a bare ``python -c``) and ``throughput
python print(1) 8x100`` (``run_python`` from 8 threads). Every anchor is started
with ``subprocess.run`` from Python, the way a Python trainer would start it; the ``bare`` row
is a plain ``subprocess.run`` of the same program: the spawn floor. Anchors whose tool is
missing are skipped with the reason. Rounds: ``AGENTRL_BENCH_ROUNDS`` (default 200),
``AGENTRL_BENCH_PY_ROUNDS`` (default 50), ``AGENTRL_BENCH_TP_ROUNDS`` (default 3).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator

import pytest
from _harness import (
    ANCHORS,
    PY,
    PY_ANCHORS,
    RESULTS,
    TRUE,
    agentrl_call,
    anchor_argv,
    check_anchor,
    find_nsjail,
    saturate,
    subprocess_call,
    system_python,
)
from agentrl import Sandbox

LAT_ROUNDS = int(os.environ.get("AGENTRL_BENCH_ROUNDS", "200"))
PY_ROUNDS = int(os.environ.get("AGENTRL_BENCH_PY_ROUNDS", "50"))
TP_ROUNDS = int(os.environ.get("AGENTRL_BENCH_TP_ROUNDS", "3"))
THREADS, PER_THREAD = 8, 100

G_TRUE = "latency /bin/true"
G_PY = "latency python -c pass"
G_TP = f"throughput /bin/true {THREADS}x{PER_THREAD}"
G_WARM = "latency python print(1)"
G_WARM_TP = f"throughput python print(1) {THREADS}x{PER_THREAD}"
WARM_SOURCE = "print(1)"

if not sys.platform.startswith("linux"):
    pytest.skip("agentrl sandboxes are Linux-only", allow_module_level=True)


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    box = Sandbox(max_concurrency=THREADS)
    try:
        r = box.run([TRUE])
        if not r.ok:
            pytest.skip(f"agentrl cannot run /bin/true here: {r.status} {r.error}")
        yield box
    finally:
        box.close()


@pytest.fixture(scope="module")
def nsjail_path() -> str | None:
    path, _how = find_nsjail(install=True)
    return path


@pytest.fixture
def make_call(sb: Sandbox, nsjail_path: str | None) -> Callable[[str, list[str]], Callable]:
    """make_call(who, prog): a callable running ``prog`` once under ``who``, or a skip."""

    def make(who: str, prog: list[str]) -> Callable[[], None]:
        if who == "agentrl":
            return agentrl_call(sb, prog)
        if who == "nsjail" and nsjail_path is None:
            pytest.skip(find_nsjail(install=False)[1])
        if who != "bare":
            _argv, why = check_anchor(who, nsjail_path)
            if why:
                pytest.skip(why)
        return subprocess_call(anchor_argv(who, prog, nsjail_path))

    return make


def _record(benchmark, group: str, who: str, per_call_runs: int = 1) -> None:
    med = benchmark.stats.stats.median
    benchmark.extra_info["median_ms"] = round(med * 1e3 / per_call_runs, 3)
    benchmark.extra_info["runs_per_s"] = round(per_call_runs / med, 1)
    RESULTS.setdefault(group, {})[who] = med / per_call_runs


@pytest.mark.benchmark(group=G_TRUE)
@pytest.mark.parametrize("who", ["agentrl", *ANCHORS])
def test_latency_true(benchmark, make_call, who: str) -> None:
    call = make_call(who, [TRUE])
    benchmark.pedantic(call, rounds=LAT_ROUNDS, iterations=1, warmup_rounds=10)
    _record(benchmark, G_TRUE, who)


def _interpreter(tag: str, sb: Sandbox | None = None) -> str:
    """PY: the (clean) interpreter running the benchmark; in the box (``sb``) its venv is
    bound at a path of its own, ``sb.python``. SYS: the system ``python3`` (a skip if none)."""
    if tag == "PY":
        return sb.python if sb is not None else PY
    exe, why = system_python()
    if exe is None:
        pytest.skip(why)
    return exe


@pytest.mark.parametrize("interp", ["PY", "SYS"])
@pytest.mark.parametrize("who", ["agentrl", *PY_ANCHORS])
def test_latency_python(benchmark, make_call, sb: Sandbox, who: str, interp: str) -> None:
    exe = _interpreter(interp, sb if who == "agentrl" else None)
    call = make_call(who, [exe, "-c", "pass"])
    benchmark.group = f"{G_PY} ({interp})"
    benchmark.pedantic(call, rounds=PY_ROUNDS, iterations=1, warmup_rounds=3)
    _record(benchmark, f"{G_PY} ({interp})", who)


@pytest.mark.benchmark(group=G_TP)
@pytest.mark.parametrize("who", ["agentrl", *ANCHORS])
def test_throughput_true(benchmark, make_call, who: str) -> None:
    call = make_call(who, [TRUE])
    benchmark.pedantic(saturate, args=(call, THREADS, PER_THREAD), rounds=TP_ROUNDS, iterations=1)
    _record(benchmark, G_TP, who, per_call_runs=THREADS * PER_THREAD)


def _warm_call(sb: Sandbox) -> Callable[[], None]:
    def call() -> None:
        r = sb.run_python(WARM_SOURCE)
        if not r.ok or r.stdout != b"1\n":
            raise RuntimeError(f"warm run failed: {r.status} {r.error} {r.stderr[-300:]!r}")

    # Every slot's interpreter starts before anything is timed (a one-off cost), from several
    # threads at once: one call after another would all land on the same slot.
    saturate(call, THREADS, 4)
    return call


@pytest.mark.benchmark(group=G_WARM)
@pytest.mark.parametrize("who", ["agentrl", "bare", "bare SYS"])
def test_latency_warm(benchmark, sb: Sandbox, who: str) -> None:
    if who == "agentrl":
        call = _warm_call(sb)
    else:
        exe = _interpreter("SYS" if who == "bare SYS" else "PY")
        call = subprocess_call([exe, "-c", WARM_SOURCE])
    benchmark.pedantic(call, rounds=PY_ROUNDS, iterations=1, warmup_rounds=3)
    _record(benchmark, G_WARM, who)


@pytest.mark.benchmark(group=G_WARM_TP)
def test_throughput_warm(benchmark, sb: Sandbox) -> None:
    call = _warm_call(sb)
    benchmark.pedantic(saturate, args=(call, THREADS, PER_THREAD), rounds=TP_ROUNDS, iterations=1)
    _record(benchmark, G_WARM_TP, "agentrl", per_call_runs=THREADS * PER_THREAD)
