"""The native backend of :class:`agentrl.Sandbox`: boxes built by the Rust core
(``agentrl._core.Sandbox``), with warm interpreters for ``run_python``.

It takes the facade's checked :class:`~agentrl.sandbox.backend.Options` and
:class:`~agentrl.sandbox.backend.RunRequest`; what it checks itself is what only it needs: that a
warm interpreter can load agentrl's extension, and that its environment loads no code a run can
change.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Mapping, Sequence

from agentrl import _core
from agentrl.sandbox.args import check_pass_fds
from agentrl.sandbox.backend import Options, RunRequest
from agentrl.sandbox.layout import interpreter_layout, relocate_argv0
from agentrl.sandbox.result import ExecResult
from agentrl.sandbox.warm import bootstrap_argv

__all__ = ["CORE_MODULE_IN_BOX", "NativeBackend", "default_concurrency"]


def default_concurrency() -> int:
    """Slots of a native sandbox without ``max_concurrency``: 8 per core."""
    return min(4096, max(8, 8 * (os.cpu_count() or 1)))


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


class NativeBackend:
    """:class:`~agentrl.sandbox.backend.Backend` over the Rust core's sandbox."""

    def __init__(self, opts: Options) -> None:
        layout = interpreter_layout(opts.host_python)
        base_env = {
            "PATH": ":".join([*layout.path_dirs, "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": "/work",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "USER": "sandbox",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        base_env.update(dict(opts.env))
        self._base_env = base_env
        self._python = layout.python
        self.relocated = tuple(layout.binds)
        """Relocated installations ``(host path, box path, writable)``: an ``argv[0]`` under
        one runs from where the box sees it (the pool does the same)."""
        bind_list = [*layout.binds, *opts.binds]
        warm_cfg = None
        if opts.warm:
            _check_warm_interpreter(opts.host_python)
            _check_warm_env(base_env, [dst for _, dst, rw in bind_list if rw])
            argv = bootstrap_argv(self._python, CORE_MODULE_IN_BOX, opts.preimports, opts.preload)
            warm_cfg = (argv, os.path.realpath(_core.__file__), 120.0)
        self._warm = opts.warm
        self.core = _core.Sandbox(
            opts.limits,
            opts.network,
            layout.system_paths,
            bind_list,
            list(base_env.items()),
            opts.max_concurrency,
            opts.degraded,
            opts.cgroup_parent,
            warm_cfg,
        )
        """The Rust core's sandbox (the pool schedules its jobs on it directly)."""

    @property
    def cgroup_version(self) -> str | None:
        return self.core.cgroup_version

    @property
    def python(self) -> str:
        return self._python

    @property
    def warm(self) -> bool:
        return self._warm

    def run(self, req: RunRequest) -> ExecResult:
        args = list(req.argv)
        relocate_argv0(args, self.relocated)
        if args != req.argv:
            req = dataclasses.replace(req, argv=args)
        return ExecResult._from_core(self.core.run(req, req.session, req.tee))

    def run_python(self, req: RunRequest) -> ExecResult:
        fds = check_pass_fds(req.pass_fds, self._warm)
        warm = self.warm_for(req.env, bool(fds))
        return self.run(dataclasses.replace(req, warm=warm))

    def warm_for(self, env: Sequence[tuple[str, str]], pass_fds: bool) -> bool:
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

    def session(self, files: list[tuple[str, bytes]], disk_bytes: int) -> object:
        return self.core.session(files, disk_bytes)

    def close(self, cancel: bool) -> None:
        self.core.close(cancel)

    def describe(self) -> str:
        return ""
