"""The warm interpreter's bootstrap (the "zygote" of the warm-Python fast path).

It runs inside a box, started once per slot as ``python -I -c BOOTSTRAP``, as root of its
own user namespace (an unprivileged host uid). It loads agentrl's extension module from
where the sandbox bound it, imports the configured modules, and then serves requests on
fd 3 in a loop written in Rust (``_zygote_serve``): for each one it starts a new pid namespace
with a tiny init as pid 1 and forks a child into it as pid 2; the child isolates itself (new
mount namespace, fresh tmpfs, its own ``/proc``, the box user, no capabilities,
``no_new_privs``, seccomp, every fd but 0/1/2 closed), returns from the loop and runs
``/work/__main__.py`` as a new interpreter would, while the interpreter reports the pidfds
and, later, the exit status.
"""

from __future__ import annotations

import json

__all__ = ["bootstrap_argv"]

_SOURCE = r"""
import os, sys

def _agentrl_zygote(core_path, preimports, preload):
    with open("/proc/self/comm", "w") as f:
        f.write("agentrl-warm")
    # The extension is loaded with the import system's own frozen loaders, which are loaded
    # at every start-up: importlib.util would import 17 modules (collections, functools, ...)
    # that the preimports then share, and that could not be dropped again without leaving the
    # run a state no fresh interpreter has (typing holding one collections, the run another).
    bootstrap = sys.modules["_frozen_importlib"]
    loader = sys.modules["_frozen_importlib_external"].ExtensionFileLoader("_core", core_path)
    core = bootstrap.module_from_spec(bootstrap.spec_from_loader("_core", loader))
    loader.exec_module(core)
    for name in preimports:
        __import__(name)
    for name, text in preload:
        mod = type(sys)(name)
        mod.__file__ = "<agentrl-preload:" + name + ">"
        sys.modules[name] = mod
        exec(compile(text, mod.__file__, "exec"), mod.__dict__)
    allowed = _agentrl_closed(sys.modules)
    import atexit, gc
    core._zygote_init()
    # Warm what every run would otherwise build afresh in its own copy of the heap: the
    # compiler's AST types (made on the first compile()).
    compile("pass", "<warm>", "exec")
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
    core._zygote_trim()
    core._zygote_send(ctl, b"R", [])
    # The request loop is in Rust (each line of Python here would copy pages into every
    # run): it returns only in a run, set up, with the environment to install (None: this
    # one's). Before each fork it flushes the output (not to be written again by the run)
    # and freezes the heap: a collection in a run would touch, and so copy, every page of it.
    try:
        env = core._zygote_serve(ctl, [sys.stdout.flush, sys.stderr.flush, gc.freeze], own_env)
    except EOFError:
        os._exit(0)
    if after_fork_code is not None:
        after_fork.__code__ = after_fork_code
    if len(sys.modules) != clean:
        for name in list(sys.modules):
            if name not in allowed:
                del sys.modules[name]
    _agentrl_run(env, atexit)

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

def _agentrl_run(env, atexit):
    atexit._clear()
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    path = "/work/__main__.py"
    sys.argv = ["__main__.py"]
    sys.path[0] = "/work"
    main = type(sys)("__main__")
    main.__file__ = path
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    code = 0
    try:
        with open(path, "rb") as f:
            source = f.read()
        exec(compile(source, path, "exec"), main.__dict__)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading = sys.modules.get("threading")
    if threading is not None and hasattr(threading, "_shutdown"):
        try:
            threading._shutdown()
        except BaseException:
            pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(code)

_agentrl_zygote(CORE_PATH, PREIMPORTS, PRELOAD)
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
    source = (
        _SOURCE.replace("CORE_PATH", json.dumps(core_path))
        .replace("PREIMPORTS", json.dumps(list(preimports)))
        .replace("PRELOAD", json.dumps([list(e) for e in preload]))
    )
    if len(source.encode()) > _MAX_SOURCE:
        raise ValueError(f"preload: the warm interpreter's sources exceed {_MAX_SOURCE} bytes")
    return [python, "-I", "-c", source]
