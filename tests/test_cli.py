"""``agentrl run``: the program's output, a one-line verdict, and an exit status for each verdict;
mistakes on the command line get one line and status 2, never a traceback.

Every test runs the real command (``python -m agentrl run ...``) in a child process."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agentrl.sandbox.limits import parse_duration, parse_size
from conftest import SESSION_MARK, assert_host_clean

pytestmark = pytest.mark.usefixtures("clean_host")


def agentrl_run(
    *args: str, stdin: bytes = b"", cwd: Path | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "AGENTRL_TEST_MARK": SESSION_MARK}
    return subprocess.run(
        [sys.executable, "-m", "agentrl", "run", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        env=env,
        cwd=cwd,
        check=False,
    )


def verdict(p: subprocess.CompletedProcess) -> str:
    """The verdict line (the last line of stderr)."""
    lines = p.stderr.decode(errors="replace").strip().splitlines()
    assert lines and lines[-1].startswith("[agentrl] status="), p.stderr
    return lines[-1]


def test_ok_passes_output_through_and_exits_0():
    p = agentrl_run("--", "/bin/sh", "-c", "echo out; echo err >&2")
    assert p.returncode == 0 and p.stdout == b"out\n", p
    assert p.stderr.startswith(b"err\n") and verdict(p).startswith("[agentrl] status=ok exit=0")


@pytest.mark.parametrize(
    "args, status, code, limit",
    [
        (["--", "/bin/sh", "-c", "exit 3"], "runtime_error", 3, None),
        (["--", "/bin/sh", "-c", "kill -SEGV $$"], "signaled", 128 + 11, None),
        (["--wall", "300ms", "--", "sleep", "5"], "timeout", 124, "wall_time"),
        (
            ["--cpu", "200ms", "--", "/bin/sh", "-c", "while :; do :; done"],
            "timeout",
            124,
            "cpu_time",
        ),
        (
            ["--mem", "64M", "--", sys.executable, "-c", "b = b'x' * (256 << 20)"],
            "memory_limit",
            137,
            "memory",
        ),
        (["--output", "1K", "--", "/bin/sh", "-c", "yes"], "output_limit", 125, "output"),
        # The shell cannot fork past --pids, says so and exits 2.
        (
            ["--pids", "4", "--", "/bin/sh", "-c", "for i in 1 2 3 4 5 6; do sleep 1 & done"],
            "runtime_error",
            2,
            "pids",
        ),
    ],
    ids=["exit-3", "segv", "wall", "cpu", "memory", "output", "pids"],
)
def test_each_verdict_has_its_exit_status(args, status, code, limit):
    p = agentrl_run(*args)
    line = verdict(p)
    assert line.startswith(f"[agentrl] status={status}"), line
    assert p.returncode == code, (p.returncode, line)
    assert (f"limit={limit}" in line) if limit else "limit=" not in line, line


def test_files_stdin_and_collect(tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes(b"from the host\n")
    p = agentrl_run(
        "--file",
        f"data/in.txt={src}",
        "--collect",
        "out.txt",
        "--stdin",
        "-",
        "--",
        "/bin/sh",
        "-c",
        "cat data/in.txt; cat; echo made > out.txt",
        stdin=b"piped\n",
    )
    assert p.returncode == 0 and p.stdout == b"from the host\npiped\n", p
    assert b"[collected out.txt: 5 bytes]" in p.stderr


def test_collected_files_written_under_out_dir(tmp_path):
    out = tmp_path / "out"
    p = agentrl_run(
        "--collect",
        "res/a.txt",
        "--collect",
        "missing",
        "--out-dir",
        str(out),
        "--",
        "/bin/sh",
        "-c",
        "mkdir res; echo result > res/a.txt",
    )
    assert p.returncode == 0, p
    assert (out / "res" / "a.txt").read_bytes() == b"result\n"
    assert sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_file()) == ["res/a.txt"]


def test_no_network_unless_asked(tcp_listener):
    port = tcp_listener.getsockname()[1]
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('C')"
    p = agentrl_run("--", sys.executable, "-c", code)
    assert p.returncode == 1 and b"C" not in p.stdout, p
    assert not select.select([tcp_listener], [], [], 0.2)[0], "the host listener got a connection"
    p = agentrl_run("--net", "--", sys.executable, "-c", code)
    assert p.returncode == 0 and p.stdout == b"C\n", p
    assert select.select([tcp_listener], [], [], 2)[0]
    tcp_listener.accept()[0].close()


@pytest.mark.parametrize(
    "args, says",
    [
        (["--wall", "abc", "--", "/bin/true"], "not a duration"),
        (["--wall=-1s", "--", "/bin/true"], "positive"),
        (["--cpu", "nan", "--", "/bin/true"], "positive"),
        (["--wall", "99999999999s", "--", "/bin/true"], "--wall must be at most 86400 seconds"),
        (["--mem", "1Q", "--", "/bin/true"], "--mem: not a size"),
        # A limit's error names the flag, not the Limits field (the core's rules, its words).
        (["--mem", "1M", "--", "/bin/true"], "--mem must be at least 8 MiB, got 1 MiB"),
        (["--tmpfs", "1K", "--", "/bin/true"], "--tmpfs must be at least 64 KiB, got 1 KiB"),
        (["--pids", "0", "--", "/bin/true"], "--pids must be positive, got 0"),
        (["--pids", "-3", "--", "/bin/true"], "--pids must be positive, got -3"),
        (["--file", "x", "--", "/bin/true"], "NAME=PATH"),
        (["--file", "../x=/etc/hostname", "--", "/bin/true"], "escapes the work dir"),
        (["--file", "a=/nonexistent/agentrl", "--", "/bin/true"], "No such file"),
        (["--collect", "/etc/passwd", "--", "/bin/true"], "collect"),
        (["--"], "no command given"),
        (["--", ""], "argv[0] is empty"),
    ],
)
def test_mistakes_get_one_line_and_status_2(args, says):
    p = agentrl_run(*args)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 2, (p.returncode, err)
    assert "Traceback" not in err and err.startswith("agentrl run: ") and says in err, err
    assert err.count("\n") == 1, err


def test_command_not_found_is_127():
    p = agentrl_run("--", "agentrl-no-such-command")
    assert p.returncode == 127 and b"cannot execute agentrl-no-such-command" in p.stderr, p


@pytest.mark.parametrize(
    "text, seconds", [("2s", 2.0), ("500ms", 0.5), ("1.5", 1.5), ("3m", 180.0), (" 1m ", 60.0)]
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text, size", [("4096", 4096), ("256M", 256 << 20), ("1G", 1 << 30), ("64k", 64 << 10)]
)
def test_parse_size(text, size):
    assert parse_size(text) == size


def test_nothing_is_left_behind():
    p = agentrl_run("--", "/bin/sh", "-c", "sleep 30 & sleep 30 & echo started")
    assert p.returncode == 0 and p.stdout == b"started\n", p
    assert_host_clean(timeout=2.0)


def test_eval_names_its_own_flag_for_incomplete_samples(tmp_path):
    samples = tmp_path / "s.jsonl"
    samples.write_text('{"task_id": "HumanEval/0", "completion": "    return True\\n"}\n')
    p = subprocess.run(
        [sys.executable, "-m", "agentrl", "eval", str(samples)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    err = p.stderr.decode()
    assert p.returncode == 2 and "use --ignore-incomplete" in err and "Traceback" not in err, err


def _agentrl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentrl", *args],
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def test_version_is_the_installed_ones():
    import importlib.metadata

    p = _agentrl("--version")
    assert p.returncode == 0, p
    assert p.stdout.decode().strip() == f"agentrl {importlib.metadata.version('agentrl')}", p


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("run", ["(default: 10.0s)", "(default: 512M)"]),
        ("eval", ["(default: "]),
        ("rootless", []),
    ],
)
def test_help_shows_the_defaults(command, shown):
    p = _agentrl(command, "--help")
    out = p.stdout.decode()
    assert p.returncode == 0 and "usage: agentrl " + command in out, p
    for s in shown:
        assert s in " ".join(out.split()), out
    # Options without a value to show (flags off by default, none given) show no default.
    assert "(default: None)" not in out and "(default: False)" not in out, out


def test_a_default_of_zero_is_shown_and_off_is_not():
    from agentrl.cli.main import _Parser

    p = _Parser(prog="x")
    p.add_argument("--n", type=int, default=0, help="count")
    p.add_argument("--flag", action="store_true", help="switch")
    p.add_argument("--name", help="name")
    text = " ".join(p.format_help().split())
    assert "count (default: 0)" in text, text
    assert "switch (default" not in text and "name (default" not in text, text


def test_ctrl_c_ends_with_130_and_no_traceback():
    from conftest import wait_box_started

    env = {**os.environ, "AGENTRL_TEST_MARK": SESSION_MARK}
    p = subprocess.Popen(
        [sys.executable, "-m", "agentrl", "run", "--wall", "60s", "--", "/bin/sleep", "50"],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        wait_box_started()
        p.send_signal(2)
        _, err = p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == 130 and b"Traceback" not in err, err
    assert_host_clean(timeout=2.0)


def test_a_missing_extra_is_named():
    # torch hidden from `agentrl train` as in an install without the `train` extra.
    code = (
        "import sys; sys.modules['torch'] = None; from agentrl.cli.main import main; "
        "sys.exit(main(['train', '--help']))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=False)
    err = p.stderr.decode()
    assert p.returncode == 2 and "Traceback" not in err, err
    assert "pip install 'agentrl[train]'" in err, err


def test_run_shows_the_output_live_and_in_order():
    env = {**os.environ, "AGENTRL_TEST_MARK": SESSION_MARK}
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentrl",
            "run",
            "--",
            "/bin/sh",
            "-c",
            "echo a; sleep 0.3; echo b >&2; sleep 0.3; echo c; sleep 2; echo d",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        assert p.stdout is not None
        seen = b""
        deadline = time.monotonic() + 30
        while b"c\n" not in seen and time.monotonic() < deadline:
            if select.select([p.stdout], [], [], 1)[0]:
                seen += os.read(p.stdout.fileno(), 4096)
        # a, b and c arrived, in order, while the program still sleeps before d.
        assert seen == b"a\nb\nc\n" and p.poll() is None, seen
        rest, _ = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 0, rest
    assert rest.startswith(b"d\n[agentrl] status=ok"), rest
