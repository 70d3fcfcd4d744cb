"""The harness's wire format and what every part of it shares (in the box; stdlib only).

A candidate's answers go to its judge as length-prefixed JSON (:func:`_send`); a returned value
as tagged JSON of plain values built with exact type checks (:func:`_encode`; a subclass or an
object with a lying ``__eq__`` cannot be encoded), decoded strictly (:func:`_decode`). Also
the error classes of a verdict and the builtins bound once, at load time, before any candidate
code runs (``_type``, ``_len``, ...).
"""

from __future__ import annotations

import json
import os

_MAX_DEPTH = 100
_MAX_NODES = 1 << 20
_MAX_MSG = 64 << 20
# Reads ask for 64 KiB unless a message needs more: os.read allocates the size it is asked
# for, and at 1 MiB that is an mmap, a page fault and a munmap for every call.
_READ = 1 << 16
_TEXT_CAP = 600

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


def _safe_str(exc):
    try:
        s = _str(exc)
        return _short(s) if _type(s) is str else "?"
    except BaseException:
        return "<unprintable>"
