"""RayPool against the local SandboxPool on the same machine: jobs/s and CPU per job.

    .venv/bin/python benches/bench_ray.py [--jobs 400] [--workers 4] [--repeats 3] [--no-cluster]

* Anchor: Ray's own empty actor-call rate on this machine (one call at a time, and 1000
  calls in flight), measured in the same run.
* Jobs: ``print(i)`` Python runs (warm interpreters) through a local ``SandboxPool`` and
  through a ``RayPool`` with one actor of the same workers on a local Ray instance:
  batched (``submit_many`` / ``collect``) and unbatched (one ``submit`` future per job; the
  RayPool still groups what arrives together), and a RayPool with ``batch_size=1`` (one Ray
  call per job: what batching saves).
* CPU per job: this process's ``getrusage`` (self and reaped children) plus every
  descendant's CPU (psutil): the boxes and warm interpreters, and the local Ray instance's
  raylet, GCS, actor and its boxes, before and after each run. The same count for both
  pools; "of which driver" is this process alone.
* HumanEval: the 164 canonical solutions judged on a simulated 3-node cluster
  (``ray.cluster_utils.Cluster``) against the local Evaluator on a borrowed pool (the same
  per-run path) and on its own pool (persistent judges).

Prints medians over the repeats and the ratios against the local pool.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import psutil
import ray
from agentrl import SandboxPool
from agentrl.distributed import RayPool


def _own_cpu() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _tree_cpu() -> float:
    """CPU seconds of this process and every descendant (the local pool's boxes and warm
    interpreters; with a local Ray instance, its raylet, GCS, actors and their boxes), each
    with its reaped children."""
    total = _own_cpu()
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def _measure(run: Callable[[], int]) -> tuple[float, float, float]:
    """(jobs/s, CPU seconds per job, of which in this process) of one run."""
    c0, o0, t0 = _tree_cpu(), _own_cpu(), time.perf_counter()
    n = run()
    wall, cpu, own = time.perf_counter() - t0, _tree_cpu() - c0, _own_cpu() - o0
    return n / wall, cpu / n, own / n


def _batched(pool: Any, n: int) -> Callable[[], int]:
    def run() -> int:
        ids = pool.submit_many([f"print({i})" for i in range(n)])
        got = 0
        while got < len(ids):
            outs = pool.collect(timeout=10)
            assert all(o.ok for o in outs), outs[:1]
            got += len(outs)
        return n

    return run


def _unbatched(pool: Any, n: int) -> Callable[[], int]:
    def run() -> int:
        futs = [pool.submit_python(f"print({i})") for i in range(n)]
        assert all(f.result(60).stdout == f"{i}\n".encode() for i, f in enumerate(futs))
        return n

    return run


@ray.remote(num_cpus=0)
class _Empty:
    def ping(self) -> None:
        return None


def _anchor(repeats: int) -> dict[str, float]:
    a = _Empty.remote()
    ray.get(a.ping.remote())
    one, many = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(300):
            ray.get(a.ping.remote())
        one.append(300 / (time.perf_counter() - t))
        t = time.perf_counter()
        ray.get([a.ping.remote() for _ in range(1000)])
        many.append(1000 / (time.perf_counter() - t))
    ray.kill(a)
    return {"sync": statistics.median(one), "pipelined": statistics.median(many)}


def _jobs_table(args: argparse.Namespace) -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=100 << 20)  # fmt: skip
    try:
        anchor = _anchor(args.repeats)
        print(f"Ray empty actor call: {anchor['sync']:.0f}/s one at a time "
              f"({1000 / anchor['sync']:.2f} ms per round trip), "
              f"{anchor['pipelined']:.0f}/s with 1000 in flight")  # fmt: skip
        rows: dict[str, list[tuple[float, float, float]]] = {}
        local = SandboxPool(workers=args.workers)
        rp = RayPool(num_actors=1, workers_per_actor=args.workers, num_cpus=0)
        rp1 = RayPool(num_actors=1, workers_per_actor=args.workers, num_cpus=0, batch_size=1)
        c0 = _tree_cpu()
        time.sleep(2.0)
        idle = (_tree_cpu() - c0) / 2.0
        print(f"At rest (Ray's processes, the pools): {1000 * idle:.0f} ms CPU per second")
        cases = {
            "local batched": (local, _batched),
            "ray batched": (rp, _batched),
            "local unbatched": (local, _unbatched),
            "ray unbatched": (rp, _unbatched),
            "ray batch_size=1": (rp1, _unbatched),
        }
        for pool, fn in {id(p): (p, f) for p, f in cases.values()}.values():
            fn(pool, 50)()  # warm up every pool
        for _ in range(args.repeats):  # interleaved, so drift hits every case alike
            for name, (pool, fn) in cases.items():
                rows.setdefault(name, []).append(_measure(fn(pool, args.jobs)))
        local.close()
        rp.close()
        rp1.close()
    finally:
        ray.shutdown()
    med = {k: tuple(statistics.median(r[i] for r in v) for i in range(3))
           for k, v in rows.items()}  # fmt: skip
    print(f"\n{args.jobs} jobs x {args.repeats} repeats, {args.workers} workers "
          f"(one actor), median:\n")  # fmt: skip
    print("| path | jobs/s | CPU ms/job | of which driver | vs local jobs/s | vs local CPU |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (rate, cpu, own) in med.items():
        base = med["local unbatched" if "unbatched" in name or "=1" in name else "local batched"]
        print(f"| {name} | {rate:.0f} | {1000 * cpu:.3f} | {1000 * own:.3f} | "
              f"{rate / base[0]:.2f}x | {cpu / base[1]:.2f}x |")  # fmt: skip
    for kind in ("batched", "unbatched"):
        extra = med[f"ray {kind}"][1] - med[f"local {kind}"][1]
        print(f"Ray overhead per job ({kind}): {1000 * extra:+.3f} ms CPU "
              f"({100 * extra / med[f'local {kind}'][1]:+.1f}%)")  # fmt: skip


def _humaneval(args: argparse.Namespace) -> None:
    from agentrl.evaluation import Evaluator
    from agentrl.evaluation.tasks import load_humaneval
    from ray.cluster_utils import Cluster

    tasks = load_humaneval()
    pairs = [(t, t.canonical_solution or "") for t in tasks]

    def rate(ev: Evaluator) -> float:
        ev.judge_many(pairs[:10])
        best = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            js = ev.judge_many(pairs)
            best.append(len(js) / (time.perf_counter() - t))
            assert sum(j.passed for j in js) == 164
        return statistics.median(best)

    with SandboxPool(workers=args.workers) as p, Evaluator(p) as ev:
        borrowed = rate(ev)
    with Evaluator(workers=args.workers) as ev:
        owned = rate(ev)
    node = {"num_cpus": 1, "object_store_memory": 80 << 20, "resources": {"agentrl_sandbox": 1}}
    c = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    for _ in range(2):
        c.add_node(**node)
    try:
        ray.init(address=c.address, log_to_driver=False, include_dashboard=False)
        per = max(1, args.workers // 3)
        with RayPool(workers_per_actor=per, num_cpus=0) as rp, Evaluator(rp) as ev:
            cluster = rate(ev)
    finally:
        ray.shutdown()
        c.shutdown()
    print(f"\nHumanEval 164 canonical solutions, samples/s (median of {args.repeats}):\n")
    print("| evaluator | samples/s | vs local borrowed pool |")
    print("|---|---:|---:|")
    print(f"| local, borrowed SandboxPool ({args.workers} workers) | {borrowed:.1f} | 1.00x |")
    print(f"| local, own pool (persistent judges) | {owned:.1f} | {owned / borrowed:.2f}x |")
    print(f"| RayPool, 3 simulated nodes x {per} workers | {cluster:.1f} | "
          f"{cluster / borrowed:.2f}x |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-cluster", action="store_true", help="skip the HumanEval cluster part")
    args = ap.parse_args()
    _jobs_table(args)
    if not args.no_cluster:
        _humaneval(args)


if __name__ == "__main__":
    main()
