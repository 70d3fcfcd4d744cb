"""Paths and files of a run: relative and absolute box paths checked, input files written into
the run's work directory and collected files read back (never following a symlink), and where
the work directories live."""

from __future__ import annotations

import os
import stat
import tempfile


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _relative_parts(field: str, p: str) -> list[str]:
    """Validates a relative path inside the work dir (as the native backend does)."""
    if p == "":
        raise ValueError(f"{field}: empty path")
    if "\0" in p:
        raise ValueError(f"{field}: {p!r} contains a NUL byte")
    if p.startswith("/"):
        raise ValueError(f"{field}: {p!r} is absolute; give a path relative to the work dir")
    parts = []
    for c in p.split("/"):
        if c in ("", "."):
            continue
        if c == "..":
            raise ValueError(f"{field}: {p!r} escapes the work dir")
        parts.append(c)
    if not parts:
        raise ValueError(f"{field}: {p!r} names no file")
    if any(len(c.encode()) > 255 for c in parts):
        raise ValueError(f"{field}: {p!r} has a component longer than 255 bytes")
    return parts


def _absolute_box_path(field: str, p: str) -> str:
    if "\0" in p:
        raise ValueError(f"{field}: {p!r} contains a NUL byte")
    if not p.startswith("/"):
        raise ValueError(f"{field}: {p!r} must be absolute")
    parts = []
    for c in p.split("/"):
        if c in ("", "."):
            continue
        if c == "..":
            raise ValueError(f"{field}: {p!r} must not contain '..'")
        parts.append(c)
    return "/" + "/".join(parts)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_input(work_fd: int, parts: list[str], data: bytes, hid: int) -> None:
    """Writes one input file below ``work_fd``, never following a symlink."""
    fd = os.dup(work_fd)
    try:
        for comp in parts[:-1]:
            try:
                os.mkdir(comp, 0o755, dir_fd=fd)
                os.chown(comp, hid, hid, dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                pass
            nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        ffd = os.open(parts[-1], flags, 0o644, dir_fd=fd)
        try:
            os.fchown(ffd, hid, hid)
            view = memoryview(data)
            while view:
                n = os.write(ffd, view)
                view = view[n:]
        finally:
            os.close(ffd)
    finally:
        os.close(fd)


def _collect(work_fd: int, parts: list[str], cap: int) -> tuple[bytes, bool] | None:
    """Reads a regular file below ``work_fd`` (no symlink anywhere on the way), up to ``cap``."""
    fds: list[int] = []
    try:
        fd = work_fd
        for comp in parts[:-1]:
            fd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
            fds.append(fd)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        ffd = os.open(parts[-1], flags, dir_fd=fd)
        fds.append(ffd)
        if not stat.S_ISREG(os.fstat(ffd).st_mode):
            return None
        chunks, total = [], 0
        while total <= cap:
            b = os.read(ffd, min(1 << 20, cap + 1 - total))
            if not b:
                break
            chunks.append(b)
            total += len(b)
        data = b"".join(chunks)
        return (data[:cap], True) if len(data) > cap else (data, False)
    except OSError:
        return None
    finally:
        for f in fds:
            os.close(f)


def _work_parent() -> str:
    """Where per-run work dirs live: ``/dev/shm`` when it is a tmpfs (box writes count
    against its memory cgroup), else the temp dir."""
    shm = "/dev/shm"
    for line in (_read("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        f = left.split()
        tmpfs = right.split()[:1] == ["tmpfs"]
        if len(f) > 4 and f[4] == shm and tmpfs and os.access(shm, os.W_OK | os.X_OK):
            return shm
    return tempfile.gettempdir()
