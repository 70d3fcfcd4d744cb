"""Sources of the hostile programs of the red-team corpus (test_redteam.py).

Each is run in a box by a test that then checks the host. ``CTYPES_PRELUDE`` gives programs
``sc(nr, *args) -> (result, errno)``, a raw ``syscall(2)`` through ctypes.
"""

CTYPES_PRELUDE = """
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(*[ctypes.c_long(a) if isinstance(a, int) else a for a in (nr, *args)])
    return r, ctypes.get_errno()
"""


MEMORY_BOMBS = {
    "bulk": 'b = b"x" * (600 << 20)\nprint(len(b))',
    "incremental": "c = []\nwhile True:\n    c.append(bytes([len(c) % 251]) * (1 << 20))",
    "tmpfs": "import os\nfd = os.open('/dev/shm/big', os.O_WRONLY | os.O_CREAT)\n"
    "for i in range(400):\n    os.write(fd, bytes([i % 251]) * (1 << 20))\nprint('wrote')",
}


UNDYING = {
    "background-children": "import os, subprocess, time\nsubprocess.Popen(['sleep', '300'])\n"
    "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0: time.sleep(300)\n"
    "    os._exit(0)\ntime.sleep(300)",
    "ignores-sigterm": "import signal as s, time\n"
    "for n in (s.SIGTERM, s.SIGINT, s.SIGHUP): s.signal(n, s.SIG_IGN)\ntime.sleep(300)",
    "stopped-child": "import os, signal, time\n"
    "if os.fork() == 0: os.kill(os.getpid(), signal.SIGSTOP)\ntime.sleep(300)",
    "closed-stdio": "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(300)",
}


LISTENER = """
import ctypes, os, select, socket, time
s = socket.socket(socket.AF_UNIX)
s.bind("\\0agentrl-test"); s.listen(4)
with socket.socket(socket.AF_UNIX) as c:  # the mechanism works inside one box
    c.connect("\\0agentrl-test"); s.accept()[0].close()
for p in ("/dev/shm/agentrl-shared", "/tmp/agentrl-shared"):
    with open(p, "w") as f: f.write("A")
shm = ctypes.CDLL(None).shmget(KEY, 4096, 0o1000 | 0o666)
print("ready", time.monotonic(), shm, flush=True)
# With STOP_FD and READY_FD (pipes the test passes in), the test hears "ready" and says when the
# prober is done; without them (nsjail has no pass_fds) the listener listens 2.5 s.
if READY_FD is not None: os.write(READY_FD, b"r"); os.close(READY_FD)
accepted, end, watch = 0, time.monotonic() + 2.5, [s] + ([STOP_FD] if STOP_FD is not None else [])
while STOP_FD is not None or time.monotonic() < end:
    ready = select.select(watch, [], [], 0.05)[0]
    if s in ready: s.accept()[0].close(); accepted += 1
    if STOP_FD is not None and STOP_FD in ready: break
print("accepted", accepted, "end", time.monotonic())
"""


def listener_source(key: str, channel: bool = False) -> str:
    """LISTENER for shm key ``key``; with ``channel`` it signals on fd 4 and stops on fd 3."""
    fds = ("3", "4") if channel else ("None", "None")
    return LISTENER.replace("KEY", key).replace("STOP_FD", fds[0]).replace("READY_FD", fds[1])


PROBER = """
import ctypes, json, os, socket, time
res = {"t": time.monotonic()}
try:
    with socket.socket(socket.AF_UNIX) as c: c.connect("\\0agentrl-test")
    res["connect"] = "CONNECTED"
except OSError as e:
    res["connect"] = e.errno
res["files"] = [p for p in ("/dev/shm/agentrl-shared", "/tmp/agentrl-shared") if os.path.exists(p)]
res["shm"] = ctypes.CDLL(None).shmget(KEY, 0, 0)
res["pids"] = sorted(p for p in os.listdir("/proc") if p.isdigit())
print(json.dumps(res))
"""


SYSCALLS = {
    "mount": 'sc(165, b"none", b"/tmp", b"tmpfs", 0, 0)',
    "umount2": 'sc(166, b"/work", 2)',
    "pivot_root": 'sc(155, b"/tmp", b"/tmp")',
    "chroot": 'sc(161, b"/tmp")',
    "unshare": "sc(272, 0x10000000)",
    "setns": 'sc(308, os.open("/proc/self/ns/net", os.O_RDONLY), 0)',
    "clone": "sc(56, 0x10000000 | 17, 0, 0, 0, 0)",
    "bpf": "sc(321, 0, 0, 0)",
    "perf_event_open": "sc(298, 0, 0, -1, -1, 0)",
    "userfaultfd": "sc(323, 0)",
    "io_uring_setup": "sc(425, 1, 0)",
    "keyctl": "sc(250, 0, -3, 0)",
    "add_key": 'sc(248, b"user", b"agentrl", b"x", 1, -3)',
    "request_key": 'sc(249, b"user", b"agentrl", 0, -3)',
    "kexec_load": "sc(246, 0, 0, 0, 0)",
    "init_module": 'sc(175, 0, 0, b"")',
    "finit_module": 'sc(313, 0, b"", 0)',
    "delete_module": 'sc(176, b"agentrl_nonexistent", 0)',
    "open_by_handle_at": "sc(304, -1, 0, 0)",
    "reboot": "sc(169, 0, 0, 0, 0)",
    "swapon": 'sc(167, b"/work/swap", 0)',
    "swapoff": 'sc(168, b"/work/swap")',
    "ioctl": 'sc(16, 0, 0x5412, ctypes.byref(ctypes.c_char(b"x")))',  # TIOCSTI
    "fsopen": 'sc(430, b"tmpfs", 0)',
    # ptrace and process_vm_* are allowed (confined to the box: tests/test_seccomp_fidelity.py).
    "process_madvise": "sc(440, 0, 0, 0, 0, 0)",
    "pidfd_getfd": "sc(438, 0, 0, 0)",
}


SETUID_CMDS = [
    ["su", "root", "-c", "id -u"],
    ["passwd", "-S", "root"],
    ["mount", "-t", "tmpfs", "none", "/tmp"],
    ["umount", "/work"],
    ["chsh", "-s", "/bin/sh", "root"],
    ["gpasswd", "-a", "sandbox", "root"],
    ["newgrp", "root"],
]


FORK_UNTIL_EAGAIN = """
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30); os._exit(0)
        n += 1
except OSError as e:
    print(n, e.errno)
"""


CPU_THREADS = """
import hashlib, threading
data = b"x" * (4 << 20)
def spin():
    while True: hashlib.sha256(data).digest()
ts = [threading.Thread(target=spin) for _ in range(2)]
for t in ts: t.start()
for t in ts: t.join()
"""


CPU_PROCESSES = """
import os, time
for _ in range(4):
    if os.fork() == 0:
        t = time.process_time()
        while time.process_time() - t < 0.4: pass
        os._exit(0)
while True:
    try: os.wait()
    except ChildProcessError: break
print("all done")
"""


IDENTITY = """
import json, os, socket
st = dict(ln.split(":\\t", 1) for ln in open("/proc/self/status").read().splitlines())
print(json.dumps({"ids": [os.getresuid(), os.getresgid(), os.getgroups()],
    "caps": [st[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")],
    "nnp": st["NoNewPrivs"].strip(), "seccomp": st["Seccomp"].strip(),
    "host": [socket.gethostname(), os.uname().nodename,
             open("/proc/sys/kernel/hostname").read().strip()]}))
"""


LEAVE_BEHIND = """
import os, time
for p in ("/work/x", "/tmp/y", "/dev/shm/z"):
    with open(p, "w") as f: f.write("left over")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0: time.sleep(300)  # a daemon that keeps stdout open
    os._exit(0)
os.wait()
print("daemon started")
"""


LOOK_BEHIND = """
import os
print([p for p in ("/work/x", "/tmp/y", "/dev/shm/z") if os.path.exists(p)],
      sorted(os.listdir("/work")), [p for p in os.listdir("/proc") if p.isdigit()])
"""


INOTIFY_HOG = """
import ctypes, json, os, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while n < 100000 and libc.inotify_init() >= 0:
    n += 1
print(json.dumps([open("/proc/self/uid_map").read().split(), n, time.monotonic()]), flush=True)
os.write(4, b"r")  # ready; then hold the instances until the test writes to fd 3
os.read(3, 1)
print(time.monotonic())
"""
INOTIFY_PROBE = """
import ctypes, json, time
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
uid_map = open("/proc/self/uid_map").read().split()
print(json.dumps([uid_map, fd, ctypes.get_errno(), time.monotonic()]))
"""


MEMORY_SCAN = r"""
import ctypes, re
found = []
for line in open("/proc/self/maps"):
    parts = line.split()
    lo, hi = (int(x, 16) for x in parts[0].split("-"))
    if parts[1][0] == "r" and parts[-1] not in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
        data = ctypes.string_at(lo, hi - lo)
        found += [m.group().decode() for m in re.finditer(b"[QXZJ]{12,}", data)]
print(" ".join(found))
"""
