"""The sandbox service's cost (issue 19): SandboxFusion ``/run_code`` requests of Python
``print(1)`` against ``agentrl sandbox-server`` on loopback, next to the same runs through
``SandboxPool.run_python`` in this process, on a pool of the same size, in the same run.

For each number of concurrent clients (1, 16, 64): requests per second, p50 and p99 latency,
and the ratios (server / in-process throughput; server p50 minus in-process p50). The
targets: at most 1 ms added at p50, at least 70% of the in-process throughput. The server
runs in its own process (``--processes N`` uvicorn workers, each with its own pool of
``workers / N``); the clients are aiohttp coroutines on uvloop in this one, so on a small
machine they take CPU from the server, as a trainer's reward workers would::

    python benches/bench_service.py                      # 1, 16, 64 clients
    python benches/bench_service.py --processes 1,2      # also two uvicorn workers
    python benches/bench_service.py --requests 400 --workers 4
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
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
    a = ap.parse_args()
    clients = [int(x) for x in a.clients.split(",")]
    processes = [int(x) for x in a.processes.split(",")]
    rows = []
    pool = SandboxPool(workers=a.workers)
    try:
        for procs in processes:
            port = _free_port()
            server = start_server(port, a.workers, procs)
            try:
                for c in clients:
                    n = max(a.requests, 4 * c)
                    # in-process and server alternately, each on a fresh uvloop loop; the
                    # median of each figure over the rounds (a busy machine drifts)
                    bs, ss = [], []
                    for _ in range(a.rounds):
                        bs.append(uvloop.run(inprocess(pool, n, c)))
                        ss.append(uvloop.run(served(f"http://127.0.0.1:{port}", n, c)))
                    base, srv = _median(bs), _median(ss)
                    rows.append((procs, c, base, srv))
                    print(
                        f"processes={procs} clients={c}: in-process {base['rps']:.0f}/s "
                        f"p50 {base['p50_ms']:.2f} ms; server {srv['rps']:.0f}/s "
                        f"p50 {srv['p50_ms']:.2f} ms",
                        file=sys.stderr,
                    )
            finally:
                server.terminate()
                server.wait(60)
    finally:
        pool.close()
    print(f"\n/run_code python print(1), pool of {a.workers} workers, {os.cpu_count()} cores\n")
    print(
        "| server procs | clients | in-process req/s | p50 ms | p99 ms "
        "| server req/s | p50 ms | p99 ms | throughput ratio | p50 added ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for procs, c, b, s in rows:
        print(
            f"| {procs} | {c} | {b['rps']:.0f} | {b['p50_ms']:.2f} | {b['p99_ms']:.2f} "
            f"| {s['rps']:.0f} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} "
            f"| {s['rps'] / b['rps']:.2f} | {s['p50_ms'] - b['p50_ms']:+.2f} |"
        )


if __name__ == "__main__":
    main()
