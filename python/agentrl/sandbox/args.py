"""The argument checks every entry point shares, and the interpreter paths both backends bind.

:class:`agentrl.Sandbox` (``agentrl.sandbox.box``), its nsjail backend (``agentrl.backends.nsjail``)
and :class:`agentrl.SandboxPool` jobs check their arguments with these functions, so each
mistake is refused with the same error, naming its argument, whichever entry point it reached.
:class:`Bind` is defined here because :func:`bind_tuple` checks for it; ``agentrl.sandbox.box`` and
``agentrl`` export it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.sandbox.limits import Limits

__all__ = [
    "RELOCATED",
    "Bind",
    "bind_tuple",
    "check_common",
    "check_int",
    "check_pass_fds",
    "check_range",
    "check_tee",
    "env_pairs",
    "file_list",
    "interpreter_paths",
    "python_argv",
    "python_files",
    "run_args",
    "to_box_path",
]


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


def interpreter_paths() -> list[str]:
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


RELOCATED = "/.agentrl/py"
"""Where the box sees an interpreter installation that lies under a path the box builds for
itself (a virtualenv in /tmp, say): ``RELOCATED/0``, ``RELOCATED/1``, ... in both backends."""


def to_box_path(path: str, relocated: Iterable[tuple[str, str]]) -> str:
    """Where the box sees host ``path``, given the relocated installations ``(host path, box
    path)``: ``path`` itself when it is under none of them."""
    for src, dst in relocated:
        if path == src or path.startswith(src + "/"):
            return dst + path[len(src) :]
    return path


def _to_bytes(name: str, v: object) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, (str, os.PathLike)):
        return os.fsencode(v)
    raise TypeError(f"{name} must be str, bytes or a path, got {type(v).__name__}")


def bind_tuple(b: object) -> tuple[str, str, bool]:
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


def env_pairs(name: str, env: Mapping[str, str] | None) -> list[tuple[str, str]]:
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


def check_common(
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


def run_args(
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


def python_files(source: object, files: Mapping[str, bytes | str] | None) -> dict[str, bytes | str]:
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


def python_argv(python: str) -> list[str]:
    """The command of a cold ``run_python``: ``python __main__.py`` in /work, as a program is
    run on the host (the environment honoured, /work first on ``sys.path``)."""
    return [python, "__main__.py"]


_MAX_PASS_FDS = 8


def check_pass_fds(pass_fds: object, warm: bool = True) -> tuple[int, ...]:
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


def check_tee(tee: object) -> tuple[int, int] | None:
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


def check_int(name: str, v: object, lo: float | None, hi: float | None) -> int:
    """``v`` as an int within ``[lo, hi]`` (None: unbounded on that side), else TypeError or
    ValueError naming ``name``."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    check_range(name, v, lo, hi)
    return v


def check_range(name: str, v: float, lo: float | None, hi: float | None) -> None:
    if (lo is None or v >= lo) and (hi is None or v <= hi):
        return
    if lo is not None and hi is not None:
        raise ValueError(f"{name} must be between {lo} and {hi}, got {v}")
    bound = f"at least {lo}" if hi is None else f"at most {hi}"
    raise ValueError(f"{name} must be {bound}, got {v}")


def file_list(files: Mapping[str, bytes | str] | None) -> list[tuple[str, bytes]]:
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
