"""Warm-Python fast path and sessions, side by side with the anchors, without pytest.

    python benches/report_warm.py            # writes benches/results_warm.md

Measures in one process: ``print(1)`` latency through agentrl's warm interpreter
(``run_python``), agentrl's cold path (``run([python, "-c", ...])``), a bare ``python3 -c``,
``bwrap ... python3 -c`` and ``nsjail ... python3 -c`` (iterations interleaved round-robin);
saturated warm runs per second (8 Python threads); and session step and ``reset()`` latency
with a 100-file, 10 MB work dir. Targets (issue 3): warm median at most one tenth of bare
``python3 -c``; at least 500 isolated Python runs per second on 2 cores.

Every Python anchor is measured twice, in the same interleaved rounds: with the interpreter
running this script (a clean venv is expected: its ``site`` imports nothing; the report says
what it found) and with the machine's system ``python3`` (the venv's base interpreter, whose
``site-packages`` ``.pth`` files import ~80 modules at every start). The clean figures are the
headline; the system ones show how much a heavy start-up inflates the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import (  # noqa: E402
    Latency,
    anchor_argv,
    check_anchor,
    find_nsjail,
    interpreter_note,
    is_clean,
    saturate,
    subprocess_call,
    system_python,
    time_interleaved,
)
from agentrl import Sandbox  # noqa: E402

SOURCE = "print(1)"


def _ms(lat: Latency) -> str:
    return f"{lat.median_ms:.2f} / {lat.p90_ms:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--out", default=str(HERE / "results_warm.md"))
    a = ap.parse_args()
    py = sys.executable
    sys_py, sys_how = system_python()
    nsjail, _why = find_nsjail(install=False)
    lines = [f"# Warm Python and sessions ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})"]
    lines.append(f"load average before: {os.getloadavg()[0]:.2f}; cores: {os.cpu_count()}")
    clean_word = "clean venv" if is_clean(py) else "NOT clean (its site imports modules)"
    lines.append(f"- PY ({clean_word}): {interpreter_note(py)}")
    if sys_py:
        lines.append(f"- SYS ({sys_how}): {interpreter_note(sys_py)}")
    else:
        lines.append(f"- SYS: skipped ({sys_how})")
    interpreters = {"PY": py} | ({"SYS": sys_py} if sys_py else {})
    with Sandbox() as sb:
        # Start every slot's warm interpreter first (their boot is a one-off cost): calls from
        # several threads at once, as one after another would all land on the same slot.
        saturate(lambda: sb.run_python(SOURCE), threads=8, per_thread=4)

        def warm() -> None:
            r = sb.run_python(SOURCE)
            if not r.ok or r.stdout != b"1\n":
                raise RuntimeError(r.summary())

        def cold(argv: list[str]):
            def call() -> None:
                r = sb.run(argv)
                if not r.ok:
                    raise RuntimeError(r.summary())

            return call

        calls = {"agentrl warm run_python": warm}
        # In the box the venv is bound at a path of its own (sb.python); SYS at its own path.
        calls["agentrl cold run(PY -c)"] = cold([sb.python, "-c", SOURCE])
        if sys_py:
            calls["agentrl cold run(SYS -c)"] = cold([sys_py, "-c", SOURCE])
        for tag, exe in interpreters.items():
            calls[f"bare {tag} -c print(1)"] = subprocess_call([exe, "-c", SOURCE])
            calls[f"bare {tag} -c pass"] = subprocess_call([exe, "-c", "pass"])
        for name in ("bwrap", "nsjail"):
            argv, why = check_anchor(name, nsjail)
            if argv is None:
                lines.append(f"- {name} skipped: {why}")
                continue
            for tag, exe in interpreters.items():
                prog = [exe, "-c", SOURCE]
                calls[f"{name} {tag} -c print(1)"] = subprocess_call(
                    anchor_argv(name, prog, nsjail)
                )
        lat = time_interleaved(calls, a.iterations, warmup=5)
        warm_ms = lat["agentrl warm run_python"].median_ms
        lines += ["", f"## `print(1)` latency, ms (median / p90, {a.iterations} runs each)", ""]
        lines += ["| command | median / p90 | ratio to warm |", "|---|---|---|"]
        for name, value in lat.items():
            lines.append(f"| {name} | {_ms(value)} | {value.median_ms / warm_ms:.1f}x |")
        lines.append("")
        for tag in interpreters:
            bare = lat[f"bare {tag} -c print(1)"].median_ms
            bare_pass = lat[f"bare {tag} -c pass"].median_ms
            head = "headline, clean interpreter" if tag == "PY" else "system interpreter"
            lines.append(
                f"- Target ({head}): warm median <= bare {tag} -c print(1) / 10 = "
                f"{bare / 10:.2f} ms: "
                + ("met" if warm_ms <= bare / 10 else "NOT met")
                + f" ({bare / warm_ms:.1f}x faster than bare {tag} -c print(1), "
                f"{bare_pass / warm_ms:.1f}x faster than bare {tag} -c pass)"
            )
        rates = [saturate(warm, threads=8, per_thread=100) for _ in range(3)]
        rate = statistics.median(rates)
        lines += ["", "## Saturated warm runs (8 threads x 100, median of 3)", ""]
        lines.append(
            f"{rate:.0f} isolated Python runs/s on {os.cpu_count()} cores "
            f"(target >= 500: {'met' if rate >= 500 else 'NOT met'}); rounds: "
            + ", ".join(f"{r:.0f}" for r in rates)
        )
        files = {f"d/f{i:03}.bin": os.urandom(100_000) for i in range(100)}
        with sb.session(files) as s:
            step, reset = [], []
            for _ in range(a.iterations // 2):
                t = time.perf_counter()
                r = s.run(["sh", "-c", "echo x >> d/f000.bin; rm d/f001.bin"])
                step.append(time.perf_counter() - t)
                if not r.ok:
                    raise RuntimeError(r.summary())
                t = time.perf_counter()
                s.reset()
                reset.append(time.perf_counter() - t)
        lines += ["", "## Session with a 100-file, 10 MB work dir", ""]
        lines += ["| operation | median / p90, ms |", "|---|---|"]
        lines.append(f"| step (`sh -c` writing and deleting) | {_ms(Latency(step))} |")
        lines.append(f"| `reset()` | {_ms(Latency(reset))} |")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
