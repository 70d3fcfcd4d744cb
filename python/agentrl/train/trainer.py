"""The GRPO trainer and the loop that feeds it from a :class:`~agentrl.RolloutScheduler`.

:class:`GRPOTrainer` turns finished episode groups into one policy update:
group-relative advantages from the episodes' rewards (masked rewards and failed episodes
are left out), then the clipped, importance-corrected surrogate of :mod:`.grpo` over the
completion tokens, with gradient accumulation over micro-batches, AdamW and gradient
clipping. Every update bumps the policy version, even one without signal (so that an
on-policy scheduler, which admits a batch per version, goes on).

:func:`train_on_scheduler` is the asynchronous loop: it collects groups while generation
and sandbox steps go on, runs the update in a worker thread (so the event loop keeps
serving the scheduler), hands the new weights to the generator and bumps the scheduler's
version. With ``max_staleness=0`` this is on-policy GRPO; with ``max_staleness >= 1``
rollouts of the next batch are generated while the trainer updates (AReaL-style), and the
decoupled objective corrects the stale tokens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from agentrl.rollout.episode import EpisodeGroup, EpisodeStatus
from agentrl.train.config import GRPOConfig
from agentrl.train.grpo import group_advantages, policy_loss

__all__ = ["GRPOConfig", "GRPOTrainer", "TrainSequence", "collect_sequences", "train_on_scheduler"]


@dataclass
class TrainSequence:
    """One completion to learn from: a turn of an episode with its advantage."""

    prompt_ids: list[int]
    token_ids: list[int]
    behav_logprobs: list[float] | None
    advantage: float
    version: int
    """Policy version that generated it."""


def _episode_reward(ep: Any) -> float | None:
    if ep.status is EpisodeStatus.FAILED or not ep.turns:
        return None
    total = 0.0
    for t in ep.turns:
        if t.reward is None:
            return None
        total += float(t.reward)
    return total


def collect_sequences(
    groups: Sequence[EpisodeGroup], *, scale_std: bool = False
) -> tuple[list[TrainSequence], dict[str, float]]:
    """The sequences of ``groups`` that carry signal, and batch statistics.

    Each group's rewards (an episode's reward is the sum of its turns'; a failed episode or
    one with a masked turn is masked) give group-relative advantages; episodes with a zero
    advantage (masked, or in a group without spread) are left out. Every turn of a kept
    episode is one sequence; its action must be a :class:`agentrl.policy.Generation`.
    """
    out: list[TrainSequence] = []
    rewards: list[float] = []
    masked = 0
    informative = 0
    for g in groups:
        r = [_episode_reward(e) for e in g.episodes]
        masked += sum(v is None for v in r)
        rewards += [v for v in r if v is not None]
        if not r:
            continue
        rt = torch.tensor([[math.nan if v is None else v for v in r]], dtype=torch.float32)
        adv = group_advantages(rt, ~torch.isnan(rt), scale_std=scale_std)[0]
        if bool((adv != 0).any()):
            informative += 1
        for ep, a in zip(g.episodes, adv.tolist(), strict=True):
            if a == 0.0:
                continue
            for turn in ep.turns:
                gen = turn.action
                if not hasattr(gen, "token_ids") or not hasattr(gen, "prompt_ids"):
                    raise TypeError(
                        "GRPO needs Generation actions (token ids and log-probs), got "
                        f"{type(gen).__name__}"
                    )
                if not gen.token_ids:
                    continue
                lp = list(gen.logprobs) if getattr(gen, "logprobs", None) else None
                out.append(
                    TrainSequence(list(gen.prompt_ids), list(gen.token_ids), lp, a, turn.version)
                )
    n_eps = sum(len(g.episodes) for g in groups)
    stats = {
        "episodes": float(n_eps),
        "masked": float(masked),
        "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "groups": float(len(groups)),
        "informative_groups": float(informative),
        "sequences": float(len(out)),
    }
    return out, stats


def _pad(rows: Sequence[Sequence[float]] | Sequence[Tensor], width: int) -> Tensor:
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, r in enumerate(rows):
        t = r if isinstance(r, Tensor) else torch.tensor(r, dtype=torch.float32)
        out[i, : len(t)] = t
    return out


class GRPOTrainer:
    """Policy updates from episode groups; see the module docs.

    ``policy``: an :class:`agentrl.policy.Policy` whose weights are trained (in place). Keep
    the generator on a separate copy and hand it :meth:`weights` after each update.
    ``reference``: a frozen policy for the KL term (default: a copy of ``policy`` made
    now, only when ``kl_coef > 0``).
    """

    def __init__(
        self, policy: Any, config: GRPOConfig | None = None, *, reference: Any = None
    ) -> None:
        self.policy = policy
        self.config = c = config or GRPOConfig()
        self.optimizer = torch.optim.AdamW(
            policy.model.parameters(), lr=c.lr, betas=c.betas, weight_decay=c.weight_decay
        )
        self.reference = None
        if c.kl_coef > 0:
            self.reference = reference if reference is not None else policy.copy()
            for p in self.reference.model.parameters():
                p.requires_grad_(False)
        self.step = 0
        """Updates done."""

    @property
    def version(self) -> int:
        """The version of the trained weights (the policy's)."""
        return int(self.policy.version)

    def weights(self) -> dict[str, Tensor]:
        """The trained weights, detached (to hand to a generator)."""
        return {k: v.detach() for k, v in self.policy.model.state_dict().items()}

    # ---- one update

    def _logprobs(self, policy: Any, seqs: Sequence[TrainSequence], width: int) -> Tensor:
        lps = policy.token_logprobs(
            [s.prompt_ids for s in seqs],
            [s.token_ids for s in seqs],
            temperature=self.config.temperature,
        )
        out = torch.zeros(len(seqs), width, dtype=torch.float32, device=lps[0].device)
        for i, lp in enumerate(lps):
            out[i, : len(lp)] = lp
        return out

    def update(self, groups: Sequence[EpisodeGroup]) -> dict[str, float]:
        """One policy update from ``groups``; returns its metrics. Bumps the version."""
        t0 = time.perf_counter()
        c = self.config
        seqs, stats = collect_sequences(groups, scale_std=c.scale_std)
        model = self.policy.model
        model.train()
        metrics: dict[str, float] = dict(stats)
        metrics.update(loss=0.0, grad_norm=0.0, clip_fraction=0.0, is_weight=1.0, kl=0.0)
        metrics["staleness"] = (
            sum(self.version - s.version for s in seqs) / len(seqs) if seqs else 0.0
        )
        if seqs:
            self._optimise(seqs, metrics)
        self.step += 1
        self.policy.version = self.version + 1
        metrics["step"] = float(self.step)
        metrics["version"] = float(self.version)
        metrics["update_s"] = time.perf_counter() - t0
        return metrics

    def _optimise(self, seqs: list[TrainSequence], metrics: dict[str, float]) -> None:
        c = self.config
        dev = self.policy.device
        n_seqs = float(len(seqs))
        n_tokens = float(sum(len(s.token_ids) for s in seqs))
        chunks = [seqs[i : i + c.micro_batch_size] for i in range(0, len(seqs), c.micro_batch_size)]
        widths = [max(len(s.token_ids) for s in ch) for ch in chunks]
        masks = [
            (torch.arange(w)[None, :] < torch.tensor([len(s.token_ids) for s in ch])[:, None]).to(
                dev
            )
            for ch, w in zip(chunks, widths, strict=True)
        ]
        prox: list[Tensor | None] = [None] * len(chunks)
        refs: list[Tensor | None] = [None] * len(chunks)
        with torch.no_grad():
            for i, (ch, w) in enumerate(zip(chunks, widths, strict=True)):
                if c.ppo_epochs > 1:
                    prox[i] = self._logprobs(self.policy, ch, w)
                if self.reference is not None:
                    refs[i] = self._logprobs(self.reference, ch, w)
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        totals = {"loss": 0.0, "clip_fraction": 0.0, "is_weight": 0.0, "kl": 0.0}
        norms = []
        for _ in range(c.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for i, (ch, w) in enumerate(zip(chunks, widths, strict=True)):
                logp = self._logprobs(self.policy, ch, w)
                behav = None
                if all(s.behav_logprobs is not None for s in ch):
                    behav = _pad([s.behav_logprobs or [] for s in ch], w).to(dev)
                adv = torch.tensor([s.advantage for s in ch], dtype=torch.float32, device=dev)
                loss, st = policy_loss(
                    logp,
                    adv,
                    masks[i],
                    prox_logp=prox[i],
                    behav_logp=behav,
                    ref_logp=refs[i],
                    eps_low=c.eps_low,
                    eps_high=c.eps_high,
                    is_cap=c.is_cap or None,
                    kl_coef=c.kl_coef,
                    agg=c.loss_agg,
                    n_seqs=n_seqs,
                    n_tokens=n_tokens,
                    max_new_tokens=c.max_new_tokens,
                )
                loss.backward()
                share = st.tokens / max(n_tokens, 1.0)
                totals["loss"] += loss.item() / c.ppo_epochs
                totals["clip_fraction"] += st.clip_fraction * share / c.ppo_epochs
                totals["is_weight"] += st.mean_is_weight * share / c.ppo_epochs
                totals["kl"] += st.kl * share / c.ppo_epochs
            if c.grad_clip > 0:
                norm = torch.nn.utils.clip_grad_norm_(params, c.grad_clip)
            else:
                norm = torch.linalg.vector_norm(
                    torch.stack([p.grad.norm() for p in params if p.grad is not None])
                )
            norms.append(float(norm))
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        metrics.update(totals)
        metrics["grad_norm"] = sum(norms) / len(norms)
        metrics["tokens"] = n_tokens

    # ---- state (checkpoints)

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer, step and version (see :mod:`agentrl.train.checkpoint`)."""
        return {
            "model": self.policy.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "version": self.version,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned."""
        self.policy.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.policy.version = int(state["version"])


StepCallback = Callable[[dict[str, float], list[EpisodeGroup]], Awaitable[None] | None]


async def train_on_scheduler(
    trainer: GRPOTrainer,
    scheduler: Any,
    backend: Any,
    *,
    steps: int,
    batch_episodes: int,
    on_step: StepCallback | None = None,
    executor: concurrent.futures.Executor | None = None,
) -> None:
    """Runs ``steps`` updates on groups from ``scheduler`` (started, being fed).

    Groups are collected until they hold ``batch_episodes`` episodes; the update runs in
    ``executor`` (default: a private single thread) while the scheduler goes on; then the
    new weights go to ``backend`` (``aupdate_weights`` or ``update_weights``) and the
    scheduler's version is bumped. ``on_step(metrics, groups)`` is called (and awaited if
    it returns an awaitable) after each update, before the next batch is collected.
    """
    loop = asyncio.get_running_loop()
    own = executor is None
    ex = executor or concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentrl-train")
    try:
        batch: list[EpisodeGroup] = []
        n = 0
        done = 0
        t_wait = time.perf_counter()
        async for group in scheduler.groups():
            batch.append(group)
            n += len(group.episodes)
            if n < batch_episodes:
                continue
            wait_s = time.perf_counter() - t_wait
            metrics = await loop.run_in_executor(ex, trainer.update, batch)
            t1 = time.perf_counter()
            sd = trainer.weights()
            if hasattr(backend, "aupdate_weights"):
                await backend.aupdate_weights(sd, trainer.version)
            else:
                backend.update_weights(sd, trainer.version)
            scheduler.set_policy_version(trainer.version)
            metrics["weight_sync_s"] = time.perf_counter() - t1
            metrics["wait_s"] = wait_s
            if on_step is not None:
                r = on_step(metrics, batch)
                if asyncio.iscoroutine(r) or isinstance(r, asyncio.Future):
                    await r
            done += 1
            batch, n = [], 0
            t_wait = time.perf_counter()
            if done >= steps:
                break
    finally:
        if own:
            ex.shutdown(wait=True)
