"""The main job of ``agentrl train``: built-in coding tasks, a supervised warm start of the
built-in TinyGPT, then GRPO with sandbox rewards on the rollout scheduler.

Phases: (1) warm start on a weak programmer's programs (:mod:`.tasks`); (2) held-out pass
rate of the warm-started policy; (3) GRPO: a :class:`~agentrl.RolloutScheduler` samples
``group_size`` completions per training task with a generator copy of the policy, the
sandboxed :class:`~agentrl.evaluation.Evaluator` judges them (partial credit), and
:func:`~agentrl.train.trainer.train_on_scheduler` updates the policy and syncs the
generator; (4) the final held-out pass rate. Writes ``metrics.jsonl``, ``checkpoint/``,
``plot.png`` and ``summary.json`` under the output directory.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import json
import random
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from agentrl.train.checkpoint import load_checkpoint, save_checkpoint
from agentrl.train.config import TrainConfig
from agentrl.train.families import CodeTask, all_tasks, split_tasks, task_stream, warm_start_data
from agentrl.train.progress import ProgressView
from agentrl.train.sft import supervised_warm_start
from agentrl.train.trainer import GRPOTrainer, train_on_scheduler

__all__ = ["TaskEnv", "evaluate_pass_rate", "run_job"]

STOP = ("\n",)


class TaskEnv:
    """A single-turn episode of a :class:`CodeTask`: the observation is the prompt, the
    action a :class:`~agentrl.policy.Generation`, the reward the shaped sandbox verdict
    (None when the sandbox failed: masked)."""

    def __init__(self, task: CodeTask, evaluator: Any, reward_config: Any, cache: dict) -> None:
        self.task, self.evaluator, self.reward_config, self._cache = (
            task,
            evaluator,
            reward_config,
            cache,
        )

    async def reset(self, task: CodeTask) -> str:
        return task.prompt

    async def step(self, action: Any) -> tuple[None, float | None, bool, dict[str, Any]]:
        from agentrl.evaluation.rewards import shape

        ftask = self._cache.get(self.task.task_id)
        if ftask is None:
            ftask = self._cache[self.task.task_id] = self.task.to_function_task()
        j = await self.evaluator.ajudge(ftask, action.text)
        r = shape(j, action.text, self.reward_config)
        info = {"passed": j.passed, "fraction": j.fraction, "error": j.error_class.value}
        if r.masked:
            info["masked"] = r.reason
        return None, r.value, True, info


async def evaluate_pass_rate(
    policy: Any,
    tasks: list[CodeTask],
    samples: int,
    evaluator: Any,
    params: Any,
    executor: concurrent.futures.Executor | None = None,
    cache: dict | None = None,
) -> dict[str, float]:
    """Samples ``samples`` completions per task with ``policy`` (in ``executor``) and judges
    them in the sandbox: the pass rate (pass@1, estimated over the samples), the mean
    fraction of tests passed, and the masked count."""
    loop = asyncio.get_running_loop()
    prompts = [t.prompt for t in tasks for _ in range(samples)]
    gens = await loop.run_in_executor(executor, policy.generate, prompts, params)
    cache = {} if cache is None else cache
    jobs = []
    for i, g in enumerate(gens):
        t = tasks[i // samples]
        ft = cache.get(t.task_id)
        if ft is None:
            ft = cache[t.task_id] = t.to_function_task()
        jobs.append(evaluator.ajudge(ft, g.text))
    judgements = await asyncio.gather(*jobs)
    ok = [j for j in judgements if not j.masked]
    n = max(1, len(ok))
    return {
        "pass_rate": sum(j.passed for j in ok) / n,
        "fraction": sum(j.fraction for j in ok) / n,
        "masked": float(len(judgements) - len(ok)),
        "samples": float(len(judgements)),
    }


def _out_dir(c: TrainConfig) -> Path:
    if c.out_dir:
        return Path(c.out_dir)
    return Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")


def _seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # pragma: no cover
        pass


class _Observability:
    """The run's Prometheus endpoint (``metrics_port``) and its tracer (``traces``)."""

    def __init__(self, c: TrainConfig, out: Path, view: ProgressView) -> None:
        self.server = self.tracer = None
        self.metrics: Any = None
        if c.metrics_port is not None:
            from agentrl.observability import metrics

            self.metrics = metrics
            self.server = metrics.start_http_server(c.metrics_port)
            view.message(f"metrics at http://127.0.0.1:{self.server.server_port}/metrics")
        if c.traces != "none":
            from agentrl.observability.traces import Tracer

            self.tracer = Tracer(out / "traces", sink=c.traces, name="train")

    def instrument(self, obj: Any, name: str, kind: str = "pool") -> None:
        if self.metrics is None:
            return
        if kind == "pool":
            self.metrics.instrument(obj, name)
        else:
            self.metrics.register_stats(obj, name, kind)

    def step(self, rec: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.record_trainer_step(rec)

    def close(self) -> None:
        if self.tracer is not None:
            self.tracer.close()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def run_job(config: TrainConfig | None = None, *, view: ProgressView | None = None) -> dict:
    """Runs the main job; returns its summary (also written to ``summary.json``)."""
    c = config or TrainConfig()
    view = view or ProgressView(enabled=c.progress)
    try:
        return asyncio.run(_run(c, view))
    finally:
        view.close()


async def _run(c: TrainConfig, view: ProgressView) -> dict[str, Any]:
    from agentrl.evaluation import Evaluator
    from agentrl.evaluation.rewards import RewardConfig
    from agentrl.policy import GPTConfig, LocalBackend, Policy, SamplingParams
    from agentrl.rollout.scheduler import RolloutScheduler, SchedulerConfig

    t_start = time.monotonic()
    out = _out_dir(c)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(c.to_dict(), indent=2) + "\n")
    from agentrl.observability.report import RunReport

    log = RunReport(out, c.report_to, c.to_dict())
    obs = _Observability(c, out, view)
    _seed_all(c.seed)
    torch.set_num_threads(c.threads)
    families = None if c.families is None else [f.strip() for f in c.families.split(",")]
    train_tasks, held_tasks = split_tasks(all_tasks(families), held_out=c.held_out)
    gpt = GPTConfig(
        n_layer=c.n_layer, n_head=c.n_head, d_model=c.d_model, max_seq_len=c.max_seq_len
    )
    policy = Policy.builtin(gpt, device=c.device, seed=c.seed)
    if policy.device.type != "cpu":
        policy = Policy(policy.model, policy.tokenizer, device=policy.device, dtype=torch.float32)
    trainer = GRPOTrainer(policy, c.grpo)
    summary: dict[str, Any] = {
        "out_dir": str(out),
        "train_tasks": len(train_tasks),
        "held_out_tasks": len(held_tasks),
    }
    log.write("start", config=c.to_dict(), **summary)
    view.message(
        f"agentrl train: {len(train_tasks)} training tasks, {len(held_tasks)} held out; "
        f"output in {out}"
    )

    # ---- (1) warm start
    warm_meta: dict[str, Any] = {}
    t0 = time.monotonic()
    if c.resume:
        warm_meta = load_checkpoint(c.resume, trainer)
        view.message(f"resumed from {c.resume} at step {trainer.step}")
    elif c.sft.steps:
        sft = c.sft if c.sft.seed is not None else dataclasses.replace(c.sft, seed=c.seed)
        pairs = warm_start_data(
            train_tasks, sft.steps * sft.batch_size, p_correct=c.p_correct, seed=c.seed
        )

        def on_sft(step: int, loss: float, secs: float) -> None:
            view.update("warm start", step + 1, sft.steps, {"loss": loss})
            if step % 20 == 0 or step + 1 == sft.steps:
                log.write("sft", step=step + 1, loss=loss, seconds=secs)

        await asyncio.get_running_loop().run_in_executor(
            None, lambda: supervised_warm_start(policy, pairs, sft, on_step=on_sft)
        )
    summary["warm_start_s"] = time.monotonic() - t0

    cache: dict[str, Any] = {}
    seeds = itertools.count(c.seed * 1_000_003 + 1)
    train_ex = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentrl-train")

    def params(seed: int) -> Any:
        return SamplingParams(
            max_new_tokens=c.grpo.max_new_tokens,
            temperature=c.grpo.temperature,
            top_p=c.top_p,
            stop=STOP,
            seed=seed,
        )

    ray_pool = None
    if c.ray_address:
        from agentrl.distributed import RayPool

        ray_pool = RayPool(workers_per_actor=c.sandbox_workers, address=c.ray_address)
        evaluator = Evaluator(ray_pool, timeout=c.eval_timeout, tracer=obs.tracer)
    else:
        evaluator = Evaluator(workers=c.sandbox_workers, timeout=c.eval_timeout, tracer=obs.tracer)
    obs.instrument(evaluator.pool, "train")
    try:
        # ---- (2) the warm start's held-out pass rate
        t0 = time.monotonic()
        if c.resume and "warm_start_pass_rate" in warm_meta:
            first = {"pass_rate": warm_meta["warm_start_pass_rate"], "fraction": None}
        else:
            view.update("eval", 0, 1, {"held-out tasks": len(held_tasks)}, force=True)
            first = await evaluate_pass_rate(
                policy, held_tasks, c.final_eval_samples, evaluator, params(next(seeds)),
                train_ex, cache,
            )  # fmt: skip
        summary["warm_start_pass_rate"] = first["pass_rate"]
        summary["warm_start_fraction"] = first.get("fraction")
        log.write("eval", step=trainer.step, held_out_pass_rate=first["pass_rate"],
                  held_out_fraction=first.get("fraction"), initial=True,
                  seconds=time.monotonic() - t0)  # fmt: skip
        view.message(
            f"warm start: held-out pass rate {first['pass_rate']:.3f} "
            f"({summary['warm_start_s']:.0f}s)"
        )

        # ---- (3) GRPO
        torch.set_num_threads(c.rl_threads)
        gen_policy = policy.copy()
        backend = LocalBackend(gen_policy)
        reward_cfg = RewardConfig(partial_credit=c.partial_credit)
        history: list[dict[str, Any]] = []
        evals: list[tuple[int, float]] = [(trainer.step, first["pass_rate"])]
        t_rl = time.monotonic()

        async def generate(episodes: list[Any]) -> list[Any]:
            return await backend.generate([e.observation for e in episodes], params(next(seeds)))

        sched_cfg = SchedulerConfig(
            batch_size=c.batch_episodes,
            max_staleness=c.max_staleness,
            max_batch=64,
            max_inflight=max(c.batch_episodes * (c.max_staleness + 1), c.group_size),
            batch_wait_s=0.005,
        )
        last = {"t": time.monotonic(), "eps": 0, "jobs": 0, "idle": 0.0, "bad": 0}
        latest: dict[str, Any] = {"held": first["pass_rate"]}

        async def on_step(m: dict[str, float], groups: list[Any]) -> None:
            st = sched.stats()
            now = time.monotonic()
            dt = max(1e-9, now - last["t"])
            eps, jobs = st["episodes_finished"], st["pool"]["completed"]
            # infrastructure failures: runs retried after a sandbox_error, jobs that failed
            bad = st["pool"].get("retries", 0) + st["pool"].get("failed", 0)
            idle = st["generator_idle_fraction"] * st["elapsed_s"]
            turns = [e.turns[0] for g in groups for e in g.episodes if e.turns]
            passed = [bool(t.info.get("passed")) for t in turns if isinstance(t.info, dict)]
            rec: dict[str, Any] = {
                **m,
                "batch_pass_rate": sum(passed) / max(1, len(passed)),
                "rollouts_per_s": (eps - last["eps"]) / dt,
                "sandbox_runs_per_s": (jobs - last["jobs"]) / dt,
                "generator_idle": min(1.0, max(0.0, (idle - last["idle"]) / dt)),
                "sandbox_failure_rate": (bad - last["bad"]) / max(1, jobs - last["jobs"]),
                "elapsed_s": now - t_start,
                "tokens_per_s": m.get("tokens", 0.0) / max(1e-9, m.get("update_s", 0.0)),
            }
            last.update(t=now, eps=eps, jobs=jobs, idle=idle, bad=bad)
            step = trainer.step
            if (c.eval_every and step % c.eval_every == 0) and step < c.steps:
                ev = await evaluate_pass_rate(
                    policy, held_tasks, c.eval_samples, evaluator, params(next(seeds)),
                    train_ex, cache,
                )  # fmt: skip
                rec["held_out_pass_rate"] = ev["pass_rate"]
                rec["held_out_fraction"] = ev["fraction"]
                latest["held"] = ev["pass_rate"]
                evals.append((step, ev["pass_rate"]))
                log.write("eval", step=step, held_out_pass_rate=ev["pass_rate"],
                          held_out_fraction=ev["fraction"])  # fmt: skip
            history.append(rec)
            log.write("step", **rec)
            obs.step({**rec, "step": step})
            view.update(
                "grpo",
                step,
                c.steps,
                {
                    "reward": rec["reward_mean"],
                    "pass": rec["batch_pass_rate"],
                    "held-out": latest["held"],
                    "rollouts/s": rec["rollouts_per_s"],
                    "sandbox/s": rec["sandbox_runs_per_s"],
                    "gen idle": f"{100 * rec['generator_idle']:.0f}%",
                    "sandbox fail": f"{100 * rec['sandbox_failure_rate']:.1f}%",
                    "stale": rec["staleness"],
                    "update": f"{rec['update_s']:.2f}s",
                },
                force=True,
            )
            if c.checkpoint_every and step % c.checkpoint_every == 0 and step < c.steps:
                await asyncio.get_running_loop().run_in_executor(
                    train_ex, lambda: save_checkpoint(out / "checkpoint", trainer, extra=meta())
                )

        def meta() -> dict[str, Any]:
            return {
                "config": c.to_dict(),
                "warm_start_pass_rate": summary["warm_start_pass_rate"],
            }

        remaining = c.steps - trainer.step
        try:
            async with RolloutScheduler(
                generate,
                lambda task: TaskEnv(task, evaluator, reward_cfg, cache),
                pool=evaluator.pool,
                config=sched_cfg,
                version=trainer.version,
            ) as sched:
                obs.instrument(sched, "train", "scheduler")
                await backend.aupdate_weights(trainer.weights(), trainer.version)
                sched.feed(task_stream(train_tasks, seed=c.seed + trainer.step), c.group_size)
                if remaining > 0:
                    await train_on_scheduler(
                        trainer,
                        sched,
                        backend,
                        steps=remaining,
                        batch_episodes=c.batch_episodes,
                        on_step=on_step,
                        executor=train_ex,
                    )
                sched_stats = sched.stats()
        finally:
            backend.close()
        summary["rl_s"] = time.monotonic() - t_rl

        # ---- (4) final evaluation, checkpoint, plot
        view.update("eval", 0, 1, {"held-out tasks": len(held_tasks)}, force=True)
        final = await evaluate_pass_rate(
            policy, held_tasks, c.final_eval_samples, evaluator, params(next(seeds)),
            train_ex, cache,
        )  # fmt: skip
        evals.append((trainer.step, final["pass_rate"]))
        log.write("eval", step=trainer.step, held_out_pass_rate=final["pass_rate"],
                  held_out_fraction=final["fraction"], final=True)  # fmt: skip
        await asyncio.get_running_loop().run_in_executor(
            train_ex, lambda: save_checkpoint(out / "checkpoint", trainer, extra=meta())
        )
    finally:
        evaluator.close()
        if ray_pool is not None:
            ray_pool.close()
        train_ex.shutdown(wait=True)
        obs.close()

    summary.update(
        final_pass_rate=final["pass_rate"],
        final_fraction=final["fraction"],
        improvement=final["pass_rate"] - summary["warm_start_pass_rate"],
        steps=trainer.step,
        episodes=sched_stats["episodes_finished"],
        generator_idle_fraction=sched_stats["generator_idle_fraction"],
        rollouts_per_s=sched_stats["episodes_per_sec"],
        sandbox_runs=sched_stats["pool"]["completed"],
        evals=evals,
    )
    try:
        from agentrl.train.plot import plot_run

        plot_run(out / "plot.png", history, evals)
        summary["plot"] = str(out / "plot.png")
    except Exception as e:  # a missing plot must not lose the run
        view.message(f"plot failed: {e!r}")
    summary["wall_s"] = time.monotonic() - t_start
    log.write("end", **{k: v for k, v in summary.items() if k != "evals"})
    log.close()
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    view.message(
        f"held-out pass rate {summary['warm_start_pass_rate']:.3f} -> "
        f"{summary['final_pass_rate']:.3f} ({100 * summary['improvement']:+.1f} points) "
        f"in {summary['wall_s']:.0f}s; {out}"
    )
    return summary
