"""What :class:`agentrl.Sandbox` asks of a backend: the protocol, and the checked arguments it
hands over.

The facade (``agentrl.sandbox.box``) checks every argument once, with the shared checks of
``agentrl.sandbox.args``, and gives a backend only what passed: :class:`Options` when it opens,
a :class:`RunRequest` for each run. A backend enforces the isolation and the limits and makes
the verdict. Two implement :class:`Backend`: the native one over the Rust core
(``agentrl.sandbox.native``) and nsjail's (``agentrl.backends.nsjail``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from agentrl.sandbox.limits import Limits
from agentrl.sandbox.result import ExecResult

__all__ = ["Backend", "Options", "RunRequest"]


@dataclass(frozen=True)
class Options:
    """A sandbox's constructor arguments, checked and with defaults filled in."""

    limits: Limits
    network: bool
    binds: tuple[tuple[str, str, bool], ...]
    """The caller's binds as ``(source, absolute target, writable)``."""
    env: tuple[tuple[str, str], ...]
    """The caller's additions to the box environment."""
    max_concurrency: int
    degraded: bool
    cgroup_parent: str | None
    warm: bool
    preimports: tuple[str, ...]
    preload: tuple[tuple[str, str], ...]
    python: str | None
    """The ``python`` argument as given (None: the running interpreter)."""
    host_python: str
    """The interpreter ``run_python`` uses, as an absolute host path (an executable)."""


@dataclass(frozen=True, slots=True)
class RunRequest:
    """One run's arguments, checked: what :meth:`agentrl.Sandbox.run` hands a backend, and
    what crosses into the Rust core (``_core.Sandbox.run``, and in a
    :class:`agentrl.pool.jobs.PoolJob` ``_core.Pool.submit_many``), read there by field name."""

    argv: list[bytes]
    """The program and its arguments."""
    stdin: bytes
    """The whole standard input."""
    files: list[tuple[str, bytes]]
    """Input files: (path relative to the work dir, contents)."""
    collect: list[str]
    """Files to hand back after the run (relative to the work dir)."""
    limits: Limits | None
    """This run's limits (None: the sandbox's)."""
    cwd: str | None
    """Working directory in the box (None: the work dir)."""
    env: list[tuple[str, str]]
    """Variables added to the sandbox's environment."""
    tee: tuple[int, int] | None = None
    """Host fds that get a live copy of stdout and stderr."""
    warm: bool = False
    """Run as a fork of the slot's warm interpreter (native backend, ``run_python`` only)."""
    session: object = None
    """The core session whose work dir the run uses (native backend only)."""
    pass_fds: tuple[int, ...] = ()
    """Host fds the run gets as its fds 3, 4, ... (warm runs only)."""


class Backend(Protocol):
    """A way of running boxes behind :class:`agentrl.Sandbox`."""

    @property
    def cgroup_version(self) -> str | None:
        """``"v1"`` or ``"v2"``, or None where no cgroup enforces the limits (degraded)."""
        ...

    @property
    def python(self) -> str:
        """Where the box sees the interpreter that ``run_python`` uses."""
        ...

    @property
    def warm(self) -> bool:
        """Whether ``run_python`` can fork a warm interpreter."""
        ...

    def run(self, req: RunRequest) -> ExecResult:
        """Runs ``req`` in a fresh box; its verdict."""
        ...

    def run_python(self, req: RunRequest) -> ExecResult:
        """Runs ``req``, a ``run_python`` (``python __main__.py`` with the source among its
        files), warm where the backend can; refuses what it cannot honour (``pass_fds``,
        ``tee``) with a ValueError."""
        ...

    def warm_for(self, env: Sequence[tuple[str, str]], pass_fds: bool) -> bool:
        """Whether a ``run_python`` with ``env`` (and ``pass_fds``) runs warm."""
        ...

    def session(self, files: list[tuple[str, bytes]], disk_bytes: int) -> object:
        """The backend's handle of a new session's work dir (see :class:`agentrl.Session`)."""
        ...

    def close(self, cancel: bool) -> None:
        """Stops the backend and removes what it made on the host; runs in flight are
        waited for, or with ``cancel`` (at interpreter exit) not."""
        ...

    def describe(self) -> str:
        """What the sandbox's ``repr`` adds for this backend (empty, or `` key=value``...)."""
        ...
