"""GRPO training on the rollout scheduler, and the main job ``agentrl train``.

* :mod:`.grpo`: the losses (group advantages, clipped decoupled surrogate, KL, aggregation).
* :class:`GRPOTrainer` / :func:`train_on_scheduler`: updates from episode groups while the
  :class:`~agentrl.RolloutScheduler` keeps generating and executing.
* :class:`TrainConfig`: the configuration of ``agentrl train`` (flags and TOML).
* :func:`run_job`: the main job (built-in tasks, warm start, GRPO with sandbox rewards).
"""

from __future__ import annotations

from agentrl.train.checkpoint import load_checkpoint, save_checkpoint
from agentrl.train.config import TrainConfig
from agentrl.train.families import CodeTask, all_tasks, split_tasks
from agentrl.train.grpo import aggregate, group_advantages, k3_kl, policy_loss
from agentrl.train.job import evaluate_pass_rate, run_job
from agentrl.train.sft import SFTConfig, supervised_warm_start
from agentrl.train.trainer import GRPOConfig, GRPOTrainer, collect_sequences, train_on_scheduler

__all__ = [
    "CodeTask",
    "GRPOConfig",
    "GRPOTrainer",
    "SFTConfig",
    "TrainConfig",
    "aggregate",
    "all_tasks",
    "collect_sequences",
    "evaluate_pass_rate",
    "group_advantages",
    "k3_kl",
    "load_checkpoint",
    "policy_loss",
    "run_job",
    "save_checkpoint",
    "split_tasks",
    "supervised_warm_start",
    "train_on_scheduler",
]
