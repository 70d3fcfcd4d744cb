"""Persistent judges: one judge serves many function tasks, each candidate a warm run of its own.

Judging a function task takes two processes: the candidate, and a judge that runs the tests
against it (the candidate must not be able to reach the verdict). Forking both for every task
costs two forks and two exits of a warm interpreter; here the judge lives on, so each task
costs one warm run (the candidate's) and the judge's work. In order, for one task:

1. a free judge is taken (a warm run started with :func:`harness.server._judge_server`, its
   socket to the host passed as its fd 3);
2. three pipes are made; the judge gets the task's tests and its ends of them over its socket;
3. the candidate runs as a warm run (:func:`harness.candidate._candidate`) with the other ends
   as its fds 3, 4 and 5: it has nothing else of the judge, and the judge nothing of it but
   the pipes;
4. once the candidate's run is over, the judge is told how it ended and answers the verdict.

A judge that dies, hangs or answers nonsense masks that task (no reward, with the reason) and
is replaced; the next tasks never see it. Judges are recycled after :data:`MAX_TASKS` tasks or
:data:`MAX_AGE_S` seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
import weakref
from collections.abc import Iterable
from concurrent.futures import CancelledError
from typing import Any

from agentrl.pool.jobs import JobExpired, JobFailed
from agentrl.pool.pool import SandboxPool
from agentrl.sandbox.box import Sandbox
from agentrl.sandbox.limits import Limits
from agentrl.sandbox.result import ExecResult, Status

JUDGE_MAIN = "from {module} import _judge_server\n_judge_server()\n"
CANDIDATE_MAIN = "from {module} import _candidate\n_candidate({source!r}, {entry!r})\n"

MAX_TASKS = 10_000
"""Tasks a judge serves before it is replaced."""

MAX_AGE_S = 3600.0
"""Seconds a judge serves before it is replaced (its run's wall limit is far above)."""

START_TIMEOUT_S = 60.0
"""Seconds a new judge may take to say it is ready."""

VERDICT_GRACE_S = 30.0
"""Seconds a judge may take to answer once its candidate's run is over."""


# A child made with fork() gets copies of the host's ends of every judge's socket and of the
# pipes of tasks in flight. Kept there, they would hide a judge's death from the parent and a
# closed socket from a judge (it would never end); so the child closes its copies at once.
_LIVE: weakref.WeakSet[_Judge] = weakref.WeakSet()
_IN_FLIGHT: set[int] = set()
_FORK_LOCK = threading.Lock()


def _close_copies_after_fork() -> None:
    global _FORK_LOCK
    # The parent held the lock across the fork (below): the child's copy would stay locked.
    _FORK_LOCK = threading.Lock()
    for j in list(_LIVE):
        with contextlib.suppress(OSError):
            j.sock.close()
    for fd in list(_IN_FLIGHT):
        with contextlib.suppress(OSError):
            os.close(fd)
    _IN_FLIGHT.clear()


# Held across fork(), so that a task's pipes are either all in _IN_FLIGHT or not made yet.
os.register_at_fork(
    before=lambda: _FORK_LOCK.acquire(),
    after_in_parent=lambda: _FORK_LOCK.release(),
    after_in_child=_close_copies_after_fork,
)


class JudgeFailed(Exception):
    """The judge could not give a verdict (it died, hung or broke the protocol)."""


class JudgeUnavailable(JudgeFailed):
    """The judge could not take the task (it was gone already): nothing of the task ran."""


class _Judge:
    """One judge: a warm run serving tasks over a unix socket."""

    def __init__(self, sandbox: Sandbox, module: str, limits: Limits) -> None:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        _LIVE.add(self)
        self.buf = bytearray()
        self.result: ExecResult | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.tasks = 0
        self.born = time.monotonic()
        source = JUDGE_MAIN.format(module=module)

        def serve() -> None:
            try:
                self.result = sandbox.run_python(source, limits=limits, pass_fds=[theirs.fileno()])
            except BaseException as e:  # reported by whoever waits for this judge
                self.error = e
            finally:
                self.done.set()

        self.thread = threading.Thread(target=serve, name="agentrl-judge", daemon=True)
        self.thread.start()
        try:
            # Once the judge speaks, its run holds its own copy of `theirs`: ours must go, or
            # the judge's death would never show as end of file here.
            msg = self._recv(time.monotonic() + START_TIMEOUT_S)
            if msg != {"ready": True}:
                raise JudgeFailed(f"the judge did not start: {msg!r}")
        except BaseException:
            self.close()
            raise
        finally:
            theirs.close()

    # --- the socket ----------------------------------------------------------------------

    def _why(self) -> str:
        if self.error is not None:
            return f"{type(self.error).__name__}: {self.error}"
        if self.result is not None:
            err = self.result.stderr.decode("utf-8", "replace").strip()[-300:]
            return self.result.summary() + (f"; stderr: {err}" if err else "")
        return "it closed its socket"

    def _recv(self, deadline: float) -> Any:
        while True:
            if len(self.buf) >= 8:
                size = int.from_bytes(self.buf[:8], "big")
                if len(self.buf) >= 8 + size:
                    raw = bytes(self.buf[8 : 8 + size])
                    del self.buf[: 8 + size]
                    try:
                        return json.loads(raw)
                    except ValueError:
                        raise JudgeFailed("the judge sent a malformed message") from None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise JudgeFailed("the judge did not answer in time")
            self.sock.settimeout(min(remaining, 0.5))
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                if self.done.is_set():
                    raise JudgeFailed(f"the judge ended: {self._why()}") from None
                continue
            except OSError as e:
                raise JudgeFailed(f"the judge's socket failed: {e}") from None
            if not chunk:
                self.done.wait(5.0)
                raise JudgeFailed(f"the judge ended: {self._why()}")
            self.buf += chunk

    def _send(self, obj: Any, fds: list[int] | None = None) -> None:
        """Sends ``obj`` as JSON (bytes: already encoded), with ``fds``."""
        data = obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")).encode()
        data = len(data).to_bytes(8, "big") + data
        try:
            self.sock.settimeout(None)
            sent = socket.send_fds(self.sock, [data], fds) if fds else 0
            self.sock.sendall(data[sent:])
        except OSError as e:
            raise JudgeFailed(f"the judge is gone ({e}): {self._why()}") from None

    # --- one task --------------------------------------------------------------------------

    def judge(
        self,
        pool: SandboxPool,
        task: bytes,
        candidate_source: str,
        limits: Limits,
    ) -> tuple[dict[str, Any], ExecResult | None, str]:
        """Judges one candidate (``task``: the judge's task as JSON): the verdict and the
        candidate's run, or None and why when the pool gave up on it. Raises
        :class:`JudgeFailed` when this judge can give no verdict (it is then unusable)."""
        self.tasks += 1
        with _FORK_LOCK:
            req_r, req_w = os.pipe()
            rep_r, rep_w = os.pipe()
            out_r, out_w = os.pipe()
            theirs = (req_w, rep_r, out_r)
            ours = [req_r, rep_w, out_w]
            _IN_FLIGHT.update(theirs, ours)
        try:
            try:
                if self.done.is_set():
                    raise JudgeUnavailable(f"the judge ended: {self._why()}")
                try:
                    self._send(task, list(theirs))
                except JudgeFailed as e:
                    raise JudgeUnavailable(str(e)) from None
            finally:
                _close(theirs)
            # The pool's job holds copies of ours until the run is over.
            fut = pool.submit_python(candidate_source, limits=limits, pass_fds=ours)
        finally:
            _close(ours)
        try:
            result: ExecResult | None = fut.result()
            fate = _fate(result)
        except (JobFailed, JobExpired, CancelledError) as e:
            result, fate = None, {"status": "sandbox_error", "error": f"{type(e).__name__}: {e}"}
        self._send(fate)
        verdict = self._recv(time.monotonic() + VERDICT_GRACE_S)
        if not isinstance(verdict, dict):
            raise JudgeFailed(f"the judge sent {type(verdict).__name__}, not a verdict")
        return verdict, result, fate.get("error") or ""

    def worn(self) -> bool:
        return self.tasks >= MAX_TASKS or time.monotonic() - self.born > MAX_AGE_S

    def close(self) -> None:
        """Ends the judge: it reads end of file and exits (or is killed at its next task's
        time limit if it is stuck in one)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def _close(fds: Iterable[int]) -> None:
    with _FORK_LOCK:
        for fd in fds:
            _IN_FLIGHT.discard(fd)
            os.close(fd)


def _fate(result: ExecResult) -> dict[str, Any]:
    """How a candidate's run ended, for its judge."""
    name = None
    if result.signal is not None:
        try:
            name = signal.Signals(result.signal).name
        except ValueError:
            name = f"signal {result.signal}"
    return {
        "status": result.status.value,
        "signal": name,
        "exit_code": result.exit_code,
        "error": result.error if result.status is Status.SANDBOX_ERROR else None,
    }


class Judges:
    """At most ``size`` judges on ``pool``'s sandbox, lent one task at a time; the candidates
    run as jobs of ``pool`` (its statistics count them)."""

    def __init__(self, pool: SandboxPool, module: str, limits: Limits, size: int) -> None:
        self.pool, self.module, self.limits, self.size = pool, module, limits, size
        self.sandbox = pool.sandbox
        self._idle: list[_Judge] = []
        self._count = 0
        self._cv = threading.Condition()
        self._closed = False

    def _take(self) -> _Judge:
        with self._cv:
            while True:
                if self._closed:
                    raise RuntimeError("the Evaluator is closed")
                if self._idle:
                    return self._idle.pop()
                if self._count < self.size:
                    self._count += 1
                    break
                self._cv.wait()
        try:
            return _Judge(self.sandbox, self.module, self.limits)
        except BaseException:
            self._drop()
            raise

    def _drop(self) -> None:
        with self._cv:
            self._count -= 1
            self._cv.notify()

    def _give_back(self, judge: _Judge) -> None:
        with self._cv:
            if not self._closed and not judge.worn():
                self._idle.append(judge)
                self._cv.notify()
                return
        judge.close()
        self._drop()

    def judge(
        self, task: bytes, candidate_source: str, limits: Limits
    ) -> tuple[dict[str, Any] | None, ExecResult | None, str]:
        """``(verdict, candidate's run, "")``; ``(verdict, None, reason)`` when the pool gave
        up on the candidate's job, or ``(None, None, reason)`` when no judge could give a
        verdict (either way the task is to be masked). A judge found gone before the task
        reached it (it died while idle) is replaced and the task given to the new one."""
        for attempt in range(2):
            try:
                judge = self._take()
            except JudgeFailed as e:
                return None, None, str(e)
            ok = False
            try:
                verdict, result, why = judge.judge(self.pool, task, candidate_source, limits)
                ok = True
                return verdict, result, why
            except JudgeUnavailable as e:
                if attempt:
                    return None, None, str(e)
            except JudgeFailed as e:
                return None, None, str(e)
            finally:
                if ok:
                    self._give_back(judge)
                else:
                    judge.close()
                    self._drop()
        raise AssertionError("unreachable")

    def retire_idle(self) -> None:
        """Ends the idle judges and waits until their runs are over (new ones start when
        needed)."""
        with self._cv:
            idle, self._idle = self._idle, []
        for j in idle:
            j.close()
        for j in idle:
            j.thread.join(10.0)
            self._drop()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cv.notify_all()
        for j in idle:
            j.close()
        for j in idle:
            j.thread.join(10.0)
