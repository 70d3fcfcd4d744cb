"""Persistent sessions: the work dir persists, processes do not; reset and branches."""

from __future__ import annotations

import pytest
from agentrl import Limits, Sandbox, SandboxError, Status
from conftest import assert_host_clean, why


def test_persistence_reset_snapshot_restore(sb: Sandbox) -> None:
    files = {f"data/f{i}.txt": bytes([65 + i % 26]) * 100_000 for i in range(100)}
    with sb.session(files) as s:
        r = s.run(["sh", "-c", "ls data | wc -l; cat data/f1.txt | wc -c; echo one > a.txt"])
        assert r.ok and r.stdout == b"100\n100000\n", why(r)
        assert s.run(["cat", "a.txt"]).stdout == b"one\n"
        snap = s.snapshot()
        assert s.run(["sh", "-c", "rm -r data a.txt; echo two > b.txt"]).ok
        assert s.run(["ls"]).stdout == b"b.txt\n"
        s.reset()
        assert s.run(["ls"]).stdout == b"a.txt\ndata\n", "reset returns to the last snapshot"
        s.run(["sh", "-c", "echo branch-1 > a.txt"])
        branch1 = s.snapshot()
        s.restore(snap)
        assert s.run(["cat", "a.txt"]).stdout == b"one\n"
        s.restore(branch1)
        assert s.run(["cat", "a.txt"]).stdout == b"branch-1\n"
        assert s.steps == 8


def test_sessions_are_private(sb: Sandbox) -> None:
    with sb.session({"secret.txt": "mine"}) as a, sb.session() as b:
        assert a.run(["cat", "secret.txt"]).stdout == b"mine"
        r = b.run(["sh", "-c", "ls -A; cat secret.txt"])
        assert r.stdout == b"" and r.exit_code == 1, why(r)
        plain = sb.run(["ls", "-A"])
        assert plain.stdout == b"", why(plain)


def test_no_process_survives_a_step(sb: Sandbox) -> None:
    with sb.session() as s:
        r = s.run(["sh", "-c", "sleep 60 & echo started"])
        assert r.ok and r.stdout == b"started\n"
        assert_host_clean()
        r = s.run(["sh", "-c", "for p in /proc/[0-9]*; do cat $p/comm; done"])
        assert r.ok and b"sleep" not in r.stdout and b"sh" in r.stdout, why(r)


def test_collect_and_symlinks(sb: Sandbox) -> None:
    with sb.session() as s:
        r = s.run(
            ["sh", "-c", "echo ok > out.txt; ln -s /etc/passwd link; ln -s /proc/1/root root"],
            collect=["out.txt", "link", "root"],
        )
        assert r.files == {"out.txt": b"ok\n"}, why(r)


def test_run_python_step(sb: Sandbox) -> None:
    with sb.session() as s:
        assert s.run_python("open('state', 'w').write('3')").ok
        r = s.run_python("print(int(open('state').read()) * 2)")
        assert r.stdout == b"6\n", why(r)
        # As `python -c` in the repo on a host: the work dir's modules import, env applies.
        assert s.run_python("open('helper.py', 'w').write('X = 7')").ok
        r = s.run_python(
            "import helper, os, sys; print(helper.X, os.environ['PYTHONHASHSEED'], sys.path[0])",
            env={"PYTHONHASHSEED": "3"},
        )
        assert r.stdout == b"7 3 \n", why(r)


def test_cpu_budget_and_disk_limit(sb: Sandbox) -> None:
    limits = Limits(wall_time_s=5, cpu_time_s=5)
    with sb.session(limits=limits, cpu_budget_s=0.4, disk_bytes=1 << 20) as s:
        r = s.run(["sh", "-c", "head -c 4000000 /dev/zero > big"])
        assert r.exit_code != 0 and b"No space left" in r.stderr, why(r)
        r = s.run(["sh", "-c", "while :; do :; done"])
        assert (r.status, r.limit) == (Status.TIMEOUT, "cpu_time"), why(r)
        assert r.cpu_time_s < 1.0
        with pytest.raises(SandboxError, match="budget"):
            s.run(["true"])


def test_closed_session_and_bad_arguments(sb: Sandbox) -> None:
    s = sb.session()
    s.close()
    s.close()
    with pytest.raises(SandboxError):
        s.run(["true"])
    with pytest.raises(ValueError, match="escapes"):
        sb.session({"../x": "1"})
    with pytest.raises(ValueError, match="cpu_budget_s"):
        sb.session(cpu_budget_s=0)
    with pytest.raises(TypeError):
        sb.session(disk_bytes="1M")  # type: ignore[arg-type]
    with sb.session() as a, sb.session() as b:
        snap = a.snapshot()
        with pytest.raises(ValueError, match="another session"):
            b.restore(snap)
