"""``agentrl serve`` request latency and throughput on loopback, for a tiny built-in policy.

    python benches/serve_latency.py                      # this interpreter's agentrl
    python benches/serve_latency.py --python A --python B  # side by side (e.g. before/after)

Each ``--python`` interpreter runs ``agentrl serve`` on a tiny checkpoint (2 layers, d=32,
CPU, one torch thread) in a subprocess; this process measures it with one httpx client
(keep-alive): the median and p90 latency of ``/health`` and of ``/v1/completions`` with
``max_tokens`` 1 and 16 (greedy), interleaved round-robin across the servers so load drift
hits all alike, then requests per second with 16 concurrent clients (``max_tokens`` 1).
Prints a Markdown table; ratios are against the first interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def _start(python: str, ckpt: Path) -> tuple[subprocess.Popen[str], str]:
    argv = [python, "-m", "agentrl", "serve", "--policy", str(ckpt), "--port", "0"]
    argv += ["--device", "cpu", "--model-name", "tiny"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if "listening on " not in line:
        proc.kill()
        raise RuntimeError(f"{python}: agentrl serve did not start: {line!r} {proc.stderr.read()}")  # type: ignore[union-attr]
    return proc, line.split("listening on ")[1].split()[0]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _throughput(url: str, clients: int, per_client: int) -> float:
    body = {"prompt": "x = ", "max_tokens": 1, "temperature": 0}
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:

        async def worker() -> None:
            for _ in range(per_client):
                r = await c.post("/v1/completions", json=body)
                r.raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return clients * per_client / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", help="interpreter with agentrl installed")
    ap.add_argument("--requests", type=int, default=200, help="requests per latency case")
    args = ap.parse_args()
    pythons = args.python or [sys.executable]

    import torch
    from agentrl.policy import GPTConfig, Policy

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp())
    Policy.builtin(GPTConfig(n_layer=2, n_head=2, d_model=32, max_seq_len=96), device="cpu").save(
        tmp / "ckpt"
    )
    servers = [_start(p, tmp / "ckpt") for p in pythons]
    cases = {
        "GET /health": ("GET", "/health", None),
        "completion, 1 token": (
            "POST",
            "/v1/completions",
            {"prompt": "x = ", "max_tokens": 1, "temperature": 0},
        ),
        "completion, 16 tokens": (
            "POST",
            "/v1/completions",
            {"prompt": "x = ", "max_tokens": 16, "temperature": 0},
        ),
    }
    lat: dict[tuple[int, str], list[float]] = {}
    try:
        clients = [httpx.Client(base_url=url, timeout=60) for _, url in servers]
        for name, (method, path, body) in cases.items():
            for i, c in enumerate(clients):  # warm-up
                for _ in range(10):
                    c.request(method, path, json=body).raise_for_status()
                lat[(i, name)] = []
            for _ in range(args.requests):
                for i, c in enumerate(clients):
                    t0 = time.perf_counter()
                    c.request(method, path, json=body).raise_for_status()
                    lat[(i, name)].append(time.perf_counter() - t0)
        rps = [asyncio.run(_throughput(url, 16, 25)) for _, url in servers]
    finally:
        for proc, _ in servers:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    print(
        "| case | " + " | ".join(f"server {i} p50 / p90 (ms)" for i in range(len(pythons))) + " |"
    )
    print("|---" * (len(pythons) + 1) + "|")
    for name in cases:
        cells = []
        for i in range(len(pythons)):
            xs = lat[(i, name)]
            p50 = statistics.median(xs) * 1e3
            ratio = p50 / (statistics.median(lat[(0, name)]) * 1e3)
            cells.append(f"{p50:.2f} / {_pct(xs, 0.9) * 1e3:.2f} ({ratio:.2f}x)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    cells = [f"{r:.0f} req/s ({r / rps[0]:.2f}x)" for r in rps]
    print("| 16 clients, 1 token | " + " | ".join(cells) + " |")
    for i, p in enumerate(pythons):
        print(f"server {i}: {p}")


if __name__ == "__main__":
    main()
