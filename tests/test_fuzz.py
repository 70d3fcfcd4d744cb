"""Bad input never crosses into Python as anything but a clear exception.

Hypothesis builds calls of the sandbox's public API and of the extension module's own entry
points (``agentrl._core``, which skip the Python layer's checks): each call is well formed but
for up to two arguments replaced by hostile values (wrong types, NUL bytes, escaping paths,
NaN, infinities, out-of-range integers, tuples of the wrong length). Every call either runs,
returning a well-formed verdict, or raises ``TypeError``, ``ValueError``, ``OverflowError`` or
an ``AgentRLError``. A Rust panic would surface as ``pyo3_runtime.PanicException``, a
``BaseException``, and fail these tests; a crash of the extension would end the test process.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

import pytest
from agentrl import AgentRLError, ExecResult, Limits, Sandbox, Status
from conftest import DEFAULT_LIMITS, SESSION_MARK
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CLEAR = (TypeError, ValueError, OverflowError, AgentRLError)
STATUSES = {s.value for s in Status}
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# --- values -----------------------------------------------------------------------------------

texts = st.one_of(
    st.sampled_from(["", ".", "..", "/", "a", "a/b", "../x", "/work/x", "a\0b", "x" * 300]),
    st.text(max_size=12),
)
blobs = st.one_of(st.binary(max_size=64), st.text(max_size=16))
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    texts,
    st.binary(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
hostile_numbers = st.one_of(
    st.sampled_from([0, -1, 2**31, 2**63, 2**64, 2**70, 0.0, -0.0, 1e300, math.nan, math.inf]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**66), max_value=2**66),
    junk,
)
LIMIT_FIELDS = [  # Limits' fields in order, each with a sane range for a short run
    st.floats(min_value=0.5, max_value=3.0),
    st.floats(min_value=0.5, max_value=3.0),
    st.integers(min_value=64 << 20, max_value=512 << 20),
    st.integers(min_value=8, max_value=64),
    st.integers(min_value=1 << 10, max_value=1 << 20),
    st.integers(min_value=1 << 10, max_value=64 << 20),
    st.integers(min_value=16, max_value=256),
    st.integers(min_value=1 << 20, max_value=64 << 20),
]
limit_tuples = st.tuples(*LIMIT_FIELDS)
names = st.sampled_from(["f", "in.txt", "a/b.txt", "sub/dir/x"])


def _one_field_hostile(t: tuple) -> st.SearchStrategy[tuple]:
    return st.tuples(st.integers(0, 7), hostile_numbers).map(
        lambda iv: (*t[: iv[0]], iv[1], *t[iv[0] + 1 :])
    )


VALID = {
    "argv": st.sampled_from(
        [[b"/bin/true"], [b"/bin/echo", b"hi"], [b"/bin/cat", b"f"], [b"/bin/sh", b"-c", b"exit 3"]]
    ),
    "stdin": st.binary(max_size=64),
    "files": st.lists(
        st.tuples(names, st.binary(max_size=64)), max_size=3, unique_by=lambda p: p[0]
    ),
    "collect": st.lists(names, max_size=3),
    "limits": st.one_of(st.none(), limit_tuples),
    "cwd": st.sampled_from([None, "sub", "/tmp", "/work"]),
    "env": st.lists(
        st.tuples(st.sampled_from(["A", "B_1", "LANG"]), st.text("abc", max_size=5)), max_size=2
    ),
    "warm": st.booleans(),
}
HOSTILE = {
    "argv": st.one_of(st.lists(st.one_of(st.binary(max_size=8), texts, junk), max_size=3), junk),
    "stdin": junk,
    "files": st.one_of(
        st.lists(st.tuples(texts, blobs), max_size=3), st.lists(junk, max_size=2), junk
    ),
    "collect": st.one_of(st.lists(st.one_of(texts, junk), max_size=3), junk),
    "limits": st.one_of(
        limit_tuples.flatmap(_one_field_hostile),
        st.lists(hostile_numbers, max_size=10).map(tuple),
        junk,
    ),
    "cwd": st.one_of(texts, junk),
    "env": st.one_of(
        st.lists(st.tuples(texts, texts), max_size=3), st.lists(junk, max_size=2), junk
    ),
    "warm": junk,
}


def draw_call(data: st.DataObject, params: list[str]) -> dict[str, object]:
    """Well-formed values for ``params``, up to two of them replaced by hostile ones."""
    args = {p: data.draw(VALID[p], label=p) for p in params}
    for p in sorted(data.draw(st.sets(st.sampled_from(params), max_size=2), label="hostile")):
        args[p] = data.draw(HOSTILE[p], label=f"hostile {p}")
    return args


def _pairs_to_dict(v: object) -> object:
    """The public API takes mappings where the extension takes lists of pairs."""
    if isinstance(v, list) and all(isinstance(p, tuple) and len(p) == 2 for p in v):
        return dict(v)
    return v


def _limits(v: object) -> object:
    """A tuple of Limits' fields as Limits when valid, else as it is (hostile)."""
    if isinstance(v, tuple):
        try:
            return Limits(*v)
        except (TypeError, ValueError):
            return v
    return v


# --- checking a call --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_sb() -> Iterator[Sandbox]:
    limits = DEFAULT_LIMITS.replace(wall_time_s=2.0, cpu_time_s=2.0)
    with Sandbox(limits, env={"AGENTRL_TEST_MARK": SESSION_MARK}, max_concurrency=2) as box:
        yield box


def _clear(call: Callable[[], object]) -> object:
    """Runs ``call``: its result, or None after a clear exception; fails on anything else."""
    try:
        r = call()
    except CLEAR:
        return None
    except BaseException as e:  # PanicException, SystemError, ...
        pytest.fail(f"{type(e).__module__}.{type(e).__name__} crossed into Python: {e}")
    return r


def _check_verdict(r: object) -> None:
    if r is None:
        return
    if isinstance(r, ExecResult):
        assert r.status.value in STATUSES, r
    else:
        assert isinstance(r, dict) and r.get("status") in STATUSES, r


# --- the public API --------------------------------------------------------------------------


@FUZZ
@given(data=st.data())
def test_sandbox_run_gives_a_verdict_or_a_clear_error(fuzz_sb, data):
    a = draw_call(data, ["argv", "stdin", "files", "collect", "limits", "cwd", "env"])
    argv, files, env = a.pop("argv"), _pairs_to_dict(a.pop("files")), _pairs_to_dict(a.pop("env"))
    limits = _limits(a.pop("limits"))
    _check_verdict(
        _clear(lambda: fuzz_sb.run(argv, files=files, env=env, limits=limits, **a))  # type: ignore[arg-type]
    )


@FUZZ
@given(
    source=st.one_of(st.sampled_from(["print(1)", "import sys; sys.exit(3)", "1/0"]), texts, junk),
    files=st.one_of(VALID["files"], HOSTILE["files"]),
)
def test_run_python_gives_a_verdict_or_a_clear_error(fuzz_sb, source, files):
    files = _pairs_to_dict(files)
    _check_verdict(_clear(lambda: fuzz_sb.run_python(source, files=files)))  # type: ignore[arg-type]


@settings(max_examples=400, deadline=None)
@given(
    fields=st.dictionaries(
        st.sampled_from(list(Limits.__dataclass_fields__)),
        st.one_of(
            st.floats(min_value=0.1, max_value=100.0), st.integers(1, 1 << 30), hostile_numbers
        ),
        max_size=4,
    )
)
def test_limits_accept_or_name_the_bad_field(fields):
    try:
        lim = Limits(**fields)
    except (TypeError, ValueError) as e:
        assert any(name in str(e) for name in fields), f"{e!r} names none of {sorted(fields)}"
        return
    for name, value in fields.items():
        got = getattr(lim, name)
        assert got == value and not (isinstance(got, float) and math.isnan(got))


# --- the extension module's own entry points -------------------------------------------------


@FUZZ
@given(data=st.data())
def test_core_run_gives_a_verdict_or_a_clear_error(fuzz_sb, data):
    a = draw_call(data, ["argv", "stdin", "files", "collect", "limits", "cwd", "env", "warm"])
    raw = fuzz_sb._inner
    if a["warm"] is True and isinstance(a["files"], list):  # a warm run's program
        a["files"] = [*a["files"], ("__main__.py", b"print(1)")]
    args = [a[p] for p in ("argv", "stdin", "files", "collect", "limits", "cwd", "env", "warm")]
    _check_verdict(_clear(lambda: raw.run(*args)))


@FUZZ
@given(
    files=st.one_of(VALID["files"], HOSTILE["files"]),
    disk=st.one_of(st.integers(min_value=1 << 20, max_value=64 << 20), hostile_numbers),
)
def test_core_session_gives_a_session_or_a_clear_error(fuzz_sb, files, disk):
    s = _clear(lambda: fuzz_sb._inner.session(files, disk))
    if s is not None:
        s.close()


def test_sessions_and_snapshots_misused(fuzz_sb):
    a = fuzz_sb.session(files={"f": "a"})
    b = fuzz_sb.session(files={"f": "b"})
    snap = a.snapshot()
    for call in (
        lambda: b.restore(snap),  # another session's snapshot
        lambda: b.restore(object()),  # type: ignore[arg-type]
        lambda: fuzz_sb._inner.run([b"/bin/true"], b"", [], [], None, None, [], False, object()),
    ):
        with pytest.raises(CLEAR):
            call()
    a.close()
    for call in (a.reset, a.snapshot, lambda: a.restore(snap), lambda: a.run(["/bin/true"])):
        with pytest.raises(CLEAR):
            call()
    a.close()  # idempotent
    r = b.run(["/bin/cat", "f"])
    assert r.ok and r.stdout == b"b"
    b.close()


# --- the pool: a refused batch submits nothing, an accepted job gets exactly one outcome ------

SCHED_VALID = {
    "group": st.integers(0, 3),
    "priority": st.integers(-5, 5),
    "deadline": st.one_of(st.none(), st.floats(min_value=5.0, max_value=30.0)),
}
SCHED_HOSTILE = {
    "group": hostile_numbers,
    "priority": hostile_numbers,
    "deadline": st.one_of(st.sampled_from([-1.0, 0.0, math.nan, math.inf]), hostile_numbers),
}


@pytest.fixture(scope="module")
def fuzz_pool(fuzz_sb: Sandbox) -> Iterator[object]:
    from agentrl import SandboxPool

    with SandboxPool(workers=2, sandbox=fuzz_sb) as pool:
        yield pool


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), n=st.integers(1, 4))
def test_pool_batches_are_all_or_nothing_and_every_job_ends_once(fuzz_pool, data, n):
    jobs = []
    for i in range(n):
        a = draw_call(data, ["argv", "stdin", "files", "collect", "limits", "cwd", "env"])
        job = {
            "argv": a["argv"],
            "stdin": a["stdin"],
            "files": _pairs_to_dict(a["files"]),
            "collect": a["collect"],
            "limits": _limits(a["limits"]),
            "env": _pairs_to_dict(a["env"]),
        }
        if a["cwd"] is not None:
            job["cwd"] = a["cwd"]
        for key in data.draw(
            st.sets(st.sampled_from(sorted(SCHED_VALID)), max_size=2), label=f"sched {i}"
        ):
            bad = data.draw(st.booleans(), label=f"hostile {key}")
            job[key] = data.draw((SCHED_HOSTILE if bad else SCHED_VALID)[key], label=key)
        jobs.append(job)
    before = fuzz_pool.stats()["submitted"]
    ids = _clear(lambda: fuzz_pool.submit_many(jobs))
    if ids is None:  # refused: as a whole, before any job crossed to the workers
        assert fuzz_pool.stats()["submitted"] == before
        return
    assert len(ids) == n and len(set(ids)) == n
    outcomes = []
    deadline = time.monotonic() + 60
    while len(outcomes) < n and time.monotonic() < deadline:
        outcomes += fuzz_pool.collect(timeout=1.0)
    assert sorted(o.job_id for o in outcomes) == sorted(ids), (outcomes, ids)
    for o in outcomes:
        assert o.status in ("completed", "expired", "failed"), o
        if o.status == "completed":
            _check_verdict(o.result)
    assert fuzz_pool.stats()["panics"] == 0


# --- making sandboxes and sessions ------------------------------------------------------------

CTOR_VALID = {
    "network": st.booleans(),
    "binds": st.sampled_from([(), [("/usr/share/doc", "/data")], [("/etc", "/host-etc", False)]]),
    "env": st.dictionaries(st.sampled_from(["A", "B_1"]), st.text("xyz", max_size=4), max_size=2),
    "max_concurrency": st.integers(1, 3),
    "warm": st.booleans(),
    "preimports": st.sampled_from([(), ("json",), ("json", "math")]),
    "cgroup_parent": st.none(),
}
CTOR_HOSTILE = {
    "network": junk,
    "binds": st.one_of(
        st.lists(st.tuples(texts, texts), max_size=2),
        st.lists(st.tuples(texts, texts, junk), max_size=2),
        st.lists(junk, max_size=2),
        junk,
    ),
    "env": st.one_of(st.dictionaries(texts, texts, max_size=2), junk),
    "max_concurrency": hostile_numbers,
    "warm": junk,
    "preimports": st.one_of(st.lists(st.one_of(texts, junk), max_size=2), junk),
    "cgroup_parent": st.one_of(texts, junk),
}


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_making_a_sandbox_gives_one_or_a_clear_error(data):
    kw = {p: data.draw(CTOR_VALID[p], label=p) for p in CTOR_VALID}
    for p in sorted(
        data.draw(st.sets(st.sampled_from(sorted(CTOR_VALID)), max_size=2), label="bad")
    ):
        kw[p] = data.draw(CTOR_HOSTILE[p], label=f"hostile {p}")
    box = _clear(lambda: Sandbox(DEFAULT_LIMITS, **kw))  # type: ignore[arg-type]
    if box is not None:
        try:
            _check_verdict(_clear(lambda: box.run(["/bin/true"])))
        finally:
            box.close()


SESSION_VALID = {
    "files": st.dictionaries(names, st.binary(max_size=32), max_size=2),
    "limits": st.one_of(st.none(), limit_tuples.map(_limits)),
    "disk_bytes": st.one_of(st.none(), st.integers(1 << 20, 16 << 20)),
    "cpu_budget_s": st.one_of(st.none(), st.floats(0.5, 10.0)),
}
SESSION_HOSTILE = {
    "files": HOSTILE["files"],
    "limits": HOSTILE["limits"],
    "disk_bytes": hostile_numbers,
    "cpu_budget_s": hostile_numbers,
}


@FUZZ
@given(data=st.data())
def test_sessions_give_steps_or_clear_errors(fuzz_sb, data):
    kw = {p: data.draw(SESSION_VALID[p], label=p) for p in SESSION_VALID}
    bad = data.draw(st.sets(st.sampled_from(sorted(SESSION_VALID)), max_size=1), label="bad")
    for p in sorted(bad):
        kw[p] = data.draw(SESSION_HOSTILE[p], label=f"hostile {p}")
    kw["files"], kw["limits"] = _pairs_to_dict(kw["files"]), _limits(kw["limits"])
    s = _clear(lambda: fuzz_sb.session(**kw))
    if s is None:
        return
    try:
        a = draw_call(data, ["argv", "stdin", "collect", "limits", "env"])
        limits_ = _limits(a.pop("limits"))
        argv, env = a.pop("argv"), _pairs_to_dict(a.pop("env"))
        _check_verdict(_clear(lambda: s.run(argv, limits=limits_, env=env, **a)))
        _clear(s.reset)
        _check_verdict(_clear(lambda: s.run(["/bin/true"])))
    finally:
        s.close()
