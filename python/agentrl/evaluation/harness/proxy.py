"""The judge's proxy of the candidate (:class:`_Child`): calls go out over a pipe, answers
are checked, and the candidate's death, time limit and output flood become fatal failures."""

from __future__ import annotations

import builtins
import contextlib
import json
import marshal
import os
import select
import signal
import time

from .wire import (
    _MAX_MSG,
    _READ,
    MEMORY_LIMIT,
    OUTPUT_LIMIT,
    RUNTIME_ERROR,
    SYNTAX_ERROR,
    TIMEOUT,
    _BadMessage,
    _decode,
    _short,
)

_OUT_CAP = 1 << 20
_OUT_KEEP = 4000


class _Fatal(BaseException):
    """The candidate can answer no more calls (timeout, death, output flood)."""

    def __init__(self, cls, exc, message, tb=""):
        super().__init__(message)
        self.cls, self.exc, self.message, self.tb = cls, exc, message, tb


class _Unanswerable(BaseException):
    """The candidate returned a value that cannot be checked (not a plain value)."""


class CandidateError(Exception):
    """An exception the candidate raised whose type is not a builtin one."""


_SIGNAL_NAMES = {int(s): s.name for s in signal.Signals}


class _Child:
    def __init__(self, pid, req_w, rep_r, out_r, deadline):
        self.pid, self.req_w, self.rep_r, self.out_r = pid, req_w, rep_r, out_r
        self.deadline = deadline
        self.buf = bytearray()
        self.out = bytearray()
        self.out_total = 0
        self.fatal = None
        self.seq = 0
        self.calls = 0
        self.last = ""
        self.last_raised = None
        self.tainted = False
        self.exited = False
        os.set_blocking(req_w, False)
        self.poll = select.poll()
        self.poll.register(rep_r, select.POLLIN)
        self.poll.register(out_r, select.POLLIN)
        self.out_open = True

    # child management
    def stop(self):
        """Kills the child without waiting (the box reaps it): the run is over."""
        if not self.exited:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            self.exited = True

    def kill(self):
        if not self.exited:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(self.pid, 0)
            self.exited = True

    def die(self, cls, exc, message, tb=""):
        self.kill()
        self.fatal = _Fatal(cls, exc, message, tb)
        raise self.fatal

    def gone(self):
        """The child closed its reply pipe: collect how it ended."""
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except OSError:
            pid, status = self.pid, 0
        if pid == 0:
            self.kill()
            self.die(RUNTIME_ERROR, "CandidateExit", "the candidate closed its channel")
        self.reaped(status)

    def check_alive(self):
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except OSError:
            return
        if pid:
            self.reaped(status)

    def reaped(self, status):
        """The child has ended with wait ``status``: a fatal failure naming how."""
        self.exited = True
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            name = _SIGNAL_NAMES.get(sig, str(sig))
            self.die(RUNTIME_ERROR, name, f"the candidate was killed by {name}")
        code = os.waitstatus_to_exitcode(status)
        self.die(RUNTIME_ERROR, "CandidateExit", f"the candidate exited (status {code})")

    def drain_output(self, data):
        self.out_total += len(data)
        self.out += data
        if len(self.out) > 2 * _OUT_KEEP:
            del self.out[: len(self.out) - _OUT_KEEP]
        if self.out_total > _OUT_CAP:
            self.die(OUTPUT_LIMIT, None, f"the candidate wrote more than {_OUT_CAP} bytes")

    def wait(self, want_write=False):
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            self.die(TIMEOUT, None, "time limit exceeded")
        if want_write:
            self.poll.register(self.req_w, select.POLLOUT)
        try:
            events = self.poll.poll(min(remaining, 0.1) * 1000)
        finally:
            if want_write:
                self.poll.unregister(self.req_w)
        if not events:
            self.check_alive()
        writable = False
        over = self.run_over()
        piped = False
        for fd, ev in events:
            if fd == self.over_fd:
                over = True
                continue
            piped = True
            if fd == self.req_w:
                if ev & (select.POLLERR | select.POLLHUP):
                    self.gone()
                writable = True
                continue
            data = os.read(fd, _READ if fd == self.out_r else self.want())
            if fd == self.out_r:
                if data:
                    self.drain_output(data)
                else:
                    self.poll.unregister(self.out_r)
            elif data:
                self.buf += data
                if len(self.buf) > _MAX_MSG + 8:
                    self.die(RUNTIME_ERROR, "ProtocolError", "the candidate sent too much")
            else:
                self.gone()
        if over and not piped:  # the candidate's run is over and its pipes are drained
            self.gone()
        return writable

    def tests_start(self):
        """The tests begin (their time counts in this judge's own box limits)."""

    def tests_end(self):
        """The tests are over."""

    over_fd = -1
    """An fd that becomes readable once the candidate's run is over (the persistent judge's
    socket, where the host says so): its pipes may stay open elsewhere (a copy inherited by a
    process the host forked meanwhile), so their end of file alone is not enough."""

    def run_over(self):
        return False

    def want(self):
        """How much to read from the reply pipe: the rest of the current message, if larger."""
        if len(self.buf) < 8:
            return _READ
        rest = 8 + int.from_bytes(self.buf[:8], "big") - len(self.buf)
        return min(max(rest, _READ), _MAX_MSG + 8)

    def recv(self):
        while True:
            if len(self.buf) >= 8:
                size = int.from_bytes(self.buf[:8], "big")
                if size > _MAX_MSG:
                    self.die(RUNTIME_ERROR, "ProtocolError", "oversized message")
                if len(self.buf) >= 8 + size:
                    raw = bytes(self.buf[8 : 8 + size])
                    del self.buf[: 8 + size]
                    try:
                        msg = json.loads(raw)
                    except Exception:
                        self.die(RUNTIME_ERROR, "ProtocolError", "malformed message")
                    if type(msg) is not list or len(msg) < 2 or type(msg[1]) is not str:
                        self.die(RUNTIME_ERROR, "ProtocolError", "malformed message")
                    if msg[0] == self.seq and type(msg[0]) is int:
                        return msg
                    continue
            self.wait()

    def send(self, data):
        view = memoryview(len(data).to_bytes(8, "big") + data)
        while view:
            try:
                n = os.write(self.req_w, view)
            except BlockingIOError:
                n = 0
            except (BrokenPipeError, OSError):
                self.gone()
            view = view[n:]
            if view:
                self.wait(want_write=True)

    def ready(self):
        msg = self.recv()
        kind = msg[1]
        if kind == "ready":
            return None
        if kind == "syntax" and len(msg) >= 4:
            return (SYNTAX_ERROR, _short(msg[2], 80), _short(msg[3]), "")
        if kind == "error" and len(msg) >= 5:
            cls = MEMORY_LIMIT if msg[2] == "MemoryError" else RUNTIME_ERROR
            return (cls, _short(msg[2], 80), _short(msg[3]), _short(msg[4], 2000))
        self.die(RUNTIME_ERROR, "ProtocolError", "unexpected message")
        return None

    def call(self, args, kwargs):
        if self.fatal is not None:
            raise self.fatal
        self.calls += 1
        try:
            data = marshal.dumps((self.seq + 1, args, kwargs))
        except ValueError as e:
            raise TypeError(f"agentrl cannot send this argument to the candidate: {e}") from None
        self.seq += 1
        self.send(data)
        msg = self.recv()
        shown = _call_text(args, kwargs)
        kind = msg[1]
        if kind == "ok" and len(msg) == 3:
            try:
                value = _decode(msg[2])
            except _BadMessage as e:
                self.die(RUNTIME_ERROR, "ProtocolError", f"malformed value: {e}")
            self.last = _short(f"{shown} returned {_short(repr(value), 300)}")
            return value
        if kind == "raise" and len(msg) == 5 and all(type(x) is str for x in msg[2:]):
            name, text, tb = _short(msg[2], 80), _short(msg[3]), _short(msg[4], 2000)
            self.last = _short(f"{shown} raised {name}: {text}")
            if name in _EXIT_NAMES:
                self.die(RUNTIME_ERROR, name, f"the candidate raised {name}", tb)
            exc = _mapped_exception(name, text)
            self.last_raised = (exc, name, text, tb)
            raise exc
        if kind == "unencodable" and len(msg) == 3 and type(msg[2]) is str:
            self.tainted = True
            self.last = _short(f"{shown} returned {_short(msg[2], 200)} that cannot be checked")
            raise _Unanswerable(self.last)
        self.die(RUNTIME_ERROR, "ProtocolError", "unexpected reply")
        return None


def _call_text(args, kwargs):
    parts = [_short(repr(a), 200) for a in args]
    parts += [f"{k}={_short(repr(v), 200)}" for k, v in kwargs.items()]
    return _short("candidate(" + ", ".join(parts) + ")", 400)


_EXIT_NAMES = {"SystemExit", "KeyboardInterrupt", "GeneratorExit"}


def _mapped_exception(name, text):
    cls = getattr(builtins, name, None)
    if (
        name not in _EXIT_NAMES
        and isinstance(cls, type)
        and issubclass(cls, Exception)
        and cls.__module__ == "builtins"
    ):
        try:
            return cls(text)
        except Exception:
            pass
    return CandidateError(f"{name}: {text}")
