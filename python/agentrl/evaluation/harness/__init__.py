"""The trusted harness that judges a function task inside a box, and how it gets there.

The box's ``__main__.py`` loads the harness (as marshalled code objects written next to it, or
as source for another interpreter) and calls :func:`.judge._main` with the candidate's source
and entry point; the task's tests (compiled on the host by :func:`.cases.prepare`) and the
verdict nonce come on stdin, which the candidate never sees. It uses the standard library only.
In order:

1. It makes itself non-dumpable, so a same-uid process cannot open ``/proc/<pid>/mem`` or
   ``/proc/<pid>/fd`` of it, nor trace it.
2. It forks the candidate child before reading anything from stdin. The child points fds 0,
   1 and 2 at ``/dev/null`` and an output pipe, keeps only its two command pipes, executes the
   candidate's source in fresh globals and serves calls of the entry point: arguments come in,
   the return value goes back as tagged JSON built with exact type checks (a subclass or an
   object with a lying ``__eq__`` cannot be encoded).
3. The parent then reads the nonce and the tests from stdin, executes the prompt's helpers
   and the tests in its own interpreter with the entry point bound to a proxy that forwards
   each call to the child, and rewrites every ``assert`` statement so each is judged apart.
4. It prints one line, the nonce followed by the JSON verdict, on its stdout.

That is the judge of one run per task (an Evaluator on a borrowed pool). An Evaluator that owns
its pool keeps judges alive instead (:func:`.server._judge_server`, driven by
``agentrl.evaluation._judges``): the candidate is a warm run of its own
(:func:`.candidate._candidate`), connected to a judge by three pipes only, and the same
:func:`.judge._judge` gives the verdict, which goes to the host over the judge's own socket.

The parts (:data:`PARTS`, in the order they load; each imports only parts before it):

* ``wire``: the wire format (tagged JSON of plain values), the verdict's error classes and the
  builtins bound before any candidate code runs;
* ``candidate``: what runs in the candidate's process (:func:`.candidate._child`);
* ``proxy``: the judge's proxy of the candidate (:class:`.proxy._Child`);
* ``cases``: the assert rewriter, :func:`.cases.prepare` and the cases' verdicts;
* ``judge``: :func:`.judge._main` (one run per task) and :func:`.judge._judge`;
* ``server``: the persistent judge.

How the parts reach the box (this module: it runs on the host and is never shipped). The parts
import each other by relative imports only (``from .wire import _send``), so the same code runs
on the host as ``agentrl.evaluation.harness.<part>`` and in the box as
``_agentrl_harness.<part>`` (:data:`PRELOADED_HARNESS`), where nothing of the agentrl package is
imported for it. The host compiles every part (``optimize=2``) and marshals them as one list of
``(part, code object)`` in :data:`PARTS`' order, cached in this package's ``__pycache__``
(:func:`compiled_parts`). In the box one short loader unmarshals that list and, part after part,
makes the module, registers it in ``sys.modules`` and executes its code object in it; each
relative import then finds its part in ``sys.modules``, already executed (a dict look-up: no
search of the file system, no import of the package). The loader last binds the entry points
(:data:`ENTRY_POINTS`) where it runs: in the module ``_agentrl_harness`` of an owned pool's warm
interpreters (:func:`preload_loader`), or in the run's ``__main__`` (:func:`compiled_loader`,
:func:`source_loader`). That is the one unmarshalling of the single module this package
replaces, plus six module objects and eleven relative imports: about 0.06 ms more per load (0.28
ms against 0.22 ms to unmarshal and execute it, measured in a warm process), far below what a
judged task costs. Parts concatenated into one source at build time would load alike, but the
host would then run other code than the box (the host imports the parts, for
:func:`.cases.prepare`).
"""

from __future__ import annotations

import binascii
import contextlib
import functools
import marshal
import os
import sys
import zlib
from importlib import _bootstrap_external  # type: ignore[attr-defined]
from pathlib import Path

__all__ = [
    "ENTRY_POINTS",
    "HARNESS_FILE",
    "PARTS",
    "PRELOADED_HARNESS",
    "compiled_loader",
    "compiled_parts",
    "preload_loader",
    "source_loader",
]

PARTS = ("wire", "candidate", "proxy", "cases", "judge", "server")
"""The harness's modules in the order they load in the box (each imports only earlier ones)."""

ENTRY_POINTS = (("judge", "_main"), ("server", "_judge_server"), ("candidate", "_candidate"))
"""``(part, name)`` of what the box's ``__main__`` calls, bound where the loader runs."""

PRELOADED_HARNESS = "_agentrl_harness"
"""Module name of the harness in the warm interpreters of an owned pool (loaded once per
interpreter, before any candidate code; each run gets a fork of it), and the package name of
its parts in every box."""

HARNESS_FILE = ".agentrl_harness"
"""Name of the compiled harness in the box's work dir (read once, before any candidate code)."""

_HERE = Path(__file__).parent

_PRELOAD_BUDGET = 100_000
"""Longest harness preload sent as compiled code objects (the warm interpreter's whole
bootstrap is one ``execve`` argument, at most ``agentrl.sandbox.warm._MAX_SOURCE`` bytes)."""


@functools.lru_cache(maxsize=1)
def _sources() -> tuple[tuple[str, str], ...]:
    return tuple((part, (_HERE / f"{part}.py").read_text(encoding="utf-8")) for part in PARTS)


def _install(parts: str, compiled: bool) -> str:
    """Loader lines that install the parts (the expression ``parts``: ``(part, code object)``
    pairs, or ``(part, source)`` ones) as modules and bind the entry points. They need
    ``sys`` as ``_s``; every name they make starts with ``_`` and is deleted after."""
    run = "_c" if compiled else "compile(_c, '<agentrl-harness:' + _n + '>', 'exec')"
    lines = [
        f"for _n, _c in {parts}:",
        f"    _p = type(_s)({PRELOADED_HARNESS + '.'!r} + _n)",
        f"    _p.__package__ = {PRELOADED_HARNESS!r}",
        "    _s.modules[_p.__name__] = _p",
        f"    exec({run}, _p.__dict__)",
    ]
    for part, name in ENTRY_POINTS:
        lines.append(f"{name} = _s.modules[{f'{PRELOADED_HARNESS}.{part}'!r}].{name}")
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=1)
def source_loader() -> str:
    """The harness as source, for a box whose interpreter is not this one (it compiles it)."""
    return (
        "import sys as _s\n" + _install(repr(_sources()), compiled=False) + "del _s, _n, _c, _p\n"
    )


@functools.lru_cache(maxsize=1)
def compiled_loader() -> tuple[str, bytes]:
    """A small loader and the file it loads, :data:`HARNESS_FILE` (:func:`compiled_parts`):
    compiling ~1,200 lines of source costs ~9 ms per run, loading the code objects from a file
    well under 1 ms. Only valid for an interpreter of this very version (checked in the box:
    a mismatch is a masked run)."""
    blob = compiled_parts()
    tag = sys.implementation.cache_tag
    loader = (
        "import sys as _s, marshal as _m, os as _o\n"
        f"if _s.implementation.cache_tag != {tag!r}:\n"
        "    _o.write(2, b'AGENTRL-HARNESS-ERROR interpreter mismatch\\n')\n"
        "    _o._exit(70)\n"
        f"with open({HARNESS_FILE!r}, 'rb') as _f:\n"
        "    _parts = _m.loads(_f.read())\n"
        + _install("_parts", compiled=True)
        + "del _s, _m, _o, _f, _parts, _n, _c, _p\n"
    )
    return loader, blob


@functools.lru_cache(maxsize=1)
def preload_loader() -> str:
    """The harness as the warm interpreters of an owned pool load it.

    A loader of its marshalled code objects (base64): compiling the ~1,200 lines of source
    took every warm interpreter 10 to 20 ms of its boot (an Evaluator boots two per worker),
    unmarshalling takes well under 1 ms. The pool runs this very interpreter (checked in the
    box: another one refuses to load it and the warm interpreter does not start). The code
    objects are zlib-compressed (74 kB marshalled, about 30 kB compressed; inflating costs well
    under a millisecond), so the loader stays far inside the bootstrap's budget; the source
    itself only where it would not fit (tests/test_judges.py checks that it does)."""
    text = binascii.b2a_base64(zlib.compress(compiled_parts(), 9), newline=False).decode("ascii")
    tag = sys.implementation.cache_tag
    loader = (
        "import sys as _s, marshal as _m, binascii as _b, zlib as _z\n"
        f"if _s.implementation.cache_tag != {tag!r}:\n"
        f"    raise ImportError({'the compiled agentrl harness needs ' + tag!r})\n"
        + _install(f"_m.loads(_z.decompress(_b.a2b_base64({text!r})))", compiled=True)
        + "del _s, _m, _b, _z, _n, _c, _p\n"
    )
    return loader if len(loader) <= _PRELOAD_BUDGET else source_loader()


@functools.lru_cache(maxsize=1)
def compiled_parts() -> bytes:
    """The parts compiled (``optimize=2``) and marshalled as one list of ``(part, code
    object)``, with a bytecode cache.

    Compiling them takes ~20 ms of every new process's start, before the first warm
    interpreter can boot. The result is cached as Python caches modules' bytecode: in this
    package's ``__pycache__`` (``harness.<cache_tag>.agentrl-harness``), valid for this
    interpreter's bytecode magic and every part's exact size and mtime (a change to any part
    compiles them all afresh); written atomically, and silently skipped where the directory is
    not writable. The file is as trusted as the ``.pyc`` files beside it (the same directory);
    anything that does not match is ignored and compiled afresh.
    """
    sources = _sources()
    try:
        stats = [os.stat(_HERE / f"{part}.py") for part in PARTS]
        key = _bootstrap_external.MAGIC_NUMBER + b"".join(
            b"%s:%d:%d;" % (part.encode(), st.st_mtime_ns, st.st_size)
            for part, st in zip(PARTS, stats, strict=True)
        )
        cache = _HERE / "__pycache__" / f"harness.{sys.implementation.cache_tag}.agentrl-harness"
    except (OSError, AttributeError):
        key = cache = None
    if key is not None and cache is not None:
        try:
            data = cache.read_bytes()
            same = all(
                len(text.encode("utf-8")) == st.st_size
                for (_, text), st in zip(sources, stats, strict=True)
            )
            if data.startswith(key) and same:
                marshal.loads(data[len(key) :])  # a damaged file is compiled afresh
                return data[len(key) :]
        except (OSError, ValueError, EOFError, TypeError):
            pass
    blob = marshal.dumps(
        [
            (part, compile(text, f"<agentrl-harness:{part}>", "exec", optimize=2))
            for part, text in sources
        ]
    )
    if key is not None and cache is not None:
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        try:
            cache.parent.mkdir(exist_ok=True)
            tmp.write_bytes(key + blob)
            os.replace(tmp, cache)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return blob
