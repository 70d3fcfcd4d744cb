"""agentrl: an engine for agent reinforcement learning of language models.

The sandbox runs untrusted, model-generated programs in isolated boxes built on Linux
namespaces, seccomp-bpf, cgroups and rlimits, from a Rust core.
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
from agentrl.scheduler import (
    Episode,
    EpisodeGroup,
    EpisodeStatus,
    RolloutScheduler,
    SchedulerConfig,
    Turn,
)
from agentrl.session import Session, Snapshot

__all__ = [
    "AgentRLError",
    "Bind",
    "Episode",
    "EpisodeGroup",
    "EpisodeStatus",
    "ExecResult",
    "JobExpired",
    "JobFailed",
    "JobOutcome",
    "JobStatus",
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
