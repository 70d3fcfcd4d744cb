"""The private mount namespace for bind sources the box user cannot reach (:class:`_Staging`).

nsjail switches to the box's user before it mounts, so a bind source must be reachable by an
unprivileged host uid; others are bound once to reachable paths inside a namespace held by a
helper process, which every run enters with ``nsenter``. The host's mounts stay untouched."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
from collections.abc import Mapping

from agentrl.errors import SandboxError


def _reachable_by_others(path: str) -> bool:
    """Whether an unprivileged user can look up ``path`` (every ancestor searchable by others)."""
    p = os.path.realpath(path)
    parts = p.strip("/").split("/")
    cur = "/"
    for part in ["", *parts[:-1]]:
        cur = os.path.join(cur, part) if part else cur
        try:
            st = os.stat(cur)
        except OSError:
            return False
        if not st.st_mode & stat.S_IXOTH:
            return False
    return True


class _Staging:
    """A helper process holding a private mount namespace in which bind sources that the box
    user cannot reach are bound to reachable directories (the host's mounts stay untouched).
    Runs enter it with ``nsenter`` before starting nsjail; it ends when its stdin closes."""

    def __init__(self, stage_dir: str, sources: list[str]) -> None:
        tools = {
            t: shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin")
            for t in ("unshare", "nsenter", "mount")
        }
        for tool, where in tools.items():
            if where is None:
                raise SandboxError(
                    f"{tool} (util-linux) is needed to bind {sources[0]} into nsjail boxes"
                )
        self.nsenter: str = tools["nsenter"]  # type: ignore[assignment]
        self.targets: dict[str, str] = {}
        script = ["set -e"]
        args: list[str] = []
        for i, src in enumerate(sources):
            dst = os.path.join(stage_dir, str(i))
            if os.path.isdir(src):
                os.mkdir(dst, 0o755)
            else:
                os.close(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
            self.targets[src] = dst
            a, b = len(args) + 1, len(args) + 2
            args += [src, dst]
            script.append(f'mount --rbind "${{{a}}}" "${{{b}}}"')
            script.append(f'mount -o remount,bind,ro,nosuid,nodev "${{{b}}}"')
        script += ["echo ready", "exec cat > /dev/null"]
        try:
            self.proc = subprocess.Popen(
                [
                    *("unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c"),
                    "\n".join(script),
                    "agentrl-nsjail-staging",
                    *args,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                start_new_session=True,
            )
        except OSError as e:
            raise SandboxError(f"cannot start the nsjail staging namespace: {e}") from None
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
            self.stop()
            raise SandboxError(f"cannot prepare the nsjail bind sources: {err.strip() or line!r}")

    @property
    def mnt_ns(self) -> str:
        return f"/proc/{self.proc.pid}/ns/mnt"

    def stop(self) -> None:
        p = self.proc
        for f in (p.stdin, p.stdout, p.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _restage(arg: object, targets: Mapping[str, str]) -> object:
    """Rewrites a ``src:dst`` mount argument whose source was staged."""
    if not isinstance(arg, str) or ":" not in arg:
        return arg
    src, _, dst = arg.partition(":")
    return f"{targets[src]}:{dst}" if src in targets else arg
