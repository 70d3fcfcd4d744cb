"""The verdict record of one run."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl import _core

__all__ = ["ExecResult", "Status"]


class Status(str, enum.Enum):
    """How a run ended."""

    OK = "ok"
    """Exited with status 0 within every limit."""
    RUNTIME_ERROR = "runtime_error"
    """Exited with a non-zero status."""
    SIGNALED = "signaled"
    """Killed by a signal (segfault, abort, SIGSYS, ...)."""
    TIMEOUT = "timeout"
    """Ran past the wall-clock or CPU-time limit (``limit`` says which)."""
    MEMORY_LIMIT = "memory_limit"
    """Killed by the memory limit."""
    OUTPUT_LIMIT = "output_limit"
    """Wrote more than the output cap to stdout or stderr."""
    SANDBOX_ERROR = "sandbox_error"
    """The sandbox failed (infrastructure); never the program's fault."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ExecResult:
    """What one sandboxed run did."""

    status: Status
    """How it ended."""
    exit_code: int | None = None
    """Exit status, when it exited normally."""
    signal: int | None = None
    """Terminating signal, when killed by one."""
    stdout: bytes = b""
    """Captured standard output (bytes; not decoded, non-UTF-8 preserved)."""
    stderr: bytes = b""
    """Captured standard error."""
    stdout_truncated: bool = False
    """Standard output went past the cap; the rest was discarded."""
    stderr_truncated: bool = False
    """Standard error went past the cap."""
    wall_time_s: float = 0.0
    """Wall-clock time from exec to exit."""
    cpu_time_s: float = 0.0
    """CPU time of every process and thread of the run."""
    peak_memory_bytes: int | None = None
    """Peak memory of the run's cgroup."""
    peak_memory_exact: bool = False
    """``peak_memory_bytes`` is the run's exact peak. ``False`` where it is a lower bound or
    absent: cgroup v2 before Linux 6.12 cannot reset the peak counter per run, so a warm run
    there gets the largest usage sampled about every 10 ms (or the counter, exact, where the
    run raised the slot's lifetime peak). A cold run on 5.19-6.11 gets a fresh cgroup of its
    own, whose counter is exact; before 5.19 (no counter) it is sampled too."""
    limit: str | None = None
    """The limit that fired: wall_time, cpu_time, memory, output, pids or file_size."""
    denied_syscalls: tuple[str, ...] = ()
    """System calls the seccomp policy refused, in order of first use."""
    files: dict[str, bytes] = field(default_factory=dict)
    """Collected output files (missing ones are absent)."""
    truncated_files: tuple[str, ...] = ()
    """Collected files that were cut at the size cap."""
    error: str | None = None
    """For ``sandbox_error``: what failed."""

    @property
    def ok(self) -> bool:
        """True when the status is ``ok``."""
        return self.status is Status.OK

    @classmethod
    def _from_core(cls, v: _core.ExecResult) -> ExecResult:
        """This record of the core's typed verdict (its fields have these names and types)."""
        return cls(
            status=Status(v.status),
            exit_code=v.exit_code,
            signal=v.signal,
            stdout=v.stdout,
            stderr=v.stderr,
            stdout_truncated=v.stdout_truncated,
            stderr_truncated=v.stderr_truncated,
            wall_time_s=v.wall_time_s,
            cpu_time_s=v.cpu_time_s,
            peak_memory_bytes=v.peak_memory_bytes,
            peak_memory_exact=v.peak_memory_exact,
            limit=v.limit,
            denied_syscalls=tuple(v.denied_syscalls),
            files=v.files,
            truncated_files=tuple(v.truncated_files),
            error=v.error,
        )

    def summary(self) -> str:
        """A one-line verdict, as the CLI prints it."""
        parts = [f"status={self.status.value}"]
        if self.exit_code is not None:
            parts.append(f"exit={self.exit_code}")
        if self.signal is not None:
            parts.append(f"signal={self.signal}")
        if self.limit:
            parts.append(f"limit={self.limit}")
        parts.append(f"wall={self.wall_time_s * 1e3:.1f}ms")
        parts.append(f"cpu={self.cpu_time_s * 1e3:.1f}ms")
        if self.peak_memory_bytes is not None:
            parts.append(f"mem={self.peak_memory_bytes / (1 << 20):.1f}MiB")
        if self.stdout_truncated or self.stderr_truncated:
            parts.append("output-truncated")
        if self.denied_syscalls:
            parts.append("denied=" + ",".join(self.denied_syscalls))
        if self.error:
            parts.append(f"error={self.error!r}")
        return " ".join(parts)
