"""The text environment protocol: :class:`StepResult`, :class:`TextEnv` and the view of an
environment that :class:`agentrl.RolloutScheduler` drives."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.sandbox.args import check_int, check_range

__all__ = [
    "RewardMasked",
    "SchedulerEnv",
    "StepResult",
    "TextEnv",
    "action_text",
    "check_field",
    "trim_middle",
]


def check_field(
    owner: str,
    name: str,
    value: object,
    kind: str,
    *,
    low: float | None = None,
    high: float | None = None,
) -> None:
    """Validates one field of an environment config: ``kind`` is ``"bool"``, ``"str"``,
    ``"int"`` or ``"number"`` (int or float, finite), with optional bounds; raises TypeError or
    ValueError naming ``owner.name``."""
    where = f"{owner}.{name}"
    if kind == "bool":
        if not isinstance(value, bool):
            raise TypeError(f"{where} must be True or False, got {value!r}")
    elif kind == "str":
        if not isinstance(value, str):
            raise TypeError(f"{where} must be a str, got {type(value).__name__}")
    elif kind == "int":
        check_int(where, value, low, high)
    else:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{where} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{where} must be finite, got {value!r}")
        check_range(where, value, low, high)


@dataclass
class StepResult:
    """What one environment step returns.

    It unpacks as ``observation, reward, done, info`` (the tuple the
    :class:`agentrl.RolloutScheduler` expects from ``step``).
    """

    observation: str
    """What the policy sees next (feedback, command output; empty when nothing follows)."""
    reward: float | None
    """The step's reward; None when it is masked (an infrastructure failure, not the
    policy's fault: train on no reward, never on 0). ``info["masked"]`` says why."""
    done: bool
    """The episode is over."""
    info: dict[str, Any] = field(default_factory=dict)
    """Details: the judgement, the reward components, ``masked`` (the reason or None)."""

    @property
    def masked(self) -> bool:
        """The step has no reward (see ``info["masked"]``)."""
        return self.reward is None

    def __iter__(self) -> Iterator[Any]:
        return iter((self.observation, self.reward, self.done, self.info))


class RewardMasked(Exception):
    """Raised by :class:`SchedulerEnv` for a step whose reward is masked, so that the
    :class:`agentrl.RolloutScheduler` (whose turns carry float rewards) fails the episode
    with the reason instead of training on a made-up reward."""

    def __init__(self, reason: str, result: StepResult) -> None:
        super().__init__(f"reward masked: {reason}")
        self.reason = reason
        self.result = result


class TextEnv:
    """Base class of text environments: ``reset(task) -> observation`` then
    ``step(action) -> StepResult`` until ``done``.

    Subclasses implement :meth:`reset` and :meth:`step`; the async variants :meth:`areset`
    and :meth:`astep` run them in a thread unless a subclass has a native async path (on a
    :class:`agentrl.SandboxPool`). An instance runs one episode at a time; ``reset`` starts
    the next one. Close it (or use ``with``) to free what it holds.
    """

    def reset(self, task: Any) -> str:
        """Starts an episode of ``task``; returns the first observation."""
        raise NotImplementedError

    def step(self, action: Any) -> StepResult:
        """Applies the policy's ``action`` (text, or a chat message / message list)."""
        raise NotImplementedError

    async def areset(self, task: Any) -> str:
        """:meth:`reset` without blocking the event loop."""
        return await asyncio.to_thread(self.reset, task)

    async def astep(self, action: Any) -> StepResult:
        """:meth:`step` without blocking the event loop."""
        return await asyncio.to_thread(self.step, action)

    def close(self) -> None:
        """Frees what the environment holds. Idempotent."""

    async def aclose(self) -> None:
        """:meth:`close` without blocking the event loop."""
        await asyncio.to_thread(self.close)

    def for_scheduler(self) -> SchedulerEnv:
        """This environment as :class:`agentrl.RolloutScheduler` drives it (async methods,
        masked rewards raised as :class:`RewardMasked`)."""
        return SchedulerEnv(self)

    def __enter__(self) -> TextEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SchedulerEnv:
    """Adapts a :class:`TextEnv` to :class:`agentrl.RolloutScheduler`: ``reset``/``step``/
    ``close`` are the environment's async variants, so steps run on the pool (or a thread)
    without blocking the scheduler's loop. A masked step keeps its reward None: the scheduler
    delivers the episode with :attr:`agentrl.Episode.masked` set and the reason in the turn's
    ``info["masked"]``, and a trainer skips it (:attr:`agentrl.EpisodeGroup.usable`).

    ``RolloutScheduler(generate, lambda task: CodeEnv(evaluator).for_scheduler(), ...)``
    """

    def __init__(self, env: TextEnv) -> None:
        if not isinstance(env, TextEnv):
            raise TypeError(f"env must be a TextEnv, got {type(env).__name__}")
        self.env = env

    async def reset(self, task: Any) -> str:
        return await self.env.areset(task)

    async def step(self, action: Any) -> StepResult:
        return await self.env.astep(action)

    async def close(self) -> None:
        await self.env.aclose()


def action_text(action: Any) -> str:
    """The text of a policy action: a str, a chat message ``{"role", "content"}`` or a list
    of them (the assistant messages' contents, joined); content may be a list of parts
    (``{"type": "text", "text": ...}``)."""
    if isinstance(action, str):
        return action
    if isinstance(action, Mapping):
        return _content_text(action.get("content"))
    if isinstance(action, Sequence) and not isinstance(action, (bytes, bytearray)):
        msgs = [m for m in action if isinstance(m, Mapping)]
        if len(msgs) != len(action):
            raise TypeError("a message list must hold only dicts with 'role' and 'content'")
        mine = [m for m in msgs if m.get("role", "assistant") == "assistant"] or msgs
        return "\n".join(_content_text(m.get("content")) for m in mine)
    raise TypeError(f"an action must be a str or chat message(s), got {type(action).__name__}")


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, Mapping) and isinstance(p.get("text"), str):
                parts.append(p["text"])
        return "".join(parts)
    raise TypeError(f"message content must be str or a list of parts, got {type(content).__name__}")


def trim_middle(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping its head and tail (where the
    error usually is) and saying how much was dropped."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit // 3
    tail = limit - head
    dropped = len(text) - head - tail
    return f"{text[:head]}\n[... {dropped} characters cut ...]\n{text[-tail:]}"
