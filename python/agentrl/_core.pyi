"""Type stubs of the Rust extension module."""

from collections.abc import Callable
from os import PathLike
from typing import Any, Self, final

__all__ = [
    "AgentRLError",
    "Pool",
    "PoolClosed",
    "PoolFull",
    "Sandbox",
    "SandboxError",
    "Session",
    "Snapshot",
    "_TestPool",
    "__version__",
    "_cgroup_default_parent",
    "_host_id_ranges",
    "_zygote_init",
    "_zygote_send",
    "_zygote_serve",
    "_zygote_trim",
    "check_host",
    "classify_verdict",
    "seccomp_policy",
]

__version__: str

class AgentRLError(Exception): ...
class SandboxError(AgentRLError): ...

_LimitsTuple = tuple[float, float, int, int, int, int, int, int]

@final
class Sandbox:
    def __new__(
        cls,
        limits: _LimitsTuple,
        network: bool,
        system_paths: list[str],
        binds: list[tuple[str | PathLike[str], str | PathLike[str], bool]],
        env: list[tuple[str, str]],
        max_concurrency: int,
        degraded: bool,
        cgroup_parent: str | None = None,
        warm: tuple[list[str], str, float] | None = None,
    ) -> Self: ...
    def run(
        self,
        argv: list[bytes],
        stdin: bytes,
        files: list[tuple[str, bytes]],
        collect: list[str],
        limits: _LimitsTuple | None,
        cwd: str | None,
        env: list[tuple[str, str]],
        warm: bool = False,
        session: Session | None = None,
        pass_fds: list[int] = ...,
        tee: tuple[int, int] | None = None,
    ) -> dict[str, Any]: ...
    def session(self, files: list[tuple[str, bytes]], disk_bytes: int) -> Session: ...
    def close(self, cancel: bool = False) -> None: ...
    @property
    def cgroup_version(self) -> str | None: ...
    @property
    def slots(self) -> int: ...

# ---- the job scheduler (rust/python/src/pool.rs)

class PoolFull(AgentRLError): ...
class PoolClosed(AgentRLError): ...

_SandboxItem = tuple[
    list[bytes],  # argv
    bytes,  # stdin
    list[tuple[str, bytes]],  # files
    list[str],  # collect
    _LimitsTuple | None,
    str | None,  # cwd
    list[tuple[str, str]],  # env
    bool,  # warm
    int,  # group
    int,  # priority
    float | None,  # deadline, seconds from now
    list[int],  # pass_fds (warm runs only)
]
# (record type, (completed, cancelled, expired, failed)): `collect` then returns instances of
# the record type made of (id, status, result, reason); without it, (id, kind, value) tuples.
_OutcomeShape = tuple[type[tuple[Any, ...]], tuple[Any, Any, Any, Any]]

@final
class Pool:
    def __new__(
        cls,
        sandbox: Sandbox,
        workers: int,
        capacity: int,
        retries: int,
        block_timeout: float | None = None,
        outcome: _OutcomeShape | None = None,
    ) -> Self: ...
    def submit_many(self, items: list[_SandboxItem]) -> list[int]: ...
    def collect(self, max: int | None = None, timeout: float = 0.0) -> list[Any]: ...
    def cancel(self, id: int) -> bool: ...
    def cancel_group(self, group: int) -> int: ...
    def completion_fd(self) -> int: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self, drain: bool) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def workers(self) -> int: ...

@final
class _TestPool:
    """Fake executor: an int n is a no-op returning n; (op, arg, group, priority, deadline)
    with op 0 no-op, 1 sleep arg µs, 2 infrastructure fault, 3 fault on the first arg
    attempts, 4 panic."""

    def __new__(
        cls,
        workers: int,
        capacity: int,
        retries: int,
        block_timeout: float | None = None,
        outcome: _OutcomeShape | None = None,
    ) -> Self: ...
    def submit_many(
        self, items: list[int | tuple[int, int, int, int, float | None]]
    ) -> list[int]: ...
    def collect(self, max: int | None = None, timeout: float = 0.0) -> list[Any]: ...
    def cancel(self, id: int) -> bool: ...
    def cancel_group(self, group: int) -> int: ...
    def completion_fd(self) -> int: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self, drain: bool) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def workers(self) -> int: ...

@final
@final
class Snapshot: ...

@final
class Session:
    def reset(self) -> None: ...
    def snapshot(self) -> Snapshot: ...
    def restore(self, snap: Snapshot) -> None: ...
    def close(self) -> None: ...

def seccomp_policy(network: bool) -> dict[str, Any]: ...
def check_host() -> None: ...
def classify_verdict(
    oom: bool,
    killed: str | None,
    signal: int | None,
    exit_code: int | None,
    cpu_exhausted: bool,
    truncated: bool,
    pids_hit: bool,
) -> tuple[str, str | None]: ...
def _cgroup_default_parent() -> str | None: ...
def _host_id_ranges() -> tuple[tuple[int, int], tuple[int, int]]: ...
def _zygote_init() -> None: ...
def _zygote_trim() -> None: ...
def _zygote_send(fd: int, data: bytes, fds: list[int]) -> None: ...
def _zygote_serve(
    fd: int, before_fork: list[Callable[[], object]], own_env: list[tuple[str, str]]
) -> list[tuple[str, str]] | None: ...
