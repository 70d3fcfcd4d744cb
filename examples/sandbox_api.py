"""The sandbox API in one script: cold and warm runs, limits and their verdicts, files in and
out, a session with snapshot/restore, and a pool of jobs from threads and from asyncio.

Run it (as root, or under ``agentrl rootless --``; Linux 5.12+):

    python examples/sandbox_api.py

It prints one line per step, for instance::

    cold run:     ok b'45\\n' (status=ok exit=0 wall=33.2ms cpu=20.0ms mem=3.5MiB)
    warm run:     ok b'hello from a warm fork\\n'
    memory bomb:  memory_limit limit=memory
    busy loop:    timeout limit=cpu_time
    files:        ok out.txt=b'HELLO\\n'
    session:      exists after rm -rf: False; runs after restore: True
    pool batch:   [0, 1, 4, 9, 16, 25, 36, 49]
    asyncio:      ['task 0 ok', 'task 1 ok', 'task 2 ok']
    all steps passed

Each verdict is an ``agentrl.ExecResult``: ``status`` (ok, runtime_error, signaled, timeout,
memory_limit, output_limit, sandbox_error), ``limit`` (which limit fired), stdout and stderr
as bytes, wall/CPU time, peak memory and any refused system calls.
"""

from __future__ import annotations

import asyncio

from agentrl import Limits, Sandbox, SandboxPool, Status

LIMITS = Limits(wall_time_s=5, cpu_time_s=2, memory_bytes=128 << 20, max_pids=16)


def runs_and_limits(sb: Sandbox) -> None:
    # A cold run: any program, started fresh in a new box.
    r = sb.run(["python3", "-c", "print(sum(range(10)))"])
    print(f"cold run:     {r.status} {r.stdout!r} ({r.summary()})")
    assert r.ok and r.stdout == b"45\n"

    # A warm run: a fork of the slot's warm interpreter (same isolation, a few ms).
    r = sb.run_python("print('hello from a warm fork')")
    print(f"warm run:     {r.status} {r.stdout!r}")
    assert r.ok

    # Limits per run. A memory bomb is killed by the memory limit...
    bomb = "x = bytearray(1 << 30)  # 1 GiB against a 64 MiB limit"
    r = sb.run_python(bomb, limits=LIMITS.replace(memory_bytes=64 << 20))
    print(f"memory bomb:  {r.status} limit={r.limit}")
    assert r.status is Status.MEMORY_LIMIT

    # ...and a busy loop by the CPU-time limit (a sleeping one would hit the wall-clock one).
    r = sb.run_python("while True: pass", limits=LIMITS.replace(cpu_time_s=0.5))
    print(f"busy loop:    {r.status} limit={r.limit}")
    assert r.status is Status.TIMEOUT and r.limit in ("cpu_time", "wall_time")


def files_in_and_out(sb: Sandbox) -> None:
    # `files` are written into the box's /work before the run; `collect` hands files back.
    src = "open('out.txt', 'w').write(open('in.txt').read().upper())"
    r = sb.run_python(src, files={"in.txt": "hello\n"}, collect=["out.txt"])
    print(f"files:        {r.status} out.txt={r.files['out.txt']!r}")
    assert r.files["out.txt"] == b"HELLO\n"


def session(sb: Sandbox) -> None:
    # A session keeps its work dir across steps (no process survives a step); snapshot and
    # restore are O(1) whatever the size of the files: the shape of a multi-turn agent.
    with sb.session(files={"repo/main.py": "print('v1')\n"}, cpu_budget_s=10) as s:
        snap = s.snapshot()
        s.run(["rm", "-rf", "repo"])
        gone = s.run(["test", "-e", "repo/main.py"]).ok
        s.restore(snap)
        back = s.run(["python3", "repo/main.py"]).stdout
    restored = back == b"v1\n"
    print(f"session:      exists after rm -rf: {gone}; runs after restore: {restored}")
    assert not gone and restored


def pool_batch() -> None:
    # A pool runs many jobs at once on worker threads (off the GIL). submit_many takes a
    # batch (argv lists, Python source, or mappings with per-job keywords) in one crossing;
    # collect() drains the outcomes as they finish, in any order.
    with SandboxPool(workers=4, limits=LIMITS) as pool:
        ids = pool.submit_many(f"print({i} * {i})" for i in range(8))
        order = {job_id: i for i, job_id in enumerate(ids)}
        squares = [0] * len(ids)
        left = len(ids)
        while left:
            for outcome in pool.collect(timeout=10):
                squares[order[outcome.job_id]] = int(outcome.unwrap().stdout)
                left -= 1
    print(f"pool batch:   {squares}")
    assert squares == [i * i for i in range(8)]


async def pool_asyncio() -> None:
    # From a coroutine, `await pool.run_python(...)` resolves on the event loop; cancelling
    # the awaiting task kills the job's box.
    async with SandboxPool(workers=4, limits=LIMITS) as pool:
        jobs = [pool.run_python(f"print('task {i} ok')") for i in range(3)]
        results = await asyncio.gather(*jobs)
    lines = [r.stdout.decode().strip() for r in results]
    print(f"asyncio:      {lines}")
    assert lines == [f"task {i} ok" for i in range(3)]


def main() -> None:
    with Sandbox(limits=LIMITS, max_concurrency=4) as sb:
        runs_and_limits(sb)
        files_in_and_out(sb)
        session(sb)
    pool_batch()
    asyncio.run(pool_asyncio())
    print("all steps passed")


if __name__ == "__main__":
    main()
