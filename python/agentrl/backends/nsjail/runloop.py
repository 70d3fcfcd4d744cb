"""A run's supervision and verdict: :func:`_watch` feeds stdin, captures output, enforces the wall,
CPU and output limits and reaps nsjail; :func:`_verdict` turns what it learnt into an
:class:`~agentrl.ExecResult`, classified by the native backend's rule (the Rust core's
``classify_verdict``)."""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

from agentrl import _core
from agentrl.backends.nsjail.capture import _Capture, _parse_log
from agentrl.backends.nsjail.cgroups import _RunCgroup
from agentrl.sandbox.limits import Limits
from agentrl.sandbox.result import ExecResult, Status

_POLL_S = 0.01
"""How often a run's CPU time is sampled while nothing else happens."""

_SIDE_CAP = 1 << 20
"""Most bytes kept of nsjail's log and of the init's status pipe (the rest is drained)."""


@dataclass
class _Run:
    """Everything one run owns (released by :meth:`NsjailBackend._release`)."""

    hid: int
    run_dir: str
    work: str
    cwd: str
    """Working directory inside the box."""
    cgroup: _RunCgroup | None = None


def _watch(
    proc: subprocess.Popen,
    started: float,
    stdin: bytes,
    lim: Limits,
    run: _Run,
    argv: list[bytes],
    in_w: int,
    out_r: int,
    err_r: int,
    log_r: int,
    st_r: int,
    fds: list[int],
) -> ExecResult:
    """Feeds stdin, captures output, enforces the wall, CPU and output limits, reaps nsjail
    and turns what it learnt into a verdict."""
    cg = run.cgroup
    out, err = _Capture(lim.max_output_bytes), _Capture(lim.max_output_bytes)
    side: dict[int, list[bytes]] = {log_r: [], st_r: []}
    sel = selectors.DefaultSelector()
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)
        fds.append(pidfd)
    except OSError:  # Linux < 5.3: poll with wait4(WNOHANG) instead
        pidfd = None
    reaped: tuple[int, os.struct_rusage] | None = None  # type: ignore[name-defined]
    view = memoryview(stdin)
    killed: str | None = None
    killed_at = 0.0
    exited_at: float | None = None

    def kill(reason: str) -> None:
        nonlocal killed, killed_at
        if killed is None:
            killed, killed_at = reason, time.monotonic()
        if cg is not None:
            cg.kill(exclude=proc.pid)  # nsjail then reaps its jail and exits by itself
        else:  # the jail's init dies with nsjail (PR_SET_PDEATHSIG), the rest with it
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)

    try:
        for fd in (out_r, err_r, log_r, st_r):
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ)
        if view:
            os.set_blocking(in_w, False)
            sel.register(in_w, selectors.EVENT_WRITE)
        else:
            os.close(in_w)
            fds.remove(in_w)
        deadline = started + lim.wall_time_s
        cpu_limit_ns = int(lim.cpu_time_s * 1e9)
        while True:
            now = time.monotonic()
            if exited_at is None and killed is None:
                if now >= deadline:
                    kill("wall_time")
                elif out.truncated or err.truncated:
                    kill("output")
                elif cg is not None and (cg.cpu_ns() or 0) >= cpu_limit_ns:
                    kill("cpu_time")
            if exited_at is not None:
                # nsjail is gone, and its jail with it: drain what is left, briefly.
                if not [k for k in sel.get_map().values() if k.fd != in_w]:
                    break
                if now - exited_at > 1.0:
                    break
                timeout = 1.0 - (now - exited_at)
            elif killed is not None:
                timeout = 0.05
                if now > killed_at + 2.0:  # nsjail itself does not go: take it down too
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGKILL)
                elif cg is not None:
                    # Again until nsjail is gone: a kill that came while nsjail was still
                    # setting up found its jail not yet in the cgroup, and the jail would
                    # then run on until nsjail's own whole-second --time_limit.
                    cg.kill(exclude=proc.pid)
            else:
                timeout = max(0.0, min(deadline - now, _POLL_S if cg is not None else 0.05))
            if pidfd is None and exited_at is None:
                timeout = min(timeout, 0.01)
                pid, wst, ru = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    reaped, exited_at = (wst, ru), time.monotonic()
                    continue
            for key, _ev in sel.select(timeout):
                fd = key.fd
                if fd == pidfd:
                    sel.unregister(fd)
                    exited_at = time.monotonic()
                elif fd == in_w:
                    try:
                        view = view[os.write(in_w, view[: 1 << 16]) :]
                    except BlockingIOError:
                        pass
                    except OSError:  # EPIPE: the box closed its stdin, or ended
                        view = view[:0]
                    if not view:
                        sel.unregister(in_w)
                        os.close(in_w)
                        fds.remove(in_w)
                else:
                    try:
                        b = os.read(fd, 1 << 16)
                    except BlockingIOError:
                        continue
                    except OSError:
                        b = b""
                    if not b:
                        sel.unregister(fd)
                    elif fd == out_r:
                        out.feed(b)
                    elif fd == err_r:
                        err.feed(b)
                    elif sum(map(len, side[fd])) < _SIDE_CAP:
                        side[fd].append(b)
        if reaped is None:
            _pid, wstatus, rusage = os.wait4(proc.pid, 0)
        else:
            wstatus, rusage = reaped
        proc.returncode = os.waitstatus_to_exitcode(wstatus)
        wall = (exited_at or time.monotonic()) - started
    finally:
        sel.close()
    if cg is not None:
        cg.kill(exclude=proc.pid)  # nothing should be left; make sure
    return _verdict(
        proc.returncode,
        rusage,
        wall,
        killed,
        out,
        err,
        b"".join(side[log_r]).decode(errors="replace"),
        b"".join(side[st_r]).decode(errors="replace"),
        lim,
        run,
        argv,
    )


def _verdict(
    rc: int,
    rusage: os.struct_rusage,  # type: ignore[name-defined]
    wall: float,
    killed: str | None,
    out: _Capture,
    err: _Capture,
    log_text: str,
    status_text: str,
    lim: Limits,
    run: _Run,
    argv: list[bytes],
) -> ExecResult:
    """What a run ended in: nsjail's exit status and log, the init's report and the run's
    cgroup counters, classified as the native backend does (:func:`_classify`)."""
    cg = run.cgroup
    v = _parse_log(log_text)
    cpu = rusage.ru_utime + rusage.ru_stime
    cg_cpu = cg.cpu_ns() if cg is not None else None
    if cg_cpu is not None:
        cpu = max(cpu, cg_cpu / 1e9)
    # The init's report is its last line. (The program cannot write to this pipe: it belongs
    # to host root and /proc is read-only. Taking the last line is defence in depth.)
    lines = re.findall(r"^(status|exec|cwd) (\d+)$", status_text, re.M)
    last = lines[-1] if lines else None
    if last is not None and last[0] in ("exec", "cwd"):
        # The caller's mistake (no such program or directory), as in the native backend.
        exec_failed = last[0] == "exec"
        what, path = ("execute", argv[0]) if exec_failed else ("enter", run.cwd.encode())
        return ExecResult(
            status=Status.RUNTIME_ERROR,
            exit_code=127 if exec_failed else 126,
            stderr=err.data + _cannot(what, path, int(last[1])),
            wall_time_s=wall,
            cpu_time_s=cpu,
        )
    exit_code: int | None = None
    sig: int | None = None
    if last is not None:
        raw = int(last[1])
        if os.WIFEXITED(raw):
            exit_code = os.WEXITSTATUS(raw)
        else:
            sig = os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else signal.SIGKILL
    else:
        # No word from the init: it never started, or it died (our kill, nsjail's time
        # limit, the OOM killer). What nsjail saw of it is the best there is.
        failed = v.exec_error is not None or any("Couldn't launch" in e for e in v.errors)
        if killed is None and (failed or "Executing '" not in log_text):
            tail = err.data.decode(errors="replace").strip()[-500:]
            detail = "; ".join(v.errors[-3:]) or f"nsjail exited with status {rc}: {tail}"
            if rc == 125:
                detail = "cannot place nsjail in the run's cgroup or set its file size limit"
            return ExecResult(status=Status.SANDBOX_ERROR, error=detail, wall_time_s=wall)
        sig = v.signal if v.signal is not None else signal.SIGKILL
        if v.signal is None and v.exit_code is not None and killed is None:
            sig, exit_code = None, v.exit_code
    if v.time_limit and killed is None:
        killed = "wall_time"
    usage = cg.usage() if cg is not None else {}
    if usage.get("oom_kill") is not None:  # v1: OOM eventfd; v2: memory.events oom_kill
        oom = bool(usage["oom_kill"])
    else:  # no OOM notification: the limit was hit, and a SIGKILL we did not send
        oom = bool(usage.get("failcnt")) and sig == signal.SIGKILL and killed is None
    pids_peak, pids_events = usage.get("pids_peak"), usage.get("pids_max_events")
    pids_hit = bool(pids_events) or (pids_peak is not None and pids_peak >= lim.max_pids)
    # The native backend's rule, from the Rust core: both backends judge a run alike.
    status_name, limit = _core.classify_verdict(
        oom,
        killed,
        sig,
        exit_code,
        cpu >= lim.cpu_time_s,
        out.truncated or err.truncated,
        pids_hit,
    )
    status = Status(status_name)
    return ExecResult(
        status=status,
        exit_code=exit_code,
        signal=sig,
        stdout=out.data,
        stderr=err.data,
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        wall_time_s=wall,
        cpu_time_s=cpu,
        peak_memory_bytes=usage.get("peak"),
        peak_memory_exact=usage.get("peak") is not None,  # a fresh cgroup per run
        limit=limit,
    )


def _cannot(what: str, path: bytes, err: int) -> bytes:
    """The native backend's message for a program or working directory that cannot be used
    (``what`` is ``execute`` or ``enter``)."""
    obj = b"" if what == "execute" else b"the working directory "
    text = f"{os.strerror(err) if err else 'unknown error'} (os error {err})"
    return b"agentrl: cannot " + what.encode() + b" " + obj + path + b": " + text.encode() + b"\n"
