"""Red-team tests of three containment holes, each checked on the host after the attack.

* **IPC namespace per warm run.** A warm run used to share its interpreter's IPC namespace:
  SysV shared memory, message queues and semaphores and POSIX message queues made by one run
  were there for the next run on the slot (one episode could hand answers to later ones).
* **CLONE_PARENT.** A warm run is pid 2 of its pid namespace with the warm interpreter, outside
  it, as its parent, so a ``clone(CLONE_PARENT)`` child became the interpreter's child; the
  namespace's teardown waited for the interpreter to reap it while the interpreter waited for
  the teardown: the slot stalled for 30 s and the run ended as ``sandbox_error``. Nothing a
  program does may end as ``sandbox_error``: a property test composes hostile actions.
* **Core dumps.** ``RLIMIT_CORE`` 0 does not stop a piped ``core_pattern`` (the kernel ignores
  the limit for a pipe unless it is exactly 1): a crash in a box started the host's core
  handler as host root. Boxes now get 1 byte, soft and hard.
"""

from __future__ import annotations

import itertools
import os
import secrets
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agentrl import ExecResult, Limits, Sandbox, Status
from conftest import (
    DEFAULT_LIMITS,
    SESSION_MARK,
    TIME_SCALE,
    WARM_MARK,
    host_procs_of_box_uids,
    native_runner,
    wait_no_box_procs,
    why,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PATHS = ["warm", "cold"]
CORE_PATHS = [*PATHS, "nsjail"]

# A hung slot used to take 30 s (the supervisor's wait for the interpreter's report): a run
# that ends within this bound did not hang. Not a speed assertion.
HANG_S = 10.0


@pytest.fixture(scope="module")
def one() -> Iterator[Sandbox]:
    """A one-slot sandbox: consecutive warm runs are forks of the same warm interpreter."""
    with Sandbox(DEFAULT_LIMITS, env={"AGENTRL_TEST_MARK": SESSION_MARK}, max_concurrency=1) as b:
        yield b


def runner(sb: Sandbox, path: str) -> Callable[..., ExecResult]:
    return native_runner(sb, path)


def core_runner(
    request: pytest.FixtureRequest, one: Sandbox, path: str
) -> Callable[..., ExecResult]:
    """``runner``, or the nsjail backend's ``run_python`` (skipped where it cannot run)."""
    if path != "nsjail":
        return runner(one, path)
    nj = request.getfixturevalue("nj")

    def go(source: str, **kw: object) -> ExecResult:
        return nj.run_python(textwrap.dedent(source), **kw)  # type: ignore[arg-type]

    return go


def healthy(sb: Sandbox, path: str) -> None:
    """The slot's next run is ok and does not hang."""
    t = time.monotonic()
    r = runner(sb, path)("print('fine')")
    took = time.monotonic() - t
    assert r.status == Status.OK and r.stdout == b"fine\n", why(r)
    assert took < HANG_S, f"the next run took {took:.1f} s"


def assert_no_box_procs() -> None:
    left = wait_no_box_procs(3.0)
    assert not left, f"box processes survived on the host: {left}"


# ---------------------------------------------------------------------------------------------
# 1. IPC namespaces

IPC_PRELUDE = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
KEY, NAME, SECRET = {key}, {name!r}.encode(), {secret!r}
IPC_CREAT, IPC_EXCL = 0o1000, 0o2000
try:
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
except OSError:
    rt = libc
"""

IPC_WRITE = """
shm = libc.shmget(KEY, 4096, IPC_CREAT | IPC_EXCL | 0o666)
assert shm >= 0, ("shmget", ctypes.get_errno())
addr = libc.shmat(shm, None, 0)
ctypes.memmove(addr, SECRET, len(SECRET))
q = libc.msgget(KEY, IPC_CREAT | IPC_EXCL | 0o666)
assert q >= 0, ("msgget", ctypes.get_errno())
class Msg(ctypes.Structure):
    _fields_ = [("mtype", ctypes.c_long), ("text", ctypes.c_char * 64)]
m = Msg(1, SECRET)
assert libc.msgsnd(q, ctypes.byref(m), len(SECRET), 0) == 0, ("msgsnd", ctypes.get_errno())
sem = libc.semget(KEY, 1, IPC_CREAT | IPC_EXCL | 0o666)
assert sem >= 0, ("semget", ctypes.get_errno())
mqd = rt.mq_open(NAME, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666, None)
assert mqd >= 0, ("mq_open", ctypes.get_errno())
assert rt.mq_send(mqd, SECRET, len(SECRET), 0) == 0, ("mq_send", ctypes.get_errno())
print("written")
"""

IPC_READ = """
found = []
if libc.shmget(KEY, 0, 0) >= 0:
    found.append("shm")
if libc.msgget(KEY, 0) >= 0:
    found.append("msg")
if libc.semget(KEY, 0, 0) >= 0:
    found.append("sem")
if rt.mq_open(NAME, os.O_RDONLY, 0, None) >= 0:
    found.append("mq")
print("found", found)
"""


def ipc_on_host(key: int, name: str) -> list[str]:
    """What the host's IPC namespace, and each of our warm interpreters', holds of ``key`` and
    of the POSIX queue ``name``."""
    hexkey = f"0x{key:08x}"
    left = []
    namespaces: list[list[str]] = [[]]
    for pid, _uids, cmd in host_procs_of_box_uids(with_warm=True):
        if WARM_MARK in cmd:
            namespaces.append(["nsenter", f"--ipc=/proc/{pid}/ns/ipc", "--"])
    for ns in namespaces:
        try:
            listing = subprocess.run(
                [*ns, "ipcs", "-a"], capture_output=True, text=True, timeout=10, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue  # the interpreter went away meanwhile
        if hexkey in listing:
            left.append(f"{ns or 'host'}: {hexkey}")
    if os.path.ismount("/dev/mqueue") and os.path.exists(f"/dev/mqueue{name}"):
        left.append(f"/dev/mqueue{name}")
    return left


@pytest.mark.parametrize("path", PATHS)
def test_ipc_objects_do_not_outlive_their_run(one: Sandbox, path: str) -> None:
    key = secrets.randbits(30) | 1
    name = f"/agentrl-{secrets.token_hex(6)}"
    prelude = IPC_PRELUDE.format(key=key, name=name, secret=b"the answer is 42")
    run = runner(one, path)
    r = run(prelude + IPC_WRITE)
    assert r.status == Status.OK and r.stdout == b"written\n", why(r)
    r = run(prelude + IPC_READ)
    assert r.status == Status.OK and r.stdout == b"found []\n", why(r)
    # A warm run after a cold one, and the other way round, find nothing either.
    other = runner(one, "cold" if path == "warm" else "warm")
    r = other(prelude + IPC_READ)
    assert r.status == Status.OK and r.stdout == b"found []\n", why(r)
    assert ipc_on_host(key, name) == []


def test_each_warm_run_has_its_own_ipc_namespace(one: Sandbox) -> None:
    # The warm interpreter moves into a fresh namespace right after each fork, while that run
    # is alive, so each run's differs from the one before it. (Not from every earlier one: a
    # freed namespace's inode number can be given to a new one, so runs 1 and 3 may show the
    # same number; that they share no objects is test_ipc_objects_do_not_outlive_their_run's.)
    src = "import os; print(os.readlink('/proc/self/ns/ipc'))"
    seen = [one.run_python(src).stdout for _ in range(4)]
    assert all(s.startswith(b"ipc:[") for s in seen), seen
    assert all(a != b for a, b in itertools.pairwise(seen)), seen
    assert os.readlink("/proc/self/ns/ipc").encode() + b"\n" not in seen


# ---------------------------------------------------------------------------------------------
# 2. CLONE_PARENT and other hostile process games: never sandbox_error

CLONE_PARENT, CLONE_VM, CLONE_VFORK = 0x8000, 0x100, 0x4000

HOSTILE_PRELUDE = """
import ctypes, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
SYS_clone, SYS_clone3, SYS_exit_group = 56, 435, 231
def clone(flags):
    return libc.syscall(SYS_clone, flags | signal.SIGCHLD, 0, 0, 0, 0)
"""

HOSTILE = {
    # A CLONE_PARENT child that exits at once: the interpreter's (warm) or init's (cold) child.
    "clone_parent_exit": """
pid = clone(0x8000)
if pid == 0:
    os._exit(3)
""",
    # One that keeps running, and outlives the program.
    "clone_parent_sleeper": """
pid = clone(0x8000)
if pid == 0:
    time.sleep(1000)
    os._exit(0)
""",
    # A CLONE_PARENT child that makes another: both are the interpreter's children.
    "clone_parent_chain": """
pid = clone(0x8000)
if pid == 0:
    if clone(0x8000) == 0:
        time.sleep(1000)
    os._exit(0)
""",
    # vfork semantics (no shared memory) with CLONE_PARENT.
    "vfork_parent": """
pid = clone(0x8000 | 0x4000)
if pid == 0:
    os._exit(0)
""",
    # A real vfork with CLONE_PARENT: the child shares the memory and exits by a raw call.
    "vfork_vm_parent": """
pid = libc.syscall(SYS_clone, 0x8000 | 0x4000 | 0x100 | signal.SIGCHLD, 0, 0, 0, 0)
if pid == 0:
    libc.syscall(SYS_exit_group, 0)
""",
    # clone3 with CLONE_PARENT (refused with ENOSYS by the filter, so runtimes fall back).
    "clone3_parent": """
args = (ctypes.c_uint64 * 11)(0x8000, 0, 0, 0, signal.SIGCHLD, 0, 0, 0, 0, 0, 0)
pid = libc.syscall(SYS_clone3, ctypes.byref(args), ctypes.sizeof(args))
if pid == 0:
    os._exit(0)
""",
    "double_fork": """
if os.fork() == 0:
    if os.fork() == 0:
        time.sleep(1000)
    os._exit(0)
os.wait()
""",
    "setsid_child": """
if os.fork() == 0:
    os.setsid()
    time.sleep(1000)
    os._exit(0)
""",
    "kill_pid_1": """
try:
    os.kill(1, signal.SIGKILL)
except OSError:
    pass
""",
    "kill_everyone_else": """
signal.signal(signal.SIGTERM, signal.SIG_IGN)
try:
    os.kill(-1, signal.SIGTERM)
except OSError:
    pass
""",
    "close_stdout": """
sys.stdout.flush()
os.close(1)
""",
    "dup_stdout": """
sys.stdout.flush()
fd = os.dup(1)
os.dup2(2, 1)
os.dup2(fd, 1)
""",
    "exhaust_pids": """
kids = 0
for _ in range(100):
    try:
        if os.fork() == 0:
            time.sleep(1000)
            os._exit(0)
        kids += 1
    except OSError:
        break
""",
    "clone_parent_flood": """
for _ in range(200):
    if clone(0x8000) == 0:
        os._exit(0)
""",
    "exit_now": """
sys.stdout.flush()
os._exit(7)
""",
}


def compose(names: list[str]) -> str:
    parts = [HOSTILE_PRELUDE]
    for n in names:
        body = textwrap.indent(HOSTILE[n].strip(), "    ")
        parts.append(f"try:\n{body}\nexcept Exception as e:\n    print({n!r}, 'raised', e)\n")
    parts.append("print('done')\n")
    return "".join(parts)


HOSTILE_LIMITS = Limits(wall_time_s=3.0, cpu_time_s=3.0, max_pids=32, memory_bytes=256 << 20)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("flavour", ["clone_parent_exit", "clone_parent_sleeper"])
def test_clone_parent_ends_with_the_programs_verdict(one: Sandbox, path: str, flavour: str) -> None:
    run = runner(one, path)
    t = time.monotonic()
    r = run(compose([flavour]) + "print('pid', pid > 0)\n", limits=HOSTILE_LIMITS)
    took = time.monotonic() - t
    assert r.status == Status.OK, why(r)
    assert r.stdout == b"done\npid True\n", why(r)
    assert took < HANG_S, f"the run took {took:.1f} s"
    healthy(one, path)
    assert_no_box_procs()


@pytest.mark.parametrize("path", PATHS)
def test_clone_parent_flood_is_reaped_as_it_goes(one: Sandbox, path: str) -> None:
    # 100 short-lived CLONE_PARENT children under a pids limit of 32: each is reaped when it
    # ends (by the cold run's init, by the warm interpreter), so their zombies do not pile up
    # until no process can be made.
    # The times scale for slow machines (the 6.1 guest on a loaded host spent its 3 s of CPU).
    src = HOSTILE_PRELUDE + textwrap.dedent(
        f"""
        made, deadline = 0, time.monotonic() + {2.0 * TIME_SCALE}
        while made < 100 and time.monotonic() < deadline:
            pid = clone(0x8000)
            if pid == 0:
                os._exit(0)
            if pid > 0:
                made += 1
            else:
                time.sleep(0.005)  # at the pids limit: wait for the reaper
        print("made", made)
        """
    )
    limits = HOSTILE_LIMITS.replace(wall_time_s=3.0 * TIME_SCALE, cpu_time_s=3.0 * TIME_SCALE)
    r = runner(one, path)(src, limits=limits)
    assert r.status == Status.OK and r.stdout == b"made 100\n", why(r)
    healthy(one, path)
    assert_no_box_procs()


@pytest.mark.parametrize("path", PATHS)
@given(names=st.lists(st.sampled_from(sorted(HOSTILE)), min_size=1, max_size=4))
@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_hostile_process_games_never_give_sandbox_error(
    one: Sandbox, path: str, names: list[str]
) -> None:
    run = runner(one, path)
    t = time.monotonic()
    r = run(compose(names), limits=HOSTILE_LIMITS)
    took = time.monotonic() - t
    assert r.status != Status.SANDBOX_ERROR, f"{names}: {why(r)}"
    assert took < HANG_S, f"{names}: the run took {took:.1f} s"
    healthy(one, path)
    assert_no_box_procs()


# ---------------------------------------------------------------------------------------------
# 3. Core dumps and a piped core_pattern

CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")


@pytest.fixture
def piped_core_pattern(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """Sets a piped ``core_pattern`` whose handler logs the crashing thread's name (``%e``),
    restores the old pattern afterwards. Yields (a name for the crashing program to take,
    the handler's log). Crashes of other programs meanwhile (a parallel suite) log other
    names."""
    try:
        old = CORE_PATTERN.read_text()
    except OSError as e:
        pytest.skip(f"cannot read core_pattern: {e}")
    token = secrets.token_hex(4)
    d = Path("/tmp") / f"agentrl-core-{token}"
    d.mkdir(mode=0o700)
    log = d / "log"
    handler = d / "handler"
    handler.write_text(f'#!/bin/sh\necho "$1" >> {log}\ncat > /dev/null\n')
    handler.chmod(0o700)
    try:
        CORE_PATTERN.write_text(f"|{handler} %e\n")
    except OSError as e:
        pytest.skip(f"core_pattern is not writable: {e}")
    try:
        yield f"crash{token}", log
    finally:
        CORE_PATTERN.write_text(old)
        time.sleep(0.2)
        for p in (log, handler):
            p.unlink(missing_ok=True)
        d.rmdir()


def handler_saw(log: Path, name: str, wait: float = 1.0) -> bool:
    deadline = time.monotonic() + wait
    while True:
        if log.exists() and name in log.read_text():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


CRASHES = {
    "segv": ("import ctypes; ctypes.string_at(0)", 11),
    "abort": ("import os; os.abort()", 6),
    # At 0 the kernel would start a piped handler again: the program may not get there.
    "segv-after-lowering-the-limit": (
        "import ctypes, resource\n"
        "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
        "try:\n"
        "    resource.prlimit(0, resource.RLIMIT_CORE, (0, 0))\n"
        "except OSError:\n"
        "    pass\n"
        "ctypes.string_at(0)",
        11,
    ),
}


@pytest.mark.parametrize("path", CORE_PATHS)
@pytest.mark.parametrize("crash", sorted(CRASHES))
def test_a_crash_never_starts_the_hosts_core_handler(
    request: pytest.FixtureRequest,
    one: Sandbox,
    piped_core_pattern: tuple[str, Path],
    path: str,
    crash: str,
) -> None:
    name, log = piped_core_pattern
    code, sig = CRASHES[crash]
    src = (
        "import ctypes\n"
        f"ctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)  # PR_SET_NAME\n" + code + "\n"
    )
    run = core_runner(request, one, path)
    r = run(src)
    assert r.status == Status.SIGNALED and r.signal == sig, why(r)
    assert not handler_saw(log, name), "the host's core handler ran for a crash in the box"
    r = run("print('fine')")
    assert r.status == Status.OK and r.stdout == b"fine\n", why(r)


def test_the_handler_does_run_for_a_host_crash(piped_core_pattern: tuple[str, Path]) -> None:
    # The test's own check: the same crash on the host, with a core limit of 0 (the box's old
    # limit), does start the handler.
    name, log = piped_core_pattern
    subprocess.run(
        [
            "prlimit",
            "--core=0:0",
            "--",
            sys.executable,
            "-c",
            f"import ctypes; ctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0); "
            "ctypes.string_at(0)",
        ],
        check=False,
        timeout=30,
    )
    assert handler_saw(log, name, wait=5.0)


@pytest.mark.parametrize("path", CORE_PATHS)
def test_the_program_cannot_change_its_core_limit(
    request: pytest.FixtureRequest, one: Sandbox, path: str
) -> None:
    r = core_runner(request, one, path)(
        """
        import resource
        print(resource.getrlimit(resource.RLIMIT_CORE))
        lims = [(2, 2), (1, 2), (0, 0), (0, 1), (resource.RLIM_INFINITY,) * 2]
        for lim in lims:
            try:
                resource.setrlimit(resource.RLIMIT_CORE, lim)
            except (ValueError, OSError):
                pass
            try:
                resource.prlimit(0, resource.RLIMIT_CORE, lim)
            except (ValueError, OSError):
                pass
        print(resource.getrlimit(resource.RLIMIT_CORE))
        """
    )
    # A change is refused, or (setrlimit, which reads nothing back) succeeds without effect.
    assert r.status == Status.OK and r.stdout == b"(1, 1)\n(1, 1)\n", why(r)
