"""The Python API of the sandbox: validation, files, stdin, env, verdicts, concurrency.

The tests that take ``box`` run against both backends (the native one and nsjail's, the latter
skipped with the reason where nsjail is missing); ``run_py`` also covers the native backend's
warm and cold paths."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import agentrl
import pytest
from agentrl import AgentRLError, Bind, ExecResult, Limits, Sandbox, SandboxError, Status
from conftest import (
    CGROUP_V2,
    DEFAULT_LIMITS,
    TIME_SCALE,
    assert_host_clean,
    cgroup_kernel_version,
    is_nsjail,
    out,
    py,
    sh_in_box,
    wait_box_started,
    why,
)

FIELDS = [f.name for f in dataclasses.fields(Limits)]
FLOAT_FIELDS = ["wall_time_s", "cpu_time_s"]

# --- Limits ---------------------------------------------------------------------------------


def test_limits_defaults_and_replace():
    lim = Limits()
    assert (lim.wall_time_s, lim.cpu_time_s, lim.memory_bytes) == (10.0, 10.0, 512 << 20)
    assert (lim.max_pids, lim.max_output_bytes, lim.max_file_bytes) == (64, 1 << 20, 64 << 20)
    assert (lim.max_open_files, lim.tmpfs_bytes) == (256, 64 << 20)
    new = lim.replace(wall_time_s=2, max_pids=8)
    assert new.wall_time_s == 2.0 and isinstance(new.wall_time_s, float) and new.max_pids == 8
    assert lim.wall_time_s == 10.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        lim.max_pids = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="max_pids"):
        lim.replace(max_pids=0)


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("bad", [0, -1])
def test_limits_non_positive_rejected(field, bad):
    with pytest.raises(ValueError, match=field):
        Limits(**{field: bad})


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("bad", [True, False, "5", None, [1]])
def test_limits_wrong_type_rejected(field, bad):
    with pytest.raises(TypeError, match=field):
        Limits(**{field: bad})


@pytest.mark.parametrize("field", FIELDS)
def test_limits_out_of_range_rejected(field):
    bads = [float("nan"), float("inf"), 1e9] if field in FLOAT_FIELDS else [1 << 63, 1.5]
    for bad in bads:
        with pytest.raises((ValueError, TypeError), match=field):
            Limits(**{field: bad})


@pytest.mark.parametrize(
    "field, bad, reason",
    [
        ("memory_bytes", (8 << 20) - 1, "must be at least 8 MiB, got 8388607 bytes"),
        ("tmpfs_bytes", 1 << 10, "must be at least 64 KiB, got 1 KiB"),
        ("max_open_files", 3, "must be at least 16, got 3"),
        ("max_pids", (1 << 22) + 1, "must be at most 4194304, got 4194305"),
        ("wall_time_s", 1e9, "must be at most 86400 seconds, got 1000000000"),
        ("cpu_time_s", float("nan"), "must be a positive number of seconds, got NaN"),
        ("max_pids", 0, "must be positive, got 0"),
        ("max_pids", -1, "must be positive, got -1"),
    ],
)
def test_limits_are_checked_once_by_the_core_and_name_the_field(field, bad, reason):
    # One set of rules (the Rust core's), one message style, and a field a front end can map
    # to its own option: the error is agentrl.InvalidArgument, a ValueError.
    with pytest.raises(agentrl.InvalidArgument) as e:
        Limits(**{field: bad})
    assert isinstance(e.value, ValueError)
    assert (e.value.field, e.value.reason) == (field, reason)
    assert str(e.value) == f"Limits.{field} {reason}"


def test_limits_memory_floor_keeps_the_host_safe():
    # Below the floor a cgroup OOM kill during the box's execve could hit the host process.
    with pytest.raises(ValueError, match="memory_bytes must be at least 8 MiB"):
        Limits(memory_bytes=(8 << 20) - 1)
    assert Limits(memory_bytes=8 << 20).memory_bytes == 8 << 20


@pytest.mark.parametrize("warm", [True, False])
def test_smallest_memory_limit_contains_a_hog_and_the_host_lives(warm):
    with Sandbox(limits=Limits(memory_bytes=8 << 20), max_concurrency=1, warm=warm) as sb:
        ok = sb.run_python("print(1)")
        hog = sb.run_python("b = bytearray(64 << 20)\nprint(len(b))")
    assert ok.ok and ok.stdout == b"1\n"
    assert hog.status is Status.MEMORY_LIMIT and hog.stdout == b""
    # the host process (this one) is still here to see the verdicts


@pytest.mark.parametrize("warm", [True, False])
def test_a_runs_tmpfs_is_freed_before_the_next_run(warm):
    # A cold run's file system is freed after its verdict has been delivered, off the
    # caller's critical path, but always before the slot's next run: its pages must not
    # count against the next run's memory limit or show in its peak.
    lim = Limits(memory_bytes=64 << 20, tmpfs_bytes=96 << 20)
    fill = "open('/tmp/f', 'wb').write(bytes(40 << 20)); print('filled')"
    hog = "b = bytearray(40 << 20); print(len(b))"
    with Sandbox(limits=lim, max_concurrency=1, warm=warm) as sb:
        run = sb.run_python if warm else (lambda src: sb.run([sys.executable, "-c", src]))
        for _ in range(3):
            f = run(fill)
            assert f.ok and f.stdout == b"filled\n", why(f)
            # Where the kernel gives only a lower bound (cgroup v2 before 6.12), not checked.
            assert f.peak_memory_bytes >= 40 << 20 or not f.peak_memory_exact
            h = run(hog)
            assert h.ok and h.stdout == b"41943040\n", why(h)
            assert h.peak_memory_bytes < 60 << 20, h.peak_memory_bytes


def test_runs_with_other_tmpfs_sizes_and_session_steps_between_get_their_own_tmpfs():
    # A slot makes the next run's tmpfs ahead, like the last ordinary run's; runs with another
    # size, and session steps (their own work dir and host id), must still get their own.
    probe = (
        "import os; s = os.statvfs('/tmp'); print(s.f_blocks * s.f_frsize >> 20,"
        " sorted(os.listdir('.')), sorted(os.listdir('/tmp')));"
        " open('/tmp/left', 'w').write('x'); open('left', 'w').write('x')"
    )
    with Sandbox(max_concurrency=1) as sb, sb.session({"mine.txt": "s"}) as session:
        for mib in (8, 8, 16, 8, 16, 16):
            lim = DEFAULT_LIMITS.replace(tmpfs_bytes=mib << 20)
            r = sb.run([sys.executable, "-c", probe], files={"in.txt": "i"}, limits=lim)
            assert r.ok and r.stdout == f"{mib} ['in.txt'] []\n".encode(), why(r)
            st = session.run(["sh", "-c", "ls; ls /tmp"])
            assert st.ok and st.stdout == b"mine.txt\n", why(st)


# --- argument validation --------------------------------------------------------------------


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
def test_bad_argv(box, argv, exc):
    with pytest.raises(exc):
        box.run(argv)


BAD_PATHS = ["../x", "/etc/x", "a/../../x", "", ".", "./", "a\0b", "x" * 256]


@pytest.mark.parametrize("name", BAD_PATHS)
def test_bad_file_names_rejected(box, name):
    with pytest.raises(ValueError):
        box.run(["/bin/true"], files={name: b"x"})
    with pytest.raises(ValueError):
        box.run(["/bin/true"], collect=[name])


@pytest.mark.parametrize("env", [{"A\0": "x"}, {"A": "x\0y"}, {"": "x"}, {"A=B": "x"}])
def test_bad_env_rejected(box, env):
    with pytest.raises(ValueError):
        box.run(["/bin/true"], env=env)
    with pytest.raises(ValueError):
        type(box)(env=env)


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
def test_wrong_types_rejected(box, kwargs):
    with pytest.raises(TypeError):
        box.run(["/bin/true"], **kwargs)


def test_bad_cwd_and_sandbox_arguments(box):
    for cwd in ("../x", "a/../../x", "/work/../etc", "a\0b"):
        with pytest.raises(ValueError):
            box.run(["/bin/true"], cwd=cwd)
    with pytest.raises(TypeError):
        box.run_python(b"print(1)")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"__main__\.py"):
        box.run_python("print(1)", files={"__main__.py": "x"})
    big = {"big": b"x" * (128 << 10)}  # input files larger than the run's tmpfs
    with pytest.raises(ValueError, match="files"):
        box.run(["/bin/true"], files=big, limits=DEFAULT_LIMITS.replace(tmpfs_bytes=64 << 10))
    kind = type(box)
    with pytest.raises(TypeError):
        kind(limits={"wall_time_s": 1})  # type: ignore[arg-type]
    for mc, exc in ((0, ValueError), (5000, ValueError), (True, TypeError), ("2", TypeError)):
        with pytest.raises(exc):
            kind(max_concurrency=mc)
    for target in ("/proc/x", "/work", "/etc", "/", "relative"):
        with pytest.raises(ValueError):
            kind(binds=[("/usr", target)])
    # A flag that is not a bool is refused, never read for its truth: network="no" would
    # otherwise share the host network, degraded="false" drop the cgroup limits.
    for kw in (
        {"network": "no"},
        {"network": 1},
        {"degraded": "false"},
        {"warm": None},
        {"binds": 5},
        {"binds": "/usr"},
        {"preimports": 5},
        {"preimports": "json"},
        {"cgroup_parent": 5},
        {"python": 5},
    ):
        (name,) = kw
        with pytest.raises(TypeError, match=name):
            kind(**kw)
    for bind in (("/usr/share", "/data", "no"), ("/usr/share", "/data", 1)):
        with pytest.raises(TypeError, match="writable"):  # never a writable bind by accident
            kind(binds=[bind])
    with pytest.raises(TypeError, match="writable"):
        Bind("/usr/share", writable="no")  # type: ignore[arg-type]
    assert issubclass(SandboxError, AgentRLError) and issubclass(AgentRLError, Exception)


def test_binds_read_only_and_writable(box, tmp_path):
    private = tmp_path / "private"  # under pytest's 0700 tmp dir: not reachable by the box user
    private.mkdir()
    (private / "data.txt").write_text("from the host")
    shared = Path(f"/tmp/agentrl-rw-{os.urandom(4).hex()}")
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    src = """
    print(open("/data/data.txt").read())
    try: open("/data/new", "w"); print("WROTE")
    except OSError as e: print("ERR", e.errno)
    with open("/shared/out.txt", "w") as f: f.write("from the box")
    """
    try:
        binds = [Bind(str(private), "/data"), (str(shared), "/shared", True)]
        with type(box)(DEFAULT_LIMITS, binds=binds) as other:
            r = py(other, src)
        assert r.ok and out(r).split("\n")[:2] == ["from the host", f"ERR {errno.EROFS}"], why(r)
        assert (shared / "out.txt").read_text() == "from the box"
        assert not (private / "new").exists()
    finally:
        for f in shared.iterdir():
            f.unlink()
        shared.rmdir()


# --- files, stdin, cwd, env -----------------------------------------------------------------


def test_files_nested_and_collect_round_trip(box):
    blob = os.urandom(100_000)
    src = """
    import os
    print(open("a/b/c.txt").read(), open("top.txt").read(), len(open("bin.dat", "rb").read()))
    with open("a/b/c.txt", "a") as f: f.write("+box")
    os.makedirs("out/deep", exist_ok=True)
    with open("out/deep/r.bin", "wb") as f: f.write(open("bin.dat", "rb").read()[::-1])
    """
    r = py(
        box,
        src,
        files={"a/b/c.txt": "nested", "top.txt": b"top", "bin.dat": blob},
        collect=["a/b/c.txt", "out/deep/r.bin", "missing.txt", "./top.txt"],
    )
    assert r.ok and out(r).split() == ["nested", "top", "100000"], why(r)
    assert r.files["a/b/c.txt"] == b"nested+box"
    assert r.files["out/deep/r.bin"] == blob[::-1]
    assert "missing.txt" not in r.files and r.truncated_files == ()
    assert r.files["./top.txt"] == b"top"  # under the name it was asked for


def test_collected_file_capped_at_max_file_bytes(box):
    lim = DEFAULT_LIMITS.replace(max_file_bytes=4096)
    files = {"in.bin": os.urandom(8192), "small": b"s"}
    r = box.run(["/bin/true"], files=files, collect=["in.bin", "small"], limits=lim)
    assert r.ok and r.files["in.bin"] == files["in.bin"][:4096] and r.files["small"] == b"s"
    assert r.truncated_files == ("in.bin",), why(r)


@pytest.mark.parametrize(
    "stdin, expect",
    [
        (b"\x00\xffbinary\n", b"\x00\xffbinary\n"),
        ("h\u00e9llo \u2603", "h\u00e9llo \u2603".encode()),
    ],
)
def test_stdin_bytes_and_str(box, stdin, expect):
    r = box.run(["/bin/cat"], stdin=stdin)
    assert r.ok and r.stdout == expect, why(r)


def test_large_stdin_round_trip(box):
    data = os.urandom(3 << 20)
    src = "import hashlib, sys\nprint(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"
    r = py(box, src, stdin=data)
    assert r.ok and out(r).strip() == hashlib.sha256(data).hexdigest(), why(r)


def test_cwd_relative_absolute_and_missing(box):
    r = box.run(["/bin/sh", "-c", "pwd; cat f"], files={"sub/dir/f": "here"}, cwd="sub/dir")
    assert r.ok and r.stdout == b"/work/sub/dir\nhere", why(r)
    r = box.run(["/bin/pwd"], cwd="/tmp")
    assert r.ok and r.stdout == b"/tmp\n", why(r)
    for cwd, path in (("nope/x", "/work/nope/x"), ("/nope", "/nope"), ("f", "/work/f")):
        r = box.run(["/bin/pwd"], cwd=cwd, files={"f": "a file"})  # the caller's mistake
        assert r.status is Status.RUNTIME_ERROR and r.exit_code == 126, why(r)
        assert r.stderr.startswith(f"agentrl: cannot enter the working directory {path}: ".encode())


def test_env_passed_and_host_env_absent(box, monkeypatch):
    monkeypatch.setenv("AGENTRL_HOST_ONLY", "leak")
    src = "import json, os\nprint(json.dumps(dict(os.environ)))"
    with type(box)(DEFAULT_LIMITS, env={"BOX_LEVEL": "1", "SHARED": "box"}) as other:
        r = other.run([other.python, "-c", src], env={"RUN_LEVEL": "2", "SHARED": "run"})
    env = json.loads(r.stdout)
    assert r.ok and env["BOX_LEVEL"] == "1" and env["RUN_LEVEL"] == "2", why(r)
    assert env["SHARED"] == "run" and "AGENTRL_HOST_ONLY" not in env
    assert env["HOME"] == "/work" and env["TMPDIR"] == "/tmp"
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "USER", "PYTHONDONTWRITEBYTECODE"} | {
        "BOX_LEVEL",
        "RUN_LEVEL",
        "SHARED",
        "LC_CTYPE",
    }


def test_argv_types_bytes_and_pathlike(box):
    r = box.run([Path("/bin/echo"), b"b\xffytes", "str"])
    assert r.ok and r.stdout == b"b\xffytes str\n", why(r)


# --- verdicts -------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 3, 42, 137, 255])
def test_exit_codes(box, code):
    r = box.run(["/bin/sh", "-c", f"echo out; echo err >&2; exit {code}"])
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
def test_signaled(run_py, source, sig):
    r = run_py(source + "\nprint('still alive')")
    assert r.status is Status.SIGNALED and r.signal == sig and r.exit_code is None, why(r)
    assert b"still alive" not in r.stdout


def test_file_size_limit_reported(box):
    lim = DEFAULT_LIMITS.replace(max_file_bytes=1 << 20)
    r = box.run(["dd", "if=/dev/zero", "of=big", "bs=1M", "count=2"], limits=lim)
    assert r.status is Status.SIGNALED and r.signal == signal.SIGXFSZ, why(r)
    assert r.limit == "file_size", why(r)


@pytest.mark.parametrize("argv", [["agentrl-no-such-command"], ["/work/nope"], ["/etc/passwd"]])
def test_command_not_found(box, argv):
    r = box.run(argv)
    assert r.status is Status.RUNTIME_ERROR and r.exit_code == 127, why(r)
    assert r.stderr.startswith(b"agentrl: cannot execute " + argv[0].encode() + b": "), why(r)
    assert r.stderr.endswith(b")\n") and b"(os error " in r.stderr, why(r)


def test_per_run_limits_override(box):
    r = py(box, "import time; time.sleep(5)", limits=DEFAULT_LIMITS.replace(wall_time_s=0.3))
    assert r.status is Status.TIMEOUT and r.limit == "wall_time" and r.wall_time_s < 2, why(r)
    r = py(box, "import time; time.sleep(0.5); print('ok')")  # the sandbox default is back
    assert r.ok and r.stdout == b"ok\n", why(r)
    with type(box)(DEFAULT_LIMITS.replace(wall_time_s=0.3)) as other:
        r = other.run(["sleep", "5"])
        assert r.status is Status.TIMEOUT, why(r)
        r = other.run(["sleep", "0.5"], limits=DEFAULT_LIMITS)
        assert r.ok, why(r)


def test_a_wall_limit_that_passes_during_start_up_still_kills(box):
    """A wall limit shorter than the box's own start-up: the kill comes while the box is being
    set up (for nsjail: before its jail has joined the run's cgroup) and must still land then,
    not at some later backstop (nsjail's own whole-second --time_limit)."""
    limits = DEFAULT_LIMITS.replace(wall_time_s=0.02)
    for _ in range(10):
        r = box.run(["sleep", "5"], limits=limits)
        assert r.status is Status.TIMEOUT and r.limit == "wall_time", why(r)
        assert r.wall_time_s < 1.0 * TIME_SCALE, why(r)


def _exact_peak_expected(path: str) -> bool:
    """Whether this kernel gives a run on ``path`` an exact per-run peak: cgroup v1; v2 from
    Linux 6.12 on (where a write to ``memory.peak`` resets it for the writer's fd); for a cold
    run, v2 from 5.19 on (``memory.peak`` exists: the run gets a fresh cgroup of its own)."""
    if not CGROUP_V2:
        return True
    return cgroup_kernel_version() >= ((5, 19) if path == "cold" else (6, 12))


@pytest.mark.parametrize("path", ["cold", "warm"])
def test_peak_memory_is_per_run_and_says_whether_exact(box, path):
    """A run's peak is its own: a small run after a 64 MiB one reports a small peak (a
    lower bound, flagged as such, where the kernel cannot reset the counter)."""
    big = "b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096])"
    run = (
        (lambda src: box.run(["python3", "-c", src]))
        if path == "cold"
        else (lambda src: box.run_python(src))
    )
    r = run(big)
    assert r.ok and r.peak_memory_bytes is not None, why(r)
    assert r.peak_memory_bytes >= 64 << 20, r.peak_memory_bytes
    small = run("print(1)")
    assert small.ok and small.peak_memory_bytes is not None, why(small)
    assert small.peak_memory_bytes < 32 << 20, small.peak_memory_bytes
    # The nsjail backend gives every run a fresh cgroup: exact on every kernel.
    assert small.peak_memory_exact is (is_nsjail(box) or _exact_peak_expected(path))


def test_result_fields_and_summary(box):
    r = py(box, "import sys; sys.stdout.write('x'); sys.stderr.write('y')")
    assert isinstance(r, ExecResult) and r.ok and r.status == "ok" and str(r.status) == "ok"
    assert (r.stdout, r.stderr, r.exit_code, r.signal) == (b"x", b"y", 0, None)
    assert not r.stdout_truncated and not r.stderr_truncated and r.error is None
    assert 0 < r.wall_time_s < 5 and 0 <= r.cpu_time_s < 5
    assert r.peak_memory_bytes is not None and 0 < r.peak_memory_bytes < DEFAULT_LIMITS.memory_bytes
    assert r.denied_syscalls == () and r.files == {} and r.limit is None
    assert r.summary().startswith("status=ok exit=0")
    assert {s.value for s in Status} == {
        "ok",
        "runtime_error",
        "signaled",
        "timeout",
        "memory_limit",
        "output_limit",
        "sandbox_error",
    }


def test_sandbox_properties(sb):
    assert sb.cgroup_version in ("v1", "v2")
    # The interpreter as the box sees it: at its own path, or at /.agentrl/py/N when it is
    # installed under a directory the box makes for itself (a venv under /work or /tmp).
    assert sb.python == sys.executable or sb.python.startswith("/.agentrl/py/"), sb.python
    for python in (sb.python, sys.executable):
        r = sb.run([python, "-c", "import sys; print(sys.executable)"])
        assert r.ok and r.stdout.decode().strip() == sb.python, why(r)
    assert sb.limits == DEFAULT_LIMITS and sb.network is False
    assert "open" in repr(sb)


def test_arun_from_asyncio(box):
    async def main():
        return await asyncio.gather(*(box.arun(["/bin/echo", str(i)]) for i in range(4)))

    results = asyncio.run(main())
    assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(4)]


# --- concurrency and lifecycle --------------------------------------------------------------

ISOLATION = r"""
tok=$(cat tok)
before=$(find /work /tmp /dev/shm -mindepth 1 | sort | tr '\n' ' ')
for d in /work /tmp /dev/shm; do echo "$tok" > "$d/m-$tok"; done
sleep 0.01
echo "$tok|$before|$(cat /tmp/* /dev/shm/* | tr '\n' ' ')"
"""


def test_concurrent_runs_are_isolated(sb):
    errors: list[str] = []

    def worker(t: int) -> None:
        for i in range(10):
            tok = f"t{t}-{i}"
            r = sb.run(["/bin/sh", "-c", ISOLATION], files={"tok": tok})
            if not r.ok or out(r).strip() != f"{tok}|/work/tok |{tok} {tok}":
                errors.append(why(r))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    # 160 runs on 16 threads: a minute is a stall, not load (scaled for the emulated guests).
    assert time.monotonic() - t0 < 60 * TIME_SCALE
    assert_host_clean()


def test_runs_while_host_is_multithreaded(sb):
    stop = threading.Event()

    def busy() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    threads = [threading.Thread(target=busy) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        results = [sb.run(["/bin/echo", str(i)]) for i in range(20)]
        results.append(py(sb, "import threading; print(threading.active_count())"))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert all(r.ok for r in results), [why(r) for r in results if not r.ok]
    assert [r.stdout for r in results[:20]] == [f"{i}\n".encode() for i in range(20)]
    assert results[-1].stdout == b"1\n"


def test_context_manager_and_close():
    with Sandbox(DEFAULT_LIMITS) as box:
        assert box.run(["/bin/true"]).ok
    assert "closed" in repr(box)
    with pytest.raises(SandboxError):
        box.run(["/bin/true"])
    with pytest.raises(SandboxError):
        box.run_python("print(1)")
    box.close()  # idempotent
    box2 = Sandbox(DEFAULT_LIMITS)
    box2.close()
    with pytest.raises(SandboxError):
        box2.run(["/bin/true"])


def test_close_waits_for_runs_in_flight():
    box = Sandbox(DEFAULT_LIMITS)
    results = []
    t = threading.Thread(target=lambda: results.append(box.run(["sleep", "0.5"])))
    t.start()
    time.sleep(0.2)
    box.close()
    t.join()
    assert len(results) == 1 and results[0].ok, results
    assert_host_clean()


def test_host_process_stays_dumpable() -> None:
    """The spawn path switches uids (which clears the process's dumpable flag) and restores it:
    the host keeps its core dumps and stays debuggable."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_get_dumpable, pr_set_dumpable = 3, 4
    libc.prctl(pr_set_dumpable, 1, 0, 0, 0)
    with Sandbox() as box:
        for _ in range(5):
            assert box.run(["/bin/true"]).ok
            assert box.run_python("pass").ok
        assert libc.prctl(pr_get_dumpable, 0, 0, 0, 0) == 1


_INTERRUPTED = """
import sys, time
from agentrl import Limits, Sandbox
sb = Sandbox(max_concurrency=1)
print("ready", flush=True)
t0 = time.monotonic()
try:
    sb.run(["sleep", "30"], limits=Limits(wall_time_s=60, cpu_time_s=60))
    print("finished", flush=True)
except KeyboardInterrupt:
    print(f"interrupted {time.monotonic() - t0:.2f}", flush=True)
assert sb.run(["/bin/true"]).ok  # the sandbox goes on
sb.close()
"""


@pytest.mark.parametrize("warm", [False, True])
def test_ctrl_c_interrupts_a_blocking_run_and_kills_its_box(warm):
    source = _INTERRUPTED
    if warm:
        source = source.replace(
            'sb.run(["sleep", "30"],', 'sb.run_python("import time; time.sleep(30)",'
        )
    p = subprocess.Popen([sys.executable, "-c", source], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"
    wait_box_started()
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=20)
    assert p.returncode == 0
    word, seconds = out.split()[:2]
    assert word == "interrupted" and float(seconds) < 10, out
    assert_host_clean()


# --------------------------------------------------------------------------------------------
# Live output (tee).


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


@pytest.mark.parametrize("path", ["cold", "warm"])
def test_tee_shows_output_while_the_run_goes_on(sb, path):
    """A copy of the output reaches the tee fds while the program still runs, each stream on
    its own fd, and equals what the verdict keeps."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    got: dict[str, object] = {}

    def watch() -> None:
        # The first line arrives before the program's sleep ends.
        ready = select.select([out_r], [], [], 20 * TIME_SCALE)[0]
        got["first_at"] = time.monotonic() if ready else None

    t = threading.Thread(target=watch)
    t.start()
    script = "echo first; echo oops >&2; sleep 1.5; echo second"
    t0 = time.monotonic()
    try:
        r = sh_in_box(sb, path, script, tee=(out_w, err_w))
    finally:
        os.close(out_w)
        os.close(err_w)
    end = time.monotonic()
    t.join()
    assert r.status == "ok", why(r)
    assert got["first_at"] is not None and got["first_at"] < end - 1.0, (got, t0, end)
    assert _read_all(out_r) == r.stdout == b"first\nsecond\n", why(r)
    assert _read_all(err_r) == r.stderr == b"oops\n", why(r)


def test_tee_keeps_the_order_of_the_two_streams_and_the_cap(sb):
    r_fd, w_fd = os.pipe()
    script = "echo a; sleep 0.2; echo b >&2; sleep 0.2; echo c; head -c 300000 /dev/zero"
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(_read_all(r_fd)))
    reader.start()
    try:
        r = sb.run(
            ["/bin/sh", "-c", script],
            tee=(w_fd, w_fd),
            limits=dataclasses.replace(DEFAULT_LIMITS, max_output_bytes=100_000),
        )
    finally:
        os.close(w_fd)
    reader.join(timeout=30)
    [both] = got
    assert r.status == "output_limit" and r.stdout_truncated, why(r)
    assert both.startswith(b"a\nb\nc\n"), both[:20]
    # What the tee shows is what the verdict keeps: the capped stdout and all of stderr.
    assert len(both) == len(r.stdout) + len(r.stderr) == 100_000 + 2, len(both)


def test_tee_to_a_reader_that_never_reads_holds_the_verdict_up_only_briefly(sb):
    # More than a pipe holds: the writer blocks, the verdict comes after a bounded wait
    # (rust/sandbox/src/tee.rs, FINISH_WAIT: 5 s), and the reader still gets it all later.
    r_fd, w_fd = os.pipe()
    try:
        t0 = time.monotonic()
        r = sb.run(["/bin/sh", "-c", "head -c 200000 /dev/zero"], tee=(w_fd, w_fd))
        took = time.monotonic() - t0
    finally:
        os.close(w_fd)
    assert r.status == "ok" and len(r.stdout) == 200_000, why(r)
    assert took < 5 + 5 * TIME_SCALE, took
    assert len(_read_all(r_fd)) == 200_000


def test_tee_to_a_reader_that_went_away_does_not_stall_the_run(sb):
    r_fd, w_fd = os.pipe()
    os.close(r_fd)
    try:
        r = sb.run(["/bin/sh", "-c", "echo x; echo y >&2"], tee=(w_fd, w_fd))
    finally:
        os.close(w_fd)
    assert r.status == "ok" and r.stdout == b"x\n" and r.stderr == b"y\n", why(r)


@pytest.mark.parametrize(
    ("tee", "error"),
    [((1,), TypeError), ([1, 2], TypeError), ((1, "2"), TypeError), ((-1, 2), ValueError)],
)
def test_a_bad_tee_is_refused_by_name(sb, tee, error):
    with pytest.raises(error, match="tee"):
        sb.run(["/bin/true"], tee=tee)


def test_tee_of_a_closed_fd_is_refused_by_name(sb):
    r_fd, w_fd = os.pipe()
    os.close(r_fd)
    os.close(w_fd)
    with pytest.raises(ValueError, match="tee: fd"):
        sb.run(["/bin/true"], tee=(w_fd, w_fd))


def test_the_nsjail_backend_refuses_tee(nj):
    with pytest.raises(ValueError, match="tee"):
        nj.run(["/bin/true"], tee=(1, 2))
