"""Cgroups of the nsjail backend, a thin layer over the Rust core's nsjail mode
(``_core.NsjailCgroups``, ``docs/design/cgroups.md``): detection, placement, the sandbox's base
cgroup(s) (v1 ``memory``, ``pids`` and ``cpuacct``, or one v2 cgroup), each run's cgroup below
them with its exact limits, counters, v1 OOM notifications, kill switch and removal, all done
as the native backend does them. What stays here is how nsjail is told about these cgroups:
its flags (:meth:`_RunCgroup.nsjail_flags`) and the ``cgroup.procs`` it joins itself
(:attr:`_RunCgroup.join_procs`)."""

from __future__ import annotations

import logging
import os

from agentrl import _core
from agentrl.errors import SandboxError
from agentrl.sandbox.limits import Limits

log = logging.getLogger("agentrl.nsjail")  # the logger name from before the move

_MEM_SLACK = 1 << 20
"""nsjail's own memory limit sits this far above the parent's, so the parent is what fires."""


class _Cgroups:
    """The sandbox's base cgroup(s) and the per-run cgroups below them."""

    def __init__(self, core: _core.NsjailCgroups) -> None:
        self.core = core
        self.version = core.version
        """``"v1"`` or ``"v2"``."""

    @classmethod
    def create(cls, parent: str | None) -> _Cgroups | None:
        """The base below ``parent`` (relative to each hierarchy's mount; None: placed as the
        native backend places its own), or None when the host has no usable hierarchy."""
        if _core.NsjailCgroups.detect() is None:
            return None
        try:
            core = _core.NsjailCgroups(None if parent is None else parent.strip("/"))
        except _core.SandboxError as e:
            raise SandboxError(f"cannot create the nsjail sandbox's cgroup: {e}") from None
        return cls(core)

    def new_run(self) -> _RunCgroup:
        return _RunCgroup(self)

    def remove(self) -> None:
        """Lets go of the base; it goes once every run's cgroup is removed too."""
        self.core.remove()


class _RunCgroup:
    """The cgroup(s) of one run (made by :meth:`setup`) and the flags that tell nsjail."""

    def __init__(self, base: _Cgroups) -> None:
        self.base = base
        self.core: _core.NsjailRunCgroup | None = None

    @property
    def v1(self) -> bool:
        return self.base.version == "v1"

    def setup(self, limits: Limits) -> None:
        """Creates the run's cgroup(s) with the exact memory and pids limits (``OSError`` when
        the host refuses)."""
        try:
            self.core = self.base.core.new_run()
            self.core.set_limits(limits.memory_bytes, limits.max_pids)
        except _core.SandboxError as e:
            raise OSError(str(e)) from None

    def _dir(self, controller: str) -> str:
        if self.core is None:
            raise RuntimeError("the run's cgroup is not set up")
        return self.core.dir(controller)

    def nsjail_flags(self, limits: Limits) -> list[str]:
        """nsjail's flags for its own cgroup below the run's (limits a little above the run's,
        so that the run's fire)."""
        mem_max = str(limits.memory_bytes + _MEM_SLACK)
        if self.v1:
            mm, pm = self.base.core.mount("memory"), self.base.core.mount("pids")
            return [
                "--cgroup_mem_max",
                mem_max,
                "--cgroup_mem_mount",
                mm,
                "--cgroup_mem_parent",
                os.path.relpath(self._dir("memory"), mm),
                "--cgroup_pids_max",
                str(limits.max_pids),
                "--cgroup_pids_mount",
                pm,
                "--cgroup_pids_parent",
                os.path.relpath(self._dir("pids"), pm),
            ]
        return [
            "--use_cgroupv2",
            "--cgroupv2_mount",
            self._dir("memory"),
            "--cgroup_mem_max",
            mem_max,
            "--cgroup_pids_max",
            str(limits.max_pids),
        ]

    @property
    def join_procs(self) -> str | None:
        """``cgroup.procs`` that nsjail itself joins before it starts (v1: for CPU time)."""
        return os.path.join(self._dir("cpuacct"), "cgroup.procs") if self.v1 else None

    def cpu_ns(self) -> int | None:
        return self.core.cpu_ns() if self.core is not None else None

    def kill(self, exclude: int) -> None:
        """SIGKILLs every process of the run but ``exclude`` (nsjail), until none is left."""
        if self.core is not None:
            self.core.kill(exclude)

    def usage(self) -> dict[str, int | None]:
        """``peak``, ``failcnt``, ``oom_kill``, ``pids_peak``, ``pids_max_events``."""
        return self.core.usage() if self.core is not None else {}

    def remove(self) -> None:
        core, self.core = self.core, None
        if core is not None:
            try:
                core.remove()
            except _core.SandboxError as e:
                log.warning("cannot remove the run's cgroup: %s", e)
