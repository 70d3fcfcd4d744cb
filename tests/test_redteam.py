"""Red-team corpus: hostile programs run in the box, and the host checked afterwards.

Every test runs against each way a program can run: ``run_py`` tests through the native
backend's warm path (``run_python``, a fork of the slot's warm interpreter), its cold path
(a fresh interpreter: ``run([python, ...])``) and the nsjail backend (``nsjail``); ``box``
tests through the native and the nsjail backends. The nsjail path is skipped, with the reason,
where nsjail cannot be found or installed, or without root. Where the nsjail backend differs
from the native one by design, the test says so: no names in ``denied_syscalls``, x32 calls get
``ENOSYS`` instead of a kill, ``/work`` is not size-limited by ``tmpfs_bytes``.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agentrl import ExecResult, Sandbox, Status
from conftest import (
    BOX_UID_BASE,
    BOX_UID_RANGE,
    CGROUP_V2,
    DEFAULT_LIMITS,
    TIME_SCALE,
    assert_host_clean,
    host_proc_count,
    host_procs_of_box_uids,
    is_nsjail,
    out,
    py,
    wait_count_at_most,
    why,
)
from hostile import (
    CPU_PROCESSES,
    CPU_THREADS,
    CTYPES_PRELUDE,
    FORK_UNTIL_EAGAIN,
    IDENTITY,
    INOTIFY_HOG,
    INOTIFY_PROBE,
    LEAVE_BEHIND,
    LOOK_BEHIND,
    MEMORY_BOMBS,
    MEMORY_SCAN,
    PROBER,
    SETUID_CMDS,
    SYSCALLS,
    UNDYING,
    listener_source,
)
from nsjail_support import (
    NSJAIL_BOX_IDS,
    assert_no_nsjail_box_left,
    nsjail_box_procs,
)

pytestmark = pytest.mark.usefixtures("clean_host")

SHORT = DEFAULT_LIMITS.replace(wall_time_s=1.5 * TIME_SCALE)
NATIVE_BOX_IDS = range(BOX_UID_BASE, BOX_UID_BASE + BOX_UID_RANGE)


# --- host checks of both backends ---------------------------------------------------------


def assert_clean(timeout: float = 2.0) -> None:
    """No process of a box of either backend is left on the host."""
    assert_host_clean(timeout)
    assert_no_nsjail_box_left(timeout)


@pytest.fixture
def clean_host() -> Iterator[None]:
    assert_clean()
    yield
    assert_clean()


def sha(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# --- resource exhaustion --------------------------------------------------------------------


def test_fork_bomb_is_contained(run_py):
    baseline, peak, stop = host_proc_count(), [0], threading.Event()
    procs = nsjail_box_procs if is_nsjail(run_py) else host_procs_of_box_uids

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], len(procs()))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    src = "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"
    try:
        r = run_py(src, limits=SHORT.replace(max_pids=16, wall_time_s=2.0 * TIME_SCALE))
    finally:
        stop.set()
        sampler.join()
    assert r.status is Status.TIMEOUT and r.limit == "wall_time", why(r)
    assert r.wall_time_s < 5 * TIME_SCALE, why(r)
    assert 0 < peak[0] <= 16, f"{peak[0]} box processes alive at once with max_pids=16"
    assert_clean()
    # Other programs may run on the host meanwhile: a small tolerance for their processes.
    assert wait_count_at_most(host_proc_count, baseline + 30) <= baseline + 30


def test_fork_until_eagain_stops_at_max_pids(box):
    r = py(box, FORK_UNTIL_EAGAIN, limits=SHORT.replace(max_pids=10))
    n, err = out(r).split()
    most = 8 if is_nsjail(box) else 9
    assert int(n) <= most and int(err) == errno.EAGAIN and r.limit == "pids", why(r)


@pytest.mark.parametrize("kind", sorted(MEMORY_BOMBS))
def test_memory_bomb(run_py, kind):
    # The wall limit is only a backstop (the memory limit ends the run long before); it scales
    # for slow machines (an emulated guest on a loaded host took 5 s to reach the limit).
    lim = SHORT.replace(wall_time_s=5.0 * TIME_SCALE, memory_bytes=128 << 20, tmpfs_bytes=512 << 20)
    r = run_py(MEMORY_BOMBS[kind], limits=lim.replace(max_file_bytes=1 << 30))
    if kind == "tmpfs":  # tmpfs pages count against the memory limit: killed or write fails
        assert b"wrote" not in r.stdout, why(r)
        assert r.status in (Status.MEMORY_LIMIT, Status.RUNTIME_ERROR), why(r)
    else:
        assert r.status is Status.MEMORY_LIMIT and r.limit == "memory", why(r)
    if is_nsjail(run_py):  # read from the run's own cgroup, which outlives the run
        assert r.peak_memory_bytes is not None
    # cgroup v2 lets a task that is being OOM-killed charge past memory.max while it exits (the
    # kernel forces the charges of dying tasks), so its peak may pass the limit by a few MiB.
    slack = (8 << 20) if CGROUP_V2 else (1 << 20)
    assert r.peak_memory_bytes is None or r.peak_memory_bytes <= (128 << 20) + slack, why(r)


def test_oom_killed_child_is_a_memory_limit(run_py):
    # An OOM kill anywhere in the run decides the verdict, even when the program itself
    # survives and exits 0.
    src = """
    import subprocess, sys
    r = subprocess.run([sys.executable, "-c", "b = b'x' * (400 << 20)"])
    print("child", r.returncode)
    """
    r = run_py(src, limits=SHORT.replace(memory_bytes=128 << 20, wall_time_s=5.0 * TIME_SCALE))
    assert r.status is Status.MEMORY_LIMIT and r.limit == "memory", why(r)
    assert r.exit_code == 0 and r.stdout == b"child -9\n", why(r)


def test_cpu_spin_threads_counted_together(box):
    # Two threads hash (hashlib releases the GIL); the main thread only waits, so if only it
    # were counted the wall clock would fire instead.
    # The overshoot past 0.5 s is the limit's reaction time, which a slow guest stretches.
    r = py(box, CPU_THREADS, limits=SHORT.replace(cpu_time_s=0.5, wall_time_s=5.0 * TIME_SCALE))
    assert r.status is Status.TIMEOUT and r.limit == "cpu_time", why(r)
    assert 0.5 <= r.cpu_time_s < 0.5 + 2.0 * TIME_SCALE, why(r)
    assert r.wall_time_s < 4.0 * TIME_SCALE, why(r)


def test_cpu_spread_over_processes_counted_together(box):
    # Four children burn 0.4 s each: no single process passes 1 s, the run does.
    r = py(box, CPU_PROCESSES, limits=SHORT.replace(cpu_time_s=1.0, wall_time_s=8.0))
    assert r.status is Status.TIMEOUT and r.limit == "cpu_time", why(r)
    assert b"all done" not in r.stdout


@pytest.mark.parametrize("kind", sorted(UNDYING))
def test_wall_clock_kills_everything(run_py, kind):
    r = run_py(UNDYING[kind], limits=SHORT.replace(wall_time_s=1.0))
    assert r.status is Status.TIMEOUT and r.limit == "wall_time", why(r)
    assert 1.0 <= r.wall_time_s < 3.0, why(r)
    assert_clean(timeout=0.5)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize("endless", [False, True], ids=["50MiB", "endless"])
def test_output_flood_is_capped(box, stream, endless):
    cap, loop = 64 << 10, "while True" if endless else "for _ in range(800)"
    t0 = time.monotonic()
    src = f"import sys\n{loop}:\n    sys.{stream}.buffer.write(b'A' * 65521)"
    r = py(box, src, limits=SHORT.replace(max_output_bytes=cap, wall_time_s=4.0 * TIME_SCALE))
    elapsed, data = time.monotonic() - t0, getattr(r, stream)
    assert len(data) == cap and data == b"A" * cap and getattr(r, f"{stream}_truncated")
    assert r.status is Status.OUTPUT_LIMIT and r.limit == "output", why(r)
    assert elapsed < 2.0 * TIME_SCALE, f"flood ran {elapsed:.1f}s after passing the output cap"


def test_filling_tmpfs_gets_enospc_and_nothing_reaches_host(box):
    name = f"agentrl-fill-{os.urandom(6).hex()}"
    # nsjail's /work is a bind of a host directory, not a tmpfs of tmpfs_bytes.
    dirs = ("/tmp", "/dev/shm") if is_nsjail(box) else ("/work", "/tmp", "/dev/shm")
    src = f"""
    import errno
    res = {{}}
    for d in {dirs!r}:
        try:
            with open(f"{{d}}/{name}", "wb") as f:
                for _ in range(64): f.write(b"z" * (1 << 20)); f.flush()
            res[d] = "no error"
        except OSError as e:
            res[d] = errno.errorcode[e.errno]
    print(res)
    """
    r = py(box, src, limits=SHORT.replace(tmpfs_bytes=8 << 20, max_file_bytes=256 << 20))
    assert r.ok and out(r).count("ENOSPC") == len(dirs), why(r)
    for d in ("/tmp", "/var/tmp", "/root", "/dev/shm", os.getcwd()):
        assert not os.path.exists(os.path.join(d, name))


def test_fd_exhaustion_and_rlimits_cannot_be_raised(box):
    src = """
    import os, resource
    fds = []
    try:
        while True: fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        print("fds", len(fds) + 3, e.errno)
    for name in ("NOFILE", "CPU", "FSIZE", "CORE", "MEMLOCK", "NPROC", "MSGQUEUE"):
        lim = getattr(resource, "RLIMIT_" + name)
        old = resource.getrlimit(lim)
        try: resource.setrlimit(lim, (-1, -1))
        except (ValueError, OSError): pass
        if resource.getrlimit(lim) != old: print("raised", name, old)
    """
    r = py(box, src, limits=SHORT.replace(max_open_files=64))
    assert r.ok and out(r).split()[:3] == ["fds", "64", str(errno.EMFILE)], why(r)
    assert "raised" not in out(r), why(r)


def test_unread_huge_stdin_does_not_hang(box):
    t0 = time.monotonic()
    lim = SHORT.replace(wall_time_s=5.0 * TIME_SCALE)
    r = py(box, "print('bye')", stdin=b"q" * (16 << 20), limits=lim)
    assert r.ok and r.stdout == b"bye\n" and time.monotonic() - t0 < 3.0 * TIME_SCALE, why(r)


# --- host files -----------------------------------------------------------------------------

READ_PATHS = ["/etc/shadow", "{s}", "/proc/1/root{s}", "/proc/1/root/etc/shadow"]
READ_PATHS += ["/proc/self/root/../../..{s}", "/work/../../..{s}", "/proc/1/cwd/../..{s}"]


@pytest.mark.parametrize("template", READ_PATHS)
def test_reading_host_files_fails(run_py, host_secret_file, template):
    path, token = host_secret_file
    src = f"""
    import os
    try:
        with open({template.format(s=path)!r}, "rb") as f: print("READ", f.read())
    except OSError as e:
        print("DENIED", e.errno)
    hits = []
    for top in ("/var", "/root", "/home", "/tmp", "/work", "/run", "/mnt", "/etc"):
        for d, dirs, files in os.walk(top):
            # Not into the interpreter's own installation (bound read-only where it lives, e.g.
            # pyenv's under /root): tens of thousands of files that hold no secret of the test,
            # and a walk of them with cold caches took past the wall limit in CI.
            dirs[:] = [x for x in dirs if os.path.join(d, x) not in {sorted(_INTERPRETER_PATHS)!r}]
            hits += [os.path.join(d, f) for f in files if {token[:12]!r} in f]
    print("HITS", hits)
    """
    r = run_py(src)
    assert r.ok and token.encode() not in r.stdout, why(r)
    assert b"DENIED" in r.stdout and b"HITS []" in r.stdout, why(r)
    assert Path("/etc/shadow").read_bytes()[:20] not in r.stdout


@pytest.mark.parametrize(
    "target", ["/usr/{n}", "/etc/{n}", "/root/{n}", "{p}/{n}", "/bin/{n}", "/{n}", "/.run/{n}"]
)
def test_writing_host_paths_fails(run_py, target):
    path = target.format(n=f"agentrl-w-{os.urandom(6).hex()}", p=sys.prefix)
    src = f"""
    try:
        with open({path!r}, "w") as f: f.write("pwned")
        print("WROTE")
    except OSError as e:
        print("DENIED", e.errno)
    """
    r = run_py(src)
    assert r.ok and out(r).startswith("DENIED"), why(r)
    assert not os.path.exists(path)


def test_host_tmp_and_existing_files_unchanged(box):
    name = f"agentrl-t-{os.urandom(6).hex()}"
    victims = [os.path.realpath(sys.executable), "/usr/bin/env", "/bin/sh", "/etc/passwd"]
    before = {v: (sha(v), os.stat(v).st_mtime_ns, os.stat(v).st_mode) for v in victims}
    src = f"""
    import os
    with open("/tmp/{name}", "w") as f: f.write("box-local")
    print("tmp ok")
    for v in {victims!r}:
        for op in (lambda: open(v, "r+b").write(b"X"), lambda: os.chmod(v, 0o777),
                   lambda: os.truncate(v, 0), lambda: os.unlink(v), lambda: os.utime(v, (0, 0))):
            try: op(); print("MODIFIED", v)
            except OSError: pass
    """
    r = py(box, src)
    assert r.ok and b"tmp ok" in r.stdout and b"MODIFIED" not in r.stdout, why(r)
    assert not os.path.exists(f"/tmp/{name}")
    assert before == {v: (sha(v), os.stat(v).st_mtime_ns, os.stat(v).st_mode) for v in victims}


def test_symlinks_fifos_and_dirs_are_not_collected(box, host_secret_file):
    secret, token = host_secret_file
    src = f"""
    import os
    os.symlink("/etc/passwd", "out"); os.symlink("/proc/1/root/etc/shadow", "link")
    os.symlink({str(secret)!r}, "secret"); os.symlink("/etc", "etcdir")
    os.mkfifo("fifo"); os.mkdir("adir"); os.symlink("adir", "dirlink")
    with open("adir/inner", "w") as f: f.write("inner")
    with open("good.txt", "w") as f: f.write("fine")
    """
    names = ["out", "link", "secret", "etcdir/passwd", "fifo", "adir", "dirlink/inner", "good.txt"]
    t0 = time.monotonic()
    r = py(box, src, collect=[*names, "adir/inner"])
    assert r.ok and r.files == {"good.txt": b"fine", "adir/inner": b"inner"}, why(r)
    assert time.monotonic() - t0 < 5.0 * TIME_SCALE and token.encode() not in r.files["good.txt"]


# --- network and other processes ------------------------------------------------------------


def test_host_loopback_unreachable_and_raw_sockets_refused(run_py, tcp_listener):
    # IP sockets work in the box's private network namespace (only lo), so the host's
    # loopback listener is another namespace's: refused. Raw and other netlink sockets are
    # refused by the policy.
    port = tcp_listener.getsockname()[1]
    src = f"""
    import socket as S
    for fam, typ, proto, addr in ((S.AF_INET, S.SOCK_STREAM, 0, ("127.0.0.1", {port})),
                                  (S.AF_INET6, S.SOCK_STREAM, 0, ("::1", {port})),
                                  (S.AF_NETLINK, S.SOCK_RAW, 12, None),  # NETLINK_NETFILTER
                                  (S.AF_PACKET, S.SOCK_RAW, 0, None)):
        try:
            with S.socket(fam, typ, proto) as s:
                s.settimeout(1)
                if addr: s.connect(addr)
            print("CONNECTED", fam)
        except OSError as e:
            print("ERR", e.errno)
    """
    r = run_py(src)
    refused = [str(errno.ECONNREFUSED)] * 2 + [str(errno.EPROTONOSUPPORT), str(errno.EAFNOSUPPORT)]
    assert r.ok and out(r).split() == [w for e in refused for w in ("ERR", e)], why(r)
    # nsjail cannot say which call was refused.
    assert r.denied_syscalls == () if is_nsjail(run_py) else "socket" in r.denied_syscalls
    assert not select.select([tcp_listener], [], [], 0.2)[0], "the host listener got a connection"


def test_net_namespace_has_only_loopback(box):
    r = py(box, "print(open('/proc/net/dev').read())")
    ifaces = [ln.split(":")[0].strip() for ln in out(r).splitlines()[2:] if ":" in ln]
    assert r.ok and ifaces == ["lo"], why(r)


def test_host_unix_sockets_unreachable(box):
    tag = os.urandom(6).hex()
    path, abstract = f"/tmp/agentrl-host-{tag}.sock", f"\0agentrl-host-{tag}"
    src = f"""
    import socket
    for addr in ({path!r}, {abstract!r}):
        try:
            with socket.socket(socket.AF_UNIX) as c: c.connect(addr)
            print("CONNECTED")
        except OSError as e:
            print("ERR", e.errno)
    """
    with socket.socket(socket.AF_UNIX) as s1, socket.socket(socket.AF_UNIX) as s2:
        s1.bind(path)
        s2.bind(abstract)
        s1.listen(4)
        s2.listen(4)
        try:
            r = py(box, src)
        finally:
            os.unlink(path)
        assert r.ok and b"CONNECTED" not in r.stdout, why(r)
        assert select.select([s1, s2], [], [], 0.2)[0] == []


def test_killing_host_processes_fails(box):
    with subprocess.Popen(["sleep", "60"]) as victim:
        src = f"""
        import os, signal
        for pid in ({victim.pid}, {os.getpid()}, {os.getppid()}):
            try: os.kill(pid, signal.SIGKILL); print("KILLED", pid)
            except OSError as e: print("ERR", e.errno)
        os.kill(-1, signal.SIGKILL)
        """
        try:
            r = py(box, src)
            time.sleep(0.2)
            assert victim.poll() is None, "the host process was killed from the box"
        finally:
            victim.kill()
    assert b"KILLED" not in r.stdout, why(r)


def while_running(
    box: Sandbox, source: str, probe: Callable[[], ExecResult]
) -> tuple[ExecResult, ExecResult]:
    """Runs ``source`` in ``box`` and ``probe()`` while it is alive: the run gets a pipe to stop
    on as fd 3 and one to say it is ready on as fd 4, so the two overlap however slowly a box
    starts. Returns both verdicts."""
    results: dict[str, ExecResult] = {}
    done_r, done_w = os.pipe()
    ready_r, ready_w = os.pipe()
    run = threading.Thread(
        target=lambda: results.update(a=py(box, source, pass_fds=(done_r, ready_w))), daemon=True
    )
    try:
        run.start()
        heard = select.select([ready_r], [], [], 60 * TIME_SCALE)[0]
        assert heard and os.read(ready_r, 1) == b"r", "the first run never said it was ready"
        b = probe()
    finally:
        os.write(done_w, b"x")
        run.join(30 * TIME_SCALE)
        for fd in (done_r, done_w, ready_r, ready_w):
            os.close(fd)
    return results["a"], b


def test_two_live_boxes_cannot_reach_each_other(sb):
    # The listener says "ready" on a pipe and listens until the prober is done, so the two runs
    # overlap however slowly a box starts (no time window).
    key = str(int.from_bytes(os.urandom(3), "big") + 1)
    a, b = while_running(
        sb, listener_source(key, channel=True), lambda: py(sb, PROBER.replace("KEY", key))
    )
    assert a.ok and b.ok, why(a) + why(b)
    words, res = out(a).split(), json.loads(b.stdout)
    assert int(words[2]) >= 0 and float(words[1]) < res["t"] < float(words[-1]), "not concurrent"
    assert res["connect"] == errno.ECONNREFUSED and res["files"] == [] and res["shm"] == -1, res
    # Only the box's init (pid 1) and the program itself (pid 2).
    assert res["pids"] == ["1", "2"] and "accepted 0" in out(a), res


def test_two_sandboxes_do_not_share_host_identity(sb):
    # Boxes of two sandboxes alive at once must not share a host uid: per-user kernel limits
    # (inotify instances, pipe pages, message queues, ...) would let one starve the other.
    with Sandbox(DEFAULT_LIMITS) as other:
        a, b = while_running(other, INOTIFY_HOG, lambda: py(sb, INOTIFY_PROBE))
    assert a.ok and b.ok, why(a) + why(b)
    (map_a, n, ready), end = json.loads(a.stdout.splitlines()[0]), float(out(a).split()[-1])
    map_b, fd, err, t = json.loads(b.stdout)
    assert n > 0 and ready < t < end, "the two boxes were not alive together"
    assert map_a[1] != map_b[1], f"both boxes run as host uid {int(map_a[1]):#x}"
    assert fd >= 0, f"inotify_init failed with errno {err} after another sandbox's box hogged it"


def test_warm_run_memory_holds_no_earlier_run_secrets():
    # A warm run is a fork of the slot's interpreter: what an earlier run was handed (here its
    # environment) must not be readable in the memory of a later one.
    leaked = []
    with Sandbox(DEFAULT_LIMITS, max_concurrency=1) as box:
        for n in (52, 60):
            tok = "".join(secrets.choice("QXZJ") for _ in range(n))
            first = box.run_python("pass", env={"AGENTRL_SECRET": tok})
            r = box.run_python(MEMORY_SCAN)
            assert first.ok and r.ok, why(first) + why(r)
            leaked += [f for f in out(r).split() if f in tok]
    assert not leaked, f"a later run read an earlier run's environment: {leaked}"


def test_host_sysv_shm_invisible(box):
    libc = ctypes.CDLL(None, use_errno=True)
    key = int.from_bytes(os.urandom(3), "big") + 1
    shmid = libc.shmget(key, 4096, 0o1000 | 0o600)
    assert shmid >= 0
    try:
        r = py(box, f"import ctypes\nprint(ctypes.CDLL(None).shmget({key}, 0, 0))")
        assert r.ok and r.stdout == b"-1\n", why(r)
    finally:
        libc.shmctl(shmid, 0, None)  # IPC_RMID


def test_host_processes_invisible(run_py):
    src = f"""
    import os
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    print(len(pids), os.path.exists("/proc/{os.getpid()}/environ"), os.getpid(), os.getppid())
    """
    r = run_py(src)
    n, seen, pid, ppid = out(r).split()
    # The box's init (pid 1) and the program (pid 2). A cold run's program is the init's
    # child; a warm run's is the warm interpreter's, outside the namespace, so its parent
    # pid reads 0 (as for a process that `docker exec` started).
    expected_ppid = "0" if run_py.path == "warm" else "1"
    assert r.ok and int(n) == 2 and pid == "2" and ppid == expected_ppid, why(r)
    assert seen == "False" or os.getpid() < 5


# --- seccomp --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SYSCALLS))
def test_denied_syscall(run_py, name):
    src = f"r, e = {SYSCALLS[name]}\nif r == 0 and {name!r} == 'clone': os._exit(0)\n"
    r = run_py(CTYPES_PRELUDE + src + "print(json.dumps([r, e]))")
    assert r.ok and json.loads(r.stdout) == [-1, errno.EPERM], why(r)
    assert r.denied_syscalls == () if is_nsjail(run_py) else name in r.denied_syscalls, why(r)


def test_refused_ioctl_not_bypassed_by_high_bits(run_py):
    # The kernel reads ioctl's request, socket's domain and personality's persona as 32-bit
    # values: a filter that compared all 64 bits would let these through.
    src = 'print(json.dumps([sc(16, 0, 0x100005412, ctypes.byref(ctypes.c_char(b"x"))),'
    src += " sc(16, 0, 0x1_0000541C, 0), sc(41, 0x1_00000011, 3, 0), sc(135, 0x1_00000008)]))"
    r = run_py(CTYPES_PRELUDE + src)
    eperm, eaf = [-1, errno.EPERM], [-1, errno.EAFNOSUPPORT]
    assert r.ok and json.loads(r.stdout) == [eperm, eperm, eaf, eperm], why(r)


def test_clone3_unknown_and_x32_syscalls(run_py):
    src = """
args = (ctypes.c_uint64 * 11)(0x10000000)  # clone3 with CLONE_NEWUSER
print(json.dumps([sc(435, ctypes.byref(args), 88), sc(999)]), flush=True)
print(json.dumps(sc(0x40000000 | 39)))  # x32 getpid: the native filter kills the process
"""
    r = run_py(CTYPES_PRELUDE + src)
    lines = r.stdout.splitlines()
    clone3, unknown = json.loads(lines[0])
    assert clone3 == [-1, errno.ENOSYS] and unknown == [-1, errno.ENOSYS], why(r)
    if is_nsjail(run_py):  # Kafel's default catches x32 numbers: refused, not killed
        assert r.ok and json.loads(lines[1]) == [-1, errno.ENOSYS], why(r)
    else:
        assert r.status is Status.SIGNALED and r.signal == signal.SIGSYS, why(r)
        assert len(lines) == 1, why(r)


def test_int80_32bit_syscall_is_killed(box):
    src = """
    import ctypes, mmap
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(bytes.fromhex("b814000000cd80c3"))  # mov eax, 20 (getpid); int 0x80; ret
    fn = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
    print("int80 returned", fn(), flush=True)
    """
    r = py(box, src)
    assert r.status is Status.SIGNALED and r.signal in (signal.SIGSYS, signal.SIGSEGV), why(r)
    assert b"returned" not in r.stdout


def test_ordinary_programs_work_under_the_policy(run_py):
    src = """
    import asyncio, json, mmap, os, select, socket, subprocess, threading, time
    import multiprocessing as mp
    t = threading.Thread(target=time.sleep, args=(0.01,)); t.start(); t.join()
    assert subprocess.run(["/bin/sh", "-c", "exit 3"]).returncode == 3
    a, b = socket.socketpair(); a.sendall(b"x"); assert b.recv(1) == b"x"
    async def main():
        p = await asyncio.create_subprocess_exec("true"); assert await p.wait() == 0
    asyncio.run(main())
    with mp.get_context("fork").Pool(2) as pool:
        assert pool.map(abs, [-1, -2]) == [1, 2]
    select.select([], [], [], 0); ep = select.epoll(); ep.close()
    m = mmap.mmap(-1, 1 << 20); m[0] = 1; m.close()
    os.sched_getaffinity(0); os.urandom(8)
    print("fine")
    """
    r = run_py(src)
    assert r.ok and r.stdout == b"fine\n", why(r)


def test_chroot_escape_fails(run_py):
    src = """
    import os
    os.makedirs("jail", exist_ok=True)
    try: os.chroot("jail"); print("CHROOTED")
    except OSError as e: print("ERR", e.errno)
    for _ in range(64): os.chdir("..")
    print(sorted(os.listdir(".")))
    """
    r = run_py(src)
    assert r.ok and out(r).startswith(f"ERR {errno.EPERM}"), why(r)
    assert is_nsjail(run_py) or "chroot" in r.denied_syscalls
    top = out(r).splitlines()[1]  # the box's own root, nothing of the host
    # /sys is the box's own (tests/test_box_view.py): its cgroups, nothing of the host.
    assert "'work'" in top and not any(f"'{d}'" in top for d in ("boot", "var")), top


# --- kernel interfaces, identity, environment -----------------------------------------------


def test_proc_sys_writes_fail_and_host_unchanged(run_py):
    keys = ["kernel/hostname", "kernel/core_pattern", "kernel/pid_max"]
    before = {k: Path(f"/proc/sys/{k}").read_text() for k in keys}
    # Foreign values where harmless, the host's own value where a success would matter.
    writes = {**before, "kernel/hostname": "pwned\n", "vm/drop_caches": "3\n"}
    src = f"""
    import json
    res = {{}}
    for k, v in {writes!r}.items():
        try:
            with open("/proc/sys/" + k, "w") as f: f.write(v)
            res[k] = "WROTE"
        except OSError as e:
            res[k] = e.errno
    mi = [ln.split() for ln in open("/proc/self/mountinfo")]
    res["ro"] = [m[5].split(",")[0] for m in mi if m[4] == "/proc/sys"]
    print(json.dumps(res))
    """
    r = run_py(src)
    res = json.loads(r.stdout)
    ro = res.pop("ro")  # nsjail mounts /proc/sys with the rest of /proc read-only
    assert r.ok and (is_nsjail(run_py) or ro == ["ro"]), why(r)
    assert all(v in (errno.EROFS, errno.EACCES, errno.EPERM) for v in res.values()), res
    assert before == {k: Path(f"/proc/sys/{k}").read_text() for k in keys}


def test_identity_caps_and_hostname(run_py):
    r = run_py(IDENTITY + "print(json.dumps(open('/proc/self/uid_map').read().split()))")
    res, uid_map = (json.loads(line) for line in r.stdout.splitlines())
    assert r.ok and res["ids"] == [[1000] * 3, [1000] * 3, []], why(r)
    assert res["caps"] == ["0000000000000000"] * 5
    assert res["nnp"] == "1" and res["seccomp"] == "2"
    assert res["host"] == ["sandbox"] * 3 and socket.gethostname() != "sandbox"
    # Every id of the box's user namespace (the box user 1000, and the native backend's root
    # of the box) is one unprivileged host id of the backend's range, never host root.
    host_ids = NSJAIL_BOX_IDS if is_nsjail(run_py) else NATIVE_BOX_IDS
    triples = [uid_map[i : i + 3] for i in range(0, len(uid_map), 3)]
    assert any(inside == "1000" for inside, _, _ in triples), uid_map
    assert all(int(host) in host_ids and n == "1" for _, host, n in triples), uid_map


def test_setuid_binaries_gain_nothing(box):
    before = {p: sha(p) for p in ("/etc/passwd", "/etc/group", "/etc/shadow") if os.path.exists(p)}
    src = f"""
    import json, os, subprocess
    res = []
    for cmd in {SETUID_CMDS!r}:
        if os.path.exists("/usr/bin/" + cmd[0]):
            p = subprocess.run(["/usr/bin/" + cmd[0], *cmd[1:]], input=b"", capture_output=True)
            res.append([cmd[0], p.returncode, (p.stdout + p.stderr).decode(errors="replace")])
    mi = [ln.split() for ln in open("/proc/self/mountinfo")]
    print(json.dumps({{"res": res, "usr": [m[5] for m in mi if m[4] == "/usr"]}}))
    """
    r = py(box, src)
    res = json.loads(r.stdout)
    assert r.ok and len(res["res"]) >= 3, why(r)
    for name, rc, text in res["res"]:
        assert rc != 0 and not text.strip().startswith("0"), (name, text)
    # nsjail binds the host's root as it is (no_new_privs alone keeps set-uid bits inert).
    assert is_nsjail(box) or "nosuid" in res["usr"][0]
    assert before == {p: sha(p) for p in before}


_INTERPRETER_PATHS = {
    os.path.realpath(p)
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
} | {sys.prefix, sys.base_prefix}


def test_host_mounts_invisible(run_py):
    r = run_py("print(open('/proc/self/mountinfo').read())")
    mounts = [ln.split() for ln in out(r).splitlines() if ln]
    assert r.ok and 0 < len(mounts) < 30, why(r)
    for m in mounts:
        root, point, fstype = m[3], m[4], m[m.index("-") + 1]
        if "cgroup" in fstype:  # the box's own cgroups, read-only (tests/test_box_view.py)
            assert point.startswith("/sys/fs/cgroup") and root == "/", m
            assert "ro" in m[5].split(","), m
        assert point not in ("/sys", "/home", "/var", "/run"), m
        if point.startswith("/.agentrl/py/") and root in _INTERPRETER_PATHS:
            # The interpreter's own installation, relocated (a venv under /work or /tmp):
            # the kernel names a bind's source directory as its root.
            continue
        # The tests' working directory, unless it is where the box has its own mounts (a
        # run from /tmp: the box's /tmp is a tmpfs of its own).
        cwd = [os.getcwd()] if os.getcwd() not in ("/", "/tmp") else []
        for host in ("/root/.cache", "/work/main", "/var", *cwd, "/boot", "/home"):
            assert not (root + "/").startswith(host + "/"), m
            assert not (point + "/").startswith(host + "/"), m


def test_minimal_dev_and_no_mknod(run_py):
    src = """
    import json, os, stat
    print(json.dumps(sorted(os.listdir("/dev"))))
    for p in ("/work/sda", "/dev/shm/mem"):
        try: os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 1)); print("MKNOD", p)
        except OSError as e: print("ERR", e.errno)
    try:  # at most the box's own cgroups (tests/test_box_view.py)
        if os.listdir("/sys") not in ([], ["fs"]): print("SYS", os.listdir("/sys"))
    except OSError: pass
    with open("/dev/null", "w") as f: f.write("x")
    """
    r = run_py(src)
    assert r.ok and "MKNOD" not in out(r) and "SYS" not in out(r), why(r)
    listed = set(json.loads(out(r).splitlines()[0]))
    assert {"null", "zero", "full", "random", "urandom", "shm"} <= listed, listed
    allowed = {"null", "zero", "full", "random", "urandom", "fd", "stdin", "stdout", "stderr"}
    assert listed <= allowed | ({"shm"} if is_nsjail(run_py) else {"shm", "ptmx", "pts", "tty"}), (
        listed
    )


def test_host_environment_not_leaked(run_py, monkeypatch):
    secret = os.urandom(12).hex()
    monkeypatch.setenv("AGENTRL_HOST_SECRET", secret)
    src = "import os\nprint(dict(os.environ))\nprint(open('/proc/self/environ', 'rb').read())"
    if is_nsjail(run_py):  # its init runs as the box user: its environment is readable too
        src += "\nprint(open('/proc/1/environ', 'rb').read())"
    r = run_py(src)
    assert r.ok and secret.encode() not in r.stdout, why(r)
    assert b"AGENTRL_HOST_SECRET" not in r.stdout


def test_host_fds_not_leaked(run_py, host_secret_file, tcp_listener):
    fd = os.open(host_secret_file[0], os.O_RDONLY)
    os.set_inheritable(fd, True)
    tcp_listener.set_inheritable(True)
    src = """
    import os
    names = sorted(os.listdir("/proc/self/fd"))
    open_fds = []
    for n in range(3, 4096):
        try: os.fstat(n); open_fds.append(n)
        except OSError: pass
    print(names, open_fds)
    """
    try:
        r = run_py(src)
    finally:
        os.close(fd)
    assert r.ok and out(r).strip() == "['0', '1', '2', '3'] []", why(r)  # 3: listdir's own


def test_nothing_survives_into_the_next_run(run_py):
    r1 = run_py(LEAVE_BEHIND)
    assert r1.ok and r1.stdout == b"daemon started\n", why(r1)
    assert_clean(timeout=0.5)
    r2 = run_py(LOOK_BEHIND)
    assert r2.ok and out(r2).strip() == "[] ['__main__.py'] ['1', '2']", why(r2)


def test_non_utf8_output_preserved(run_py):
    payload = b"\xff\xfe\x00\x80invalid\xc3(\n"
    src = f"import sys\nsys.stdout.buffer.write({payload!r})\nsys.stderr.buffer.write({payload!r})"
    r = run_py(src)
    assert r.ok and r.stdout == payload and r.stderr == payload, why(r)
