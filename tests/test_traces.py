"""Execution traces (agentrl.observability.traces): records of a mixed batch, found by search
in both sinks, shown by job, counted; the writer never blocks the pool and counts drops."""

from __future__ import annotations

import json
import threading

import pytest
from agentrl import Limits, SandboxPool
from agentrl.evaluation import Evaluator
from agentrl.evaluation.tasks import FunctionTask
from agentrl.observability import job_context
from agentrl.observability.traces import Tracer, parse_query, search, show, summary
from conftest import TIME_SCALE

TASK = FunctionTask(
    task_id="HumanEval/32",
    prompt="def div(a, b):\n",
    test="def check(candidate):\n    assert candidate(6, 3) == 2\n    assert candidate(1, 1) == 1\n",
    entry_point="div",
)
GOOD = "    return a // b\n"
ZERO = "    return a // 0\n"  # ZeroDivisionError in the candidate
WRONG = "    return a + b\n"  # the first assert fails
SPIN = "    while True:\n        pass\n"  # timeout
SPIN_LIMITS = Limits(wall_time_s=2.0 * TIME_SCALE, cpu_time_s=0.3 * TIME_SCALE)


def _mixed_batch(pool: SandboxPool) -> list:
    """Jobs with contexts: ok, a traceback, a timeout, a refused syscall, a shell failure."""
    futs = []
    with job_context(episode=1, group=0, policy_version=3, task_id="fam/add"):
        futs.append(pool.submit_python("print('hello trace')"))
        futs.append(pool.submit_python("1 / 0"))
    with job_context(episode=2, task_id="HumanEval/32"):
        futs.append(pool.submit_python("while True: pass", limits=SPIN_LIMITS))
    futs.append(pool.submit_python(
        "import os\nos.makedirs('j', exist_ok=True)\ntry: os.chroot('j')\nexcept OSError: pass\n"
    ))  # fmt: skip
    futs.append(pool.submit(["/bin/sh", "-c", "echo nope >&2; exit 4"]))
    return [f.result(timeout=60 * TIME_SCALE) for f in futs]


@pytest.mark.parametrize("sink", ["jsonl", "sqlite"])
def test_a_mixed_batch_is_found_by_search(tmp_path, sink) -> None:
    tracer = Tracer(tmp_path, sink=sink, output_cap=128)
    with SandboxPool(workers=2, tracer=tracer) as pool:
        results = _mixed_batch(pool)
        pool.submit_python("print('x' * 1000)").result(timeout=30 * TIME_SCALE)
    assert tracer.flush(30 * TIME_SCALE)
    tracer.close()
    assert tracer.stats()["written"] == 6 and tracer.stats()["dropped"] == 0

    (zero,) = search(tmp_path, "ZeroDivisionError")
    assert zero["status"] == "runtime_error" and zero["task_id"] == "fam/add"
    assert zero["episode"] == 1 and zero["policy_version"] == 3 and zero["language"] == "python"
    assert "ZeroDivisionError" in zero["stderr"] and zero["exit_code"] == 1
    assert len(zero["source_sha256"]) == 64

    (spin,) = search(tmp_path, "status:timeout task:HumanEval/32")
    assert spin["limit"] in ("cpu_time", "wall_time") and spin["signal"] == 9
    assert spin["episode"] == 2
    assert spin["limit"] == "wall_time" or spin["cpu_time_s"] >= 0.3 * TIME_SCALE * 0.9
    assert list(search(tmp_path, "status:timeout task:HumanEval/31")) == []
    (chroot,) = search(tmp_path, "syscall:chroot")
    assert chroot["denied_syscalls"] == ["chroot"]
    (sh,) = search(tmp_path, "lang:bash nope")
    assert sh["exit_code"] == 4 and sh["argv"][:2] == ["/bin/sh", "-c"]
    assert len(list(search(tmp_path, "task:fam/*"))) == 2
    assert len(list(search(tmp_path, "kind:job", limit=3))) == 3
    # output is capped and marked
    (big,) = search(tmp_path, "xxxxxxxx")
    assert big["stdout"].startswith("x" * 64) and big["stdout"].endswith("x" * 63 + "\n")
    assert "[... 873 bytes cut ...]" in big["stdout"] and big["stdout_truncated"]

    (rec,) = show(tmp_path, zero["trace_id"])
    assert rec == zero
    assert [r["trace_id"] for r in show(tmp_path, str(zero["job"]))] == [zero["trace_id"]]
    s = summary(tmp_path)
    assert s["kinds"] == {"job": 6}
    assert s["jobs_by_status"]["timeout"] == 1 and s["refused_syscalls"] == {"chroot": 1}
    assert results[0].ok


def test_judgements_carry_the_failing_test_and_traceback(tmp_path, capsys) -> None:
    tracer = Tracer(tmp_path, sink="sqlite")
    with Evaluator(workers=2, timeout=0.5 * TIME_SCALE, tracer=tracer) as ev:
        js = ev.judge_many([(TASK, GOOD), (TASK, ZERO), (TASK, WRONG)])
        js.append(ev.judge(TASK, SPIN))
    assert [j.passed for j in js] == [True, False, False, False]
    assert tracer.flush(30 * TIME_SCALE)
    tracer.close()
    judged = list(search(tmp_path, "kind:judgement"))
    assert len(judged) == 4 and all(r["task_id"] == "HumanEval/32" for r in judged)
    (zero,) = search(tmp_path, "kind:judgement ZeroDivisionError")
    assert "ZeroDivisionError" in zero["traceback"] and zero["error_class"] == "runtime_error"
    (wrong,) = search(tmp_path, "kind:judgement error:wrong_answer")
    assert "candidate(6, 3) == 2" in wrong["failing_test"] + wrong["feedback"]
    (spin,) = search(tmp_path, "kind:judgement error:timeout")
    assert not spin["passed"] and spin["task_id"] == "HumanEval/32"
    # the job behind a judgement shares its judge id: `show` brings both
    jobs = list(search(tmp_path, f"kind:job judge:{zero['judge']}"))
    assert jobs and all(j["task_id"] == "HumanEval/32" for j in jobs)
    shown = show(tmp_path, jobs[0]["trace_id"])
    assert {r["kind"] for r in shown} == {"job", "judgement"}

    from agentrl.cli.main import main

    assert main(["traces", "search", "ZeroDivisionError", "--traces", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ZeroDivisionError" in out and "HumanEval/32" in out
    assert main(["traces", "show", jobs[0]["trace_id"], "--traces", str(tmp_path)]) == 0
    assert "judgement" in capsys.readouterr().out
    assert main(["traces", "stats", "--traces", str(tmp_path)]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["judgements_by_error_class"]["passed"] == 1
    assert main(["traces", "search", "nothing-like-this", "--traces", str(tmp_path)]) == 1
    assert main(["traces", "stats", "--traces", str(tmp_path / "none")]) == 2
    assert "no traces" in capsys.readouterr().err


def test_a_full_queue_drops_and_counts_never_blocks(tmp_path) -> None:
    gate = threading.Event()

    class SlowSink:
        def __init__(self) -> None:
            self.n = 0

        def write(self, records) -> None:
            gate.wait(30)
            self.n += len(records)

        def close(self) -> None:
            pass

    sink = SlowSink()
    tracer = Tracer(tmp_path, sink=sink, max_queue=3)
    with SandboxPool(workers=2, tracer=tracer) as pool:
        for r in pool.map(["print(1)"] * 12):
            assert r.ok
    st = tracer.stats()
    assert st["dropped"] >= 12 - 3 - 2 and st["queued"] + st["dropped"] == 12
    gate.set()
    assert tracer.flush(30)
    tracer.close()
    assert sink.n == st["queued"]


def test_query_parsing_and_bad_arguments(tmp_path) -> None:
    assert parse_query("status:timeout task:HumanEval/32 Zero x:") == (
        {"status": "timeout", "task_id": "HumanEval/32"},
        ["Zero", "x:"],
    )
    with pytest.raises(ValueError, match="sink"):
        Tracer(tmp_path, sink="csv")
    with pytest.raises(ValueError, match="output_cap"):
        Tracer(tmp_path, output_cap=-1)
    with pytest.raises(FileNotFoundError, match="no traces"):
        list(search(tmp_path / "missing", "x"))
    with pytest.raises(TypeError, match="observer"):
        SandboxPool(workers=1, tracer=object())


def test_agentrl_eval_records_traces_and_shows_rates(tmp_path, capsys) -> None:
    from agentrl.cli.main import main

    probs = tmp_path / "p.jsonl"
    probs.write_text(json.dumps({"task_id": TASK.task_id, "prompt": TASK.prompt,
                                 "test": TASK.test, "entry_point": TASK.entry_point}) + "\n")  # fmt: skip
    samples = tmp_path / "s.jsonl"
    rows = [{"task_id": TASK.task_id, "completion": c} for c in (GOOD, ZERO, WRONG)]
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    traces = tmp_path / "traces"
    argv = ["eval", str(samples), "--problems", str(probs), "--k", "1", "--workers", "2",
            "--traces", str(traces)]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "judged 3/3" in err and "sandbox runs/s" in err and "failed 66.7%" in err
    judged = list(search(traces, "kind:judgement task:HumanEval/32"))
    assert sorted(r["status"] for r in judged) == ["passed", "runtime_error", "wrong_answer"]
    jobs = list(search(traces, "kind:job task:HumanEval/32"))
    assert len(jobs) >= 3 and all(j.get("judge") for j in jobs)
