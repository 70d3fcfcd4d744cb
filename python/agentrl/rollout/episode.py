"""The records of rollouts: :class:`Episode` (what ``generate`` receives), its :class:`Turn`
list, and the :class:`EpisodeGroup` that leaves the :class:`agentrl.RolloutScheduler` as
one unit."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Episode", "EpisodeGroup", "EpisodeStatus", "Turn"]


class EpisodeStatus(str, enum.Enum):
    """Where an episode is."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    """The environment said done."""
    TRUNCATED = "truncated"
    """It reached ``max_turns``."""
    FAILED = "failed"
    """Its environment or generation raised; see ``error``."""


@dataclass
class Turn:
    """One generation step and the environment step that answered it."""

    observation: Any
    """What the policy saw."""
    action: Any
    """What ``generate`` returned for this episode."""
    version: int
    """Policy version when the ``generate`` call that made the action started."""
    reward: float | None = 0.0
    """The step's reward; None when it is *masked* (an infrastructure failure, such as a
    ``sandbox_error``, left the step without a trustworthy reward: train on nothing, not 0)."""
    info: Any = None


@dataclass
class Episode:
    """One rollout: the unit ``generate`` receives (in batches) and groups are made of."""

    id: int
    group_id: int
    index: int
    """Position within its group."""
    task: Any
    observation: Any = None
    """The latest observation (what the next generation step answers)."""
    turns: list[Turn] = field(default_factory=list)
    status: EpisodeStatus = EpisodeStatus.PENDING
    error: BaseException | None = None
    traceback: str | None = None
    start_version: int = -1
    """Policy version when it was (last) admitted."""
    admitted_as: int = -1
    """Its rank among all admitted episodes (1-based); the staleness bound applies to it."""
    restarts: int = 0
    """Times it was aborted by a policy update and re-queued."""

    @property
    def masked(self) -> bool:
        """Some step's reward is masked (None): the episode carries no reward signal."""
        return any(t.reward is None for t in self.turns)

    @property
    def mask_reason(self) -> str | None:
        """Why the first masked step has no reward (its ``info["masked"]`` when given)."""
        for t in self.turns:
            if t.reward is None:
                reason = t.info.get("masked") if isinstance(t.info, dict) else None
                return str(reason) if reason else "reward masked"
        return None

    @property
    def total_reward(self) -> float | None:
        """Sum of the turns' rewards; None when the episode is :attr:`masked`."""
        if self.masked:
            return None
        return sum(t.reward for t in self.turns if t.reward is not None)

    @property
    def versions(self) -> tuple[int, ...]:
        """Distinct policy versions of its turns, in order."""
        return tuple(dict.fromkeys(t.version for t in self.turns))


@dataclass
class EpisodeGroup:
    """The episodes of one task, delivered together once all have finished."""

    id: int
    task: Any
    episodes: list[Episode]

    @property
    def ok(self) -> bool:
        """No episode failed."""
        return all(e.status is not EpisodeStatus.FAILED for e in self.episodes)

    @property
    def failed(self) -> list[Episode]:
        return [e for e in self.episodes if e.status is EpisodeStatus.FAILED]

    @property
    def usable(self) -> list[Episode]:
        """The episodes a trainer can learn from: finished (done or truncated), not masked."""
        return [e for e in self.episodes if e.status is not EpisodeStatus.FAILED and not e.masked]
