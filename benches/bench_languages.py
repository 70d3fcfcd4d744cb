"""C++ stdin/stdout judging: one program on 20 tests, agentrl against plain ``subprocess``.

    python benches/bench_languages.py [--rounds 3] [--tests 20] [--workers 4]

The program is a typical contest solution (``#include <bits/stdc++.h>``, reads ``n`` numbers,
prints their sorted order's checksum); each test gives it 20,000 numbers. Rows, timed from the
source text to the 20 verdicts (outputs compared on the host), each round in a rotated order:

* ``subprocess, g++ + run per test`` (the anchor): what a plain harness does, per test
  ``g++ -std=c++17 -O2 main.cpp`` then ``./a.out < input`` with ``subprocess.run`` in a temp
  dir, one test after another; no isolation at all.
* ``subprocess, g++ once + 20 runs``: the same with the compile hoisted out of the loop (what
  the cache buys without a sandbox; context, not a target).
* ``agentrl run_code per test``: :func:`agentrl.languages.run_code` once per test, a fresh
  :class:`CompileCache` each round (so the round compiles once, in a box, and every later test
  is a cache hit); the runs one after another.
* ``agentrl compile once + 20 runs in parallel``: :func:`prepare` then all 20 runs submitted
  at once to the warm pool (how the Evaluator judges an IOTask), a fresh cache each round.

Every row must give the 20 right answers or the script stops. The pool (``--workers``) is made
and warmed before timing. The report gives each row's median over the rounds and its speed-up
over the anchor (target, issue 19: at least 5x).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from agentrl import Limits, SandboxPool
from agentrl.languages import (
    CompileCache,
    compare_output,
    prepare,
    resolve_language,
    run_code,
    submit_program,
)

SOURCE = r"""#include <bits/stdc++.h>
using namespace std;
int main() {
    ios::sync_with_stdio(false); cin.tie(nullptr);
    int n; if (!(cin >> n)) return 1;
    vector<long long> a(n);
    for (auto &x : a) cin >> x;
    sort(a.begin(), a.end());
    unsigned long long h = 1469598103934665603ULL;
    for (auto x : a) { h ^= (unsigned long long)x; h *= 1099511628211ULL; }
    cout << n << ' ' << a.front() << ' ' << a.back() << ' ' << h << '\n';
}
"""


def make_tests(k: int, n: int, seed: int = 1) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    tests = []
    for _ in range(k):
        a = [rng.randint(-(10**12), 10**12) for _ in range(n)]
        h = 1469598103934665603
        for x in sorted(a):
            h ^= x & 0xFFFFFFFFFFFFFFFF
            h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        s = sorted(a)
        tests.append((f"{n}\n{' '.join(map(str, a))}\n", f"{n} {s[0]} {s[-1]} {h}\n"))
    return tests


def check(outs: list[bytes], tests: list[tuple[str, str]], row: str) -> None:
    bad = [
        i
        for i, (o, (_, want)) in enumerate(zip(outs, tests, strict=True))
        if not compare_output(o, want, "exact")
    ]
    if bad:
        sys.exit(f"{row}: wrong answers on tests {bad[:5]} (got {outs[bad[0]][:80]!r})")


def subprocess_per_test(tests: list[tuple[str, str]], gxx: str) -> list[bytes]:
    outs = []
    for stdin, _ in tests:
        with tempfile.TemporaryDirectory(prefix="bench-lang-") as d:
            with open(os.path.join(d, "main.cpp"), "w") as f:
                f.write(SOURCE)
            subprocess.run([gxx, "-std=c++17", "-O2", "-o", "a.out", "main.cpp"], cwd=d, check=True)
            p = subprocess.run(
                ["./a.out"], cwd=d, input=stdin.encode(), capture_output=True, timeout=10
            )
            outs.append(p.stdout)
    return outs


def subprocess_compile_once(tests: list[tuple[str, str]], gxx: str) -> list[bytes]:
    with tempfile.TemporaryDirectory(prefix="bench-lang-") as d:
        with open(os.path.join(d, "main.cpp"), "w") as f:
            f.write(SOURCE)
        subprocess.run([gxx, "-std=c++17", "-O2", "-o", "a.out", "main.cpp"], cwd=d, check=True)
        return [
            subprocess.run(
                ["./a.out"], cwd=d, input=s.encode(), capture_output=True, timeout=10
            ).stdout
            for s, _ in tests
        ]


def agentrl_per_test(pool: SandboxPool, tests: list[tuple[str, str]]) -> list[bytes]:
    cache = CompileCache()
    outs = []
    for stdin, _ in tests:
        r = run_code(pool, "cpp", SOURCE, stdin=stdin, cache=cache)
        assert r.run is not None, r.compile
        outs.append(r.run.stdout)
    assert cache.stats()["misses"] == 1
    return outs


def agentrl_parallel(pool: SandboxPool, tests: list[tuple[str, str]]) -> list[bytes]:
    cache = CompileCache()
    program = prepare(pool, "cpp", SOURCE, cache=cache)
    assert program.compiled_ok, program.compile
    futs = [submit_program(pool, program, stdin=s) for s, _ in tests]
    return [f.result().stdout for f in futs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tests", type=int, default=20)
    ap.add_argument("--numbers", type=int, default=20000, help="numbers per test input")
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()

    lang = resolve_language("cpp")
    gxx = lang.toolchain().paths["g++"]
    tests = make_tests(args.tests, args.numbers)
    limits = Limits(wall_time_s=10, cpu_time_s=10, memory_bytes=512 << 20, max_pids=64)
    with SandboxPool(workers=args.workers, limits=limits) as pool:
        # Warm the pool's slots and the page cache of g++ and its headers for every row.
        check(agentrl_parallel(pool, tests), tests, "warm-up")
        check(subprocess_compile_once(tests, gxx), tests, "warm-up")
        rows: dict[str, Callable[[], list[bytes]]] = {
            "subprocess, g++ + run per test": lambda: subprocess_per_test(tests, gxx),
            "subprocess, g++ once + 20 runs": lambda: subprocess_compile_once(tests, gxx),
            "agentrl run_code per test": lambda: agentrl_per_test(pool, tests),
            "agentrl compile once + 20 runs in parallel": lambda: agentrl_parallel(pool, tests),
        }
        names = list(rows)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                t = time.perf_counter()
                outs = rows[name]()
                times[name].append(time.perf_counter() - t)
                check(outs, tests, name)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    anchor = statistics.median(times[names[0]])
    print(
        f"\nC++ judging, one program on {args.tests} tests ({args.numbers} numbers each), "
        f"{args.rounds} rounds, {os.cpu_count()} CPUs, pool workers={args.workers}, "
        f"{lang.version()}"
    )
    print(f"{'row':<46} {'median s':>9} {'min s':>8} {'speed-up':>9}")
    for name in names:
        med = statistics.median(times[name])
        print(f"{name:<46} {med:>9.3f} {min(times[name]):>8.3f} {anchor / med:>8.1f}x")


if __name__ == "__main__":
    main()
