"""Persistent judges (an Evaluator that owns its pool): reuse, failures, isolation between tasks.

The hacks of ``test_hacks.py`` run against these judges too; here is what is particular to a
judge that outlives its tasks: judges are reused and end with the Evaluator, a judge that dies
costs at most the task it was judging (never a verdict), and one task's tests cannot change
what the next task's tests see.
"""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time

import pytest
from agentrl.evaluation import Evaluator, FunctionTask
from conftest import judge_procs, my_descendants

ECHO = FunctionTask(
    task_id="echo",
    prompt="def echo(x):\n",
    test="def check(candidate):\n    assert candidate(1) == 1\n    assert candidate('a') == 'a'\n",
    entry_point="echo",
)
GOOD = "    return x\n"


def _judges() -> set[int]:
    """This test process's judges (another process's Evaluators, say a benchmark running
    meanwhile, have judges of their own)."""
    mine = my_descendants()
    return {pid for pid, _ in judge_procs() if pid in mine}


def _gone(pids: set[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while pids & _judges():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_judges_are_reused_and_end_with_the_evaluator() -> None:
    before = _judges()
    with Evaluator(workers=2, timeout=5.0) as ev:
        assert ev._served
        out = ev.judge_many([(ECHO, GOOD)] * 24)
        assert all(j.passed for j in out), [j.feedback for j in out if not j.passed]
        mine = _judges() - before
        assert 1 <= len(mine) <= 2, mine
        out = ev.judge_many([(ECHO, GOOD), (ECHO, "    return 0\n")] * 6)
        assert [j.passed for j in out] == [True, False] * 6
        assert _judges() - before == mine  # the same judges served the second batch
    assert _gone(mine), "a judge outlived its Evaluator"


def test_a_judge_killed_while_idle_costs_nothing() -> None:
    before = _judges()
    with Evaluator(workers=1, timeout=5.0) as ev:
        assert ev.judge(ECHO, GOOD).passed
        (pid,) = _judges() - before
        os.kill(pid, signal.SIGKILL)
        assert _gone({pid})
        # The task goes to a new judge: a verdict, not a mask.
        j = ev.judge(ECHO, GOOD)
        assert j.passed and not j.masked, j
        assert ev.judge(ECHO, "    return None\n").n_passed == 0


def test_a_judge_killed_mid_task_masks_that_task_only() -> None:
    before = _judges()
    slow = "    import time\n    time.sleep(3)\n    return x\n"
    with Evaluator(workers=1, timeout=10.0) as ev:
        assert ev.judge(ECHO, GOOD).passed
        (pid,) = _judges() - before
        out = []
        t = threading.Thread(target=lambda: out.append(ev.judge(ECHO, slow)))
        t.start()
        time.sleep(1.0)  # the candidate is asleep in its first call
        os.kill(pid, signal.SIGKILL)
        t.join(30)
        (j,) = out
        # No verdict came: no reward, with the reason; never a pass or a fail.
        assert j.masked and not j.passed and "judge" in (j.mask_reason or ""), j
        j = ev.judge(ECHO, GOOD)
        assert j.passed and not j.masked, j


def test_one_tasks_tests_do_not_reach_the_next() -> None:
    meddler = FunctionTask(
        task_id="meddler",
        prompt="def f(x):\n",
        test=textwrap.dedent(
            """
            import builtins, os, sys
            builtins.sorted = lambda *a, **k: [42]
            sys.setrecursionlimit(60)
            os.chdir("/tmp")
            def check(candidate):
                assert candidate(1) == 1
            """
        ),
        entry_point="f",
    )
    victim = FunctionTask(
        task_id="victim",
        prompt="def g(x):\n",
        test=textwrap.dedent(
            """
            import os, sys
            def check(candidate):
                assert sorted([3, 1, 2]) == [1, 2, 3]
                assert sys.getrecursionlimit() >= 1000
                assert os.getcwd() == "/work"
                assert candidate(2) == 2
            """
        ),
        entry_point="g",
    )
    before = _judges()
    with Evaluator(workers=1, timeout=5.0) as ev:
        assert ev.judge(meddler, GOOD).passed
        judge = _judges() - before
        j = ev.judge(victim, GOOD)
        assert j.passed, j.feedback
        assert _judges() - before == judge  # judged by the judge that ran the meddler


def test_the_candidate_holds_only_its_pipes() -> None:
    with Evaluator(workers=1, timeout=5.0) as ev:
        j = ev.judge(
            ECHO,
            "    import os\n"
            "    listed = sorted(int(f) for f in os.listdir('/proc/self/fd'))\n"
            "    print([f for f in listed if os.path.exists(f'/proc/self/fd/{f}')], os.getppid())\n"
            "    return x\n",
        )
    assert j.passed, j.feedback
    # stdin (/dev/null), stdout and stderr (the output pipe), requests and replies.
    assert j.output.splitlines()[0] == "[0, 1, 2, 10, 11] 0", j.output


@pytest.mark.parametrize("workers", [1, 3])
def test_more_callers_than_judges_wait_their_turn(workers: int) -> None:
    before = _judges()
    with Evaluator(workers=workers, timeout=5.0) as ev:
        results: list[bool] = []
        lock = threading.Lock()

        def call() -> None:
            for _ in range(4):
                ok = ev.judge(ECHO, GOOD).passed
                with lock:
                    results.append(ok)
                    assert len(_judges() - before) <= workers

        threads = [threading.Thread(target=call) for _ in range(2 * workers + 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert results == [True] * 4 * len(threads)


def test_a_fork_of_the_host_neither_keeps_judges_alive_nor_stalls_a_verdict() -> None:
    before = _judges()
    with Evaluator(workers=1, timeout=5.0) as ev:
        assert ev.judge(ECHO, GOOD).passed
        mine = _judges() - before
        # A child forked while a task is in flight (a trainer's reward worker, say) that
        # lives on: its copies of the host's fds must not hide the candidate's crash from the
        # judge, nor keep the judge alive after the Evaluator closes.
        crash = "    import os, time\n    time.sleep(0.5)\n    os.abort()\n"
        out = []
        t = threading.Thread(target=lambda: out.append(ev.judge(ECHO, crash)))
        t.start()
        time.sleep(0.2)
        pid = os.fork()
        if pid == 0:
            time.sleep(8)
            os._exit(0)
        try:
            t.join(30)
            (j,) = out
            assert not j.passed and j.error_detail == "the candidate was killed by SIGABRT", j
        finally:
            ev.close()
            assert _gone(mine, 5.0), "the forked child kept a judge alive"
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@pytest.mark.parametrize("stuck", ["while True:\n        pass", "import time\n    time.sleep(60)"])
def test_tests_stuck_past_the_timeout_fail_as_a_timeout(stuck: str) -> None:
    # The one-run judge's box stops such tests at its time limit; a persistent judge stops
    # them itself, scores the task a timeout as that box would, and serves on.
    task = FunctionTask(
        task_id="stuck",
        prompt="def f(x):\n",
        test=f"def check(candidate):\n    assert candidate(1) == 1\n    {stuck}\n",
        entry_point="f",
    )
    before = _judges()
    with Evaluator(workers=1, timeout=1.0) as ev:
        j = ev.judge(task, GOOD)
        assert not j.passed and not j.masked and j.error_class.value == "timeout", j
        judge = _judges() - before
        assert ev.judge(ECHO, GOOD).passed
        assert _judges() - before == judge


def test_the_preloaded_harness_is_compiled_and_well_inside_its_budget() -> None:
    # Past its budget the preload falls back to source, which every warm interpreter would
    # compile at boot (10 to 20 ms each): growing the harness must not do that unnoticed.
    from agentrl.evaluation import harness

    loader = harness.preload_loader()
    assert "_m.loads(_z.decompress(" in loader, "the preload fell back to source"
    assert len(loader) <= 0.6 * harness._PRELOAD_BUDGET, len(loader)
