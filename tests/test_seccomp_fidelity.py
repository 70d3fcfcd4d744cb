"""Seccomp policy fidelity: what ordinary programs need runs unrefused, what attacks need stays
refused (and named), on the cold path (``sb.run``) and the warm path (``sb.run_python``).

* Loopback networking with ``network=False``: every box has a private network namespace with
  only ``lo`` (127.0.0.1 and ::1), so IP and ``NETLINK_ROUTE`` sockets are allowed there; the
  host's loopback and every other address stay unreachable (checked on the host too).
* Tracing inside the box: sanitizers (LeakSanitizer traces its own threads at exit), strace
  and gdb work; a tracer can neither rewrite a call past the filter nor reach the box's init,
  the warm interpreter, the host or another box.
* Routine refusals are not noise: ordinary programs end with ``denied_syscalls == ()``.

Each test runs the same program on the host where the output is compared.
"""

from __future__ import annotations

import errno
import os
import platform
import re
import select
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from agentrl import ExecResult, Sandbox, Status
from conftest import BOX_UID_BASE, WARM_MARK, _cmdline, sh_in_box, status_ids, why

X86_64 = platform.machine() == "x86_64"
PATHS = ["cold", "warm"]


sh = sh_in_box


def py(sb: Sandbox, path: str, source: str, **kw: object) -> ExecResult:
    """Runs Python source: a fresh interpreter (cold) or a fork of the warm one."""
    source = textwrap.dedent(source)
    if path == "warm":
        return sb.run_python(source, **kw)  # type: ignore[arg-type]
    files = {**(kw.pop("files", None) or {}), "main.py": source}  # type: ignore[dict-item]
    return sb.run([sb.python, "-I", "main.py"], files=files, **kw)  # type: ignore[arg-type]


def host_sh(script: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["/bin/sh", "-c", script], cwd=cwd, capture_output=True, timeout=60)


def clean(r: ExecResult) -> None:
    assert r.ok and r.denied_syscalls == (), why(r)


# --- 1. loopback networking -----------------------------------------------------------------

LOOPBACK_PY = """
import asyncio, socket

async def echo(reader, writer):
    writer.write((await reader.readline()).upper()); await writer.drain(); writer.close()

async def main():
    for host in ("127.0.0.1", "::1", "localhost"):
        server = await asyncio.start_server(echo, host, 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"ping " + host.encode() + b"\\n"); await writer.drain()
        print((await reader.readline()).decode().strip())
        writer.close(); server.close(); await server.wait_closed()

asyncio.run(main())
for fam, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    u = socket.socket(fam, socket.SOCK_DGRAM); u.bind((host, 0))
    c = socket.socket(fam, socket.SOCK_DGRAM); c.sendto(b"dgram", u.getsockname())
    print(host, u.recv(16).decode())
print(socket.if_nameindex())
print(sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)}))
print(sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80, flags=socket.AI_ADDRCONFIG,
                                                   type=socket.SOCK_STREAM)}))
print(socket.gethostbyname("localhost"))
"""


@pytest.mark.parametrize("path", PATHS)
def test_loopback_servers_in_python(sb: Sandbox, path: str) -> None:
    r = py(sb, path, LOOPBACK_PY)
    clean(r)
    lines = r.stdout.decode().splitlines()
    assert lines[:5] == [
        "PING 127.0.0.1",
        "PING ::1",
        "PING LOCALHOST",
        "127.0.0.1 dgram",
        "::1 dgram",
    ], why(r)
    assert lines[5] == "[(1, 'lo')]", why(r)
    # getaddrinfo of localhost reads the box's /etc/hosts as the host's: the same answer.
    host = subprocess.run(
        [sys.executable, "-I", "-c", "import socket" + LOOPBACK_PY.split("if_nameindex())")[1]],
        capture_output=True,
        check=True,
        timeout=30,
    )
    assert lines[6] == host.stdout.decode().splitlines()[0], (lines, host.stdout)


@pytest.mark.parametrize("path", PATHS)
def test_loopback_has_both_addresses(sb: Sandbox, path: str) -> None:
    """`lo` is up with 127.0.0.1/8 and ::1/128, seen through netlink (`ip`) and /proc."""
    ip = shutil.which("ip")
    script = "cat /proc/net/if_inet6; " + ("ip -o addr show dev lo" if ip else "true")
    r = sh(sb, path, script)
    clean(r)
    text = r.stdout.decode()
    assert re.search(r"^0{31}1 01 80 10 80\s+lo$", text, re.M), why(r)
    if ip:
        assert "inet 127.0.0.1/8" in text and "inet6 ::1/128" in text, why(r)


NODE_HTTP = r"""
const http = require('http'), os = require('os');
console.log(JSON.stringify(Object.keys(os.networkInterfaces())));
const s = http.createServer((q, r) => r.end('hello ' + q.url)).listen(0, '127.0.0.1', () => {
  http.get('http://127.0.0.1:' + s.address().port + '/x', (r) => {
    let d = ''; r.on('data', (c) => d += c); r.on('end', () => { console.log(d); s.close(); });
  });
});
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize("path", PATHS)
def test_node_http_server_on_loopback(sb: Sandbox, path: str) -> None:
    r = sh(sb, path, "node server.js", files={"server.js": NODE_HTTP})
    clean(r)
    assert r.stdout == b'["lo"]\nhello /x\n', why(r)


UNREACHABLE_PY = """
import errno, socket, time
port = {port}
def attempt(fam, typ, addr):
    t0 = time.monotonic()
    try:
        with socket.socket(fam, typ) as s:
            s.settimeout(3)
            if typ == socket.SOCK_DGRAM:
                s.sendto(b"x", addr)
            else:
                s.connect(addr)
        res = "CONNECTED"
    except OSError as e:
        res = errno.errorcode.get(e.errno, str(e.errno))
    print(addr[0], res, round(time.monotonic() - t0, 1))
attempt(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", port))
attempt(socket.AF_INET6, socket.SOCK_STREAM, ("::1", port))
for host in {hosts!r}:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    attempt(fam, socket.SOCK_STREAM, (host, 80))
    attempt(fam, socket.SOCK_DGRAM, (host, 53))
"""


def _host_addresses() -> list[str]:
    """The host's own non-loopback addresses (reached from the box, they would be the host)."""
    found = []
    try:
        text = subprocess.run(
            ["ip", "-o", "addr"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return found
    for m in re.finditer(r"inet6? ([0-9a-f.:]+)/", text):
        a = m.group(1)
        if not a.startswith(("127.", "::1", "fe80")):
            found.append(a)
    return found[:4]


@pytest.mark.parametrize("path", PATHS)
def test_host_and_outside_unreachable(sb: Sandbox, path: str, tcp_listener: socket.socket) -> None:
    """IP sockets work in the private namespace only: the host's loopback listener is another
    namespace's (refused), and every other address has no route (ENETUNREACH at once, nothing
    sent). The host listener sees no connection."""
    port = tcp_listener.getsockname()[1]
    hosts = ["10.0.0.1", "192.168.1.1", "8.8.8.8", "2001:db8::1", *_host_addresses()]
    r = py(sb, path, UNREACHABLE_PY.format(port=port, hosts=hosts))
    clean(r)
    lines = [ln.split() for ln in r.stdout.decode().splitlines()]
    assert lines[0][:2] == ["127.0.0.1", "ECONNREFUSED"], why(r)
    assert lines[1][:2] == ["::1", "ECONNREFUSED"], why(r)
    assert len(lines) == 2 + 2 * len(hosts), why(r)
    for _addr, res, secs in lines[2:]:
        assert res == "ENETUNREACH" and float(secs) < 1.0, why(r)
    assert not select.select([tcp_listener], [], [], 0.2)[0], "the host listener got a connection"


LEAVE_TIME_WAIT = """
import socket
s = socket.socket(); s.bind(("127.0.0.1", {port})); s.listen(1)
c = socket.create_connection(("127.0.0.1", {port})); a, _ = s.accept()
a.close(); c.close(); s.close()  # the server side closes first: its port would be TIME_WAIT
print("left")
"""

FIND_TIME_WAIT = """
import socket
print(sum(ln.split()[3] == "06" for ln in open("/proc/net/tcp").read().splitlines()[1:]))
s = socket.socket(); s.bind(("127.0.0.1", {port})); print("bound")
"""


def test_no_tcp_state_passes_to_the_next_run_of_a_slot() -> None:
    """Sequential runs of a slot share its network namespace: a connection one run closed must
    leave no TIME_WAIT entry that the next run sees or that keeps it from binding the port."""
    port = 40000 + os.getpid() % 20000
    with Sandbox(max_concurrency=1) as one:
        for first in PATHS:
            for second in PATHS:
                r = py(one, first, LEAVE_TIME_WAIT.format(port=port))
                assert r.ok and r.stdout == b"left\n", why(r)
                r = py(one, second, FIND_TIME_WAIT.format(port=port))
                assert r.ok and r.stdout == b"0\nbound\n", (first, second, why(r))
    # The host's own setting is untouched.
    with open("/proc/sys/net/ipv4/tcp_max_tw_buckets") as f:
        assert int(f.read()) > 0


NETLINK_PY = """
import errno, socket, subprocess
def netlink(proto):
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, proto).close(); return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
print("route", netlink(0), "sock_diag", netlink(4), "audit", netlink(9), "netfilter", netlink(12))
for cmd in (["ip", "addr", "add", "10.9.9.9/24", "dev", "lo"], ["ip", "link", "set", "lo", "down"],
            ["ip", "link", "add", "agentrl0", "type", "dummy"]):
    p = subprocess.run(cmd, capture_output=True)
    print(p.returncode != 0)
print(open("/proc/net/if_inet6").read().count("lo"), socket.if_nameindex())
"""


@pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 is not installed")
@pytest.mark.parametrize("path", PATHS)
def test_netlink_reads_but_cannot_change_the_namespace(sb: Sandbox, path: str) -> None:
    """NETLINK_ROUTE and NETLINK_SOCK_DIAG are open; changing an address, a link or adding one
    fails (the namespace is not the box's to administer); NETLINK_AUDIT gets a plain
    EPROTONOSUPPORT, unreported; other protocols are refused and named."""
    r = py(sb, path, NETLINK_PY)
    assert r.ok, why(r)
    lines = r.stdout.decode().splitlines()
    assert lines[0] == "route ok sock_diag ok audit EPROTONOSUPPORT netfilter EPROTONOSUPPORT"
    assert lines[1:4] == ["True"] * 3, why(r)
    assert lines[4] == "1 [(1, 'lo')]", why(r)
    assert r.denied_syscalls == ("socket",), why(r)
    # The next run of the slot still finds lo up with both addresses.
    test_loopback_has_both_addresses(sb, path)


# --- 2. tracing -----------------------------------------------------------------------------

LEAK_C = r"""
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    char *p = malloc(7);
    p[0] = 'x';
    printf("stdout %c\n", p[0]);
    if (argc < 2) free(p);
    p = 0;
    return 0;
}
"""

CRASH_C = "int main(void) { int *p = 0; return *p; }\n"


def _asan_shape(stderr: bytes) -> list[str]:
    """The leak report without pids and addresses."""
    text = re.sub(rb"==\d+==", b"==PID==", stderr)
    text = re.sub(rb"0x[0-9a-f]+", b"ADDR", text)
    text = re.sub(rb"/[^ ]*/(l\.c)", rb"\1", text)
    return [ln for ln in text.decode().splitlines() if ln.strip()]


needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


@needs_gcc
@pytest.mark.parametrize("path", PATHS)
def test_address_sanitizer_leak_report(sb: Sandbox, path: str, tmp_path: Path) -> None:
    """LeakSanitizer stops the world with ptrace at exit: the leaking run reports the leak with
    the host's exit code and report; the clean one exits 0 with its stdout."""
    build = "gcc -g -O0 -fsanitize=address -o l l.c"
    script = f"{build} && ./l leak; echo rc=$?; ./l; echo rc=$?"
    (tmp_path / "l.c").write_text(LEAK_C)
    host = host_sh(script, tmp_path)
    r = sh(sb, path, script, files={"l.c": LEAK_C})
    clean(r)
    assert r.stdout == host.stdout, why(r)
    assert b"rc=0" in r.stdout and re.search(rb"rc=[1-9]", r.stdout), why(r)
    assert _asan_shape(r.stderr) == _asan_shape(host.stderr), why(r)
    assert b"LeakSanitizer: detected memory leaks" in r.stderr, why(r)


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
@pytest.mark.parametrize("path", PATHS)
def test_strace(sb: Sandbox, path: str, tmp_path: Path) -> None:
    script = "strace -f -o /dev/null true && strace -f -e trace=write echo hi 2>&1"
    r = sh(sb, path, script)
    clean(r)
    assert b"+++ exited with 0 +++" in r.stdout and r.stdout == host_sh(script, tmp_path).stdout
    assert r.stdout.startswith(b'write(1, "hi\\n", 3hi\n)'), why(r)


@needs_gcc
@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")
@pytest.mark.parametrize("path", PATHS)
def test_gdb_backtrace_of_a_crash(sb: Sandbox, path: str, tmp_path: Path) -> None:
    """gdb runs the program (PTRACE_TRACEME in its fork, ASLR off as on the host) and prints
    the same stop and backtrace as on the host, addresses included."""
    script = "gcc -g -O0 -o c c.c && gdb -nx -batch -ex run -ex bt --args ./c 2>&1"
    (tmp_path / "c.c").write_text(CRASH_C)
    host = host_sh(script, tmp_path)
    r = sh(sb, path, script, files={"c.c": CRASH_C})
    clean(r)

    def key(b: bytes) -> list[str]:
        keep = ("Program received", "#0", "in main")
        return [ln for ln in b.decode().splitlines() if ln.startswith(keep)]

    assert key(r.stdout) and key(r.stdout) == key(host.stdout), (why(r), host.stdout)
    assert b"Error disabling address space randomization" not in r.stdout, why(r)


TRACER_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PTRACE_O_SUSPEND_SECCOMP
#define PTRACE_O_SUSPEND_SECCOMP (1 << 21)
#endif

/* The tracee makes an allowed call (getppid); at its syscall-enter stop the tracer turns it
 * into nr(a0, a1, a2) and prints what it returned. */
static int rewrite(long nr, long a0, long a1, long a2) {
    pid_t child = fork();
    if (child == 0) {
        ptrace(PTRACE_TRACEME, 0, 0, 0);
        raise(SIGSTOP);
        syscall(SYS_getppid);
        _exit(0);
    }
    int st;
    waitpid(child, &st, 0);
    errno = 0;
    long s = ptrace(PTRACE_SETOPTIONS, child, 0, PTRACE_O_SUSPEND_SECCOMP);
    printf("suspend %ld %d\n", s, s < 0 ? errno : 0);
    ptrace(PTRACE_SETOPTIONS, child, 0, PTRACE_O_TRACESYSGOOD | PTRACE_O_EXITKILL);
    int entering = 1, state = 0;
    for (;;) {
        ptrace(PTRACE_SYSCALL, child, 0, 0);
        if (waitpid(child, &st, 0) < 0) return 1;
        if (WIFEXITED(st)) { printf("exited %d\n", WEXITSTATUS(st)); return 0; }
        if (WIFSIGNALED(st)) { printf("killed %d\n", WTERMSIG(st)); return 0; }
        if (!(WIFSTOPPED(st) && WSTOPSIG(st) == (SIGTRAP | 0x80))) continue;
        struct user_regs_struct r;
        ptrace(PTRACE_GETREGS, child, 0, &r);
        if (entering && state == 0 && r.orig_rax == SYS_getppid) {
            r.orig_rax = nr; r.rdi = a0; r.rsi = a1; r.rdx = a2; r.r10 = r.r8 = r.r9 = 0;
            ptrace(PTRACE_SETREGS, child, 0, &r);
            state = 1;
        } else if (!entering && state == 1) {
            printf("result %ld\n", (long)r.rax);
            state = 2;
        }
        entering = !entering;
    }
}

/* Every way of reaching into process `pid`. */
static void reach(pid_t pid) {
    char buf[16], path[64];
    struct iovec local = {buf, sizeof buf}, remote = {(void *)0x400000, sizeof buf};
    long r;
    errno = 0; r = ptrace(PTRACE_ATTACH, pid, 0, 0);
    printf("%d attach %d\n", pid, r < 0 ? errno : 0);
    if (r == 0) { waitpid(pid, 0, __WALL); ptrace(PTRACE_DETACH, pid, 0, 0); }
    errno = 0; r = ptrace(PTRACE_SEIZE, pid, 0, 0);
    printf("%d seize %d\n", pid, r < 0 ? errno : 0);
    if (r == 0) ptrace(PTRACE_DETACH, pid, 0, 0);
    errno = 0; r = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    printf("%d vm_readv %d\n", pid, r < 0 ? errno : 0);
    errno = 0; r = process_vm_writev(pid, &local, 1, &remote, 1, 0);
    printf("%d vm_writev %d\n", pid, r < 0 ? errno : 0);
    snprintf(path, sizeof path, "/proc/%d/mem", pid);
    errno = 0; r = open(path, O_RDONLY);
    printf("%d mem %d\n", pid, r < 0 ? errno : 0);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc == 6 && !strcmp(argv[1], "rewrite"))
        return rewrite(strtol(argv[2], 0, 0), strtol(argv[3], 0, 0), strtol(argv[4], 0, 0),
                       strtol(argv[5], 0, 0));
    if (argc >= 3 && !strcmp(argv[1], "reach")) {
        for (int i = 2; i < argc; i++) reach(atoi(argv[i]));
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "traceme")) {
        /* Makes the parent its tracer (an anti-debugging check), gets a signal, execs. */
        errno = 0;
        long r = ptrace(PTRACE_TRACEME, 0, 0, 0);
        printf("traceme %ld %d\n", r, errno);
        signal(SIGUSR1, SIG_IGN);
        raise(SIGUSR1);
        printf("after signal\n");
        execl("/bin/echo", "echo", "exec ok", (char *)0);
        return 99;
    }
    return 2;
}
"""


@pytest.fixture(scope="module")
def tracer(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    if not X86_64 or shutil.which("gcc") is None:
        pytest.skip("the tracer is x86_64 C")
    d = tmp_path_factory.mktemp("tracer")
    (d / "t.c").write_text(TRACER_C)
    subprocess.run(["gcc", "-O1", "-o", str(d / "t"), str(d / "t.c")], check=True, timeout=60)
    return (d / "t").read_bytes()


def run_tracer(sb: Sandbox, path: str, tracer: bytes, args: str, **kw: object) -> ExecResult:
    return sh(sb, path, f"chmod +x t && ./t {args}", files={"t": tracer}, **kw)


CLONE_NEWUSER = 0x10000000
REWRITES = {
    # name: (nr, a0, a1, a2, result)
    "unshare": (272, CLONE_NEWUSER, 0, 0, -errno.EPERM),
    "mount": (165, 0, 0, 0, -errno.EPERM),
    "kexec_load": (246, 0, 0, 0, -errno.EPERM),
    "bpf": (321, 0, 0, 0, -errno.EPERM),
    "setns": (308, 0, 0, 0, -errno.EPERM),
    "socket": (41, socket.AF_PACKET, socket.SOCK_RAW, 0, -errno.EAFNOSUPPORT),
    "clone": (56, CLONE_NEWUSER | 17, 0, 0, -errno.EPERM),
}


@pytest.mark.parametrize("name", sorted(REWRITES))
@pytest.mark.parametrize("path", PATHS)
def test_tracer_cannot_rewrite_a_call_past_the_filter(
    sb: Sandbox, path: str, tracer: bytes, name: str
) -> None:
    """seccomp runs after the syscall-enter stop (Linux >= 4.8), so the rewritten call is judged
    and refused, and named; PTRACE_O_SUSPEND_SECCOMP needs CAP_SYS_ADMIN of the host."""
    nr, a0, a1, a2, result = REWRITES[name]
    r = run_tracer(sb, path, tracer, f"rewrite {nr} {a0} {a1} {a2}")
    assert r.ok, why(r)
    lines = r.stdout.decode().splitlines()
    assert lines[0] in (f"suspend -1 {errno.EPERM}", f"suspend -1 {errno.EINVAL}"), why(r)
    assert lines[1:] == [f"result {result}", "exited 0"], why(r)
    assert name in r.denied_syscalls, why(r)


@pytest.mark.parametrize("path", PATHS)
def test_tracer_cannot_switch_to_a_foreign_abi(sb: Sandbox, path: str, tracer: bytes) -> None:
    """An x32 number written in by the tracer kills the tracee, as one issued directly does."""
    r = run_tracer(sb, path, tracer, f"rewrite {0x40000000 | 39} 0 0 0")
    assert r.ok and r.stdout.decode().splitlines()[-1] == "killed 31", why(r)


def _tracer_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


@pytest.mark.parametrize("path", PATHS)
def test_tracer_cannot_reach_init_or_anything_outside(
    sb: Sandbox, path: str, tracer: bytes
) -> None:
    """pid 1 (the box's init, without seccomp, on its own uid and non-dumpable) cannot be
    attached, seized, read or written; the host's pids (this test, the warm interpreter) are
    not in the box's pid namespace. A process of the box can trace its own kin (pid 2)."""
    warm = [
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit()
        and (ids := status_ids(p))
        and BOX_UID_BASE <= ids[0][0] < BOX_UID_BASE + 4096
        and WARM_MARK in _cmdline(int(p))
    ]
    outside = [os.getpid(), os.getppid(), *warm[:2]]
    r = run_tracer(sb, path, tracer, "reach 1 " + " ".join(map(str, outside)))
    clean(r)
    got = {}
    for line in r.stdout.decode().splitlines():
        pid, what, err = line.split()
        got[(int(pid), what)] = int(err)
    for what in ("attach", "seize", "vm_readv", "vm_writev"):
        assert got[(1, what)] == errno.EPERM, why(r)
    assert got[(1, "mem")] == errno.EACCES, why(r)
    for pid in outside:
        for what in ("attach", "seize", "vm_readv", "vm_writev"):
            # No such process in the box's namespace (or, by chance, a box process the box
            # may not reach: EPERM); never success.
            assert got[(pid, what)] in (errno.ESRCH, errno.EPERM), (pid, what, why(r))
        assert got[(pid, "mem")] in (errno.ENOENT, errno.EACCES), (pid, why(r))
        assert _tracer_pid(pid) in (0, None), f"host process {pid} is being traced"


def test_tracer_cannot_reach_a_concurrent_box(sb: Sandbox, tracer: bytes) -> None:
    """A box that tries every pid number cannot attach to anything but its own processes while
    another box runs beside it; the other box's processes are never traced."""
    result: dict[str, ExecResult] = {}
    victim = threading.Thread(
        target=lambda: result.setdefault(
            "v", sb.run(["/bin/sh", "-c", "sleep 2.718; echo survived"])
        )
    )
    victim.start()
    deadline = time.monotonic() + 5
    victims: list[int] = []
    while not victims and time.monotonic() < deadline:
        victims = [
            p for p in map(int, filter(str.isdigit, os.listdir("/proc"))) if "2.718" in _cmdline(p)
        ]
        time.sleep(0.02)
    assert victims, "the victim box did not start"
    pids = " ".join(str(p) for p in range(1, 300))
    r = run_tracer(sb, "cold", tracer, pids.join(["reach ", ""]))
    clean(r)
    attached = [
        ln
        for ln in r.stdout.decode().splitlines()
        if ln.split()[1] == "attach" and ln.split()[2] == "0"
    ]
    # Only its own shell (pid 2, the tracer's parent) is within reach.
    assert attached == ["2 attach 0"], why(r)
    for p in victims:
        assert _tracer_pid(p) in (0, None), "the other box's process is traced"
    victim.join()
    assert result["v"].ok and result["v"].stdout == b"survived\n", why(result["v"])


def test_program_that_makes_its_init_its_tracer_runs_on(sb: Sandbox, tracer: bytes) -> None:
    """Cold path: the program (pid 2) calls PTRACE_TRACEME, so the init is its tracer; the init
    is no debugger: it detaches, the signal is delivered as without a tracer and the program
    runs to its end (on a host, its parent shell would see it stopped)."""
    r = sb.run(["/bin/sh", "-c", "chmod +x t && exec ./t traceme"], files={"t": tracer})
    clean(r)
    assert r.stdout == b"traceme 0 0\nafter signal\nexec ok\n", why(r)
    src = """
    import ctypes, os, signal
    libc = ctypes.CDLL(None, use_errno=True)
    print("traceme", libc.ptrace(0, 0, 0, 0), flush=True)
    signal.signal(signal.SIGUSR1, lambda *a: print("handled", flush=True))
    os.kill(os.getpid(), signal.SIGUSR1)
    os.execv("/bin/echo", ["echo", "exec ok"])
    """
    r = py(sb, "cold", src)
    clean(r)
    assert r.stdout == b"traceme 0\nhandled\nexec ok\n", why(r)


def test_warm_run_that_makes_the_interpreter_its_tracer(sb: Sandbox) -> None:
    """Warm path: the run's parent is the warm interpreter, which is no debugger either; a run
    that makes it its tracer and then takes a signal stays stopped until its wall-clock limit
    (a documented difference from the cold path), and the interpreter serves the next run."""
    src = """
    import ctypes, os, signal
    libc = ctypes.CDLL(None, use_errno=True)
    print("traceme", libc.ptrace(0, 0, 0, 0), flush=True)
    os.kill(os.getpid(), signal.SIGUSR1)
    """
    r = sb.run_python(textwrap.dedent(src), limits=sb.limits.replace(wall_time_s=1.0))
    assert r.status is Status.TIMEOUT and r.stdout == b"traceme 0\n", why(r)
    assert r.denied_syscalls == (), why(r)
    assert sb.run_python("print(1)").stdout == b"1\n"


# --- 3. routine refusals --------------------------------------------------------------------

ORDINARY_SH = {
    "ls": "ls -la / >/dev/null && echo ok",
    "ps": "ps aux | head -1",
    "make": "make --version | head -1",
    "gcc": "printf 'int main(void){return 3;}' > a.c && gcc a.c -o a; ./a; echo rc=$?",
    "dmesg": "dmesg >/dev/null 2>&1; echo rc=$?",
    "ss": "command -v ss >/dev/null && ss -tln >/dev/null; echo ok",
    "ip": "command -v ip >/dev/null && ip addr >/dev/null; echo ok",
    "java": "command -v java >/dev/null && java -version 2>&1 | head -1 | cut -c1-7; echo ok",
    "node": "command -v node >/dev/null && node -e 'console.log(require(\"os\").cpus().length>0)'",
    "pip": "python3 -m pip --version >/dev/null && python3 -m pip list >/dev/null; echo rc=$?",
}

ORDINARY_PY = {
    "uuid": "import uuid; print(uuid.getnode() > 0)",
    "ssl": "import ssl; ssl.create_default_context(); print('ok')",
    "sqlite3": "import sqlite3; print(sqlite3.connect(':memory:').execute('select 7').fetchone())",
    "multiprocessing": """
        import multiprocessing as mp
        if __name__ == "__main__":
            for m in ("fork", "spawn", "forkserver"):
                with mp.get_context(m).Pool(2) as p:
                    print(m, p.map(abs, [-1, -2]))
        """,
}


@pytest.mark.parametrize("name", sorted(ORDINARY_SH))
@pytest.mark.parametrize("path", PATHS)
def test_ordinary_commands_are_not_refused(
    sb: Sandbox, path: str, name: str, tmp_path: Path
) -> None:
    script = ORDINARY_SH[name]
    box_script, host_script = script, script
    if name == "pip":
        box_script = script.replace("python3", sb.python)
        host_script = script.replace("python3", sys.executable)
    r = sh(sb, path, box_script, limits=sb.limits.replace(wall_time_s=30, cpu_time_s=20))
    assert r.ok and r.denied_syscalls == (), why(r)
    host = host_sh(host_script, tmp_path)
    if name not in ("ps", "dmesg"):  # ps lists other processes; dmesg reads the host's log
        assert r.stdout == host.stdout, (why(r), host.stdout)


@pytest.mark.parametrize("name", sorted(ORDINARY_PY))
@pytest.mark.parametrize("path", PATHS)
def test_ordinary_python_is_not_refused(sb: Sandbox, path: str, name: str) -> None:
    src = textwrap.dedent(ORDINARY_PY[name])
    r = py(sb, path, src, limits=sb.limits.replace(wall_time_s=30, cpu_time_s=20))
    assert r.ok and r.denied_syscalls == (), why(r)
    host = subprocess.run([sys.executable, "-c", src], capture_output=True, timeout=60, check=True)
    assert r.stdout == host.stdout, (why(r), host.stdout)


ATTACKS = {
    "mount": 'sc(165, b"none", b"/tmp", b"tmpfs", 0, 0)',
    "unshare": "sc(272, 0x10000000)",
    "bpf": "sc(321, 0, 0, 0)",
    "kexec_load": "sc(246, 0, 0, 0, 0)",
    "init_module": 'sc(175, 0, 0, b"")',
    "keyctl": "sc(250, 0, -3, 0)",
    "io_uring_setup": "sc(425, 1, 0)",
    "perf_event_open": "sc(298, 0, 0, -1, -1, 0)",
    "process_madvise": "sc(440, 0, 0, 0, 0, 0)",
    "pidfd_getfd": "sc(438, 0, 0, 0)",
    "socket": "sc(41, 17, 3, 0)",  # AF_PACKET
}


@pytest.mark.skipif(not X86_64, reason="x86_64 system-call numbers")
@pytest.mark.parametrize("path", PATHS)
def test_attack_shaped_calls_are_still_named(sb: Sandbox, path: str) -> None:
    calls = ", ".join(f"{k!r}: {v}" for k, v in ATTACKS.items())
    src = f"""
    import ctypes, json
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    def sc(*a):
        r = libc.syscall(*a)
        return r, ctypes.get_errno()
    print(json.dumps({{{calls}}}))
    """
    r = py(sb, path, src)
    assert r.ok, why(r)
    assert set(r.denied_syscalls) == set(ATTACKS), why(r)
