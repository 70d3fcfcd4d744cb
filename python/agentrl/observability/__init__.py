"""Observability of agentrl: Prometheus metrics, execution traces, trainer logs.

* :mod:`agentrl.observability.metrics` (needs ``prometheus_client``): agentrl's registry,
  collectors reading the pools' and schedulers' ``stats()`` at scrape time, per-result counts
  (:func:`~agentrl.observability.metrics.instrument`), ``/metrics`` as an ASGI app
  (:func:`~agentrl.observability.metrics.asgi_app`) or a thread
  (:func:`~agentrl.observability.metrics.start_http_server`).
* :mod:`agentrl.observability.traces`: a trace record of every job (:class:`Tracer`, a pool
  observer), written off the hot path to rotating JSONL or SQLite with full-text search.
* :mod:`agentrl.observability.context`: :func:`job_context`, the ids jobs carry.
* :mod:`agentrl.observability.report`: ``report_to`` sinks of the trainer (jsonl,
  tensorboard, wandb).
* ``assets/``: a Grafana dashboard and Prometheus alert rules (``agentrl metrics dashboard``,
  ``agentrl metrics rules``).

Importing this package imports none of the optional dependencies.
"""

from __future__ import annotations

import os
from typing import Any

from agentrl.observability.context import current_context, job_context

__all__ = ["asset_path", "current_context", "job_context", "observe_pool"]


def observe_pool(
    pool: Any,
    *,
    name: str = "default",
    metrics: bool = True,
    traces: str | os.PathLike[str] | None = None,
    sink: str = "jsonl",
) -> Any:
    """One call for a service that owns a pool (``agentrl sandbox-server``, a trainer):
    exposes its metrics under ``pool=name`` (``metrics``, needs ``prometheus_client``) and,
    with ``traces`` (a directory), records every job there (``sink``: ``"jsonl"`` or
    ``"sqlite"``). Returns the :class:`~agentrl.observability.traces.Tracer` (None without
    ``traces``); close it after the pool."""
    if metrics:
        from agentrl.observability.metrics import instrument

        instrument(pool, name)
    if traces is None:
        return None
    from agentrl.observability.traces import Tracer

    tracer = Tracer(traces, sink=sink, name=name)
    pool.add_observer(tracer)
    return tracer


def asset_path(name: str) -> str:
    """The path of a shipped asset (``dashboard.json``, ``alerts.yml``)."""
    import importlib.resources

    return str(importlib.resources.files("agentrl.observability") / "assets" / name)
