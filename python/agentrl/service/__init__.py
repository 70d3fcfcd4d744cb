"""The sandbox service: agentrl's pool behind HTTP.

* ``app``: :func:`create_app`, the FastAPI app: SandboxFusion's ``POST /run_code`` and
  ``GET /v1/ping``; agentrl's ``POST /v1/run`` and ``POST /v1/judge`` (batches, NDJSON as
  results finish); ``GET /health``; ``/metrics`` where ``agentrl.observability`` exists.
* ``config``: :class:`ServiceConfig`, what a server serves and how much it accepts.
* ``gate``: bearer-token auth, the request-size bound and the structured access log.
* ``models``: the request and response models (pydantic).
* ``runcode``: SandboxFusion's limits and status rules on agentrl's verdicts.
* ``server``: :func:`serve`, uvicorn with a graceful drain on SIGTERM.

Run it with ``agentrl sandbox-server``; talk to it with :class:`agentrl.client.SandboxClient`.
FastAPI and uvicorn are imported only here, never by ``import agentrl``.
"""

from __future__ import annotations

from typing import Any

from agentrl.service.config import ServiceConfig

__all__ = ["ServiceConfig", "create_app", "serve"]


def create_app(*args: Any, **kwargs: Any) -> Any:
    """See :func:`agentrl.service.app.create_app`."""
    from agentrl.service.app import create_app as _create

    return _create(*args, **kwargs)


def serve(*args: Any, **kwargs: Any) -> None:
    """See :func:`agentrl.service.server.serve`."""
    from agentrl.service.server import serve as _serve

    _serve(*args, **kwargs)
