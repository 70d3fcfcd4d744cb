"""The executor protocol: what the Evaluator, the rollout scheduler, the environments and the
trainer need from whatever runs their sandbox jobs.

:class:`agentrl.SandboxPool` (one host), :class:`agentrl.distributed.RayPool` (a Ray cluster)
and the sandbox service's client all satisfy it, so each consumer takes any of them. Code that
needs a local-only feature (the Evaluator's persistent judges, which hold warm interpreters of
one :class:`agentrl.Sandbox`) checks ``isinstance(x, SandboxPool)`` and falls back to the
per-run path otherwise.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Awaitable, Iterable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from agentrl.sandbox.result import ExecResult

__all__ = ["Executor"]


@runtime_checkable
class Executor(Protocol):
    """Runs sandbox jobs: the public job surface of :class:`agentrl.SandboxPool`.

    Job keywords (all optional): ``stdin``, ``files``, ``collect``, ``limits``, ``env``,
    ``cwd`` (as :meth:`agentrl.Sandbox.run`); implementations may take more (``group``,
    ``priority``, ``deadline``).
    """

    @property
    def workers(self) -> int:
        """Jobs that run at once (all nodes together for a cluster)."""
        ...

    def submit(self, argv: Sequence[Any], **kw: Any) -> concurrent.futures.Future[ExecResult]:
        """Submits a run of ``argv``; a future of its result."""
        ...

    def submit_python(self, source: str, **kw: Any) -> concurrent.futures.Future[ExecResult]:
        """Submits a run of Python ``source``; a future of its result."""
        ...

    def run(self, argv: Sequence[Any], **kw: Any) -> Awaitable[ExecResult]:
        """``await executor.run(argv, ...)`` from a coroutine."""
        ...

    def run_python(self, source: str, **kw: Any) -> Awaitable[ExecResult]:
        """``await executor.run_python(source, ...)`` from a coroutine."""
        ...

    def map(self, jobs: Iterable[Any], **kw: Any) -> Iterator[ExecResult]:
        """Runs every job, yields the results in order."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counters; at least ``completed`` (jobs that ran)."""
        ...

    def close(self) -> None:
        """Stops the executor (idempotent)."""
        ...
