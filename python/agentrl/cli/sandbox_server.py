"""``agentrl sandbox-server``: the sandbox service over HTTP.

Serves SandboxFusion's ``POST /run_code`` (point verl, ROLL or SkyRL at it unchanged) and
agentrl's ``/v1/run`` and ``/v1/judge`` on this process's sandbox pool. Without
``--token-file`` it binds only loopback. SIGTERM drains: every accepted request is answered
before the process exits."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``sandbox-server`` on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "sandbox-server",
        help="serve the sandbox over HTTP (SandboxFusion-compatible /run_code)",
        description=__doc__.split("\n\n")[1].replace("``", "") if __doc__ else None,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=int, default=8080, help="port to bind")
    p.add_argument(
        "--token-file",
        metavar="F",
        help="file holding the bearer token every request must carry (required off loopback)",
    )
    p.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="CIDR",
        help="network whose clients need no token (repeatable; needs --token-file)",
    )
    p.add_argument("--workers", type=int, default=None, help="sandbox workers (default 2/core)")
    p.add_argument(
        "--max-inflight",
        type=int,
        default=None,
        help="most runs accepted at once; beyond it 429 + Retry-After (default 8 per worker)",
    )
    p.add_argument(
        "--processes", type=int, default=1, help="uvicorn worker processes, each with a pool"
    )
    p.add_argument("--max-body", default="16M", help="largest request body (413 beyond)")
    p.add_argument("--memory-mb", type=int, default=1024, help="memory_limit_MB=-1 means this")
    p.add_argument("--output", default="1M", help="stdout/stderr cap of /run_code, each")
    p.add_argument(
        "--allow-network", action="store_true", help="let the boxes reach the network (UNSAFE)"
    )
    p.add_argument(
        "--traces", metavar="DIR", default=None, help="record a trace of every job in DIR"
    )
    p.add_argument("--trace-sink", choices=("jsonl", "sqlite"), default="jsonl", help="trace store")
    p.add_argument("--log-level", default="info", help="debug, info, warning, error")
    p.set_defaults(func=run)
    return p


def run(a: argparse.Namespace) -> int:
    from agentrl.sandbox.limits import parse_size
    from agentrl.service.config import ServiceConfig
    from agentrl.service.server import check_bind, serve

    try:
        token = None
        if a.token_file:
            with open(a.token_file, encoding="utf-8") as f:
                token = f.read().strip()
            if not token:
                raise ValueError(f"--token-file {a.token_file}: the file is empty")
        if a.processes < 1:
            raise ValueError("--processes must be at least 1")
        if a.traces is not None and a.processes > 1:
            raise ValueError("--traces takes one process (a trace store has one writer)")
        config = ServiceConfig(
            token=token,
            trusted_networks=tuple(a.trust),
            workers=a.workers,
            max_inflight=a.max_inflight,
            max_body_bytes=parse_size(a.max_body),
            default_memory_mb=a.memory_mb,
            max_output_bytes=parse_size(a.output),
            allow_network=a.allow_network,
            traces=a.traces,
            trace_sink=a.trace_sink,
        )
        check_bind(a.host, config)
    except (ValueError, OSError) as e:
        print(f"agentrl sandbox-server: {e}", file=sys.stderr)
        return 2
    level = getattr(logging, str(a.log_level).upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    serve(config, a.host, a.port, processes=a.processes, log_level=str(a.log_level).lower())
    return 0
