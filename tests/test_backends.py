"""Generation backends and ``agentrl serve``: the HTTP backend against a real server on
loopback, compared with the local backend."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
uvloop = pytest.importorskip("uvloop")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("openai")

from agentrl.policy import GPTConfig, Policy, SamplingParams  # noqa: E402
from agentrl.policy.backends import (  # noqa: E402
    BackendError,
    GenerationBackend,
    LocalBackend,
    OpenAIBackend,
)
from agentrl.policy.server import ServerThread  # noqa: E402

torch.set_num_threads(2)

SMALL = GPTConfig(n_layer=2, n_head=2, d_model=32, max_seq_len=96)
PROMPTS = ["def add(a, b):", "x", "print('hi')", "ünïcode ✓"]


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.builtin(SMALL, device="cpu", seed=1)


@pytest.fixture(scope="module")
def server(policy: Policy) -> Iterator[ServerThread]:
    with ServerThread(policy, model_name="tiny", batch_wait_s=0.02) as srv:
        yield srv


def run(coro):  # type: ignore[no-untyped-def]
    """Runs a coroutine on uvloop, as the trainer does."""
    return uvloop.run(coro)


async def _post(url: str, body: object, path: str = "/v1/completions") -> tuple[int, dict]:
    """GET ``path`` (``body`` None) or POST ``body`` as JSON; the status and the JSON body."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        if body is None:
            resp = await client.get(path)
        else:
            resp = await client.post(path, json=body)
        return resp.status_code, resp.json()


def test_backends_follow_the_protocol(policy: Policy, server: ServerThread) -> None:
    assert isinstance(LocalBackend(policy), GenerationBackend)
    assert isinstance(OpenAIBackend(server.url, "tiny"), GenerationBackend)
    with pytest.raises(ValueError, match="http"):
        OpenAIBackend("localhost:8000", "tiny")
    with pytest.raises(TypeError, match="Policy"):
        LocalBackend("not a policy")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=20, temperature=0.0),
        SamplingParams(max_new_tokens=30, temperature=0.0, stop=("a", "\n")),
        SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.8, seed=7),
    ],
    ids=["greedy", "stop", "seeded"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_http_backend_matches_local_backend(
    policy: Policy, server: ServerThread, params: SamplingParams, stream: bool
) -> None:
    async def both() -> tuple[list, list]:
        http = OpenAIBackend(server.url + "/v1", "tiny", stream=stream)
        with LocalBackend(policy) as local:
            try:
                return await http.generate(PROMPTS, params), await local.generate(PROMPTS, params)
            finally:
                await http.aclose()

    remote, local = run(both())
    assert len(remote) == len(local) == len(PROMPTS)
    for r, g in zip(remote, local, strict=True):
        assert r.token_ids == g.token_ids
        assert r.prompt_ids == g.prompt_ids
        assert r.text == g.text
        assert r.finish_reason == g.finish_reason
        assert r.stop == g.stop
        assert r.logprobs == pytest.approx(g.logprobs, abs=1e-5)
        assert r.version == g.version == policy.version
        assert r.prompt == g.prompt


def test_concurrent_requests_are_batched(policy: Policy, server: ServerThread) -> None:
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    prompts = [f"{i} + {i} =" for i in range(16)]

    async def many() -> list:
        http = OpenAIBackend(server.url, "tiny")
        try:
            return await asyncio.gather(*(http.generate([p], params) for p in prompts))
        finally:
            await http.aclose()

    before = server.server.batches
    results = run(many())
    assert server.server.batches - before < len(prompts)  # requests shared batches
    expect = policy.generate(prompts, params)
    assert [r[0].token_ids for r in results] == [g.token_ids for g in expect]


def test_openai_api_shapes(server: ServerThread, policy: Policy) -> None:
    status, health = run(_post(server.url, None, "/health"))
    assert status == 200 and health == {"status": "ok", "policy_version": policy.version}
    status, models = run(_post(server.url, None, "/v1/models"))
    assert status == 200 and [m["id"] for m in models["data"]] == ["tiny"]
    body = {"model": "tiny", "prompt": ["ab", "c"], "max_tokens": 5, "n": 3, "logprobs": 0}
    body |= {"temperature": 1.0, "seed": 3}
    status, out = run(_post(server.url, body))
    assert status == 200, out
    assert out["object"] == "text_completion" and out["model"] == "tiny"
    choices = out["choices"]
    assert [c["index"] for c in choices] == list(range(6))
    for c in choices:
        ext, lp = c["agentrl"], c["logprobs"]
        assert len(ext["token_ids"]) == len(lp["tokens"]) == len(lp["token_logprobs"]) == 5
        assert lp["token_logprobs"] == ext["logprobs"]
        assert c["finish_reason"] == ext["finish_reason"] == "length"
        assert lp["tokens"] == [policy.tokenizer.decode([t]) for t in ext["token_ids"]]
    assert {tuple(c["agentrl"]["prompt_token_ids"]) for c in choices[:3]} == {
        tuple(policy.tokenizer.encode_prompt("ab"))
    }
    assert len({tuple(c["agentrl"]["token_ids"]) for c in choices}) > 1  # n samples differ
    usage = out["usage"]
    assert usage["completion_tokens"] == 30
    assert usage["prompt_tokens"] == 3 * (3 + 2)
    # token-id prompts; logprobs omitted: no logprobs object
    ids = policy.tokenizer.encode_prompt("ab")
    status, out2 = run(_post(server.url, {"prompt": ids, "max_tokens": 4, "temperature": 0}))
    assert status == 200 and out2["choices"][0]["logprobs"] is None
    (g,) = policy.generate(["ab"], SamplingParams(max_new_tokens=4, temperature=0))
    assert out2["choices"][0]["agentrl"]["token_ids"] == g.token_ids


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"prompt": "a", "top_p": 2}, 400, "top_p"),
        ({"prompt": "a", "max_tokens": 0}, 400, "max_new_tokens"),
        ({"prompt": "a", "temperature": "hot"}, 400, "temperature"),
        ({"prompt": 5}, 400, "prompt"),
        ({"prompt": [[1, 2], "x"]}, 400, "prompt"),
        ({"prompt": [999]}, 400, "token ids"),
        ({"prompt": "a", "echo": True}, 400, "echo"),
        ({"prompt": "a", "stream": "yes"}, 400, "stream"),
        ({"prompt": "a", "max_tokens": True}, 400, "max_tokens"),
        ({"prompt": "a", "n": 0}, 400, "n must"),
        ({"prompt": "a", "stop": 3}, 400, "stop"),
        ({"prompt": "a", "model": "gpt-9"}, 404, "gpt-9"),
        ({"prompt": "a" * 200, "max_tokens": 4}, 400, "context"),
        ([1, 2], 400, "JSON object"),
    ],
)
def test_bad_requests_get_openai_errors(
    server: ServerThread, body: object, status: int, needle: str
) -> None:
    got, out = run(_post(server.url, body))
    assert got == status
    assert needle in out["error"]["message"]
    got, _ = run(_post(server.url, None, "/health"))  # the server is still up
    assert got == 200


def test_routes_and_methods(server: ServerThread) -> None:
    assert run(_post(server.url, None, "/nope"))[0] == 404
    assert run(_post(server.url, None, "/v1/completions"))[0] == 405
    assert run(_post(server.url, {}, "/health"))[0] == 405


def test_a_bad_request_does_not_fail_its_batch(policy: Policy, server: ServerThread) -> None:
    good = {"prompt": "ok", "max_tokens": 6, "temperature": 0}
    bad = {"prompt": "z" * 120, "max_tokens": 6, "temperature": 0}  # beyond the context

    async def both() -> list:
        return await asyncio.gather(*(_post(server.url, b) for b in (good, bad, good)))

    (s1, o1), (s2, _), (s3, o3) = run(both())
    assert (s1, s2, s3) == (200, 400, 200)
    (g,) = policy.generate(["ok"], SamplingParams(max_new_tokens=6, temperature=0))
    assert (
        o1["choices"][0]["agentrl"]["token_ids"]
        == g.token_ids
        == o3["choices"][0]["agentrl"]["token_ids"]
    )


def test_http_backend_errors(server: ServerThread) -> None:
    async def go() -> None:
        wrong = OpenAIBackend(server.url, "other-model")
        with pytest.raises(BackendError, match="404"):
            await wrong.generate(["a"], SamplingParams(max_new_tokens=2))
        await wrong.aclose()
        closed = OpenAIBackend("http://127.0.0.1:9", "tiny", max_retries=0)  # nothing listens
        with pytest.raises(BackendError, match="connect"):
            await closed.generate(["a"], SamplingParams(max_new_tokens=2))

    run(go())
    with pytest.raises(NotImplementedError):
        OpenAIBackend(server.url, "tiny").update_weights({}, 1)


def test_local_backend_keeps_the_loop_free_and_updates_weights(policy: Policy) -> None:
    pol = policy.copy()
    other = Policy.builtin(SMALL, device="cpu", seed=9)
    params = SamplingParams(max_new_tokens=60, temperature=0.0)

    async def go() -> tuple[int, list, list]:
        ticks = 0
        with LocalBackend(pol) as backend:
            task = asyncio.ensure_future(backend.generate(PROMPTS * 8, params))
            while not task.done():
                await asyncio.sleep(0.001)
                ticks += 1
            first = task.result()
            backend.update_weights(other.state_dict(), version=4)
            assert backend.version == 4
            second = await backend.generate(PROMPTS, params)
            await backend.aupdate_weights(policy.state_dict(), version=6)
            third = await backend.generate(PROMPTS[:1], params)
            assert third[0].version == 6 and third[0].token_ids == first[0].token_ids
        return ticks, first, second

    ticks, first, second = run(go())
    assert ticks > 3  # the loop ran while the worker thread generated
    assert {g.version for g in first} == {0} and {g.version for g in second} == {4}
    assert [g.token_ids for g in second] == [g.token_ids for g in other.generate(PROMPTS, params)]


def test_agentrl_serve_subprocess_and_clean_shutdown(tmp_path: Path, policy: Policy) -> None:
    ckpt = tmp_path / "ckpt"
    saved = policy.copy()
    saved.version = 5
    saved.save(ckpt)
    code = (
        "import argparse, sys\n"
        "from agentrl.policy import server\n"
        "p = argparse.ArgumentParser(); sub = p.add_subparsers()\n"
        "server.add_parser(sub)\n"
        "args = p.parse_args(sys.argv[1:])\n"
        "sys.exit(args.func(args))\n"
    )
    argv = [sys.executable, "-c", code, "serve", "--policy", str(ckpt), "--port", "0"]
    argv += ["--device", "cpu", "--model-name", "ckpt"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert "listening on http://" in line, (line, proc.stderr.read() if proc.poll() else "")  # type: ignore[union-attr]
        url = line.split("listening on ")[1].split()[0]
        params = SamplingParams(max_new_tokens=10, temperature=0.0)

        async def go() -> list:
            http = OpenAIBackend(url, "ckpt")
            try:
                return await http.generate(PROMPTS, params)
            finally:
                await http.aclose()

        remote = run(go())
        local = saved.generate(PROMPTS, params)
        assert [g.token_ids for g in remote] == [g.token_ids for g in local]
        assert {g.version for g in remote} == {5}
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_reports_a_bad_policy_dir(tmp_path: Path) -> None:
    import argparse

    from agentrl.policy import server as srv

    p = argparse.ArgumentParser()
    srv.add_parser(p.add_subparsers())
    args = p.parse_args(["serve", "--policy", str(tmp_path / "missing"), "--device", "cpu"])
    assert srv.run(args) == 2


def test_request_body_round_trip_is_json(server: ServerThread) -> None:
    body = {"prompt": "q", "max_tokens": 3, "temperature": 0, "stop": "\n", "logprobs": 1}
    status, out = run(_post(server.url, body))
    assert status == 200
    json.dumps(out)  # the whole response is plain JSON
    assert time.time() - out["created"] < 60


def test_streaming_backend_reports_text_as_it_comes(policy: Policy, server: ServerThread) -> None:
    params = SamplingParams(max_new_tokens=24, temperature=0.0, stop=("q",))
    deltas: dict[int, list[str]] = {}

    async def go() -> list:
        http = OpenAIBackend(server.url, "tiny", stream=True)
        try:
            return await http.generate(
                PROMPTS, params, on_text=lambda i, d: deltas.setdefault(i, []).append(d)
            )
        finally:
            await http.aclose()

    gens = run(go())
    for i, g in enumerate(gens):
        assert "".join(deltas.get(i, [])) == g.text
    assert max(len(d) for d in deltas.values()) > 1  # pieces, not one blob
    with pytest.raises(ValueError, match="stream=True"):
        run(OpenAIBackend(server.url, "tiny").generate(["a"], params, on_text=print))


def test_backend_retries_a_connection_then_reports_it() -> None:
    async def go() -> float:
        http = OpenAIBackend("http://127.0.0.1:9", "tiny", max_retries=1)
        t0 = time.monotonic()
        with pytest.raises(BackendError, match="cannot connect"):
            await http.generate(["a"], SamplingParams(max_new_tokens=2))
        return time.monotonic() - t0

    assert run(go()) >= 0.3  # one back-off (0.5 s, jittered by up to -25%) before giving up
    with pytest.raises(ValueError, match="max_retries"):
        OpenAIBackend("http://127.0.0.1:9", "tiny", max_retries=-1)
