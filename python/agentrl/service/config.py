"""The sandbox service's settings."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field

from agentrl.sandbox.limits import Limits

__all__ = ["ServiceConfig", "is_loopback"]


def _default_max_limits() -> Limits:
    return Limits(
        wall_time_s=600.0,
        cpu_time_s=600.0,
        memory_bytes=16 << 30,
        max_pids=1024,
        max_output_bytes=64 << 20,
        max_file_bytes=1 << 30,
        max_open_files=4096,
        tmpfs_bytes=4 << 30,
    )


@dataclass(frozen=True)
class ServiceConfig:
    """What one server process serves and how much it accepts.

    The defaults suit one node serving trainers on the same network; every bound is a
    request's HTTP error (413, 422 or 429), never a silent cut."""

    token: str | None = None
    """Bearer token every request but ``GET /health`` must carry (``Authorization: Bearer
    TOKEN``, or the ``/t/TOKEN/...`` path prefix for clients that cannot set headers).
    ``None``: no auth, and :func:`agentrl.service.serve` binds only loopback."""

    trusted_networks: tuple[str, ...] = ()
    """Networks (CIDR, e.g. ``10.0.0.0/8``) whose clients need no token: for clients that
    cannot send one (SkyRL's, which builds ``http://HOST:8080/run_code`` itself). Only with a
    token: the rest of the world still needs it."""

    workers: int | None = None
    """Sandbox workers of the pool (boxes running at once); ``None``: two per core."""

    max_inflight: int | None = None
    """Most sandbox runs accepted at once (running or queued) across all requests; beyond
    it a request is answered 429 with ``Retry-After``. ``None``: 8 per pool worker."""

    max_body_bytes: int = 16 << 20
    """Largest request body; a bigger one is answered 413."""

    max_batch: int = 1024
    """Most jobs (or judged completions) in one ``/v1/run`` or ``/v1/judge`` request."""

    allow_network: bool = False
    """Let the boxes reach the network (off: each box has its own empty network namespace)."""

    default_memory_mb: int = 1024
    """Memory limit of a ``/run_code`` run whose ``memory_limit_MB`` is -1 (the default)."""

    max_output_bytes: int = 1 << 20
    """Capture cap of stdout and of stderr, each, for ``/run_code`` (past it: truncated and
    flagged)."""

    default_limits: Limits = field(default_factory=Limits)
    """Limits of a ``/v1/run`` job for the fields it does not set."""

    max_limits: Limits = field(default_factory=_default_max_limits)
    """Upper bound of each limit a request may ask for (above it: 422 naming the field)."""

    retry_after_s: int = 1
    """The ``Retry-After`` of a 429 (or a 503 while draining)."""

    traces: str | None = None
    """Directory to record a trace of every sandbox job in (``agentrl traces search`` reads
    it); ``None``: no traces. With several processes, each writes its own files there."""

    trace_sink: str = "jsonl"
    """Trace store: ``"jsonl"`` (rotating files) or ``"sqlite"`` (FTS5 full-text search)."""

    pod_name: str | None = field(default_factory=lambda: os.environ.get("MY_POD_NAME"))
    """``executor_pod_name`` of ``/run_code`` answers (SandboxFusion reads ``MY_POD_NAME``)."""

    def __post_init__(self) -> None:
        if self.token is not None:
            if not isinstance(self.token, str) or not self.token.strip():
                raise ValueError("token must be a non-empty string")
            if any(c.isspace() for c in self.token) or "/" in self.token:
                raise ValueError("token must not contain whitespace or '/'")
        nets = tuple(self.trusted_networks)
        object.__setattr__(self, "trusted_networks", nets)
        for n in nets:
            try:
                ipaddress.ip_network(n, strict=False)
            except ValueError:
                raise ValueError(f"trusted_networks: not a network: {n!r}") from None
        if nets and self.token is None:
            raise ValueError("trusted_networks needs a token (without one, all is loopback)")
        for name in ("max_body_bytes", "max_batch", "default_memory_mb", "max_output_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.trace_sink not in ("jsonl", "sqlite"):
            raise ValueError(f"trace_sink must be 'jsonl' or 'sqlite', got {self.trace_sink!r}")
        for name in ("workers", "max_inflight"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive int or None, got {v!r}")

    @property
    def pool_workers(self) -> int:
        """The pool's worker count."""
        if self.workers is not None:
            return self.workers
        from agentrl.pool.pool import default_workers  # agentrl.pool imports asyncio: here

        return default_workers()

    @property
    def inflight_limit(self) -> int:
        """The effective :attr:`max_inflight`."""
        return self.max_inflight if self.max_inflight is not None else 8 * self.pool_workers


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` exposes the server to this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
