"""A pool of fake jobs on the real Rust scheduler, for tests and benchmarks: no sandbox, so
they measure scheduling (submission, completion, cancellation, retries), not boxes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from agentrl import _core
from agentrl.pool.engine import _JobPool
from agentrl.pool.jobs import _OUTCOME, PoolFuture, schedule_args

__all__: list[str] = []


class _TestPool(_JobPool):
    """A pool of fake jobs (tests and benchmarks): ``(op, arg)`` with the ops below."""

    NOOP, SLEEP, INFRA, FLAKY, PANIC = range(5)

    def __init__(
        self,
        workers: int = 2,
        capacity: int = 4096,
        retries: int = 2,
        backpressure: str = "block",
        block_timeout: float | None = None,
    ) -> None:
        block = 1.0 if backpressure == "block" else None
        core = _core._TestPool(workers, 2 * capacity + 64, retries, block, _OUTCOME)
        super().__init__(core, capacity, backpressure, block_timeout)

    def _item(self, op: int, arg: int, kw: Mapping[str, Any]) -> tuple:
        return (op, arg, *schedule_args(**kw))

    def submit(self, op: int, arg: int = 0, **kw: Any) -> PoolFuture:
        return self._submit_futures([self._item(op, arg, kw)])[0]

    def run(self, op: int, arg: int = 0, **kw: Any) -> asyncio.Future:
        return self._start_async(self._item(op, arg, kw))

    def submit_many(self, jobs: list) -> list[int]:
        """Jobs are ints (no-ops returning the int) or ``(op, arg, group, priority, deadline)``."""
        if not jobs:
            return []
        self._admit(len(jobs))
        return self._submit(jobs, None)
