"""The rollout scheduler's configuration: batching, staleness and admission bounds."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SchedulerConfig"]


@dataclass(frozen=True)
class SchedulerConfig:
    """Configuration of a :class:`RolloutScheduler`."""

    batch_size: int = 64
    """Episodes per trainer batch: the unit of the staleness bound."""
    max_staleness: int | None = 1
    """AReaL's admission bound: at most ``(max_staleness + version + 1) * batch_size``
    episodes are ever started by policy ``version``, so an episode trained in the batch of
    its admission lags the trainer by at most this many versions. Groups are delivered as
    they finish, so a group that finishes late can reach the trainer a version or more later
    than that (each :class:`Turn` carries the version that generated it, for a trainer that
    must drop or down-weight such groups). An aborted and re-queued episode is counted once.
    None: no bound."""
    max_inflight: int = 256
    """Most episodes running at once, counting those of finished groups that wait for room
    on the output queue."""
    max_batch: int = 64
    """Most episodes in one call of ``generate``."""
    batch_wait_s: float = 0.002
    """Once one episode waits for generation, how long to wait for more before calling
    ``generate`` with what is ready (a full batch goes at once)."""
    generate_concurrency: int = 1
    """Calls of ``generate`` in flight at once (e.g. one per inference server)."""
    on_policy_update: str = "continue"
    """On :meth:`RolloutScheduler.set_policy_version`: ``"continue"`` keeps in-flight
    episodes running (each turn is tagged with the version that generated it); ``"abort"``
    stops unfinished episodes (their sandbox jobs are cancelled) and re-queues them first."""
    output_capacity: int = 16
    """Finished groups the output queue holds before finished episodes wait (and, through
    ``max_inflight``, admission stops)."""
    max_turns: int | None = None
    """Turns after which an episode ends as ``truncated``. None: no limit."""
    isolate_generation_errors: bool = True
    """When ``generate`` raises for a batch, call it again once per episode so that only the
    episodes whose call raises fail; otherwise the whole batch fails."""
    sync_env_in_thread: bool = True
    """Run plain (non-async) ``reset``/``step`` methods in a thread so they cannot block the
    event loop."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_inflight", "max_batch", "generate_concurrency"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        for name in ("max_staleness", "max_turns"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"{name} must be a non-negative int or None, got {v!r}")
        if self.output_capacity < 1:
            raise ValueError(f"output_capacity must be positive, got {self.output_capacity}")
        if not self.batch_wait_s >= 0:
            raise ValueError(f"batch_wait_s must be non-negative, got {self.batch_wait_s}")
        if self.on_policy_update not in ("continue", "abort"):
            raise ValueError('on_policy_update must be "continue" or "abort"')
