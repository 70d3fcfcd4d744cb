"""Soak: thousands of runs must leave nothing behind on the host."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from agentrl import Limits, Sandbox, Status
from conftest import (
    SESSION_MARK,
    agentrl_cgroup_dirs,
    assert_host_clean,
    host_proc_count,
    host_procs_of_box_uids,
    mount_lines,
    my_descendants,
    own_fds,
    tmp_entries,
    wait_count_at_most,
    why,
)

pytestmark = pytest.mark.slow

LIMITS = Limits(wall_time_s=5.0, cpu_time_s=5.0, memory_bytes=128 << 20, max_pids=16)
THREADS = 4
RUNS_PER_THREAD = 520  # 2,080 runs


def threads_of_this_process() -> int:
    return len(os.listdir("/proc/self/task"))


def _busy_slot_threads() -> list[str]:
    """The slot threads of this process (of every Sandbox alive in it) that are between two
    runs rather than idle: ``"tid comm wchan"`` each."""
    busy = []
    for tid in os.listdir("/proc/self/task"):
        try:
            comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            if not comm.startswith("agentrl-slot"):
                continue
            wchan = Path(f"/proc/self/task/{tid}/wchan").read_text().strip()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        # Idle: waiting for work (a futex), or supervising a run that outlives this test, such
        # as a persistent judge of an Evaluator another test left alive (a poll whose fds stay
        # as they are while the run lives). Between two runs a slot is in neither.
        if not (wchan.startswith("futex") or wchan.startswith("poll_schedule_timeout")):
            busy.append(f"{tid} {comm} {wchan}")
    return busy


def _slot_threads_waiting() -> bool:
    return not _busy_slot_threads()


def settled_fds(timeout: float = 10.0) -> int:
    """This process's fd count at a quiescent point.

    A slot hands a run's verdict to its caller first and only then, off the caller's critical
    path, drops what the run left and makes the next run's channels (``between_runs`` in
    ``rust/sandbox/src/run/channels.rs``): right after the last verdicts, slots are still
    doing that, and the count depends on how far each has got (a spare set of channels alone
    is 10 fds: the tmpfs, its root, three pipes and a socket pair). Once every slot thread is
    back waiting for work, an idle slot's fds are a function of its state only: the count is
    read there, twice in a row the same, with the slot threads waiting both times."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        n = len(own_fds())
        if _slot_threads_waiting() and n == last:
            return n
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the slots did not settle in {timeout}s (fds: {last}, {n}; "
                f"busy: {_busy_slot_threads()})"
            )
        last = n if _slot_threads_waiting() else None
        time.sleep(0.02)


def snapshot(cgroups_before: set[str] | None = None) -> dict[str, object]:
    return {
        "fds": settled_fds(),
        "mounts": mount_lines(),
        "cgroups": agentrl_cgroup_dirs(os.getpid()) - (cgroups_before or set()),
        "descendants": len(my_descendants()),
    }


def suspicious_tmp(entries: set[str]) -> set[str]:
    """New /tmp entries that could be the sandbox's: named after it or owned by a box id."""
    found = set()
    for e in entries:
        try:
            st = os.lstat(os.path.join("/tmp", e))
        except FileNotFoundError:
            continue
        if "agentrl" in e or st.st_uid >= 0x5A000000 or st.st_gid >= 0x5A000000:
            found.add(e)
    return found


def hammer(box: Sandbox, argvs: list[list[str]], per_thread: int) -> list:
    """``per_thread`` runs from each of THREADS threads, cycling through ``argvs``."""

    def worker(k: int) -> list:
        return [box.run(argvs[(k + i) % len(argvs)]) for i in range(per_thread)]

    with ThreadPoolExecutor(THREADS) as ex:
        return [r for rs in ex.map(worker, range(THREADS)) for r in rs]


def warm_up(box: Sandbox) -> None:
    """Runs until every slot exists (slots are made as the load needs them)."""
    for _ in range(30):
        hammer(box, [["/bin/true"]], 5)
        if box._inner.slots >= THREADS:
            return


def test_soak_true_leaves_nothing_behind():
    gc.collect()  # what earlier tests left for the collector goes now, not mid-soak
    cgroups_before = agentrl_cgroup_dirs(os.getpid())
    session_boxes = {
        p[0] for p in host_procs_of_box_uids(with_warm=True)
    }  # the session's warm interpreters
    fds_before, threads_before, mounts_before = (
        settled_fds(),
        threads_of_this_process(),
        mount_lines(),
    )
    box = Sandbox(LIMITS, env={"AGENTRL_TEST_MARK": SESSION_MARK}, max_concurrency=THREADS)
    try:
        warm_up(box)
        base, procs, tmp = snapshot(cgroups_before), host_proc_count(), tmp_entries()
        assert base["cgroups"], "the sandbox made no cgroup of its own"
        results = hammer(box, [["/bin/true"], ["sh", "-c", ":"]], RUNS_PER_THREAD)
        assert len(results) >= 2000
        bad = [why(r) for r in results if not r.ok]
        assert not bad, f"{len(bad)} runs failed, e.g. {bad[:3]}"
        assert_host_clean()
        after = snapshot(cgroups_before)
        # fds may only shrink (an object of an earlier test finalised meanwhile); a per-run
        # leak would add thousands.
        assert after["fds"] <= base["fds"], f"grew: {base} -> {after}"
        assert {**after, "fds": 0} == {**base, "fds": 0}, f"grew: {base} -> {after}"
        # Other programs may start processes and temp files meanwhile: tolerances for them,
        # but a per-run leak would show up as hundreds.
        assert wait_count_at_most(host_proc_count, procs + 30) <= procs + 30
        new_tmp = tmp_entries() - tmp
        assert not suspicious_tmp(new_tmp) and len(new_tmp) < 20, sorted(new_tmp)
    finally:
        box.close()
    # After close: the sandbox's cgroups, slot threads and fds are gone.
    left = agentrl_cgroup_dirs(os.getpid()) - cgroups_before
    assert wait_count_at_most(threads_of_this_process, threads_before) == threads_before
    assert mount_lines() == mounts_before
    assert not left, f"cgroups left after close(): {sorted(left)}"
    warm = [p for p in host_procs_of_box_uids(with_warm=True) if p[0] not in session_boxes]
    assert not warm, f"box processes (warm interpreters) alive after close(): {warm}"
    del box
    assert settled_fds() == fds_before, "fds of this process leaked by the sandbox"


ABNORMAL = [
    ["sh", "-c", "exit 3"],
    ["sh", "-c", "sleep 5 & sleep 5"],  # wall-clock kill with a background child
    ["sh", "-c", "yes | head -c 200000"],  # output cap
    ["sh", "-c", "kill -SEGV $$"],
    ["sh", "-c", "while :; do :; done"],  # CPU limit
    ["/no/such/program"],
    ["sh", "-c", "echo x > f; mkfifo p; ln -s /etc/passwd l"],
]


def test_soak_abnormal_endings_leave_nothing_behind():
    cgroups_before = agentrl_cgroup_dirs(os.getpid())
    # The time limits scale with the machine's speed (.ci/guest-matrix sets 10 for its emulated
    # guests): each ending must still come from the limit it is meant to hit.
    scale = float(os.environ.get("AGENTRL_TEST_TIME_SCALE", "1"))
    lim = LIMITS.replace(wall_time_s=0.15 * scale, cpu_time_s=0.1 * scale, max_output_bytes=1000)
    with Sandbox(lim, env={"AGENTRL_TEST_MARK": SESSION_MARK}, max_concurrency=THREADS) as box:
        warm_up(box)
        base = snapshot(cgroups_before)
        statuses: dict[Status, int] = {}
        lock = threading.Lock()

        def worker(k: int) -> None:
            for i in range(40):
                r = box.run(ABNORMAL[(k + i) % len(ABNORMAL)], collect=["f", "p", "l"])
                with lock:
                    statuses[r.status] = statuses.get(r.status, 0) + 1

        with ThreadPoolExecutor(THREADS) as ex:
            list(ex.map(worker, range(THREADS)))
        assert Status.SANDBOX_ERROR not in statuses, statuses
        assert {Status.TIMEOUT, Status.OUTPUT_LIMIT, Status.RUNTIME_ERROR} <= set(statuses)
        assert_host_clean()
        assert snapshot(cgroups_before) == base
    assert not agentrl_cgroup_dirs(os.getpid()) - cgroups_before


# A process that never closes what it opened: the Sandbox is in a cycle held by a module
# global, the pool (an Evaluator's) by another; both have run warm and cold jobs.
_UNCLOSED = """
import os
from agentrl import Sandbox
from agentrl.evaluation import Evaluator, FunctionTask
sb = Sandbox(max_concurrency=2)
sb.me = [sb]
assert sb.run(["/bin/true"]).ok and sb.run_python("print(1)").ok
ev = Evaluator(workers=2)
task = FunctionTask("t", "def f(x):\\n", "assert candidate(2) == 4\\n", "f")
assert ev.judge(task, "    return x * 2\\n").passed
print(os.getpid(), flush=True)
"""

# A process that is killed while its sandbox is open.
_KILLED = """
import os, time
from agentrl import Sandbox
sb = Sandbox(max_concurrency=2)
assert sb.run(["/bin/true"]).ok and sb.run_python("print(1)").ok
print(os.getpid(), flush=True)
time.sleep(60)
"""


def _python(source: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", source], stdout=subprocess.PIPE, text=True)


def _run_to_end(source: str) -> None:
    """Runs ``source`` (which prints its pid last) in a new interpreter to a clean exit, then
    checks the host: none of its cgroups and no box process is left."""
    p = _python(source)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0
    assert not agentrl_cgroup_dirs(int(out.split()[-1]))
    assert_host_clean()


def test_what_a_process_never_closed_is_closed_at_exit():
    _run_to_end(_UNCLOSED)


def _bases(dirs: set[str], pid: int) -> set[Path]:
    return {Path(d) for d in dirs if Path(d).name.startswith(f"agentrl-{pid}-")}


def test_a_killed_process_cgroups_are_removed_by_the_next_sandbox():
    p = _python(_KILLED)
    assert p.stdout is not None
    pid = int(p.stdout.readline())
    p.kill()
    p.wait()
    p.stdout.close()
    left = agentrl_cgroup_dirs(pid)
    assert left, "a killed process cannot remove its cgroups"
    assert_host_clean()
    # Only a base older than the grace period counts as stale (a new one may not be locked yet).
    for base in _bases(left, pid):
        os.utime(base, (time.time() - 3600, time.time() - 3600))
    with Sandbox(max_concurrency=1) as sb:
        assert sb.run(["/bin/true"]).ok
        assert not agentrl_cgroup_dirs(pid)
        # A base whose owner is alive is never touched, however old.
        mine = _bases(agentrl_cgroup_dirs(os.getpid()), os.getpid())
        assert mine
        for base in mine:
            os.utime(base, (time.time() - 3600, time.time() - 3600))
        with Sandbox(max_concurrency=1) as other:
            assert other.run(["/bin/true"]).ok
        assert all(b.is_dir() for b in mine)
        assert sb.run(["/bin/true"]).ok


# A child made with fork() inherits copies of an open Sandbox and pool but not their threads.
_FORKED = """
import os, sys, time, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads (3.12+)
from agentrl import PoolClosed, Sandbox, SandboxError, SandboxPool
sb = Sandbox(max_concurrency=2)
pool = SandboxPool(workers=2)
assert sb.run(["/bin/true"]).ok and sb.run_python("print(1)").ok
assert pool.submit(["/bin/true"]).result().ok
session = sb.session(files={"a.txt": b"1"})
assert session.run(["cat", "a.txt"]).stdout == b"1"
pid = os.fork()
if pid == 0:
    t0 = time.monotonic()
    for call in (lambda: sb.run(["/bin/true"]), lambda: session.run(["true"]), session.reset):
        try:
            call()
            sys.exit(3)
        except SandboxError as e:
            assert "fork" in str(e), e
    session.close()
    try:
        pool.submit(["/bin/true"])
        sys.exit(4)
    except PoolClosed as e:
        assert "fork" in str(e), e
    sb.close()
    pool.close()
    assert time.monotonic() - t0 < 5
    sys.exit(0)  # a normal exit: finalization and atexit run here
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
# The parent's sandbox, session and pool are intact.
assert session.run(["cat", "a.txt"]).stdout == b"1"
session.close()
assert sb.run(["/bin/true"]).ok and sb.run_python("print(2)").stdout == b"2\\n"
assert pool.submit_python("print(3)").result().stdout == b"3\\n"
print(os.getpid(), flush=True)
pool.close()
sb.close()
"""


def test_a_forked_child_refuses_the_parents_sandbox_and_leaves_it_alone():
    _run_to_end(_FORKED)


# A process that exits while a daemon thread's run is in flight.
_EXIT_MID_RUN = """
import os, threading, time
from agentrl import Limits, Sandbox
sb = Sandbox(max_concurrency=2)
started = threading.Event()
def long_run():
    started.set()
    sb.run(["sleep", "30"], limits=Limits(wall_time_s=60, cpu_time_s=60))
threading.Thread(target=long_run, daemon=True).start()
started.wait()
time.sleep(0.5)
print(os.getpid(), flush=True)
"""


def test_exit_cancels_runs_in_flight_instead_of_waiting_for_them():
    t0 = time.monotonic()
    _run_to_end(_EXIT_MID_RUN)
    assert time.monotonic() - t0 < 15, "exit waited for the 30 s run"


# A host process with a low soft limit on open files (1,024 is a common default) and many
# slots busy at once: each busy slot holds about 21 descriptors.
_LOW_NOFILE = """
import json, os, resource, threading
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
from agentrl import Limits, Sandbox
results = []
with Sandbox(max_concurrency=40) as sb:
    raised = resource.getrlimit(resource.RLIMIT_NOFILE)
    def go():
        for _ in range(2):
            results.append(sb.run(["sleep", "0.3"]))
    threads = [threading.Thread(target=go) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    inner = sb.run(["sh", "-c", "ulimit -n"]).stdout.decode().strip()
bad = [r.summary() for r in results if not r.ok]
print(json.dumps({"raised": raised, "hard": hard, "bad": bad[:3], "n": len(results),
                  "inner": inner, "box_limit": Limits().max_open_files}))
print(os.getpid(), flush=True)
"""


def test_a_low_open_files_limit_is_raised_for_the_slots_and_boxes_keep_their_own():
    p = _python(_LOW_NOFILE)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0
    report = json.loads(out.splitlines()[0])
    assert report["n"] == 80
    assert report["bad"] == [], report["bad"]  # 40 busy slots need more than 256 descriptors
    assert report["raised"][0] >= 40 * 21, report["raised"]
    assert report["raised"][1] >= report["hard"]  # a hard limit is never lowered
    assert report["inner"] == str(report["box_limit"])  # the box's limit is its own
    assert not agentrl_cgroup_dirs(int(out.split()[-1]))
    assert_host_clean()


_MANY_SANDBOXES = """
import json, os, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
from agentrl import Sandbox
for _ in range(40):
    with Sandbox(max_concurrency=64) as sb:
        pass
print(json.dumps(resource.getrlimit(resource.RLIMIT_NOFILE)))
print(os.getpid(), flush=True)
"""


def test_closed_sandboxes_stop_counting_toward_the_open_files_limit():
    p = _python(_MANY_SANDBOXES)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0
    soft, _hard = json.loads(out.splitlines()[0])
    # Room for the slots of the sandboxes alive at once (the previous one is still bound to
    # `sb` while the next is made), not for the 40 x 64 made one after another.
    assert 64 * 32 <= soft < 3 * 64 * 32, soft
    assert not agentrl_cgroup_dirs(int(out.split()[-1]))
    assert_host_clean()


def test_a_slot_that_cannot_start_leaves_nothing_and_the_others_serve(tmp_path: Path):
    """A slot added under load that fails to start (here its bind source has vanished) costs
    nothing: the runs go to the slots there are, no cgroup or thread of it stays, and the
    sandbox does not retry on every queued run."""
    data = tmp_path / "data"
    data.mkdir()
    before = agentrl_cgroup_dirs(os.getpid())
    threads_before = threads_of_this_process()
    box = Sandbox(LIMITS, binds=[(str(data), "/data")], max_concurrency=THREADS)
    try:
        data.rmdir()  # every slot made from now on fails to clone its bind source
        results = hammer(box, [["/bin/true"]], 25)
        assert all(r.ok for r in results), [why(r) for r in results if not r.ok][:3]
        assert box._inner.slots == 1
        slots = {Path(d).name for d in agentrl_cgroup_dirs(os.getpid()) - before}
        assert {s for s in slots if s.startswith("slot-")} == {"slot-0"}, sorted(slots)
        assert wait_count_at_most(threads_of_this_process, threads_before + 1) == (
            threads_before + 1
        )
    finally:
        box.close()
    assert not agentrl_cgroup_dirs(os.getpid()) - before


def test_a_sandbox_grows_no_more_slots_than_its_callers_keep_busy():
    """Slots are added only while queued runs outnumber the slots that are not busy, so N
    callers in a loop never make more than N (8 callers used to grow a sandbox to all its 16
    slots: a caller submits again the moment its result wakes it, before its slot is back)."""
    with Sandbox(LIMITS, max_concurrency=4 * THREADS) as box:
        results = hammer(box, [["/bin/true"], ["sh", "-c", ":"]], 40)
        assert all(r.ok for r in results), [why(r) for r in results if not r.ok][:3]
        assert 1 <= box._inner.slots <= THREADS, box._inner.slots
