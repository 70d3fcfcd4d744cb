"""Rollouts: many concurrent episodes, batched generation overlapped with environment steps.

* ``scheduler``: :class:`RolloutScheduler` and its :class:`SchedulerConfig`.
* ``episode``: :class:`Episode`, its :class:`Turn` records, :class:`EpisodeGroup` (the
  episodes of one prompt, for GRPO) and :class:`EpisodeStatus`.
"""

from agentrl.rollout.episode import Episode, EpisodeGroup, EpisodeStatus, Turn
from agentrl.rollout.scheduler import RolloutScheduler, SchedulerConfig

__all__ = [
    "Episode",
    "EpisodeGroup",
    "EpisodeStatus",
    "RolloutScheduler",
    "SchedulerConfig",
    "Turn",
]
