"""Closes, when the interpreter exits, the sandboxes and pools that were never closed.

An open :class:`~agentrl.Sandbox` or pool owns cgroups and warm interpreters. Python does not
promise to collect every object at exit (one kept by a module global, a cycle or a thread may
outlive finalization), and the Rust side then never runs its clean-up: the processes die with
us, but the cgroup directories would stay. Each such object registers here and is closed by one
``atexit`` hook (runs are cancelled, not waited for). What a killed process leaves behind is
removed by the next sandbox created under the same parent cgroup.
"""

from __future__ import annotations

import atexit
import contextlib
import weakref
from typing import Protocol


class _Closable(Protocol):
    def _close_at_exit(self) -> None: ...


_open: weakref.WeakSet[_Closable] = weakref.WeakSet()


def track(obj: _Closable) -> None:
    """Closes ``obj`` at interpreter exit if it is still alive then."""
    _open.add(obj)


def untrack(obj: _Closable) -> None:
    _open.discard(obj)


@atexit.register
def _close_all() -> None:
    for obj in list(_open):
        with contextlib.suppress(Exception):  # best effort: exit goes on
            obj._close_at_exit()
