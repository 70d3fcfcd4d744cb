"""SandboxPool: futures, asyncio (default loop and uvloop), batches, cancellation that kills
boxes, deadlines, infrastructure retries, close; and property tests on the fake-executor pool
(every job gets exactly one terminal outcome, nothing deadlocks, counts add up)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from collections import Counter

import pytest
import uvloop
from agentrl import (
    AgentRLError,
    JobExpired,
    JobFailed,
    JobStatus,
    Limits,
    PoolClosed,
    PoolFull,
    Sandbox,
    SandboxPool,
    Status,
)
from agentrl.pool.testing import _TestPool
from conftest import why
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

OPS = _TestPool


def _run(coro: object, use_uvloop: bool) -> object:
    loop = uvloop.new_event_loop() if use_uvloop else asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)  # type: ignore[arg-type]
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


async def _await(aw: object) -> object:
    return await aw  # type: ignore[misc]


def _procs_with(token: str) -> list[int]:
    found = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(p))
            except OSError:
                pass
    return found


def _wait_gone(token: str, timeout: float = 3.0) -> list[int]:
    end = time.monotonic() + timeout
    while (left := _procs_with(token)) and time.monotonic() < end:
        time.sleep(0.01)
    return left


def _wait_started(token: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not _procs_with(token):
        assert time.monotonic() < end, "the box did not start"
        time.sleep(0.005)


@pytest.fixture
def pool(sb: Sandbox):
    with SandboxPool(sandbox=sb, workers=4, capacity=64) as p:
        yield p


# ---- sandbox jobs


def test_results_and_program_failures_are_completed(pool: SandboxPool) -> None:
    ok = pool.submit(["/bin/sh", "-c", "echo hi; echo err >&2"])
    bad = pool.submit(["/bin/sh", "-c", "exit 3"])
    warm = pool.submit_python("import sys; print(sys.argv); raise SystemExit(5)")
    r = ok.result(10)
    assert r.ok and r.stdout == b"hi\n" and r.stderr == b"err\n", why(r)
    assert bad.result(10).status is Status.RUNTIME_ERROR and bad.result().exit_code == 3
    w = warm.result(10)
    assert w.exit_code == 5 and b"__main__.py" in w.stdout, why(w)
    s = pool.stats()
    assert s["completed"] >= 3 and s["failed"] == 0 and s["retries"] == 0
    assert s["latency_s"]["n"] >= 3 and 0 < s["latency_s"]["p50"] <= s["latency_s"]["p99"]
    for k in ("queue_depth", "queued", "running", "utilisation", "jobs_per_sec", "inflight"):
        assert k in s


def test_files_collect_stdin_env_limits(pool: SandboxPool) -> None:
    f = pool.submit(
        ["/bin/sh", "-c", "cat in.txt; cat; echo $X > out.txt"],
        files={"in.txt": "file "},
        stdin=b"stdin",
        env={"X": "42"},
        collect=["out.txt"],
    )
    r = f.result(10)
    assert r.stdout == b"file stdin" and r.files == {"out.txt": b"42\n"}, why(r)
    t = pool.submit(["/bin/sleep", "5"], limits=Limits(wall_time_s=0.2)).result(10)
    assert t.status is Status.TIMEOUT


def test_python_jobs_take_fds_the_job_holds_until_it_ends(pool: SandboxPool) -> None:
    r, w = os.pipe()
    try:
        fut = pool.submit_python("import os\nos.write(3, b'from the job')", pass_fds=[w])
        os.close(w)  # the job holds its own copy from submission on
        w = -1
        assert fut.result(10).ok
        assert os.read(r, 100) == b"from the job"
        assert os.read(r, 100) == b""  # the job's copy ended with it
        before = pool.stats()["submitted"]
        with pytest.raises(TypeError, match="pass_fds"):
            pool.submit(["/bin/true"], pass_fds=[r])  # argv jobs are cold
        with pytest.raises(ValueError, match="Bad file descriptor"):
            pool.submit_python("pass", pass_fds=[1 << 20])
        with pytest.raises(ValueError, match="job 1: pass_fds"):
            pool.submit_many(["pass", {"source": "pass", "pass_fds": [-1]}])
        assert pool.stats()["submitted"] == before  # nothing was submitted
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_validation_raises_at_submit(pool: SandboxPool) -> None:
    before = pool.stats()["submitted"]
    with pytest.raises(TypeError):
        pool.submit("echo hi")
    with pytest.raises(ValueError, match="escapes"):
        pool.submit(["/bin/true"], files={"../x": b""})
    with pytest.raises(ValueError, match="absolute"):
        pool.submit(["/bin/true"], collect=["/etc/passwd"])
    with pytest.raises(TypeError, match="unexpected"):
        pool.submit(["/bin/true"], stdout=1)
    with pytest.raises(ValueError):
        pool.submit(["/bin/true"], group=-1)
    with pytest.raises(TypeError):
        pool.submit(["/bin/true"], group="a")
    with pytest.raises(ValueError):
        pool.submit(["/bin/true"], priority=1 << 40)
    with pytest.raises(TypeError):
        pool.submit(["/bin/true"], deadline=1, deadline_at=2)
    with pytest.raises(ValueError):
        pool.submit(["/bin/true"], env={"A=B": "c"})
    with pytest.raises(ValueError, match="job 1"):
        pool.submit_many([["/bin/true"], {"argv": ["/bin/true"], "cwd": "/a/../b"}])
    assert pool.stats()["submitted"] == before  # nothing was submitted


@pytest.mark.parametrize(
    "kw, exc, says",
    [
        ({"workers": 0}, ValueError, "workers"),
        ({"capacity": "5"}, TypeError, "capacity"),
        ({"retries": True}, TypeError, "retries"),
        ({"backpressure": "blok"}, ValueError, "backpressure"),
        ({"block_timeout": "x"}, TypeError, "block_timeout"),
        ({"block_timeout": -1}, ValueError, "block_timeout"),
        ({"limits": 5}, TypeError, "limits"),
        ({"sandbox": 5}, TypeError, "sandbox"),
        ({"sandbox": {"network": "no"}}, TypeError, "network"),
    ],
)
def test_pool_arguments_are_checked_and_named(kw, exc, says) -> None:
    with pytest.raises(exc, match=says):
        SandboxPool(**{"workers": 1, **kw})


def test_map_in_order_and_batches(pool: SandboxPool) -> None:
    jobs = [["/bin/sh", "-c", f"echo {i}"] for i in range(20)] + ["print('py')"]
    out = list(pool.map(jobs))
    assert [r.stdout for r in out] == [f"{i}\n".encode() for i in range(20)] + [b"py\n"]
    ids = pool.submit_many([{"source": f"print({i})"} for i in range(10)], priority=1)
    got = {}
    while len(got) < 10:
        for o in pool.collect(timeout=10):
            got[o.job_id] = o
    assert set(got) == set(ids)
    assert sorted(int(o.result.stdout) for o in got.values()) == list(range(10))
    assert pool.collect(timeout=5) == []  # nothing outstanding: returns at once


def test_cancel_group_kills_running_boxes(pool: SandboxPool) -> None:
    token = f"{time.time_ns() % 10**6 + 7}.5"
    futs = [pool.submit(["/bin/sleep", token], group=77) for _ in range(2)]
    queued = [pool.submit(["/bin/sleep", token], group=77) for _ in range(4)]
    _wait_started(token)
    t = time.monotonic()
    assert pool.cancel(77) == 6
    for f in futs + queued:
        with pytest.raises(concurrent.futures.CancelledError):
            f.result(5)
    assert time.monotonic() - t < 2.0
    assert _wait_gone(token) == []
    assert pool.submit(["/bin/true"]).result(10).ok  # the workers are fine


def test_future_cancel_kills_box(pool: SandboxPool) -> None:
    token = f"{time.time_ns() % 10**6 + 3}.25"
    f = pool.submit(["/bin/sleep", token])
    _wait_started(token)
    assert f.cancel() and f.cancelled()
    assert _wait_gone(token) == []
    done = pool.submit(["/bin/true"])
    done.result(10)
    assert not done.cancel()  # finished jobs cannot be cancelled


def test_cancel_kills_warm_python_run(pool: SandboxPool) -> None:
    pool.submit_python("pass").result(30)  # the slot's warm interpreter is up
    f = pool.submit_python("import time; time.sleep(30)")
    end = time.monotonic() + 10
    while pool.stats()["running"] < 1:
        assert time.monotonic() < end
        time.sleep(0.01)
    time.sleep(0.2)
    t = time.monotonic()
    assert f.cancel()
    while pool.stats()["running"]:
        assert time.monotonic() - t < 2, "the run was not stopped"
        time.sleep(0.01)
    assert pool.submit_python("print(7)").result(30).stdout == b"7\n"


def test_deadline_expires_queued_job(sb: Sandbox) -> None:
    with SandboxPool(sandbox=sb, workers=1) as p:
        blocker = p.submit(["/bin/sleep", "0.3"])
        late = p.submit(["/bin/true"], deadline=0.05)
        at = p.submit(["/bin/true"], deadline_at=time.monotonic() + 60)
        with pytest.raises(JobExpired):
            late.result(10)
        assert blocker.result(10).ok and at.result(10).ok
        assert issubclass(JobExpired, AgentRLError) and p.stats()["expired"] == 1


def test_infrastructure_errors_are_retried_then_failed() -> None:
    with SandboxPool(workers=1, retries=2, sandbox={"preimports": ("agentrl_no_such_mod",)}) as p:
        f = p.submit_python("print(1)")
        with pytest.raises(JobFailed, match=r"(?s)after 3 attempt.*agentrl_no_such_mod") as e:
            f.result(60)
        assert "warm interpreter" in e.value.reason
        assert p.stats()["retries"] == 2
        assert p.submit(["/bin/true"]).result(10).ok  # cold runs still work


def test_close_without_drain_cancels_and_loses_nothing(sb: Sandbox) -> None:
    p = SandboxPool(sandbox=sb, workers=2, capacity=32)
    futs = [p.submit(["/bin/sleep", "10"]) for _ in range(6)]
    ids = p.submit_many([["/bin/sleep", "10"]] * 4)
    time.sleep(0.2)
    for bad in ("no", 0, None):  # a flag of the wrong kind closes nothing
        with pytest.raises(TypeError, match="drain"):
            p.close(drain=bad)  # type: ignore[arg-type]
    assert not p.closed
    t = time.monotonic()
    p.close(drain=False)
    assert time.monotonic() - t < 3
    assert all(f.cancelled() for f in futs)
    outs = p.collect()
    assert sorted(o.job_id for o in outs) == sorted(ids)
    assert {o.status for o in outs} == {JobStatus.CANCELLED}
    with pytest.raises(PoolClosed):
        p.submit(["/bin/true"])
    p.close()  # idempotent


def test_close_with_drain_runs_everything(sb: Sandbox) -> None:
    with SandboxPool(sandbox=sb, workers=2) as p:
        futs = [p.submit(["/bin/sh", "-c", f"sleep 0.05; echo {i}"]) for i in range(8)]
    assert [f.result(0).stdout for f in futs] == [f"{i}\n".encode() for i in range(8)]
    assert p.closed and not any(p.stats()[k] for k in ("running", "queued", "futures"))


def test_backpressure(sb: Sandbox) -> None:
    with SandboxPool(sandbox=sb, workers=1, capacity=2, backpressure="error") as p:
        a = p.submit(["/bin/sleep", "0.2"])
        p.submit(["/bin/sleep", "0.2"])
        with pytest.raises(PoolFull):
            p.submit(["/bin/true"])
        with pytest.raises(ValueError, match="capacity"):
            p.submit_many([["/bin/true"]] * 3)
        a.result(10)
    with SandboxPool(sandbox=sb, workers=1, capacity=2, block_timeout=0.1) as p:
        p.submit_many([["/bin/sleep", "0.3"]] * 2)  # nobody collects: room never frees
        with pytest.raises(PoolFull):
            p.submit(["/bin/true"])
        assert not p.cancel_job(12345)  # unknown id: harmless


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_asyncio(sb: Sandbox, loop: str) -> None:
    async def main() -> None:
        async with SandboxPool(sandbox=sb, workers=4) as p:
            rs = await asyncio.gather(*(p.run_python(f"print({i})") for i in range(12)))
            assert [r.stdout for r in rs] == [f"{i}\n".encode() for i in range(12)]
            assert (await p.run(["/bin/sh", "-c", "exit 2"])).exit_code == 2
            token = f"{time.time_ns() % 10**6 + 11}.75"
            task = asyncio.ensure_future(p.run(["/bin/sleep", token]))
            while not _procs_with(token):
                await asyncio.sleep(0.01)
            task.cancel()  # cancelling the future kills the box
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.01)  # the done callbacks run on the next iteration
            assert await asyncio.get_running_loop().run_in_executor(None, _wait_gone, token) == []
            token2 = token + "1"
            waiter = asyncio.ensure_future(_await(p.run(["/bin/sleep", token2])))
            while not _procs_with(token2):
                await asyncio.sleep(0.01)
            waiter.cancel()  # cancelling a task awaiting it does too
            with pytest.raises(asyncio.CancelledError):
                await waiter
            await asyncio.sleep(0.01)
            assert await asyncio.get_running_loop().run_in_executor(None, _wait_gone, token2) == []
            with pytest.raises(JobExpired):
                await p.run(["/bin/true"], deadline=-1)
            # a future of the same pool, resolved by the dispatcher thread
            assert (await asyncio.wrap_future(p.submit(["/bin/true"]))).ok

    _run(main(), loop == "uvloop")


# ---- the fake-executor pool: faults and property tests


def test_panicking_worker_fails_its_job_and_pool_keeps_its_size() -> None:
    with _TestPool(workers=2, retries=1) as p:
        futs = [p.submit(OPS.PANIC) for _ in range(5)] + [p.submit(OPS.NOOP, 7)]
        for f in futs[:5]:
            with pytest.raises(JobFailed, match="executor panicked: injected panic"):
                f.result(5)
        assert futs[5].result(5) == 7
        s = p.stats()
        assert s["panics"] == 5 and s["workers_alive"] == 2 and s["failed"] == 5
        assert p.submit(OPS.FLAKY, 1).result(5) == 1  # one retry, then success
        with pytest.raises(JobFailed, match="after 2 attempt"):
            p.submit(OPS.INFRA).result(5)


def test_priorities_then_fifo_and_collect_max() -> None:
    with _TestPool(workers=1, capacity=64) as p:
        blocker = p.submit(OPS.SLEEP, 100_000)  # holds the only worker while we queue
        time.sleep(0.02)
        jobs = [(OPS.NOOP, i, 0, prio, None) for i, prio in enumerate([0, 2, -1, 2, 0, 9, -9])]
        ids = p.submit_many(jobs)
        blocker.result(5)
        got = []
        while len(got) < len(ids):
            got += p.collect(max=2, timeout=5)
            assert len(got) <= len(ids)
        # 9 is clamped to the top lane and -9 to the bottom one; FIFO within a lane
        assert [o.result for o in got] == [5, 1, 3, 0, 4, 2, 6]
        assert all(o.ok and o.unwrap() == o.result for o in got)
        assert p.stats()["queue_depth"] == dict.fromkeys(range(-3, 4), 0)


JOB = st.tuples(
    st.sampled_from([OPS.NOOP, OPS.SLEEP, OPS.INFRA, OPS.FLAKY, OPS.PANIC]),
    st.integers(0, 3),  # arg (sleep: x 2 ms)
    st.integers(0, 3),  # group
    st.integers(-4, 4),  # priority
    st.sampled_from([None, -1.0, 0.002, 30.0]),  # deadline
    st.booleans(),  # batch (collect) or future
)
SUBMIT = st.tuples(st.just("submit"), st.lists(JOB, min_size=1, max_size=8))
ACTION = st.one_of(
    SUBMIT,
    SUBMIT,
    SUBMIT,
    st.tuples(st.just("cancel_group"), st.integers(0, 3)),
    st.tuples(st.just("cancel_job"), st.integers(0, 50)),
    st.tuples(st.just("collect"), st.integers(1, 5)),
    st.tuples(st.just("sleep"), st.integers(0, 3)),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    actions=st.lists(ACTION, min_size=1, max_size=30),
    drain=st.sampled_from([True, True, False]),
    retries=st.integers(0, 2),
)
def test_every_job_gets_exactly_one_outcome(actions: list, drain: bool, retries: int) -> None:
    p = _TestPool(workers=2, capacity=256, retries=retries)
    futures: dict[int, concurrent.futures.Future] = {}
    batch: set[int] = set()
    specs: dict[int, tuple] = {}
    outcomes: dict[int, object] = {}
    order: list[int] = []
    for action in actions:
        kind, arg = action
        if kind == "submit":
            for op, a, group, prio, deadline, in_batch in arg:
                a = a * 2000 if op == OPS.SLEEP else a
                if in_batch:
                    (jid,) = p.submit_many([(op, a, group, prio, deadline)])
                    batch.add(jid)
                else:
                    f = p.submit(op, a, group=group, priority=prio, deadline=deadline)
                    jid = f.job_id
                    futures[jid] = f
                specs[jid] = (op, a)
                order.append(jid)
        elif kind == "cancel_group":
            p.cancel(arg)
        elif kind == "cancel_job" and order:
            jid = order[arg % len(order)]
            if jid in futures:
                futures[jid].cancel()
            else:
                p.cancel_job(jid)
        elif kind == "collect":
            for o in p.collect(max=arg):
                assert o.job_id not in outcomes, "two outcomes for one job"
                outcomes[o.job_id] = o
        elif kind == "sleep":
            time.sleep(arg / 1000)
    p.close(drain=drain)
    for o in p.collect():
        assert o.job_id not in outcomes, "two outcomes for one job"
        outcomes[o.job_id] = o
    assert set(outcomes) == batch
    assert p.collect(timeout=1) == []
    assert all(f.done() for f in futures.values())  # close resolved every future

    kinds: Counter[str] = Counter()
    for jid in order:
        op, a = specs[jid]
        if jid in futures:
            f = futures[jid]
            if f.cancelled():
                status = "cancelled"
            elif isinstance(f.exception(0), JobExpired):
                status = "expired"
            elif f.exception(0) is not None:
                status = "failed"
                reason = f.exception(0).reason
            else:
                status, value = "completed", f.result(0)
        else:
            o = outcomes[jid]
            status, value, reason = o.status.value, o.result, o.reason
        kinds[status] += 1
        if status == "completed":
            assert op in (OPS.NOOP, OPS.SLEEP, OPS.FLAKY)
            if op == OPS.FLAKY:
                assert a <= retries and value == a
            else:
                assert value == a
        if status == "failed":
            if op == OPS.PANIC:
                assert reason == "executor panicked: injected panic"
            else:
                assert op in (OPS.INFRA, OPS.FLAKY)
                assert f"after {retries + 1} attempt" in reason
    s = p.stats()
    assert s["submitted"] == len(order)
    for k in ("completed", "cancelled", "expired", "failed"):
        assert s[k] == kinds[k], (k, s, kinds)
    assert s["finished"] == len(order) and s["workers"] == 2
    assert s["inflight"] == 0 and s["futures"] == 0 and s["uncollected"] == 0
    if drain:
        assert kinds["cancelled"] == 0 or any(a[0].startswith("cancel") for a in actions)


@settings(max_examples=80, deadline=None)
@given(
    jobs=st.lists(st.tuples(st.sampled_from([0, 1, 2, 4]), st.integers(0, 3)), max_size=30),
    cancel_at=st.integers(0, 30),
    use_uvloop=st.booleans(),
)
def test_async_exactly_once(jobs: list, cancel_at: int, use_uvloop: bool) -> None:
    async def main() -> None:
        got: dict[int, str] = {}
        async with _TestPool(workers=2, capacity=16, retries=1) as p:

            async def one(i: int, op: int, a: int) -> None:
                try:
                    await p.run(op, a * 1000 if op == OPS.SLEEP else a, group=a)
                    got[i] = "completed"
                except asyncio.CancelledError:
                    got[i] = "cancelled"
                except JobFailed:
                    got[i] = "failed"

            tasks = [asyncio.ensure_future(one(i, *j)) for i, j in enumerate(jobs)]
            await asyncio.sleep(0)
            if cancel_at < len(tasks):
                tasks[cancel_at].cancel()  # its job may still finish first: either is fine
            p.cancel(1)
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
            s = p.stats()
        assert len(got) == len(jobs)
        assert s["finished"] == s["submitted"] >= len(jobs) - 1  # one may never be submitted
        others = Counter(v for i, v in got.items() if i != cancel_at)
        slack = 1 if cancel_at < len(jobs) else 0
        for k in ("completed", "failed", "cancelled"):
            assert 0 <= s[k] - others[k] <= slack, (k, s, got)

    _run(main(), use_uvloop)
