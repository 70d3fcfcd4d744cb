"""What a job is part of: the ids a trace record and the metrics' labels carry.

A caller that knows what its sandbox jobs belong to (an episode of a rollout, a task being
judged, a policy version) says so once around the submissions::

    with job_context(task_id="HumanEval/32", episode=7, group=2, policy_version=3):
        await pool.run_python(source)

The context is a :mod:`contextvars` variable, so it follows asyncio tasks and is captured
when a job is submitted (only by a pool that has observers). Nested contexts add to the outer
one. This module is light: it imports nothing beyond the standard library.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["CONTEXT_FIELDS", "current_context", "job_context", "job_tag", "language_of"]

CONTEXT_FIELDS = ("task_id", "episode", "group", "policy_version", "language", "judge")
"""The fields a context may carry (anything else goes to ``extra``)."""

_CTX: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "agentrl_job_context", default=None
)

# argv[0] basenames of the usual toolchains -> the language they stand for (bounded label set).
_PROGRAMS = {
    "python": "python", "python3": "python", "pypy3": "python",
    "node": "nodejs", "nodejs": "nodejs", "deno": "typescript", "tsx": "typescript",
    "bash": "bash", "sh": "bash", "dash": "bash",
    "gcc": "c", "cc": "c", "clang": "c",
    "g++": "cpp", "c++": "cpp", "clang++": "cpp",
    "java": "java", "javac": "java",
    "go": "go", "rustc": "rust", "cargo": "rust", "ruby": "ruby", "perl": "perl",
    "php": "php", "lua": "lua", "julia": "julia", "Rscript": "r", "ghc": "haskell",
    "runghc": "haskell", "swift": "swift", "kotlinc": "kotlin", "scala": "scala",
    "dotnet": "csharp", "mono": "csharp", "csc": "csharp",
}  # fmt: skip


@contextlib.contextmanager
def job_context(**fields: Any) -> Iterator[dict[str, Any]]:
    """Jobs submitted inside carry ``fields`` (``task_id``, ``episode``, ``group``,
    ``policy_version``, ``language``, ``judge``, or any other JSON value)."""
    outer = _CTX.get()
    ctx = {**outer, **fields} if outer else dict(fields)
    token = _CTX.set(ctx)
    try:
        yield ctx
    finally:
        _CTX.reset(token)


def current_context() -> dict[str, Any] | None:
    """The context of jobs submitted here now, or None."""
    return _CTX.get()


def language_of(argv: Sequence[Any]) -> str:
    """The language a command runs, from its program's name (``"other"`` if unknown)."""
    if not argv:
        return "other"
    a0 = argv[0]
    name = os.path.basename(a0.decode("utf-8", "replace") if isinstance(a0, bytes) else str(a0))
    if name in _PROGRAMS:
        return _PROGRAMS[name]
    base = name.rstrip("0123456789.-")  # python3.11, gcc-12, node18
    return _PROGRAMS.get(base, "other")


def job_tag(python: bool, argv: Sequence[Any]) -> tuple[str, dict[str, Any] | None]:
    """A job's tag as the pool records it when observed: ``(language, context)``."""
    ctx = _CTX.get()
    if ctx is not None and "language" in ctx:
        return str(ctx["language"]), ctx
    return ("python" if python else language_of(argv)), ctx
