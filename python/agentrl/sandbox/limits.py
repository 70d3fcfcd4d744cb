"""Resource limits of a sandboxed run."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from agentrl import _core

__all__ = ["Limits", "parse_duration", "parse_size"]

MIN_MEMORY_BYTES = 8 << 20
"""Smallest memory limit: the kernel's start of a program (``execve``) must fit in it (until
it completes, a box process shares the spawning process's memory, and a cgroup OOM kill then
would take the host process with it)."""


@dataclass(frozen=True)
class Limits:
    """Limits applied to one run. Every field must be positive; a bad one raises
    :class:`agentrl.InvalidArgument` (a ``ValueError``) whose ``field`` names it."""

    wall_time_s: float = 10.0
    """Wall-clock limit in seconds; the whole box (every process in it) is killed at the limit."""

    cpu_time_s: float = 10.0
    """CPU time limit in seconds, all threads and processes of the run counted together."""

    memory_bytes: int = 512 << 20
    """Memory limit (cgroup), including what the run writes to its tmpfs; at least 8 MiB
    (what the kernel needs to start a program in the box)."""

    max_pids: int = 64
    """Most processes and threads alive at once."""

    max_output_bytes: int = 1 << 20
    """Capture cap for stdout and for stderr, each; the rest is drained and discarded."""

    max_file_bytes: int = 64 << 20
    """Largest file the run may write; also the cap for each collected file."""

    max_open_files: int = 256
    """Most open files per process."""

    tmpfs_bytes: int = 64 << 20
    """Size of the tmpfs holding the work dir, ``/tmp`` and ``/dev/shm``."""

    def __post_init__(self) -> None:
        # The types here (a bool is no number; an int field takes no float); the rules in the
        # Rust core (agentrl_sandbox::Limits::validate), the one place they are written, whose
        # InvalidArgument (a ValueError) names the field: ``e.field``, ``e.reason``.
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "float":
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise TypeError(f"Limits.{f.name} must be a number, got {type(v).__name__}")
                object.__setattr__(self, f.name, float(v))
            else:
                if isinstance(v, bool) or not isinstance(v, int):
                    raise TypeError(f"Limits.{f.name} must be an int, got {type(v).__name__}")
                if not 0 <= v < 1 << 63:  # what the core's u64 fields take, and more than enough
                    reason = f"must be positive, got {v}" if v < 0 else f"is too large: {v}"
                    e = _core.InvalidArgument(f"Limits.{f.name} {reason}")
                    e.field, e.reason = f.name, reason
                    raise e
        _core.check_limits(self)

    def replace(self, **changes: float | int) -> Limits:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "m": 60.0}


def parse_size(text: str) -> int:
    """Parses ``256M``, ``1G``, ``4096`` (binary units) into bytes."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1] if t and t[-1] in "KMG" else ""
    num = t[: len(t) - len(unit)]
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (use e.g. 256M, 1G, 4096)") from None
    if value <= 0 or not math.isfinite(value):
        raise ValueError(f"size must be positive: {text!r}")
    return int(value * _SIZE_UNITS[unit])


def parse_duration(text: str) -> float:
    """Parses ``2s``, ``500ms``, ``1.5`` (seconds), ``1m`` into seconds."""
    t = text.strip().lower()
    for unit in ("ms", "s", "m"):
        if t.endswith(unit):
            num, mult = t[: -len(unit)], _TIME_UNITS[unit]
            break
    else:
        num, mult = t, 1.0
    try:
        value = float(num) * mult
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use e.g. 2s, 500ms)") from None
    if value <= 0 or not math.isfinite(value):
        raise ValueError(f"duration must be positive: {text!r}")
    return value
