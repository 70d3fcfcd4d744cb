"""The warm interpreter's bootstrap (the Rust core's ``agentrl_sandbox::warm``: the process
that forks each warm run).

It runs inside a box, started once per slot as ``python -c BOOTSTRAP`` with the sandbox's
own environment (so ``sys.flags`` and all start-up state are what ``python __main__.py`` gets
from that environment; the sandbox refuses one whose code paths reach a writable bind), as
root of its own user namespace (an unprivileged host uid). It loads agentrl's extension module from
where the sandbox bound it, imports the configured modules, and then serves requests on
fd 3 in a loop written in Rust (``_warm_serve``): for each one it starts a new pid namespace
with a tiny init as pid 1 and forks a child into it as pid 2; the child isolates itself (new
mount namespace, fresh tmpfs, its own ``/proc``, the box user, no capabilities,
``no_new_privs``, seccomp, every fd but 0/1/2 closed), returns from the loop and runs
``/work/__main__.py`` as ``python __main__.py`` would, while the interpreter reports the
pidfds and, later, the exit status.

The run matches a cold run (and the host) in ``sys.argv``, ``sys.orig_argv``,
``/proc/self/cmdline`` and ``environ`` (set by the request loop), ``comm``, ``sys.path``,
``__main__``'s namespace, what it prints for an uncaught exception or a SyntaxError and its
exit status (SIGINT for an uncaught KeyboardInterrupt). The PYTHON* variables of a run's
``env`` that a fork can apply are applied here (``_agentrl_start_env``); a run that changes
any other start-up state runs cold (``native._cold_because``). What a fork cannot change:
the string hash seed (one per warm interpreter, shared by its runs) and one frame of this
bootstrap below the program's module frame (``sys._getframe().f_back``, ``inspect.stack()``,
``traceback.print_stack()``, one frame less of recursion depth).
"""

from __future__ import annotations

__all__ = ["bootstrap_argv"]

_SOURCE = r"""
# _agentrl_warm (what the tests find the warm interpreters on the host by)
import os, sys
# sys.path[0] of `-c` is the working directory ("/" here): nothing is imported from it.
if not getattr(sys.flags, "safe_path", False):
    del sys.path[0]

def _agentrl_closed(names):
    # The modules to keep, with every ancestor package of each: a kept `collections.abc`
    # whose `collections` were dropped would be re-imported as a new package without its
    # `abc` attribute, a state no fresh interpreter can be in.
    keep = set(names)
    for name in list(keep):
        while "." in name:
            name = name.rpartition(".")[0]
            keep.add(name)
    return keep

def _agentrl_run(env, own_env):
    # The state `python __main__.py` starts the program in, in /work: its arguments, its
    # path, a fresh __main__ with what the interpreter puts there; then the compiled program
    # (or the SyntaxError, reported as the interpreter does: no traceback).
    atexit._clear()
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
        _agentrl_start_env(dict(own_env))
    path = "/work/__main__.py"
    sys.argv = ["__main__.py"]
    sys.orig_argv = [sys.orig_argv[0], "__main__.py"]
    if not getattr(sys.flags, "safe_path", False):
        sys.path.insert(0, "/work")
    main = _agentrl_run_state(type(sys)("__main__"))
    sys.modules["__main__"] = main
    error = None
    try:
        with open(path, "rb") as f:
            source = f.read()
        code = compile(source, path, "exec", dont_inherit=True)
    except BaseException as e:
        error = e.with_traceback(None)
    if error is not None:
        # Outside the handler: nothing is being handled while the interpreter reports it.
        _agentrl_exit(error)
    return main.__dict__, code

def _agentrl_run_state(main):
    # __main__ as the interpreter makes it for a file (called once in the warm interpreter
    # too, so that a run finds the code it runs here warmed up).
    path = "/work/__main__.py"
    main.__loader__ = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", path)
    main.__annotations__ = {}
    main.__builtins__ = sys.modules["builtins"]
    main.__file__ = path
    main.__cached__ = None
    return main

def _agentrl_start_env(own):
    # What the interpreter takes from PYTHON* variables at start-up, for those a run may set
    # (the sandbox runs any other change of them cold, in a fresh interpreter).
    get = os.environ.get
    new = get("PYTHONPATH", "")
    if new != own.get("PYTHONPATH", ""):
        # As getpath and site build it: absolute, after sys.path[0], duplicates dropped.
        seen = set()
        entries = [os.path.abspath(p) for p in new.split(os.pathsep)] if new else []
        sys.path[:] = [p for p in entries + sys.path if not (p in seen or seen.add(p))]
    new = get("PYTHONWARNINGS", "")
    if new != own.get("PYTHONWARNINGS", ""):
        sys.warnoptions[:] = [o for o in new.split(",") if o]
        if "warnings" in sys.modules:
            sys.modules["warnings"]._processoptions(sys.warnoptions)
        else:
            import warnings
    new = get("PYTHONUNBUFFERED", "")
    if new and not own.get("PYTHONUNBUFFERED", ""):
        io = sys.modules["io"]
        for fd, name in ((1, "stdout"), (2, "stderr")):
            old = getattr(sys, name)
            raw = io.FileIO(fd, "wb", closefd=False)
            raw.name = "<" + name + ">"
            stream = io.TextIOWrapper(raw, old.encoding, old.errors, "\n", False, True)
            stream.mode = "w"
            setattr(sys, name, stream)
            setattr(sys, "__" + name + "__", stream)
    new = get("PYTHONPYCACHEPREFIX", "")
    if new != own.get("PYTHONPYCACHEPREFIX", ""):
        sys.pycache_prefix = new or None

def _agentrl_exit(exc):
    # The end of `python __main__.py`: the uncaught exception reported (without this
    # bootstrap's frame), non-daemon threads joined, atexit handlers run, output flushed.
    code = 0
    if exc is not None:
        tb = exc.__traceback__
        if tb is not None and tb.tb_frame.f_globals is globals():
            tb = exc.__traceback__ = tb.tb_next
        code = _agentrl_report(exc, tb)
    threading = sys.modules.get("threading")
    if threading is not None and hasattr(threading, "_shutdown"):
        try:
            threading._shutdown()
        except BaseException:
            pass
    atexit._run_exitfuncs()
    # Py_FinalizeEx: an error flushing stdout is reported as unraisable and the exit status
    # becomes 120; one flushing stderr is ignored.
    out = sys.stdout
    if out is not None and not getattr(out, "closed", False):
        try:
            out.flush()
        except BaseException as e:
            sys.stderr.write("Exception ignored in: " + repr(out) + "\n")
            sys.__excepthook__(type(e), e.with_traceback(None), None)
            code = 120
    try:
        sys.stderr.flush()
    except BaseException:
        pass
    if type(exc) is KeyboardInterrupt:
        # As the interpreter does: the exit status says SIGINT killed it.
        import _signal
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        os.kill(os.getpid(), _signal.SIGINT)
        code = 130
    os._exit(code)

def _agentrl_report(exc, tb):
    # PyErr_Print's sequence: SystemExit is an exit status (its code printed if not an
    # int), anything else goes to sys.excepthook, with what it does when the hook fails.
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        err = sys.stderr
        if err is not None:
            err.write(str(code))
            err.write("\n")
        return 1
    kind = type(exc)
    sys.last_type, sys.last_value, sys.last_traceback = kind, exc, tb
    hook = getattr(sys, "excepthook", None)
    if hook is None:
        sys.stderr.write("sys.excepthook is missing\n")
        sys.__excepthook__(kind, exc, tb)
        return 1
    try:
        hook(kind, exc, tb)
    except BaseException as e:
        if isinstance(e, SystemExit):
            return _agentrl_report(e, None)
        t2 = e.__traceback__ = e.__traceback__.tb_next
        e.__context__ = None
        sys.stderr.write("Error in sys.excepthook:\n")
        sys.__excepthook__(type(e), e, t2)
        sys.stderr.write("\nOriginal exception was:\n")
        sys.__excepthook__(kind, exc, tb)
    return 1

# The warm interpreter, at module level: nothing here is ever freed, so a run (which
# returns from the request loop to here) writes none of it, and so copies none of its pages.
# The extension is loaded with the import system's own frozen loaders, which are loaded
# at every start-up: importlib.util would import 17 modules (collections, functools, ...)
# that the preimports then share, and that could not be dropped again without leaving the
# run a state no fresh interpreter has (typing holding one collections, the run another).
bootstrap = sys.modules["_frozen_importlib"]
loader = sys.modules["_frozen_importlib_external"].ExtensionFileLoader("_core", CORE_PATH)
core = bootstrap.module_from_spec(bootstrap.spec_from_loader("_core", loader))
loader.exec_module(core)
for name in PREIMPORTS:
    __import__(name)
for name, text in PRELOAD:
    mod = type(sys)(name)
    mod.__file__ = "<agentrl-preload:" + name + ">"
    sys.modules[name] = mod
    exec(compile(text, mod.__file__, "exec"), mod.__dict__)
allowed = _agentrl_closed(sys.modules)
import atexit, gc
core._warm_init()
# Warm what every run would otherwise build afresh in its own copy of the heap: the
# compiler's AST types (made on the first compile()).
compile("pass", "<warm>", "exec", dont_inherit=True)
_agentrl_run_state(type(sys)("__main__"))
# Modules of the bootstrap itself leave sys.modules here, once, rather than in every
# run (the references above keep them alive).
for name in list(sys.modules):
    if name not in allowed:
        del sys.modules[name]
clean = len(sys.modules)
own_env = list(os.environ.items())
# threading's after-fork hook rebuilds its bookkeeping for the threads a fork left
# behind. This interpreter forks while single-threaded, where the child's copy is already
# right: the hook is skipped then (it would copy ~100 pages of this heap into every run)
# and restored in the run, for forks of the run's own.
threading = sys.modules.get("threading")
after_fork = getattr(threading, "_after_fork", None)
after_fork_code = getattr(after_fork, "__code__", None)
if after_fork_code is not None and threading.active_count() == 1:
    after_fork.__code__ = (lambda: None).__code__
ctl = 3
# Last: the supervisor takes what this interpreter holds now as the baseline that each
# run's memory is counted above.
core._warm_trim()
core._warm_send(ctl, b"R", [])
# The request loop is in Rust (each line of Python here would copy pages into every
# run): it returns only in a run, set up, with the environment to install (None: this
# one's). Before each fork it flushes the output (not to be written again by the run)
# and freezes the heap: a collection in a run would touch, and so copy, every page of it.
try:
    env = core._warm_serve(ctl, [sys.stdout.flush, sys.stderr.flush, gc.freeze], own_env)
except EOFError:
    os._exit(0)
if after_fork_code is not None:
    after_fork.__code__ = after_fork_code
if len(sys.modules) != clean:
    for name in list(sys.modules):
        if name not in allowed:
            del sys.modules[name]
_agentrl_globals, _agentrl_code = _agentrl_run(env, own_env)
_agentrl_error = None
try:
    exec(_agentrl_code, _agentrl_globals)
except BaseException as _agentrl_exc:
    _agentrl_error = _agentrl_exc
# Outside the handler: nothing is being handled while the interpreter reports it and runs
# the atexit handlers.
_agentrl_exit(_agentrl_error)
"""

_MAX_SOURCE = 120_000
"""Longest bootstrap source: it is one argument of ``execve`` (the kernel takes 128 KiB)."""


def bootstrap_argv(
    python: str,
    core_path: str,
    preimports: tuple[str, ...],
    preload: tuple[tuple[str, str], ...] = (),
) -> list[str]:
    """The command that starts a warm interpreter: it imports ``preimports`` and executes
    each ``(module name, source)`` of ``preload`` as a module in ``sys.modules``."""
    for name in preimports:
        if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
            raise ValueError(f"preimports: {name!r} is not a module name")
    for entry in preload:
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise TypeError("preload must map module names to source text")
        name, text = entry
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"preload: {name!r} is not a module name")
        if not isinstance(text, str):
            raise TypeError(f"preload: the source of {name!r} must be a str")
        try:
            compile(text, f"<agentrl-preload:{name}>", "exec")
        except SyntaxError as e:
            raise ValueError(f"preload: {name!r} does not compile: {e}") from None
    import json  # here, not at import agentrl: only a warm sandbox's start needs it

    source = (
        _SOURCE.replace("CORE_PATH", json.dumps(core_path))
        .replace("PREIMPORTS", json.dumps(list(preimports)))
        .replace("PRELOAD", json.dumps([list(e) for e in preload]))
    )
    if len(source.encode()) > _MAX_SOURCE:
        raise ValueError(f"preload: the warm interpreter's sources exceed {_MAX_SOURCE} bytes")
    return [python, "-c", source]
