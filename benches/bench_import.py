"""What ``import agentrl`` adds to a Python start: ``python -c "import agentrl"`` against
``python -c pass`` with the same interpreter, interleaved, medians of wall and of CPU
time (CPU time is steadier on a shared machine; issue 18 asks for under 50 ms in a clean venv). Run it with the clean venv's interpreter:

    .venv/bin/python benches/bench_import.py [--rounds 40]

Also prints the modules ``import agentrl`` loads beyond a bare start, and the slowest imports
of one ``-X importtime`` run.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time


def _once(code: str) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one ``python -c code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    a = ap.parse_args()
    bare, full = [], []
    for _ in range(3):  # warm the page cache
        _once("import agentrl")
    for _ in range(a.rounds):
        bare.append(_once("pass"))
        full.append(_once("import agentrl"))
    print(f"interpreter: {sys.executable}")
    for i, what in ((0, "wall"), (1, "CPU (user + system)")):
        b = statistics.median(x[i] for x in bare)
        f = statistics.median(x[i] for x in full)
        print(f"{what}, medians of {a.rounds} interleaved rounds:")
        print(f"  python -c pass:             {b * 1e3:7.2f} ms")
        print(f"  python -c 'import agentrl': {f * 1e3:7.2f} ms")
        print(f"  import agentrl adds:        {(f - b) * 1e3:7.2f} ms")
    code = "import sys; s = set(sys.modules); import agentrl; print(len(set(sys.modules) - s))"
    n = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    print(f"modules it loads: {n.stdout.strip()}")
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import agentrl"],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    rows = []
    for line in err.splitlines()[1:]:
        _, self_us, _cum, name = (p.strip() for p in line.replace("|", ":", 3).split(":", 3))
        rows.append((int(self_us), name.strip()))
    print("slowest by own time (us):", ", ".join(f"{n} {t}" for t, n in sorted(rows)[-8:][::-1]))


if __name__ == "__main__":
    main()
