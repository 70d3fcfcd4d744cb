"""Warm-Python fast path and sessions, side by side with the anchors, without pytest.

    python benches/report_warm.py            # writes benches/results_warm.md

Measures in one process: ``print(1)`` latency through agentrl's warm interpreter
(``run_python``), agentrl's cold path (``run([python, "-c", ...])``), a bare ``python3 -c``,
``bwrap ... python3 -c`` and ``nsjail ... python3 -c`` (iterations interleaved round-robin);
saturated warm runs per second (8 Python threads); and session step and ``reset()`` latency
with a 100-file, 10 MB work dir. Targets (issue 3): warm median at most one tenth of bare
``python3 -c``; at least 500 isolated Python runs per second on 2 cores.
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
    saturate,
    subprocess_call,
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
    prog = [py, "-c", SOURCE]
    nsjail, _why = find_nsjail(install=False)
    lines = [f"# Warm Python and sessions ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})"]
    lines.append(f"load average before: {os.getloadavg()[0]:.2f}; cores: {os.cpu_count()}")
    with Sandbox() as sb:
        # Start every slot's warm interpreter first (their boot is a one-off cost): calls from
        # several threads at once, as one after another would all land on the same slot.
        saturate(lambda: sb.run_python(SOURCE), threads=8, per_thread=4)

        def warm() -> None:
            r = sb.run_python(SOURCE)
            if not r.ok or r.stdout != b"1\n":
                raise RuntimeError(r.summary())

        def cold() -> None:
            r = sb.run(prog)
            if not r.ok:
                raise RuntimeError(r.summary())

        calls = {"agentrl warm run_python": warm, "agentrl cold run(python -c)": cold}
        calls["bare python3 -c"] = subprocess_call(prog)
        for name in ("bwrap", "nsjail"):
            argv, why = check_anchor(name, nsjail)
            if argv is None:
                lines.append(f"- {name} skipped: {why}")
                continue
            calls[f"{name} python3 -c"] = subprocess_call(anchor_argv(name, prog, nsjail))
        lat = time_interleaved(calls, a.iterations, warmup=5)
        warm_ms = lat["agentrl warm run_python"].median_ms
        lines += ["", f"## `print(1)` latency, ms (median / p90, {a.iterations} runs each)", ""]
        lines += ["| command | median / p90 | ratio to warm |", "|---|---|---|"]
        for name, value in lat.items():
            lines.append(f"| {name} | {_ms(value)} | {value.median_ms / warm_ms:.1f}x |")
        bare = lat["bare python3 -c"].median_ms
        lines.append("")
        lines.append(
            f"Target: warm median <= bare / 10 = {bare / 10:.2f} ms: "
            + ("met" if warm_ms <= bare / 10 else "NOT met")
            + f" ({bare / warm_ms:.1f}x faster than bare)"
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
