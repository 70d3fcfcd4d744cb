"""Host ids of nsjail boxes: the box user's inside id and the per-run host uid/gid allocator."""

from __future__ import annotations

import os
import threading

from agentrl import _core
from agentrl.errors import SandboxError

BOX_ID = 1000
"""Inside uid and gid of the box user (as in the native backend)."""


class _HostIds:
    """Process-wide allocator of per-run host uids/gids (round robin, none shared while live),
    in the range the Rust core gives the nsjail backend (``_core._host_id_ranges``: a fixed
    range beside the native backend's on a root host, a part of the subordinate ids in
    rootless mode)."""

    def __init__(self) -> None:
        self._range: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._used: set[int] = set()
        self._next = 0

    def take(self) -> int:
        with self._lock:
            if self._range is None:
                self._range = _core._host_id_ranges()[1]
                # Spread processes over the range so that two rarely pick the same ids.
                self._next = (os.getpid() * 97) % self._range[1]
            base, span = self._range
            for _ in range(span):
                i = self._next
                self._next = (self._next + 1) % span
                if i not in self._used:
                    self._used.add(i)
                    return base + i
        raise SandboxError("no free host id for an nsjail box")

    def give(self, hid: int) -> None:
        with self._lock:
            if self._range is not None:
                self._used.discard(hid - self._range[0])


_IDS = _HostIds()
