"""The trainer and the main job: configuration from flags and TOML, the built-in tasks,
updates from episode groups (masking, zero-variance groups, version bumps), the loop on a
real RolloutScheduler (on-policy and asynchronous), checkpoint resume reproducing the next
step exactly, the plot, and a smoke run of the main job with sandbox rewards."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
from agentrl.cli.train import add_parser
from agentrl.cli.train import run as cli_run
from agentrl.policy import GPTConfig, LocalBackend, Policy, SamplingParams
from agentrl.rollout.episode import Episode, EpisodeGroup, EpisodeStatus, Turn
from agentrl.rollout.scheduler import RolloutScheduler, SchedulerConfig
from agentrl.train import (
    GRPOConfig,
    GRPOTrainer,
    SFTConfig,
    TrainConfig,
    collect_sequences,
    load_checkpoint,
    run_job,
    save_checkpoint,
    split_tasks,
)
from agentrl.train.checkpoint import get_rng_state
from agentrl.train.config import settings
from agentrl.train.families import all_tasks, task_stream, warm_start_data
from agentrl.train.plot import plot_run
from agentrl.train.trainer import train_on_scheduler

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

TINY = GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=64)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


# ---- configuration


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="command"))
    return p.parse_args(["train", *argv])


def test_flags_toml_and_defaults(tmp_path: Path) -> None:
    from agentrl.train.config import config_from_args

    assert config_from_args(_parse([])) == TrainConfig()
    toml = tmp_path / "run.toml"
    toml.write_text('[train]\nsteps = 7\ngroup-size = 4\nloss_agg = "dr_grpo"\nscale_std = true\n')
    c = config_from_args(_parse(["--config", str(toml), "--steps", "9", "--no-scale-std"]))
    assert (c.steps, c.group_size, c.grpo.loss_agg, c.grpo.scale_std) == (9, 4, "dr_grpo", False)
    argv = ["--out-dir", "none", "--grpo-lr", "1e-3", "--sandbox-workers", "3"]
    c = config_from_args(_parse(argv))
    assert c.out_dir is None and c.grpo.lr == 1e-3 and c.sandbox_workers == 3
    assert TrainConfig.from_toml(toml).steps == 7


def test_bad_config_values_are_named() -> None:
    with pytest.raises(ValueError, match="group_size"):
        TrainConfig(group_size=0)
    with pytest.raises(ValueError, match=r"GRPOConfig\.loss_agg"):
        TrainConfig(grpo=GRPOConfig(loss_agg="mean"))
    with pytest.raises(TypeError, match="steps"):
        TrainConfig(steps=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown TrainConfig fields: nope"):
        TrainConfig.from_dict({"nope": 1})
    with pytest.raises(SystemExit):
        _parse(["--steps", "many"])


def test_cli_help_has_every_field_and_print_config(capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command")
    tp = add_parser(sub)
    text = tp.format_help()
    for s in settings():
        assert all(flag in text for flag in s.flags), s
    assert "Completions sampled per task" in text  # the field docstring is the help
    assert cli_run(_parse(["--print-config", "--steps", "3"])) == 0
    assert tomllib.loads(capsys.readouterr().out)["train"]["steps"] == 3
    assert cli_run(_parse(["--held-out", "2"])) == 2


# ---- tasks


def test_tasks_split_and_weak_programmer() -> None:
    tasks = all_tasks()
    assert len({t.task_id for t in tasks}) == len(tasks) > 200
    train, held = split_tasks(tasks)
    assert {t.task_id for t in train}.isdisjoint({t.task_id for t in held})
    assert len(train) + len(held) == len(tasks)
    assert {t.family for t in held} == {t.family for t in tasks}
    assert [t.task_id for t in split_tasks(tasks)[1]] == [t.task_id for t in held]
    for t in tasks:
        assert t.check_locally(t.solution) == 1.0
        assert t.wrong and all(t.check_locally(w) < 1.0 for w in t.wrong)
        assert t.prompt.endswith("return ") and t.test_source.startswith("def check(candidate):")
    data = warm_start_data(train, 2000, p_correct=0.3, seed=1)
    by_id = {t.prompt: t for t in train}
    correct = sum(by_id[p].solution + "\n" == c for p, c in data) / len(data)
    assert 0.25 < correct < 0.35
    assert all(p in by_id for p, _ in data)  # held-out tasks never appear
    stream = task_stream(train[:5], seed=3)
    assert sorted(next(stream).task_id for _ in range(5)) == sorted(t.task_id for t in train[:5])


# ---- updates from groups


def _policy(seed: int = 0) -> Policy:
    return Policy.builtin(TINY, device="cpu", seed=seed)


def _groups(policy: Policy, rewards: list[list[float | None]], seed: int = 0) -> list[EpisodeGroup]:
    """Groups of single-turn episodes whose actions are real generations of ``policy``."""
    prompts = ["ab", "cd", "ef", "gh"]
    out = []
    eid = 0
    for gi, row in enumerate(rewards):
        gens = policy.generate(
            [prompts[gi % 4]] * len(row), SamplingParams(max_new_tokens=6, seed=seed + gi)
        )
        eps = []
        for i, (r, g) in enumerate(zip(row, gens, strict=True)):
            eid += 1
            ep = Episode(eid, gi, i, prompts[gi % 4])
            ep.turns.append(Turn(g.prompt, g, policy.version, r))
            ep.status = EpisodeStatus.DONE
            eps.append(ep)
        out.append(EpisodeGroup(gi, prompts[gi % 4], eps))
    return out


def test_collect_sequences_masks_and_skips_flat_groups() -> None:
    pol = _policy()
    groups = _groups(pol, [[1.0, 0.0, None, 0.5], [0.3, 0.3, 0.3, 0.3], [1.0, None, None, None]])
    groups[0].episodes[3].status = EpisodeStatus.FAILED  # a failed episode is masked too
    seqs, st = collect_sequences(groups)
    # Group 0: valid rewards 1.0 and 0.0 (mean 0.5) -> advantages +0.5, -0.5. Group 1 is
    # flat and group 2 has one valid episode: no signal.
    assert sorted(s.advantage for s in seqs) == [-0.5, 0.5]
    assert st["masked"] == 5 and st["informative_groups"] == 1 and st["groups"] == 3
    assert st["reward_mean"] == pytest.approx((1.0 + 0.0 + 0.3 * 4 + 1.0) / 7)
    assert all(s.behav_logprobs is not None and s.token_ids for s in seqs)


def test_update_moves_towards_rewarded_completions_and_bumps_version() -> None:
    torch.manual_seed(0)
    pol = _policy()
    trainer = GRPOTrainer(pol, GRPOConfig(lr=1e-2, temperature=1.0))
    groups = _groups(pol, [[1.0, 0.0, 0.0, 0.0]])
    good, bad = groups[0].episodes[0].turns[0].action, groups[0].episodes[1].turns[0].action

    def score(g: Any) -> float:
        with torch.no_grad():
            return float(pol.token_logprobs([g.prompt_ids], [g.token_ids])[0].sum())

    before = (score(good), score(bad))
    m = trainer.update(groups)
    # On policy the ratio is 1, so the loss is -mean(advantage): 0 for a group's advantages
    # (+0.75, -0.25 x 3), exactly so when behaviour and proximal log-probs agree to the bit.
    # The gradient is not 0: that is what moves the weights.
    assert m["sequences"] == 4 and m["loss"] == pytest.approx(0.0, abs=1e-3)
    assert m["grad_norm"] > 0
    assert m["is_weight"] == pytest.approx(1.0, abs=1e-3)  # on-policy: behaviour = proximal
    assert score(good) > before[0] and score(bad) < before[1]
    assert trainer.step == 1 and pol.version == 1
    # No signal: the version still moves (an on-policy scheduler waits for it), weights not.
    w = {k: v.clone() for k, v in pol.state_dict().items()}
    m = trainer.update(_groups(pol, [[0.5, 0.5]]))
    assert m["sequences"] == 0 and pol.version == 2
    assert all(torch.equal(w[k], v) for k, v in pol.state_dict().items())


def test_stale_tokens_get_importance_weights() -> None:
    pol = _policy()
    groups = _groups(pol, [[1.0, 0.0, 0.0, 1.0]])
    trainer = GRPOTrainer(pol, GRPOConfig(lr=1e-3, is_cap=1e9))
    # Make the behaviour log-probs those of a different (stale) policy: weights != 1.
    for ep in groups[0].episodes:
        g = ep.turns[0].action
        g.logprobs = [lp - 0.5 for lp in g.logprobs]
    m = trainer.update(groups)
    assert m["is_weight"] == pytest.approx(torch.exp(torch.tensor(0.5)).item(), rel=1e-3)
    capped = GRPOTrainer(_policy(), GRPOConfig(lr=1e-3, is_cap=1.2))
    assert capped.update(groups)["is_weight"] == pytest.approx(1.2, rel=1e-6)


def test_kl_and_multiple_epochs_and_accumulation_agree() -> None:
    groups_src = _policy()
    groups = _groups(groups_src, [[1.0, 0.0, 0.2, 0.7], [0.0, 1.0, 1.0, 0.0]])
    results = []
    for mb in (8, 3):
        pol = _policy()
        tr = GRPOTrainer(pol, GRPOConfig(lr=1e-2, micro_batch_size=mb, kl_coef=0.1, ppo_epochs=2))
        m = tr.update(groups)
        results.append((m, {k: v.clone() for k, v in pol.state_dict().items()}))
    (m1, w1), (m2, w2) = results
    assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-4, abs=1e-6)
    for k in w1:
        assert torch.allclose(w1[k], w2[k], atol=1e-5), k
    assert m1["kl"] > 0  # the second epoch moved away from the reference


# ---- checkpoints


def test_checkpoint_resume_reproduces_the_next_step(tmp_path: Path) -> None:
    def fresh() -> GRPOTrainer:
        return GRPOTrainer(_policy(), GRPOConfig(lr=5e-3, weight_decay=0.01))

    def step(tr: GRPOTrainer, k: int) -> dict[str, float]:
        # The batch is sampled from the trainer's own policy with the global torch RNG, so
        # the RNG state is part of what must be restored.
        seed = int(torch.randint(0, 2**31, (1,)).item()) + random.randrange(1000)
        r = [[1.0, 0.0, 0.5, 0.0], [0.0, 1.0, 1.0, 0.0]]
        return tr.update(_groups(tr.policy, r, seed=seed + k))

    torch.manual_seed(1)
    random.seed(1)
    a = fresh()
    step(a, 0)
    save_checkpoint(tmp_path / "ckpt", a, extra={"note": "x"})
    rng_at_save = get_rng_state()
    ma = step(a, 1)
    wa = a.policy.state_dict()

    torch.manual_seed(123)  # a different process state
    random.seed(123)
    b = fresh()
    meta = load_checkpoint(tmp_path / "ckpt", b)
    assert meta["step"] == 1 and meta["note"] == "x" and b.step == 1 and b.version == 1
    assert torch.equal(get_rng_state()["torch"], rng_at_save["torch"])
    mb = step(b, 1)
    assert ma["loss"] == mb["loss"] and ma["grad_norm"] == mb["grad_norm"]
    for k, v in b.policy.state_dict().items():
        assert torch.equal(v, wa[k]), k
    assert b.step == a.step == 2
    # The policy directory alone loads as a Policy.
    assert Policy.load(tmp_path / "ckpt" / "policy").version == 1
    with pytest.raises(ValueError, match="not a training checkpoint"):
        load_checkpoint(tmp_path, b)


# ---- the loop on a real scheduler


class _CharEnv:
    """Reward: share of 'a' in the completion (in-process; no sandbox needed here)."""

    async def reset(self, task: Any) -> str:
        return str(task)

    async def step(self, g: Any) -> tuple[None, float, bool, dict]:
        return None, g.text.count("a") / max(1, len(g.text)), True, {}


@pytest.mark.parametrize("staleness", [0, 1])
def test_train_on_scheduler_on_policy_and_async(staleness: int) -> None:
    async def main() -> tuple[list[dict[str, float]], int, int]:
        pol = _policy()
        gen = pol.copy()
        backend = LocalBackend(gen)
        trainer = GRPOTrainer(pol, GRPOConfig(lr=1e-2))
        counter = iter(range(10**6))

        async def generate(eps: list[Episode]) -> list[Any]:
            p = SamplingParams(max_new_tokens=5, seed=next(counter))
            return await backend.generate([e.observation for e in eps], p)

        cfg = SchedulerConfig(batch_size=16, max_staleness=staleness, max_batch=16)
        seen: list[dict[str, float]] = []

        async with RolloutScheduler(generate, lambda t: _CharEnv(), config=cfg) as sched:
            sched.feed(iter(lambda: "b", None), group_size=4)
            await train_on_scheduler(
                trainer, sched, backend, steps=4, batch_episodes=16,
                on_step=lambda m, g: seen.append(m),
            )  # fmt: skip
        backend.close()
        return seen, gen.version, trainer.version

    seen, gen_version, version = asyncio.run(main())
    assert [m["step"] for m in seen] == [1, 2, 3, 4] and version == gen_version == 4
    assert all(m["episodes"] == 16 for m in seen)
    if staleness == 0:
        assert all(m["staleness"] == 0 for m in seen)
    else:
        assert all(0 <= m["staleness"] <= 1 for m in seen)


# ---- plot


def test_plot_fallback_writes_a_png(tmp_path: Path) -> None:
    hist = [{"step": i, "reward_mean": i / 10, "batch_pass_rate": i / 12} for i in range(1, 11)]
    path = plot_run(tmp_path / "p.png", hist, [(0, 0.2), (10, 0.7)], use_matplotlib=False)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    idat = data[data.index(b"IDAT") + 4 : data.index(b"IEND") - 8]
    raw = zlib.decompress(idat)
    assert len(raw) == h * (1 + 3 * w)
    assert len(set(raw[1 : 1 + 3 * w * 50])) > 2  # something was drawn


# ---- the main job, small


def test_smoke_run_reward_rises(tmp_path: Path) -> None:
    # One family keeps the warm start short; on-policy (staleness 0) batches are admitted a
    # version at a time, so the sampled batches barely depend on timing.
    c = TrainConfig(
        out_dir=str(tmp_path / "run"), seed=0, threads=1, rl_threads=1, progress=False,
        families="arith", sft=SFTConfig(steps=300, batch_size=32), steps=24, group_size=8,
        groups_per_step=8, grpo=GRPOConfig(lr=5e-4), max_staleness=0, eval_every=0,
        eval_samples=2, final_eval_samples=2, sandbox_workers=2,
    )  # fmt: skip
    s = run_job(c)
    out = tmp_path / "run"
    for name in ("metrics.jsonl", "summary.json", "plot.png", "config.json"):
        assert (out / name).is_file(), name
    assert (out / "checkpoint" / "trainer.pt").is_file()
    steps = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in steps if r["event"] == "step"]
    assert len(rewards) == 24 and s["steps"] == 24
    first, last = sum(rewards[:6]) / 6, sum(rewards[-6:]) / 6
    assert last > first + 0.05, (first, last)
    assert s["sandbox_runs"] >= 24 * 64


def test_progress_view_live_and_plain() -> None:
    import io

    from agentrl.train.progress import ProgressView, bar

    assert bar(0.5, 10) == "#####....." and bar(float("nan"), 4) == "...."
    s = io.StringIO()
    v = ProgressView(s, live=True)
    v.update("grpo", 1, 4, {"reward": 0.25, "gen idle": "40%"})
    v.message("a line that stays")
    v.update("grpo", 2, 4, {"reward": 0.5, "gen idle": "30%"})
    v.close()
    out = s.getvalue()
    # a rich live view: redrawn in place (cursor up, erase line), the fields in a table
    assert "\x1b[1A" in out and "\x1b[2K" in out and "2/4" in out
    assert "reward" in out and "0.500" in out and "a line that stays" in out
    s = io.StringIO()
    v = ProgressView(s, live=False)
    v.update("grpo", 1, 4, {"reward": 0.25}, force=True)
    v.update("grpo", 2, 4, {"reward": 0.5})  # within a second: skipped unless forced
    assert s.getvalue().count("\n") == 1 and "\x1b" not in s.getvalue()
    ProgressView(s, enabled=False).update("x", 1, 1, {})
    assert s.getvalue().count("\n") == 1


@pytest.mark.gpu
def test_one_update_on_cuda_in_bf16() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    pol = Policy.builtin(TINY, device="cuda", dtype="bf16", seed=0)
    trainer = GRPOTrainer(pol, GRPOConfig(lr=1e-3))
    before = {k: v.clone() for k, v in pol.state_dict().items()}
    m = trainer.update(_groups(pol, [[1.0, 0.0, 0.0, 1.0], [0.2, 0.9, 0.1, 0.0]]))
    assert m["sequences"] > 0 and m["grad_norm"] > 0 and pol.version == 1
    assert any(not torch.equal(before[k], v) for k, v in pol.state_dict().items())
