"""The sandbox service's cost (issue 19): SandboxFusion ``/run_code`` requests of Python
``print(1)`` against ``agentrl sandbox-server`` on loopback, next to the same runs through
``SandboxPool.run_python`` in this process, on a pool of the same size, in the same run.

For each number of concurrent clients (1, 16, 64): requests per second, p50 and p99 latency,
and the ratios (server / in-process throughput; server p50 minus in-process p50). The
targets: at most 1 ms added at p50, at least 70% of the in-process throughput. The server
runs in its own process (``--processes N`` uvicorn workers, each with its own pool of
``workers / N``). Two load generators drive it, on the same machine, so on a small machine
they take CPU from the boxes:

* ``aiohttp``: coroutines on uvloop in this process (a Python trainer's reward client; about
  0.6 ms of CPU per request on the development machine);
* ``wrk`` (Debian's ``wrk``, C; ``.ci/setup`` installs it), ``-t1 -c CLIENTS`` for
  ``--wrk-seconds``, every response's body checked by a Lua hook: the server's own cost,
  as HTTP servers are measured (skipped with a note when ``wrk`` is not on ``PATH``).

::

    python benches/bench_service.py                      # 1, 16, 64 clients
    python benches/bench_service.py --processes 1,2      # also two uvicorn workers
    python benches/bench_service.py --requests 400 --workers 4 --load aiohttp
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

import aiohttp
import uvloop
from agentrl import SandboxPool

CODE = "print(1)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _drive(n: int, clients: int, one: Callable[[], Awaitable[None]]) -> dict[str, float]:
    """``n`` calls of ``one`` from ``clients`` coroutines: rate and latency percentiles."""
    lat: list[float] = []
    left = n

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t = time.perf_counter()
            await one()
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - t0
    return {
        "rps": n / wall,
        "p50_ms": 1e3 * statistics.median(lat),
        "p99_ms": 1e3 * _pct(lat, 0.99),
    }


async def inprocess(pool: SandboxPool, n: int, clients: int) -> dict[str, float]:
    async def one() -> None:
        r = await pool.run_python(CODE)
        assert r.stdout == b"1\n", r

    await _drive(min(n, 4 * clients), clients, one)  # warm every slot
    return await _drive(n, clients, one)


async def served(url: str, n: int, clients: int) -> dict[str, float]:
    conn = aiohttp.TCPConnector(limit=clients, force_close=False)
    async with aiohttp.ClientSession(connector=conn) as session:
        payload = {"code": CODE, "language": "python"}

        async def one() -> None:
            async with session.post(url + "/run_code", json=payload) as resp:
                body = await resp.json()
            assert resp.status == 200 and body["run_result"]["stdout"] == "1\n", body

        await _drive(min(n, 4 * clients), clients, one)  # warm connections and slots
        return await _drive(n, clients, one)


WRK_SCRIPT = r"""
wrk.method = "POST"
wrk.body = '{"code": "print(1)", "language": "python"}'
wrk.headers["Content-Type"] = "application/json"
bad = 0  -- a global of each thread's Lua state, read back by done() in the main one
local threads = {}
function setup(thread) table.insert(threads, thread) end
function response(status, headers, body)
  if status ~= 200 or not string.find(body, '"stdout":"1\\n"', 1, true) then bad = bad + 1 end
end
function done(summary, latency, requests)
  local wrong = 0
  for _, t in ipairs(threads) do wrong = wrong + t:get("bad") end
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "seconds": %f, "p50_us": %d, "p99_us": %d, "bad": %d, "errors": %d}\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50), latency:percentile(99),
    wrong, e.connect + e.read + e.write + e.status + e.timeout))
end
"""
"""wrk's Lua: POSTs ``print(1)`` to ``/run_code``, counts every response that is not a 200
with ``"stdout":"1\\n"`` (the JSON escape), prints a JSON summary (latency in microseconds)."""


def served_wrk(url: str, clients: int, seconds: float, script: str) -> dict[str, float]:
    """``wrk -t1 -c clients`` for ``seconds`` (after one second of warm-up connections):
    requests per second and latency percentiles; raises if any response was wrong."""
    cmd = ["wrk", "-t1", f"-c{clients}", "--timeout", "30s", "-s", script, url + "/run_code"]
    subprocess.run([*cmd[:-1], "-d1s", cmd[-1]], capture_output=True, check=True)
    out = subprocess.run(
        [*cmd[:-1], f"-d{seconds:g}s", cmd[-1]], capture_output=True, text=True, check=True
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("{"))
    r = json.loads(line)
    if r["bad"] or r["errors"] or not r["requests"]:
        raise RuntimeError(f"wrk: wrong or failed responses: {r}")
    return {
        "rps": r["requests"] / r["seconds"],
        "p50_ms": r["p50_us"] / 1e3,
        "p99_ms": r["p99_us"] / 1e3,
    }


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def start_server(port: int, workers: int, processes: int) -> subprocess.Popen:
    per = max(1, workers // processes)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl", "sandbox-server", "--port", str(port),
         "--workers", str(per), "--max-inflight", "100000", "--processes", str(processes),
         "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start") from None
            time.sleep(0.1)
    time.sleep(0.5 * processes)  # every worker process up
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,16,64", help="concurrent clients, comma-separated")
    ap.add_argument("--requests", type=int, default=300, help="requests per measurement")
    ap.add_argument("--workers", type=int, default=2 * (os.cpu_count() or 1), help="pool size")
    ap.add_argument("--processes", default="1", help="uvicorn worker processes to try")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per figure")
    ap.add_argument(
        "--load", default="aiohttp,wrk", help="load generators, comma-separated: aiohttp, wrk"
    )
    ap.add_argument("--wrk-seconds", type=float, default=3.0, help="each wrk measurement")
    a = ap.parse_args()
    clients = [int(x) for x in a.clients.split(",")]
    processes = [int(x) for x in a.processes.split(",")]
    loads = [x.strip() for x in a.load.split(",") if x.strip()]
    if set(loads) - {"aiohttp", "wrk"}:
        ap.error(f"--load: unknown load generator in {a.load!r}")
    if "wrk" in loads and shutil.which("wrk") is None:
        print("wrk is not on PATH (Debian: apt-get install wrk): skipped", file=sys.stderr)
        loads.remove("wrk")
    if not loads:
        ap.error("no load generator left to run")
    rows = []
    pool = SandboxPool(workers=a.workers)
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(WRK_SCRIPT)
        script.flush()
        try:
            for procs in processes:
                port = _free_port()
                url = f"http://127.0.0.1:{port}"
                server = start_server(port, a.workers, procs)
                try:
                    for c in clients:
                        n = max(a.requests, 4 * c)
                        # in-process and each load generator in turn, each asyncio run on a
                        # fresh uvloop loop; the median of each figure over the rounds (a
                        # busy machine drifts)
                        runs: dict[str, list[dict[str, float]]] = {"in-process": []}
                        for _ in range(a.rounds):
                            runs["in-process"].append(uvloop.run(inprocess(pool, n, c)))
                            for load in loads:
                                runs.setdefault(load, []).append(
                                    uvloop.run(served(url, n, c))
                                    if load == "aiohttp"
                                    else served_wrk(url, c, a.wrk_seconds, script.name)
                                )
                        base = _median(runs["in-process"])
                        for load in loads:
                            srv = _median(runs[load])
                            rows.append((procs, c, load, base, srv))
                            print(
                                f"processes={procs} clients={c}: in-process {base['rps']:.0f}/s "
                                f"p50 {base['p50_ms']:.2f} ms; {load} -> server "
                                f"{srv['rps']:.0f}/s p50 {srv['p50_ms']:.2f} ms",
                                file=sys.stderr,
                            )
                finally:
                    server.terminate()
                    server.wait(60)
        finally:
            pool.close()
    print(f"\n/run_code python print(1), pool of {a.workers} workers, {os.cpu_count()} cores\n")
    print(
        "| server procs | clients | load generator | in-process req/s | p50 ms | p99 ms "
        "| server req/s | p50 ms | p99 ms | throughput ratio | p50 added ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for procs, c, load, b, s in rows:
        print(
            f"| {procs} | {c} | {load} | {b['rps']:.0f} | {b['p50_ms']:.2f} | {b['p99_ms']:.2f} "
            f"| {s['rps']:.0f} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} "
            f"| {s['rps'] / b['rps']:.2f} | {s['p50_ms'] - b['p50_ms']:+.2f} |"
        )


if __name__ == "__main__":
    main()
