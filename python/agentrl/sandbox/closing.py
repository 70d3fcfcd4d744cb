"""Closes, when the interpreter exits, the sandboxes and pools that were never closed.

An open :class:`~agentrl.Sandbox` or pool owns cgroups and warm interpreters. Python does not
promise to collect every object at exit (one kept by a module global, a cycle or a thread may
outlive finalization), and the Rust side then never runs its clean-up: the processes die with
us, but the cgroup directories would stay. Each such object registers here and is closed by one
``atexit`` hook (runs are cancelled, not waited for). What a killed process leaves behind is
removed by the next sandbox created under the same parent cgroup.

Only the process that created an object closes it: a child made with ``os.fork`` inherits the
registry (and the objects) but not the threads behind them, and must leave them alone.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref
from typing import Protocol


class _Closable(Protocol):
    def _close_at_exit(self) -> None: ...


_open: weakref.WeakKeyDictionary[_Closable, int] = weakref.WeakKeyDictionary()


def track(obj: _Closable) -> None:
    """Closes ``obj`` at interpreter exit if it is still alive then (in this process)."""
    _open[obj] = os.getpid()


def untrack(obj: _Closable) -> None:
    _open.pop(obj, None)


@atexit.register
def _close_all() -> None:
    me = os.getpid()
    for obj, pid in list(_open.items()):
        if pid == me:
            with contextlib.suppress(Exception):  # best effort: exit goes on
                obj._close_at_exit()
