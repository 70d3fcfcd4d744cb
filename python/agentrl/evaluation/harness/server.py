"""The persistent judge (:func:`_judge_server`): one judge for many tasks, each candidate a
warm run of its own, reached through three pipes (:class:`_ServedChild`).

The host (see ``agentrl.evaluation._judges``) keeps judges running as warm runs of their own
and, for each task, makes three pipes: it sends the judge the task with its ends of them over
the judge's socket (fd 3), and starts the candidate as a warm run
(:func:`.candidate._candidate`) with the other ends as fds 3, 4 and 5. The candidate is then
alone in its box (its own pid namespace, files and user): it has nothing of the judge but the
pipes. Once the candidate's run is over, the host sends the judge how it ended (its "fate");
the judge answers with the verdict, the same as :func:`.judge._main`'s.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import select
import signal
import sys
import time

from .judge import _add_run_facts, _judge, _set_undumpable
from .proxy import _Child, _Fatal
from .wire import _READ, OUTPUT_LIMIT, RUNTIME_ERROR, TIMEOUT, _len, _safe_str, _send

_START_WAIT = 300.0
"""Seconds a judge waits for its candidate's first message (the run may wait for a slot)."""


class _Conn:
    """Length-prefixed JSON messages on the judge's socket to the host (fd 3)."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()

    def send(self, obj):
        _send(self.sock.fileno(), obj)

    def recv(self, max_fds=0):
        """The next message and the fds that came with it; ``(None, [])`` at end of file."""
        import socket

        fds = []
        while True:
            if _len(self.buf) >= 8:
                size = int.from_bytes(self.buf[:8], "big")
                if _len(self.buf) >= 8 + size:
                    raw = bytes(self.buf[8 : 8 + size])
                    del self.buf[: 8 + size]
                    return json.loads(raw), fds
            if max_fds and not fds:
                chunk, got, _flags, _addr = socket.recv_fds(self.sock, _READ, max_fds)
                fds.extend(got)
            else:
                chunk = self.sock.recv(_READ)
            if not chunk:
                for fd in fds:
                    os.close(fd)
                return None, []
            self.buf += chunk


class _ServedChild(_Child):
    """A candidate that is not the judge's child: it is reached through its pipes only, and
    how it ended comes from the host (``fate``)."""

    def __init__(self, req_w, rep_r, out_r, timeout, conn):
        super().__init__(None, req_w, rep_r, out_r, time.monotonic() + _START_WAIT)
        self.timeout = timeout
        self.conn = conn
        self.ended = None
        self.closed = False
        self.over_fd = conn.sock.fileno()
        self.poll.register(self.over_fd, select.POLLIN)

    def run_over(self):
        return _len(self.conn.buf) > 0  # the host's word came with the task already

    def tests_start(self):
        # The tests' own time is the task's too: past the deadline (and a second), a test
        # stuck in Python code (a loop waiting for a value that never comes) stops as a
        # timeout, as the one-run judge's box would; one stuck in C is the hard stop's.
        signal.signal(signal.SIGALRM, _alarm)
        left = max(self.deadline - time.monotonic(), 0.0)
        signal.setitimer(signal.ITIMER_REAL, left + 1.0)

    def tests_end(self):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    def close(self):
        if not self.closed:
            self.closed = True
            with contextlib.suppress(KeyError, ValueError):
                self.poll.unregister(self.over_fd)
            for fd in (self.req_w, self.rep_r, self.out_r):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def stop(self):
        """Closes the pipes: the candidate reads end of file (or dies of SIGPIPE), and what
        may still run of it stops at its own time limit."""
        self.exited = True
        self.close()

    kill = stop

    def check_alive(self):
        pass

    def fate(self):
        """How the candidate's run ended, from the host (once; it comes after the run)."""
        if self.ended is None:
            self.close()
            msg, _ = self.conn.recv()
            if type(msg) is not dict:
                raise EOFError("the host closed the judge's socket")
            self.ended = msg
        return self.ended

    def gone(self):
        self.stop()
        f = self.fate()
        status = f.get("status")
        if status == "signaled" or status == "memory_limit":
            name = "SIGKILL" if status == "memory_limit" else str(f.get("signal") or "a signal")
            self.die(RUNTIME_ERROR, name, f"the candidate was killed by {name}")
        if status == "timeout":
            self.die(TIMEOUT, None, "time limit exceeded")
        if status == "output_limit":
            self.die(OUTPUT_LIMIT, None, "the candidate exceeded its output limit")
        if status == "sandbox_error":
            raise RuntimeError(f"the candidate's box failed: {f.get('error')}")
        self.die(
            RUNTIME_ERROR,
            "CandidateExit",
            f"the candidate exited (status {f.get('exit_code')})",
        )

    def ready(self):
        try:
            msg = self.recv()
        except _Fatal as e:
            if e.cls == TIMEOUT:  # no first message in _START_WAIT: not the candidate's doing
                raise RuntimeError("the candidate did not start") from None
            raise
        if msg[1] != "hello":
            self.die(RUNTIME_ERROR, "ProtocolError", "unexpected message")
        self.deadline = time.monotonic() + self.timeout
        return super().ready()


def _alarm(signum, frame):
    raise _Fatal(TIMEOUT, None, "time limit exceeded")


_HARD_STOP_CPU_S = 30.0
"""CPU seconds beyond a task's timeout after which a judge is ended (SIGPROF's default)."""


def _judge_server():
    """A judge's warm run: judges the tasks the host sends on fd 3 until end of file."""
    import socket

    with open("/proc/self/comm", "w") as f:  # for ps and the like (while still dumpable)
        f.write("agentrl-judge")
    _set_undumpable()
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # what tests print goes nowhere (it went nowhere before either)
    quiet = open(os.devnull, "w")  # noqa: SIM115 (lives as long as the judge)
    sys.stdout = sys.stderr = quiet
    conn = _Conn(socket.socket(fileno=3))
    builtins_state = dict(builtins.__dict__)
    limit = sys.getrecursionlimit()
    cwd = os.getcwd()
    conn.send({"ready": True})
    while True:
        task, fds = conn.recv(max_fds=3)
        if task is None:
            os._exit(0)
        start = time.monotonic()
        timeout = float(task["timeout"])
        # The hard stop: trusted test code stuck in C (a giant comparison) cannot be
        # interrupted, so SIGPROF's default action ends the judge; the host then masks the
        # task and starts another judge.
        signal.signal(signal.SIGPROF, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_PROF, timeout + _HARD_STOP_CPU_S)
        child = _ServedChild(*fds, timeout, conn)
        try:
            verdict = _judge(task, task["entry"], child)
        except BaseException as e:
            verdict = {"masked": f"harness error: {type(e).__name__}: {_safe_str(e)}"}
        child.stop()
        try:
            child.fate()
        except BaseException:
            os._exit(0)
        _add_run_facts(verdict, child, start)
        signal.setitimer(signal.ITIMER_PROF, 0)
        # What one task's tests changed of the interpreter does not reach the next task's.
        builtins.__dict__.clear()
        builtins.__dict__.update(builtins_state)
        sys.setrecursionlimit(limit)
        sys.stdout = sys.stderr = quiet
        with contextlib.suppress(OSError):
            os.chdir(cwd)
        del child, task, fds
        conn.send(verdict)
