"""Persistent sessions for multi-turn agents."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from agentrl import _core
from agentrl.errors import SandboxError
from agentrl.sandbox.limits import Limits
from agentrl.sandbox.result import ExecResult

if TYPE_CHECKING:
    from agentrl.sandbox.box import Sandbox, StrOrBytesPath

__all__ = ["Session", "Snapshot"]


class Snapshot:
    """A frozen state of a session's work dir (see :meth:`Session.snapshot`)."""

    def __init__(self, session: Session, inner: _core.Snapshot, index: int) -> None:
        self._session = session
        self._inner = inner
        self.index = index
        """Order of creation within the session."""

    def __repr__(self) -> str:
        return f"<agentrl.Snapshot #{self.index}>"


class Session:
    """A work dir that persists across steps; no process survives a step.

    Each step is an ordinary fresh box (same isolation and limits as
    :meth:`Sandbox.run`) whose ``/work`` is the session's. The work dir is an overlay of
    frozen layers under a writable one, so :meth:`reset` (back to the initial files or the
    last snapshot), :meth:`snapshot` and :meth:`restore` take the same few milliseconds
    whatever the size of the files. Sessions are invisible to each other and to plain runs.
    Steps of one session run one at a time.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        inner: _core.Session,
        limits: Limits,
        cpu_budget_s: float | None,
    ) -> None:
        self._sandbox = sandbox
        self._inner = inner
        self._limits = limits
        self._cpu_budget_s = cpu_budget_s
        self._cpu_used_s = 0.0
        self._steps = 0
        self._snapshots = 0
        self._lock = threading.Lock()
        self._closed = False

    @property
    def cpu_used_s(self) -> float:
        """CPU time used by every step so far."""
        return self._cpu_used_s

    @property
    def steps(self) -> int:
        """Steps run so far."""
        return self._steps

    def _step_limits(self, limits: Limits | None) -> Limits:
        if limits is not None and not isinstance(limits, Limits):
            raise TypeError(f"limits must be agentrl.Limits, got {type(limits).__name__}")
        lim = limits or self._limits
        if self._cpu_budget_s is not None:
            left = self._cpu_budget_s - self._cpu_used_s
            if left <= 0:
                raise SandboxError(
                    f"the session's CPU budget of {self._cpu_budget_s} s is spent "
                    f"({self._cpu_used_s:.3f} s used)"
                )
            lim = lim.replace(cpu_time_s=min(lim.cpu_time_s, left))
        return lim

    def run(
        self,
        argv: Sequence[StrOrBytesPath],
        *,
        stdin: bytes | str | None = None,
        collect: Iterable[str] = (),
        limits: Limits | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Runs one step: ``argv`` in a fresh box whose ``/work`` is the session's."""
        with self._lock:
            if self._closed:
                raise SandboxError("the session is closed")
            r = self._sandbox.run(
                argv,
                stdin=stdin,
                collect=collect,
                limits=self._step_limits(limits),
                cwd=cwd,
                env=env,
                _session=self._inner,
            )
            self._steps += 1
            self._cpu_used_s += r.cpu_time_s
            return r

    def run_python(
        self,
        source: str,
        *,
        stdin: bytes | str | None = None,
        collect: Iterable[str] = (),
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Runs Python ``source`` as one step (``python -c source`` in ``/work``, as on a host:
        the work dir is first on ``sys.path`` and ``env`` is honoured)."""
        if not isinstance(source, str):
            raise TypeError("source must be a str")
        return self.run(
            [self._sandbox.python, "-c", source],
            stdin=stdin,
            collect=collect,
            limits=limits,
            env=env,
        )

    def reset(self) -> None:
        """Drops every change since the session began, or since the last restore."""
        with self._lock:
            self._inner.reset()

    def snapshot(self) -> Snapshot:
        """Freezes the current work dir; :meth:`restore` returns to it (branches allowed)."""
        with self._lock:
            inner = self._inner.snapshot()
            self._snapshots += 1
            return Snapshot(self, inner, self._snapshots)

    def restore(self, snap: Snapshot) -> None:
        """Returns the work dir to ``snap`` (taken from this session)."""
        if not isinstance(snap, Snapshot):
            raise TypeError(f"restore takes a Snapshot, got {type(snap).__name__}")
        if snap._session is not self:
            raise ValueError("that snapshot belongs to another session")
        with self._lock:
            self._inner.restore(snap._inner)

    def close(self) -> None:
        """Frees the session's layers. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._inner.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<agentrl.Session {state} steps={self._steps}>"
