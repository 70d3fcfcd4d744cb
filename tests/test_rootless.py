"""Rootless mode: ``agentrl rootless -- CMD`` for a user without root (docs/deployment.md).

The tests that build boxes run as an unprivileged user with subordinate ids and
``newuidmap``: the guest matrix's ``rootless`` layout (``.ci/guest-matrix``: a Debian 6.1
guest whose user has a delegated ``user@UID.service``), or a developer's own account. Each runs
a real program under the launcher and checks the host afterwards: the boxes ran as the user's
subordinate ids, not as the user, and nothing of them is left. The launcher's own checks
(subordinate ids, the helpers, root) run everywhere.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from agentrl.sandbox import rootless
from conftest import TIME_SCALE


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


SUBUID = rootless.subordinate_ids("/etc/subuid", _user(), os.getuid())
CAN_LAUNCH = (
    os.geteuid() != 0
    and shutil.which("newuidmap") is not None
    and SUBUID is not None
    and rootless.subordinate_ids("/etc/subgid", _user(), os.getuid()) is not None
)
needs_user = pytest.mark.skipif(
    not CAN_LAUNCH,
    reason="needs an unprivileged user with subordinate ids and newuidmap (the guest "
    "matrix's rootless layout)",
)
DELEGATED = rootless.delegated_cgroup() is not None


def test_subordinate_ids_are_read_by_name_or_uid(tmp_path: Path) -> None:
    f = tmp_path / "subuid"
    f.write_text("root:1:2\nbad line\nalice:x:5\nalice:100000:65536\n4242:300000:1000\n")
    assert rootless.subordinate_ids(f, "alice", 1000) == (100000, 65536)
    assert rootless.subordinate_ids(f, "bob", 4242) == (300000, 1000)
    assert rootless.subordinate_ids(f, "bob", 1001) is None
    assert rootless.subordinate_ids(tmp_path / "missing", "alice", 1000) is None


def test_the_launcher_says_what_is_missing() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "agentrl", "rootless"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 70 and "Traceback" not in out.stderr, out.stderr
    [line] = out.stderr.splitlines()
    assert line == "agentrl rootless: no command given (use: agentrl rootless [--] CMD ...)"
    if os.geteuid() == 0:
        out = subprocess.run(
            [sys.executable, "-m", "agentrl", "rootless", "--", "/bin/true"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 70, out.stderr
        assert "this process is root already" in out.stderr, out.stderr


@needs_user
def test_without_the_launcher_the_line_names_it() -> None:
    from agentrl import Sandbox, SandboxError

    with pytest.raises(SandboxError) as e:
        Sandbox()
    msg = str(e.value)
    assert f"runs as uid {os.getuid()}, not root" in msg, msg
    assert "agentrl rootless -- CMD" in msg and "\n" not in msg, msg


# Run under the launcher: each case's verdict, and what the host can see of the boxes.
CASES = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from agentrl import Limits, Sandbox
    scale = float(sys.argv[1])
    degraded = sys.argv[2] == "degraded"
    out = {}
    def short(**kw):
        kw.setdefault("wall_time_s", 5.0 * scale)
        kw.setdefault("cpu_time_s", 2.0 * scale)
        return Limits(**kw)
    with Sandbox(max_concurrency=2, degraded=degraded) as sb:
        out["cgroup_version"] = sb.cgroup_version
        r = sb.run(["/bin/sh", "-c", "id -u; id -g; echo hi >/work/f; cat /work/f"])
        out["id"] = [r.status.value, r.stdout.decode()]
        r = sb.run([sb.python, "-c", "import sys; print(sys.argv)"])
        out["python_cold"] = [r.status.value, r.stdout.decode()]
        r = sb.run_python("import sys; print(sys.argv)")
        out["python_warm"] = [r.status.value, r.stdout.decode()]
        r = sb.run_python("x = bytearray(600 << 20); print(len(x))",
                          limits=short(memory_bytes=256 << 20))
        out["memory"] = [r.status.value, r.limit]
        r = sb.run_python("import os\\nwhile True:\\n    os.fork()", limits=short(max_pids=16))
        out["pids"] = [r.status.value, r.limit]
        r = sb.run_python("while True: pass", limits=short(cpu_time_s=0.5 * scale))
        out["cpu"] = [r.status.value, r.limit]
        r = sb.run(["/bin/sleep", "60"], limits=short(wall_time_s=0.5 * scale))
        out["wall"] = [r.status.value, r.limit]
        # The launcher's own files: not in the box (its root is a read-only system view).
        secret = sys.argv[3]
        r = sb.run(["/bin/sh", "-c", f"cat {secret}; echo tampered >{secret}"])
        out["secret"] = [r.status.value, r.stdout.decode()]
        # Seen from the host while it runs: the uid of a box's process.
        holder = {}
        t = threading.Thread(target=lambda: holder.setdefault(
            "r", sb.run(["/bin/sleep", str(4 * scale)], limits=short(wall_time_s=8 * scale))))
        t.start()
        print("BOX-SLEEPING", flush=True)
        t.join()
        out["sleep"] = holder["r"].status.value
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def _uids_of(comm: str) -> list[int]:
    uids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if (p / "comm").read_text().strip() != comm:
                continue
            for line in (p / "status").read_text().splitlines():
                if line.startswith("Uid:"):
                    uids.append(int(line.split()[1]))
        except OSError:
            continue
    return uids


@needs_user
@pytest.mark.parametrize("cgroup", ["delegated", "no-cgroup"])
def test_boxes_under_the_launcher_keep_every_limit_and_run_as_subordinate_ids(
    tmp_path: Path, cgroup: str
) -> None:
    if cgroup == "delegated" and not DELEGATED:
        pytest.skip("this process's cgroup is not delegated to this user")
    secret = tmp_path / "secret"
    secret.write_text("the launcher's own file\n")
    script = tmp_path / "cases.py"
    script.write_text(CASES)
    argv = [sys.executable, "-m", "agentrl", "rootless"]
    if cgroup == "no-cgroup":
        argv.append("--no-cgroup")
    mode = "degraded" if cgroup == "no-cgroup" else "full"
    argv += ["--", sys.executable, str(script), str(TIME_SCALE), mode, str(secret)]
    seen: list[int] = []
    lines = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        assert p.stdout is not None and p.stderr is not None
        for line in p.stdout:
            lines.append(line)
            if line.startswith("BOX-SLEEPING"):
                deadline = time.monotonic() + 3 * TIME_SCALE
                while not seen and time.monotonic() < deadline:
                    seen = _uids_of("sleep")
                    time.sleep(0.05)
        err = p.stderr.read()
        assert p.wait(timeout=300 * TIME_SCALE) == 0, "".join(lines) + err
    [result] = [json.loads(x[7:]) for x in lines if x.startswith("RESULT ")]

    # The same verdicts as on a root host.
    assert result["id"] == ["ok", "1000\n1000\nhi\n"], result
    assert result["python_cold"] == ["ok", "['-c']\n"], result
    assert result["python_warm"] == ["ok", "['__main__.py']\n"], result
    assert result["cpu"] == ["timeout", "cpu_time"], result
    assert result["wall"] == ["timeout", "wall_time"], result
    assert result["secret"][0] != "ok" and "launcher" not in result["secret"][1], result
    assert result["sleep"] == "ok", result
    if cgroup == "delegated":
        assert result["cgroup_version"] == "v2", result
    if result["cgroup_version"] is not None:
        # Without its own cgroup namespace, too, a delegated cgroup is found and used.
        assert result["memory"] == ["memory_limit", "memory"], result
        assert result["pids"][1] == "pids", result
    else:
        # rlimits only: an address-space limit (MemoryError) and RLIMIT_NPROC.
        assert result["memory"][0] in ("runtime_error", "memory_limit"), result
        assert result["pids"][0] != "ok", result

    # The host after: the box ran as one of the user's subordinate ids, never as the user.
    assert SUBUID is not None
    first, count = SUBUID
    assert seen, "no box process was found on the host while it slept"
    for uid in seen:
        assert first <= uid < first + count and uid != os.getuid(), (uid, SUBUID)
    assert secret.read_text() == "the launcher's own file\n"
    deadline = time.monotonic() + 10 * TIME_SCALE
    while [u for u in _uids_of("sleep") if first <= u < first + count]:
        assert time.monotonic() < deadline, "a box's process outlived its sandbox"
        time.sleep(0.1)
    own = rootless.delegated_cgroup()
    if own is not None:
        left = [p.name for p in own.parent.rglob("agentrl-*") if p.name != "agentrl-host"]
        assert left == [], left
