"""Running the service on uvicorn (uvloop and httptools where installed), with a graceful
drain on SIGTERM/SIGINT: the listener closes, every accepted request is answered, then the
pool closes."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from agentrl.sandbox.limits import Limits
from agentrl.service.config import ServiceConfig, is_loopback

__all__ = ["app_from_env", "check_bind", "serve", "uvicorn_config"]

_ENV = "AGENTRL_SERVICE_CONFIG"


def check_bind(host: str, config: ServiceConfig) -> None:
    """Refuses to expose a server without a token beyond this machine."""
    if config.token is None and not is_loopback(host):
        raise ValueError(
            f"refusing to bind {host!r} without a token: anyone who can reach it could run "
            "code here; give --token-file, or bind 127.0.0.1"
        )


def _loop_and_http() -> tuple[str, str]:
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    try:
        import httptools  # noqa: F401

        http = "httptools"
    except ImportError:
        http = "h11"
    return loop, http


def uvicorn_config(app: Any, host: str, port: int, **kw: Any) -> Any:
    """A ``uvicorn.Config`` for the service: no uvicorn access log (the app writes its own,
    structured), a deep backlog, no graceful-shutdown timeout (every run is bounded by its
    limits, so the drain is too)."""
    import uvicorn

    loop, http = _loop_and_http()
    kw.setdefault("log_level", "info")
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop=loop,
        http=http,
        access_log=False,
        lifespan="on",
        backlog=4096,
        timeout_keep_alive=30,
        **kw,
    )


def _server_class() -> Any:
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """Marks the app draining (``/health`` answers 503) when told to exit."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            svc = getattr(getattr(self.config.app, "fastapi", None), "state", None)
            if svc is not None:
                svc.service["draining"] = True
            super().handle_exit(sig, frame)

    return DrainingServer


def _config_to_env(config: ServiceConfig) -> str:
    d = dataclasses.asdict(config)
    return json.dumps(d)


def app_from_env() -> Any:
    """The app of a worker process (``--processes`` > 1), its config from the environment."""
    d = json.loads(os.environ[_ENV])
    for k in ("default_limits", "max_limits"):
        d[k] = Limits(**d[k])
    d["trusted_networks"] = tuple(d["trusted_networks"])
    from agentrl.service.app import create_app

    return create_app(ServiceConfig(**d))


def serve(
    config: ServiceConfig,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    processes: int = 1,
    log_level: str = "info",
) -> None:
    """Serves until SIGTERM/SIGINT, then drains. ``processes`` > 1 runs that many uvicorn
    worker processes on the port, each with its own pool of ``config.workers``."""
    check_bind(host, config)
    import uvicorn

    if processes > 1:
        os.environ[_ENV] = _config_to_env(config)
        loop, http = _loop_and_http()
        uvicorn.run(
            "agentrl.service.server:app_from_env",
            factory=True,
            host=host,
            port=port,
            workers=processes,
            loop=loop,
            http=http,
            access_log=False,
            log_level=log_level,
            backlog=4096,
        )
        return
    from agentrl.service.app import create_app

    server = _server_class()(uvicorn_config(create_app(config), host, port, log_level=log_level))
    server.run()
