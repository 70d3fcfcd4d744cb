"""Cgroups of the nsjail backend: the sandbox's base cgroup(s) (:class:`_Cgroups`, v1 ``memory``,
``pids`` and ``cpuacct`` or one v2 cgroup) and each run's cgroup below them (:class:`_RunCgroup`:
the exact limits, the counters, v1 OOM notifications, the kill switch)."""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import signal
import threading
import time

from agentrl import _core
from agentrl.errors import SandboxError
from agentrl.sandbox.limits import Limits

log = logging.getLogger("agentrl.nsjail")  # the logger name from before the move

_MEM_SLACK = 1 << 20
"""nsjail's own memory limit sits this far above the parent's, so the parent is what fires."""


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _read_int(path: str) -> int | None:
    text = _read(path)
    try:
        return int(text.split()[0]) if text else None
    except ValueError:
        return None


def _kv(path: str, key: str) -> int | None:
    text = _read(path)
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            with contextlib.suppress(ValueError):
                return int(parts[1])
    return None


def _rmdir_tree(path: str, deadline: float) -> bool:
    """Removes a cgroup directory and its sub-cgroups (children first), retrying while busy."""
    while True:
        try:
            for entry in os.scandir(path):
                if entry.is_dir(follow_symlinks=False):
                    _rmdir_tree(entry.path, deadline)
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                log.warning("cannot remove cgroup %s: %s", path, e)
                return False
            time.sleep(0.005)


def _self_cgroup(controller: str | None) -> str:
    """This process's cgroup path in the hierarchy of ``controller`` (None: v2)."""
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        hid, ctrls, path = [*line.split(":", 2), "", ""][:3]
        if controller is None and hid == "0" and ctrls == "":
            return path
        if controller is not None and controller in ctrls.split(","):
            return path
    return "/"


def _cgroup_mounts() -> dict[str, str]:
    """Mount points of the v1 hierarchies by controller, and ``"2"`` for a pure v2 root."""
    out: dict[str, str] = {}
    for line in (_read("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        point, fstype, opts = fields[4], rfields[0], rfields[2].split(",")
        if fstype == "cgroup":
            for c in ("memory", "pids", "cpuacct"):
                if c in opts and c not in out:
                    out[c] = point
        elif fstype == "cgroup2" and point == "/sys/fs/cgroup":
            out["2"] = point
    return out


class _Cgroups:
    """The sandbox's base cgroup(s) and the per-run cgroups below them."""

    V1_CONTROLLERS = ("memory", "pids", "cpuacct")

    def __init__(self, version: str, dirs: dict[str, str], mounts: dict[str, str]) -> None:
        self.version = version
        self.dirs = dirs
        """Base directory by controller (v2: key ``"2"``)."""
        self.mounts = mounts
        self._seq = itertools.count()
        self._lock = threading.Lock()

    @classmethod
    def create(cls, parent: str | None) -> _Cgroups | None:
        mounts = _cgroup_mounts()
        name = f"agentrl-nsjail-{os.getpid()}-{next(_BASE_SEQ)}"
        if all(c in mounts for c in cls.V1_CONTROLLERS):
            version, ctrls = "v1", cls.V1_CONTROLLERS
        elif "2" in mounts and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            version, ctrls = "v2", ("2",)
        else:
            return None
        dirs: dict[str, str] = {}
        try:
            for c in ctrls:
                mount = mounts[c]
                if parent is not None:
                    base = os.path.join(mount, parent.strip("/"))
                elif c == "2":
                    # Placed as the native backend places its cgroups (the Rust core decides).
                    base = _core._cgroup_default_parent() or mount
                else:
                    own = _self_cgroup(c).strip("/")
                    base = os.path.join(mount, own) if own else mount
                    if not os.path.isdir(base):
                        base = mount
                d = os.path.join(base, name)
                os.mkdir(d, 0o755)
                dirs[c] = d
            if version == "v2":
                _enable_v2_controllers(mounts["2"], dirs["2"])
        except OSError as e:
            for d in dirs.values():
                _rmdir_tree(d, time.monotonic() + 1)
            raise SandboxError(f"cannot create the nsjail sandbox's cgroup: {e}") from None
        return cls(version, dirs, mounts)

    def new_run(self) -> _RunCgroup:
        with self._lock:
            n = next(self._seq)
        return _RunCgroup(self, f"run-{n}")

    def remove(self) -> None:
        deadline = time.monotonic() + 2
        for d in self.dirs.values():
            _rmdir_tree(d, deadline)


_BASE_SEQ = itertools.count()


def _enable_v2_controllers(root: str, base: str) -> None:
    """Writes ``+memory +pids`` to ``cgroup.subtree_control`` from ``root`` down to ``base``."""
    rel = os.path.relpath(base, root)
    path = root
    for part in ["", *rel.split(os.sep)]:
        path = os.path.join(path, part) if part else path
        ctl = os.path.join(path, "cgroup.subtree_control")
        have = (_read(ctl) or "").split()
        for c in ("memory", "pids"):
            if c not in have:
                _write(ctl, f"+{c}")


class _RunCgroup:
    """The cgroup(s) of one run: the exact limits, the counters, and the kill switch."""

    def __init__(self, base: _Cgroups, name: str) -> None:
        self.base = base
        self.dirs = {c: os.path.join(d, name) for c, d in base.dirs.items()}
        self.created: list[str] = []
        self.oom_fds: tuple[int, int] | None = None
        """v1: an eventfd registered for the cgroup's OOM notifications, and the
        ``memory.oom_control`` fd it watches."""

    @property
    def v1(self) -> bool:
        return self.base.version == "v1"

    def setup(self, limits: Limits) -> None:
        for d in self.dirs.values():
            os.mkdir(d, 0o755)
            self.created.append(d)
        if self.v1:
            mem = self.dirs["memory"]
            _write(os.path.join(mem, "memory.limit_in_bytes"), str(limits.memory_bytes))
            # No memsw limit: with one, v1 counts no failure in memory.failcnt (nor in
            # memory.memsw.failcnt), which is the only trace of the limit firing that survives
            # nsjail's cleanup. swappiness 0 keeps the group out of swap instead.
            with contextlib.suppress(OSError):
                _write(os.path.join(mem, "memory.swappiness"), "0")
            _write(os.path.join(self.dirs["pids"], "pids.max"), str(limits.max_pids))
            self._watch_oom(mem)
        else:
            d = self.dirs["2"]
            _write(os.path.join(d, "memory.max"), str(limits.memory_bytes))
            swap = os.path.join(d, "memory.swap.max")
            if os.path.exists(swap):
                _write(swap, "0")
            _write(os.path.join(d, "pids.max"), str(limits.max_pids))
            ctl = os.path.join(d, "cgroup.subtree_control")
            for c in ("memory", "pids"):
                _write(ctl, f"+{c}")

    def _watch_oom(self, mem: str) -> None:
        """v1 counts an OOM kill in the victim's cgroup (nsjail's, removed before we could read
        it), but notifies the cgroup whose limit fired (this one) through an eventfd."""
        try:
            efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except (AttributeError, OSError):
            return
        try:
            ofd = os.open(os.path.join(mem, "memory.oom_control"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(efd)
            return
        try:
            _write(os.path.join(mem, "cgroup.event_control"), f"{efd} {ofd}")
        except OSError:
            os.close(efd)
            os.close(ofd)
            return
        self.oom_fds = (efd, ofd)

    def _oom_events(self) -> int | None:
        if self.oom_fds is None:
            return None
        try:
            return os.eventfd_read(self.oom_fds[0])
        except BlockingIOError:
            return 0
        except OSError:
            return None

    def nsjail_flags(self, limits: Limits) -> list[str]:
        mem_max = str(limits.memory_bytes + _MEM_SLACK)
        if self.v1:
            mm, pm = self.base.mounts["memory"], self.base.mounts["pids"]
            return [
                "--cgroup_mem_max",
                mem_max,
                "--cgroup_mem_mount",
                mm,
                "--cgroup_mem_parent",
                os.path.relpath(self.dirs["memory"], mm),
                "--cgroup_pids_max",
                str(limits.max_pids),
                "--cgroup_pids_mount",
                pm,
                "--cgroup_pids_parent",
                os.path.relpath(self.dirs["pids"], pm),
            ]
        return [
            "--use_cgroupv2",
            "--cgroupv2_mount",
            self.dirs["2"],
            "--cgroup_mem_max",
            mem_max,
            "--cgroup_pids_max",
            str(limits.max_pids),
        ]

    @property
    def join_procs(self) -> str | None:
        """``cgroup.procs`` that nsjail itself joins before it starts (v1: for CPU time)."""
        return os.path.join(self.dirs["cpuacct"], "cgroup.procs") if self.v1 else None

    def cpu_ns(self) -> int | None:
        if self.v1:
            return _read_int(os.path.join(self.dirs["cpuacct"], "cpuacct.usage"))
        usec = _kv(os.path.join(self.dirs["2"], "cpu.stat"), "usage_usec")
        return None if usec is None else usec * 1000

    def _all_procs(self, exclude: int) -> list[int]:
        roots = [self.dirs["cpuacct"], self.dirs["memory"]] if self.v1 else [self.dirs["2"]]
        pids: set[int] = set()
        for root in roots:
            for dirpath, _dirs, _files in os.walk(root):
                for tok in (_read(os.path.join(dirpath, "cgroup.procs")) or "").split():
                    with contextlib.suppress(ValueError):
                        pids.add(int(tok))
        pids.discard(exclude)
        return sorted(pids)

    def kill(self, exclude: int) -> None:
        """SIGKILLs every process of the run but ``exclude`` (nsjail), until none is left."""
        if not self.v1:
            with contextlib.suppress(OSError):
                _write(os.path.join(self.dirs["2"], "cgroup.kill"), "1")
        deadline = time.monotonic() + 2.0
        while True:
            left = self._all_procs(exclude)
            if not left or time.monotonic() > deadline:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)

    def usage(self) -> dict[str, int | None]:
        if self.v1:
            mem, pids = self.dirs["memory"], self.dirs["pids"]
            return {
                "peak": _read_int(os.path.join(mem, "memory.max_usage_in_bytes")),
                "failcnt": _read_int(os.path.join(mem, "memory.failcnt")),
                "oom_kill": self._oom_events(),
                "pids_peak": _read_int(os.path.join(pids, "pids.peak")),
                "pids_max_events": None,
            }
        d = self.dirs["2"]
        return {
            "peak": _read_int(os.path.join(d, "memory.peak")),
            "failcnt": _kv(os.path.join(d, "memory.events"), "max"),
            "oom_kill": _kv(os.path.join(d, "memory.events"), "oom_kill"),
            "pids_peak": _read_int(os.path.join(d, "pids.peak")),
            "pids_max_events": _kv(os.path.join(d, "pids.events"), "max"),
        }

    def remove(self) -> None:
        if self.oom_fds is not None:
            for fd in self.oom_fds:
                os.close(fd)
            self.oom_fds = None
        deadline = time.monotonic() + 2.0
        for d in reversed(self.created):
            _rmdir_tree(d, deadline)
        self.created.clear()
