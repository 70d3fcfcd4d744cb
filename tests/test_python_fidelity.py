"""A ``run_python``, warm or cold, behaves like ``python __main__.py`` run on the host in a
directory holding the same files, with the same environment: the same output, byte for byte
(paths and the interpreter's location normalised), the same exit status.

Each program runs three ways: on the host (this interpreter, in a temporary directory), in
the box cold (``Sandbox(warm=False)``) and warm (a fork of the slot's warm interpreter). The
differences that forking makes inherent are tested as what the README documents."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path

import agentrl
import pytest
from agentrl import Bind, Sandbox, Status
from conftest import why

BOX_WORK = "/work"


@pytest.fixture(scope="module")
def boxes() -> Iterator[dict[str, Sandbox]]:
    with Sandbox(max_concurrency=2) as warm, Sandbox(warm=False, max_concurrency=2) as cold:
        yield {"warm": warm, "cold": cold}


def _host_env(sb: Sandbox, work: Path, env: Mapping[str, str] | None) -> dict[str, str]:
    """The box's environment, as the host's interpreter in ``work`` gets it."""
    r = sb.run(["env", "-0"])
    assert r.ok, why(r)
    out = dict(e.split("=", 1) for e in r.stdout.decode().split("\0") if e)
    out["HOME"] = str(work)
    out["PATH"] = os.path.dirname(sys.executable) + ":/usr/local/bin:/usr/bin:/bin"
    out.update(env or {})
    return out


def _normalise(text: bytes, work: Path | None = None) -> str:
    s = text.decode(errors="replace")
    # An editable install of agentrl (a development tree): on the host's sys.path, not in the
    # box's. The installed wheel lives in site-packages, on both.
    tree = os.path.dirname(os.path.dirname(agentrl.__file__))
    if not tree.startswith(sys.prefix + os.sep):
        s = s.replace(f", {tree!r}", "")
    for prefix in sorted({sys.prefix, os.path.realpath(sys.prefix)}, key=len, reverse=True):
        s = s.replace(prefix, "VENV")
    s = re.sub(r"/\.agentrl/py/\d+", "VENV", s)
    if work is not None:
        s = s.replace(str(work), BOX_WORK)
    return re.sub(r" at 0x[0-9a-f]+", " at 0xADDR", s)


def host_run(
    tmp_path: Path,
    sb: Sandbox,
    source: str,
    files: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[str, str, int]:
    """``python __main__.py`` in a directory like the box's /work: (stdout, stderr, status
    as ``subprocess`` gives it, negative for a signal)."""
    work = tmp_path / "work"
    work.mkdir()
    for name, text in {**(files or {}), "__main__.py": source}.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    p = subprocess.run(
        [sys.executable, "__main__.py"],
        cwd=work,
        env=_host_env(sb, work, env),
        capture_output=True,
        timeout=60,
        check=False,
    )
    return _normalise(p.stdout, work), _normalise(p.stderr, work), p.returncode


def box_run(
    sb: Sandbox,
    source: str,
    files: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[str, str, int]:
    r = sb.run_python(source, files=files, env=env)
    assert r.status is not Status.SANDBOX_ERROR, why(r)
    code = -r.signal if r.status is Status.SIGNALED else r.exit_code
    return _normalise(r.stdout), _normalise(r.stderr), code


_PROGRAMS = {
    "ok": "print('hi')\n",
    "uncaught": "def f():\n    raise ValueError('boom')\nf()\n",
    "chained": (
        "def f():\n    raise ValueError('inner')\n"
        "try:\n    f()\nexcept ValueError as e:\n    raise KeyError('outer') from e\n"
    ),
    "during-handling": "try:\n    1 / 0\nexcept ZeroDivisionError:\n    undefined_name\n",
    "keyboard-interrupt": "import atexit\natexit.register(print, 'bye')\nraise KeyboardInterrupt\n",
    "exit-str": "import sys\nsys.exit('bye now')\n",
    "exit-int": "import sys\nprint('x')\nsys.exit(300)\n",
    "exit-none": "raise SystemExit\n",
    "atexit-raises": (
        "import atexit\ndef h():\n    raise RuntimeError('in atexit')\natexit.register(h)\n"
    ),
    "thread-raises": (
        "import threading\ndef t():\n    raise OSError('in thread')\n"
        "th = threading.Thread(target=t)\nth.start()\nth.join()\nprint('after')\n"
    ),
    "excepthook": (
        "import sys\ndef hook(t, v, tb):\n"
        "    import traceback\n"
        "    print('hook', t.__name__, v, len(traceback.extract_tb(tb)), v.__traceback__ is tb)\n"
        "sys.excepthook = hook\ndef f():\n    raise ValueError(1)\nf()\n"
    ),
    "excepthook-raises": (
        "import sys\ndef hook(t, v, tb):\n    raise TypeError('hook broke')\n"
        "sys.excepthook = hook\nraise ValueError(2)\n"
    ),
    "last-value": (
        "import atexit, sys\natexit.register(lambda: print(repr(sys.last_value)))\nraise OSError(5)\n"
    ),
    "stdout-flush-fails": "import os, sys\nprint('x', end='')\nos.close(1)\nsys.exit(3)\n",
    "stdout-closed": "import sys\nprint('x')\nsys.stdout.close()\n",
    "syntax-error": "x = (\n",
    "indentation-error": "if True:\nprint(1)\n",
    "tab-error": "if True:\n        a = 1\n\tb = 2\n",
    "syntax-error-deep": "print(1)\ndef f():\n    return 1 +\n",
    "main-module": (
        "import sys, os\n"
        "print(list(vars()), __name__, __file__, __spec__, __doc__, __package__, __cached__)\n"
        "print(type(__loader__).__name__, vars(__loader__), __builtins__ is sys.modules['builtins'])\n"
        "print(sys.argv, sys.orig_argv, sys.executable, sys.path[0], os.getcwd())\n"
        "print(sys.modules['__main__'].__dict__ is globals())\n"
    ),
    "proc-self": (
        "print(open('/proc/self/cmdline', 'rb').read(), repr(open('/proc/self/comm').read()))\n"
    ),
    "flags": (
        "import sys\nprint(sys.flags, sys.dont_write_bytecode, sys.warnoptions, sys.pycache_prefix)\n"
        "print(sys.stdout.write_through, type(sys.stdout.buffer).__name__, sys.stdout.encoding)\n"
        "print(sys.getfilesystemencoding(), sys.get_int_max_str_digits(), __debug__)\n"
        "print(sys.path[:5])\n"
    ),
    "import-helper": (
        "import os, helper\nprint(helper.VALUE, helper.__file__, sorted(os.listdir('.')))\n"
    ),
    "warning": "import warnings\nwarnings.warn('careful', DeprecationWarning)\nprint('done')\n",
    "hash": "print(hash('a') == hash('a'), hash(b'xyz'), hash('agentrl'))\n",
    "assert": "assert False, 'asserted'\nprint('not asserted')\n",
}

_FILES = {"import-helper": {"helper.py": "VALUE = 42\n"}}

# Runs whose env changes what only a fresh interpreter can take (routed cold when warm), and
# those the warm bootstrap applies itself.
_ENVS = {
    "PYTHONPATH": {"PYTHONPATH": "lib::/nonexistent:lib/"},
    "PYTHONWARNINGS": {"PYTHONWARNINGS": "error::DeprecationWarning,,ignore::UserWarning"},
    "PYTHONUNBUFFERED": {"PYTHONUNBUFFERED": "1"},
    "PYTHONPYCACHEPREFIX": {"PYTHONPYCACHEPREFIX": "/tmp/pyc"},
    "PYTHONDONTWRITEBYTECODE": {"PYTHONDONTWRITEBYTECODE": ""},
    "PYTHONHASHSEED": {"PYTHONHASHSEED": "0"},
    "PYTHONOPTIMIZE": {"PYTHONOPTIMIZE": "1"},
    "PYTHONDEVMODE": {"PYTHONDEVMODE": "1"},
    "PYTHONUTF8": {"PYTHONUTF8": "1"},
    "PYTHONIOENCODING": {"PYTHONIOENCODING": "latin-1:replace"},
    "PYTHONSAFEPATH": {"PYTHONSAFEPATH": "1"},
    "PYTHONINTMAXSTRDIGITS": {"PYTHONINTMAXSTRDIGITS": "5000"},
    "PYTHONNOUSERSITE": {"PYTHONNOUSERSITE": "1"},
    "LANG": {"LANG": "C"},
}

# Programs whose output the hash seed changes: compared only where it is fixed.
_SEEDED = {"hash"}


def _check(tmp_path: Path, boxes: dict[str, Sandbox], name: str, env: dict | None) -> None:
    source, files = _PROGRAMS[name], _FILES.get(name)
    host = host_run(tmp_path, boxes["cold"], source, files, env)
    for path, sb in boxes.items():
        got = box_run(sb, source, files, env)
        if name in _SEEDED and (env or {}).get("PYTHONHASHSEED") is None:
            got, want = got[2], host[2]
        else:
            want = host
        assert got == want, f"{path} differs from the host:\n{got}\n!=\n{want}"


@pytest.mark.parametrize("name", sorted(_PROGRAMS))
def test_programs_behave_as_on_the_host(tmp_path: Path, boxes, name: str) -> None:
    _check(tmp_path, boxes, name, None)


@pytest.mark.parametrize("var", sorted(_ENVS))
@pytest.mark.parametrize("name", ["flags", "import-helper", "warning", "hash", "assert"])
def test_python_variables_take_effect_as_on_the_host(tmp_path: Path, boxes, var, name) -> None:
    _check(tmp_path, boxes, name, _ENVS[var])


def test_keyboard_interrupt_ends_by_sigint(boxes) -> None:
    for sb in boxes.values():
        r = sb.run_python("raise KeyboardInterrupt")
        assert (r.status, r.signal) == (Status.SIGNALED, signal.SIGINT), why(r)


def test_bytecode_is_written_as_on_the_host(tmp_path: Path, boxes) -> None:
    """With the box's PYTHONDONTWRITEBYTECODE=1 no __pycache__; without it, one."""
    src = "import os, helper\nprint(sorted(os.listdir('.')))\n"
    files = {"helper.py": "X = 1\n"}
    for env, want in (
        ({}, "['__main__.py', 'helper.py']"),
        ({"PYTHONDONTWRITEBYTECODE": ""}, None),
    ):
        (tmp_path / str(bool(env))).mkdir()
        host = host_run(tmp_path / str(bool(env)), boxes["cold"], src, files, env)
        if want is None:
            want = "['__main__.py', '__pycache__', 'helper.py']"
        assert host[0].strip() == want
        for path, sb in boxes.items():
            assert box_run(sb, src, files, env)[0].strip() == want, path


def test_each_run_with_a_random_hash_seed_gets_its_own(boxes) -> None:
    """PYTHONHASHSEED=random (and warm=False) give per-run string hashes, as on the host; the
    warm runs of one slot share their interpreter's seed (documented)."""
    src = "print(hash('agentrl'))"
    for sb in boxes.values():
        seen = {sb.run_python(src, env={"PYTHONHASHSEED": "random"}).stdout for _ in range(4)}
        assert len(seen) == 4, seen
    cold = {boxes["cold"].run_python(src).stdout for _ in range(4)}
    assert len(cold) == 4, cold
    with Sandbox(max_concurrency=1) as one:
        warm = {one.run_python(src).stdout for _ in range(4)}
    assert len(warm) == 1, "warm runs of one interpreter share its seed (documented)"


def test_the_program_sees_one_frame_below_its_own_when_warm(tmp_path: Path, boxes) -> None:
    """Documented: the warm program's module frame runs from the bootstrap's, one frame that
    shows in stacks a program takes of itself (never in its tracebacks)."""
    src = textwrap.dedent(
        """\
        import inspect, sys, traceback
        traceback.print_stack()
        print(len(traceback.extract_stack()), len(inspect.stack()), sys._getframe().f_back)
        """
    )
    host = host_run(tmp_path, boxes["cold"], src)
    assert host[0].endswith("1 1 None\n")
    assert box_run(boxes["cold"], src) == host
    out, err, code = box_run(boxes["warm"], src)
    assert code == 0 and out.startswith("2 2 <frame at ") and "file '<string>'" in out
    extra = '  File "<string>", line '
    assert err.startswith(extra) and err.split("\n", 1)[1] == host[1], err


def test_a_start_up_variable_with_pass_fds_is_refused(boxes) -> None:
    r, w = os.pipe()
    try:
        with pytest.raises(ValueError, match=r"PYTHONHASHSEED.*pass_fds"):
            boxes["warm"].run_python("pass", env={"PYTHONHASHSEED": "1"}, pass_fds=[w])
        ok = boxes["warm"].run_python("pass", env={"PYTHONPATH": "x"}, pass_fds=[w])
        assert ok.ok, why(ok)
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("var", sorted(_ENVS))
def test_only_start_up_variables_send_a_run_cold(boxes, var: str) -> None:
    """A warm run's parent is its interpreter, outside its pid namespace (ppid 0); a cold
    run's is the box's init."""
    r = boxes["warm"].run_python("import os; print(os.getppid())", env=_ENVS[var])
    assert r.ok, why(r)
    emulated = var in ("PYTHONPATH", "PYTHONWARNINGS", "PYTHONUNBUFFERED", "PYTHONPYCACHEPREFIX")
    assert r.stdout == (b"0\n" if emulated else b"1\n"), why(r)
    same = boxes["warm"].run_python("import os; print(os.getppid())", env={"LANG": "C.UTF-8"})
    assert same.stdout == b"0\n", "the sandbox's own value changes nothing: " + why(same)


def test_the_warm_interpreter_never_loads_code_from_a_writable_bind(tmp_path: Path) -> None:
    """PYTHONPATH of the sandbox's env reaches the warm interpreter at its start (as the
    host's would): a writable bind on it would let a run plant a sitecustomize.py that the
    next warm interpreter runs with more than a run has."""
    shared = tmp_path / "shared"
    shared.mkdir()
    bind = Bind(str(shared), "/shared", writable=True)
    for env in ({"PYTHONPATH": "/shared"}, {"PYTHONPATH": "/x:/shared/lib"}, {"PYTHONHOME": "/"}):
        with pytest.raises(ValueError, match="writable bind /shared"):
            Sandbox(binds=[bind], env=env)
    with Sandbox(binds=[bind], env={"PYTHONPATH": "/shared"}, warm=False) as cold:
        (shared / "helper.py").write_text("X = 7\n")
        r = cold.run_python("import helper; print(helper.X)")
        assert r.stdout == b"7\n", why(r)
    with Sandbox(binds=[Bind(str(shared), "/shared")], env={"PYTHONPATH": "/shared"}) as warm:
        r = warm.run_python("import helper; print(helper.X)")
        assert r.stdout == b"7\n", why(r)


def test_proc_self_environ_is_the_runs_environment(boxes) -> None:
    src = "print(sorted(open('/proc/self/environ', 'rb').read().split(b'\\0')))"
    for env in (None, {"EXTRA": "1", "PYTHONPATH": "lib"}):
        got = {path: sb.run_python(src, env=env) for path, sb in boxes.items()}
        assert all(r.ok for r in got.values()), got
        assert got["warm"].stdout == got["cold"].stdout, (got["warm"].stdout, got["cold"].stdout)
        assert (b"EXTRA=1" in got["warm"].stdout) == (env is not None)
