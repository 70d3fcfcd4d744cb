"""RayPool and RayGenerationBackend on a simulated three-node Ray cluster on this machine.

One ``ray.cluster_utils.Cluster`` (three nodes of two CPUs, each with one ``agentrl_sandbox``
resource) and one RayPool serve the whole module: starting them costs tens of seconds on a
loaded two-core host. Job counts are hundreds, not thousands, to keep the file short; the
node-removal test runs last, since it shrinks the cluster. The teardown checks that no
process of the cluster's session is left.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ray = pytest.importorskip("ray")
from agentrl import Limits, SandboxPool, Status  # noqa: E402
from agentrl.distributed import RayGenerationBackend, RayPool  # noqa: E402
from agentrl.distributed.actor import INFLIGHT_PER_WORKER, SandboxActor  # noqa: E402
from agentrl.evaluation import Evaluator  # noqa: E402
from agentrl.evaluation.tasks import load_humaneval  # noqa: E402
from agentrl.pool import Executor, JobStatus  # noqa: E402
from conftest import TIME_SCALE  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

NODE = {"num_cpus": 2, "object_store_memory": 80 << 20, "resources": {"agentrl_sandbox": 1}}
LIMITS = Limits(wall_time_s=10.0 * TIME_SCALE, cpu_time_s=5.0 * TIME_SCALE, memory_bytes=128 << 20)


def _session_procs(session: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if session.encode() in f.read():
                    out.append(int(pid))
        except OSError:
            pass
    return out


@pytest.fixture(scope="module")
def cluster() -> Any:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    c = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    workers = [c.add_node(**NODE) for _ in range(2)]
    session = Path(c.head_node.get_session_dir_path()).name
    try:
        ray.init(address=c.address, log_to_driver=False, include_dashboard=False)
        c.wait_for_nodes()
        c.workers = workers  # type: ignore[attr-defined]
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        deadline = time.monotonic() + 30
        while _session_procs(session) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _session_procs(session), "ray processes outlived the cluster"


@pytest.fixture(scope="module")
def pool(cluster: Any) -> Any:
    p = RayPool(workers_per_actor=2, limits=LIMITS, replace_timeout=30)
    yield p
    p.close()


def _mixed() -> list[dict[str, Any]]:
    short = Limits(wall_time_s=1.0 * TIME_SCALE, cpu_time_s=1.0 * TIME_SCALE)
    small = Limits(memory_bytes=64 << 20, wall_time_s=10.0 * TIME_SCALE)
    jobs: list[dict[str, Any]] = []
    for i in range(12):
        jobs.append({"source": f"print({i} * {i})"})
        jobs.append({"source": "import sys; sys.exit(3)"})
    jobs.append({"source": "while True: pass", "limits": short})
    jobs.append({"source": "import time; time.sleep(60)", "limits": short})
    jobs.append({"source": 'b = b"x" * (600 << 20)\nprint(len(b))', "limits": small})
    jobs.append({"source": "c = []\nwhile True:\n    c.append(bytes(1 << 20))", "limits": small})
    hostile = (
        "import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            import time; time.sleep(30); os._exit(0)\n        n += 1\n"
        "except OSError as e:\n    print('eagain', e.errno)\n"
    )
    jobs.append({"source": hostile, "limits": LIMITS.replace(max_pids=16)})
    marker = f"/tmp/agentrl-ray-escape-{os.getpid()}"
    jobs.append({"source": f"open({marker!r}, 'w').write('x'); print('wrote')"})
    jobs.append({"argv": ["/bin/sh", "-c", "echo hi; kill -9 $$"]})
    return jobs


def _verdict(r: Any) -> tuple[Any, ...]:
    return (r.status, r.exit_code, r.signal, r.stdout if r.status is Status.OK else None)


# First, while the module's pool does not hold the sandbox resources yet.


def test_train_with_ray_learns_as_local(cluster: Any, tmp_path: Path) -> None:
    from agentrl.cli.main import main as cli

    common = [
        "--seed", "0", "--threads", "1", "--rl-threads", "1", "--no-progress",
        "--families", "arith", "--sft-steps", "40", "--sft-batch-size", "16", "--steps", "3",
        "--group-size", "4", "--groups-per-step", "4", "--max-staleness", "0",
        "--eval-every", "0", "--eval-samples", "1", "--final-eval-samples", "1",
        "--sandbox-workers", "2",
    ]  # fmt: skip
    runs = {}
    for name, extra in (("local", []), ("ray", ["--ray", cluster.address])):
        out = tmp_path / name
        assert cli(["train", "--out-dir", str(out), *common, *extra]) == 0
        runs[name] = json.loads((out / "summary.json").read_text())
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        runs[name]["rewards"] = [r["reward_mean"] for r in rows if r.get("event") == "step"]
    loc, ray_run = runs["local"], runs["ray"]
    assert len(ray_run["rewards"]) == len(loc["rewards"]) == 3
    assert ray_run["sandbox_runs"] >= 3 * 16
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert abs(mean(ray_run["rewards"]) - mean(loc["rewards"])) < 0.15, runs
    assert abs(ray_run["final_pass_rate"] - loc["final_pass_rate"]) < 0.25, runs


def test_cli_eval_with_ray(cluster: Any, tmp_path: Path, capsys: Any) -> None:
    from agentrl.cli.main import main as cli

    samples = tmp_path / "samples.jsonl"
    tasks = load_humaneval()[:4]
    rows = [{"task_id": t.task_id, "completion": t.canonical_solution} for t in tasks]
    rows.append({"task_id": tasks[0].task_id, "completion": "    return None\n"})
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["eval", str(samples), "--ray", cluster.address, "--ignore-incomplete", "--k", "1"]
    assert cli([*argv, "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "| pass@1 | 0.8750 |" in out and "| samples | 5 |" in out
    results = [json.loads(x) for x in Path(f"{samples}_results.jsonl").read_text().splitlines()]
    assert [r["passed"] for r in results] == [True, True, True, True, False]


def test_generation_on_a_ray_actor_with_weights_pushed_mid_run(cluster: Any) -> None:
    from agentrl.policy import GPTConfig, Policy, SamplingParams
    from agentrl.rollout.scheduler import RolloutScheduler, SchedulerConfig
    from agentrl.train import GRPOConfig, GRPOTrainer
    from agentrl.train.trainer import train_on_scheduler

    class CharEnv:
        async def reset(self, task: Any) -> str:
            return str(task)

        async def step(self, g: Any) -> tuple[None, float, bool, dict]:
            return None, g.text.count("a") / max(1, len(g.text)), True, {}

    tiny = GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=64)
    pol = Policy.builtin(tiny, device="cpu", seed=0)
    backend = RayGenerationBackend(pol.copy(), num_cpus=0.5)
    trainer = GRPOTrainer(pol, GRPOConfig(lr=1e-2))
    seeds = iter(range(10**6))
    versions: list[int] = []

    async def generate(eps: list[Any]) -> list[Any]:
        p = SamplingParams(max_new_tokens=5, seed=next(seeds))
        gens = await backend.generate([e.observation for e in eps], p)
        versions.extend(g.version for g in gens)
        return gens

    async def main() -> list[dict[str, float]]:
        seen: list[dict[str, float]] = []
        cfg = SchedulerConfig(batch_size=8, max_staleness=1, max_batch=8)
        async with RolloutScheduler(generate, lambda t: CharEnv(), config=cfg) as sched:
            sched.feed(iter(lambda: "b", None), group_size=4)
            await train_on_scheduler(
                trainer, sched, backend, steps=3, batch_episodes=8,
                on_step=lambda m, g: seen.append(m),
            )  # fmt: skip
        return seen

    try:
        seen = asyncio.run(main())
        assert [m["step"] for m in seen] == [1, 2, 3]
        assert backend.version == trainer.version == 3
        assert ray.get(backend._actors[0].version.remote()) == 3
        assert max(versions) >= 2 and min(versions) == 0  # later batches ran on pushed weights
        assert backend.nodes()[0] in {n["NodeID"] for n in ray.nodes()}
    finally:
        backend.close()


def test_actor_sizes_its_pool_by_its_own_node(monkeypatch: Any) -> None:
    """Without ``workers_per_actor`` an actor's pool has two workers per core of the actor's
    node, and its capacity (room for what the driver may send it) follows that node's cores,
    not the driver's (a small head node driving large sandbox nodes)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 16)  # this process stands in for the node
    actor = SandboxActor({}, None, 64)
    try:
        assert actor._pool.workers == 32
        assert actor._pool._capacity == 2 * INFLIGHT_PER_WORKER * 32 + 64 + 64
    finally:
        actor.shutdown()
    actor = SandboxActor({"workers": 2}, 10, 8)  # max_inflight_per_actor=10, batch_size=8
    try:
        assert actor._pool._capacity == 2 * 10 + 8 + 64
    finally:
        actor.shutdown()
    actor = SandboxActor({"workers": 2, "capacity": 7}, 10, 8)  # pool_options' own capacity
    try:
        assert actor._pool._capacity == 7
    finally:
        actor.shutdown()


def test_is_an_executor_and_stats_per_node(pool: RayPool) -> None:
    assert isinstance(pool, Executor)
    with pytest.raises(ValueError, match="num_actors"):
        RayPool(num_actors=0)
    with pytest.raises(ValueError, match="backpressure"):
        RayPool(backpressure="drop")
    with pytest.raises(TypeError, match="limits"):
        RayPool(limits={"wall_time_s": 1})  # type: ignore[arg-type]
    assert pool.workers == 6
    assert pool.submit_python("print(6 * 7)").result(60).stdout == b"42\n"
    s = pool.stats(refresh=True)
    assert s["actors"] == 3 and len(s["nodes"]) == 3
    assert sum(n["completed"] for n in s["nodes"].values()) == s["completed"] >= 1


def test_mixed_batch_same_verdicts_as_local(pool: RayPool) -> None:
    jobs = _mixed()
    with SandboxPool(workers=2, limits=LIMITS) as local:
        want = [_verdict(r) for r in local.map(jobs)]
    marker = f"/tmp/agentrl-ray-escape-{os.getpid()}"
    assert not os.path.exists(marker)
    got = [_verdict(r) for r in pool.map(jobs, timeout=120 * TIME_SCALE)]
    assert got == want
    kinds = Counter(v[0] for v in got)
    assert kinds[Status.TIMEOUT] == 2 and kinds[Status.MEMORY_LIMIT] == 2, kinds
    assert kinds[Status.SANDBOX_ERROR] == 0
    assert not os.path.exists(marker)  # the box's /tmp is its own, on every node


def test_async_run_submit_many_collect_and_cancel(pool: RayPool) -> None:
    async def main() -> list[Any]:
        return await asyncio.gather(*(pool.run_python(f"print({i})") for i in range(20)))

    assert [r.stdout for r in asyncio.run(main())] == [f"{i}\n".encode() for i in range(20)]
    slow = "import time; time.sleep(30)"
    ids = pool.submit_many([slow] * 6, group=7)
    ids += pool.submit_many(["print('x')"] * 10)
    time.sleep(0.5)
    assert pool.cancel(7) == 6
    outs: list[Any] = []
    end = time.monotonic() + 60 * TIME_SCALE
    while len(outs) < len(ids) and time.monotonic() < end:
        outs += pool.collect(timeout=5)
    assert sorted(o.job_id for o in outs) == sorted(ids)
    st = Counter(o.status for o in outs)
    assert st == {JobStatus.CANCELLED: 6, JobStatus.COMPLETED: 10}
    with pytest.raises(TypeError, match="pass_fds"):
        pool.submit(["true"], pass_fds=[3])
    with pytest.raises(TypeError, match="job 1"):
        pool.submit_many(["print(1)", 42])


def test_evaluator_scores_humaneval_canonical_on_the_cluster(pool: RayPool) -> None:
    tasks = load_humaneval()
    with Evaluator(pool, timeout=10.0 * TIME_SCALE) as ev:
        js = ev.judge_many([(t, t.canonical_solution or "") for t in tasks])
    assert len(js) == 164
    assert [j.task_id for j in js if not j.passed] == []
    per_node = [n["completed"] for n in pool.stats(refresh=True)["nodes"].values()]
    assert len(per_node) == 3 and min(per_node) > 0  # every node judged some


def test_actor_killed_mid_batch_loses_and_duplicates_nothing(pool: RayPool) -> None:
    before = pool.stats()
    n = 2000
    ids = pool.submit_many([f"import time; time.sleep(0.005); print({i})" for i in range(n)])
    time.sleep(1.0)
    victim = next(a for a in pool._actors if a.alive and a.assigned)
    ray.kill(victim.handle)
    outs: list[Any] = []
    end = time.monotonic() + 120 * TIME_SCALE
    while len(outs) < n and time.monotonic() < end:
        outs += pool.collect(timeout=5)
    assert Counter(o.job_id for o in outs) == Counter(ids)  # each exactly once
    first = ids[0]
    assert all(o.ok and o.result.stdout == f"{o.job_id - first}\n".encode() for o in outs)
    after = pool.stats()
    assert after["actors_lost"] == before["actors_lost"] + 1
    assert after["infra_retries"] > before["infra_retries"]
    assert after["failed"] == before["failed"]
    end = time.monotonic() + 60 * TIME_SCALE
    while pool.stats()["actors"] < 3 and time.monotonic() < end:
        time.sleep(0.5)
    assert pool.stats()["actors_replaced"] >= 1  # its resource freed, a new actor took it


def test_metrics_aggregate_the_cluster_pool(pool: RayPool) -> None:
    """Prometheus sees a RayPool as one pool: totals, faults (the actor the test above
    killed) and each node's share."""
    pytest.importorskip("prometheus_client")
    from agentrl.observability.metrics import instrument, render, unregister_stats

    instrument(pool, "cluster")
    try:
        s = pool.stats(refresh=True)
        text = render()[0].decode()
    finally:
        unregister_stats("cluster")

    def value(metric: str) -> float:
        m = re.search(rf'^{metric}\{{pool="cluster"\}} (\S+)', text, re.M)
        assert m, (metric, text[:3000])
        return float(m.group(1))

    assert value("agentrl_pool_actors_lost_total") == s["actors_lost"] >= 1
    assert value("agentrl_pool_infra_retries_total") == s["infra_retries"] >= 1
    assert value("agentrl_pool_jobs_submitted_total") == s["submitted"]
    assert value("agentrl_pool_workers") == s["workers"]
    nodes = re.findall(
        r'^agentrl_pool_node_actors\{node="([^"]+)",pool="cluster"\} (\S+)', text, re.M
    )
    assert {n for n, _ in nodes} == set(s["nodes"]), text[:3000]
    assert sum(float(v) for _, v in nodes) == s["actors"]


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(1, 12), st.integers(0, 3)),
        st.tuples(st.just("cancel_group"), st.integers(1, 3), st.just(0)),
        st.tuples(st.just("cancel_job"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("kill"), st.integers(0, 5), st.just(0)),
        st.tuples(st.just("sleep"), st.integers(1, 3), st.just(0)),
    ),
    min_size=3,
    max_size=10,
)


def _kill_node(cluster: Any, pool: RayPool, a: int) -> None:
    """Removes a worker node that holds a live actor (waiting for a replacement actor to be
    placed if an earlier kill left none there), and adds a fresh node in its place."""
    by_id = {n.node_id: n for n in cluster.workers}
    end = time.monotonic() + 30 * TIME_SCALE
    while True:
        held = [x.info["node_id"] for x in pool._actors if x.alive and x.info["node_id"] in by_id]
        if held or time.monotonic() > end:
            break
        time.sleep(0.1)
    assert held, "no live actor on a worker node to take down"
    node = by_id[held[a % len(held)]]
    cluster.remove_node(node)
    cluster.workers = [n for n in cluster.workers if n is not node]
    cluster.workers.append(cluster.add_node(wait=False, **NODE))


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=_OPS, kill_at=st.integers(0, 10))
def test_property_submit_cancel_kill_keep_exactly_once(
    cluster: Any, pool: RayPool, ops: list, kill_at: int
) -> None:
    ops = [
        *ops[:kill_at],
        ("submit", 8, 0),
        ("kill", kill_at, 0),
        ("submit", 8, 1),
        ("node", kill_at, 0),
        *ops[kill_at:],
    ]  # an actor killed and a whole node taken down in every example, with jobs in flight
    ids: list[int] = []
    futs: list[Any] = []
    for op, a, b in ops:
        if op == "submit":
            job = f"import time; time.sleep(0.05); print({a})"
            ids += pool.submit_many([job] * a, group=b)
            futs += [pool.submit_python(job, group=b)]
        elif op == "cancel_group":
            pool.cancel(a)
        elif op == "cancel_job" and futs:
            futs[a % len(futs)].cancel()
        elif op == "kill":
            alive = [x for x in pool._actors if x.alive]
            if len(alive) >= 2:
                ray.kill(alive[a % len(alive)].handle)
        elif op == "node":
            _kill_node(cluster, pool, a)
        elif op == "sleep":
            time.sleep(0.1 * a)
    outs: list[Any] = []
    end = time.monotonic() + 120 * TIME_SCALE
    while len(outs) < len(ids) and time.monotonic() < end:
        outs += pool.collect(timeout=2)
    assert Counter(o.job_id for o in outs) == Counter(ids)
    assert pool.collect(timeout=0.2) == []
    for o in outs:
        assert o.status in (JobStatus.COMPLETED, JobStatus.CANCELLED), o
        if o.ok:
            assert o.result.status is Status.OK
    for f in futs:
        assert f.cancelled() or f.result(120 * TIME_SCALE).status is Status.OK


def test_node_removed_with_jobs_in_flight_loses_and_duplicates_nothing(
    cluster: Any, pool: RayPool
) -> None:
    """Last: it takes a node out of the module's cluster."""
    end = time.monotonic() + 60 * TIME_SCALE
    while pool.stats()["actors"] < 3 and time.monotonic() < end:
        time.sleep(0.5)
    before = pool.stats()
    n = 2000
    jobs = [f"import time; time.sleep(0.005); print({i})" for i in range(n)]
    futs = [pool.submit_python(j) for j in jobs]
    time.sleep(1.0)
    cluster.remove_node(cluster.workers[0])
    got = [f.result(180 * TIME_SCALE).stdout for f in futs]
    assert got == [f"{i}\n".encode() for i in range(n)]
    after = pool.stats()
    assert after["completed"] - before["completed"] == n
    assert after["actors_lost"] >= before["actors_lost"] + 1
    assert after["infra_retries"] > before["infra_retries"]
    assert after["failed"] == before["failed"]
