"""Prometheus metrics of agentrl, on its own registry (:data:`REGISTRY`).

Nothing is counted on the hot path that the pools already count: collectors read the
``stats()`` of registered objects (pools, schedulers, a ``RayPool``, anything with a
``stats()`` dict) when Prometheus scrapes. What only the results say (status by language, run
time and CPU histograms, refused system calls) is counted by :class:`JobMetrics`, an observer
that :func:`instrument` adds to a pool: a few dict updates per result, no prometheus_client
call. Names follow Prometheus' conventions: ``agentrl_`` prefix, base units, ``_total``,
``_seconds``, ``_bytes``, ``_ratio``.

Serving: :func:`asgi_app` (mount at ``/metrics`` of an ASGI app), :func:`start_http_server`
(a thread, for ``agentrl train --metrics-port``), :class:`MetricsMiddleware` (HTTP requests
of a service). :func:`metric_names` lists every series name agentrl can expose (the dashboard
and alert rules are checked against it).

This module is long because the metric table (:data:`SPECS`) and the collectors that fill it
stay together: it is the one catalogue the dashboard and the alert rules are checked against.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

__all__ = [
    "REGISTRY",
    "JobMetrics",
    "MetricsMiddleware",
    "asgi_app",
    "instrument",
    "metric_names",
    "observe_http",
    "observe_judgement",
    "record_trainer_step",
    "register_stats",
    "render",
    "start_http_server",
    "unregister_stats",
]

REGISTRY = CollectorRegistry(auto_describe=True)
"""agentrl's registry (not prometheus_client's global one, so an embedding application keeps
its own metrics apart)."""

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""Bucket bounds (seconds) of the run time and CPU time histograms."""
MEMORY_BUCKETS = tuple(float(1 << s) for s in range(20, 34, 1))  # 1 MiB .. 8 GiB
"""Bucket bounds (bytes) of the peak memory histogram."""
HTTP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# ---- the metric table: name -> (type, help, labels). Counters are named without _total.
C, G, H = "counter", "gauge", "histogram"
SPECS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # pools (from stats())
    "agentrl_pool_jobs_submitted": (C, "Jobs accepted by the pool.", ("pool",)),
    "agentrl_pool_jobs_finished": (
        C, "Jobs ended, by outcome (completed, cancelled, expired, failed).", ("pool", "outcome")),
    "agentrl_pool_retries": (C, "Infrastructure retries (runs ending sandbox_error retried).",
                             ("pool",)),
    "agentrl_pool_worker_panics": (C, "Worker panics caught by the scheduler.", ("pool",)),
    "agentrl_pool_queue_depth": (G, "Jobs waiting to start, by priority lane.",
                                 ("pool", "priority")),
    "agentrl_pool_jobs_queued": (G, "Jobs waiting to start.", ("pool",)),
    "agentrl_pool_jobs_running": (G, "Jobs running now.", ("pool",)),
    "agentrl_pool_jobs_in_flight": (
        G, "Jobs in the pool (queued, running, or finished but not handed over).", ("pool",)),
    "agentrl_pool_capacity_jobs": (G, "Most jobs the pool holds at once.", ("pool",)),
    "agentrl_pool_workers": (G, "Worker threads (boxes running at once).", ("pool",)),
    "agentrl_pool_workers_alive": (G, "Worker threads alive.", ("pool",)),
    "agentrl_pool_utilisation_ratio": (G, "Fraction of worker time spent running jobs.",
                                       ("pool",)),
    # a pool across a cluster (agentrl.distributed.RayPool)
    "agentrl_pool_infra_retries": (
        C, "Jobs re-run elsewhere after the node or actor running them was lost.", ("pool",)),
    "agentrl_pool_actors": (G, "Sandbox actors alive.", ("pool",)),
    "agentrl_pool_actors_lost": (C, "Sandbox actors lost (died or their node left).", ("pool",)),
    "agentrl_pool_actors_replaced": (C, "Sandbox actors started in place of lost ones.",
                                     ("pool",)),
    "agentrl_pool_node_actors": (G, "Sandbox actors alive on a node.", ("pool", "node")),
    "agentrl_pool_node_jobs_delivered": (C, "Jobs a node's actors have delivered.",
                                         ("pool", "node")),
    "agentrl_pool_node_jobs_running": (G, "Jobs running on a node.", ("pool", "node")),
    "agentrl_pool_node_workers": (G, "Sandbox workers on a node.", ("pool", "node")),
    "agentrl_sandbox_slots": (G, "Box slots of the pool's sandbox.", ("pool",)),
    "agentrl_sandbox_warm_interpreters": (
        G, "Warm interpreter slots of the pool's sandbox (0 when warm runs are off).", ("pool",)),
    # results (JobMetrics)
    "agentrl_jobs_submitted": (C, "Jobs submitted, by language.", ("pool", "language")),
    "agentrl_jobs_finished": (
        C, "Jobs finished, by verdict (ok, runtime_error, timeout, memory_limit, output_limit, "
        "signaled, sandbox_error; or cancelled, expired, failed) and language.",
        ("pool", "status", "language")),
    "agentrl_job_run_seconds": (H, "Wall time of completed runs.", ("pool", "language")),
    "agentrl_job_cpu_seconds": (H, "CPU time of completed runs.", ("pool", "language")),
    "agentrl_job_peak_memory_bytes": (H, "Peak memory of completed runs.", ("pool", "language")),
    "agentrl_job_limit_hits": (C, "Runs stopped by a limit, by limit.", ("pool", "limit")),
    "agentrl_syscalls_refused": (C, "System calls refused by the seccomp policy (once per run "
                                 "that tried them), by name.", ("pool", "syscall")),
    # judge
    "agentrl_judgements": (C, "Judgements, by error class (passed, assertion, runtime_error, "
                           "timeout, ...).", ("error_class",)),
    # scheduler
    "agentrl_scheduler_policy_version": (G, "The policy version episodes start with.",
                                         ("scheduler",)),
    "agentrl_scheduler_episodes_in_flight": (G, "Episodes running.", ("scheduler",)),
    "agentrl_scheduler_episodes_pending": (G, "Episodes fed but not started.", ("scheduler",)),
    "agentrl_scheduler_episodes_waiting_generation": (
        G, "Episodes waiting for the generator.", ("scheduler",)),
    "agentrl_scheduler_episodes_in_generation": (G, "Episodes being generated for.",
                                                 ("scheduler",)),
    "agentrl_scheduler_episodes_in_env": (G, "Episodes in an environment step.", ("scheduler",)),
    "agentrl_scheduler_groups_ready": (G, "Finished groups waiting for the trainer.",
                                       ("scheduler",)),
    "agentrl_scheduler_staleness_bound": (
        G, "Most episodes the current policy version may still start (admission bound).",
        ("scheduler",)),
    "agentrl_scheduler_generator_idle_ratio": (
        G, "Fraction of generator time idle since the scheduler started.", ("scheduler",)),
    "agentrl_scheduler_episodes_finished": (
        C, "Episodes ended, by outcome (finished, failed, truncated, masked, aborted).",
        ("scheduler", "outcome")),
    "agentrl_scheduler_groups_delivered": (C, "Groups handed to the trainer.", ("scheduler",)),
    "agentrl_scheduler_generate_calls": (C, "Calls of the generator.", ("scheduler",)),
    # anything else with stats()
    "agentrl_component_stat": (G, "A numeric entry of a registered object's stats().",
                               ("component", "key")),
    # trainer
    "agentrl_trainer_step": (G, "Optimizer steps done.", ()),
    "agentrl_trainer_reward_mean": (G, "Mean reward of the last batch.", ()),
    "agentrl_trainer_pass_rate_ratio": (G, "Pass rate of the last batch.", ()),
    "agentrl_trainer_held_out_pass_rate_ratio": (G, "Last held-out pass rate.", ()),
    "agentrl_trainer_tokens_per_second": (G, "Tokens trained on per second (last step).", ()),
    "agentrl_trainer_update_seconds": (G, "Time of the last policy update.", ()),
    "agentrl_trainer_staleness": (G, "Policy lag of the last batch's episodes (versions).", ()),
    "agentrl_trainer_rollouts_per_second": (G, "Episodes finished per second (last step).", ()),
    "agentrl_trainer_sandbox_runs_per_second": (G, "Sandbox runs per second (last step).", ()),
    "agentrl_trainer_generator_idle_ratio": (G, "Generator idle fraction (last step).", ()),
    "agentrl_gpu_memory_used_bytes": (G, "CUDA memory allocated by this process.", ("device",)),
    "agentrl_gpu_memory_reserved_bytes": (G, "CUDA memory reserved by this process.",
                                          ("device",)),
    "agentrl_gpu_utilization_ratio": (G, "GPU utilisation (needs pynvml).", ("device",)),
    # HTTP
    "agentrl_http_requests": (C, "HTTP requests served, by method, route and status code.",
                              ("method", "route", "code")),
    "agentrl_http_request_duration_seconds": (H, "Time to serve an HTTP request.",
                                              ("method", "route")),
    "agentrl_http_requests_in_flight": (G, "HTTP requests being served.", ()),
}  # fmt: skip


def metric_names() -> set[str]:
    """Every series name agentrl may expose (counters with ``_total``, histograms with
    ``_bucket``/``_sum``/``_count``), for checking dashboards and alert rules."""
    out = set()
    for name, (kind, _, _) in SPECS.items():
        if kind == C:
            out |= {name + "_total", name + "_created"}
        elif kind == H:
            out |= {name + s for s in ("_bucket", "_sum", "_count", "_created")}
        else:
            out.add(name)
    return out


def _family(name: str, labels: tuple[str, ...] | None = None) -> Metric:
    kind, doc, names = SPECS[name]
    lb = list(names if labels is None else labels)
    if kind == C:
        return CounterMetricFamily(name, doc, labels=lb)
    if kind == H:
        return HistogramMetricFamily(name, doc, labels=lb)
    return GaugeMetricFamily(name, doc, labels=lb)


class _Families:
    """Families made on first use during one collection."""

    def __init__(self) -> None:
        self.f: dict[str, Metric] = {}

    def add(self, name: str, labels: list[str], value: float) -> None:
        fam = self.f.get(name)
        if fam is None:
            fam = self.f[name] = _family(name)
        fam.add_metric(labels, value)

    def hist(self, name: str, labels: list[str], bounds: tuple, counts: list[int], total: float):
        fam = self.f.get(name)
        if fam is None:
            fam = self.f[name] = _family(name)
        cum, buckets = 0, []
        for b, n in zip(bounds, counts, strict=False):
            cum += n
            buckets.append((_le(b), cum))
        buckets.append(("+Inf", cum + counts[-1]))
        fam.add_metric(labels, buckets, total)


def _le(b: float) -> str:
    return repr(float(b))


# ---- objects with stats()
class StatsCollector(Collector):
    """Reads the ``stats()`` of registered objects at scrape time (weakly held)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objs: dict[str, tuple[Any, str]] = {}

    def add(self, obj: Any, name: str, kind: str) -> None:
        ref = weakref.ref(obj) if _weakrefable(obj) else (lambda o=obj: o)
        with self._lock:
            self._objs[name] = (ref, kind)

    def remove(self, name: str) -> None:
        with self._lock:
            self._objs.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._objs)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        fams = _Families()
        with self._lock:
            items = list(self._objs.items())
        for name, (ref, kind) in items:
            obj = ref()
            if obj is None:
                self.remove(name)
                continue
            try:
                s = obj.stats()
            except Exception:  # a closed or broken object: skip it this time
                continue
            if kind == "pool":
                _pool_metrics(fams, name, s, obj)
            elif kind == "scheduler":
                _scheduler_metrics(fams, name, s)
            else:
                for k, v in s.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        fams.add("agentrl_component_stat", [name, str(k)], float(v))
        return list(fams.f.values())


def _weakrefable(obj: Any) -> bool:
    try:
        weakref.ref(obj)
        return True
    except TypeError:
        return False


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _pool_metrics(fams: _Families, name: str, s: Mapping[str, Any], obj: Any) -> None:
    p = [name]
    fams.add("agentrl_pool_jobs_submitted", p, _num(s.get("submitted")))
    for outcome in ("completed", "cancelled", "expired", "failed"):
        fams.add("agentrl_pool_jobs_finished", [name, outcome], _num(s.get(outcome)))
    fams.add("agentrl_pool_retries", p, _num(s.get("retries")))
    fams.add("agentrl_pool_worker_panics", p, _num(s.get("panics")))
    depth = s.get("queue_depth")
    if isinstance(depth, Mapping):
        for prio, n in depth.items():
            fams.add("agentrl_pool_queue_depth", [name, str(prio)], _num(n))
    fams.add("agentrl_pool_jobs_queued", p, _num(s.get("queued")))
    fams.add("agentrl_pool_jobs_running", p, _num(s.get("running")))
    fams.add("agentrl_pool_jobs_in_flight", p, _num(s.get("inflight")))
    fams.add("agentrl_pool_capacity_jobs", p, _num(s.get("capacity")))
    fams.add("agentrl_pool_workers", p, _num(s.get("workers")))
    fams.add("agentrl_pool_workers_alive", p, _num(s.get("workers_alive", s.get("workers"))))
    fams.add("agentrl_pool_utilisation_ratio", p, _num(s.get("utilisation")))
    if "actors" in s:  # a pool across a cluster: its faults and each node's share
        fams.add("agentrl_pool_infra_retries", p, _num(s.get("infra_retries")))
        fams.add("agentrl_pool_actors", p, _num(s.get("actors")))
        fams.add("agentrl_pool_actors_lost", p, _num(s.get("actors_lost")))
        fams.add("agentrl_pool_actors_replaced", p, _num(s.get("actors_replaced")))
        nodes = s.get("nodes")
        for node, n in nodes.items() if isinstance(nodes, Mapping) else ():
            if not isinstance(n, Mapping):
                continue
            q = [name, str(node)]
            fams.add("agentrl_pool_node_actors", q, _num(n.get("actors")))
            fams.add("agentrl_pool_node_jobs_delivered", q, _num(n.get("delivered")))
            fams.add("agentrl_pool_node_jobs_running", q, _num(n.get("running")))
            fams.add("agentrl_pool_node_workers", q, _num(n.get("workers")))
    sb = getattr(obj, "sandbox", None)
    inner = getattr(sb, "_inner", None)
    slots = getattr(inner, "slots", None)
    if isinstance(slots, int):
        fams.add("agentrl_sandbox_slots", p, slots)
        fams.add("agentrl_sandbox_warm_interpreters", p, slots if getattr(sb, "warm", 0) else 0)


_EPISODE_KEYS = {
    "finished": "episodes_finished",
    "failed": "episodes_failed",
    "truncated": "episodes_truncated",
    "masked": "episodes_masked",
    "aborted": "episodes_aborted",
}


def _scheduler_metrics(fams: _Families, name: str, s: Mapping[str, Any]) -> None:
    p = [name]
    fams.add("agentrl_scheduler_policy_version", p, _num(s.get("version")))
    fams.add("agentrl_scheduler_episodes_in_flight", p, _num(s.get("inflight")))
    fams.add("agentrl_scheduler_episodes_pending", p, _num(s.get("pending")))
    fams.add("agentrl_scheduler_episodes_waiting_generation", p, _num(s.get("waiting_generation")))
    fams.add("agentrl_scheduler_episodes_in_generation", p, _num(s.get("in_generation")))
    fams.add("agentrl_scheduler_episodes_in_env", p, _num(s.get("in_env")))
    fams.add("agentrl_scheduler_groups_ready", p, _num(s.get("output_queue")))
    bound = s.get("staleness_bound")
    if isinstance(bound, (int, float)):
        fams.add("agentrl_scheduler_staleness_bound", p, float(bound))
    fams.add("agentrl_scheduler_generator_idle_ratio", p, _num(s.get("generator_idle_fraction")))
    for outcome, key in _EPISODE_KEYS.items():
        fams.add("agentrl_scheduler_episodes_finished", [name, outcome], _num(s.get(key)))
    fams.add("agentrl_scheduler_groups_delivered", p, _num(s.get("groups_delivered")))
    fams.add("agentrl_scheduler_generate_calls", p, _num(s.get("generate_calls")))


_STATS = StatsCollector()
REGISTRY.register(_STATS)
ProcessCollector(registry=REGISTRY)  # process_cpu_seconds_total, process_resident_memory_bytes


def register_stats(obj: Any, name: str, kind: str | None = None) -> None:
    """Exposes ``obj.stats()`` at every scrape under ``name`` (a label value). ``kind``:
    ``"pool"`` (a :class:`SandboxPool`, ``RayPool`` or anything with the pool's stats keys),
    ``"scheduler"`` (a :class:`RolloutScheduler`), or ``"generic"`` (every numeric entry as
    ``agentrl_component_stat{component=name,key=...}``); None guesses from the stats keys.
    The object is held weakly where it can be; a later registration of the same name
    replaces it."""
    if not callable(getattr(obj, "stats", None)):
        raise TypeError(f"{type(obj).__name__} has no stats() method")
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    if kind is None:
        s = obj.stats()
        if "generator_idle_fraction" in s:
            kind = "scheduler"
        elif "queue_depth" in s and "submitted" in s:
            kind = "pool"
        else:
            kind = "generic"
    if kind not in ("pool", "scheduler", "generic"):
        raise ValueError(f'kind must be "pool", "scheduler" or "generic", got {kind!r}')
    _STATS.add(obj, name, kind)


def unregister_stats(name: str) -> None:
    """Stops exposing the object registered as ``name``."""
    _STATS.remove(name)


# ---- per-result counts
class JobMetrics(Collector):
    """A pool observer counting results by verdict and language, with run time, CPU time and
    peak memory histograms, limits hit and refused system calls. Its per-result work is a few
    dict and list updates under one lock; prometheus families are built only at scrape."""

    def __init__(self, pool_name: str) -> None:
        self.pool = pool_name
        self._lock = threading.Lock()
        self._lang: dict[int, str] = {}
        self._early: dict[int, Any] = {}
        self.submitted_by_lang: dict[str, int] = {}
        self.by_status: dict[tuple[str, str], int] = {}
        self.limits: dict[str, int] = {}
        self.syscalls: dict[str, int] = {}
        self._hists: dict[tuple[str, str], list] = {}  # (metric, lang) -> [counts..., sum]

    # observer protocol (the pool's threads)
    def submitted(self, ids: list[int], items: list) -> None:
        with self._lock:
            early = []
            for jid, it in zip(ids, items, strict=False):
                tag = getattr(it, "tag", None)
                lang = tag[0] if tag else "other"
                self.submitted_by_lang[lang] = self.submitted_by_lang.get(lang, 0) + 1
                e = self._early.pop(jid, None) if self._early else None
                if e is None:
                    self._lang[jid] = lang
                else:
                    early.append((e[0], lang))
            for o, lang in early:
                self._count(o, lang)

    def finished(self, outcomes: list) -> None:
        with self._lock:
            pop = self._lang.pop
            for o in outcomes:
                lang = pop(o[0], None)
                if lang is None:  # reported before its submission, or submitted before us
                    self._early[o[0]] = (o, time.monotonic())
                else:
                    self._count(o, lang)
            if len(self._early) > _EARLY_MAX:
                self._expire()

    def _expire(self) -> None:
        """Counts (as ``other``) outcomes whose submission was never reported: jobs submitted
        before this observer was added. An outcome that only raced its submission's report
        waits microseconds, not a second."""
        now = time.monotonic()
        for jid, (o, t) in list(self._early.items()):
            if now - t > 1.0:
                del self._early[jid]
                self._count(o, "other")

    def _count(self, o: Any, lang: str) -> None:
        r = o[2]
        st = getattr(r, "status", None) if o[1].value == "completed" else None
        status = o[1].value if st is None else st.value
        key = (status, lang)
        self.by_status[key] = self.by_status.get(key, 0) + 1
        if st is None:  # not run, or not an ExecResult (a test pool's fake jobs)
            return
        self._observe("run", lang, LATENCY_BUCKETS, r.wall_time_s)
        self._observe("cpu", lang, LATENCY_BUCKETS, r.cpu_time_s)
        if r.peak_memory_bytes:
            self._observe("mem", lang, MEMORY_BUCKETS, float(r.peak_memory_bytes))
        if r.limit:
            self.limits[r.limit] = self.limits.get(r.limit, 0) + 1
        for sc in r.denied_syscalls:
            self.syscalls[sc] = self.syscalls.get(sc, 0) + 1

    def _observe(self, what: str, lang: str, bounds: tuple, v: float) -> None:
        h = self._hists.get((what, lang))
        if h is None:
            h = self._hists[(what, lang)] = [0] * (len(bounds) + 2)
        h[bisect.bisect_left(bounds, v)] += 1
        h[-1] += v

    # collector
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            sub = dict(self.submitted_by_lang)
            fin = dict(self.by_status)
            limits = dict(self.limits)
            sys_ = dict(self.syscalls)
            hists = {k: list(v) for k, v in self._hists.items()}
        fams = _Families()
        p = self.pool
        for lang, n in sub.items():
            fams.add("agentrl_jobs_submitted", [p, lang], n)
        for (status, lang), n in fin.items():
            fams.add("agentrl_jobs_finished", [p, status, lang], n)
        for lim, n in limits.items():
            fams.add("agentrl_job_limit_hits", [p, lim], n)
        for sc, n in sys_.items():
            fams.add("agentrl_syscalls_refused", [p, sc], n)
        names = {"run": "agentrl_job_run_seconds", "cpu": "agentrl_job_cpu_seconds",
                 "mem": "agentrl_job_peak_memory_bytes"}  # fmt: skip
        for (what, lang), h in hists.items():
            bounds = MEMORY_BUCKETS if what == "mem" else LATENCY_BUCKETS
            fams.hist(names[what], [p, lang], bounds, h[:-1], h[-1])
        return list(fams.f.values())

    def snapshot(self) -> dict[str, Any]:
        """The counts so far (for tests and views)."""
        with self._lock:
            return {
                "submitted": dict(self.submitted_by_lang),
                "finished": dict(self.by_status),
                "limits": dict(self.limits),
                "syscalls": dict(self.syscalls),
            }


_EARLY_MAX = 64
"""Outcomes waiting for their submission's report before old ones are counted anyway."""

_INSTRUMENTED: dict[str, JobMetrics] = {}
_INSTR_LOCK = threading.Lock()


def instrument(pool: Any, name: str = "default") -> JobMetrics | None:
    """Exposes ``pool``'s metrics under ``pool=name``: its ``stats()`` at scrape time and,
    where the pool accepts observers (a :class:`SandboxPool`), per-result counts. Returns the
    :class:`JobMetrics` (None for a pool without observers). Instrumenting a second pool
    under the same name replaces the first."""
    register_stats(pool, name, "pool")
    if not callable(getattr(pool, "add_observer", None)):
        return None
    jm = JobMetrics(name)
    with _INSTR_LOCK:
        old = _INSTRUMENTED.pop(name, None)
        if old is not None:
            REGISTRY.unregister(old)
        _INSTRUMENTED[name] = jm
        REGISTRY.register(jm)
    pool.add_observer(jm)
    return jm


# ---- judge and trainer
class _Simple(Collector):
    """Values pushed by agentrl itself (judgements, trainer steps), exposed at scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.judgements: dict[str, int] = {}
        self.trainer: dict[str, float] = {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        fams = _Families()
        with self._lock:
            judgements = dict(self.judgements)
            trainer = dict(self.trainer)
        for cls, n in judgements.items():
            fams.add("agentrl_judgements", [cls], n)
        for k, v in trainer.items():
            fams.add(k, [], v)
        _gpu(fams)
        return list(fams.f.values())


def _gpu(fams: _Families) -> None:
    import sys

    torch = sys.modules.get("torch")  # never imported here: only a process using it has GPUs
    if torch is None:
        return
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return
        for i in range(torch.cuda.device_count()):
            d = [str(i)]
            fams.add("agentrl_gpu_memory_used_bytes", d, torch.cuda.memory_allocated(i))
            fams.add("agentrl_gpu_memory_reserved_bytes", d, torch.cuda.memory_reserved(i))
            with contextlib.suppress(Exception):  # pynvml missing
                fams.add("agentrl_gpu_utilization_ratio", d, torch.cuda.utilization(i) / 100.0)
    except Exception:
        return


_PUSHED = _Simple()
REGISTRY.register(_PUSHED)


def observe_judgement(error_class: str) -> None:
    """Counts one judgement of ``error_class`` (``passed`` for a pass)."""
    with _PUSHED._lock:
        _PUSHED.judgements[error_class] = _PUSHED.judgements.get(error_class, 0) + 1


_TRAINER_KEYS = {
    "step": "agentrl_trainer_step",
    "reward_mean": "agentrl_trainer_reward_mean",
    "batch_pass_rate": "agentrl_trainer_pass_rate_ratio",
    "held_out_pass_rate": "agentrl_trainer_held_out_pass_rate_ratio",
    "tokens_per_s": "agentrl_trainer_tokens_per_second",
    "update_s": "agentrl_trainer_update_seconds",
    "staleness": "agentrl_trainer_staleness",
    "rollouts_per_s": "agentrl_trainer_rollouts_per_second",
    "sandbox_runs_per_s": "agentrl_trainer_sandbox_runs_per_second",
    "generator_idle": "agentrl_trainer_generator_idle_ratio",
}


def record_trainer_step(rec: Mapping[str, Any]) -> None:
    """Sets the trainer gauges from a step record (the keys of ``metrics.jsonl``'s ``step``
    events: ``step``, ``reward_mean``, ``batch_pass_rate``, ``tokens_per_s``, ``update_s``,
    ...); missing or non-numeric keys are left as they were."""
    with _PUSHED._lock:
        for k, name in _TRAINER_KEYS.items():
            v = rec.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:
                _PUSHED.trainer[name] = float(v)


# ---- serving
def asgi_app() -> Callable:
    """An ASGI app serving :data:`REGISTRY` in the Prometheus text format (mount it at
    ``/metrics``)."""
    from prometheus_client import make_asgi_app

    return make_asgi_app(registry=REGISTRY)


def start_http_server(port: int, addr: str = "127.0.0.1") -> Any:
    """Serves :data:`REGISTRY` at ``http://addr:port/metrics`` from a daemon thread; returns
    the server (``.shutdown()`` stops it). Port 0 picks a free one (``server.server_port``)."""
    from prometheus_client import start_http_server as _start

    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
    server, _thread = _start(port, addr=addr, registry=REGISTRY)
    return server


def render() -> tuple[bytes, str]:
    """:data:`REGISTRY` in the Prometheus text format, and its Content-Type: for a server
    that is not ASGI (``agentrl serve``'s own HTTP loop) to answer ``GET /metrics``."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def observe_http(method: str, route: str, code: int, seconds: float) -> None:
    """Counts one HTTP request served by a server that is not ASGI (``route``: the route's
    template, not the raw path)."""
    _HTTP.observe(method, route, code, seconds)


class _Http(Collector):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, str], int] = {}
        self.hist: dict[tuple[str, str], list] = {}
        self.in_flight = 0

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        fams = _Families()
        with self._lock:
            reqs = dict(self.requests)
            hist = {k: list(v) for k, v in self.hist.items()}
            fams.add("agentrl_http_requests_in_flight", [], self.in_flight)
        for k, n in reqs.items():
            fams.add("agentrl_http_requests", list(k), n)
        for k, h in hist.items():
            fams.hist("agentrl_http_request_duration_seconds", list(k), HTTP_BUCKETS,
                      h[:-1], h[-1])  # fmt: skip
        return list(fams.f.values())

    def observe(self, method: str, route: str, code: int, seconds: float) -> None:
        with self._lock:
            k = (method, route, str(code))
            self.requests[k] = self.requests.get(k, 0) + 1
            h = self.hist.get((method, route))
            if h is None:
                h = self.hist[(method, route)] = [0] * (len(HTTP_BUCKETS) + 2)
            h[bisect.bisect_left(HTTP_BUCKETS, seconds)] += 1
            h[-1] += seconds


_HTTP = _Http()
REGISTRY.register(_HTTP)


class MetricsMiddleware:
    """ASGI middleware counting HTTP requests by method, route template (Starlette/FastAPI's
    matched route, else ``"unmatched"``, so paths with ids do not explode the label set) and
    status code, with a duration histogram. ``app = MetricsMiddleware(app)``."""

    def __init__(self, app: Callable, skip: Iterable[str] = ("/metrics",)) -> None:
        self.app = app
        self.skip = tuple(skip)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope.get("type") != "http" or scope.get("path", "").startswith(self.skip):
            await self.app(scope, receive, send)
            return
        code = [500]

        async def _send(message: dict) -> None:
            if message.get("type") == "http.response.start":
                code[0] = int(message.get("status", 500))
            await send(message)

        t0 = time.perf_counter()
        with _HTTP._lock:
            _HTTP.in_flight += 1
        try:
            await self.app(scope, receive, _send)
        finally:
            with _HTTP._lock:
                _HTTP.in_flight -= 1
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            _HTTP.observe(scope.get("method", "GET"), path, code[0], time.perf_counter() - t0)
