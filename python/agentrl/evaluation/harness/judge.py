"""The judge of one run per task (:func:`_main`) and the verdict every judge gives
(:func:`_judge`). The order of :func:`_main` is the harness's guarantee (see the package)."""

from __future__ import annotations

import binascii
import contextlib
import gc
import json
import marshal
import os
import sys
import time

from .candidate import _child
from .cases import _Cases, prepare
from .proxy import _OUT_KEEP, _Child, _Fatal
from .wire import PASSED, _safe_str, _short

_HARNESS_ERROR = "AGENTRL-HARNESS-ERROR"


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
