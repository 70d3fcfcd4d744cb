"""What the box shows an ordinary program: its own standard streams, /etc, terminals, /sys.

Each check runs on both native paths: ``cold`` (``sb.run([...])``, a fresh clone) and
``warm`` (``sb.run_python``, a fork of the slot's warm interpreter into a fresh mount
namespace; shell commands run there through ``subprocess``, which inherits fds 0/1/2). Where
the host can run the same command, the box's output must equal the host's.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from agentrl import ExecResult, Limits, Sandbox
from conftest import CGROUP_V2, native_runner, sh_in_box, why

GIB = 1 << 30
LIMITS = Limits(
    wall_time_s=120.0,
    cpu_time_s=60.0,
    memory_bytes=GIB,
    max_pids=64,
    max_output_bytes=1 << 20,
    max_file_bytes=32 << 20,
    max_open_files=256,
    tmpfs_bytes=64 << 20,
)
PATHS = ["cold", "warm"]
HAS_JAVA = shutil.which("java") is not None and shutil.which("javac") is not None

Runner = Callable[..., ExecResult]


@pytest.fixture(scope="module")
def vsb() -> Iterator[Sandbox]:
    with Sandbox(LIMITS, max_concurrency=2) as box:
        yield box


def runner(sb: Sandbox, path: str) -> Runner:
    """``go(script, stdin=...)`` runs a shell script in a box by ``path``."""
    return functools.partial(sh_in_box, sb, path)


@pytest.fixture(params=PATHS)
def sh(request: pytest.FixtureRequest, vsb: Sandbox) -> Runner:
    return runner(vsb, request.param)


@pytest.fixture(params=PATHS)
def pyr(request: pytest.FixtureRequest, vsb: Sandbox) -> Runner:
    return native_runner(vsb, request.param)


def host(script: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["sh", "-c", script], input=stdin, capture_output=True, timeout=60)


# --------------------------------------------------------------------------------------------
# 1. The box reopens its own standard streams.

STDIO_SCRIPTS = [
    "echo x > /dev/stderr",
    "echo hi | tee /dev/stderr",
    "echo y > /proc/self/fd/1; echo z > /dev/fd/2",
    f"{sys.executable} -c \"open('/dev/stdout', 'w').write('x')\"",
    "cat /dev/stdin",
    "cat < /proc/self/fd/0 | tee /dev/stdout",
]


@pytest.mark.parametrize("script", STDIO_SCRIPTS)
def test_a_run_reopens_its_own_stdio_as_on_the_host(sh: Runner, vsb: Sandbox, script: str) -> None:
    script = script.replace(sys.executable, vsb.python)
    r = sh(script, stdin=b"in put\n")
    h = host(script.replace(vsb.python, sys.executable), b"in put\n")
    assert r.status == "ok", why(r)
    assert (r.stdout, r.stderr) == (h.stdout, h.stderr), why(r)


def test_the_streams_are_the_box_users_own(pyr: Runner) -> None:
    r = pyr(
        """
        import os
        print([(os.fstat(fd).st_uid, os.fstat(fd).st_gid) for fd in (0, 1, 2)], os.getuid())
        """
    )
    assert r.status == "ok", why(r)
    assert r.stdout == b"[(1000, 1000), (1000, 1000), (1000, 1000)] 1000\n", why(r)


# --------------------------------------------------------------------------------------------
# 2. /etc: what runtimes read, never a secret.

SECRETS = [
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/passwd-",
    "/etc/group-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/pki/tls/private",
    "/etc/security/opasswd",
    "/etc/machine-id",
    "/etc/subuid",
    "/etc/subgid",
    "/etc/pip.conf",
    "/etc/npmrc",
    "/etc/gitconfig",
    "/etc/environment",
    "/home",
]


def test_no_secret_of_the_hosts_etc_is_in_the_box(pyr: Runner) -> None:
    r = pyr(
        f"""
        import os
        seen = []
        for p in {SECRETS!r}:
            if os.path.isdir(p) and not os.path.islink(p):
                if os.listdir(p):
                    seen.append(p)
            elif os.path.lexists(p):
                seen.append(p)
        # Every file of the box's /etc: none may be one the host keeps from its users.
        files = []
        for d, dirs, names in os.walk("/etc"):
            files += [os.path.join(d, n) for n in names]
        print(seen)
        print("\\n".join(files))
        """
    )
    assert r.status == "ok", why(r)
    first, *files = r.stdout.decode().splitlines()
    assert first == "[]", f"secrets in the box: {first}"
    assert len(files) > 50, why(r)
    generated = {"/etc/passwd", "/etc/group", "/etc/hostname", "/etc/hosts", "/etc/mtab"}
    for f in files:
        if f in generated or os.path.islink(f) or not os.path.exists(f):
            continue
        assert os.stat(f).st_mode & 0o004, f"{f} is not world-readable on the host"
        assert not re.search(r"private|shadow|sudoers|ssh|secret|credential", f), f


def test_passwd_and_group_stay_the_generated_ones(sh: Runner) -> None:
    r = sh("cat /etc/passwd; echo --; cat /etc/group; echo --; id")
    assert r.status == "ok", why(r)
    passwd, group, ident = r.stdout.decode().split("--\n")
    assert [line.split(":")[0] for line in passwd.splitlines()] == ["root", "sandbox", "nobody"]
    assert [line.split(":")[0] for line in group.splitlines()] == ["root", "sandbox", "nogroup"]
    assert ident.startswith("uid=1000(sandbox) gid=1000(sandbox)"), why(r)


@pytest.mark.parametrize(
    "script",
    [
        "cat /etc/os-release",
        "getent services http; getent protocols tcp",
        "readlink /etc/os-release; readlink /etc/localtime; date +%Z",
    ],
)
def test_etc_databases_equal_the_hosts(sh: Runner, script: str) -> None:
    r = sh(script)
    h = host(script)
    assert r.status == "ok", why(r)
    assert h.returncode == 0 and h.stdout
    assert r.stdout == h.stdout, why(r)


def test_python_finds_the_hosts_certificates_and_services(pyr: Runner) -> None:
    r = pyr(
        """
        import socket, ssl
        print(ssl.create_default_context().cert_store_stats()["x509_ca"])
        print(socket.getservbyname("http"), socket.getservbyname("https", "tcp"))
        """
    )
    assert r.status == "ok", why(r)
    want = ssl.create_default_context().cert_store_stats()["x509_ca"]
    assert want > 0
    assert r.stdout.decode().split("\n")[:2] == [
        str(want),
        f"{socket.getservbyname('http')} {socket.getservbyname('https', 'tcp')}",
    ], why(r)


@pytest.mark.skipif(not HAS_JAVA, reason="no java/javac on this host")
def test_java_compiles_and_runs(sh: Runner) -> None:
    src = 'public class Hello { public static void main(String[] a) { System.out.println("hello " + a.length); } }\n'
    r = sh("java -version && javac Hello.java && java Hello 1 2", files={"Hello.java": src})
    assert r.status == "ok", why(r)
    assert r.stdout == b"hello 2\n", why(r)
    assert b"openjdk version" in r.stderr or b"java version" in r.stderr, why(r)


# --------------------------------------------------------------------------------------------
# 3. Terminals: a devpts instance of each run's own.


def test_openpty_and_pty_fork(pyr: Runner) -> None:
    r = pyr(
        """
        import os, pty, sys
        try:
            open("/dev/tty")
        except OSError as e:
            print("no tty", e.errno)
        m, s = os.openpty()
        print(os.ttyname(s), os.isatty(s))
        os.write(m, b"ping\\n")
        print(os.read(s, 100))
        sys.stdout.flush()
        pid, fd = pty.fork()
        if pid == 0:
            with open("/dev/tty", "w") as tty:  # its controlling terminal, the new pty
                tty.write("via tty ")
            print(os.isatty(0), os.ttyname(0), flush=True)
            os._exit(0)
        out = b""
        while True:
            try:
                chunk = os.read(fd, 1000)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        os.waitpid(pid, 0)
        print(out)
        """
    )
    assert r.status == "ok", why(r)
    no_tty, *lines = r.stdout.decode().splitlines()
    assert no_tty == "no tty 6", why(r)  # ENXIO: the box starts without a terminal
    assert lines[0] == "/dev/pts/0 True", why(r)
    assert lines[1] == "b'ping\\n'", why(r)
    assert re.fullmatch(r"b'via tty True /dev/pts/1\\r\\n'", lines[2]), why(r)


def test_pty_spawn_and_script(pyr: Runner) -> None:
    r = pyr(
        """
        import os, pty, shutil, subprocess, sys
        sys.stdout.flush()
        status = pty.spawn([sys.executable, "-c", "import os; print(os.ttyname(0))"])
        print("status", status)
        if shutil.which("script"):
            out = subprocess.run(["script", "-qc", "tty", "/dev/null"], capture_output=True)
            print("script", out.returncode, out.stdout)
        else:
            print("script", 0, b"/dev/pts/1\\r\\n")
        """
    )
    assert r.status == "ok", why(r)
    text = r.stdout.decode()
    assert re.search(r"/dev/pts/\d+\r?\n", text), why(r)
    assert "status 0" in text, why(r)
    assert re.search(r"script 0 b'/dev/pts/\d+\\r\\n'", text), why(r)


@pytest.mark.parametrize("path", PATHS)
def test_a_run_cannot_see_another_runs_terminals(vsb: Sandbox, path: str) -> None:
    holder = native_runner(vsb, path)
    other = native_runner(vsb, path)
    held: list[ExecResult] = []
    t = threading.Thread(
        target=lambda: held.append(
            holder(
                """
                import os, time
                fds = [os.openpty() for _ in range(3)]
                print(sorted(os.listdir("/dev/pts")))
                print(time.time())
                time.sleep(3)
                print(time.time())
                """
            )
        )
    )
    t.start()
    try:
        time.sleep(1.5)
        r = other(
            """
            import os, time
            print(time.time())
            print(sorted(os.listdir("/dev/pts")))
            m, s = os.openpty()
            print(os.ttyname(s), sorted(os.listdir("/dev/pts")))
            """
        )
    finally:
        t.join()
    assert held and held[0].status == "ok", why(held[0]) if held else "no result"
    listing, opened, ended = held[0].stdout.decode().splitlines()
    assert listing == "['0', '1', '2', 'ptmx']", why(held[0])
    assert r.status == "ok", why(r)
    when, *rest = r.stdout.decode().splitlines()
    # The other run looked while the first held its three terminals.
    assert float(opened) < float(when) < float(ended), (opened, when, ended)
    assert rest == ["['ptmx']", "/dev/pts/0 ['0', 'ptmx']"], why(r)


# --------------------------------------------------------------------------------------------
# 4. /sys: the box's own cgroup, nothing of the host.


def test_sys_shows_only_the_boxs_cgroups(pyr: Runner) -> None:
    r = pyr(
        """
        import os
        print(sorted(os.listdir("/sys")), sorted(os.listdir("/sys/fs")))
        for p in ("/sys/devices", "/sys/class", "/sys/kernel", "/sys/block", "/sys/bus", "/sys/module", "/sys/firmware"):
            assert not os.path.exists(p), p
        cg = sorted(os.listdir("/sys/fs/cgroup"))
        print(cg)
        print(open("/proc/self/cgroup").read().strip())
        try:
            open("/sys/fs/cgroup/" + ("memory.max" if "memory.max" in cg else "memory/memory.limit_in_bytes"), "w").write("1")
        except OSError as e:
            print("write", e.errno)
        """
    )
    assert r.status == "ok", why(r)
    lines = r.stdout.decode().splitlines()
    assert lines[0] == "['fs'] ['cgroup']", why(r)
    if CGROUP_V2:
        assert "memory.max" in lines[1], why(r)
    else:
        assert eval(lines[1]) == ["cpu", "cpuacct", "cpuset", "memory", "pids"] or {
            "memory",
            "pids",
        } <= set(eval(lines[1])), why(r)
    for line in lines[2:-1]:
        assert line.endswith(":/"), why(r)
    assert lines[-1] in ("write 30", "write 13"), why(r)  # EROFS (or EACCES)


def _limit_source() -> str:
    return (
        "open('/sys/fs/cgroup/memory.max').read()"
        if CGROUP_V2
        else "open('/sys/fs/cgroup/memory/memory.limit_in_bytes').read()"
    )


def test_the_memory_limit_file_is_the_boxs_limit() -> None:
    # A sandbox without warm interpreters: nothing but the run is in the slot's cgroup, so
    # the limit is exactly the run's.
    with Sandbox(LIMITS, warm=False, max_concurrency=1) as cold:
        r = cold.run([cold.python, "-c", f"print({_limit_source()}.strip())"])
    assert r.status == "ok", why(r)
    assert int(r.stdout) == GIB, why(r)


def test_a_warm_runs_limit_is_its_own_plus_the_interpreters(vsb: Sandbox) -> None:
    r = vsb.run_python(f"print({_limit_source()}.strip())")
    assert r.status == "ok", why(r)
    assert GIB <= int(r.stdout) <= GIB + (256 << 20), why(r)


def _host_memory() -> int:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) * 1024


@pytest.mark.skipif(not HAS_JAVA, reason="no java on this host")
def test_the_jvm_sizes_its_heap_from_the_boxs_limit(sh: Runner) -> None:
    if _host_memory() < 4 * GIB:
        pytest.skip("the host has too little memory to tell its limit from the box's")
    r = sh(
        "java -XX:+PrintFlagsFinal -version | grep -w MaxHeapSize; "
        "java -XshowSettings:system -version 2>&1 | grep -i 'memory limit'"
    )
    assert r.status == "ok", why(r)
    heap = int(re.search(rb"MaxHeapSize\s*=\s*(\d+)", r.stdout).group(1))  # type: ignore[union-attr]
    assert 0.2 * GIB <= heap <= 0.3 * GIB, why(r)
    limit = re.search(rb"Memory Limit: ([\d.]+)([MG])", r.stdout)
    assert limit, why(r)
    value = float(limit.group(1)) * (1 << (30 if limit.group(2) == b"G" else 20))
    assert GIB <= value <= GIB + (256 << 20), why(r)
