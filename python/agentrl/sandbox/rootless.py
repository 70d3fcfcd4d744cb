"""Rootless mode: ``agentrl rootless [--] CMD ...`` runs CMD where agentrl can build boxes
without root.

agentrl's boxes need ``CAP_SYS_ADMIN`` and host ids of their own to run as. Without root, a
user namespace gives both, as rootless Podman has them: this command makes one that maps the
caller to its root and the caller's subordinate ids (``/etc/subuid`` and ``/etc/subgid``,
through the setuid helpers ``newuidmap`` and ``newgidmap`` of the ``uidmap`` package) to ids
1 and up, with a mount namespace of its own, and runs CMD in it as that root. CMD's
``Sandbox()`` then works as on a root host: the same namespaces, seccomp policy, read-only
root and verdicts; the boxes run as the upper half of the subordinate ids.

Limits: memory, pids and CPU limits need a cgroup v2 subtree delegated to the caller, as
systemd gives a user session (``systemd-run --user --scope -p Delegate=yes agentrl rootless
-- CMD``, or a user service with ``Delegate=yes``). When the caller's cgroup is delegated
(the caller can write its ``cgroup.procs`` and ``cgroup.subtree_control``), CMD also gets a
cgroup namespace rooted there with the cgroup file system mounted afresh, so that agentrl
places its boxes inside it as in a container. Without one, ``Sandbox()`` refuses to start
unless given ``degraded=True`` (rlimits only). What differs from a root host is listed in
``docs/deployment.md``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import pwd
import shutil
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["RootlessError", "add_parser", "delegated_cgroup", "main", "run", "subordinate_ids"]

_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_NEWUSER = 0x10000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_MS_REC, _MS_PRIVATE = 0x4000, 0x40000

DOCS = "https://github.com/agentrl/agentrl/blob/main/docs/deployment.md#rootless"


class RootlessError(RuntimeError):
    """Rootless mode cannot start here; the message says what is missing."""


def subordinate_ids(path: str | Path, user: str, uid: int) -> tuple[int, int] | None:
    """The first range of ``user``'s (or ``uid``'s) subordinate ids in ``path`` (the format
    of ``/etc/subuid``: ``name:first:count`` lines), or None."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) != 3 or parts[0] not in (user, str(uid)):
            continue
        try:
            first, count = int(parts[1]), int(parts[2])
        except ValueError:
            continue
        if count > 0:
            return first, count
    return None


def _own_cgroup() -> Path | None:
    """This process's cgroup v2 directory, or None (no pure v2 hierarchy)."""
    root = Path("/sys/fs/cgroup")
    if not (root / "cgroup.controllers").is_file():
        return None
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return root / line[3:].lstrip("/")
    except OSError:
        pass
    return None


def delegated_cgroup() -> Path | None:
    """This process's cgroup when it is delegated to this user (it may move processes in it
    and enable controllers for its children), else None."""
    own = _own_cgroup()
    if own is None or own == Path("/sys/fs/cgroup"):
        return None
    files = [own, own / "cgroup.procs", own / "cgroup.subtree_control"]
    return own if all(os.access(f, os.W_OK) for f in files) else None


def _check(argv: list[str]) -> tuple[tuple[int, int], tuple[int, int], list[str]]:
    """The subordinate uids and gids, and the two helpers; RootlessError with one line that
    says what is missing."""
    if not argv:
        raise RootlessError("no command given (use: agentrl rootless [--] CMD ...)")
    uid = os.getuid()
    if uid == 0:
        raise RootlessError(
            "this process is root already: run CMD directly (rootless mode is for users "
            "without root)"
        )
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    helpers = [shutil.which(h) for h in ("newuidmap", "newgidmap")]
    if not all(helpers):
        raise RootlessError(
            "newuidmap and newgidmap are not installed (Debian and Ubuntu: apt install uidmap; "
            f"RHEL and Fedora: shadow-utils); see {DOCS}"
        )
    subuid = subordinate_ids("/etc/subuid", user, uid)
    subgid = subordinate_ids("/etc/subgid", user, uid)
    if subuid is None or subgid is None:
        which = "/etc/subuid" if subuid is None else "/etc/subgid"
        raise RootlessError(
            f"{which} gives user {user} no subordinate ids (an administrator adds them with "
            f"`usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}`); "
            f"see {DOCS}"
        )
    return subuid, subgid, [str(h) for h in helpers]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _fail(fd: int, what: str) -> None:
    """In the child: report ``what`` (with errno) to the parent and exit."""
    err = ctypes.get_errno()
    os.write(fd, f"{what}: {os.strerror(err) if err else 'failed'}".encode())
    os._exit(70)


def _child(argv: list[str], cgroup: bool, go_r: int, ready_w: int, err_w: int) -> None:
    """The child: a new user namespace, then (once mapped) root in it, a mount namespace,
    maybe a cgroup namespace, and CMD."""
    libc = _libc()
    if libc.unshare(_CLONE_NEWUSER) != 0:
        _fail(
            err_w,
            "creating a user namespace (unprivileged user namespaces may be disabled: "
            "sysctl kernel.unprivileged_userns_clone, user.max_user_namespaces, or AppArmor's "
            "kernel.apparmor_restrict_unprivileged_userns)",
        )
    os.write(ready_w, b"u")
    if os.read(go_r, 1) != b"g":
        os._exit(70)  # the parent could not map the ids: it reports why
    try:
        os.setresgid(0, 0, 0)
        os.setgroups([])
        os.setresuid(0, 0, 0)
    except OSError as e:
        os.write(err_w, f"becoming root of the user namespace: {e}".encode())
        os._exit(70)
    flags = _CLONE_NEWNS | (_CLONE_NEWCGROUP if cgroup else 0)
    if libc.unshare(flags) != 0:
        _fail(err_w, "creating the mount and cgroup namespaces")
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        _fail(err_w, "making the mounts private")
    if cgroup:
        # The cgroup file system, mounted afresh, shows this namespace's root (the delegated
        # cgroup) as its top. The host's mount of it below cannot be unmounted here (it is
        # locked to this namespace), and the kernel refuses one superblock mounted twice on
        # one mount point: an empty tmpfs goes between them.
        nodev = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        if libc.mount(b"none", b"/sys/fs/cgroup", b"tmpfs", nodev, b"size=4k,mode=755") != 0:
            _fail(err_w, "covering the host's /sys/fs/cgroup")
        if libc.mount(b"cgroup2", b"/sys/fs/cgroup", b"cgroup2", nodev, None) != 0:
            _fail(err_w, "mounting the delegated cgroup at /sys/fs/cgroup")
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        os.write(err_w, f"cannot run {argv[0]}: {e}".encode())
        os._exit(127)


def run(argv: list[str], *, cgroup: bool | None = None) -> int:
    """Runs ``argv`` in rootless mode (see the module docs) and returns its exit status
    (128 + N when a signal ended it). ``cgroup``: give CMD a cgroup namespace rooted at the
    caller's delegated cgroup (default: when there is one). Raises RootlessError when rootless
    mode cannot start, and says why."""
    subuid, subgid, (newuidmap, newgidmap) = _check(list(argv))
    if cgroup is None:
        cgroup = delegated_cgroup() is not None
    elif cgroup and delegated_cgroup() is None:
        raise RootlessError(
            f"this process's cgroup ({_own_cgroup() or 'none: no cgroup v2 hierarchy'}) is not "
            "delegated to this user: run under `systemd-run --user --scope -p Delegate=yes`, "
            f"or in a user service with Delegate=yes; see {DOCS}"
        )
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child execs or exits)
        try:
            for fd in (go_w, ready_r, err_r):
                os.close(fd)
            _child(list(argv), cgroup, go_r, ready_w, err_w)
        finally:
            os._exit(70)
    for fd in (go_r, ready_w, err_w):
        os.close(fd)
    # Signals meant for CMD (Ctrl-C, a service manager's stop) reach it; this process waits.
    forward = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for s in forward:
        signal.signal(s, lambda signum, _f: os.kill(pid, signum))
    try:
        if os.read(ready_r, 1) == b"u":
            uid, gid = os.getuid(), os.getgid()
            maps = [
                [newuidmap, str(pid), "0", str(uid), "1", "1", str(subuid[0]), str(subuid[1])],
                [newgidmap, str(pid), "0", str(gid), "1", "1", str(subgid[0]), str(subgid[1])],
            ]
            for cmd in maps:
                p = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if p.returncode != 0:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    raise RootlessError(
                        f"{Path(cmd[0]).name} failed: {p.stderr.strip() or p.returncode}; "
                        f"see {DOCS}"
                    )
            os.write(go_w, b"g")
        os.close(go_w)
        err = b""
        while chunk := os.read(err_r, 4096):
            err += chunk
        _, status = os.waitpid(pid, 0)
        if err:
            raise RootlessError(err.decode(errors="replace"))
    finally:
        for s, h in forward.items():
            signal.signal(s, h)
        for fd in (ready_r, err_r):
            os.close(fd)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The ``agentrl rootless`` subcommand."""
    p = sub.add_parser(
        "rootless",
        help="run CMD in a user namespace where agentrl can build boxes without root",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument(
        "--no-cgroup",
        action="store_true",
        help="do not give CMD a cgroup namespace at the delegated cgroup",
    )
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    p.set_defaults(func=main)


def main(a: argparse.Namespace) -> int:
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    try:
        return run(argv, cgroup=False if a.no_cgroup else None)
    except RootlessError as e:
        print(f"agentrl rootless: {e}", file=sys.stderr)
        return 70
