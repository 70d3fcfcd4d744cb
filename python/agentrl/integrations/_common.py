"""What the trainer adapters share: an evaluator they own or borrow, and one scoring pass."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.envs.base import action_text

if TYPE_CHECKING:
    from agentrl.evaluation import Evaluator, Judgement, Task
    from agentrl.evaluation.rewards import Reward, RewardConfig

__all__ = ["Scored", "Scorer", "task_table"]


@dataclass(frozen=True)
class Scored:
    """One completion's verdict and reward."""

    judgement: Judgement
    reward: Reward

    @property
    def value(self) -> float | None:
        return self.reward.value


def task_table(tasks: Mapping[str, Any] | Iterable[Any] | None) -> dict[str, Task]:
    """``task_id -> task`` from a mapping or an iterable of tasks (or their records)."""
    from agentrl.envs.records import coerce_task

    if tasks is None:
        return {}
    if isinstance(tasks, Mapping):
        return {str(k): coerce_task(v) for k, v in tasks.items()}
    table: dict[str, Task] = {}
    for t in tasks:
        task = coerce_task(t)
        if not task.task_id:
            raise ValueError("a task table needs task ids")
        table[task.task_id] = task
    return table


class Scorer:
    """Judges completions of tasks and shapes the rewards, on an evaluator it owns (made on
    first use with ``workers`` and ``timeout``) or borrows."""

    def __init__(
        self,
        evaluator: Evaluator | None = None,
        *,
        reward: RewardConfig | None = None,
        extract_code: bool = True,
        workers: int | None = None,
        timeout: float = 3.0,
    ) -> None:
        if evaluator is not None:
            from agentrl.evaluation import Evaluator

            if not isinstance(evaluator, Evaluator):
                raise TypeError(f"evaluator must be an agentrl.evaluation.Evaluator: {evaluator!r}")
        if reward is not None:
            from agentrl.evaluation.rewards import RewardConfig

            if not isinstance(reward, RewardConfig):
                raise TypeError("reward must be an agentrl.evaluation.rewards.RewardConfig")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self._evaluator = evaluator
        self._owned = evaluator is None
        self._workers, self._timeout = workers, timeout
        self.reward_config = reward
        self.extract_code = extract_code
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @property
    def evaluator(self) -> Evaluator:
        """The evaluator (created on first use when none was given; in a child made with
        fork(), it makes its own pool)."""
        if self._pid != os.getpid():
            # A copy of the lock made by fork() may be held by a thread the child lacks.
            self._pid, self._lock = os.getpid(), threading.Lock()
        if self._evaluator is None:
            with self._lock:
                if self._evaluator is None:
                    from agentrl.evaluation import Evaluator

                    self._evaluator = Evaluator(workers=self._workers, timeout=self._timeout)
        return self._evaluator

    def code_of(self, text: str) -> str:
        if not self.extract_code:
            return text
        from agentrl.evaluation.rewards import extract_code

        return extract_code(text)

    def _shape(self, judgements: Iterable[Judgement], texts: list[str]) -> list[Scored]:
        from agentrl.evaluation.rewards import shape

        return [
            Scored(j, shape(j, t, self.reward_config))
            for j, t in zip(judgements, texts, strict=True)
        ]

    def score(self, tasks: list[Task], completions: list[Any]) -> list[Scored]:
        """Judges every completion (text or chat messages) of its task, in parallel."""
        texts = [action_text(c) for c in completions]
        pairs = [(t, self.code_of(x)) for t, x in zip(tasks, texts, strict=True)]
        return self._shape(self.evaluator.judge_many(pairs), texts)

    async def ascore(self, tasks: list[Task], completions: list[Any]) -> list[Scored]:
        """:meth:`score` on the running loop (the evaluator's pool, no thread blocked)."""
        import asyncio

        texts = [action_text(c) for c in completions]
        ev = self.evaluator
        coros = [ev.ajudge(t, self.code_of(x)) for t, x in zip(tasks, texts, strict=True)]
        return self._shape(await asyncio.gather(*coros), texts)

    def close(self) -> None:
        """Closes the evaluator if this scorer made it."""
        with self._lock:
            if self._owned and self._evaluator is not None:
                self._evaluator.close()
                self._evaluator = None


_shared_lock = threading.Lock()
_shared: dict[str, Scorer] = {}


def _new_lock_after_fork() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


def shared_scorer(key: str) -> Scorer:
    """The process-wide scorer under ``key`` (made with defaults on first use). It lives
    here, not in the adapter module, because trainers load adapter files by path (a second
    copy of the module) and both copies must see one configuration."""
    with _shared_lock:
        s = _shared.get(key)
        if s is None:
            s = _shared[key] = Scorer()
        return s


def set_shared_scorer(key: str, scorer: Scorer | None) -> None:
    """Replaces (or with None drops) the scorer under ``key``; closes the old one."""
    with _shared_lock:
        old = _shared.pop(key, None)
        if scorer is not None:
            _shared[key] = scorer
    if old is not None and old is not scorer:
        old.close()
