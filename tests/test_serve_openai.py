"""``agentrl serve`` against the official ``openai`` client on loopback: completions and chat
completions, streamed (server-sent events) and not, chat templates, errors, concurrency."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
uvloop = pytest.importorskip("uvloop")

from agentrl.policy import CharTokenizer, GPTConfig, Policy, SamplingParams  # noqa: E402
from agentrl.policy.chat import chat_prompt_ids, render_simple  # noqa: E402
from agentrl.policy.server import ServerThread  # noqa: E402
from agentrl.policy.streaming import TextStream  # noqa: E402
from conftest import TIME_SCALE  # noqa: E402

torch.set_num_threads(2)

SMALL = GPTConfig(n_layer=2, n_head=2, d_model=32, max_seq_len=128)
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2 + 2 = ?"},
]


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.builtin(SMALL, device="cpu", seed=3)


@pytest.fixture(scope="module")
def server(policy: Policy) -> Iterator[ServerThread]:
    with ServerThread(policy, model_name="tiny", batch_wait_s=0.02, chat_max_tokens=24) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def _greedy(policy: Policy, ids: list[int], n: int, **kw: object) -> list:
    params = SamplingParams(max_new_tokens=n, temperature=0.0, **kw)  # type: ignore[arg-type]
    return policy.generate_ids([ids], params)


# ---------------------------------------------------------------------- completions


def test_completions_through_the_openai_client(client: openai.OpenAI, policy: Policy) -> None:
    out = client.completions.create(
        model="tiny", prompt=["ab", "def f("], max_tokens=12, temperature=0, logprobs=0
    )
    assert out.object == "text_completion" and out.model == "tiny" and len(out.choices) == 2
    for prompt, choice in zip(["ab", "def f("], out.choices, strict=True):
        (g,) = _greedy(policy, policy.tokenizer.encode_prompt(prompt), 12)
        assert choice.text == g.text and choice.finish_reason == "length"
        assert choice.logprobs is not None
        assert choice.logprobs.token_logprobs == pytest.approx(g.logprobs, abs=1e-5)
        assert choice.model_extra["agentrl"]["token_ids"] == g.token_ids
    assert out.usage is not None and out.usage.completion_tokens == 24


def test_completions_stream_equals_the_whole_answer(client: openai.OpenAI) -> None:
    kw = {"model": "tiny", "prompt": ["xy", "print("], "max_tokens": 20, "temperature": 0}
    whole = client.completions.create(**kw)  # type: ignore[call-overload]
    stream = client.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}, logprobs=0
    )
    text = {0: "", 1: ""}
    finish: dict[int, str] = {}
    ext: dict[int, dict] = {}
    lps: dict[int, list[float]] = {0: [], 1: []}
    chunks = 0
    usage = None
    for chunk in stream:
        assert chunk.object == "text_completion"
        if not chunk.choices:
            usage = chunk.usage
            continue
        chunks += 1
        (c,) = chunk.choices
        text[c.index] += c.text
        if c.logprobs is not None:
            lps[c.index] += c.logprobs.token_logprobs
        if c.finish_reason is not None:
            finish[c.index] = c.finish_reason
            ext[c.index] = c.model_extra["agentrl"]
    assert chunks > 2  # tokens came in pieces
    for c in whole.choices:
        assert text[c.index] == c.text and finish[c.index] == c.finish_reason
        assert ext[c.index]["token_ids"] == c.model_extra["agentrl"]["token_ids"]
        assert lps[c.index] == ext[c.index]["logprobs"]
    assert usage is not None and usage.total_tokens == whole.usage.total_tokens  # type: ignore[union-attr]


def test_stream_with_stop_strings_never_sends_past_the_stop(
    client: openai.OpenAI, policy: Policy
) -> None:
    # Find stop strings the greedy completion really contains, then stream with them.
    (g,) = _greedy(policy, policy.tokenizer.encode_prompt("q"), 30)
    stop = [g.text[5:7], g.text[9:12]]
    whole = client.completions.create(
        model="tiny", prompt="q", max_tokens=30, temperature=0, stop=stop
    )
    assert whole.choices[0].finish_reason == "stop"
    assert whole.choices[0].model_extra["agentrl"]["stop"] in stop
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="tiny", prompt="q", max_tokens=30, temperature=0, stop=stop, stream=True
        )
    )
    assert streamed == whole.choices[0].text == g.text[: g.text.find(stop[0])]


def test_raw_sse_framing(server: ServerThread) -> None:
    body = {"prompt": "a", "max_tokens": 5, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = resp.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for ev in events[:-2]:
        assert ev.startswith("data: ")
        chunk = json.loads(ev[len("data: ") :])
        assert chunk["object"] == "text_completion" and len(chunk["choices"]) == 1


# ---------------------------------------------------------------------- chat


def test_chat_completion_uses_the_simple_template(client: openai.OpenAI, policy: Policy) -> None:
    ids = policy.tokenizer.encode_prompt(render_simple(MESSAGES))
    assert chat_prompt_ids(policy.tokenizer, MESSAGES) == ids
    assert render_simple(MESSAGES).endswith("<|user|>\n2 + 2 = ?\n<|assistant|>\n")
    out = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=10, temperature=0, logprobs=True, n=2
    )  # type: ignore[arg-type]
    (g,) = _greedy(policy, ids, 10)
    assert out.object == "chat.completion" and len(out.choices) == 2
    for c in out.choices:
        assert c.message.role == "assistant" and c.message.content == g.text
        assert c.model_extra["agentrl"]["prompt_token_ids"] == ids
        assert c.logprobs is not None and c.logprobs.content is not None
        assert [t.logprob for t in c.logprobs.content] == pytest.approx(g.logprobs, abs=1e-5)
    assert out.usage is not None and out.usage.prompt_tokens == len(ids)
    # no max_tokens: the server's chat_max_tokens (24)
    dflt = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0)  # type: ignore[arg-type]
    assert len(dflt.choices[0].model_extra["agentrl"]["token_ids"]) == 24


def test_chat_stream_through_the_openai_client(client: openai.OpenAI, policy: Policy) -> None:
    msgs = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}],
        }
    ]
    ids = policy.tokenizer.encode_prompt(render_simple([{"role": "user", "content": "hi there"}]))
    (g,) = _greedy(policy, ids, 16)
    stream = client.chat.completions.create(
        model="tiny", messages=msgs, max_completion_tokens=16, temperature=0, stream=True
    )  # type: ignore[arg-type]
    deltas = []
    first = None
    finish = None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk" and chunk.model == "tiny"
        (c,) = chunk.choices
        if first is None:
            first = c.delta
        if c.delta.content:
            deltas.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
            assert c.model_extra["agentrl"]["token_ids"] == g.token_ids
    assert first is not None and first.role == "assistant"
    assert "".join(deltas) == g.text and len(deltas) > 1
    assert finish == "length"


class _GatedPolicy(Policy):
    """Blocks generation after its first token until ``gate`` is set."""

    gate: threading.Event

    def generate_ids(self, prompt_ids, params=None, *, prompts=None, use_cache=True, on_token=None):  # type: ignore[no-untyped-def, override]
        def hook(i: int, tid: int, lp: float) -> None:
            if on_token is not None:
                on_token(i, tid, lp)
            assert self.gate.wait(60)

        return super().generate_ids(
            prompt_ids, params, prompts=prompts, use_cache=use_cache, on_token=hook
        )


def test_tokens_are_sent_while_the_model_still_generates(policy: Policy) -> None:
    gated = _GatedPolicy(copy.deepcopy(policy.model), policy.tokenizer, device="cpu")
    gated.gate = threading.Event()
    with ServerThread(gated, model_name="g") as srv:
        timeout = 20 * TIME_SCALE  # a server that buffers the stream fails here, not hangs
        with openai.OpenAI(
            base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=timeout
        ) as c:
            stream = c.completions.create(
                model="g", prompt="x", max_tokens=8, temperature=0, stream=True, logprobs=0
            )
            it = iter(stream)
            first = next(it)  # arrives while generation waits on the gate
            assert not gated.gate.is_set()
            assert len(first.choices[0].logprobs.token_logprobs) == 1  # type: ignore[union-attr]
            gated.gate.set()
            rest = list(it)
    assert rest[-1].choices[0].finish_reason == "length"


def _hf_chat_dir(tmp: Path, template: str | None) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for ch in range(32, 127):
        vocab[chr(ch)] = len(vocab)
    vocab["\n"] = len(vocab)
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Split("", behavior="isolated")
    tk.decoder = tokenizers.decoders.Fuse()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    if template is not None:
        tok.chat_template = template
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    return tmp


TEMPLATE = (
    "{% if messages[0]['role'] == 'tool' %}{{ raise_exception('tool messages cannot open') }}"
    "{% endif %}{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)


def test_chat_uses_the_models_chat_template(tmp_path: Path) -> None:
    pol = Policy.from_pretrained(_hf_chat_dir(tmp_path, TEMPLATE), device="cpu")
    ids = chat_prompt_ids(pol.tokenizer, MESSAGES)
    assert pol.tokenizer.decode(ids) == "[system]Be brief.[user]2 + 2 = ?[assistant]"
    assert ids[0] == 1 and ids[1] != 1  # the template's BOS, not a second one
    with (
        ServerThread(pol, model_name="hf") as srv,
        openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as c,
    ):
        out = c.chat.completions.create(model="hf", messages=MESSAGES, max_tokens=6, temperature=0)  # type: ignore[arg-type]
        assert out.choices[0].model_extra["agentrl"]["prompt_token_ids"] == ids
        (g,) = _greedy(pol, ids, 6)
        assert out.choices[0].message.content == g.text
        with pytest.raises(openai.BadRequestError, match="tool messages cannot open"):
            c.chat.completions.create(
                model="hf", messages=[{"role": "tool", "content": "x"}], max_tokens=2
            )  # type: ignore[arg-type]


def test_hf_tokenizer_without_template_gets_the_simple_one(tmp_path: Path) -> None:
    pol = Policy.from_pretrained(_hf_chat_dir(tmp_path, None), device="cpu")
    ids = chat_prompt_ids(pol.tokenizer, MESSAGES)
    assert ids == pol.tokenizer.encode_prompt(render_simple(MESSAGES))


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"prompt": "a"}, 400, "messages: is required"),
        ("/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "messages.0.role"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            400,
            "'image_url' are not supported",
        ),
        ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 3}, 400, "top_logprobs"),
        ("/v1/chat/completions", {"messages": MESSAGES, "model": "x"}, 404, "'x' does not exist"),
        ("/v1/chat/completions", {"messages": MESSAGES, "n": 1000}, 400, "n must"),
        ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": 1}, 400, "logprobs"),
        ("/v1/completions", {"prompt": "a", "stream_options": 5}, 400, "stream_options"),
        ("/v1/completions", {"prompt": "a" * 200, "stream": True}, 400, "context"),
        ("/v1/completions", {"prompt": "a", "stop": ["x", ""]}, 400, "stop"),
    ],
)
def test_bad_requests_are_400_naming_the_problem(
    server: ServerThread, path: str, body: dict, status: int, needle: str
) -> None:
    resp = httpx.post(server.url + path, json=body, timeout=60)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert needle in err["message"] and err["code"] == status


def test_malformed_bodies(server: ServerThread) -> None:
    url = server.url + "/v1/completions"
    resp = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "not JSON" in resp.json()["error"]["message"]
    resp = httpx.post(url, content=b"prompt=a", headers={"content-type": "text/plain"})
    assert resp.status_code == 400 and "not JSON" in resp.json()["error"]["message"]
    form = {"content-type": "application/x-www-form-urlencoded"}  # what `curl -d` sends
    resp = httpx.post(url, content=b'{"prompt": "a", "max_tokens": 2}', headers=form)
    assert resp.status_code == 200 and len(resp.json()["choices"]) == 1
    resp = httpx.post(url, content=b"[1, 2]")
    assert resp.status_code == 400 and "JSON object" in resp.json()["error"]["message"]
    resp = httpx.post(url)
    assert resp.status_code == 400 and "JSON object" in resp.json()["error"]["message"]
    assert httpx.get(server.url + "/health").status_code == 200


def test_openai_client_sees_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="nope", prompt="a", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.chat.completions.create(model="tiny", messages=MESSAGES, top_p=3)  # type: ignore[arg-type]


def test_openapi_document_lists_the_endpoints(server: ServerThread) -> None:
    doc = httpx.get(server.url + "/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health"):
        assert path in doc["paths"]
    schemas = doc["components"]["schemas"]
    assert {"CompletionRequest", "ChatCompletionRequest", "ErrorResponse"} <= set(schemas)


# ---------------------------------------------------------------------- concurrency


def test_many_clients_at_once_stream_and_not(server: ServerThread, policy: Policy) -> None:
    prompts = [f"{i}*{i}=" for i in range(12)]
    base = server.url + "/v1"

    async def one(i: int) -> str:
        async with openai.AsyncOpenAI(base_url=base, api_key="x", max_retries=0) as c:
            kw = {"model": "tiny", "prompt": prompts[i], "max_tokens": 10, "temperature": 0}
            if i % 3 == 0:
                s = await c.completions.create(**kw, stream=True)  # type: ignore[call-overload]
                return "".join([ch.choices[0].text async for ch in s if ch.choices])
            if i % 3 == 1:
                msgs = [{"role": "user", "content": prompts[i]}]
                out = await c.chat.completions.create(
                    model="tiny", messages=msgs, max_tokens=10, temperature=0, stream=True
                )  # type: ignore[arg-type]
                return "".join([ch.choices[0].delta.content or "" async for ch in out])
            r = await c.completions.create(**kw)  # type: ignore[call-overload]
            return r.choices[0].text

    async def all_at_once() -> list[str]:
        return await asyncio.gather(*(one(i) for i in range(len(prompts))))

    before = server.server.batches
    got = uvloop.run(all_at_once())
    assert server.server.batches - before < len(prompts)  # they shared batches
    for i, text in enumerate(got):
        if i % 3 == 1:
            ids = policy.tokenizer.encode_prompt(
                render_simple([{"role": "user", "content": prompts[i]}])
            )
        else:
            ids = policy.tokenizer.encode_prompt(prompts[i])
        assert text == _greedy(policy, ids, 10)[0].text, i


# ---------------------------------------------------------------------- TextStream


def test_text_stream_holds_back_partial_utf8_and_stops() -> None:
    tok = CharTokenizer()
    text = "aé✓b STOP tail"
    ts = TextStream(tok, stop=("STOP",))
    sent = ""
    for t in tok.encode(text):
        d = ts.push(t, 0.0)
        assert "\ufffd" not in d
        sent += d
        assert "S" not in sent  # held back from the stop string's first character on
    final = text[: text.find("STOP")]
    assert final.startswith(sent)
    assert sent + ts.finish(final) == final
    plain = TextStream(tok)
    assert "".join(plain.push(t, 0.0) for t in tok.encode("✓x")) == "✓x"


# ---------------------------------------------------------------------- auth, body limit


def test_api_key_and_body_limit(policy: Policy) -> None:
    with ServerThread(policy, model_name="k", api_key="s3cret", max_body_bytes=2000) as srv:
        url = srv.url + "/v1/completions"
        body = {"prompt": "a", "max_tokens": 2}
        resp = httpx.post(url, json=body)
        assert resp.status_code == 401 and "missing API key" in resp.json()["error"]["message"]
        resp = httpx.post(url, json=body, headers={"authorization": "Bearer s3creT"})
        assert resp.status_code == 401 and "wrong API key" in resp.json()["error"]["message"]
        assert httpx.get(srv.url + "/health").status_code == 200  # open to probes
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0) as c:
            assert c.models.list().data[0].id == "k"
            assert len(c.completions.create(model="k", prompt="a", max_tokens=2).choices) == 1
        with (
            openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0) as c,
            pytest.raises(openai.AuthenticationError),
        ):
            c.models.list()
        auth = {"authorization": "Bearer s3cret"}
        big = {"prompt": "a" * 3000}
        resp = httpx.post(url, json=big, headers=auth)
        assert resp.status_code == 413 and "over 2000 bytes" in resp.json()["error"]["message"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            yield b'{"prompt": "'
            for _ in range(10):
                yield b"a" * 300
            yield b'"}'

        resp = httpx.post(url, content=chunks(), headers=auth)
        assert resp.status_code == 413 and "over 2000 bytes" in resp.json()["error"]["message"]
        assert httpx.post(url, json=body, headers=auth).status_code == 200


def test_close_drains_requests_in_flight(policy: Policy) -> None:
    gated = _GatedPolicy(copy.deepcopy(policy.model), policy.tokenizer, device="cpu")
    gated.gate = threading.Event()
    srv = ServerThread(gated, model_name="g").start()
    url = srv.url
    body = {"prompt": "x", "max_tokens": 6, "temperature": 0}
    answer: list[httpx.Response] = []
    t = threading.Thread(
        target=lambda: answer.append(httpx.post(url + "/v1/completions", json=body, timeout=60))
    )
    t.start()
    while gated.lock.acquire(blocking=False):  # until generation holds the policy's lock
        gated.lock.release()
        t.join(0.01)
    closer = threading.Thread(target=srv.close)
    closer.start()
    closer.join(0.5 * TIME_SCALE)
    assert closer.is_alive()  # waits for the request in flight
    with pytest.raises(httpx.ConnectError):  # no longer accepting
        httpx.get(url + "/health", timeout=5)
    gated.gate.set()
    t.join(60)
    closer.join(60)
    assert not closer.is_alive()
    (resp,) = answer
    assert resp.status_code == 200 and len(resp.json()["choices"][0]["agentrl"]["token_ids"]) == 6


def test_metrics_count_requests_by_route_and_code(server: ServerThread) -> None:
    """``/metrics`` (Prometheus text) counts this server's requests by route template and code."""
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2})
    assert ok.status_code == 200
    bad = httpx.post(server.url + "/v1/completions", json={"prompt": "a", "max_tokens": -1})
    assert bad.status_code == 400
    text = httpx.get(server.url + "/metrics/").text
    counts = {
        (m.group(2), m.group(1)): float(m.group(3))
        for m in re.finditer(
            r'^agentrl_http_requests_total\{code="(\d+)",[^}]*route="([^"]+)"\} (\S+)',
            text,
            re.M,
        )
    }
    assert counts.get(("/v1/completions", "200"), 0) >= 1, text[:2000]
    assert counts.get(("/v1/completions", "400"), 0) >= 1, text[:2000]
