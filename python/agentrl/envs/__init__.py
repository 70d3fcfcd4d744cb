"""Text environments for agent RL: ``reset(task) -> observation``, ``step(action) ->
StepResult(observation, reward, done, info)``, with async variants.

* :class:`CodeEnv`: single-turn code generation judged by :class:`agentrl.evaluation.Evaluator`.
* :class:`CodeRepairEnv`: multi-turn repair with structured feedback and a turn budget.
* :class:`ShellEnv`: shell commands in a persistent sandbox session.

``env.for_scheduler()`` is the view :class:`agentrl.RolloutScheduler` drives.
"""

from __future__ import annotations

from agentrl.envs.base import (
    RewardMasked,
    SchedulerEnv,
    StepResult,
    TextEnv,
    action_text,
    trim_middle,
)
from agentrl.envs.code import CodeEnv, CodeEnvConfig, CodeRepairConfig, CodeRepairEnv
from agentrl.envs.records import coerce_task, task_from_fields
from agentrl.envs.shell import ShellEnv, ShellEnvConfig, ShellTask

__all__ = [
    "CodeEnv",
    "CodeEnvConfig",
    "CodeRepairConfig",
    "CodeRepairEnv",
    "RewardMasked",
    "SchedulerEnv",
    "ShellEnv",
    "ShellEnvConfig",
    "ShellTask",
    "StepResult",
    "TextEnv",
    "action_text",
    "coerce_task",
    "task_from_fields",
    "trim_middle",
]
