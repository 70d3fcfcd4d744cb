"""Type stubs of the Rust extension module."""

from os import PathLike
from typing import Any

__version__: str

class AgentRLError(Exception): ...
class SandboxError(AgentRLError): ...

_LimitsTuple = tuple[float, float, int, int, int, int, int, int]

class Sandbox:
    def __init__(
        self,
        limits: _LimitsTuple,
        network: bool,
        system_paths: list[str],
        binds: list[tuple[str | PathLike[str], str | PathLike[str], bool]],
        env: list[tuple[str, str]],
        max_concurrency: int,
        degraded: bool,
        cgroup_parent: str | None = None,
    ) -> None: ...
    def run(
        self,
        argv: list[bytes],
        stdin: bytes,
        files: list[tuple[str, bytes]],
        collect: list[str],
        limits: _LimitsTuple | None,
        cwd: str | None,
        env: list[tuple[str, str]],
    ) -> dict[str, Any]: ...
    def close(self) -> None: ...
    @property
    def cgroup_version(self) -> str | None: ...
    @property
    def slots(self) -> int: ...
