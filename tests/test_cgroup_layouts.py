"""Where the boxes' cgroups go on a cgroup v2 host, and that the caller's limits bind them.

These tests need a pure cgroup v2 hierarchy, which this project's own machines lack: they run
in the QEMU guests of ``.ci/guest/run``, whose init exports ``AGENTRL_GUEST_LAYOUT`` (how it
laid the cgroups out: a login session, a delegated service, a container, none). Elsewhere
they are skipped. Each one checks the cgroup tree itself after the fact, not only a verdict.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agentrl import Limits, Sandbox, SandboxError, Status
from conftest import CGROUP_ROOT as ROOT
from conftest import CGROUP_V2

LAYOUT = os.environ.get("AGENTRL_GUEST_LAYOUT")

pytestmark = [
    pytest.mark.skipif(not CGROUP_V2, reason="needs a cgroup v2 hierarchy"),
    pytest.mark.skipif(
        LAYOUT is None, reason="rearranges the host's cgroups: only in .ci/guest's guests"
    ),
]

WRITABLE = LAYOUT != "container-ro"


def own_cgroup() -> Path:
    line = next(x for x in Path("/proc/self/cgroup").read_text().splitlines() if x[:3] == "0::")
    return ROOT / line[3:].lstrip("/")


def bases() -> list[Path]:
    """Every base cgroup of this process (``agentrl-<pid>-<n>``) in the hierarchy."""
    prefix = f"agentrl-{os.getpid()}-"
    return sorted(p for p in ROOT.rglob(f"{prefix}*") if p.is_dir() and p.name.startswith(prefix))


def procs(d: Path) -> list[int]:
    return [int(x) for x in (d / "cgroup.procs").read_text().split()]


# What each layout's boxes get (see .ci/guest/README.md): the parent of the base cgroup, and
# where this process itself ends up.
EXPECTED = {
    # A login session's scope holds the shell too: nothing is moved, the user's slice is used.
    "host": ("user.slice/user-0.slice", "user.slice/user-0.slice/session-1.scope"),
    # A delegated service: its processes move into agentrl-host, the base goes beside it.
    "service": (
        "system.slice/agentrl-test.service",
        "system.slice/agentrl-test.service/agentrl-host",
    ),
    # A container's own cgroup (the namespace's root): emptied into agentrl-host.
    "container": ("", "agentrl-host"),
    # No controller delegated anywhere: the root enables them; nothing is moved.
    "none": ("", "init.scope"),
}


@pytest.mark.skipif(not WRITABLE, reason="the cgroup file system is read-only here")
def test_boxes_go_inside_the_callers_cgroup_as_the_layout_allows() -> None:
    before = own_cgroup()
    with Sandbox(warm=False) as sb:
        [base] = bases()
        parent, ours = EXPECTED[LAYOUT]
        assert base.parent == ROOT / parent, (base, before)
        assert own_cgroup() == ROOT / ours
        # The base is inside our cgroup where it was ours to rearrange, else in an ancestor.
        assert before == ROOT / ours or before == base.parent
        if own_cgroup().name == "agentrl-host":
            assert procs(base.parent) == [], "no process left beside the boxes"
        r = sb.run(["/bin/sh", "-c", "cat /proc/self/cgroup"])
        assert r.ok, r
        # A second sandbox of this process goes beside the first one.
        with Sandbox(warm=False) as other:
            assert len(bases()) == 2 and {b.parent for b in bases()} == {base.parent}
            assert other.run(["/bin/true"]).ok
    assert bases() == [], "the bases are removed on close"


@pytest.mark.skipif(not WRITABLE, reason="the cgroup file system is read-only here")
def test_a_limit_of_the_cgroup_holding_the_boxes_binds_them() -> None:
    """The operator's limit on the service's or container's cgroup holds for every box, even
    one whose own limit is higher (the boxes used to go to the root, outside it)."""
    with Sandbox(Limits(memory_bytes=4 << 30, wall_time_s=120, cpu_time_s=120)) as sb:
        [base] = bases()
        limited = base.parent
        if not (limited / "memory.max").is_file():
            pytest.skip("the boxes are in the true root cgroup here (it has no limits)")
        old = (limited / "memory.max").read_text().strip()
        try:
            (limited / "memory.max").write_text(str(256 << 20))
            limit, restore = 256 << 20, True
        except PermissionError:
            # A container's own cgroup (a cgroup namespace's root under nsdelegate): its limit
            # is the operator's, set from outside (the guest sets 2 GiB), never from inside.
            assert old != "max", "the container layout sets a memory limit"
            limit, restore = int(old), False
        try:
            r = sb.run_python(
                f"b = bytearray({limit + (256 << 20)}); b[::4096] = b'x' * len(b[::4096])"
            )
        finally:
            if restore:
                (limited / "memory.max").write_text(old)
        assert r.status is Status.MEMORY_LIMIT, r
        assert sb.run_python("print(1)").ok


@pytest.mark.skipif(WRITABLE, reason="the cgroup file system is writable here")
def test_a_read_only_cgroup_fs_is_refused_with_the_way_out() -> None:
    with pytest.raises(SandboxError) as e:
        Sandbox()
    msg = str(e.value)
    assert "read-only" in msg and "degraded=True" in msg and "deployment.md" in msg, msg
    # The documented degraded mode: rlimits instead of cgroups, said so, and it still runs.
    with Sandbox(degraded=True) as sb:
        assert sb.cgroup_version is None
        assert sb.run(["/bin/true"]).ok
