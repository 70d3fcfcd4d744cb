"""The candidate's side of the harness: what runs in the candidate's own process.

:func:`_child` executes the candidate's source in fresh globals and serves calls of its entry
point over two pipes; in a one-run judge it is the forked child of :func:`.judge._main`, with a
persistent judge the candidate's warm run of its own (:func:`_candidate`).
"""

from __future__ import annotations

import builtins
import contextlib
import marshal
import os
import signal
import sys
import traceback

from .wire import (
    _READ,
    _encode,
    _len,
    _name_of,
    _safe_str,
    _send,
    _short,
    _str,
    _type,
    _Unencodable,
)

_FILENAME = "<solution>"


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


def _candidate(source, entry):
    """A candidate's warm run: fds 3, 4 and 5 are its request, reply and output pipes."""
    _send(4, [0, "hello"])  # the judge's clock starts now, not when the task was sent
    try:
        _child(source, entry, 3, 4, 5)
    finally:
        os._exit(0)
