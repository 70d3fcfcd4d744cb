"""Metrics of agentrl (agentrl.observability.metrics): counts against known workloads, a real
Prometheus server scraping /metrics, the shipped alert rules (promtool) and dashboard."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from agentrl import Limits, SandboxPool
from conftest import TIME_SCALE

prometheus_client = pytest.importorskip("prometheus_client")

from agentrl.observability import asset_path, job_context  # noqa: E402
from agentrl.observability import metrics as m  # noqa: E402

N_OK, N_TIMEOUT, N_ERR = 6, 3, 2
CHROOT = "import os\nos.makedirs('j', exist_ok=True)\ntry: os.chroot('j')\nexcept OSError: pass\n"
SPIN = Limits(wall_time_s=2.0 * TIME_SCALE, cpu_time_s=0.3 * TIME_SCALE)


def _scrape() -> str:
    return prometheus_client.generate_latest(m.REGISTRY).decode()


def _value(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample ``name{labels...}`` in exposition ``text`` (labels a subset)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, val = line.rpartition(" ")
        got = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if head.split("{")[0] == name and all(got.get(k) == v for k, v in labels.items()):
            return float(val)
    return None


def _workload(pool: SandboxPool) -> None:
    futs = [pool.submit_python(f"print({i})") for i in range(N_OK)]
    futs += [pool.submit_python("while True: pass", limits=SPIN) for _ in range(N_TIMEOUT)]
    futs += [pool.submit(["/bin/sh", "-c", "exit 3"]) for _ in range(N_ERR)]
    futs.append(pool.submit_python(CHROOT))
    for f in futs:
        f.result(timeout=60 * TIME_SCALE)


@pytest.fixture(scope="module")
def loaded_pool():
    with SandboxPool(workers=2) as pool:
        jm = m.instrument(pool, "known")
        _workload(pool)
        yield pool, jm
    m.unregister_stats("known")


def test_counters_match_a_known_workload(loaded_pool) -> None:
    pool, jm = loaded_pool
    snap = jm.snapshot()
    assert snap["submitted"] == {"python": N_OK + N_TIMEOUT + 1, "bash": N_ERR}
    fin = snap["finished"]
    assert fin[("ok", "python")] == N_OK + 1  # the chroot program handles its EPERM
    assert fin[("timeout", "python")] == N_TIMEOUT
    assert fin[("runtime_error", "bash")] == N_ERR
    text = _scrape()
    assert _value(text, "agentrl_jobs_finished_total", pool="known", status="timeout") == N_TIMEOUT
    assert _value(text, "agentrl_jobs_finished_total", pool="known", status="ok") == N_OK + 1
    assert (
        _value(text, "agentrl_pool_jobs_submitted_total", pool="known") == pool.stats()["submitted"]
    )
    total = N_OK + N_TIMEOUT + N_ERR + 1
    assert _value(text, "agentrl_pool_jobs_finished_total", pool="known", outcome="completed") == (
        total
    )
    # each spin hit its CPU limit (or, on a host too loaded to give it the CPU, the wall one)
    hits = [_value(text, "agentrl_job_limit_hits_total", pool="known", limit=lim) or 0
            for lim in ("cpu_time", "wall_time")]  # fmt: skip
    assert sum(hits) == N_TIMEOUT
    assert _value(text, "agentrl_job_run_seconds_count", pool="known", language="python") == (
        N_OK + N_TIMEOUT + 1
    )
    # every timeout that hit its CPU limit spent it: the histogram's sum says so
    assert _value(text, "agentrl_job_cpu_seconds_sum", pool="known", language="python") >= (
        hits[0] * 0.3 * TIME_SCALE * 0.9
    )
    assert _value(text, "agentrl_job_cpu_seconds_bucket", pool="known", language="python",
                  le="+Inf") == N_OK + N_TIMEOUT + 1  # fmt: skip
    assert _value(text, "agentrl_pool_workers_alive", pool="known") == 2
    assert _value(text, "agentrl_pool_jobs_queued", pool="known") == 0
    # the refused chroot(2) is counted by name
    assert _value(text, "agentrl_syscalls_refused_total", pool="known", syscall="chroot") == 1


def test_language_comes_from_the_context_and_cardinality_is_bounded() -> None:
    with SandboxPool(workers=1) as pool:
        jm = m.instrument(pool, "ctx")
        try:
            with job_context(language="cpp", task_id="t1"):
                pool.submit(["/bin/true"]).result(timeout=30 * TIME_SCALE)
            pool.submit(["/bin/true-but-unknown-name-xyz"]).result(timeout=30 * TIME_SCALE)
            pool.submit(["/usr/bin/python3.11", "-c", "0"]).result(timeout=30 * TIME_SCALE)
        finally:
            m.unregister_stats("ctx")
    sub = jm.snapshot()["submitted"]
    assert sub == {"cpp": 1, "other": 1, "python": 1}


def test_scheduler_trainer_judge_and_generic_stats() -> None:
    class Sched:
        def stats(self):
            return {"version": 3, "inflight": 5, "pending": 7, "waiting_generation": 2,
                    "in_generation": 1, "in_env": 2, "output_queue": 4, "staleness_bound": 64,
                    "generator_idle_fraction": 0.25, "episodes_finished": 11,
                    "episodes_failed": 1, "groups_delivered": 2, "generate_calls": 9}  # fmt: skip

    class Thing:
        def stats(self):
            return {"hosts": 3, "name": "x", "nested": {"a": 1}}

    s, t = Sched(), Thing()
    m.register_stats(s, "sched")
    m.register_stats(t, "ray")
    m.record_trainer_step({"step": 12, "reward_mean": 0.5, "tokens_per_s": 900.0,
                           "generator_idle": 0.1, "bogus": "x"})  # fmt: skip
    m.observe_judgement("timeout")
    m.observe_judgement("timeout")
    try:
        text = _scrape()
        assert _value(text, "agentrl_scheduler_generator_idle_ratio", scheduler="sched") == 0.25
        assert _value(text, "agentrl_scheduler_groups_ready", scheduler="sched") == 4
        assert _value(text, "agentrl_scheduler_episodes_finished_total", scheduler="sched",
                      outcome="failed") == 1  # fmt: skip
        assert _value(text, "agentrl_component_stat", component="ray", key="hosts") == 3
        assert _value(text, "agentrl_trainer_step") == 12
        assert _value(text, "agentrl_trainer_tokens_per_second") == 900
        assert _value(text, "agentrl_judgements_total", error_class="timeout") >= 2
    finally:
        m.unregister_stats("sched")
        m.unregister_stats("ray")
    # an object that goes away is dropped, not kept alive
    m.register_stats(Thing(), "gone")
    assert _value(_scrape(), "agentrl_component_stat", component="gone") is None
    with pytest.raises(TypeError, match="stats"):
        m.register_stats(object(), "x")
    with pytest.raises(ValueError, match="kind"):
        m.register_stats(t, "x", kind="nope")


def test_every_exposed_name_is_in_the_table(loaded_pool) -> None:
    names = m.metric_names()
    for line in _scrape().splitlines():
        if line.startswith("agentrl_"):
            assert line.split("{")[0].split(" ")[0] in names, line


# ---- a real Prometheus server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture
def metrics_server():
    """/metrics of an ASGI app (asgi_app under MetricsMiddleware) served by uvicorn."""
    uvicorn = pytest.importorskip("uvicorn")
    starlette_apps = pytest.importorskip("starlette.applications")
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    async def hello(request):
        return PlainTextResponse("hi")

    app = starlette_apps.Starlette(
        routes=[Route("/hello/{name}", hello), Mount("/metrics", app=m.asgi_app())]
    )
    port = _free_port()
    cfg = uvicorn.Config(
        m.MetricsMiddleware(app), host="127.0.0.1", port=port, log_level="error", lifespan="off"
    )
    server = uvicorn.Server(cfg)
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 10 * TIME_SCALE
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    yield port
    server.should_exit = True
    t.join(10)


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus is not installed")
def test_prometheus_scrapes_and_answers_a_query(loaded_pool, metrics_server, tmp_path) -> None:
    port = metrics_server
    for name in ("a", "b", "c"):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/hello/{name}", timeout=5).read()
    prom_port = _free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: agentrl\n    metrics_path: /metrics/\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
    )
    proc = subprocess.Popen(
        [shutil.which("prometheus"), f"--config.file={cfg}",
         f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{prom_port}"
        queries = {
            'agentrl_jobs_finished_total{pool="known",status="timeout"}': N_TIMEOUT,
            'sum(agentrl_jobs_finished_total{pool="known"})': N_OK + N_TIMEOUT + N_ERR + 1,
            'agentrl_http_requests_total{route="/hello/{name}",code="200"}': 3,
            'up{job="agentrl"}': 1,
        }
        got: dict[str, float] = {}
        deadline = time.monotonic() + 30 * TIME_SCALE
        while time.monotonic() < deadline and len(got) < len(queries):
            assert proc.poll() is None, proc.stderr.read().decode()
            for q in queries:
                try:
                    r = _get_json(f"{base}/api/v1/query?query={urllib.parse.quote(q)}")
                except OSError:
                    break  # not up yet
                if r["status"] == "success" and r["data"]["result"]:
                    got[q] = float(r["data"]["result"][0]["value"][1])
            time.sleep(0.3)
        assert got == queries
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stderr.close()


# ---- the shipped assets
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_alert_rules_pass_promtool() -> None:
    r = subprocess.run(
        ["promtool", "check", "rules", asset_path("alerts.yml")], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def _metrics_in(expr: str) -> set[str]:
    words = set(re.findall(r"\b(agentrl_[a-z_]+)\b", expr))
    return words


def test_dashboard_and_rules_reference_only_existing_metrics() -> None:
    names = m.metric_names()
    dash = json.loads(Path(asset_path("dashboard.json")).read_text())
    assert dash["panels"] and dash["uid"]
    ids, seen = set(), set()
    for p in dash["panels"]:
        assert p["id"] not in ids and p["title"] and p["targets"]
        ids.add(p["id"])
        for t in p["targets"]:
            used = _metrics_in(t["expr"])
            assert used, t["expr"]
            assert used <= names, (p["title"], used - names)
            seen |= used
    # the dashboard shows the pool, scheduler, trainer and HTTP families
    for fam in ("agentrl_jobs_finished_total", "agentrl_pool_jobs_queued",
                "agentrl_scheduler_generator_idle_ratio", "agentrl_trainer_reward_mean",
                "agentrl_http_requests_total"):  # fmt: skip
        assert fam in seen
    rules = Path(asset_path("alerts.yml")).read_text()
    used = _metrics_in(rules)
    assert used and used <= names, used - names
    for alert in ("AgentrlSandboxErrorRate", "AgentrlPoolBacklog", "AgentrlGeneratorIdle"):
        assert f"alert: {alert}" in rules


def test_cli_prints_the_assets(capsys) -> None:
    from agentrl.cli.main import main

    assert main(["metrics", "dashboard"]) == 0
    assert json.loads(capsys.readouterr().out)["uid"] == "agentrl-overview"
    assert main(["metrics", "rules"]) == 0
    assert "AgentrlPoolBacklog" in capsys.readouterr().out
    assert main(["metrics", "names"]) == 0
    assert "agentrl_jobs_finished_total" in capsys.readouterr().out.split()


def test_start_http_server_serves_the_registry() -> None:
    server = m.start_http_server(0)
    try:
        port = server.server_port
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        assert b"agentrl_http_requests_in_flight" in body
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ValueError, match="port"):
        m.start_http_server(70000)


# ---- the trainer: report_to, --metrics-port, traces in the run directory
def test_train_reports_to_tensorboard_and_wandb_serves_metrics_and_traces(
    tmp_path, monkeypatch
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    import argparse

    import torch
    from agentrl.cli.train import add_parser
    from agentrl.observability.traces import search
    from agentrl.train.config import SFTConfig, TrainConfig, config_from_args
    from agentrl.train.job import run_job
    from agentrl.train.progress import ProgressView

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    torch.set_num_threads(1)
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="command"))
    a = p.parse_args(["train", "--metrics-port", "0", "--report-to", "tensorboard,wandb"])
    assert config_from_args(a).metrics_port == 0
    with pytest.raises(ValueError, match="report_to"):
        TrainConfig(report_to="jsonl,csv")
    with pytest.raises(ValueError, match="traces"):
        TrainConfig(traces="xml")

    scraped: list[bytes] = []
    urls: list[str] = []

    class View(ProgressView):
        def message(self, text: str) -> None:
            url = re.search(r"(http://\S+/metrics)", text)
            if url:
                urls.append(url.group(1))
            elif urls and text.startswith("warm start:"):  # the pool has run: scrape now
                scraped.append(urllib.request.urlopen(urls[0], timeout=5).read())

    out = tmp_path / "run"
    c = TrainConfig(
        out_dir=str(out), threads=1, rl_threads=1, progress=False, families="arith",
        sft=SFTConfig(steps=4, batch_size=8), steps=2, group_size=2, groups_per_step=2,
        eval_every=0, eval_samples=1, final_eval_samples=1, sandbox_workers=2, n_layer=1,
        d_model=32, n_head=2, report_to="jsonl,tensorboard,wandb", metrics_port=0,
        traces="sqlite",
    )  # fmt: skip
    s = run_job(c, view=View(enabled=False))
    assert s["steps"] == 2
    assert scraped and b'agentrl_pool_workers{pool="train"} 2.0' in scraped[0]
    assert b'agentrl_jobs_finished_total{language="python",pool="train"' in scraped[0]
    text = _scrape()
    assert _value(text, "agentrl_trainer_step") == 2
    assert _value(text, "agentrl_jobs_finished_total", pool="train", status="ok") is not None
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r["event"] == "step"] == [1, 2]
    assert "tokens_per_s" in steps[-3] or any("tokens_per_s" in r for r in steps)
    (event_file,) = (out / "tensorboard").glob("events.out.tfevents.*")
    assert event_file.stat().st_size > 200  # the config text and the step scalars
    assert list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    jobs = list(search(out / "traces", "kind:job", limit=1000))
    assert jobs and all(j["task_id"] for j in jobs)
    assert any("episode" in j and "policy_version" in j for j in jobs)
    assert list(search(out / "traces", "kind:judgement", limit=1))


def test_observe_pool_is_one_call_for_a_service(tmp_path) -> None:
    from agentrl.observability import observe_pool
    from agentrl.observability.traces import search

    with SandboxPool(workers=1) as pool:
        tracer = observe_pool(pool, name="svc", traces=tmp_path, sink="sqlite")
        try:
            pool.submit_python("print('served')").result(timeout=30 * TIME_SCALE)
        finally:
            m.unregister_stats("svc")
    tracer.close()
    body, ctype = m.render()
    assert ctype.startswith("text/plain") and b'status="ok"' in body
    assert b'pool="svc"' in body
    (rec,) = search(tmp_path, "served")
    assert rec["trace_id"].startswith("svc-")
    m.observe_http("GET", "/v1/models", 200, 0.01)
    assert _value(_scrape(), "agentrl_http_requests_total", route="/v1/models", code="200") >= 1


def test_outcomes_that_never_ran_are_counted_and_a_raising_observer_loses_nothing(
    caplog,
) -> None:
    from agentrl.pool import JobExpired, JobFailed
    from agentrl.pool.testing import _TestPool

    class Broken:
        def submitted(self, ids, items):
            raise RuntimeError("observer bug")

        def finished(self, outcomes):
            raise RuntimeError("observer bug")

    with _TestPool(workers=1, retries=1) as pool:
        jm = m.instrument(pool, "fake")
        pool.add_observer(Broken())
        try:
            ok = [pool.submit(_TestPool.NOOP, i) for i in range(5)]
            bad = pool.submit(_TestPool.INFRA)
            late = pool.submit(_TestPool.SLEEP, 200_000)
            expired = pool.submit(_TestPool.NOOP, deadline=-1.0)
            assert [f.result(timeout=30) for f in ok] == list(range(5))
            with pytest.raises(JobFailed):
                bad.result(timeout=30)
            with pytest.raises(JobExpired):
                expired.result(timeout=30)
            late.result(timeout=30)
        finally:
            m.unregister_stats("fake")
    fin = jm.snapshot()["finished"]
    assert fin[("completed", "other")] == 6 and fin[("failed", "other")] == 1
    assert fin[("expired", "other")] == 1
    assert "observer bug" in caplog.text


def test_only_the_metrics_module_imports_prometheus_client() -> None:
    import sys

    code = (
        "import sys, agentrl, agentrl.observability, agentrl.observability.traces, "
        "agentrl.observability.report, agentrl.rollout\n"
        "print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "prometheus_client" not in out and "torch" not in out and "wandb" not in out
    out = subprocess.run(
        [sys.executable, "-I", "-c", "import sys, agentrl.observability.metrics; "
         "print(' '.join(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert "prometheus_client" in out and "torch" not in out


def test_jobs_submitted_before_instrumenting_are_counted_not_kept(tmp_path) -> None:
    from agentrl.observability.traces import Tracer
    from agentrl.pool.testing import _TestPool

    with _TestPool(workers=1) as pool:
        before = [pool.submit(_TestPool.SLEEP, 5_000) for _ in range(80)]
        jm = m.instrument(pool, "late")
        tracer = Tracer(tmp_path)
        pool.add_observer(tracer)
        try:
            for f in before:
                f.result(timeout=30)
            time.sleep(1.1)
            pool.submit(_TestPool.NOOP, 1).result(timeout=30)
        finally:
            m.unregister_stats("late")
    assert jm.snapshot()["finished"][("completed", "other")] == 81
    assert not jm._early and not tracer._early
    tracer.close()
    assert tracer.stats()["written"] == 81


@pytest.mark.gpu
def test_gpu_gauges_show_this_process_cuda_memory() -> None:
    """Where CUDA is present, a scrape reports the memory this process holds on each device."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from agentrl.observability.metrics import render

    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda:0")  # 64 MiB
    text = render()[0].decode()
    m = re.search(r'^agentrl_gpu_memory_used_bytes\{device="0"\} (\S+)', text, re.M)
    assert m and float(m.group(1)) >= 64 << 20, text[-2000:]
    assert re.search(r'^agentrl_gpu_memory_reserved_bytes\{device="0"\} ', text, re.M)
    del x
