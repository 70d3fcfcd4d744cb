"""Shared fixtures and host-inspection helpers of the sandbox test suite.

Every security test checks the *host* after the run, not only the verdict: these helpers
list the processes that run under the boxes' host uids, count host processes, fds, mounts
and cgroup directories.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import agentrl
import pytest
from agentrl import ExecResult, JobFailed, Limits, Sandbox, _core
from agentrl.evaluation import Evaluator

if os.environ.get("AGENTRL_TEST_INSTALLED") == "1":
    # .ci/test: results count only for the wheel installed in the clean venv, never for the
    # source tree (an editable install, or python/ on sys.path).
    _here = Path(agentrl.__file__).resolve()
    _tree = Path(__file__).resolve().parent.parent / "python"
    _site = Path(sys.prefix).resolve()
    if _here.is_relative_to(_tree) or not _here.is_relative_to(_site):
        raise pytest.UsageError(
            f"agentrl was imported from {_here}, not from the wheel installed in {_site}"
        )
    if sys.prefix == sys.base_prefix:
        raise pytest.UsageError(f"the tests must run in the clean venv, not in {sys.prefix}")

# The native backend's box ids in this user namespace (0x5A000000 on a root host, part of the
# subordinate ids under `agentrl rootless`); the first 4096 are the slots' that tests meet.
BOX_UID_BASE = _core._host_id_ranges()[0][0]
BOX_UID_RANGE = 4096
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_V2 = (CGROUP_ROOT / "cgroup.controllers").is_file()
"""A pure cgroup v2 hierarchy is mounted (else cgroup v1, as on this project's own machines)."""


def kernel_version() -> tuple[int, int]:
    """``(major, minor)`` of the running kernel (``6.1.0-57-amd64`` gives ``(6, 1)``)."""
    major, minor = re.split(r"\D+", os.uname().release)[:2]
    return int(major), int(minor)


# The newest kernel without each cgroup feature that AGENTRL_CGROUP_HIDE can hide (the
# sandbox then acts as on that kernel: rust/sandbox/src/cgroup/detect.rs, `hidden`).
_HIDE_AS = {"memory.peak.reset": (6, 11), "memory.peak": (5, 18), "cgroup.kill": (5, 13)}


def cgroup_kernel_version() -> tuple[int, int]:
    """The kernel the sandbox's cgroup code acts as: :func:`kernel_version`, or older where
    ``AGENTRL_CGROUP_HIDE`` hides a feature (``.ci/guest-matrix`` runs the fallbacks of 5.12 to
    5.18 on 6.1 that way)."""
    hide = {h.strip() for h in os.environ.get("AGENTRL_CGROUP_HIDE", "").split(",")}
    return min([kernel_version(), *(v for h, v in _HIDE_AS.items() if h in hide)])


WARM_MARK = "_agentrl_warm"
SESSION_MARK = f"agentrl-test-{os.getpid()}-{secrets.token_hex(4)}"
"""Value of ``AGENTRL_TEST_MARK`` in the environment of every box of the session sandbox."""

TIME_SCALE = float(os.environ.get("AGENTRL_TEST_TIME_SCALE", "1"))
"""How much slower than native this machine runs programs (``.ci/guest-matrix`` sets 10 for its
emulated guests): the tests' time limits for runs that must finish, and their wall-clock
bounds, are multiplied by it."""

DEFAULT_LIMITS = Limits(
    wall_time_s=10.0 * TIME_SCALE,
    cpu_time_s=5.0 * TIME_SCALE,
    memory_bytes=256 << 20,
    max_pids=32,
    max_output_bytes=1 << 20,
    max_file_bytes=32 << 20,
    max_open_files=256,
    tmpfs_bytes=64 << 20,
)


def status_ids(pid: str | int) -> tuple[list[int], list[int]] | None:
    """Real/effective/saved/fs uids and gids of a host process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    uids: list[int] = []
    gids: list[int] = []
    for line in text.splitlines():
        if line.startswith("Uid:"):
            uids = [int(x) for x in line.split()[1:]]
        elif line.startswith("Gid:"):
            gids = [int(x) for x in line.split()[1:]]
    return uids, gids


def _in_box_range(ids: list[int]) -> bool:
    return any(BOX_UID_BASE <= i < BOX_UID_BASE + BOX_UID_RANGE for i in ids)


def host_pids() -> list[int]:
    """Every pid in the host's /proc."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def host_proc_count() -> int:
    """Host processes, less the boxes of other programs (say, the Rust tests running meanwhile)."""
    foreign = len(host_procs_of_box_uids(False, True)) - len(host_procs_of_box_uids(True, True))
    return len(host_pids()) - foreign


def _ppid_map() -> dict[int, int]:
    ppids = {}
    for pid in host_pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppids[pid] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return ppids


def my_descendants() -> set[int]:
    """Pids of every process below this test process (boxes are always below it)."""
    ppids, me, found = _ppid_map(), os.getpid(), set()
    for pid in ppids:
        seen, p = [], pid
        while p in ppids and p not in (0, 1, me) and p not in found:
            seen.append(p)
            p = ppids[p]
        if p == me or p in found:
            found.update(seen)
    return found


def has_session_marker(pid: int) -> bool:
    """Whether a host process carries this session's environment marker."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return SESSION_MARK.encode() in f.read()
    except OSError:
        return False


def host_procs_of_box_uids(
    mine_only: bool = True, with_warm: bool = False
) -> list[tuple[int, list[int], str]]:
    """Host processes whose uid or gid lies in the boxes' host id range: (pid, uids, cmdline).

    Other programs on the host (say, the Rust test suite) may run boxes with the same ids at
    the same time, so by default only the boxes of this process count: those below it in the
    process tree, or carrying this session's environment marker (in case one escaped the tree).
    The warm interpreters (one per slot, alive until ``close()``) are the sandbox's
    own and are left out unless ``with_warm``; the runs forked from them are counted, but
    for the persistent judges of open Evaluators (comm ``agentrl-judge``, alive until the
    Evaluator closes, see :func:`judge_procs`) and the idle inits of their pid namespaces.
    """
    mine = my_descendants() if mine_only else set()
    judges = {ns for _, ns in judge_procs()} if not with_warm else set()
    out = []
    for pid in host_pids():
        if judges and _pid_ns(pid) in judges:
            continue
        ids = status_ids(str(pid))
        if ids is None or not (_in_box_range(ids[0]) or _in_box_range(ids[1])):
            continue
        if mine_only and pid not in mine and not has_session_marker(pid):
            continue
        cmd = _cmdline(pid)
        if not with_warm and WARM_MARK in cmd and not _box_parent(pid):
            continue
        out.append((pid, ids[0], cmd))
    return out


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def judge_procs() -> list[tuple[int, str | None]]:
    """The host's persistent judges (see ``agentrl.evaluation._judges``): (pid, pid ns)."""
    out = []
    for pid in host_pids():
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "agentrl-judge":
                    continue
        except OSError:
            continue
        out.append((pid, _pid_ns(pid)))
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def _box_parent(pid: int) -> bool:
    """Whether the parent of ``pid`` runs under a box id too."""
    ppid = _ppid_map().get(pid)
    ids = status_ids(str(ppid)) if ppid else None
    return ids is not None and (_in_box_range(ids[0]) or _in_box_range(ids[1]))


def wait_no_box_procs(timeout: float = 2.0) -> list[tuple[int, list[int], str]]:
    """Waits (briefly) until no host process runs under a box uid; returns the survivors."""
    deadline = time.monotonic() + timeout
    left = host_procs_of_box_uids()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = host_procs_of_box_uids()
    return left


def assert_host_clean(timeout: float = 2.0) -> None:
    left = wait_no_box_procs(timeout)
    assert not left, f"box processes survived on the host: {left}"


def wait_box_started(timeout: float = 10.0, settle: float = 0.3) -> None:
    """Waits until a run of this process is alive on the host, then ``settle`` seconds more."""
    deadline = time.monotonic() + timeout
    while not host_procs_of_box_uids() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(settle)


def wait_count_at_most(count: Callable[[], int], n: int, timeout: float = 3.0) -> int:
    """Polls ``count()`` until it is at most ``n`` (or the timeout); returns the last value."""
    deadline = time.monotonic() + timeout
    value = count()
    while value > n and time.monotonic() < deadline:
        time.sleep(0.05)
        value = count()
    return value


def own_fds() -> list[int]:
    return sorted(int(x) for x in os.listdir("/proc/self/fd"))


def mount_lines() -> int:
    with open("/proc/self/mountinfo") as f:
        return len(f.read().splitlines())


def cgroup_dirs(controllers: tuple[str, ...] = ("memory", "pids", "cpuacct")) -> set[str]:
    """Every cgroup directory (recursively) of the given v1 controllers, or of v2."""
    roots = [CGROUP_ROOT / c for c in controllers if (CGROUP_ROOT / c).is_dir()]
    if not roots:
        roots = [CGROUP_ROOT]
    found: set[str] = set()
    for root in roots:
        for dirpath, _dirs, _files in os.walk(root):
            found.add(dirpath)
    return found


def agentrl_cgroup_dirs(pid: int | None = None) -> set[str]:
    """Cgroup directories of agentrl sandboxes (of process ``pid`` when given)."""
    prefix = "agentrl-" if pid is None else f"agentrl-{pid}-"
    return {d for d in cgroup_dirs() if any(p.startswith(prefix) for p in Path(d).parts)}


def tmp_entries() -> set[str]:
    return set(os.listdir("/tmp"))


def py(sb: Sandbox, source: str, **kw: object) -> ExecResult:
    """Runs dedented Python source in the box."""
    return sb.run_python(textwrap.dedent(source), **kw)  # type: ignore[arg-type]


def out(r: ExecResult) -> str:
    """stdout as text, with the verdict and stderr for assertion messages."""
    return r.stdout.decode(errors="replace")


def why(r: ExecResult) -> str:
    return f"{r.summary()}\nstdout={r.stdout[-2000:]!r}\nstderr={r.stderr[-2000:]!r}"


@pytest.fixture(scope="session")
def sb() -> Iterator[Sandbox]:
    with Sandbox(DEFAULT_LIMITS, env={"AGENTRL_TEST_MARK": SESSION_MARK}, max_concurrency=4) as box:
        yield box


@pytest.fixture(scope="session")
def nj() -> Iterator[Sandbox]:
    """The nsjail backend's sandbox (skipped, with the reason, where nsjail cannot be found or
    installed, or without root)."""
    from agentrl.backends.nsjail import NsjailSandbox
    from nsjail_support import nsjail_unavailable

    reason = nsjail_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with NsjailSandbox(
        DEFAULT_LIMITS, env={"AGENTRL_TEST_MARK": SESSION_MARK}, max_concurrency=4
    ) as box:
        yield box


@pytest.fixture(params=["native", "nsjail"])
def box(request: pytest.FixtureRequest, sb: Sandbox) -> Sandbox:
    """The native sandbox and the nsjail backend's, in turn."""
    return sb if request.param == "native" else request.getfixturevalue("nj")


def sh_in_box(sb: Sandbox, path: str, script: str, **kw: object) -> ExecResult:
    """Runs a shell script in a box of ``sb`` by ``path``: directly (``cold``), or from
    ``run_python`` through ``subprocess`` (``warm``), with the script's exit code as the
    run's."""
    if path == "cold":
        return sb.run(["/bin/sh", "-c", script], **kw)  # type: ignore[arg-type]
    src = (
        "import subprocess, sys\n"
        f"sys.exit(subprocess.run(['/bin/sh', '-c', {script!r}]).returncode)\n"
    )
    return sb.run_python(src, **kw)  # type: ignore[arg-type]


def native_runner(sb: Sandbox, path: str) -> Callable[..., ExecResult]:
    """Runs dedented Python source in a box of ``sb`` by ``path``: ``warm`` is
    ``run_python`` (a fork of the slot's warm interpreter), ``cold`` a fresh interpreter. The
    function's ``path`` attribute names it."""

    def go(source: str, **kw: object) -> ExecResult:
        source = textwrap.dedent(source)
        if path == "warm":
            return sb.run_python(source, **kw)  # type: ignore[arg-type]
        files = {**(kw.pop("files", None) or {}), "__main__.py": source}  # type: ignore[dict-item]
        return sb.run([sb.python, "-I", "__main__.py"], files=files, **kw)  # type: ignore[arg-type]

    go.path = path  # type: ignore[attr-defined]
    return go


@pytest.fixture(params=["warm", "cold", "nsjail"])
def run_py(request: pytest.FixtureRequest, sb: Sandbox) -> Callable[..., ExecResult]:
    """Runs dedented Python source once per path: the native backend's ``warm`` path
    (``run_python``, a fork of the slot's warm interpreter) and ``cold`` path (a fresh
    interpreter), and ``nsjail``, the nsjail backend's ``run_python``. The function's ``path``
    attribute names the path."""
    if request.param != "nsjail":
        return native_runner(sb, request.param)
    nj = request.getfixturevalue("nj")

    def go(source: str, **kw: object) -> ExecResult:
        return nj.run_python(textwrap.dedent(source), **kw)  # type: ignore[arg-type]

    go.path = "nsjail"  # type: ignore[attr-defined]
    return go


def is_nsjail(how: object) -> bool:
    """Whether a ``run_py`` or a ``box`` is the nsjail backend's."""
    from agentrl.backends.nsjail import NsjailSandbox

    return isinstance(how, NsjailSandbox) or getattr(how, "path", None) == "nsjail"


@pytest.fixture
def clean_host() -> Iterator[None]:
    """Asserts that no box process is alive before and after the test."""
    assert_host_clean()
    yield
    assert_host_clean()


@pytest.fixture(params=["/var/tmp", "/root"])
def host_secret_file(request: pytest.FixtureRequest) -> Iterator[tuple[Path, str]]:
    """A host file with random name and content, in /var/tmp or /root (removed afterwards)."""
    token = secrets.token_hex(16)
    path = Path(request.param) / f"agentrl-secret-{token[:12]}"
    path.write_text(f"SECRET-{token}\n")
    try:
        yield path, token
    finally:
        path.unlink(missing_ok=True)


@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    """A host TCP listener on 127.0.0.1 (never accepted by the tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        s.setblocking(False)
        yield s


class FlakyEvaluator(Evaluator):
    """Fault injection: the runs of tasks whose id starts with "flaky" end as if the sandbox
    had given up on them (a persistent judge that gave no verdict, or a pool job that ended
    as JobFailed), through the evaluator's own masking paths."""

    def _serve(self, task: Any, message: bytes, source: str, limits: Any) -> Any:
        if task.task_id.startswith("flaky"):
            return None, None, "sandbox job failed: injected, the sandbox kept failing"
        return super()._serve(task, message, source, limits)

    def _finish(self, task: Any, outcomes: list[Any], nonce: str) -> Any:
        if task.task_id.startswith("flaky"):
            outcomes = [JobFailed("injected: the sandbox kept failing") for _ in outcomes]
        return super()._finish(task, outcomes, nonce)
