"""Finding a language's programs on the host, where a box can see them.

A box sees the host's ``/usr`` read-only (and ``/bin``, ``/lib``, ``/lib64``, which are links
into it on a merged-/usr system), and nothing of ``/root``, ``/home`` or ``/opt``. So a tool
counts as present only when its real path (links resolved) lies under one of
:data:`VISIBLE_ROOTS`: ``rustc`` installed by rustup under ``/root/.cargo`` exists on the host
but cannot run in a box, and is reported missing with that reason. The toolchain's
:attr:`Toolchain.fingerprint` (path, size and modification time of each program) is part of
the compile cache's key, so an upgraded compiler never serves an old artifact.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SEARCH_PATH", "VISIBLE_ROOTS", "Toolchain", "find_toolchain", "refresh"]

SEARCH_PATH: tuple[str, ...] = (
    "/usr/local/bin",
    "/usr/bin",
    "/bin",
    "/usr/local/sbin",
    "/usr/sbin",
)
"""Where a language's programs are looked for, in order (before its own extra directories)."""

VISIBLE_ROOTS: tuple[str, ...] = ("/usr", "/bin", "/lib", "/lib64", "/sbin")
"""Paths every box binds read-only from the host: a tool must really live under one."""


def _visible(path: str) -> bool:
    return any(path == r or path.startswith(r + "/") for r in VISIBLE_ROOTS)


@dataclass(frozen=True)
class Toolchain:
    """A language's programs as found on this host."""

    paths: dict[str, str]
    """Tool name -> its real path (under :data:`VISIBLE_ROOTS`, so the same path in a box)."""
    missing: tuple[str, ...]
    """Tools not found (empty when the language can be used)."""
    detail: str
    """Why they are missing, where a tool was found but is unusable (outside ``/usr``)."""
    fingerprint: tuple[tuple[str, int, int], ...]
    """``(real path, size, mtime_ns)`` of each tool: part of the compile cache's key."""

    @property
    def ok(self) -> bool:
        """Every tool was found."""
        return not self.missing

    def version(self, tool: str, args: Sequence[str] = ("--version",)) -> str:
        """The first line ``tool args`` prints (on the host, once per call): for reports."""
        return _version(self.paths[tool], tuple(args))


@functools.lru_cache(maxsize=64)
def _version(path: str, args: tuple[str, ...]) -> str:
    try:
        p = subprocess.run(
            [path, *args], capture_output=True, timeout=30, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    text = (p.stdout or p.stderr).decode("utf-8", "replace").strip()
    return text.splitlines()[0] if text else "unknown"


def _find(name: str, dirs: Sequence[str]) -> tuple[str | None, str]:
    """The real path of ``name`` in ``dirs`` (first usable one), or ``(None, why)``."""
    outside = []
    for d in dirs:
        cand = os.path.join(d, name)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            real = os.path.realpath(cand)
            if _visible(real):
                return real, ""
            outside.append(cand if real == cand else f"{cand} (-> {real})")
    anywhere = shutil.which(name)
    if anywhere is not None:
        real = os.path.realpath(anywhere)
        if _visible(real):
            return real, ""
        outside.append(anywhere if real == anywhere else f"{anywhere} (-> {real})")
    if outside:
        return None, (
            f"{name} exists at {outside[0]}, outside {', '.join(VISIBLE_ROOTS)}, which is all "
            "a box sees of the host; install it under /usr (e.g. the distribution's package)"
        )
    return None, f"{name} is not in {os.pathsep.join(dirs)}"


_lock = threading.Lock()
_found: dict[tuple[tuple[str, ...], tuple[str, ...], bool], Toolchain] = {}


def find_toolchain(
    tools: Sequence[str], extra_dirs: Sequence[str] = (), siblings: bool = False
) -> Toolchain:
    """Finds ``tools`` (cached until :func:`refresh`). ``extra_dirs`` may hold glob patterns
    (``/usr/lib/jvm/*/bin``); with ``siblings``, the tools after the first are taken from the
    first one's real directory when they are there (one JDK's ``javac``, ``jar`` and ``java``)."""
    key = (tuple(tools), tuple(extra_dirs), siblings)
    with _lock:
        hit = _found.get(key)
    if hit is not None:
        return hit
    dirs = list(SEARCH_PATH)
    for pattern in extra_dirs:
        dirs.extend(sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else [pattern])
    paths: dict[str, str] = {}
    missing: list[str] = []
    why: list[str] = []
    for i, tool in enumerate(tools):
        search = dirs
        if siblings and i > 0 and tools[0] in paths:
            search = [os.path.dirname(paths[tools[0]]), *dirs]
        path, reason = _find(tool, search)
        if path is None:
            missing.append(tool)
            why.append(reason)
        else:
            paths[tool] = path
    prints = []
    for p in paths.values():
        try:
            st = os.stat(p)
            prints.append((p, st.st_size, st.st_mtime_ns))
        except OSError:
            prints.append((p, -1, -1))
    tc = Toolchain(paths, tuple(missing), "; ".join(why), tuple(prints))
    with _lock:
        _found[key] = tc
    return tc


def refresh() -> None:
    """Forgets what was found (after installing a toolchain while running)."""
    with _lock:
        _found.clear()
    _version.cache_clear()
