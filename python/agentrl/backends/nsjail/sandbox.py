"""The :class:`NsjailSandbox` class: :class:`agentrl.Sandbox` opened on the nsjail backend
(:class:`~agentrl.backends.nsjail.backend.NsjailBackend`), with what only that backend can tell."""

from __future__ import annotations

from agentrl.backends.nsjail.backend import NsjailBackend, default_concurrency
from agentrl.sandbox.backend import Backend, Options
from agentrl.sandbox.box import Sandbox


class NsjailSandbox(Sandbox):
    """The :class:`agentrl.Sandbox` API, enforced by nsjail (see :mod:`agentrl.backends.nsjail`).

    ``Sandbox(..., backend="nsjail")`` makes one. Arguments are those of
    :class:`agentrl.Sandbox`, checked by it; ``warm`` and ``preimports`` are accepted and
    ignored (nsjail has no warm interpreter: every ``run_python`` starts
    ``python __main__.py``); ``preload`` needs a warm interpreter and is refused. ``nsjail``
    overrides the binary (default: :func:`~agentrl.backends.nsjail.find_nsjail`).
    """

    _backend: NsjailBackend

    def __init__(self, *args: object, nsjail: str | None = None, **kwargs: object) -> None:
        self._nsjail_binary = nsjail
        kwargs["backend"] = "nsjail"
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def _default_concurrency(cls) -> int:
        return default_concurrency()

    def _open(self, backend: str, opts: Options) -> Backend:
        return NsjailBackend(opts, self._nsjail_binary)

    @property
    def nsjail(self) -> str:
        """The nsjail binary in use."""
        return self._backend.nsjail

    @property
    def seccomp_policy(self) -> str:
        """The Kafel policy given to nsjail (``--seccomp_string``)."""
        return self._backend.seccomp_policy

    @property
    def dropped_syscalls(self) -> tuple[str, ...]:
        """Calls of the native policy that nsjail's Kafel could not name (they get ENOSYS)."""
        return self._backend.dropped_syscalls

    @property
    def _root(self) -> str:
        """The sandbox's directory on the host (its runs' work directories, ``/etc``)."""
        return self._backend.root
