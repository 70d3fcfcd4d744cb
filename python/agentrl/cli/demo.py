"""``agentrl demo``: hostile programs contained, and what a box costs.

This is the project's main job until the training loop lands: it runs a handful of
attacks through the sandbox, checks the host after each, and times a box against a bare
process (and bubblewrap when it is installed).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from agentrl.sandbox.box import Sandbox
from agentrl.sandbox.limits import Limits

__all__ = ["run_demo"]

_ATTACKS: list[tuple[str, str]] = [
    ("fork bomb", "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n"),
    ("memory bomb", "x = []\nwhile True: x.append(bytearray(16 << 20))\n"),
    ("infinite loop", "while True: pass\n"),
    ("stdout flood", "import sys\nwhile True: sys.stdout.write('A' * 65536)\n"),
    ("read /etc/shadow", "print(open('/etc/shadow').read())\n"),
    ("read the host secret", "print(open(SECRET).read())\n"),
    (
        "connect to host loopback",
        "import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=1)\nprint('connected')\n",
    ),
    (
        "ptrace",
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "r = libc.ptrace(16, 1, 0, 0)\nprint('ptrace', r, os.strerror(ctypes.get_errno()))\n"
        "raise SystemExit(0 if r == 0 else 1)\n",
    ),
    ("kill every process", "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('still here')\n"),
    ("write to /usr", "open('/usr/agentrl-was-here', 'w').write('x')\n"),
]


def _median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def run_demo() -> int:
    """Runs the demonstration; returns 0 when every attack was contained."""
    import socket

    secret_dir = tempfile.mkdtemp(prefix="agentrl-demo-")
    secret = os.path.join(secret_dir, "secret.txt")
    with open(secret, "w") as f:
        f.write("host secret")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    bystander = subprocess.Popen(["sleep", "60"])
    limits = Limits(wall_time_s=2.0, cpu_time_s=1.0, memory_bytes=128 << 20, max_pids=32)
    contained = True
    print(f"{'attack':28} {'verdict':16} {'limit':10} {'host after':12}")
    print("-" * 72)
    try:
        with Sandbox(limits=limits) as sb:
            for name, src in _ATTACKS:
                src = src.replace("SECRET", repr(secret)).replace("PORT", str(port))
                r = sb.run_python(src)
                host_ok = bystander.poll() is None and not os.path.exists("/usr/agentrl-was-here")
                try:
                    listener.accept()[0].close()
                    host_ok = False
                except BlockingIOError:
                    pass
                leaked = b"host secret" in r.stdout or b"connected" in r.stdout
                good = host_ok and not leaked and not r.ok
                contained &= good
                mark = "contained" if good else "NOT CONTAINED"
                print(f"{name:28} {r.status.value:16} {r.limit or '-':10} {mark:12}")
            print()
            n = 100
            rows = [("agentrl box", _median_ms(lambda: sb.run(["/bin/true"]), n))]
            rows.append(("bare process", _median_ms(lambda: subprocess.run(["/bin/true"]), n)))
            bwrap = shutil.which("bwrap")
            if bwrap:
                cmd = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
                cmd += ["--tmpfs", "/tmp", "--unshare-all", "--die-with-parent", "/bin/true"]
                rows.append(
                    ("bubblewrap --unshare-all", _median_ms(lambda: subprocess.run(cmd), n))
                )
            print(f"/bin/true, median of {n} runs (subprocess rows include Python's spawn cost)")
            for label, ms in rows:
                print(f"  {label:28} {ms:7.2f} ms")
    finally:
        bystander.kill()
        bystander.wait()
        listener.close()
        shutil.rmtree(secret_dir, ignore_errors=True)
    print()
    print("every attack contained" if contained else "SOME ATTACK WAS NOT CONTAINED")
    return 0 if contained else 1


if __name__ == "__main__":
    sys.exit(run_demo())
