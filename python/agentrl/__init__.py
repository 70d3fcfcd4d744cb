"""agentrl: an engine for agent reinforcement learning of language models.

The sandbox runs untrusted, model-generated programs in isolated boxes built on Linux
namespaces, seccomp-bpf, cgroups and rlimits, from a Rust core; the pool and the rollout
scheduler run them off the GIL, overlapped with generation; :mod:`agentrl.evaluation` and
:mod:`agentrl.rewards` turn runs into verifiable rewards; :mod:`agentrl.envs` holds the
environments and :mod:`agentrl.integrations` the TRL/verl adapters. The torch parts
(:mod:`agentrl.policy`, :mod:`agentrl.train`) are imported on first use, so importing
agentrl does not import torch.
"""

from agentrl._core import __version__
from agentrl.errors import AgentRLError, SandboxError
from agentrl.jobs import (
    JobExpired,
    JobFailed,
    JobOutcome,
    JobStatus,
    PoolClosed,
    PoolFull,
    PoolFuture,
)
from agentrl.limits import Limits
from agentrl.pool import SandboxPool
from agentrl.result import ExecResult, Status
from agentrl.sandbox import Bind, Sandbox
from agentrl.session import Session, Snapshot

_LAZY_MODULES = ("policy", "train")

_LAZY_NAMES = {
    **{
        name: "agentrl.scheduler"
        for name in (
            "Episode",
            "EpisodeGroup",
            "EpisodeStatus",
            "RolloutScheduler",
            "SchedulerConfig",
            "Turn",
        )
    },
    **{
        name: "agentrl.evaluation"
        for name in ("ErrorClass", "Evaluator", "FunctionTask", "IOTask", "Judgement")
    },
}
"""Public names loaded on first access: the rollout scheduler imports asyncio, the evaluation
package asyncio, json and concurrent.futures (together ~40 ms of a start that uses neither,
such as a program that only runs boxes)."""


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
